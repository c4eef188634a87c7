//! How many connections a server holds at once, per peer address and in total, so that no
//! peer can exhaust its descriptors or memory (OpenSSH's `MaxStartups` is the model): a cap on
//! connections still in their handshake, and a cap on sessions. A connection past a cap is
//! turned away at once with the cap it hit ([`Busy`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::channels::busy::Busy;
use crate::channels::limits::MAX_CHANNELS;

/// What a server allows at once. The defaults fit a host with the usual 1,024 descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections not yet authenticated, in total.
    pub handshakes: u32,
    /// Connections not yet authenticated, from one address. A client joins all its data
    /// channels at once, so this stays above [`MAX_CHANNELS`].
    pub handshakes_per_address: u32,
    /// Sessions, in total.
    pub sessions: u32,
    /// Sessions from one address.
    pub sessions_per_address: u32,
    /// How long a connection may take to authenticate, from its accept.
    pub handshake_timeout: Duration,
    /// How long an authenticated control connection may take to send its request.
    pub request_timeout: Duration,
    /// Bytes of blocks being received, across sessions
    /// ([`super::block_memory::BlockMemory`]).
    pub block_memory: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            handshakes: 4 * MAX_CHANNELS as u32,
            handshakes_per_address: 2 * MAX_CHANNELS as u32,
            sessions: 256,
            sessions_per_address: 64,
            handshake_timeout: super::handshake::HANDSHAKE_TIMEOUT,
            request_timeout: Duration::from_secs(60),
            block_memory: super::block_memory::DEFAULT_SERVER_BLOCK_MEMORY,
        }
    }
}

/// One kind of connection counted per address and in total.
#[derive(Debug, Default)]
struct Counts {
    total: u32,
    by_address: HashMap<IpAddr, u32>,
}

/// The counters of one server; cheap to clone.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: Arc<ServerLimits>,
    handshakes: Arc<Mutex<Counts>>,
    sessions: Arc<Mutex<Counts>>,
}

/// A counted connection; it is uncounted when dropped, however its task ends.
#[derive(Debug)]
pub struct Ticket {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.counts.lock().expect("admission lock");
        c.total -= 1;
        if let Some(n) = c.by_address.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.by_address.remove(&self.peer);
            }
        }
    }
}

/// Counts a connection of one kind (`sessions` or handshakes) from `peer` unless that would
/// pass the `total` or the `per`-address cap.
fn enter(
    counts: &Arc<Mutex<Counts>>,
    peer: IpAddr,
    sessions: bool,
    (total, per): (u32, u32),
) -> Result<Ticket, Busy> {
    let mut c = counts.lock().expect("admission lock");
    let busy = |per_address, limit| Busy {
        sessions,
        per_address,
        limit,
    };
    if c.total >= total {
        return Err(busy(false, total));
    }
    let n = c.by_address.entry(peer).or_default();
    if *n >= per {
        return Err(busy(true, per));
    }
    *n += 1;
    c.total += 1;
    Ok(Ticket {
        counts: counts.clone(),
        peer,
    })
}

impl Admission {
    /// Counters enforcing `limits`.
    pub fn new(limits: ServerLimits) -> Self {
        Admission {
            limits: Arc::new(limits),
            handshakes: Arc::default(),
            sessions: Arc::default(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &ServerLimits {
        &self.limits
    }

    /// Counts a connection that has yet to authenticate.
    pub fn handshake(&self, peer: IpAddr) -> Result<Ticket, Busy> {
        let l = &self.limits;
        let caps = (l.handshakes, l.handshakes_per_address);
        enter(&self.handshakes, peer, false, caps)
    }

    /// Authenticated sessions now.
    pub fn sessions(&self) -> u32 {
        self.sessions.lock().expect("admission lock").total
    }

    /// Counts an authenticated session.
    pub fn session(&self, peer: IpAddr) -> Result<Ticket, Busy> {
        let l = &self.limits;
        enter(
            &self.sessions,
            peer,
            true,
            (l.sessions, l.sessions_per_address),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_address_and_in_total_and_frees_on_drop() {
        let a = Admission::new(ServerLimits {
            sessions: 3,
            sessions_per_address: 2,
            ..ServerLimits::default()
        });
        let (x, y, z): (IpAddr, IpAddr, IpAddr) = (
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
            [10, 0, 0, 3].into(),
        );
        let x1 = a.session(x).unwrap();
        let _x2 = a.session(x).unwrap();
        let busy = |per_address, limit| Busy {
            sessions: true,
            per_address,
            limit,
        };
        assert_eq!(a.session(x).unwrap_err(), busy(true, 2));
        let _y1 = a.session(y).unwrap();
        assert_eq!(a.session(z).unwrap_err(), busy(false, 3));
        drop(x1);
        let _z1 = a.session(z).unwrap();
        assert_eq!(a.session(x).unwrap_err(), busy(false, 3));
        // Handshakes are counted apart from sessions.
        let _h = a.handshake(x).unwrap();
        assert_eq!(a.sessions.lock().unwrap().by_address.get(&x), Some(&1));
    }
}
