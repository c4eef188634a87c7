//! The client: opens a session on a server and runs the sending or receiving engine,
//! depending on the operation. `options.rs` holds what the client is told, `plan.rs` the
//! plan it makes from the path's RTT, and `open.rs` how it opens the session and its data
//! channels.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;

use super::boxed::boxed;
use super::growth::{Arrivals, Connector, Growth, Joiner, Setup};
use super::handshake;
use super::idle::SESSION_IDLE;
use super::mptcp_paths::PathManager;
use super::receiver::{ReceiveEngine, Sink};
use super::report::{LiveStats, SideOutcome, TransferReport, TuningReport};
use super::sampler::SendingSide;
use super::secure::FirstContact;
use super::sender::{Announced, SendEngine};
use super::source::SendSource;
use super::tuning::{enforce_congestion, read_setup};
use super::wire::{control_pair, ControlReader, ControlWriter, Side as WireSide};
use crate::channels::control::{BenchDirection, HostFacts, Operation};
use crate::channels::growth::ChannelsToOpen;
use crate::channels::limits;
use crate::channels::opening::{Answer, ClientOpening, OpeningError};
use crate::error::{Error, Result};
use crate::fsio::dest::Destination;
use crate::fsio::root::Scope;
use crate::fsio::source::SourceTree;
use crate::transport::mptcp;
use crate::transport::tls::{ReadPart, Stream, WritePart};
use crate::transport::Transport;
use crate::tuning::online::OnlineTuner;

mod open;
mod options;
mod plan;

use open::{kernel_rtt, ping_rtt};
pub use options::{bench_limit, BenchAmount, PathRate, TransferOptions, Tune};

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
    /// The most channels the request allows the session.
    most_channels: u16,
}

impl Opened {
    /// Growth of a client's session: it connects the channels itself; `setup` prepares each.
    fn growth(&self, setup: Setup, requests: Option<UnboundedReceiver<u16>>) -> Growth {
        let (deliver, joined) = tokio::sync::mpsc::unbounded_channel();
        Growth {
            joiner: Joiner::Connect(
                self.connector.clone(),
                Mutex::new(ChannelsToOpen::new(
                    self.channels.len() as u16,
                    self.most_channels,
                )),
            ),
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
    pub fn server_facts(&self) -> impl Future<Output = Result<(HostFacts, Duration)>> + Send + '_ {
        boxed(self.server_facts_here())
    }

    async fn server_facts_here(&self) -> Result<(HostFacts, Duration)> {
        let addrs = self.resolve().await?;
        let (addr, opened) = self.connect_control(&addrs).await?;
        let mut ctrl = opened.stream;
        let peer = addr.to_string();
        let (_, skey) = handshake::client_control(&mut ctrl, &self.opts.auth.key(), &peer).await?;
        opened.first_contact.map(FirstContact::record);
        let (mut r, mut w) = control_pair(ctrl, &skey, WireSide::Client);
        let mut opening = ClientOpening::new();
        let rtt = match kernel_rtt(r.get_ref()) {
            Some(rtt) => rtt,
            None => ping_rtt(&mut opening, &mut r, &mut w).await?,
        };
        w.send(&opening.ask_facts()).await?;
        match r
            .answer("waiting for the server's facts")
            .await
            .map(|m| opening.on_message(m, Instant::now()))
        {
            Ok(Ok(Answer::Facts(f))) => Ok((*f, rtt)),
            Ok(Err(e @ (OpeningError::Refused(_) | OpeningError::Transient(_)))) => Err(e.into()),
            // An older server cannot decode the request and closes the connection.
            Ok(_) | Err(Error::PeerVanished) | Err(Error::Malformed(_)) => Err(Error::TooOld(peer)),
            Err(e) => Err(e),
        }
    }

    /// Sends local `sources` into `dest` (relative to the server root).
    pub fn push<'a>(
        &'a self,
        sources: &'a [PathBuf],
        recursive: bool,
        dest: &'a str,
        live: &'a Arc<LiveStats>,
    ) -> impl Future<Output = Result<TransferReport>> + Send + 'a {
        boxed(self.push_here(sources, recursive, dest, live))
    }

    async fn push_here(
        &self,
        sources: &[PathBuf],
        recursive: bool,
        dest: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let tree = SourceTree::walk(&Scope::Local, sources, recursive)?;
        tree.check_blocks(self.opts.block_size)?;
        let op = Operation::Push {
            dest: dest.to_string(),
            sources: sources.len() as u32,
        };
        let passed_over: Vec<String> = tree
            .passed_over_note()
            .map(|n| format!("client: {n}"))
            .into_iter()
            .collect();
        // Shown even if the server then refuses the push.
        live.set_notes(&passed_over);
        let mut source = SendSource::tree(tree);
        let mut announced = Announced::new(self.opts.block_size);
        let first = announced.take_ready(&mut source, live);
        let mut o = self.open(op, true, live, first).await?;
        o.tuning.notes.extend(passed_over);
        live.set_notes(&o.tuning.notes);
        self.send(o, source, Some(announced), "push", live).await
    }

    /// Fetches `sources` (relative to the server root) into local `dest`.
    pub fn pull<'a>(
        &'a self,
        sources: &'a [String],
        recursive: bool,
        dest: &'a str,
        live: &'a Arc<LiveStats>,
    ) -> impl Future<Output = Result<TransferReport>> + Send + 'a {
        boxed(self.pull_here(sources, recursive, dest, live))
    }

    async fn pull_here(
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
        live.set_notes(&[]);
        let o = self.open(op, false, live, Vec::new()).await?;
        live.set_notes(&o.tuning.notes);
        self.receive(o, Sink::Files(dest), unplanned, "pull", live)
            .await
    }

    /// Memory-to-memory transfer of generated data through the full protocol: `amount` of
    /// data in `direction`.
    pub fn bench<'a>(
        &'a self,
        direction: BenchDirection,
        amount: BenchAmount,
        live: &'a Arc<LiveStats>,
    ) -> impl Future<Output = Result<TransferReport>> + Send + 'a {
        boxed(self.bench_here(direction, amount, live))
    }

    async fn bench_here(
        &self,
        direction: BenchDirection,
        amount: BenchAmount,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let (bytes, seconds) = match amount {
            BenchAmount::Bytes(b) => (Some(b), None),
            BenchAmount::Seconds(s) => (None, Some(s)),
        };
        // Checked before connecting (a download's server would refuse it only after).
        bench_limit(bytes, seconds)?;
        let op = Operation::Bench {
            direction,
            bytes,
            seconds,
        };
        let upload = direction == BenchDirection::Upload;
        live.set_notes(&[]);
        let o = self.open(op, upload, live, Vec::new()).await?;
        live.set_notes(&o.tuning.notes);
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
            // The setup's row first: attaching applies the tuner's cap, and records it there.
            l.telemetry
                .set_setup(read_setup(s, i, &opts, Duration::ZERO)?);
            sampler.attach(i, s)
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
            idle: SESSION_IDLE,
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
            idle: SESSION_IDLE,
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

    /// The server as the known-servers file names it: `HOST:PORT` as given (IPv6 addresses
    /// in brackets).
    fn server_name(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.opts.port),
            false => format!("{}:{}", self.host, self.opts.port),
        }
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
