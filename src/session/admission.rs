//! How many connections a server holds at once, per peer address and in total, so that no
//! peer can exhaust its descriptors or memory (OpenSSH's `MaxStartups` is the model): a cap on
//! connections still in their handshake, a cap on sessions, and a cap on the data channels
//! joined to them. A connection past a cap is turned away at once with the cap it hit
//! ([`Busy`]), except that when the handshakes fill the server, one that has taken
//! [`MAKE_ROOM_AFTER`] gives its place to the newcomer (of those, one of the peer holding the
//! most; not to a newcomer whose own peer holds one that old): a peer that holds connections
//! open without authenticating, from as many addresses as it takes to fill the total, then
//! locks no client out, unless it opens them faster than they age.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::budget::open_files_limit;
use crate::channels::busy::{Busy, Cap};
use crate::channels::limits::MAX_CHANNELS;

/// What a server allows at once. The defaults ([`ServerLimits::for_descriptors`]) share out
/// this process's descriptor limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections not yet authenticated, in total. When they are all taken, one that has
    /// taken [`MAKE_ROOM_AFTER`] gives its place to a newcomer: the oldest of the peer holding
    /// the most (an IPv6 peer's /64 counting as one: one host may hold a whole /64), unless the
    /// newcomer's own peer holds one that old.
    pub handshakes: u32,
    /// Connections not yet authenticated, from one address. A client joins all its data
    /// channels at once, so this stays above [`MAX_CHANNELS`].
    pub handshakes_per_address: u32,
    /// Sessions, in total.
    pub sessions: u32,
    /// Sessions from one address.
    pub sessions_per_address: u32,
    /// Data channels joined to sessions, in total: each holds a descriptor, two on a server
    /// that sends (its socket and the sampler's duplicate), so without a cap a token holder's
    /// sessions of many channels would take the descriptors the server needs to accept
    /// connections and open files. The default is an eighth of the descriptor limit
    /// (`RLIMIT_NOFILE`, at least [`MAX_CHANNELS`]): at most a quarter of the descriptors,
    /// beside the half the files being received may hold
    /// ([`super::budget::FileBudget::for_this_process`]).
    pub channels: u32,
    /// Data channels from one address: half of [`Self::channels`], at least
    /// [`MAX_CHANNELS`] (one session of the most channels) when the total allows.
    pub channels_per_address: u32,
    /// How long a connection may take to authenticate, from its accept.
    pub handshake_timeout: Duration,
    /// How long an authenticated control connection may take to send its request.
    pub request_timeout: Duration,
    /// How long a session's peer may be silent once its request is in
    /// ([`super::idle::SESSION_IDLE`]).
    pub idle: Duration,
    /// Bytes of blocks being received, across sessions
    /// ([`super::block_memory::BlockMemory`]).
    pub block_memory: usize,
}

/// Descriptors a server keeps for what is neither a connection nor a file being received:
/// its listeners, the runtime's, its key file, a log.
pub const SPARE_DESCRIPTORS: u64 = 32;

/// The default caps on data channels, in total and per address, for a process allowed
/// `descriptors` open files.
fn channel_caps(descriptors: u64) -> (u32, u32) {
    let total = u32::try_from(descriptors / 8)
        .unwrap_or(u32::MAX)
        .max(MAX_CHANNELS as u32);
    (total, channels_per_address(total))
}

/// The default caps on sessions and handshakes, in total, for a process allowed
/// `descriptors` open files: they share a quarter of them, less [`SPARE_DESCRIPTORS`], a
/// quarter of that for sessions and the rest for handshakes. Never more than 256 sessions and
/// 512 handshakes (from 4,224 descriptors), nor fewer than 8 sessions and handshakes enough
/// for a client of the most channels.
fn connection_caps(descriptors: u64) -> (u32, u32) {
    let quarter =
        u32::try_from((descriptors / 4).saturating_sub(SPARE_DESCRIPTORS)).unwrap_or(u32::MAX);
    let sessions = (quarter / 4).clamp(8, 256);
    let most = MAX_CHANNELS as u32;
    let handshakes = quarter.saturating_sub(sessions).clamp(most + 8, 4 * most);
    (sessions, handshakes)
}

/// 64 sessions from one address, where `total` allows.
fn sessions_per_address(total: u32) -> u32 {
    total.min(64)
}

/// Half of `total` handshakes, but enough for a client of the most channels, which joins all
/// of them at once, when `total` allows.
fn handshakes_per_address(total: u32) -> u32 {
    (total / 2).max(MAX_CHANNELS as u32 + 8).min(total)
}

/// Half of `total`, but one session of the most channels when `total` allows.
fn channels_per_address(total: u32) -> u32 {
    (total / 2).max(MAX_CHANNELS as u32).min(total)
}

impl Default for ServerLimits {
    /// [`ServerLimits::for_descriptors`] this process's descriptor limit (`RLIMIT_NOFILE`).
    fn default() -> Self {
        ServerLimits::for_descriptors(open_files_limit())
    }
}

impl ServerLimits {
    /// The default caps for a process allowed `descriptors` open files, which they share so
    /// that no mix of peers can take the descriptors a server needs: files being received
    /// may hold half ([`super::budget::FileBudget::for_this_process`]) and data channels a
    /// quarter (an eighth of the descriptors, two each on a server that sends: its socket and
    /// the sampler's duplicate). Sessions (a control connection each) and handshakes share
    /// the rest, less [`SPARE_DESCRIPTORS`]: a quarter of it for sessions, up to 256 (64 from
    /// one address), and the rest for handshakes, up to 512 (half from one address, but
    /// enough for a client of the most channels). Below
    /// 1,024 descriptors the caps still allow one session of the most channels, so they may
    /// add up to more than the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::ServerLimits;
    ///
    /// // The usual soft limit: 512 descriptors for files, 2 × 128 for data channels.
    /// let l = ServerLimits::for_descriptors(1024);
    /// assert_eq!((l.sessions, l.handshakes, l.channels), (56, 168, 128));
    /// let l = ServerLimits::for_descriptors(1 << 20);
    /// assert_eq!((l.sessions, l.handshakes, l.channels), (256, 512, 131_072));
    /// ```
    pub fn for_descriptors(descriptors: u64) -> Self {
        let (channels, channels_per_address) = channel_caps(descriptors);
        let (sessions, handshakes) = connection_caps(descriptors);
        ServerLimits {
            handshakes,
            handshakes_per_address: handshakes_per_address(handshakes),
            sessions,
            sessions_per_address: sessions_per_address(sessions),
            channels,
            channels_per_address,
            handshake_timeout: super::handshake::HANDSHAKE_TIMEOUT,
            request_timeout: Duration::from_secs(60),
            idle: super::idle::SESSION_IDLE,
            block_memory: super::block_memory::DEFAULT_SERVER_BLOCK_MEMORY,
        }
    }

    /// The descriptors these caps let connections hold (handshakes, sessions' control
    /// connections, two for each data channel), with those of the files being received (half
    /// of `descriptors`) and [`SPARE_DESCRIPTORS`], when that is more than a process allowed
    /// `descriptors` has: a flood beside large pushes could then leave the server none.
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::ServerLimits;
    ///
    /// assert_eq!(ServerLimits::for_descriptors(1024).overcommit(1024), None);
    /// let many = ServerLimits { sessions: 1000, ..ServerLimits::for_descriptors(1024) };
    /// assert_eq!(many.overcommit(1024), Some(1968));
    /// ```
    pub fn overcommit(&self, descriptors: u64) -> Option<u64> {
        let connections =
            u64::from(self.handshakes) + u64::from(self.sessions) + 2 * u64::from(self.channels);
        let wanted = connections + descriptors / 2 + SPARE_DESCRIPTORS;
        (wanted > descriptors).then_some(wanted)
    }

    /// These limits with at most `total` sessions at once, and up to 64 of them from one
    /// address.
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::ServerLimits;
    ///
    /// let l = ServerLimits::default().with_sessions(1000);
    /// assert_eq!((l.sessions, l.sessions_per_address), (1000, 64));
    /// let l = ServerLimits::default().with_sessions(10);
    /// assert_eq!((l.sessions, l.sessions_per_address), (10, 10));
    /// ```
    pub fn with_sessions(self, total: u32) -> Self {
        ServerLimits {
            sessions: total,
            sessions_per_address: sessions_per_address(total),
            ..self
        }
    }

    /// These limits with at most `total` data channels at once, and half as many from one
    /// address (one session of the most channels, when `total` allows).
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::ServerLimits;
    ///
    /// let l = ServerLimits::default().with_channels(1000);
    /// assert_eq!((l.channels, l.channels_per_address), (1000, 500));
    /// let l = ServerLimits::default().with_channels(100);
    /// assert_eq!((l.channels, l.channels_per_address), (100, 100));
    /// ```
    pub fn with_channels(self, total: u32) -> Self {
        ServerLimits {
            channels: total,
            channels_per_address: channels_per_address(total),
            ..self
        }
    }
}

/// Warns when `limits` and the files being received may hold more descriptors than this
/// process may open ([`ServerLimits::overcommit`]).
pub(super) fn warn_of_overcommit(limits: &ServerLimits) {
    let descriptors = open_files_limit();
    if let Some(wanted) = limits.overcommit(descriptors) {
        tracing::warn!(
            "the server's caps and the files it receives may hold {wanted} descriptors, more than its open-files limit of {descriptors}: raise `ulimit -n`, or lower the caps on sessions and channels"
        );
    }
}

/// How long a handshake may wait before it gives its place to a newcomer when the handshakes
/// fill the server. A client's takes two round trips (TLS, then the hello), but the data
/// channels a client dials early wait for its control connection to authenticate; when that
/// took more than 3 s (`client::open`'s `EARLY_JOIN_WITHIN`), they are closed and dialed
/// again.
pub const MAKE_ROOM_AFTER: Duration = Duration::from_secs(5);

/// One kind of connection counted per address and in total.
#[derive(Debug, Default)]
struct Counts {
    total: u32,
    by_address: HashMap<IpAddr, u32>,
    /// Handshakes only: those that may still make room, by order of arrival.
    waiting: BTreeMap<u64, Waiting>,
    arrivals: u64,
    /// Handshakes told to make room whose tickets are not yet dropped.
    ending: u32,
    /// Peers ([`peer_group`]) whose handshake was ended to make room, and when: for
    /// [`MAKE_ROOM_AFTER`] after it they take no place either, so that the peers of a flood
    /// cannot end each other's in a chain, each reconnecting as its own is ended.
    made_room: HashMap<IpAddr, Instant>,
}

/// A handshake under way: since when, from whom ([`peer_group`]), and the signal that ends it
/// to make room.
#[derive(Debug)]
struct Waiting {
    since: Instant,
    group: IpAddr,
    end: Arc<Notify>,
}

/// The counters of one server; cheap to clone.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: Arc<ServerLimits>,
    handshakes: Arc<Mutex<Counts>>,
    sessions: Arc<Mutex<Counts>>,
    channels: Arc<Mutex<Counts>>,
}

/// A counted connection; it is uncounted when dropped, however its task ends.
#[derive(Debug)]
pub struct Ticket {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
    /// A handshake's order of arrival and its signal to make room.
    waiting: Option<(u64, Arc<Notify>)>,
}

impl Ticket {
    /// Completes when this handshake is to give its place to a newcomer (never for a
    /// session's or a channel's ticket): its connection is then closed.
    pub async fn made_room(&self) {
        match &self.waiting {
            Some((_, end)) => end.notified().await,
            None => std::future::pending().await,
        }
    }
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
        if let Some((arrival, _)) = &self.waiting {
            if c.waiting.remove(arrival).is_none() {
                c.ending -= 1;
            }
        }
    }
}

/// Counts a connection of one kind (`cap`) from `peer` unless that would pass the `total` or
/// the `per`-address cap. A handshake (`handshake_at`: now) that would pass only the total
/// is admitted if another can make room ([`room_for`]): that one is told to end, and counts
/// apart until its ticket is dropped.
fn enter(
    counts: &Arc<Mutex<Counts>>,
    peer: IpAddr,
    cap: Cap,
    (total, per): (u32, u32),
    handshake_at: Option<Instant>,
) -> Result<Ticket, Busy> {
    let mut c = counts.lock().expect("admission lock");
    let busy = |per_address, limit| Busy {
        cap,
        per_address,
        limit,
    };
    let full_here = c.by_address.get(&peer).copied().unwrap_or(0) >= per;
    if c.total - c.ending >= total {
        // A handshake from an address at its own cap takes nobody's place.
        let room = handshake_at
            .filter(|_| !full_here)
            .and_then(|now| room_for(&c, peer_group(peer), now));
        let Some(arrival) = room else {
            return Err(busy(false, total));
        };
        let w = c.waiting.remove(&arrival).expect("a waiting handshake");
        w.end.notify_one();
        c.ending += 1;
        let now = handshake_at.expect("room is made for handshakes only");
        c.made_room
            .retain(|_, at| now.saturating_duration_since(*at) < MAKE_ROOM_AFTER);
        c.made_room.insert(w.group, now);
    }
    if full_here {
        return Err(busy(true, per));
    }
    *c.by_address.entry(peer).or_default() += 1;
    c.total += 1;
    let waiting = handshake_at.map(|since| {
        let (arrival, end) = (c.arrivals, Arc::new(Notify::new()));
        c.arrivals += 1;
        let w = Waiting {
            since,
            group: peer_group(peer),
            end: end.clone(),
        };
        c.waiting.insert(arrival, w);
        (arrival, end)
    });
    Ok(Ticket {
        counts: counts.clone(),
        peer,
        waiting,
    })
}

/// The handshake that makes room for a newcomer from `group` when they fill the server: of
/// those that have waited [`MAKE_ROOM_AFTER`], the oldest of the peer ([`peer_group`])
/// holding the most; none if a handshake of the newcomer's own peer has waited that long, or
/// was ended to make room less than that ago. A client's handshakes are younger, so a flood
/// from many addresses, or from one, ends its own; and the peers of a flood, whose
/// handshakes age, take no places from each other, which would keep every handshake too
/// young to give a client its place.
fn room_for(c: &Counts, group: IpAddr, now: Instant) -> Option<u64> {
    let aged = |w: &Waiting| now.saturating_duration_since(w.since) >= MAKE_ROOM_AFTER;
    let lost_one = c
        .made_room
        .get(&group)
        .is_some_and(|at| now.saturating_duration_since(*at) < MAKE_ROOM_AFTER);
    if lost_one || c.waiting.values().any(|w| w.group == group && aged(w)) {
        return None;
    }
    let mut held: HashMap<IpAddr, u32> = HashMap::new();
    for w in c.waiting.values() {
        *held.entry(w.group).or_default() += 1;
    }
    // `waiting` is in order of arrival, and the first of the most is kept.
    let mut best: Option<(u64, u32)> = None;
    for (&arrival, w) in c.waiting.iter().filter(|(_, w)| aged(w)) {
        let n = held[&w.group];
        if best.is_none_or(|(_, most)| n > most) {
            best = Some((arrival, n));
        }
    }
    best.map(|(arrival, _)| arrival)
}

/// Whom a handshake is from, when choosing one to make room: its address, an IPv6 address's
/// /64 (one host may hold a whole /64), an IPv4 address mapped into IPv6 as itself.
fn peer_group(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl Admission {
    /// Counters enforcing `limits`.
    pub fn new(limits: ServerLimits) -> Self {
        Admission {
            limits: Arc::new(limits),
            handshakes: Arc::default(),
            sessions: Arc::default(),
            channels: Arc::default(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &ServerLimits {
        &self.limits
    }

    /// Counts a connection that has yet to authenticate; [`Ticket::made_room`] tells it to
    /// end when a newcomer takes its place.
    pub fn handshake(&self, peer: IpAddr) -> Result<Ticket, Busy> {
        self.handshake_at(peer, Instant::now())
    }

    fn handshake_at(&self, peer: IpAddr, now: Instant) -> Result<Ticket, Busy> {
        let l = &self.limits;
        let caps = (l.handshakes, l.handshakes_per_address);
        enter(&self.handshakes, peer, Cap::Handshakes, caps, Some(now))
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
            Cap::Sessions,
            (l.sessions, l.sessions_per_address),
            None,
        )
    }

    /// Counts a data channel joining a session; its ticket lives as long as the session.
    pub fn channel(&self, peer: IpAddr) -> Result<Ticket, Busy> {
        let l = &self.limits;
        enter(
            &self.channels,
            peer,
            Cap::Channels,
            (l.channels, l.channels_per_address),
            None,
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
            cap: Cap::Sessions,
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
        // So are data channels.
        let _c = a.channel(x).unwrap();
        assert_eq!(a.channels.lock().unwrap().total, 1);
    }

    /// An admission of 4 handshakes, 3 from one address: small enough to fill by hand.
    fn four_handshakes_three_per_address() -> Admission {
        Admission::new(ServerLimits {
            handshakes: 4,
            handshakes_per_address: 3,
            ..ServerLimits::default()
        })
    }

    /// The IPv4 address 10.0.0.`last`.
    fn v4(last: u8) -> IpAddr {
        [10, 0, 0, last].into()
    }

    #[test]
    fn a_full_server_ends_an_aged_handshake_of_the_busiest_peer_for_a_newcomer() {
        let a = four_handshakes_three_per_address();
        let t0 = Instant::now();
        let single = a.handshake_at(v4(1), t0).unwrap();
        let t1 = t0 + Duration::from_secs(1);
        let busy: Vec<Ticket> = (0..3).map(|_| a.handshake_at(v4(2), t1).unwrap()).collect();
        let full = Busy {
            cap: Cap::Handshakes,
            per_address: false,
            limit: 4,
        };
        // None has waited long enough.
        let soon = t0 + MAKE_ROOM_AFTER - Duration::from_millis(1);
        assert_eq!(a.handshake_at(v4(3), soon).unwrap_err(), full);
        let later = t1 + MAKE_ROOM_AFTER;
        // An address at its own cap takes nobody's place.
        assert_eq!(a.handshake_at(v4(2), later).unwrap_err(), full);
        // The busiest peer's oldest makes room, not the oldest of all.
        let newcomer = a.handshake_at(v4(3), later).unwrap();
        assert!(ready_at_once(busy[0].made_room()));
        assert!(!ready_at_once(single.made_room()));
        assert!(!ready_at_once(newcomer.made_room()));
        // Until its task lets go it still counts, apart from the cap.
        let counts = |a: &Admission| {
            let c = a.handshakes.lock().unwrap();
            (c.total, c.ending, c.waiting.len())
        };
        assert_eq!(counts(&a), (5, 1, 4));
        let _next = a.handshake_at(v4(4), later).unwrap();
        assert!(ready_at_once(busy[1].made_room()));
        assert_eq!(counts(&a), (6, 2, 4));
        drop(busy);
        assert_eq!(counts(&a), (3, 0, 3));
    }

    /// Whether `f` is ready at its first poll.
    fn ready_at_once(f: impl std::future::Future<Output = ()>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::pin!(f).poll(&mut cx).is_ready()
    }

    #[test]
    fn an_ipv6_hosts_64_is_one_peer_when_room_is_made_and_ipv4_peers_are_each_their_own() {
        let a = Admission::new(ServerLimits {
            handshakes: 4,
            handshakes_per_address: 1,
            ..ServerLimits::default()
        });
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        // IPv4 peers as a dual-stack socket gives them, then two addresses of one /64, each
        // under its own cap.
        let v4 = ["::ffff:10.0.0.1", "::ffff:10.0.0.2"].map(|s| a.handshake_at(ip(s), t0).unwrap());
        let v6 = ["2001:db8:0:1::1", "2001:db8:0:1::2"].map(|s| a.handshake_at(ip(s), t1).unwrap());
        let _newcomer = a
            .handshake_at(ip("2001:db8:0:2::1"), t1 + MAKE_ROOM_AFTER)
            .unwrap();
        // The /64 holds two, each IPv4 address one: the /64's oldest makes room.
        assert!(ready_at_once(v6[0].made_room()));
        assert!(!ready_at_once(v4[0].made_room()) && !ready_at_once(v4[1].made_room()));
    }

    #[test]
    fn a_peer_with_an_aged_handshake_takes_no_place() {
        let a = four_handshakes_three_per_address();
        let t0 = Instant::now();
        let one: Vec<Ticket> = (0..2).map(|_| a.handshake_at(v4(1), t0).unwrap()).collect();
        let two: Vec<Ticket> = (0..2).map(|_| a.handshake_at(v4(2), t0).unwrap()).collect();
        let later = t0 + MAKE_ROOM_AFTER;
        // Two peers of a flood, each under its own cap, do not end each other's.
        assert!(a.handshake_at(v4(1), later).is_err());
        assert!(a.handshake_at(v4(2), later).is_err());
        assert!(!ready_at_once(one[0].made_room()) && !ready_at_once(two[0].made_room()));
        // A client takes a place for each of its connections, from the peer holding the most.
        let _first = a.handshake_at(v4(3), later).unwrap();
        assert!(ready_at_once(one[0].made_room()));
        let _second = a.handshake_at(v4(3), later).unwrap();
        assert!(ready_at_once(two[0].made_room()));
        assert!(!ready_at_once(one[1].made_room()) && !ready_at_once(two[1].made_room()));
    }

    #[test]
    fn a_client_gets_in_beside_a_flood_of_one_handshake_per_address() {
        let a = four_handshakes_three_per_address();
        let t0 = Instant::now();
        let mut flood: Vec<Ticket> = (1..=4)
            .map(|i| a.handshake_at(v4(i), t0).unwrap())
            .collect();
        let later = t0 + MAKE_ROOM_AFTER;
        let _client = a.handshake_at(v4(9), later).unwrap();
        assert!(ready_at_once(flood[0].made_room()));
        // The peer whose handshake ended reconnects at once: it takes no other's place,
        // which would start a chain of them, each ending an aged one.
        drop(flood.remove(0));
        assert!(a.handshake_at(v4(1), later).is_err());
        assert!(!ready_at_once(flood[0].made_room()));
        // The client's next connection takes one.
        let _second = a.handshake_at(v4(9), later).unwrap();
        assert!(ready_at_once(flood[0].made_room()));
        // Once that long has passed, the peer may take a place again.
        drop(flood.remove(0));
        let much_later = later + MAKE_ROOM_AFTER;
        assert!(a.handshake_at(v4(1), much_later).is_ok());
    }

    #[test]
    fn a_client_of_the_most_channels_gets_all_its_places_beside_two_flooding_peers() {
        let a = Admission::new(ServerLimits::for_descriptors(1024));
        let total = a.limits().handshakes;
        let t0 = Instant::now();
        let peers: [IpAddr; 2] = [[10, 0, 0, 1].into(), [10, 0, 0, 2].into()];
        let flood: Vec<Ticket> = (0..total)
            .map(|i| a.handshake_at(peers[i as usize % 2], t0).unwrap())
            .collect();
        let later = t0 + MAKE_ROOM_AFTER;
        assert!(a.handshake_at(peers[0], later).is_err());
        // The control connection and the most channels, dialed at once.
        let client: IpAddr = [10, 0, 0, 9].into();
        let places: Vec<Ticket> = (0..=MAX_CHANNELS)
            .map(|i| {
                a.handshake_at(client, later)
                    .unwrap_or_else(|e| panic!("connection {i}: {e}"))
            })
            .collect();
        let ended = flood
            .iter()
            .filter(|t| ready_at_once(t.made_room()))
            .count();
        assert_eq!(ended, places.len());
    }

    #[test]
    fn the_default_caps_and_the_files_fit_the_descriptors() {
        for d in [1024, 1025, 1536, 2048, 4096, 4224, 10_000, 65_536, 1 << 20] {
            let l = ServerLimits::for_descriptors(d);
            assert_eq!(l.overcommit(d), None, "{d} descriptors: {l:?}");
            assert!(l.handshakes_per_address > MAX_CHANNELS as u32, "{l:?}");
            assert!(l.sessions_per_address <= l.sessions, "{l:?}");
        }
        let l = ServerLimits::for_descriptors(4224);
        assert_eq!((l.sessions, l.handshakes), (256, 512));
        assert_eq!(
            (l.sessions_per_address, l.handshakes_per_address),
            (64, 256)
        );
        let l = ServerLimits::for_descriptors(1024);
        assert_eq!(
            (l.sessions_per_address, l.handshakes_per_address),
            (56, 136)
        );
        // Below 1,024 a client of the most channels still gets in.
        let l = ServerLimits::for_descriptors(256);
        assert_eq!((l.sessions, l.handshakes, l.channels), (8, 136, 128));
        assert_eq!(l.overcommit(256), Some(32 + 136 + 8 + 256 + 128));
        // The caps before they shared the descriptors: 1,536 at 1,024.
        let before = ServerLimits {
            sessions: 256,
            handshakes: 512,
            ..ServerLimits::for_descriptors(1024)
        };
        assert_eq!(before.overcommit(1024), Some(1568));
    }

    #[test]
    fn channels_take_an_eighth_of_the_descriptors_and_half_of_that_per_address() {
        assert_eq!(channel_caps(1 << 20), (131_072, 65_536));
        assert_eq!(channel_caps(4096), (512, 256));
        // One session of the most channels is always possible.
        assert_eq!(channel_caps(2048), (256, 128));
        assert_eq!(channel_caps(1024), (128, 128));
        assert_eq!(channel_caps(256), (128, 128));
        assert_eq!(channels_per_address(200), 128);
        assert_eq!(channels_per_address(64), 64);
    }
}
