//! The client: opens a session on a server and runs the sending or receiving engine,
//! depending on the operation.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::faults::FaultInjection;
use super::growth::{
    connect_channel, open_channel, timed_connect, Arrivals, Connector, Dialer, Growth, Joiner,
    Setup,
};
use super::handshake::{self, Opener};
use super::mptcp_paths::{MptcpPaths, PathManager};
use super::receiver::{ReceiveEngine, Sink};
use super::report::{LiveStats, SideOutcome, TransferReport, TuningReport};
use super::sampler::SendingSide;
use super::secure::{open_control, OpenedControl, Security};
use super::sender::{Announced, SendEngine};
use super::source::{BenchLimit, SendSource};
use super::tuning::{
    check_congestion, enforce_congestion, local_plan, online_tuner, read_setup, LocalPlan, Side,
};
use super::wire::{control_pair, ControlReader, ControlWriter, Side as WireSide};
use super::{Auth, DEFAULT_PORT};
use crate::channels::control::{
    BenchDirection, HostFacts, Message, OnlineTuning, Operation, Policy, Request, Tuning,
    PROTOCOL_VERSION,
};
use crate::channels::limits;
use crate::channels::opening::{Answer, ClientOpening, OpeningError};
use crate::error::{Error, Result};
use crate::fsio::dest::Destination;
use crate::fsio::root::Scope;
use crate::fsio::source::SourceTree;
use crate::transport::mptcp::{self, SubflowCounts, MAX_EXTRA_SUBFLOWS};
use crate::transport::route;
use crate::transport::subflow_pacing;
use crate::transport::tcp_info::tcp_info;
use crate::transport::tls::{ReadPart, Stream, WritePart};
use crate::transport::{SocketOptions, Transport};
use crate::tuning::bdp::{self, BufferChoice, BufferRequest};
use crate::tuning::defaults;
use crate::tuning::desync::{
    effective_stagger, pacing_caps, stagger_offsets, PaceChoice, StaggerChoice,
};
use crate::tuning::online::{OnlineTuner, METER_CC};

/// What is known of the path's bottleneck rate before the transfer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathRate {
    /// Nothing: the online tuner measures it (or, with [`Tune::Off`], buffers are sized to
    /// the outgoing interface's speed and nothing is paced).
    #[default]
    Unknown,
    /// The user's figure for the bottleneck, bits/s on the wire (`--rate`).
    Given(u64),
    /// A goodput rate measured moments ago (a probe's first trial), bits/s of payload.
    Measured(u64),
    /// A goodput rate measured earlier and saved (a profile: a probe or an earlier copy),
    /// bits/s of payload. It may be stale or low, so the online tuner probes above it early.
    Saved(u64),
}

/// Whether the sending side tunes the transfer while data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tune {
    /// Meter the path with the first channel when its rate is unknown, pace every channel
    /// just below the rate, and add channels while they pay, retiring added ones that bring
    /// nothing (`hsxfer::tuning::online`).
    #[default]
    Online,
    /// The settings planned at the start are final.
    Off,
}

/// Options of a transfer, shared by push, pull and bench.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Number of parallel data channels to open with (1..=[`limits::MAX_CHANNELS`]).
    pub channels: u16,
    /// Most channels the online tuner may run (set it to `channels` to fix the count).
    pub max_channels: u16,
    /// Block size in bytes (the unit of scheduling, checking and resuming).
    pub block_size: u32,
    /// Server port.
    pub port: u16,
    /// Authentication.
    pub auth: Auth,
    /// Congestion control of the sending sockets, cycled over the channels; empty keeps the
    /// sending host's default.
    pub cc: Vec<String>,
    /// Socket buffer sizing.
    pub buffer: BufferChoice,
    /// The path's bottleneck rate, if known: sizes buffers and automatic pacing.
    pub rate: PathRate,
    /// Whether the sending side tunes the transfer while it runs.
    pub tune: Tune,
    /// Which congestion controls the online tuner may choose.
    pub policy: Policy,
    /// Where settings came from when not from the caller (e.g. a saved profile), for the
    /// report.
    pub origin: Vec<String>,
    /// Path RTT; `None` measures it (pings on the control connection and its `TCP_INFO`).
    pub rtt: Option<Duration>,
    /// Staggered channel starts.
    pub stagger: StaggerChoice,
    /// Per-channel pacing caps of the sending side.
    pub pace: PaceChoice,
    /// How often a sending server reports telemetry.
    pub interval: Duration,
    /// Move the data over one Multipath TCP connection (`IPPROTO_MPTCP`) whose subflows are
    /// the channels: `channels` subflows when the server announces subflow ports and the
    /// path manager's limits allow them (raised for the transfer when run as root). It falls
    /// back to TCP by itself when the server does not listen with MPTCP; the report's
    /// `transport` and `subflows` say what ran. Its subflows are paced by a BPF program,
    /// which needs root ([`crate::transport::subflow_pacing`]); without root they run
    /// unpaced.
    pub mptcp: bool,
    /// With `mptcp`, which of this host's addresses the connection opens subflows from, each
    /// with `channels` subflows (at most 9 in all, the kernel path manager's limit).
    pub mptcp_paths: MptcpPaths,
    /// TLS (the default) or clear text, and which server keys are accepted.
    pub security: Security,
    /// Deliberate damage, for tests of the integrity path (`testing` feature).
    #[cfg(feature = "testing")]
    pub faults: FaultInjection,
}

impl TransferOptions {
    /// The test hooks in force: none without the `testing` feature.
    pub(crate) fn faults(&self) -> FaultInjection {
        #[cfg(feature = "testing")]
        return self.faults;
        #[cfg(not(feature = "testing"))]
        FaultInjection::default()
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            channels: defaults::CHANNELS,
            max_channels: defaults::MAX_TUNED_CHANNELS,
            block_size: defaults::BLOCK_SIZE,
            port: DEFAULT_PORT,
            auth: Auth::NoAuth,
            cc: Vec::new(),
            buffer: BufferChoice::Auto,
            rate: PathRate::Unknown,
            tune: Tune::Online,
            policy: Policy::Fair,
            origin: Vec::new(),
            rtt: None,
            stagger: StaggerChoice::Auto,
            pace: PaceChoice::Auto,
            interval: Duration::from_secs(1),
            mptcp: false,
            mptcp_paths: MptcpPaths::Auto,
            security: Security::default(),
            #[cfg(feature = "testing")]
            faults: FaultInjection::default(),
        }
    }
}

impl TransferOptions {
    /// Checks option ranges, naming the bad value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=limits::MAX_CHANNELS).contains(&self.channels) {
            return Err(Error::Usage(format!(
                "channel count {} is out of range: use 1 to {}",
                self.channels,
                limits::MAX_CHANNELS
            )));
        }
        if !(limits::MIN_BLOCK..=limits::MAX_BLOCK).contains(&self.block_size) {
            return Err(Error::Usage(format!(
                "block size {} is out of range: use {} to {} bytes",
                self.block_size,
                limits::MIN_BLOCK,
                limits::MAX_BLOCK
            )));
        }
        if self.mptcp {
            self.mptcp_paths.check()?;
        }
        if self.mptcp && matches!(self.pace, PaceChoice::Fixed(_)) && !subflow_pacing::available() {
            return Err(Error::Usage(
                "`pace` caps on MPTCP channels need root: the kernel refuses SO_MAX_PACING_RATE \
                 on MPTCP sockets, so hsxfer caps each subflow with a BPF program"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// How much data a bench moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BenchAmount {
    /// This many bytes.
    Bytes(u64),
    /// For this many seconds (at most a day).
    Seconds(f64),
}

/// A client of one `hsxfer serve` instance.
///
/// # Examples
///
/// A server and a client in one program, on loopback: push a file, then pull it back.
///
/// ```
/// # #[tokio::main] async fn main() -> hsxfer::Result<()> {
/// use std::sync::Arc;
/// use hsxfer::{Client, LiveStats, Server};
///
/// let (root, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
/// std::fs::write(home.path().join("results.h5"), vec![7u8; 1 << 20]).unwrap();
///
/// let server = Server::builder(root.path()).port(0).bind().await?;
/// let port = server.local_addr().port();
/// tokio::spawn(server.run());
///
/// let client = Client::builder("127.0.0.1").port(port).channels(2).build()?;
/// let live = Arc::new(LiveStats::default());
/// let pushed = client.push(&[home.path().join("results.h5")], false, "in.h5", &live).await?;
/// assert!(pushed.verified && pushed.bytes == 1 << 20);
///
/// let back = home.path().join("back.h5");
/// let dest = back.to_str().unwrap();
/// let pulled = client.pull(&["in.h5".into()], false, dest, &Arc::new(LiveStats::default())).await?;
/// assert_eq!(std::fs::read(back).unwrap(), vec![7u8; 1 << 20]);
/// # let _ = pulled; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    opts: TransferOptions,
}

struct Opened {
    ctrl_r: ControlReader<ReadPart>,
    ctrl_w: ControlWriter<WritePart>,
    /// The TLS cipher suite of the session's connections; `None` in clear text.
    cipher_suite: Option<String>,
    channels: Vec<Stream>,
    stagger: Vec<Duration>,
    tuning: TuningReport,
    /// What the data channels run as.
    transport: Transport,
    /// Subflows of the MPTCP connection once they had joined.
    subflows: Option<u16>,
    /// The path manager's limits and endpoints, set for this transfer's subflows and put
    /// back after it.
    _path_manager: PathManager,
    /// The online tuner, when this end sends and the transfer is tuned.
    tuner: Option<OnlineTuner>,
    /// How to connect channels that join later.
    connector: Connector,
}

impl Opened {
    /// Growth of a client's session: it connects the channels itself; `setup` prepares each.
    fn growth(&self, setup: Setup, requests: Option<UnboundedReceiver<u16>>) -> Growth {
        let (deliver, joined) = tokio::sync::mpsc::unbounded_channel();
        Growth {
            joiner: Joiner::Connect(self.connector.clone()),
            deliver,
            setup,
            arrivals: Some(Arrivals {
                joined: Some(joined),
                requests,
            }),
        }
    }
}

impl Client {
    /// A client for `host` (a name, an IPv4 address, or an IPv6 address with or without
    /// brackets).
    pub fn new(host: &str, opts: TransferOptions) -> Self {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        Client { host, opts }
    }

    /// What the server says about itself (buffer limits, congestion controls) and the path's
    /// RTT, asked on a control connection of its own that then closes.
    pub async fn server_facts(&self) -> Result<(HostFacts, Duration)> {
        let addrs = self.resolve().await?;
        let (addr, opened) = self.connect_control(&addrs).await?;
        let mut ctrl = opened.stream;
        let peer = addr.to_string();
        let (_, skey) = handshake::client_control(&mut ctrl, &self.opts.auth.key(), &peer).await?;
        let (mut r, mut w) = control_pair(ctrl, &skey, WireSide::Client);
        let mut opening = ClientOpening::new();
        let rtt = match kernel_rtt(r.get_ref()) {
            Some(rtt) => rtt,
            None => ping_rtt(&mut opening, &mut r, &mut w).await?,
        };
        w.send(&opening.ask_facts()).await?;
        match r
            .expect()
            .await
            .map(|m| opening.on_message(m, Instant::now()))
        {
            Ok(Ok(Answer::Facts(f))) => Ok((*f, rtt)),
            Ok(Err(OpeningError::Refused(message))) => Err(Error::Refused(message)),
            // An older server cannot decode the request and closes the connection.
            Ok(_) | Err(Error::PeerVanished) | Err(Error::Malformed(_)) => Err(Error::TooOld(peer)),
            Err(e) => Err(e),
        }
    }

    /// Sends local `sources` into `dest` (relative to the server root).
    pub async fn push(
        &self,
        sources: &[PathBuf],
        recursive: bool,
        dest: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let tree = SourceTree::walk(&Scope::Local, sources, recursive)?;
        let op = Operation::Push {
            dest: dest.to_string(),
            sources: sources.len() as u32,
        };
        let passed_over = tree.passed_over_note();
        let mut source = SendSource::tree(tree);
        let mut announced = Announced::new(self.opts.block_size);
        let first = announced.take_ready(&mut source, live);
        let mut o = self.open(op, true, live, first).await?;
        o.tuning
            .notes
            .extend(passed_over.map(|n| format!("client: {n}")));
        self.send(o, source, Some(announced), "push", live).await
    }

    /// Fetches `sources` (relative to the server root) into local `dest`.
    pub async fn pull(
        &self,
        sources: &[String],
        recursive: bool,
        dest: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let dest =
            Destination::resolve(Scope::Local, dest, sources.len() as u32)?.only_requested(sources);
        let unplanned = if dest.holds_nothing() {
            limits::MAX_UNPLANNED_FILES
        } else {
            0
        };
        let op = Operation::Pull {
            sources: sources.to_vec(),
            recursive,
            unplanned_files: unplanned,
        };
        let o = self.open(op, false, live, Vec::new()).await?;
        self.receive(o, Sink::Files(dest), unplanned, "pull", live)
            .await
    }

    /// Memory-to-memory transfer of generated data through the full protocol: `amount` of
    /// data in `direction`.
    pub async fn bench(
        &self,
        direction: BenchDirection,
        amount: BenchAmount,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let (bytes, seconds) = match amount {
            BenchAmount::Bytes(b) => (Some(b), None),
            BenchAmount::Seconds(s) => (None, Some(s)),
        };
        let op = Operation::Bench {
            direction,
            bytes,
            seconds,
        };
        let upload = direction == BenchDirection::Upload;
        let o = self.open(op, upload, live, Vec::new()).await?;
        if upload {
            let limit = bench_limit(bytes, seconds)?;
            let rtt = Duration::from_micros(o.tuning.rtt_us);
            let src = SendSource::generated(self.opts.block_size, limit, self.opts.channels, rtt);
            self.send(o, src, None, "bench-upload", live).await
        } else {
            self.receive(o, Sink::Discard, 0, "bench-download", live)
                .await
        }
    }

    async fn send(
        &self,
        o: Opened,
        source: SendSource,
        announced: Option<Announced>,
        name: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        let mut o = o;
        let side = SendingSide::start(live.clone(), o.tuner.take(), &o.channels)?;
        let (sampler, plan, l) = (
            side.sampler.clone(),
            o.connector.dialer.plan.clone(),
            live.clone(),
        );
        let setup: Setup = Box::new(move |i, s| {
            let opts = plan.for_channel(i);
            enforce_congestion(s, i, &opts, "client")?;
            sampler.attach(i, s)?;
            l.telemetry
                .set_setup(read_setup(s, i, &opts, Duration::ZERO)?);
            Ok(())
        });
        let growth = o.growth(setup, side.requests);
        let out = SendEngine {
            ctrl_r: o.ctrl_r,
            ctrl_w: o.ctrl_w,
            channels: o.channels,
            stagger: o.stagger,
            gate: side.gate,
            source,
            block_size: self.opts.block_size,
            live: live.clone(),
            digest_key: self.opts.auth.key().digest_key(),
            faults: self.opts.faults(),
            forward_telemetry: None,
            growth: Some(growth),
            stop: None,
            announced,
        }
        .run();
        let out = on_runtime(out).await;
        if let Some(r) = side.sampler.stop() {
            live.telemetry.set_tuner(r);
        }
        Ok(self.report(
            name,
            live,
            out?,
            start,
            o.tuning,
            (o.transport, o.subflows, o.cipher_suite),
        ))
    }

    async fn receive(
        &self,
        o: Opened,
        sink: Sink,
        unplanned_files: u32,
        name: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        // The channels' options were applied before they connected.
        let growth = o.growth(Box::new(|_, _| Ok(())), None);
        let out = ReceiveEngine {
            ctrl_r: o.ctrl_r,
            ctrl_w: o.ctrl_w,
            channels: o.channels,
            sink,
            block_size: self.opts.block_size,
            live: live.clone(),
            digest_key: self.opts.auth.key().digest_key(),
            await_telemetry: true,
            growth: Some(growth),
            crash_at: None,
            slow_block_writes: None,
            slow_part_closes: None,
            budget: Some(super::budget::FileBudget::of_clients()),
            block_memory: super::block_memory::BlockMemory::unbounded(),
            unplanned_files,
            stop: None,
        }
        .run();
        let out = on_runtime(out).await?;
        Ok(self.report(
            name,
            live,
            out,
            start,
            o.tuning,
            (o.transport, o.subflows, o.cipher_suite),
        ))
    }

    fn report(
        &self,
        name: &str,
        live: &LiveStats,
        out: SideOutcome,
        t: Instant,
        tuning: TuningReport,
        (transport, subflows, cipher_suite): (Transport, Option<u16>, Option<String>),
    ) -> TransferReport {
        TransferReport {
            transport,
            subflows,
            encrypted: cipher_suite.is_some(),
            cipher_suite,
            ..TransferReport::new(name, live, out, self.opts.block_size, t.elapsed(), tuning)
        }
    }

    /// Data connections to open: with MPTCP one, whose subflows are the channels.
    fn connections(&self) -> u16 {
        match self.opts.mptcp {
            true => 1,
            false => self.opts.channels,
        }
    }

    /// MPTCP when every data channel runs it; asked for but refused on some, a note says so.
    fn transport_of(&self, channels: &[Stream], notes: &mut Vec<String>) -> Transport {
        if !self.opts.mptcp {
            return Transport::Tcp;
        }
        let tcp = channels
            .iter()
            .filter(|c| mptcp::subflows(*c).is_none())
            .count();
        if tcp == 0 {
            return Transport::Mptcp;
        }
        notes.push(format!(
            "client: {tcp} of {} channels run as TCP, not MPTCP: the server does not listen with \
             MPTCP (`mptcp`), this host or the server's has it off (sysctl net.mptcp.enabled), \
             or something on the path strips it",
            channels.len()
        ));
        Transport::Tcp
    }

    async fn resolve(&self) -> Result<Vec<SocketAddr>> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.opts.port))
            .await
            .map_err(|source| Error::Resolve {
                host: self.host.clone(),
                source,
            })?
            .collect();
        if addrs.is_empty() {
            return Err(Error::Resolve {
                host: self.host.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no addresses"),
            });
        }
        Ok(addrs)
    }

    /// Opens a session for `op`: connects and authenticates the control connection, plans
    /// the transport settings from the RTT, dials the data channels meanwhile, sends the
    /// request (followed by `ahead`, messages the engine would send first: a push's first
    /// manifest pieces) and joins the channels with their settings applied.
    async fn open(
        &self,
        op: Operation,
        we_send: bool,
        live: &LiveStats,
        ahead: Vec<Message>,
    ) -> Result<Opened> {
        self.opts.validate()?;
        let n = self.connections();
        let mut mptcp_notes = Vec::new();
        if we_send {
            let one_path = PathManager::none(self.opts.channels);
            let mut t = self.tuning_request(Duration::ZERO, None, None, false, &one_path);
            t.online = self.online_request(None, &one_path);
            check_congestion(&t, "client")?;
        }
        let addrs = self.resolve().await?;
        let (addr, tcp) = self.connect_tcp(&addrs).await?;
        let mut pm = match self.opts.mptcp {
            true => PathManager::set_up(
                addr.ip(),
                self.opts.channels,
                &self.opts.mptcp_paths,
                &mut mptcp_notes,
            )?,
            false => PathManager::none(self.opts.channels),
        };
        let peer = addr.to_string();
        let path = PathFacts {
            link_speed: interface_speed(&tcp),
            mss: tcp_info(&tcp).map(|t| t.mss).unwrap_or(0),
        };
        // Once the RTT is known (the kernel's sample of the connect) the data channels are
        // planned and connected; they open (TLS) once the control connection has, and join
        // once it has authenticated, while the request is on its way.
        let (ready_tx, ready_rx) = watch::channel(Ready::Connecting);
        let early = match self.opts.rtt.or_else(|| kernel_rtt(&tcp)) {
            Some(rtt) => {
                let p = self.prepare(rtt, path, &pm, we_send, live)?;
                let joins = dial_channels(addr, &peer, &p.plan, n, &ready_rx);
                Some((p, joins))
            }
            None => None,
        };
        let OpenedControl {
            stream: mut ctrl,
            opener,
            note: key_note,
        } = open_control(&self.opts.security, &self.server_name(), tcp, &peer).await?;
        ready_tx.send_replace(Ready::Opened(opener.clone()));
        let dial = |prepared: &Prepared| Dialer {
            addr,
            peer: peer.clone(),
            plan: prepared.plan.clone(),
            opener: opener.clone(),
        };
        let (session, skey) =
            handshake::client_control(&mut ctrl, &self.opts.auth.key(), &peer).await?;
        let cipher_suite = ctrl.cipher_suite();
        let (mut ctrl_r, mut ctrl_w) = control_pair(ctrl, &skey, WireSide::Client);
        let mut opening = ClientOpening::new();
        let (prepared, mut joins) = match early {
            Some(e) => e,
            None => {
                let rtt = ping_rtt(&mut opening, &mut ctrl_r, &mut ctrl_w).await?;
                let p = self.prepare(rtt, path, &pm, we_send, live)?;
                let joins = dial_channels(addr, &peer, &p.plan, n, &ready_rx);
                (p, joins)
            }
        };
        let connector = Connector {
            dialer: dial(&prepared),
            session,
            key: skey,
        };
        ready_tx.send_replace(Ready::Session(connector.clone()));
        let Prepared {
            tuning,
            plan,
            mut report,
            stagger,
            tuner,
        } = prepared;
        report.notes.extend(key_note);
        let request = opening.request(Request {
            version: PROTOCOL_VERSION,
            op,
            channels: n,
            block_size: self.opts.block_size,
            tuning,
        });
        ctrl_w.queue(&request);
        ahead.iter().for_each(|m| ctrl_w.queue(m));
        ctrl_w.flush().await?;
        // Should the server refuse the request, dropping `joins` aborts the channels.
        match opening.on_message(ctrl_r.expect().await?, Instant::now())? {
            Answer::Accepted { notes, .. } => report.notes.extend(notes),
            other => unreachable!("a request is answered by its acceptance, not {other:?}"),
        }
        let mut channels = Vec::new();
        while let Some(j) = joins.join_next().await {
            channels.push(j.map_err(Error::task("connecting a data channel"))??);
        }
        channels.sort_by_key(|c| c.0);
        let channels: Vec<Stream> = channels.into_iter().map(|c| c.1).collect();
        let transport = self.transport_of(&channels, &mut report.notes);
        pm.open_subflows(&channels[0], addr, pm.subflows - 1, &mut report.notes);
        report.notes.extend(mptcp_notes);
        let subflows = match transport {
            Transport::Mptcp => {
                let rtt = Duration::from_micros(report.rtt_us);
                let first = wait_for_subflows(&channels, pm.subflows, rtt).await;
                let mut joined = first.established;
                // Joins that failed are asked for once more, unless the server's path manager
                // is the kernel's, which took all it takes.
                let refused_past_kernel_cap = joined == MAX_EXTRA_SUBFLOWS + 1;
                let missing = pm.subflows.saturating_sub(joined + first.opening);
                if pm.userspace() && missing > 0 && !refused_past_kernel_cap {
                    pm.open_subflows(&channels[0], addr, missing, &mut report.notes);
                    joined = wait_for_subflows(&channels, pm.subflows, rtt)
                        .await
                        .established;
                }
                if pm.userspace() && joined < pm.subflows {
                    report.notes.push(format!(
                        "client: {joined} of {} MPTCP subflows joined: a server with the \
                         kernel's path manager takes at most {}; start it with the userspace \
                         one for more",
                        pm.subflows,
                        MAX_EXTRA_SUBFLOWS + 1
                    ));
                }
                Some(joined)
            }
            Transport::Tcp => None,
        };
        if we_send {
            let enforced = channels
                .iter()
                .enumerate()
                .try_for_each(|(i, c)| enforce_congestion(c, i, &plan.options[i], "client"));
            if let Err(e) = enforced {
                ctrl_w.abort(&e).await;
                ctrl_r.linger_until_closed().await;
                return Err(e);
            }
            if let Some(g) = &plan.dmc_group {
                // With MPTCP the subflows form the group in the kernel by themselves.
                if transport == Transport::Mptcp {
                    g.follow_mptcp(&channels[0]);
                }
                live.telemetry.set_group(g.clone());
            }
            if let Some(b) = plan.guard_baseline() {
                live.telemetry.set_guard_baseline(b);
            }
            for (i, c) in channels.iter().enumerate() {
                live.telemetry
                    .set_setup(read_setup(c, i, &plan.options[i], stagger[i])?);
            }
        }
        Ok(Opened {
            ctrl_r,
            ctrl_w,
            cipher_suite,
            channels,
            stagger,
            tuning: report,
            transport,
            subflows,
            _path_manager: pm,
            tuner,
            connector,
        })
    }

    /// This end's plan for a path RTT: the transport settings asked of the server, each
    /// channel's socket options, the stagger, and the sending side's online tuner.
    fn prepare(
        &self,
        rtt: Duration,
        path: PathFacts,
        pm: &PathManager,
        we_send: bool,
        live: &LiveStats,
    ) -> Result<Prepared> {
        let n = self.connections();
        let goodput = match self.opts.rate {
            PathRate::Given(wire) => Some(bdp::goodput_rate(wire, path.mss)),
            PathRate::Measured(g) | PathRate::Saved(g) => Some(g),
            PathRate::Unknown => None,
        };
        let (rate, rate_source) = match self.opts.rate {
            PathRate::Given(r) => (Some(r), "given"),
            PathRate::Measured(r) | PathRate::Saved(r) => (Some(r), "measured"),
            PathRate::Unknown => match path.link_speed {
                Some(r) => (Some(r), "interface"),
                None => (None, "unknown"),
            },
        };
        let online = self.online_request(goodput, pm);
        // The meter replaces an automatic stagger: the other channels start once the first
        // has measured the path, paced below its rate, so their slow starts cannot overshoot.
        let metered = online.as_ref().is_some_and(|o| o.pace);
        let stagger_choice = effective_stagger(self.opts.stagger, &self.opts.cc, metered);
        let stagger = stagger_offsets(stagger_choice, n, rtt, &mut rand::thread_rng());
        let mut tuning = self.tuning_request(rtt, rate, goodput, live.telemetry.tracing(), pm);
        tuning.online = online;
        tuning.stagger_us = stagger.iter().map(|d| d.as_micros() as u64).collect();
        let (side, tuner) = match we_send {
            true => (Side::Send, online_tuner(&tuning, n)),
            false => (Side::Receive, None),
        };
        let mut plan = local_plan(&tuning, side, n, "client", tuner.as_ref())?;
        plan.options.iter_mut().for_each(|o| {
            o.mptcp = self.opts.mptcp;
            o.userspace_pm = pm.userspace();
        });
        if self.opts.mptcp && self.opts.pace == PaceChoice::Auto {
            let why = match (subflow_pacing::available(), goodput, metered) {
                (false, _, _) => Some(
                    "the kernel refuses SO_MAX_PACING_RATE on MPTCP sockets, and pacing their \
                     subflows with a BPF program needs root",
                ),
                _ if pm.several() => Some(
                    "they run over several paths, whose rates differ, while a connection's \
                     cap is shared evenly by its subflows; give `pace` to cap each subflow",
                ),
                (true, None, false) => Some(
                    "the path's rate is unknown and no meter runs (`tune` off, or `stagger` \
                     given); give `rate` or `pace` to pace them",
                ),
                _ => None,
            };
            if let Some(why) = why {
                plan.notes
                    .push(format!("client: MPTCP subflows run unpaced: {why}"));
            }
        }
        let report = TuningReport {
            rtt_us: rtt.as_micros() as u64,
            rate_bps: rate,
            rate_source: rate_source.into(),
            buffer: describe_buffer(tuning.buffer),
            notes: plan.notes.clone(),
            origin: self.opts.origin.clone(),
            online: None,
        };
        Ok(Prepared {
            tuning,
            plan: Arc::new(plan),
            report,
            stagger,
            tuner,
        })
    }

    /// What the online tuner of the sending side may do, from the options; `None` with
    /// [`Tune::Off`].
    fn online_request(&self, goodput: Option<u64>, pm: &PathManager) -> Option<OnlineTuning> {
        (self.opts.tune == Tune::Online).then(|| OnlineTuning {
            max_channels: match self.opts.mptcp {
                true => 1,
                false => self.opts.max_channels.max(self.opts.channels),
            },
            rate_bps: goodput,
            rate_saved: matches!(self.opts.rate, PathRate::Saved(_)),
            // An MPTCP connection is one channel to the tuner (its subflows' sum): its cap,
            // which its subflows share, is the meter's and then the tuner's.
            pace: self.pace(pm) == PaceChoice::Auto,
            meter: self.opts.stagger == StaggerChoice::Auto,
            // A congestion control the user chose meters the path itself.
            meter_cc: self.opts.cc.is_empty().then(|| METER_CC.to_string()),
            policy: self.opts.policy,
        })
    }

    /// The pacing asked for, per connection. A fixed cap is per channel, and the channels of
    /// an MPTCP connection are its subflows, which share its cap evenly. Without root, MPTCP
    /// subflows cannot be paced; over several paths, whose rates differ, only a fixed cap
    /// per subflow makes sense.
    fn pace(&self, pm: &PathManager) -> PaceChoice {
        match (self.opts.mptcp, self.opts.pace) {
            (false, p) => p,
            (true, _) if !subflow_pacing::available() => PaceChoice::Off,
            (true, PaceChoice::Fixed(c)) => PaceChoice::Fixed(c.saturating_mul(pm.subflows as u64)),
            (true, PaceChoice::Auto) if pm.several() => PaceChoice::Off,
            (true, p) => p,
        }
    }

    /// The transport settings of the request, for a path RTT and rate (buffers are sized to
    /// an estimated rate; pacing follows only a given or measured goodput rate).
    fn tuning_request(
        &self,
        rtt: Duration,
        rate: Option<u64>,
        goodput: Option<u64>,
        trace: bool,
        pm: &PathManager,
    ) -> Tuning {
        let n = self.connections();
        Tuning {
            cc: self.opts.cc.clone(),
            buffer: bdp::request(self.opts.buffer, rate, rtt, n),
            pace: pacing_caps(self.pace(pm), n, goodput),
            stagger_us: vec![0; n as usize],
            rtt_us: rtt.as_micros() as u64,
            interval_ms: self.opts.interval.as_millis().clamp(10, u32::MAX as u128) as u32,
            trace,
            online: None,
        }
    }

    /// Connects the control connection to the first address that answers and opens it as
    /// the options' [`Security`] says.
    async fn connect_control(&self, addrs: &[SocketAddr]) -> Result<(SocketAddr, OpenedControl)> {
        let (addr, tcp) = self.connect_tcp(addrs).await?;
        let opened = open_control(
            &self.opts.security,
            &self.server_name(),
            tcp,
            &addr.to_string(),
        )
        .await?;
        Ok((addr, opened))
    }

    /// The control connection's TCP connection, to the first address that answers.
    async fn connect_tcp(&self, addrs: &[SocketAddr]) -> Result<(SocketAddr, TcpStream)> {
        let ctl_opts = SocketOptions {
            nodelay: true,
            ..Default::default()
        };
        let mut last_err = None;
        for a in addrs {
            match timed_connect(*a, &ctl_opts).await {
                Ok(s) => return Ok((*a, s)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one address was tried"))
    }

    /// The server as the known-servers file names it: `HOST:PORT` as given (IPv6 addresses
    /// in brackets).
    fn server_name(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.opts.port),
            false => format!("{}:{}", self.host, self.opts.port),
        }
    }
}

/// An upper bound on the path's rate when none is given: the link speed of the interface the
/// control connection leaves by (none for loopback and most virtual devices).
fn interface_speed(ctrl: &TcpStream) -> Option<u64> {
    let local = ctrl.local_addr().ok()?.ip();
    let name = route::interface_of(local).ok()??;
    route::link_speed_bps(&name)
}

/// What the control connection tells of the path before it authenticates.
#[derive(Clone, Copy)]
struct PathFacts {
    /// The outgoing interface's link speed, bits/s ([`interface_speed`]).
    link_speed: Option<u64>,
    /// The control connection's MSS, bytes (0 if unknown).
    mss: u32,
}

/// This end's plan for the session, made before the request ([`Client::prepare`]).
struct Prepared {
    tuning: Tuning,
    plan: Arc<LocalPlan>,
    report: TuningReport,
    stagger: Vec<Duration>,
    tuner: Option<OnlineTuner>,
}

/// The path RTT from the control connection's `TCP_INFO` minimum: the kernel's samples so far
/// (right after the connect, its SYN and SYN-ACK; then the handshakes' segments too), which
/// exclude the peers' scheduling delay. `None` when the kernel has none.
fn kernel_rtt(ctrl: &impl AsFd) -> Option<Duration> {
    let info = tcp_info(ctrl).ok()?;
    (info.min_rtt_us > 0).then(|| Duration::from_micros(info.min_rtt_us as u64))
}

/// The path RTT from a ping on the control connection, when the kernel has no sample
/// ([`kernel_rtt`]): a round trip before the data channels dial.
async fn ping_rtt(
    opening: &mut ClientOpening,
    r: &mut ControlReader<ReadPart>,
    w: &mut ControlWriter<WritePart>,
) -> Result<Duration> {
    w.send(&opening.ping(Instant::now())).await?;
    opening.on_message(r.expect().await?, Instant::now())?;
    Ok(opening.best_rtt().expect("the ping was answered"))
}

/// How long a channel dialed early may wait for the session before it joins: the server
/// closes a connection that has not joined within its handshake timeout (10 s by default).
/// A channel that waited longer is dialed again.
const EARLY_JOIN_WITHIN: Duration = Duration::from_secs(3);

/// How far the control connection has come, for the data channels dialed beside it.
#[derive(Clone)]
enum Ready {
    /// Its TLS (or clear-text preface) is under way: the channels connect.
    Connecting,
    /// It is open: the channels open the same way (in TLS, accepting its key).
    Opened(Opener),
    /// It has authenticated: the channels join the session.
    Session(Connector),
}

impl Ready {
    fn opener(&self) -> Option<Opener> {
        match self {
            Ready::Connecting => None,
            Ready::Opened(o) => Some(o.clone()),
            Ready::Session(c) => Some(c.dialer.opener.clone()),
        }
    }

    fn connector(&self) -> Option<Connector> {
        match self {
            Ready::Session(c) => Some(c.clone()),
            _ => None,
        }
    }
}

/// Dials the session's `n` data channels to `addr` with the plan's socket options; each
/// opens once `ready` holds the control connection's opener, and joins once it holds the
/// session's connector. Dropping the set aborts them.
fn dial_channels(
    addr: SocketAddr,
    peer: &str,
    plan: &Arc<LocalPlan>,
    n: u16,
    ready: &watch::Receiver<Ready>,
) -> JoinSet<Result<(u16, Stream)>> {
    let mut joins = JoinSet::new();
    for ch in 0..n {
        let (peer, plan, mut ready) = (peer.to_string(), plan.clone(), ready.clone());
        joins.spawn(async move {
            let dialed = Instant::now();
            let tcp = connect_channel(addr, &plan, ch).await?;
            let opener = match ready.wait_for(|r| r.opener().is_some()).await {
                Ok(r) => r.opener().expect("waited for an opener"),
                Err(_) => return Err(Error::PeerVanished),
            };
            let mut s = open_channel(&opener, tcp, &peer).await?;
            let connector = match ready.wait_for(|r| r.connector().is_some()).await {
                Ok(r) => r.connector().expect("waited for a connector"),
                Err(_) => return Err(Error::PeerVanished),
            };
            if dialed.elapsed() > EARLY_JOIN_WITHIN {
                s = connector.dialer.open(ch).await?;
            }
            connector.join_opened(&mut s, ch).await?;
            Ok((ch, s))
        });
    }
    joins
}

/// Waits for the MPTCP connection's extra subflows to join and returns its subflows then:
/// `want` established, or as many as joined by then and those still being opened. The server's path manager announces its ports
/// one at a time, each after the previous one was acknowledged, so the k-th extra subflow
/// joins about k round trips in: the wait is `want` + 2 RTTs (at least 200 ms, at most 5 s).
/// A join whose SYN or SYN-ACK was lost is sent again after the kernel's first 1 s timeout,
/// so while subflows are still being opened the wait goes on, up to [`JOIN_RETRY_WAIT`].
async fn wait_for_subflows(channels: &[Stream], want: u16, rtt: Duration) -> SubflowCounts {
    let start = Instant::now();
    let wait = (rtt * (want as u32 + 2)).clamp(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        let mut now = SubflowCounts::default();
        for c in channels.iter().filter_map(mptcp::subflow_counts) {
            now.established += c.established;
            now.opening += c.opening;
        }
        let waited = start.elapsed();
        let done = waited >= wait && (now.opening == 0 || waited >= wait.max(JOIN_RETRY_WAIT));
        if now.established >= want || done {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long subflows still being opened are waited for: a join sent again after the
/// kernel's first 1 s timeout, and its answer.
const JOIN_RETRY_WAIT: Duration = Duration::from_millis(2500);

/// Says in words what a buffer request means.
fn describe_buffer(b: BufferRequest) -> String {
    match b {
        BufferRequest::Kernel => "kernel autotuning".into(),
        BufferRequest::Fixed(n) => format!("fixed request of {n} bytes per socket"),
        BufferRequest::Window(w) => format!(
            "sized to a window of {w} bytes per channel (BDP share x {})",
            bdp::HEADROOM
        ),
    }
}

/// Turns bench limits into a [`BenchLimit`]; exactly one of them must be given.
pub fn bench_limit(bytes: Option<u64>, seconds: Option<f64>) -> Result<BenchLimit> {
    match (bytes, seconds) {
        (Some(b), None) => Ok(BenchLimit::Bytes(b)),
        (None, Some(s)) if s > 0.0 && s <= limits::MAX_BENCH_SECONDS => Ok(BenchLimit::Until(
            Instant::now() + Duration::from_secs_f64(s),
        )),
        _ => Err(Error::Usage(
            "bench needs exactly one of a size or a duration of at most a day".into(),
        )),
    }
}

/// Runs an engine as a task of the runtime, not inside the caller's future: a caller that
/// is `block_on`'s own future runs on a thread of its own beside the workers, and an
/// engine's control loop there (a push or pull of many small files keeps it busiest)
/// could not share the cores with the channel tasks. Dropping the caller's future still
/// stops the transfer: the task is aborted with it.
async fn on_runtime<T: Send + 'static>(
    engine: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    /// Aborts the engine's task when the future awaiting it is dropped.
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let task = tokio::spawn(engine);
    let _stop_with_caller = AbortOnDrop(task.abort_handle());
    task.await.map_err(Error::task("the transfer"))?
}
