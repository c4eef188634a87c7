//! The in-kernel MPTCP path manager's limits (`ip mptcp limits`), raised for a while by
//! every hsxfer process of a network namespace that needs them, and put back by the last
//! ([`super::ns_settings`]).

use std::io;

use super::ip_mptcp::ip;
use super::ns_settings::{Raised, Setting};

/// The in-kernel path manager's limits (`ip mptcp limits`), which belong to the network
/// namespace: how many extra subflows a connection may have, and how many addresses a
/// server announces that a client takes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Extra subflows per connection.
    pub subflows: u32,
    /// Announced addresses a connection uses.
    pub add_addr_accepted: u32,
}

impl Limits {
    /// Reads the namespace's limits.
    pub fn read() -> io::Result<Limits> {
        let out = ip(&["limits", "show"])?;
        let word = |name: &str| {
            let mut words = out.split_whitespace();
            words.find(|w| *w == name);
            words.next().and_then(|v| v.parse().ok()).ok_or_else(|| {
                io::Error::other(format!("`ip mptcp limits show` gave no {name}: {out}"))
            })
        };
        Ok(Limits {
            subflows: word("subflows")?,
            add_addr_accepted: word("add_addr_accepted")?,
        })
    }
}

impl Setting for Limits {
    const NAME: &'static str = "mptcp-limits";

    fn read() -> io::Result<Limits> {
        Limits::read()
    }

    fn set(&self) -> io::Result<()> {
        let (s, a) = (
            self.subflows.to_string(),
            self.add_addr_accepted.to_string(),
        );
        ip(&["limits", "set", "subflows", &s, "add_addr_accepted", &a]).map(drop)
    }

    fn max(self, other: Limits) -> Limits {
        Limits {
            subflows: self.subflows.max(other.subflows),
            add_addr_accepted: self.add_addr_accepted.max(other.add_addr_accepted),
        }
    }

    fn words(&self) -> String {
        format!("{} {}", self.subflows, self.add_addr_accepted)
    }

    fn from_words(w: &[&str]) -> Option<Limits> {
        Some(Limits {
            subflows: w.first()?.parse().ok()?,
            add_addr_accepted: w.get(1)?.parse().ok()?,
        })
    }
}

/// The namespace's limits raised to at least a value for a while ([`Raised`]).
pub type LimitsSet = Raised<Limits>;
