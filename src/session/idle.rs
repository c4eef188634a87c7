//! Sessions whose peer went silent end. A receiving session holds slots of the process's
//! budget of open files, and a sending one a session slot and its channels' sockets; a peer
//! that stopped talking (and, to a sender, stopped reading) after its request held them for
//! good.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// How long a session's peer may do nothing: no control message, and no block bytes
/// arriving (to a receiver) or being taken (from a sender), while this end waits for
/// nothing of its own. Ten minutes leave room for a sender whose source is slow to give its
/// first bytes (a file being staged). A receiver waiting on itself (its budget of open files,
/// its commits, its planning) says so with an empty plan once nothing went to the sender for
/// [`KEEPALIVE`], so that its sender waits too. A server may set another idle time
/// ([`crate::ServerLimits::idle`]), well above [`KEEPALIVE`].
pub const SESSION_IDLE: Duration = Duration::from_secs(600);

/// How long a receiver that waits on itself lets go without a word to the sender: short
/// beside any idle time a server would set, whichever end sends (an empty plan is a few
/// dozen bytes).
pub const KEEPALIVE: Duration = Duration::from_secs(30);

/// What a receiver says when its peer went silent.
pub const RECEIVER_IDLE: &str = "the peer sent nothing for the idle time (10 minutes by \
     default); run the same command again to resume";

/// What a sender says when its peer went silent.
pub const SENDER_IDLE: &str = "the peer sent nothing and took no block bytes for the idle \
     time (10 minutes by default); run the same command again to resume";

/// Watches a session for a silent peer ([`SESSION_IDLE`]).
#[derive(Debug)]
pub struct IdleWatch {
    /// When the peer was last heard from (or this end last worked or waited on itself).
    heard: Instant,
    /// The peer's progress then: block bytes that had arrived, or been taken.
    progress: u64,
    /// How long the peer may be silent.
    limit: Duration,
    /// What the session's error says.
    why: &'static str,
}

impl IdleWatch {
    /// A watch from `now`, when the peer's progress stood at `progress`, for a silence of
    /// `limit`; `why` is its error.
    pub fn new(now: Instant, progress: u64, limit: Duration, why: &'static str) -> Self {
        IdleWatch {
            heard: now,
            progress,
            limit,
            why,
        }
    }

    /// The peer was heard from (a control message, a channel's verdict), or this end
    /// finished work of its own.
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
    }

    /// When to look again.
    pub fn check_at(&self) -> Instant {
        self.heard + self.limit
    }

    /// Looks at the peer's progress by `now`: an error once the peer has been silent for
    /// the limit while nothing here was `busy`. Progress is looked at only here, so a silence
    /// is noticed between one and two limits after it began.
    pub fn check(&mut self, now: Instant, progress: u64, busy: bool) -> Result<()> {
        if progress != self.progress || busy {
            self.progress = progress;
            self.heard = now;
        }
        if now.duration_since(self.heard) >= self.limit {
            return Err(Error::Timeout(self.why));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_silent_for_ten_minutes_ends_the_session_unless_it_waits_on_itself() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = IdleWatch::new(t0, 0, SESSION_IDLE, RECEIVER_IDLE);
        assert_eq!(w.check_at(), at(600));
        // Block bytes kept coming: not idle.
        w.check(at(600), 4096, false).unwrap();
        assert_eq!(w.check_at(), at(1200));
        // A control message is the peer too.
        w.heard(at(900));
        assert_eq!(w.check_at(), at(1500));
        // Waiting for this end's own budget or commits is not the peer's silence.
        w.check(at(1500), 4096, true).unwrap();
        let e = w.check(at(2100), 4096, false).unwrap_err();
        assert!(
            e.to_string().contains("sent nothing for the idle time"),
            "{e}"
        );
    }
}
