//! The in-kernel MPTCP path manager's limits (`ip mptcp limits`), raised for a while by
//! every hsxfer process of a network namespace that needs them, and put back by the last.
//!
//! The limits belong to the namespace, not to a process: a server and the copies run
//! beside it share them. Each raise is recorded in a file of the namespace's, under a lock,
//! with the limits from before the first: a process that ends lowers them only to what the
//! raises still alive need, and the last one puts back the limits from before. A process
//! that was killed leaves its raise in the file; the next one to come finds it dead and puts
//! its part back.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};

use super::mptcp::ip;

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

    fn set(&self) -> io::Result<()> {
        let (s, a) = (
            self.subflows.to_string(),
            self.add_addr_accepted.to_string(),
        );
        ip(&["limits", "set", "subflows", &s, "add_addr_accepted", &a]).map(drop)
    }

    /// Each limit at the larger of the two.
    fn max(self, other: Limits) -> Limits {
        Limits {
            subflows: self.subflows.max(other.subflows),
            add_addr_accepted: self.add_addr_accepted.max(other.add_addr_accepted),
        }
    }
}

/// Limits raised for a while: to at least what was asked, never lowered by the raise. When
/// dropped, the limits go down to what the namespace's other raises still alive need over
/// the limits from before the first of them.
#[derive(Debug)]
pub struct LimitsSet(Holder);

impl LimitsSet {
    /// Raises the namespace's limits to at least `want` (root only).
    pub fn to(want: Limits) -> io::Result<LimitsSet> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let me = Holder {
            pid: std::process::id(),
            seq: NEXT.fetch_add(1, Ordering::Relaxed),
        };
        let file = Registry::lock()?;
        let now = Limits::read()?;
        let (raises, set) = raise(file.read()?, now, me, want, alive);
        set.set()?;
        file.write(Some(&raises))?;
        Ok(LimitsSet(me))
    }
}

impl Drop for LimitsSet {
    fn drop(&mut self) {
        let put_back = || -> io::Result<()> {
            let file = Registry::lock()?;
            let (raises, set) = release(file.read()?, self.0, alive);
            if let Some(set) = set {
                set.set()?;
            }
            file.write(raises.as_ref())
        };
        if let Err(e) = put_back() {
            tracing::warn!("the MPTCP path manager's limits may stay raised: {e}");
        }
    }
}

/// One raise: the process and which of its raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pid: u32,
    seq: u64,
}

/// The namespace's raises, as recorded in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Raises {
    /// The limits from before the first raise.
    before: Limits,
    /// Each raise and what it wanted.
    held: Vec<(Holder, Limits)>,
}

impl Raises {
    /// Parses the file's text: `before S A`, then one `PID.SEQ S A` per raise. Empty: none.
    fn parse(text: &str) -> Option<Raises> {
        let mut lines = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        let limits = |w: &[&str]| -> Option<Limits> {
            Some(Limits {
                subflows: w.get(1)?.parse().ok()?,
                add_addr_accepted: w.get(2)?.parse().ok()?,
            })
        };
        let first = lines.next()?;
        let before = (first.first() == Some(&"before")).then(|| limits(&first))??;
        let held = lines
            .filter_map(|w| {
                let (pid, seq) = w.first()?.split_once('.')?;
                let holder = Holder {
                    pid: pid.parse().ok()?,
                    seq: seq.parse().ok()?,
                };
                Some((holder, limits(&w)?))
            })
            .collect();
        Some(Raises { before, held })
    }

    fn text(&self) -> String {
        let line =
            |name: String, l: &Limits| format!("{name} {} {}\n", l.subflows, l.add_addr_accepted);
        let mut text = line("before".into(), &self.before);
        for (h, l) in &self.held {
            text += &line(format!("{}.{}", h.pid, h.seq), l);
        }
        text
    }

    /// The limits the recorded raises need: the larger of each over the limits from before.
    fn needed(&self) -> Limits {
        self.held
            .iter()
            .fold(self.before, |acc, (_, want)| acc.max(*want))
    }
}

/// What a raise of `want` by `me` records, and the limits it sets, with the limits `now` and
/// the file's `recorded` raises. Raises of processes no longer `alive` are dropped; when
/// none is left alive and the limits are not what they left, someone set them since, and
/// they are the limits to come back to.
fn raise(
    recorded: Option<Raises>,
    now: Limits,
    me: Holder,
    want: Limits,
    alive: impl Fn(u32) -> bool,
) -> (Raises, Limits) {
    let mut raises = recorded.unwrap_or(Raises {
        before: now,
        held: Vec::new(),
    });
    let left = raises.needed();
    raises.held.retain(|(h, _)| alive(h.pid));
    if raises.held.is_empty() && now != left {
        raises.before = now;
    }
    raises.held.push((me, want));
    (raises, now.max(want))
}

/// What the end of `me`'s raise records (nothing once none is left), and the limits to set:
/// what the raises still alive need, or the limits from before the first. Nothing is set when
/// the file has no record (someone removed it).
fn release(
    recorded: Option<Raises>,
    me: Holder,
    alive: impl Fn(u32) -> bool,
) -> (Option<Raises>, Option<Limits>) {
    let Some(mut raises) = recorded else {
        return (None, None);
    };
    raises.held.retain(|(h, _)| *h != me && alive(h.pid));
    let set = raises.needed();
    (Some(raises).filter(|r| !r.held.is_empty()), Some(set))
}

/// Whether process `pid` still runs.
fn alive(pid: u32) -> bool {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    !matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// The namespace's record of raises, while this holds the lock over all namespaces' records.
struct Registry {
    _lock: Flock<File>,
    path: PathBuf,
}

impl Registry {
    /// The directory of the records, one file per network namespace that has raises.
    const DIR: &'static str = "/run/hsxfer";

    /// Takes the lock (waiting for another holder of it) for this process's namespace's record.
    fn lock() -> io::Result<Registry> {
        let ns = std::fs::metadata("/proc/self/ns/net")?;
        let dir = Path::new(Registry::DIR);
        std::fs::create_dir_all(dir)?;
        let lock = dir.join("mptcp-limits.lock");
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock)?;
        let locked = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| io::Error::other(format!("locking {}: {e}", lock.display())))?;
        Ok(Registry {
            _lock: locked,
            path: dir.join(format!("mptcp-limits.{}.{}", ns.dev(), ns.ino())),
        })
    }

    fn read(&self) -> io::Result<Option<Raises>> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(Raises::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Records `raises`; none removes the namespace's record.
    fn write(&self, raises: Option<&Raises>) -> io::Result<()> {
        match raises {
            Some(r) => std::fs::write(&self.path, r.text()),
            None => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(subflows: u32, add_addr_accepted: u32) -> Limits {
        Limits {
            subflows,
            add_addr_accepted,
        }
    }

    fn holder(pid: u32, seq: u64) -> Holder {
        Holder { pid, seq }
    }

    #[test]
    fn the_file_reads_back_what_was_written() {
        let r = Raises {
            before: limits(2, 0),
            held: vec![(holder(10, 0), limits(8, 0)), (holder(11, 3), limits(4, 8))],
        };
        assert_eq!(Raises::parse(&r.text()), Some(r));
        assert_eq!(Raises::parse(""), None);
        assert_eq!(Raises::parse("garbage\n"), None);
    }

    /// A server raises the subflows, a copy beside it the announcements it accepts; the
    /// server ends first: only the copy's raise stays, and the copy's end puts back the
    /// limits from before the server's (the old rule left the server's for good).
    #[test]
    fn the_last_raise_to_end_puts_back_the_limits_from_before_the_first() {
        let all_alive = |_| true;
        let (server, copy) = (holder(10, 0), holder(20, 0));
        let (r, set) = raise(None, limits(2, 0), server, limits(8, 0), all_alive);
        assert_eq!(set, limits(8, 0));
        let (r, set) = raise(Some(r), set, copy, limits(8, 8), all_alive);
        assert_eq!(set, limits(8, 8));
        let (r, set) = release(Some(r), server, all_alive);
        assert_eq!(set, Some(limits(8, 8)), "the copy still needs its raise");
        let (r, set) = release(r, copy, all_alive);
        assert_eq!((r, set), (None, Some(limits(2, 0))));
    }

    /// The copy ends first: the limits go down to what the server still needs.
    #[test]
    fn an_end_lowers_the_limits_to_what_the_others_need() {
        let all_alive = |_| true;
        let (server, copy) = (holder(10, 0), holder(20, 0));
        let (r, set) = raise(None, limits(2, 0), server, limits(8, 0), all_alive);
        let (r, _) = raise(Some(r), set, copy, limits(4, 8), all_alive);
        let (r, set) = release(Some(r), copy, all_alive);
        assert_eq!(set, Some(limits(8, 0)));
        assert_eq!(release(r, server, all_alive), (None, Some(limits(2, 0))));
    }

    /// A killed server left its raise: the next raise takes the limits from before it as
    /// its own, and puts them back at its end.
    #[test]
    fn a_killed_holders_raise_is_put_back_by_the_next() {
        let killed = holder(10, 0);
        let (r, left) = raise(None, limits(2, 0), killed, limits(8, 0), |_| true);
        let only_20 = |pid| pid == 20;
        let (r, set) = raise(Some(r), left, holder(20, 0), limits(8, 0), only_20);
        assert_eq!(set, limits(8, 0));
        assert_eq!(r.held, vec![(holder(20, 0), limits(8, 0))]);
        assert_eq!(
            release(Some(r), holder(20, 0), only_20),
            (None, Some(limits(2, 0)))
        );
    }

    /// Limits someone set after the killed holder's raise are the new limits to come back to.
    #[test]
    fn limits_set_by_hand_since_a_killed_holder_are_kept() {
        let (r, _) = raise(None, limits(2, 0), holder(10, 0), limits(8, 0), |_| true);
        let me = holder(20, 0);
        let (r, set) = raise(Some(r), limits(1, 1), me, limits(8, 0), |pid| pid == 20);
        assert_eq!(set, limits(8, 1));
        assert_eq!(release(Some(r), me, |_| true), (None, Some(limits(1, 1))));
    }

    /// Two raises of one process are two holders.
    #[test]
    fn raises_of_one_process_are_told_apart() {
        let (a, b) = (holder(10, 0), holder(10, 1));
        let (r, set) = raise(None, limits(0, 0), a, limits(8, 0), |_| true);
        let (r, _) = raise(Some(r), set, b, limits(0, 8), |_| true);
        let (r, set) = release(Some(r), a, |_| true);
        assert_eq!(set, Some(limits(0, 8)));
        assert_eq!(release(r, b, |_| true), (None, Some(limits(0, 0))));
    }
}
