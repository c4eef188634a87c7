//! # hsxfer
//!
//! High-performance bulk data transfer over N parallel TCP channels: a GridFTP-style client
//! and server, and the library behind them.
//!
//! A session has one control connection and N data channels, all on the server's one port.
//! Files are cut into blocks (4 MiB by default) that whichever channel is ready takes next,
//! so a slow channel carries less. Every block is checked on arrival (CRC-32C) and every file
//! end to end (BLAKE3 per block, compared with the sender's seal); damaged blocks are sent
//! again. The receiver writes into a temporary file, keeps a restart journal of durable
//! blocks, and renames the file only once it is complete and verified, so an interrupted
//! transfer resumes where it stopped and a partial file never appears under its final name.
//!
//! ```no_run
//! # async fn demo() -> hsxfer::Result<()> {
//! use std::sync::Arc;
//! use hsxfer::{Client, LiveStats};
//!
//! let client = Client::builder("dtn1").channels(8).token_file("/etc/hsxfer/token").build()?;
//! let live = Arc::new(LiveStats::default()); // progress: read it from another task
//! let report = client.push(&["dataset".into()], true, "incoming", &live).await?;
//! assert!(report.verified);
//! # Ok(()) }
//! ```
//!
//! [`Server::builder`] serves a directory; `examples/` has a server, a push, a pull with
//! progress and a bench (`cargo run --release --example push -- ...`).
//!
//! Layout: [`channels`] is the sans-IO protocol (codecs and state machines), [`transport`]
//! the sockets, [`fsio`] the files, [`session`] the I/O glue (client, server, engines),
//! [`tuning`] the defaults and path-dependent tuning; with the `lab` feature, `lab` is the
//! emulated long fat network and the research experiments.
//!
//! Features: none by default, so a pipeline that embeds the library builds no command line,
//! progress bars, plotting or lab code. `cli` builds the `hsxfer` binary (and `lab`).

#![warn(missing_docs, unreachable_pub)]

pub mod channels;
pub mod error;
pub mod fsio;
#[cfg(feature = "lab")]
pub mod lab;
pub mod metrics;
mod os_hint;
pub mod session;
pub mod transport;
pub mod tuning;
pub mod units;

/// Measuring a path and saving what was learned: [`probe::probe`] ranks configurations on a
/// path through a server, [`probe::PathProfile`] is what it found, [`probe::ProfileStore`]
/// keeps profiles per server and direction, [`probe::apply_profile`] fills a transfer's
/// options from one.
pub mod probe {
    pub use crate::fsio::profiles::{ProfileError, ProfileStore};
    pub use crate::session::probe::{
        apply_profile, learned_profile, min_budget, probe, unix_now, Fixed, ProbeOptions,
        ProbeReport, ProbeStep, PROFILE_MAX_AGE_S,
    };
    pub use crate::tuning::probe::{Config, Direction, PathProfile, Ranked, Recommendation};
}

pub use channels::control::BenchDirection;
pub use error::{Error, Result};
pub use session::admission::ServerLimits;
pub use session::builder::{ClientBuilder, ServerBuilder};
pub use session::client::{BenchAmount, Client, PathRate, TransferOptions, Tune};
pub use session::mptcp_paths::MptcpPaths;
pub use session::report::{ChannelReport, LiveStats, TransferReport};
pub use session::server::{Server, ServerConfig, Stopper};
#[cfg(feature = "testing")]
pub use session::FaultInjection;
pub use session::{Auth, DEFAULT_PORT};
