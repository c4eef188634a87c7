//! Builders for [`Client`] and [`Server`]: the options an embedder usually sets, checked once
//! at `build`, with the command line's defaults for the rest.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use super::admission::ServerLimits;
use super::client::{Client, PathRate, TransferOptions, Tune};
use super::mptcp_paths::MptcpPaths;
use super::server::{Server, ServerConfig};
use super::{token, Auth, DEFAULT_PORT};
use crate::error::Result;
use crate::transport::mptcp_pm::PathManagerKind;
use crate::transport::tls::{ServerIdentity, ServerTls};

/// Builds a [`Client`]; see [`Client::builder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    host: String,
    opts: TransferOptions,
    token_file: Option<PathBuf>,
}

impl Client {
    /// A builder for a client of the server at `host` (a name, an IPv4 address, or an IPv6
    /// address with or without brackets), with the command line's defaults: port 7420, no
    /// token, channels and settings tuned while the transfer runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> hsxfer::Result<()> {
    /// use std::sync::Arc;
    /// use hsxfer::{Client, LiveStats};
    ///
    /// let client = Client::builder("dtn1").channels(8).token_file("/etc/hsxfer/token").build()?;
    /// let live = Arc::new(LiveStats::default());
    /// let report = client.push(&["dataset".into()], true, "incoming", &live).await?;
    /// println!("{:.0} Mbit/s, verified: {}", report.goodput_bps / 1e6, report.verified);
    /// # Ok(()) }
    /// ```
    pub fn builder(host: &str) -> ClientBuilder {
        ClientBuilder {
            host: host.to_string(),
            opts: TransferOptions::default(),
            token_file: None,
        }
    }
}

impl ClientBuilder {
    /// Runs the data channels as Multipath TCP connections (see [`TransferOptions::mptcp`]).
    pub fn mptcp(mut self, on: bool) -> Self {
        self.opts.mptcp = on;
        self
    }

    /// With MPTCP, which of this host's addresses the connection opens subflows from (see
    /// [`TransferOptions::mptcp_paths`]; by default every other path toward the server).
    pub fn mptcp_paths(mut self, paths: MptcpPaths) -> Self {
        self.opts.mptcp_paths = paths;
        self
    }

    /// Runs exactly `n` data channels (the tuner adds none).
    pub fn channels(mut self, n: u16) -> Self {
        self.opts.channels = n;
        self.opts.max_channels = n;
        self
    }

    /// The server's port.
    pub fn port(mut self, port: u16) -> Self {
        self.opts.port = port;
        self
    }

    /// Authenticates with the token in `path` (written by `hsxfer token new`).
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Congestion controls of the sending sockets, cycled over the channels.
    pub fn cc<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.opts.cc = names.into_iter().map(Into::into).collect();
        self
    }

    /// The path's bottleneck rate, bits/s, when known: sizes buffers and pacing.
    pub fn rate(mut self, bits_per_second: u64) -> Self {
        self.opts.rate = PathRate::Given(bits_per_second);
        self
    }

    /// Whether the sending side tunes the transfer while it runs (default: it does).
    pub fn tune(mut self, tune: Tune) -> Self {
        self.opts.tune = tune;
        self
    }

    /// Block size in bytes: the unit of scheduling, checking and resuming.
    pub fn block_size(mut self, bytes: u32) -> Self {
        self.opts.block_size = bytes;
        self
    }

    /// Every other option, as a whole (what was set before is replaced). Their `auth` is
    /// used unless [`ClientBuilder::token_file`] names a token file, which wins.
    pub fn options(mut self, opts: TransferOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Reads the token file, if one was given, and checks the options.
    pub fn build(mut self) -> Result<Client> {
        if let Some(path) = &self.token_file {
            self.opts.auth = Auth::from_token_file(path)?;
        }
        self.opts.validate()?;
        Ok(Client::new(&self.host, self.opts))
    }
}

/// Builds a [`Server`]; see [`Server::builder`].
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    root: PathBuf,
    listen: IpAddr,
    port: u16,
    token_file: Option<PathBuf>,
    limits: ServerLimits,
    mptcp: bool,
    mptcp_pm: PathManagerKind,
    key_file: Option<PathBuf>,
    identity: Option<Arc<ServerIdentity>>,
    allow_clear: bool,
}

impl Server {
    /// A builder for a server of `root`, with the command line's defaults: port 7420, no
    /// token and so loopback only (give [`ServerBuilder::token_file`] to serve a network).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> hsxfer::Result<()> {
    /// use hsxfer::Server;
    ///
    /// let server = Server::builder("/data")
    ///     .listen("0.0.0.0".parse().unwrap())
    ///     .token_file("/etc/hsxfer/token")
    ///     .bind()
    ///     .await?;
    /// println!("serving on {}", server.local_addr());
    /// server.run().await
    /// # }
    /// ```
    pub fn builder(root: impl Into<PathBuf>) -> ServerBuilder {
        ServerBuilder {
            root: root.into(),
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: DEFAULT_PORT,
            token_file: None,
            limits: ServerLimits::default(),
            mptcp: false,
            mptcp_pm: PathManagerKind::Kernel,
            key_file: None,
            identity: None,
            allow_clear: false,
        }
    }
}

impl ServerBuilder {
    /// The address to listen on (default 127.0.0.1).
    pub fn listen(mut self, ip: IpAddr) -> Self {
        self.listen = ip;
        self
    }

    /// The port (0: a free one; [`Server::local_addr`] tells which).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Authenticates clients with the token in `path`.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Caps on connections and sessions.
    pub fn limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Listens with Multipath TCP (plain TCP clients are still served).
    pub fn mptcp(mut self, on: bool) -> Self {
        self.mptcp = on;
        self
    }

    /// With MPTCP, the path manager the server's connections run: the in-kernel one (the
    /// default: it announces 8 extra ports) or the userspace one, which takes as many
    /// subflows as clients open (root only; see [`PathManagerKind`]).
    pub fn mptcp_pm(mut self, kind: PathManagerKind) -> Self {
        self.mptcp_pm = kind;
        self
    }

    /// Keeps the server's TLS key in `path` (made there on first start) instead of
    /// `server-key.pem` in hsxfer's configuration directory.
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key_file = Some(path.into());
        self
    }

    /// Uses this key, kept in memory only (a one-shot server's, say).
    pub fn identity(mut self, identity: Arc<ServerIdentity>) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Also serves clients that ask for clear text (`--no-encrypt`); TLS clients are served
    /// either way. Off by default.
    pub fn allow_clear(mut self, on: bool) -> Self {
        self.allow_clear = on;
        self
    }

    /// Reads the token file (refusing one inside the root) and the TLS key (made on first
    /// start), checks the configuration and binds the port.
    pub async fn bind(self) -> Result<Server> {
        if let Some(t) = &self.token_file {
            token::check_outside(t, &self.root)?;
        }
        let identity = match self.identity {
            Some(id) => id,
            None => Arc::new(ServerIdentity::of_server(self.key_file)?.0),
        };
        Server::bind(ServerConfig {
            tls: ServerTls::new(&identity, self.allow_clear),
            root: self.root,
            listen: SocketAddr::new(self.listen, self.port),
            auth: Auth::from_optional_token_file(self.token_file.as_deref())?,
            #[cfg(feature = "testing")]
            faults: Default::default(),
            limits: self.limits,
            mptcp: self.mptcp,
            mptcp_pm: self.mptcp_pm,
        })
        .await
    }
}
