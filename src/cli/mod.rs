//! Command-line parsing and dispatch. Each subcommand maps onto one library call.

/// `println!` that leaves off when stdout is closed (`hsxfer cc list | head -1`) instead of
/// panicking on the broken pipe.
macro_rules! outln {
    () => {
        $crate::cli::output::stdout_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::stdout_line(format_args!($($arg)*))
    };
}

mod cc;
mod doctor;
mod flags;
mod lab;

mod output;
mod probe;
mod tune;
mod units;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::io::{IsTerminal, Read, Write};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use hsxfer::channels::control::Policy;
use hsxfer::channels::oneshot::Announcement;
use hsxfer::probe::{Direction as ProfileDirection, Fixed};
use hsxfer::session::secure::{Security, Trust};
use hsxfer::session::ssh::{OneShot, SshLaunch};
use hsxfer::transport::mptcp_pm::PathManagerKind;
use hsxfer::transport::tls::{Fingerprint, ServerIdentity, ServerTls};
use hsxfer::tuning::bdp::BufferChoice;
use hsxfer::tuning::desync::{PaceChoice, StaggerChoice};
use hsxfer::{
    Auth, BenchAmount, BenchDirection, Client, LiveStats, MptcpPaths, PathRate, Server,
    ServerConfig, ServerLimits, TransferOptions, TransferReport, Tune, DEFAULT_PORT,
};
use nix::sys::signal::Signal;

use hsxfer::fsio::operands::{self, Direction};
use output::Mode;

/// High-performance bulk data transfer over parallel TCP channels.
#[derive(Parser)]
#[command(name = "hsxfer", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve and receive files below a root directory.
    Serve(ServeArgs),
    /// Copy files and trees to or from a server: `copy SRC... HOST:DST` or `copy HOST:SRC... DST`.
    Copy(CopyArgs),
    /// Memory-to-memory throughput through the full protocol (like iperf3, for hsxfer).
    Bench(BenchArgs),
    /// Measure the path to a server (RTT, bottleneck rate, queue, loss) and rank congestion
    /// control × channels × pacing on it; saves the result for later copies.
    Probe(probe::ProbeArgs),
    /// Check what on this host limits throughput, with the exact fix for each finding.
    Doctor(doctor::DoctorArgs),
    /// An emulated long fat network on this host (namespaces, bottleneck, delay) and the
    /// research experiments on it.
    Lab(lab::LabArgs),
    /// Congestion controls: list them, register hsxfer's bundled BPF ones (dmctcp, highspeed,
    /// scalable, htcp, bic, dmctcp_classic), unregister them.
    Cc(cc::CcArgs),
    /// Token files: `token new FILE` writes a new random token, readable by you only.
    Token(TokenArgs),
}

#[derive(Args)]
struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Write a new 256-bit random token to FILE (mode 600; an existing FILE is kept). Copy
    /// it to the server's and the clients' hosts and give it to --token-file on both.
    New {
        /// Where to write it.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(Args)]
#[group(multiple = false)]
struct AuthArgs {
    /// File holding the shared secret token (same file on both ends).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// No token: allowed only when the server listens on loopback.
    #[arg(long)]
    no_auth: bool,
}

impl AuthArgs {
    /// These options as given on a command line (`--token-file F` or `--no-auth`).
    fn as_flags(&self) -> Vec<String> {
        match (&self.token_file, self.no_auth) {
            (Some(f), _) => vec!["--token-file".into(), f.display().to_string()],
            (None, true) => vec!["--no-auth".into()],
            (None, false) => Vec::new(),
        }
    }

    fn auth(&self) -> anyhow::Result<Auth> {
        match (&self.token_file, self.no_auth) {
            (Some(f), _) => Ok(Auth::from_token_file(f)?),
            (None, true) => Ok(Auth::NoAuth),
            (None, false) => bail!(
                "no authentication chosen: give --token-file FILE (a shared secret) or --no-auth (loopback only)"
            ),
        }
    }
}

/// The options that reach a server, as given on a command line: `--port` when not the
/// default, then the authentication and encryption choices. A printed `copy` command that
/// carries them reaches the same server the same way (and finds the profile saved for it).
fn connection_flags(port: u16, auth: &AuthArgs, security: &SecurityArgs) -> Vec<String> {
    let mut flags = Vec::new();
    if port != DEFAULT_PORT {
        flags.extend(["--port".to_string(), port.to_string()]);
    }
    flags.extend(auth.as_flags());
    flags.extend(security.as_flags());
    flags
}

/// A client's encryption and which server keys it accepts.
#[derive(Args)]
pub(crate) struct SecurityArgs {
    /// Clear text instead of TLS 1.3: still authenticated, but anyone on the path can read
    /// the data. The server must allow it too (`serve --no-encrypt`).
    #[arg(long, conflicts_with_all = ["server_fingerprint", "known_servers"])]
    no_encrypt: bool,
    /// Accept only the server key with this fingerprint (as `hsxfer serve` prints it)
    /// instead of the known-servers file.
    #[arg(long, value_name = "SHA256:...")]
    server_fingerprint: Option<Fingerprint>,
    /// The known-servers file: a server met for the first time is recorded there, a server
    /// whose key changed is refused (default: ~/.config/hsxfer/known_servers).
    #[arg(long, value_name = "FILE")]
    known_servers: Option<PathBuf>,
}

impl SecurityArgs {
    /// These options as given on a command line.
    pub(crate) fn as_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if self.no_encrypt {
            flags.push("--no-encrypt".into());
        }
        if let Some(f) = &self.server_fingerprint {
            flags.extend(["--server-fingerprint".into(), f.to_string()]);
        }
        if let Some(f) = &self.known_servers {
            flags.extend(["--known-servers".into(), f.display().to_string()]);
        }
        flags
    }

    /// The choice; clap already refused `--no-encrypt` with either of the others.
    pub(crate) fn security(&self) -> anyhow::Result<Security> {
        Ok(Security::choose(
            !self.no_encrypt,
            self.server_fingerprint,
            self.known_servers.clone(),
        )?)
    }
}

/// Test-only fault injection (hidden from help; `testing` feature).
#[cfg(feature = "testing")]
#[derive(Args)]
struct FaultArgs {
    /// Corrupt the N-th block sent after its CRC was computed.
    #[arg(long, hide = true, value_name = "N")]
    debug_corrupt_wire: Option<u64>,
    /// Corrupt the N-th block sent and send the damaged bytes' digest (only the seal catches it).
    #[arg(long, hide = true, value_name = "N")]
    debug_corrupt_past_check: Option<u64>,
    /// Kill the receiving server (SIGKILL) just before this step of a commit.
    #[arg(long, hide = true, value_name = "STEP")]
    debug_crash_at: Option<hsxfer::fsio::partial::CommitStep>,
    /// A receiving server takes this much longer over every block it writes.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = units::parse_duration)]
    debug_slow_block_writes: Option<std::time::Duration>,
    /// The sending side's first data channel waits this long before each block it sends.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = units::parse_duration)]
    debug_slow_first_channel: Option<std::time::Duration>,
}

#[cfg(feature = "testing")]
impl FaultArgs {
    fn faults(&self) -> hsxfer::FaultInjection {
        hsxfer::FaultInjection {
            corrupt_on_wire: self.debug_corrupt_wire,
            corrupt_past_check: self.debug_corrupt_past_check,
            crash_at: self.debug_crash_at,
            slow_block_writes: self.debug_slow_block_writes,
            slow_first_channel: self.debug_slow_first_channel,
            ..Default::default()
        }
    }
}

#[derive(Args)]
struct ServeArgs {
    /// Directory to serve; nothing outside it can be read or written (default with --stdio:
    /// the current directory).
    #[arg(long, value_name = "DIR", required_unless_present = "stdio")]
    root: Option<PathBuf>,
    /// Address to listen on (default: 0.0.0.0, or 127.0.0.1 with --no-auth; with --stdio,
    /// the address the SSH connection came in on).
    #[arg(long, value_name = "ADDR")]
    listen: Option<IpAddr>,
    /// TCP port for control and data channels (default: 7420; with --stdio, any free port).
    #[arg(long)]
    port: Option<u16>,
    /// Most sessions served at once (default: 256, or a sixteenth of the open-files limit
    /// less 8 if that is fewer, at least 8); more are turned away with a message to retry.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: Option<u32>,
    /// Most sessions served at once from one client address (default: 64, or
    /// --max-sessions if that is fewer).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions_per_address: Option<u32>,
    /// Most data channels joined to sessions at once (default: an eighth of the open-files
    /// limit, at least 128); a channel past it is turned away with a message to retry.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_channels: Option<u32>,
    /// Most data channels at once from one client address (default: half of
    /// --max-channels, at least 128 when it allows).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_channels_per_address: Option<u32>,
    /// Memory for blocks being received, across sessions (default: 64M; e.g. 1G): a channel
    /// waits for a block's buffer while all of it is held. Raise it for many channels of
    /// large blocks at once.
    #[arg(long, value_name = "SIZE", value_parser = parse_block_memory)]
    block_memory: Option<u64>,
    /// Exit when the first session that moves files (a push or a pull) ends.
    #[arg(long)]
    once: bool,
    /// One-shot server for `copy --ssh`: make a one-time token (or take one with
    /// --token-stdin), print the port and the token
    /// on standard output, serve one copy (implies --once) and exit, or exit as soon as
    /// standard input closes.
    #[arg(long, conflicts_with_all = ["token_file", "no_auth"])]
    stdio: bool,
    /// With --stdio, take the token from the first line of standard input instead of making
    /// one (what `copy --ssh` does, so that an interrupted copy resumes).
    #[arg(long, requires = "stdio")]
    token_stdin: bool,
    /// Listen with Multipath TCP, so `--mptcp` clients move data over MPTCP (plain TCP clients
    /// are served as before). As root, with a specific --listen address, the 8 ports after
    /// --port are announced to clients for extra subflows (removed again at exit).
    #[arg(long)]
    mptcp: bool,
    /// With --mptcp, the path manager of its connections: kernel (the 8 announced ports) or
    /// userspace (as root: clients open their own subflows, as many as they ask for, up to
    /// 32 for hsxfer clients run as root with -n above 9; clients that wait for announced
    /// ports get one). The namespace's choice (net.mptcp.pm_type) is put back at exit.
    #[arg(long, value_name = "kernel|userspace", default_value = "kernel",
          value_parser = <PathManagerKind as std::str::FromStr>::from_str, requires = "mptcp")]
    mptcp_pm: PathManagerKind,
    /// The server's TLS key, made there on first start (default:
    /// ~/.config/hsxfer/server-key.pem). Its fingerprint is printed at start.
    #[arg(long, value_name = "FILE", conflicts_with = "stdio")]
    key_file: Option<PathBuf>,
    /// Also serve clients that ask for clear text (`copy --no-encrypt`), for trusted
    /// networks; TLS clients are served either way.
    #[arg(long)]
    no_encrypt: bool,
    #[command(flatten)]
    auth: AuthArgs,
    #[cfg(feature = "testing")]
    #[command(flatten)]
    faults: FaultArgs,
}

#[derive(Args)]
struct TransferArgs {
    /// Number of parallel data channels, fixed (default: 4, which the online tuner may raise
    /// while added channels pay, and lower again when added ones bring nothing, never below 4).
    #[arg(short = 'n', long = "channels")]
    channels: Option<u16>,
    /// Server port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Block size (e.g. 1M, 4M): the unit of scheduling, checking and resuming. A file may
    /// have at most 4,194,304 blocks: 16 TiB at the default 4M.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    block_size: Option<u64>,
    /// Congestion control of the sending sockets: NAME for every channel, or NAME,NAME,...
    /// cycled over the channels (default: the sending host's default).
    #[arg(long, value_name = "NAME[,NAME...]", value_delimiter = ',')]
    cc: Vec<String>,
    /// Socket buffers: auto (sized to --rate × RTT, never below kernel autotuning), kernel
    /// (autotuning), or SIZE (the SO_SNDBUF/SO_RCVBUF request; the kernel doubles it).
    #[arg(long, value_name = "auto|SIZE|kernel", default_value = "auto", value_parser = parse_buffer)]
    buffer: BufferChoice,
    /// Bottleneck rate of the path in bits/s (e.g. 1G, 10Gbit): sizes buffers and automatic pacing.
    #[arg(long, value_name = "RATE", value_parser = units::parse_rate)]
    rate: Option<u64>,
    /// Path RTT to plan for instead of measuring it (e.g. 60ms).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration)]
    rtt: Option<Duration>,
    /// Staggered channel starts: auto (about two RTTs apart, jittered), DURATION apart, or off.
    #[arg(long, value_name = "auto|DURATION|off", default_value = "auto", value_parser = parse_stagger)]
    stagger: StaggerChoice,
    /// Per-channel pacing cap: auto (slightly different caps around rate/N when --rate is
    /// given, none otherwise), RATE for every channel (e.g. 500M), or off.
    #[arg(long, value_name = "auto|RATE|off", default_value = "auto", value_parser = parse_pace)]
    pace: PaceChoice,
    /// Tuning: auto (use this server's saved profile for what is not given, if any; the
    /// sending side measures the path with its first channel, paces every channel just below
    /// the rate it found, and adds channels while they pay, retiring added ones that bring
    /// nothing), probe (run `hsxfer probe` first and use its result), or off (the settings
    /// planned at the start are final).
    #[arg(long, value_name = "auto|probe|off", default_value = "auto", value_parser = <hsxfer::session::settle::Source as std::str::FromStr>::from_str)]
    tune: hsxfer::session::settle::Source,
    /// Which congestion controls tuning may choose: fair (loss-based ones only, so the
    /// transfer stays near its fair share against other TCP traffic) or fast (may choose BBR,
    /// and runs the bundled BIC under the pacing caps where it is registered).
    #[arg(long, value_name = "fair|fast", default_value = "fair", value_parser = parse_policy)]
    policy: Policy,
    /// Reporting interval of the live display and of --json channel events.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = units::parse_duration)]
    interval: Duration,
    /// Write a per-channel time series (cwnd, ssthresh, RTT, state; every 10 ms) to FILE as CSV.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Move the data over one Multipath TCP connection with -n subflows (as root, the path
    /// manager's limits are raised for it); it falls back to TCP, with a warning, when the
    /// server was not started with --mptcp. As root, its subflows are paced by a BPF program
    /// (--pace, --rate, or what the online tuner measures); without root they run unpaced.
    #[arg(long)]
    mptcp: bool,
    /// With --mptcp, which local addresses open subflows: auto (as root, also every address
    /// whose route toward the server leaves through another interface, e.g. a second uplink
    /// with its own routing rule), off (only the kernel's choice), or ADDR[,ADDR...] (as
    /// well as the kernel's choice). Each path gets -n subflows, 9 in all at most.
    #[arg(long, value_name = "auto|off|ADDR[,ADDR...]", default_value = "auto",
          value_parser = <MptcpPaths as std::str::FromStr>::from_str, requires = "mptcp")]
    mptcp_paths: MptcpPaths,
    /// Print NDJSON events (schema: docs/json.md) instead of human output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    auth: AuthArgs,
    #[command(flatten)]
    security: SecurityArgs,
    #[cfg(feature = "testing")]
    #[command(flatten)]
    faults: FaultArgs,
}

impl TransferArgs {
    /// The options; `remote` gives a one-shot server's port and token instead of --port and
    /// the token options.
    fn options(&self, remote: Option<&OneShot>) -> anyhow::Result<TransferOptions> {
        let block_size = match self.block_size {
            Some(b) => u32::try_from(b).map_err(|_| {
                anyhow::anyhow!(
                    "block size {b} is out of range: use {} to {} bytes",
                    hsxfer::channels::limits::MIN_BLOCK,
                    hsxfer::channels::limits::MAX_BLOCK
                )
            })?,
            None => hsxfer::tuning::defaults::BLOCK_SIZE,
        };
        let channels = self.channels.unwrap_or(hsxfer::tuning::defaults::CHANNELS);
        let opts = TransferOptions {
            channels,
            max_channels: match self.channels {
                Some(n) => n,
                None => hsxfer::tuning::defaults::MAX_TUNED_CHANNELS,
            },
            block_size,
            port: remote.map_or(self.port, |r| r.port),
            auth: match remote {
                Some(r) => r.auth.clone(),
                None => self.auth.auth()?,
            },
            cc: self.cc.clone(),
            buffer: self.buffer,
            rate: self.rate.map_or(PathRate::Unknown, PathRate::Given),
            tune: Tune::Online,
            policy: self.policy,
            origin: Vec::new(),
            rtt: self.rtt,
            stagger: self.stagger,
            pace: self.pace,
            interval: self.interval,
            mptcp: self.mptcp,
            mptcp_paths: self.mptcp_paths.clone(),
            // A one-shot server's key came over SSH: pin it.
            security: match remote {
                Some(r) => Security::Tls(Trust::Pinned(r.key)),
                None => self.security.security()?,
            },
            #[cfg(feature = "testing")]
            faults: self.faults.faults(),
        };
        if self.interval < Duration::from_millis(10) {
            bail!("--interval must be at least 10ms");
        }
        opts.validate()?;
        Ok(opts)
    }

    fn mode(&self) -> Mode {
        if self.json {
            Mode::Json
        } else {
            Mode::Human
        }
    }

    /// The settings the user gave: a saved profile leaves them alone.
    fn fixed(&self) -> Fixed {
        Fixed {
            channels: self.channels.is_some(),
            cc: !self.cc.is_empty(),
            pace: self.pace != PaceChoice::Auto,
            rate: self.rate.is_some(),
        }
    }

    /// The transfer's options, settled against `--tune` (a saved profile or a probe).
    async fn settled(
        &self,
        host: &str,
        direction: ProfileDirection,
        remote: Option<&OneShot>,
    ) -> anyhow::Result<(TransferOptions, Settled)> {
        let mut opts = self.options(remote)?;
        let profile_port = match remote {
            Some(_) => hsxfer::session::settle::SSH_PROFILE_PORT,
            None => opts.port,
        };
        let connection = match remote {
            Some(_) => vec!["--ssh".to_string()],
            None => connection_flags(opts.port, &self.auth, &self.security),
        };
        let (profiled, notes) = tune::settle(
            self.tune,
            &mut opts,
            self.fixed(),
            (host, profile_port),
            direction,
            self.mode(),
            &connection,
        )
        .await?;
        Ok((opts, Settled { profiled, notes }))
    }
}

fn parse_buffer(s: &str) -> Result<BufferChoice, String> {
    match s {
        "auto" => Ok(BufferChoice::Auto),
        "kernel" => Ok(BufferChoice::Kernel),
        _ => units::parse_size(s)
            .map(BufferChoice::Fixed)
            .map_err(|e| format!("{e}; or auto, kernel")),
    }
}

/// A server's block memory: at least one default block, so that a transfer is not slowed to
/// one block at a time by a typo.
fn parse_block_memory(s: &str) -> Result<u64, String> {
    let bytes = units::parse_size(s)?;
    let least = u64::from(hsxfer::tuning::defaults::BLOCK_SIZE);
    if bytes < least {
        let mib = least >> 20;
        return Err(format!(
            "{s} holds less than one {mib} MiB block: use at least {mib}M"
        ));
    }
    Ok(bytes)
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    match s {
        "fair" => Ok(Policy::Fair),
        "fast" => Ok(Policy::Fast),
        _ => Err("use fair or fast".into()),
    }
}

fn parse_stagger(s: &str) -> Result<StaggerChoice, String> {
    match s {
        "auto" => Ok(StaggerChoice::Auto),
        "off" => Ok(StaggerChoice::Off),
        _ => units::parse_duration(s)
            .map(StaggerChoice::Fixed)
            .map_err(|e| format!("{e}; or auto, off")),
    }
}

fn parse_pace(s: &str) -> Result<PaceChoice, String> {
    match s {
        "auto" => Ok(PaceChoice::Auto),
        "off" => Ok(PaceChoice::Off),
        _ => match units::parse_rate(s) {
            Ok(0) => Err("a pacing rate must be positive; or auto, off".into()),
            Ok(bits) => Ok(PaceChoice::Fixed(bits / 8)),
            Err(e) => Err(format!("{e}; or auto, off")),
        },
    }
}

#[derive(Args)]
struct CopyArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', long)]
    recursive: bool,
    #[command(flatten)]
    transfer: TransferArgs,
    /// Start the server over SSH for this copy only (no daemon, no token file): runs
    /// `hsxfer serve --once --stdio` on the remote host as [USER@]HOST's user; remote paths
    /// are relative to that user's home, or absolute. The server's key comes over SSH and
    /// is pinned, and the copy is encrypted: --no-encrypt, --server-fingerprint and
    /// --known-servers do not apply.
    #[arg(
        long,
        conflicts_with_all = [
            "token_file",
            "no_auth",
            "port",
            "no_encrypt",
            "server_fingerprint",
            "known_servers",
        ]
    )]
    ssh: bool,
    /// The SSH command and its options, split at spaces (e.g. "ssh -p 2222 -i KEY").
    #[arg(long, value_name = "CMD", default_value = "ssh", requires = "ssh")]
    ssh_command: String,
    /// The hsxfer program on the remote host.
    #[arg(long, value_name = "PATH", default_value = "hsxfer", requires = "ssh")]
    remote_hsxfer: String,
    /// The address the remote server listens on (default: the one SSH reached; give it when
    /// SSH goes through a jump host or NAT).
    #[arg(long, value_name = "ADDR", requires = "ssh")]
    remote_listen: Option<IpAddr>,
    /// The remote server's port (default: any free one; give one a firewall lets through).
    #[arg(long, value_name = "PORT", requires = "ssh")]
    remote_port: Option<u16>,
    /// Sources, then the destination; remote ones are HOST:PATH (PATH relative to the
    /// server root; HOST may be a name, an IPv4 address or [IPv6]; [USER@]HOST with --ssh).
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    operands: Vec<String>,
}

#[derive(Args)]
struct BenchArgs {
    /// Amount of data to move (e.g. 10G).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size, conflicts_with = "time")]
    size: Option<u64>,
    /// Seconds to run (default 10 when --size is not given). The bench ends then: what the
    /// sockets still hold is dropped, and only what arrived counts. Timed, the data goes in
    /// 64 KiB blocks unless --block-size says otherwise.
    #[arg(long, value_name = "SECS")]
    time: Option<f64>,
    /// Server sends, client receives (default: client sends).
    #[arg(short = 'R', long)]
    reverse: bool,
    #[command(flatten)]
    transfer: TransferArgs,
    /// The server.
    host: String,
}

/// Entry point: runs the command and maps the outcome to an exit code (0 only when every
/// byte arrived and was verified).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_files_limit();
    let default_level = match cli.command {
        Command::Serve(ref a) if a.stdio => "warn",
        Command::Serve(_) => "info",
        _ => "warn",
    };
    // Colours only on a terminal: a server's log is mostly a file or a journal.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HSXFER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .init();
    let mode = match &cli.command {
        Command::Copy(c) => c.transfer.mode(),
        Command::Bench(b) => b.transfer.mode(),
        Command::Serve(_) => Mode::Human,
        Command::Doctor(d) => d.mode(),
        Command::Probe(p) => p.mode(),
        Command::Lab(_) | Command::Cc(_) | Command::Token(_) => Mode::Human,
    };
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let lab = matches!(cli.command, Command::Lab(_));
    let result = rt.block_on(run(cli.command));
    if lab {
        // An interrupted `lab` command's thread may still be running a step: not waited for.
        rt.shutdown_background();
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            output::error(mode, &e);
            // 128 + the signal's number, as a shell reports a command a signal stopped.
            match e.downcast_ref::<Interrupted>() {
                Some(Interrupted(sig, _)) => ExitCode::from(128 + *sig as u8),
                None => ExitCode::from(1),
            }
        }
    }
}

/// A command stopped by a signal, after what it changed on this host was put back.
#[derive(Debug)]
struct Interrupted(Signal, &'static str);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}{}", self.0, self.1)
    }
}

impl std::error::Error for Interrupted {}

/// Runs `work` until it ends or a stop signal ([`stop_signal`]) arrives. Then it is
/// dropped, not the process killed, so that its destructors put back what it changed in the
/// kernel (the MPTCP path manager's limits and type, set for a copy run as root) and stop an
/// SSH one-shot server.
async fn until_stopped(
    work: impl std::future::Future<Output = anyhow::Result<bool>>,
    what_is_kept: &'static str,
) -> anyhow::Result<bool> {
    let mut work = Box::pin(work);
    let sig = tokio::select! {
        r = &mut work => return r,
        sig = stop_signal() => sig,
    };
    // Dropped first, so that its display is gone before its notes are printed.
    drop(work);
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some((mode, live)) = running {
        warn_of_set_up(mode, &live);
    }
    Err(Interrupted(sig, what_is_kept).into())
}

/// The running transfer's output mode and counters, so that a signal that drops it still
/// shows the notes of its set-up before the error (a tree's entries passed over, a server
/// key recorded on first contact), as a transfer that fails does.
static RUNNING: std::sync::Mutex<Option<(Mode, Arc<LiveStats>)>> = std::sync::Mutex::new(None);

/// Records the transfer now running for [`until_stopped`].
fn running(mode: Mode, live: &Arc<LiveStats>) {
    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some((mode, live.clone()));
}

/// Runs a `lab` subcommand on a thread of its own until it ends or a stop signal arrives.
/// Then the labs it was building, or running an experiment on, are removed (their delay
/// element and server would outlive the process), and the process ends without waiting for
/// that thread.
async fn lab_until_stopped(a: lab::LabArgs) -> anyhow::Result<bool> {
    let work = tokio::task::spawn_blocking(move || lab::lab(a));
    tokio::select! {
        r = work => r?,
        sig = stop_signal() => {
            let removed = tokio::task::spawn_blocking(hsxfer::lab::Lab::remove_claimed).await?;
            let what = if removed.is_empty() { "" } else { ": the labs it built are removed" };
            Err(Interrupted(sig, what).into())
        }
    }
}

/// Raises the soft limit on open files to the hard one: the usual soft limit of 1,024 is a
/// default for interactive shells, and a server serves many sessions of many channels each.
/// Transfers bound what they hold open anyway (`session::budget::FileBudget`), so a hard
/// limit of 1,024 works too.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

async fn run(cmd: Command) -> anyhow::Result<bool> {
    match cmd {
        Command::Serve(a) => serve(a).await,
        Command::Copy(a) => {
            let kept = ": run the same command again to resume (what arrived verified is kept)";
            until_stopped(copy(a), kept).await
        }
        Command::Bench(a) => until_stopped(bench(a), "").await,
        Command::Doctor(a) => doctor::doctor(a),
        Command::Probe(a) => until_stopped(probe::run(a), ": nothing was saved").await,
        Command::Lab(a) => lab_until_stopped(a).await,
        Command::Cc(a) => cc::cc(a).await,
        Command::Token(TokenArgs {
            command: TokenCommand::New { file },
        }) => {
            hsxfer::session::token::new(&file)?;
            outln!("wrote a new token to {} (mode 600)", file.display());
            Ok(true)
        }
    }
}

/// The first of SIGINT (Ctrl-C), SIGTERM (what a service manager sends) and SIGHUP (the
/// terminal or SSH session closed) to arrive: a server or a transfer then stops through its
/// destructors, which remove what it set up in the kernel (MPTCP subflow ports and limits),
/// where the signal's default action would have killed it with them in place.
async fn stop_signal() -> Signal {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind| signal(kind).expect("signal handlers can be installed");
    let mut int = listen(SignalKind::interrupt());
    let mut term = listen(SignalKind::terminate());
    let mut hup = listen(SignalKind::hangup());
    tokio::select! {
        _ = int.recv() => Signal::SIGINT,
        _ = term.recv() => Signal::SIGTERM,
        _ = hup.recv() => Signal::SIGHUP,
    }
}

/// The server's caps: its flags, and defaults for this process's descriptor limit (raised
/// by then) for the rest.
fn server_limits(a: &ServeArgs) -> ServerLimits {
    let defaults = ServerLimits::default();
    let limits = match a.max_channels {
        Some(n) => defaults.with_channels(n),
        None => defaults,
    };
    let limits = match a.max_sessions {
        Some(n) => limits.with_sessions(n),
        None => limits,
    };
    ServerLimits {
        sessions_per_address: a
            .max_sessions_per_address
            .unwrap_or(limits.sessions_per_address),
        channels_per_address: a
            .max_channels_per_address
            .unwrap_or(limits.channels_per_address),
        block_memory: a.block_memory.map_or(limits.block_memory, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        }),
        ..limits
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<bool> {
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("."));
    let (auth, announce) = if a.stdio {
        let token = match a.token_stdin {
            true => token_from_stdin()?,
            false => hsxfer::session::token::one_time(),
        };
        (Auth::Token(token.clone().into_bytes()), Some(token))
    } else {
        (a.auth.auth()?, None)
    };
    if let Some(t) = &a.auth.token_file {
        hsxfer::session::token::check_outside(t, &root)?;
    }
    let ip = a.listen.unwrap_or(if a.stdio {
        ssh_server_address().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    } else if auth == Auth::NoAuth {
        IpAddr::from([127, 0, 0, 1])
    } else {
        IpAddr::from([0, 0, 0, 0])
    });
    let port = a.port.unwrap_or(if a.stdio { 0 } else { DEFAULT_PORT });
    // A root that cannot be served is refused before a first run makes the server's key.
    hsxfer::fsio::root::Scope::confined(&root)
        .with_context(|| format!("server root {}", root.display()))?;
    let identity = if a.stdio {
        // A one-shot server's key lives as long as it does; its client learns it over SSH.
        ServerIdentity::generate()?
    } else {
        let (id, path, new) = ServerIdentity::of_server(a.key_file.clone())?;
        let made = if new { "made" } else { "from" };
        tracing::info!(
            "server key {} ({made} {})",
            id.fingerprint(),
            path.display()
        );
        id
    };
    let server = Server::bind(ServerConfig {
        tls: ServerTls::new(&identity, a.no_encrypt),
        root: root.clone(),
        listen: SocketAddr::new(ip, port),
        auth,
        #[cfg(feature = "testing")]
        faults: a.faults.faults(),
        limits: server_limits(&a),
        mptcp: a.mptcp,
        mptcp_pm: a.mptcp_pm,
    })
    .await?;
    tracing::info!("serving {} on {}", root.display(), server.local_addr());
    // A signal ends the sessions with a word to each client (run the copy again once the
    // server is back), not with connections that just close.
    let stopper = server.stopper();
    let stop = |sig: Signal| async move {
        tracing::info!("{sig}: stopping");
        stopper.stop(sig.as_ref()).await;
    };
    let Some(token) = announce else {
        tokio::select! {
            r = async { if a.once { server.run_once().await } else { server.run().await } } => r?,
            sig = stop_signal() => stop(sig).await,
        }
        return Ok(true);
    };
    let line = Announcement {
        port: server.local_addr().port(),
        token,
        key: identity.fingerprint().to_string(),
    };
    outln!("{line}");
    std::io::stdout().flush()?;
    // The client holds the SSH channel open for the whole copy: its end means the client is
    // gone, and nothing must stay running. A plain thread reads it: a read on tokio's
    // blocking pool cannot be cancelled and would hold the process at exit.
    let (eof_tx, closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        let _ = eof_tx.send(());
    });
    tokio::select! {
        r = server.run_once() => r?,
        _ = closed => tracing::info!("the ssh channel closed, stopping"),
        sig = stop_signal() => stop(sig).await,
    }
    Ok(true)
}

/// `serve --stdio --token-stdin`: the token on the first line of standard input.
fn token_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the token from standard input")?;
    let token = line.trim();
    if token.len() < hsxfer::session::token::MIN_TOKEN_CHARS {
        bail!(
            "--token-stdin: the first line of standard input must be a token of at least {} \
             characters",
            hsxfer::session::token::MIN_TOKEN_CHARS
        );
    }
    Ok(token.to_string())
}

/// The address an SSH client reached this host on (`SSH_CONNECTION`'s third field): where
/// a one-shot server listens, so its client can reach it the same way.
fn ssh_server_address() -> Option<IpAddr> {
    let conn = std::env::var("SSH_CONNECTION").ok()?;
    conn.split_whitespace().nth(2)?.parse().ok()
}

async fn copy(a: CopyArgs) -> anyhow::Result<bool> {
    let mode = a.transfer.mode();
    let (interval, trace) = (a.transfer.interval, a.transfer.trace.clone());
    let mut dir = operands::direction(&a.operands).map_err(anyhow::Error::msg)?;
    let (op, target, way) = match &dir {
        Direction::Push { host, .. } => ("push", host.clone(), ProfileDirection::Push),
        Direction::Pull { host, .. } => ("pull", host.clone(), ProfileDirection::Pull),
    };
    if let Direction::Pull { dest, .. } = &dir {
        output::keep_stdout_for(std::path::Path::new(dest));
    }
    let remote = if a.ssh {
        let root = operands::ssh_root(&mut dir).map_err(anyhow::Error::msg)?;
        let launch = SshLaunch {
            token: Some(hsxfer::session::token::for_ssh(&target, root)?),
            command: a.ssh_command.split_whitespace().map(String::from).collect(),
            remote_hsxfer: a.remote_hsxfer.clone(),
            listen: a.remote_listen,
            port: a.remote_port,
        };
        Some(launch.start(&target, root).await?)
    } else {
        None
    };
    // With --ssh the operand may name a user: connect to the host alone.
    let host = match a.ssh {
        true => target.rsplit_once('@').map_or(target.as_str(), |(_, h)| h),
        false => &target,
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let (opts, settled) = a.transfer.settled(&host, way, remote.as_ref()).await?;
    output::start(mode, op, &host, opts.channels, opts.block_size);
    let live = Arc::new(LiveStats::new(opts.channels as usize));
    live.add_notes(&settled.notes);
    running(mode, &live);
    let client = Client::new(&host, opts);
    let display = output::Live::start(mode, live.clone(), interval, trace.as_deref())?;
    let result = match dir {
        Direction::Push { sources, dest, .. } => {
            let sources: Vec<PathBuf> = sources.into_iter().map(PathBuf::from).collect();
            client.push(&sources, a.recursive, &dest, &live).await
        }
        Direction::Pull { sources, dest, .. } => {
            client.pull(&sources, a.recursive, &dest, &live).await
        }
    };
    display.finish().await?;
    if let Some(r) = remote {
        r.finish().await;
    }
    finish(mode, result, &settled, &live)
}

async fn bench(a: BenchArgs) -> anyhow::Result<bool> {
    let mode = a.transfer.mode();
    let amount = match (a.size, a.time) {
        (Some(bytes), _) => BenchAmount::Bytes(bytes),
        (None, Some(seconds)) => BenchAmount::Seconds(seconds),
        (None, None) => BenchAmount::Seconds(10.0),
    };
    let (direction, way) = if a.reverse {
        (BenchDirection::Download, ProfileDirection::Pull)
    } else {
        (BenchDirection::Upload, ProfileDirection::Push)
    };
    let host = a
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let (mut opts, settled) = a.transfer.settled(&host, way, None).await?;
    if a.transfer.block_size.is_none() && matches!(amount, BenchAmount::Seconds(_)) {
        opts.block_size = hsxfer::tuning::defaults::TIMED_BENCH_BLOCK;
    }
    output::start(mode, "bench", &a.host, opts.channels, opts.block_size);
    let live = Arc::new(LiveStats::new(opts.channels as usize));
    live.add_notes(&settled.notes);
    running(mode, &live);
    let client = Client::new(&a.host, opts);
    let display = output::Live::start(
        mode,
        live.clone(),
        a.transfer.interval,
        a.transfer.trace.as_deref(),
    )?;
    let result = client.bench(direction, amount, &live).await;
    display.finish().await?;
    finish(mode, result, &settled, &live)
}

/// What `--tune` settled for a transfer: where to save what it learns, and its notes
/// (shown first among the transfer's own).
struct Settled {
    profiled: hsxfer::session::settle::Profiled,
    notes: Vec<String>,
}

/// Reports a transfer: its summary, with the notes of its settling first, or, when it
/// failed, the notes known by then before its error.
fn finish(
    mode: Mode,
    result: hsxfer::Result<TransferReport>,
    settled: &Settled,
    live: &LiveStats,
) -> anyhow::Result<bool> {
    let mut r = result.inspect_err(|_| warn_of_set_up(mode, live))?;
    r.tuning.notes.splice(0..0, settled.notes.iter().cloned());
    tune::learn(&settled.profiled, &mut r);
    output::summary(mode, &r);
    Ok(r.verified)
}

/// A failed or stopped transfer's set-up notes (its settling's among them, added to `live`
/// before it started), shown before its error: the summary that would have carried them
/// never comes.
fn warn_of_set_up(mode: Mode, live: &LiveStats) {
    output::warnings(mode, &live.notes());
}
