//! The server: one listening port for the control connections and data channels of every
//! session; sessions are confined to the server's root and independent of each other (a
//! malformed or hostile connection ends only itself).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};

use super::admission::{warn_of_overcommit, Admission, ServerLimits, Ticket};
use super::block_memory::BlockMemory;
use super::boxed::boxed;
use super::budget::FileBudget;
use super::engine::stopped;
use super::faults::FaultInjection;
use super::growth::{Arrivals, Growth, Joiner, Reserve, Setup};
use super::handshake;
use super::receiver::{ReceiveEngine, Sink};
use super::report::LiveStats;
use super::sampler::SendingSide;
use super::sender::{Announced, SendEngine};
use super::source::SendSource;
use super::tuning::{
    enforce_congestion, host_facts, local_plan, online_tuner, read_setup, LocalPlan, Side,
};
use super::wire::{control_pair, Side as WireSide};
use super::Auth;
use crate::channels::auth::{SessionId, SessionKey, TokenKey};
use crate::channels::control::{BenchDirection, Message, Operation, Request};
use crate::channels::handshake::Heard;
use crate::channels::limits;
use crate::channels::opening::{ServerHeard, ServerOpening};
use crate::error::{Error, Result};
use crate::fsio::dest::Destination;
use crate::fsio::root::Scope;
use crate::fsio::source::SourceTree;
use crate::session::client::bench_limit;
use crate::session::mptcp_paths::MAX_USERSPACE_SUBFLOWS;
use crate::transport::mptcp::{self, SignalEndpoints, MAX_EXTRA_SUBFLOWS};
use crate::transport::mptcp_pm::{EventListener, PathManagerKind, UserspacePm};
use crate::transport::subflow_pacing;
use crate::transport::tls::{ServerTls, Stream};
use crate::transport::{self, SocketOptions};

/// How long a server waits for all data channels of a session to join.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Configuration of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Directory the server serves and writes into; nothing outside it is reachable.
    pub root: PathBuf,
    /// Address and port to listen on.
    pub listen: SocketAddr,
    /// Authentication.
    pub auth: Auth,
    /// Deliberate damage to blocks this server sends, and crashes, for tests of the
    /// integrity and crash paths (`testing` feature).
    #[cfg(feature = "testing")]
    pub faults: FaultInjection,
    /// How many connections and sessions it holds at once, and how long a peer may take to
    /// authenticate and to ask.
    pub limits: ServerLimits,
    /// Listen with Multipath TCP, so MPTCP clients get MPTCP channels (plain TCP clients are
    /// served as before).
    pub mptcp: bool,
    /// With `mptcp`, the path manager its connections run (root only for the userspace one).
    pub mptcp_pm: PathManagerKind,
    /// TLS: the server's key, and whether clients may ask for clear text.
    pub tls: ServerTls,
}

impl ServerConfig {
    /// The test hooks in force: none without the `testing` feature.
    fn faults(&self) -> FaultInjection {
        #[cfg(feature = "testing")]
        return self.faults;
        #[cfg(not(feature = "testing"))]
        FaultInjection::default()
    }
}

struct Pending {
    key: SessionKey,
    /// One slot per channel the session may have: true once that channel joined.
    joined: Vec<bool>,
    /// The joined channels' counts against the server's caps, held while the session lives.
    tickets: Vec<Ticket>,
    tx: mpsc::UnboundedSender<(u16, Stream)>,
}

impl State {
    /// Leaves `session` the join slots of its `n` channels, once its request says how many:
    /// until then any of the protocol's may be taken. A channel that already joined in a slot
    /// beyond `n` is queued, and ends the session ([`joined_channels`]).
    fn slots_for(&self, session: SessionId, n: u16) {
        let mut pending = self.pending.lock().expect("sessions lock");
        if let Some(p) = pending.get_mut(&session) {
            p.joined.truncate(n as usize);
        }
    }

    /// Reserves join slots for `count` more channels of `session`; returns the first index,
    /// or `None` when the session would exceed [`limits::MAX_CHANNELS`].
    fn reserve(&self, session: SessionId, count: u16) -> Option<u16> {
        let mut pending = self.pending.lock().expect("sessions lock");
        let p = pending.get_mut(&session)?;
        let first = p.joined.len();
        if first + count as usize > limits::MAX_CHANNELS as usize {
            return None;
        }
        p.joined.resize(first + count as usize, false);
        u16::try_from(first).ok()
    }
}

/// A session's join slots, and the channels that joined in them.
struct SessionSlots {
    _slots: Slots,
    tx: mpsc::UnboundedSender<(u16, Stream)>,
    rx: mpsc::UnboundedReceiver<(u16, Stream)>,
}

impl SessionSlots {
    /// Opens the slots of an authenticated session. Its data channels may join from then on,
    /// while its request is on its way (a client dials them beside its control connection):
    /// until the request says how many the session has ([`State::slots_for`]), any of the
    /// protocol's may be taken, and the joined wait in `rx` for the request to be read.
    fn open(state: &Arc<State>, session: SessionId, key: &SessionKey) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        state.pending.lock().expect("sessions lock").insert(
            session,
            Pending {
                key: key.clone(),
                joined: vec![false; limits::MAX_CHANNELS as usize],
                tickets: Vec::new(),
                tx: tx.clone(),
            },
        );
        let _slots = Slots {
            state: state.clone(),
            session,
        };
        SessionSlots { _slots, tx, rx }
    }
}

/// A session's join slots, removed when the session ends however it ends.
struct Slots {
    state: Arc<State>,
    session: SessionId,
}

impl Drop for Slots {
    /// The session's entry goes out under the lock and is dropped after it: its channels'
    /// tickets take the admission's lock.
    fn drop(&mut self) {
        let gone = self
            .state
            .pending
            .lock()
            .expect("sessions lock")
            .remove(&self.session);
        drop(gone);
    }
}

struct State {
    scope: Scope,
    key: TokenKey,
    tls: ServerTls,
    /// Files open for receiving, across sessions.
    files: FileBudget,
    /// Buffers for blocks being received, across sessions.
    block_memory: BlockMemory,
    faults: FaultInjection,
    admission: Admission,
    pending: Mutex<HashMap<SessionId, Pending>>,
    /// Told when a session that moved files (a push or a pull) ends, for [`Server::run_once`].
    transfer_ended: Notify,
    /// Why the server is stopping, once it is ([`Stopper`]).
    stop: watch::Sender<Option<String>>,
}

/// Tells [`State::transfer_ended`] when dropped, however the session ends.
struct TransferSession<'a>(&'a State);

impl Drop for TransferSession<'_> {
    fn drop(&mut self) {
        self.0.transfer_ended.notify_one();
    }
}

/// A bound server; [`Server::run`] serves until the task is dropped.
pub struct Server {
    listener: TcpListener,
    state: Arc<State>,
    /// What the MPTCP path manager does for this server; undone with the server.
    _path_manager: ServerPm,
}

impl Server {
    /// Checks the configuration and binds the port. `--no-auth` is refused unless the listen
    /// address is loopback.
    pub async fn bind(cfg: ServerConfig) -> Result<Server> {
        if cfg.auth == Auth::NoAuth && !cfg.listen.ip().is_loopback() {
            return Err(Error::Usage(format!(
                "`no_auth` is only allowed on a loopback address, not {}: give a `token_file`",
                cfg.listen.ip()
            )));
        }
        let scope = Scope::confined(&cfg.root)
            .map_err(Error::io(format!("server root {}", cfg.root.display())))?;
        warn_of_overcommit(&cfg.limits);
        let bound = transport::bind(cfg.listen, cfg.mptcp)
            .map_err(Error::io(format!("binding {}", cfg.listen)))?;
        // Announced before listening, so that a client which finds the port open also finds
        // the subflow ports, and that the limits this raises are set before any client can
        // raise its own (a read-modify-write after a client's would undo the client's).
        let path_manager = match (cfg.mptcp, cfg.mptcp_pm) {
            (false, _) => ServerPm::None,
            (true, PathManagerKind::Kernel) => {
                subflow_ports(bound.local_addr().map_err(Error::io("the bound address"))?)
                    .map_or(ServerPm::None, |e| ServerPm::Announced { _endpoints: e })
            }
            (true, PathManagerKind::Userspace) => userspace_pm()?,
        };
        let listener = bound
            .listen()
            .map_err(Error::io(format!("listening on {}", cfg.listen)))?;
        Ok(Server {
            listener,
            _path_manager: path_manager,
            state: Arc::new(State {
                scope,
                key: cfg.auth.key(),
                tls: cfg.tls.clone(),
                files: FileBudget::for_this_process(),
                block_memory: BlockMemory::with_bytes(cfg.limits.block_memory),
                faults: cfg.faults(),
                admission: Admission::new(cfg.limits),
                pending: Mutex::new(HashMap::new()),
                transfer_ended: Notify::new(),
                stop: watch::Sender::new(None),
            }),
        })
    }

    /// The fingerprint of the server's TLS key, which clients pin.
    pub fn fingerprint(&self) -> crate::transport::tls::Fingerprint {
        self.state.tls.fingerprint()
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// A handle that stops this server's sessions, telling each client why.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> hsxfer::Result<()> {
    /// use hsxfer::{Server, ServerConfig};
    /// # let cfg: ServerConfig = unimplemented!();
    /// let server = Server::bind(cfg).await?;
    /// let stopper = server.stopper();
    /// tokio::select! {
    ///     r = server.run() => r?,
    ///     _ = tokio::signal::ctrl_c() => stopper.stop("SIGINT").await,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stopper(&self) -> Stopper {
        Stopper {
            state: self.state.clone(),
        }
    }

    /// Serves until the first session that moves files (a push or a pull) ends, however it
    /// ends: the one-shot server a client starts over SSH. Sessions that only measure (a
    /// probe's benches) may come before it.
    pub async fn run_once(self) -> Result<()> {
        let state = self.state.clone();
        tokio::select! {
            r = self.run() => r,
            _ = state.transfer_ended.notified() => Ok(()),
        }
    }

    /// Accepts connections forever.
    pub fn run(self) -> impl Future<Output = Result<()>> + Send {
        boxed(self.serve())
    }

    async fn serve(self) -> Result<()> {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // A vanished peer frees its connection, whatever phase it is in.
            if let Err(e) = transport::keep_alive(&stream) {
                tracing::warn!("{peer}: setting keepalives: {e}");
            }
            let ticket = match self.state.admission.handshake(peer.ip()) {
                Ok(t) => t,
                Err(busy) => {
                    tracing::warn!("{peer}: turned away: {busy}");
                    handshake::turn_away(stream, busy);
                    continue;
                }
            };
            let state = self.state.clone();
            tokio::spawn(async move {
                match connection(state, stream, peer, ticket).await {
                    Ok(()) => {}
                    Err(Error::Stopping(why)) => {
                        tracing::info!("{peer}: session ended, the server is stopping ({why})")
                    }
                    Err(e) => tracing::warn!("{peer}: {e}"),
                }
            });
        }
    }
}

/// Stops a server's sessions ([`Server::stopper`]).
#[derive(Clone)]
pub struct Stopper {
    state: Arc<State>,
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopper").finish_non_exhaustive()
    }
}

/// How long [`Stopper::stop`] waits for the sessions to tell their clients and end.
const STOP_GRACE: Duration = Duration::from_secs(3);

impl Stopper {
    /// Ends every session with [`Error::Stopping`] (`why`: "SIGTERM", say), which tells its
    /// client to run the same command again once the server is back (the copy resumes), and
    /// waits up to 3 s for them to end. A session that starts after this ends the same way.
    pub async fn stop(&self, why: &str) {
        self.state.stop.send_replace(Some(why.to_string()));
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while self.state.admission.sessions() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// What the MPTCP path manager does for a server.
#[derive(Debug)]
enum ServerPm {
    /// Nothing: no MPTCP, or no root to set anything.
    None,
    /// The in-kernel manager announces extra ports.
    Announced { _endpoints: SignalEndpoints },
    /// The namespace selects the userspace manager, and its events have a listener, so the
    /// connections accept the subflows clients open.
    Userspace {
        _selected: UserspacePm,
        _listener: EventListener,
    },
}

/// Selects the userspace path manager for the connections the server accepts (root only).
fn userspace_pm() -> Result<ServerPm> {
    if !transport::cc::privileged() {
        return Err(Error::Usage(
            "the userspace MPTCP path manager needs root: it is the host's (its network \
             namespace's)"
                .into(),
        ));
    }
    let fail = |e: std::io::Error| Error::Usage(format!("no userspace MPTCP path manager: {e}"));
    let listener = EventListener::subscribe().map_err(fail)?;
    let selected = UserspacePm::select().map_err(fail)?;
    tracing::info!(
        "MPTCP connections run the userspace path manager: clients open their own subflows \
         (hsxfer clients as root, up to {MAX_USERSPACE_SUBFLOWS}); clients that wait for \
         announced ports get one"
    );
    Ok(ServerPm::Userspace {
        _selected: selected,
        _listener: listener,
    })
}

/// Announces the ports after the server's own to MPTCP clients, so that each of their
/// connections can open up to [`MAX_EXTRA_SUBFLOWS`] more subflows. That needs root and a
/// specific listen address; without them clients get one subflow per connection.
fn subflow_ports(addr: SocketAddr) -> Option<SignalEndpoints> {
    let why = match (transport::cc::privileged(), addr.ip().is_unspecified()) {
        (false, _) => "announcing subflow ports to the MPTCP path manager needs root".to_string(),
        (true, true) => "give a specific listen address to announce subflow ports".to_string(),
        (true, false) => match SignalEndpoints::add(addr.ip(), addr.port(), MAX_EXTRA_SUBFLOWS) {
            Ok(e) => {
                tracing::info!(
                    "MPTCP clients may open subflows to ports {}-{} as well",
                    addr.port() as u32 + 1,
                    addr.port() as u32 + MAX_EXTRA_SUBFLOWS as u32
                );
                return Some(e);
            }
            Err(e) => e.to_string(),
        },
    };
    tracing::warn!("MPTCP clients get one subflow per connection: {why}");
    None
}

/// Serves one accepted connection: authenticates it within the handshake timeout (while
/// `handshaking` counts it), then runs its session or hands it to its session as a channel.
async fn connection(
    state: Arc<State>,
    tcp: TcpStream,
    peer: SocketAddr,
    handshaking: Ticket,
) -> Result<()> {
    let limits = state.admission.limits();
    let handshake = async {
        let Some((mut s, m)) = handshake::server_open(tcp, &state.tls).await? else {
            return Ok(None);
        };
        let Some(m) = handshake::server_accept(&mut s, m).await? else {
            return Ok(None);
        };
        Ok::<_, Error>(Some((s, m)))
    };
    let handshake = async {
        tokio::select! {
            r = tokio::time::timeout(limits.handshake_timeout, handshake) => Some(r),
            () = handshaking.made_room() => None,
        }
    };
    let Some(handshake) = handshake.await else {
        tracing::debug!("{peer}: closed, its handshake making room for a newcomer");
        return Ok(());
    };
    let accepted = match handshake {
        Err(_) => return Err(Error::Timeout("waiting for the peer's handshake")),
        // Not worth a warning: a client drops the data channels it dialed for a session that
        // did not open, whatever their phase.
        Ok(Err(Error::PeerVanished)) => {
            tracing::debug!("{peer}: left during its handshake");
            return Ok(());
        }
        Ok(r) => r?,
    };
    let Some((mut s, mut m)) = accepted else {
        tracing::debug!(
            "{peer}: closed before its hello (a port check, or a data channel its client did not use)"
        );
        return Ok(());
    };
    drop(handshaking);
    match m.heard().expect("a complete hello") {
        Heard::Control => {
            let session: SessionId = rand::random();
            let Ok(skey) = m.accept_control(&state.key, session) else {
                handshake::close_with(s, &mut m).await;
                return Err(Error::AuthRefused(peer.to_string()));
            };
            let counted = match state.admission.session(peer.ip()) {
                Ok(t) => t,
                Err(busy) => {
                    m.turn_away(busy);
                    handshake::close_with(s, &mut m).await;
                    return Err(Error::Busy {
                        peer: peer.to_string(),
                        busy,
                    });
                }
            };
            // Before the welcome: the client joins its data channels as soon as it has it.
            let slots = SessionSlots::open(&state, session, &skey);
            m.welcome();
            handshake::answer(&mut s, &mut m).await?;
            s.tcp().set_nodelay(true).ok();
            let out = control(state, s, peer, session, skey, slots).await;
            drop(counted);
            out
        }
        Heard::Join { session, channel } => {
            let joined = {
                let mut pending = state.pending.lock().expect("sessions lock");
                let p = pending.get_mut(&session);
                let free = p
                    .as_ref()
                    .is_some_and(|p| p.joined.get(channel as usize) == Some(&false));
                // Counted before it is admitted: past the cap it is turned away instead.
                match free.then(|| state.admission.channel(peer.ip())).transpose() {
                    Err(busy) => {
                        m.turn_away(busy);
                        Err(Error::Busy {
                            peer: peer.to_string(),
                            busy,
                        })
                    }
                    Ok(ticket) => {
                        let admitted = m.admit_join(p.as_ref().map(|p| &p.key), free);
                        match (p, ticket) {
                            (Some(p), Some(ticket)) if admitted => {
                                p.joined[channel as usize] = true;
                                p.tickets.push(ticket);
                                Ok(p.tx.clone())
                            }
                            _ => Err(Error::Refused(format!("bad join for channel {channel}"))),
                        }
                    }
                }
            };
            let tx = match joined {
                Ok(tx) => tx,
                Err(e) => {
                    handshake::close_with(s, &mut m).await;
                    return Err(e);
                }
            };
            handshake::answer(&mut s, &mut m).await?;
            // Under the lock, so that a slot the request has closed since takes nothing
            // (`State::slots_for`): the session then counts on what it finds queued.
            let pending = state.pending.lock().expect("sessions lock");
            if pending
                .get(&session)
                .is_some_and(|p| (channel as usize) < p.joined.len())
            {
                let _ = tx.send((channel, s));
            }
            Ok(())
        }
    }
}

async fn control(
    state: Arc<State>,
    ctrl: Stream,
    peer: SocketAddr,
    session: SessionId,
    key: SessionKey,
    slots: SessionSlots,
) -> Result<()> {
    let (mut r, w) = control_pair(ctrl, &key, WireSide::Server);
    let mut w = w.hiding(state.scope.clone());
    let SessionSlots { _slots, tx, mut rx } = slots;
    // Pings and facts come first; the request must follow soon, or the session slot is held
    // by a peer that does nothing.
    let asked_by = Instant::now() + state.admission.limits().request_timeout;
    let mut opening = ServerOpening::new();
    let asked = async {
        loop {
            let next = tokio::time::timeout_at(asked_by.into(), r.expect())
                .await
                .map_err(|_| Error::Timeout("waiting for the client's request"))?;
            match opening.on_message(next?)? {
                ServerHeard::Reply(m) => w.send(&m).await?,
                ServerHeard::Facts => w.send(&Message::HostFacts(host_facts()?)).await?,
                ServerHeard::Request(req) => return Ok(*req),
            }
        }
    };
    let mut stop = Some(state.stop.subscribe());
    let asked = async {
        tokio::select! {
            r = asked => r,
            e = stopped(&mut stop) => Err(e),
        }
    };
    let req = match asked.await {
        Ok(req) => req,
        Err(e) => {
            // Say why (a forged message, say), unless the client is gone.
            if !matches!(e, Error::PeerVanished) {
                w.abort(&e).await;
            }
            return Err(e);
        }
    };
    let _transfer = matches!(req.op, Operation::Push { .. } | Operation::Pull { .. })
        .then(|| TransferSession(&state));
    // Check everything that can be checked before any data channel is opened. A stop
    // (SIGTERM) ends this and the wait for the channels too, telling the client to run again.
    let prepared = tokio::select! {
        p = prepare_role(&state, &req) => p,
        e = stopped(&mut stop) => Err(e),
    };
    let prepared = prepared.and_then(|(role, note)| {
        let (side, tuner) = match role {
            Role::Send(_) => (Side::Send, online_tuner(&req.tuning, req.channels)),
            Role::Receive(_) => (Side::Receive, None),
        };
        let mut plan = local_plan(&req.tuning, side, req.channels, "server", tuner.as_ref())?;
        plan.notes.extend(note.map(|n| format!("server: {n}")));
        Ok((role, plan, tuner))
    });
    let (role, plan, tuner) = match prepared {
        Ok(p) => p,
        Err(e @ Error::Stopping(_)) => {
            w.abort(&e).await;
            return Err(e);
        }
        Err(e) => {
            // The client says "server refused".
            w.abort(&Error::Usage(e.to_string())).await;
            return Err(e);
        }
    };
    tracing::info!("{peer}: {:?} over {} channels", req.op, req.channels);
    let n = req.channels;
    state.slots_for(session, n);
    w.send(&opening.accept(n, plan.notes.clone())).await?;
    let joined = tokio::select! {
        c = joined_channels(&mut rx, n) => c,
        e = stopped(&mut stop) => Err(e),
    };
    let mut channels = match joined {
        Ok(c) => c,
        Err(e) => {
            w.abort(&e).await;
            return Err(e);
        }
    };
    channels.sort_by_key(|c| c.0);
    let channels: Vec<Stream> = channels.into_iter().map(|c| c.1).collect();
    let live = Arc::new(LiveStats::new(channels.len()));
    if let Err(e) = apply_plan(&channels, &plan, &req, &role, &live) {
        w.abort(&e).await;
        r.linger_until_closed().await;
        return Err(e);
    }
    let (block_size, faults) = (req.block_size, state.faults);
    let reserve: Reserve = {
        let state = state.clone();
        Arc::new(move |count| state.reserve(session, count))
    };
    let plan = Arc::new(plan);
    let out = match role {
        Role::Receive(sink) => {
            let p = plan.clone();
            let setup: Setup = Box::new(move |i, c| configure(c, i, &p.for_channel(i), None));
            ReceiveEngine {
                ctrl_r: r,
                ctrl_w: w,
                channels,
                sink,
                block_size,
                live: live.clone(),
                digest_key: state.key.digest_key(),
                await_telemetry: false,
                growth: Some(growth(reserve, tx, rx, setup, None)),
                crash_at: faults.crash_at,
                slow_block_writes: faults.slow_block_writes,
                slow_part_closes: faults.slow_part_closes,
                budget: Some(state.files.clone()),
                block_memory: state.block_memory.clone(),
                unplanned_files: 0,
                stop: Some(state.stop.subscribe()),
                idle: state.admission.limits().idle,
            }
            .run()
            .await
        }
        Role::Send(source) => {
            let side = SendingSide::start(live.clone(), tuner, &channels)?;
            let (sampler, l, p) = (side.sampler.clone(), live.clone(), plan.clone());
            let setup: Setup = Box::new(move |i, c| {
                configure(c, i, &p.for_channel(i), Some((&l, Duration::ZERO)))?;
                sampler.attach(i, c)
            });
            let out = SendEngine {
                ctrl_r: r,
                ctrl_w: w,
                channels,
                stagger: stagger_of(&req),
                gate: side.gate,
                source,
                block_size,
                live: live.clone(),
                digest_key: state.key.digest_key(),
                faults,
                forward_telemetry: Some(Duration::from_millis(req.tuning.interval_ms as u64)),
                growth: Some(growth(reserve, tx, rx, setup, side.requests)),
                stop: Some(state.stop.subscribe()),
                idle: state.admission.limits().idle,
                announced: Some(Announced::new(block_size).unplanned(unplanned_files(&req.op))),
            }
            .run()
            .await;
            side.sampler.stop();
            out
        }
    }?;
    tracing::info!(
        "{peer}: done, {} bytes, {} files ({} skipped)",
        live.total(),
        out.files,
        out.files_skipped
    );
    Ok(())
}

/// The session's `n` data channels, as they join within [`JOIN_TIMEOUT`]. A channel that
/// joined before the request in a slot beyond `n` fails the session: it was queued before
/// [`State::slots_for`] closed those slots, so it is here by the time the `n` are.
async fn joined_channels(
    rx: &mut mpsc::UnboundedReceiver<(u16, Stream)>,
    n: u16,
) -> Result<Vec<(u16, Stream)>> {
    let deadline = Instant::now() + JOIN_TIMEOUT;
    let mut channels = Vec::with_capacity(n as usize);
    while channels.len() < n as usize {
        match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
            Ok(Some(c)) if c.0 < n => channels.push(c),
            Ok(Some((c, _))) => return Err(beyond(c, n)),
            _ => return Err(Error::Timeout("waiting for data channels to join")),
        }
    }
    match rx.try_recv() {
        Ok((c, _)) => Err(beyond(c, n)),
        Err(_) => Ok(channels),
    }
}

fn beyond(channel: u16, n: u16) -> Error {
    Error::Refused(format!(
        "data channel {channel} joined a session of {n} channels"
    ))
}

/// Applies this end's socket options to the joined data channels; on the sending side,
/// makes each run the congestion control asked for, records the settings in force and
/// starts keeping a trace if the client wants one.
fn apply_plan(
    channels: &[Stream],
    plan: &LocalPlan,
    req: &Request,
    role: &Role,
    live: &LiveStats,
) -> Result<()> {
    let stagger = stagger_of(req);
    if let Role::Send(_) = role {
        if let Some(g) = &plan.dmc_group {
            // With MPTCP the subflows form the group in the kernel by themselves.
            if let Some(c) = channels.first().filter(|c| mptcp::is_mptcp(*c)) {
                g.follow_mptcp(c);
            }
            live.telemetry.set_group(g.clone());
        }
        if let Some(b) = plan.guard_baseline() {
            live.telemetry.set_guard_baseline(b);
        }
    }
    for (i, (c, opts)) in channels.iter().zip(&plan.options).enumerate() {
        let sending = matches!(role, Role::Send(_)).then_some((live, stagger[i]));
        configure(c, i, opts, sending)?;
    }
    if req.tuning.trace && matches!(role, Role::Send(_)) {
        live.telemetry.enable_trace();
    }
    Ok(())
}

/// Applies this end's options to data channel `i`; on the sending side (`sending`: the
/// telemetry and the channel's start offset) makes it run the congestion control asked for
/// and records the settings in force.
fn configure(
    c: &Stream,
    i: usize,
    opts: &SocketOptions,
    sending: Option<(&LiveStats, Duration)>,
) -> Result<()> {
    c.tcp().set_nodelay(false).ok();
    let mut opts = opts.clone();
    if opts.max_pacing_rate.is_some() && mptcp::is_mptcp(c) && !subflow_pacing::available() {
        tracing::warn!(
            "data channel {i} runs unpaced: pacing MPTCP subflows needs root (a BPF program)"
        );
        opts.max_pacing_rate = None;
    }
    let opts = &opts;
    // The congestion control last, after the dmctcp tag, and only if the route's differs:
    // under `congctl lock` even setting the algorithm in force fails.
    let others = SocketOptions {
        congestion: None,
        ..opts.clone()
    };
    others
        .apply(c)
        .map_err(Error::io(format!("configuring data channel {i}")))?;
    enforce_congestion(c, i, opts, "server")?;
    if let Some((live, stagger)) = sending {
        live.telemetry.set_setup(read_setup(c, i, opts, stagger)?);
    }
    Ok(())
}

/// Growth of a server's session: it admits the client's joins into reserved slots.
fn growth(
    reserve: Reserve,
    deliver: mpsc::UnboundedSender<(u16, Stream)>,
    joined: mpsc::UnboundedReceiver<(u16, Stream)>,
    setup: Setup,
    requests: Option<mpsc::UnboundedReceiver<u16>>,
) -> Growth {
    Growth {
        joiner: Joiner::Admit(reserve),
        deliver,
        setup,
        arrivals: Some(Arrivals {
            joined: Some(joined),
            requests,
        }),
    }
}

/// The requested start offset of each channel.
fn stagger_of(req: &Request) -> Vec<Duration> {
    (0..req.channels as usize)
        .map(|i| Duration::from_micros(req.tuning.stagger_us.get(i).copied().unwrap_or(0)))
        .collect()
}

/// How many first files a pull lets this server send before their plans (0 for other
/// operations).
fn unplanned_files(op: &Operation) -> u32 {
    match op {
        Operation::Pull {
            unplanned_files, ..
        } => *unplanned_files,
        _ => 0,
    }
}

enum Role {
    Send(SendSource),
    Receive(Sink),
}

/// Checks the request and prepares this end's part: the destination of a push, the walked
/// tree of a pull (on the blocking pool: a large tree takes a while to list), or the
/// generated data of a bench; with a note for the client on what a pull's walk passed over.
async fn prepare_role(state: &State, req: &Request) -> Result<(Role, Option<String>)> {
    Ok(match &req.op {
        Operation::Push { dest, sources } => (
            Role::Receive(Sink::Files(Destination::resolve(
                state.scope.clone(),
                dest,
                *sources,
            )?)),
            None,
        ),
        Operation::Pull {
            sources, recursive, ..
        } => {
            // The same source named twice goes once, and two with one name are refused
            // (`SourceTree::walk`).
            let paths = sources
                .iter()
                .map(|s| state.scope.resolve(s))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let (recursive, scope) = (*recursive, state.scope.clone());
            let block_size = req.block_size;
            let tree = tokio::task::spawn_blocking(move || {
                let tree = SourceTree::walk(&scope, &paths, recursive)?;
                tree.check_blocks(block_size).map(|()| tree)
            })
            .await
            .map_err(Error::task("listing the sources"))??;
            let note = tree.passed_over_note();
            (Role::Send(SendSource::tree(tree)), note)
        }
        Operation::Bench {
            direction: BenchDirection::Upload,
            ..
        } => (Role::Receive(Sink::Discard), None),
        Operation::Bench {
            direction: BenchDirection::Download,
            bytes,
            seconds,
        } => (
            Role::Send(SendSource::generated(
                req.block_size,
                bench_limit(*bytes, *seconds)?,
                req.channels,
                Duration::from_micros(req.tuning.rtt_us),
            )),
            None,
        ),
    })
}
