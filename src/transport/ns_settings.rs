//! Settings of the network namespace that hsxfer processes raise for a while and share
//! (the MPTCP path manager's limits and type), put back by the last of them to end.
//!
//! Such a setting belongs to the namespace, not to a process: a server and the copies run
//! beside it share it. Each raise is recorded in a file of the namespace's, under a lock,
//! with the value from before the first: a process that ends lowers the setting only to
//! what the raises still alive need, and the last one puts back the value from before. A
//! process that was killed leaves its raise in the file; the next one to raise the setting
//! finds it dead, and puts its part back at its own end. (Each process used to put back the
//! value it had found: the first to end took away the raise of another still running, and
//! the last left the first's for good.)

use std::fs::{File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};

/// A setting of the namespace that hsxfer raises for a while.
pub trait Setting: Copy + Eq + std::fmt::Debug {
    /// The name of its records (in `/run/hsxfer`), and of the setting in messages.
    const NAME: &'static str;
    /// Reads the namespace's value.
    fn read() -> io::Result<Self>;
    /// Sets the namespace's value.
    fn set(&self) -> io::Result<()>;
    /// The least value that is at least each of the two.
    fn max(self, other: Self) -> Self;
    /// The value as the words of a record's line.
    fn words(&self) -> String;
    /// The value from the words of a record's line.
    fn from_words(words: &[&str]) -> Option<Self>;
}

/// A setting raised for a while: to at least what was asked, never lowered by the raise.
/// When dropped, the setting goes down to what the namespace's other raises still alive need
/// over the value from before the first of them.
#[derive(Debug)]
pub struct Raised<S: Setting> {
    me: Holder,
    _setting: PhantomData<S>,
}

impl<S: Setting> Raised<S> {
    /// Raises the namespace's setting to at least `want` (root only).
    pub fn to(want: S) -> io::Result<Raised<S>> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let me = Holder {
            pid,
            seq: NEXT.fetch_add(1, Ordering::Relaxed),
            start: start_time(pid),
        };
        let file = Registry::lock(S::NAME)?;
        let now = S::read()?;
        let (raises, set) = raise(file.read()?, now, me, want, alive);
        set.set()?;
        file.write(Some(&raises))?;
        Ok(Raised {
            me,
            _setting: PhantomData,
        })
    }
}

impl<S: Setting> Drop for Raised<S> {
    fn drop(&mut self) {
        let put_back = || -> io::Result<()> {
            let file = Registry::lock(S::NAME)?;
            let (raises, set) = release(file.read::<S>()?, self.me, alive);
            if let Some(set) = set {
                set.set()?;
            }
            file.write(raises.as_ref())
        };
        if let Err(e) = put_back() {
            tracing::warn!("{} may stay raised: {e}", S::NAME);
        }
    }
}

/// One raise: the process and which of its raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    pid: u32,
    seq: u64,
    /// When the process started ([`start_time`]), where known: a process that later has
    /// its number is another (records of older versions have none).
    start: Option<u64>,
}

/// The namespace's raises of one setting, as recorded in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Raises<S> {
    /// The value from before the first raise.
    before: S,
    /// Each raise and what it wanted.
    held: Vec<(Holder, S)>,
}

impl<S: Setting> Raises<S> {
    /// Parses the file's text: `before VALUE`, then one `PID.SEQ[.START] VALUE` per raise.
    /// Empty: none.
    fn parse(text: &str) -> Option<Raises<S>> {
        let mut lines = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>());
        let value = |w: &[&str]| S::from_words(w.get(1..)?);
        let first = lines.next()?;
        let before = (first.first() == Some(&"before")).then(|| value(&first))??;
        let held = lines
            .filter_map(|w| {
                let mut id = w.first()?.split('.');
                let holder = Holder {
                    pid: id.next()?.parse().ok()?,
                    seq: id.next()?.parse().ok()?,
                    start: match id.next() {
                        Some(start) => Some(start.parse().ok()?),
                        None => None,
                    },
                };
                Some((holder, value(&w)?))
            })
            .collect();
        Some(Raises { before, held })
    }

    fn text(&self) -> String {
        let mut text = format!("before {}\n", self.before.words());
        for (h, v) in &self.held {
            let start = h.start.map(|s| format!(".{s}")).unwrap_or_default();
            text += &format!("{}.{}{start} {}\n", h.pid, h.seq, v.words());
        }
        text
    }

    /// The value the recorded raises need over the value from before.
    fn needed(&self) -> S {
        self.held
            .iter()
            .fold(self.before, |acc, (_, want)| acc.max(*want))
    }
}

/// What a raise of `want` by `me` records, and the value it sets, with the value `now` and
/// the file's `recorded` raises. Raises of processes no longer `alive` are dropped; when
/// none is left alive and the value is not what they left, someone set it since, and it is
/// the value to come back to.
fn raise<S: Setting>(
    recorded: Option<Raises<S>>,
    now: S,
    me: Holder,
    want: S,
    alive: impl Fn(&Holder) -> bool,
) -> (Raises<S>, S) {
    let mut raises = recorded.unwrap_or(Raises {
        before: now,
        held: Vec::new(),
    });
    let left = raises.needed();
    raises.held.retain(|(h, _)| alive(h));
    if raises.held.is_empty() && now != left {
        raises.before = now;
    }
    raises.held.push((me, want));
    (raises, now.max(want))
}

/// What the end of `me`'s raise records (nothing once none is left), and the value to set:
/// what the raises still alive need, or the value from before the first. Nothing is set when
/// the file has no record (someone removed it).
fn release<S: Setting>(
    recorded: Option<Raises<S>>,
    me: Holder,
    alive: impl Fn(&Holder) -> bool,
) -> (Option<Raises<S>>, Option<S>) {
    let Some(mut raises) = recorded else {
        return (None, None);
    };
    raises.held.retain(|(h, _)| *h != me && alive(h));
    let set = raises.needed();
    (Some(raises).filter(|r| !r.held.is_empty()), Some(set))
}

/// What the raises of processes no longer alive left, dropped from `recorded` with the
/// value `now`: the records that stay (none once none is left), and the value to set, if
/// any was dropped and the value is still theirs (one set by hand since is kept).
fn forget_dead<S: Setting>(
    recorded: Option<Raises<S>>,
    now: S,
    alive: impl Fn(&Holder) -> bool,
) -> (Option<Raises<S>>, Option<S>) {
    let Some(mut raises) = recorded else {
        return (None, None);
    };
    let (left, held) = (raises.needed(), raises.held.len());
    raises.held.retain(|(h, _)| alive(h));
    if raises.held.len() == held {
        return (Some(raises), None);
    }
    let set = match raises.held.is_empty() && now != left {
        true => None,
        false => Some(raises.needed()),
    };
    (Some(raises).filter(|r| !r.held.is_empty()), set)
}

/// Puts back what killed processes' raises of `S` left in this namespace, without raising
/// it: for a process that needs it as it was before them (a server or copy of the in-kernel
/// path manager, where a killed userspace-PM server left the userspace one selected).
pub fn forget_dead_raises<S: Setting>() -> io::Result<()> {
    let file = Registry::lock(S::NAME)?;
    let Some(recorded) = file.read::<S>()? else {
        return Ok(());
    };
    let (raises, set) = forget_dead(Some(recorded), S::read()?, alive);
    if let Some(set) = set {
        set.set()?;
    }
    file.write(raises.as_ref())
}

/// Whether the process of raise `h` still runs: a process of its number that started when
/// it did.
fn alive(h: &Holder) -> bool {
    let pid = nix::unistd::Pid::from_raw(h.pid as i32);
    let exists = !matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    );
    exists && (h.start.is_none() || start_time(h.pid).is_none_or(|s| Some(s) == h.start))
}

/// When process `pid` started, in clock ticks after boot (`/proc/PID/stat`'s 22nd field).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (2nd field) may hold spaces and parentheses: count after its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The namespace's record of one setting's raises, while this holds the lock over all
/// records.
struct Registry {
    _lock: Flock<File>,
    path: PathBuf,
}

impl Registry {
    /// The directory of the records, one file per network namespace that has raises.
    const DIR: &'static str = "/run/hsxfer";

    /// Takes the lock (waiting for another holder of it) for the record of setting `name` in
    /// this process's namespace.
    fn lock(name: &str) -> io::Result<Registry> {
        let ns = std::fs::metadata("/proc/self/ns/net")?;
        let dir = Path::new(Registry::DIR);
        std::fs::create_dir_all(dir)?;
        let lock = dir.join("settings.lock");
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
            path: dir.join(format!("{name}.{}.{}", ns.dev(), ns.ino())),
        })
    }

    fn read<S: Setting>(&self) -> io::Result<Option<Raises<S>>> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(Raises::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Records `raises`; none removes the namespace's record.
    fn write<S: Setting>(&self, raises: Option<&Raises<S>>) -> io::Result<()> {
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

    /// Two values raised each on its own, as the MPTCP limits are.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Pair(u32, u32);

    impl Setting for Pair {
        const NAME: &'static str = "test-pair";
        fn read() -> io::Result<Pair> {
            unreachable!("the rules are pure")
        }
        fn set(&self) -> io::Result<()> {
            unreachable!("the rules are pure")
        }
        fn max(self, other: Pair) -> Pair {
            Pair(self.0.max(other.0), self.1.max(other.1))
        }
        fn words(&self) -> String {
            format!("{} {}", self.0, self.1)
        }
        fn from_words(w: &[&str]) -> Option<Pair> {
            Some(Pair(w.first()?.parse().ok()?, w.get(1)?.parse().ok()?))
        }
    }

    fn limits(subflows: u32, add_addr_accepted: u32) -> Pair {
        Pair(subflows, add_addr_accepted)
    }

    fn holder(pid: u32, seq: u64) -> Holder {
        Holder {
            pid,
            seq,
            start: None,
        }
    }

    #[test]
    fn the_file_reads_back_what_was_written() {
        let r = Raises {
            before: limits(2, 0),
            held: vec![(holder(10, 0), limits(8, 0)), (holder(11, 3), limits(4, 8))],
        };
        assert_eq!(Raises::parse(&r.text()), Some(r));
        assert_eq!(Raises::<Pair>::parse(""), None);
        assert_eq!(Raises::<Pair>::parse("garbage\n"), None);
    }

    /// A server raises the subflows, a copy beside it the announcements it accepts; the
    /// server ends first: only the copy's raise stays, and the copy's end puts back the
    /// limits from before the server's (the old rule left the server's for good).
    #[test]
    fn the_last_raise_to_end_puts_back_the_limits_from_before_the_first() {
        let all_alive = |_: &Holder| true;
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
        let all_alive = |_: &Holder| true;
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
        let (r, left) = raise(None, limits(2, 0), killed, limits(8, 0), |_: &Holder| true);
        let only_20 = |h: &Holder| h.pid == 20;
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
        let (r, _) = raise(
            None,
            limits(2, 0),
            holder(10, 0),
            limits(8, 0),
            |_: &Holder| true,
        );
        let me = holder(20, 0);
        let (r, set) = raise(Some(r), limits(1, 1), me, limits(8, 0), |h: &Holder| {
            h.pid == 20
        });
        assert_eq!(set, limits(8, 1));
        assert_eq!(
            release(Some(r), me, |_: &Holder| true),
            (None, Some(limits(1, 1)))
        );
    }

    /// A process that has the number of a killed holder is not that holder: its start time
    /// tells them apart (the raise stayed for good).
    #[test]
    fn a_process_that_took_a_killed_holders_number_is_not_alive_for_it() {
        let me = std::process::id();
        let started = start_time(me).expect("this process's start time");
        let h = |start| Holder {
            pid: me,
            seq: 0,
            start,
        };
        assert!(alive(&h(Some(started))));
        assert!(alive(&h(None)), "a record of an older version");
        assert!(!alive(&h(Some(started + 1))));
        let r = Raises {
            before: limits(2, 0),
            held: vec![
                (h(Some(started)), limits(8, 8)),
                (holder(11, 3), limits(4, 8)),
            ],
        };
        assert_eq!(Raises::parse(&r.text()), Some(r));
        assert!(Raises::<Pair>::parse("before 2 0\n1.0.x 8 8\n")
            .unwrap()
            .held
            .is_empty());
    }

    /// A killed holder's raise that no other process replaces is put back by one that needs
    /// the value from before (the userspace path manager a killed server left selected);
    /// one set by hand since is kept.
    #[test]
    fn dead_raises_are_put_back_without_a_raise_of_ones_own() {
        let (killed, running) = (holder(10, 0), holder(20, 0));
        let (r, left) = raise(None, limits(0, 0), killed, limits(1, 0), |_: &Holder| true);
        let only_20 = |h: &Holder| h.pid == 20;
        assert_eq!(
            forget_dead(Some(r.clone()), left, only_20),
            (None, Some(limits(0, 0)))
        );
        assert_eq!(
            forget_dead(Some(r.clone()), limits(3, 0), only_20),
            (None, None)
        );
        let all_alive = |_: &Holder| true;
        assert_eq!(
            forget_dead(Some(r.clone()), left, all_alive),
            (Some(r.clone()), None)
        );
        let (both, left) = raise(Some(r), left, running, limits(1, 0), all_alive);
        let (kept, set) = forget_dead(Some(both), left, only_20);
        assert_eq!(set, Some(limits(1, 0)));
        assert_eq!(kept.unwrap().held, vec![(running, limits(1, 0))]);
    }

    /// Two raises of one process are two holders.
    #[test]
    fn raises_of_one_process_are_told_apart() {
        let (a, b) = (holder(10, 0), holder(10, 1));
        let (r, set) = raise(None, limits(0, 0), a, limits(8, 0), |_: &Holder| true);
        let (r, _) = raise(Some(r), set, b, limits(0, 8), |_: &Holder| true);
        let (r, set) = release(Some(r), a, |_: &Holder| true);
        assert_eq!(set, Some(limits(0, 8)));
        assert_eq!(release(r, b, |_: &Holder| true), (None, Some(limits(0, 0))));
    }
}
