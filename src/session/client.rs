//! The client: opens a session on a server and runs the sending or receiving engine,
//! depending on the operation.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::handshake;
use super::receiver::{ReceiveEngine, Sink};
use super::report::{LiveStats, SideOutcome, TransferReport};
use super::sender::{FaultInjection, SendEngine};
use super::source::{BenchLimit, SendSource};
use super::wire::{ControlReader, ControlWriter};
use super::{Auth, DEFAULT_PORT};
use crate::channels::control::{BenchDirection, Message, Operation, Request, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use crate::fsio::dest::Destination;
use crate::fsio::root::Scope;
use crate::fsio::source::SourceTree;
use crate::transport::{self, SocketOptions};
use crate::tuning::defaults;

/// Options of a transfer, shared by push, pull and bench.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Number of parallel data channels (1..=[`defaults::MAX_CHANNELS`]).
    pub channels: u16,
    /// Block size in bytes (the unit of scheduling, checking and resuming).
    pub block_size: u32,
    /// Server port.
    pub port: u16,
    /// Authentication.
    pub auth: Auth,
    /// Per-channel pacing cap for the sending side, bytes per second.
    pub pace: Option<u64>,
    /// Deliberate damage, for tests of the integrity path.
    pub faults: FaultInjection,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            channels: defaults::CHANNELS,
            block_size: defaults::BLOCK_SIZE,
            port: DEFAULT_PORT,
            auth: Auth::NoAuth,
            pace: None,
            faults: FaultInjection::default(),
        }
    }
}

impl TransferOptions {
    /// Checks option ranges, naming the bad value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=defaults::MAX_CHANNELS).contains(&self.channels) {
            return Err(Error::Usage(format!(
                "channel count {} is out of range: use 1 to {}",
                self.channels,
                defaults::MAX_CHANNELS
            )));
        }
        if !(defaults::MIN_BLOCK..=defaults::MAX_BLOCK).contains(&self.block_size) {
            return Err(Error::Usage(format!(
                "block size {} is out of range: use {} to {} bytes",
                self.block_size,
                defaults::MIN_BLOCK,
                defaults::MAX_BLOCK
            )));
        }
        Ok(())
    }
}

/// A client of one `hsxfer serve` instance.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    opts: TransferOptions,
}

struct Opened {
    ctrl: TcpStream,
    channels: Vec<TcpStream>,
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

    /// Sends local `sources` into `dest` (relative to the server root).
    pub async fn push(
        &self,
        sources: &[PathBuf],
        recursive: bool,
        dest: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let tree = SourceTree::walk(sources, recursive)?;
        for p in &tree.passed_over {
            tracing::warn!("passed over {p}: not a regular file or directory");
        }
        let op = Operation::Push {
            dest: dest.to_string(),
            sources: sources.len() as u32,
        };
        let o = self.open(op, true).await?;
        self.send(o, SendSource::tree(tree), "push", live).await
    }

    /// Fetches `sources` (relative to the server root) into local `dest`.
    pub async fn pull(
        &self,
        sources: &[String],
        recursive: bool,
        dest: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let dest = Destination::resolve(Scope::Local, dest, sources.len() as u32)?;
        let op = Operation::Pull {
            sources: sources.to_vec(),
            recursive,
        };
        let o = self.open(op, false).await?;
        self.receive(o, Sink::Files(dest), "pull", live).await
    }

    /// Memory-to-memory transfer of generated data through the full protocol: `bytes` or
    /// `seconds` (one of them) of data in `direction`.
    pub async fn bench(
        &self,
        direction: BenchDirection,
        bytes: Option<u64>,
        seconds: Option<f64>,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let op = Operation::Bench {
            direction,
            bytes,
            seconds,
        };
        let upload = direction == BenchDirection::Upload;
        let o = self.open(op, upload).await?;
        if upload {
            let limit = bench_limit(bytes, seconds)?;
            let src = SendSource::generated(self.opts.block_size, limit);
            self.send(o, src, "bench-upload", live).await
        } else {
            self.receive(o, Sink::Discard, "bench-download", live).await
        }
    }

    async fn send(
        &self,
        o: Opened,
        source: SendSource,
        name: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        let (r, w) = o.ctrl.into_split();
        let out = SendEngine {
            ctrl_r: ControlReader::new(r),
            ctrl_w: ControlWriter::new(w),
            channels: o.channels,
            source,
            block_size: self.opts.block_size,
            live: live.clone(),
            digest_key: self.opts.auth.key().digest_key(),
            faults: self.opts.faults,
        }
        .run()
        .await?;
        Ok(self.report(name, live, out, start))
    }

    async fn receive(
        &self,
        o: Opened,
        sink: Sink,
        name: &str,
        live: &Arc<LiveStats>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        let (r, w) = o.ctrl.into_split();
        let out = ReceiveEngine {
            ctrl_r: ControlReader::new(r),
            ctrl_w: ControlWriter::new(w),
            channels: o.channels,
            sink,
            block_size: self.opts.block_size,
            live: live.clone(),
            digest_key: self.opts.auth.key().digest_key(),
        }
        .run()
        .await?;
        Ok(self.report(name, live, out, start))
    }

    fn report(&self, name: &str, live: &LiveStats, out: SideOutcome, t: Instant) -> TransferReport {
        TransferReport::new(name, live, out, self.opts.block_size, t.elapsed())
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

    /// Connects, authenticates, sends the request and joins the data channels.
    async fn open(&self, op: Operation, we_send: bool) -> Result<Opened> {
        self.opts.validate()?;
        let addrs = self.resolve().await?;
        let ctl_opts = SocketOptions {
            nodelay: true,
            ..Default::default()
        };
        let mut last_err = None;
        let mut found = None;
        for a in &addrs {
            match timed_connect(*a, &ctl_opts).await {
                Ok(s) => {
                    found = Some((*a, s));
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let Some((addr, mut ctrl)) = found else {
            return Err(last_err.expect("at least one address was tried"));
        };
        let peer = addr.to_string();
        let (session, skey) =
            handshake::client_control(&mut ctrl, &self.opts.auth.key(), &peer).await?;
        let request = Message::Request(Request {
            version: PROTOCOL_VERSION,
            op,
            channels: self.opts.channels,
            block_size: self.opts.block_size,
            pace_bps: self.opts.pace,
        });
        let (r, w) = ctrl.split();
        ControlWriter::new(w).send(&request).await?;
        match ControlReader::new(r).expect().await? {
            Message::Accepted { .. } => {}
            Message::Abort { message } => return Err(Error::Refused(message)),
            other => {
                return Err(Error::Malformed(format!(
                    "expected acceptance, got {other:?}"
                )))
            }
        }
        let data_opts = SocketOptions {
            nodelay: false,
            max_pacing_rate: if we_send { self.opts.pace } else { None },
            ..Default::default()
        };
        let mut joins = JoinSet::new();
        for ch in 0..self.opts.channels {
            let (opts, key, peer) = (data_opts.clone(), skey.clone(), peer.clone());
            joins.spawn(async move {
                let mut s = timed_connect(addr, &opts).await?;
                handshake::client_join(&mut s, &key, session, ch, &peer).await?;
                Ok::<_, Error>((ch, s))
            });
        }
        let mut channels = Vec::new();
        while let Some(j) = joins.join_next().await {
            channels.push(j.map_err(|e| Error::Malformed(format!("join task: {e}")))??);
        }
        channels.sort_by_key(|c| c.0);
        Ok(Opened {
            ctrl,
            channels: channels.into_iter().map(|c| c.1).collect(),
        })
    }
}

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

async fn timed_connect(addr: SocketAddr, opts: &SocketOptions) -> Result<TcpStream> {
    let err = |source| Error::Connect {
        addr: addr.to_string(),
        source,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, transport::connect(addr, opts)).await {
        Ok(r) => r.map_err(err),
        Err(_) => Err(err(std::io::ErrorKind::TimedOut.into())),
    }
}

/// Turns bench limits into a [`BenchLimit`]; exactly one of them must be given.
pub fn bench_limit(bytes: Option<u64>, seconds: Option<f64>) -> Result<BenchLimit> {
    match (bytes, seconds) {
        (Some(b), None) => Ok(BenchLimit::Bytes(b)),
        (None, Some(s)) if s > 0.0 && s.is_finite() => Ok(BenchLimit::Until(
            Instant::now() + Duration::from_secs_f64(s),
        )),
        _ => Err(Error::Usage(
            "bench needs exactly one of a size or a positive duration".into(),
        )),
    }
}
