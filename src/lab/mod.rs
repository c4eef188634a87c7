//! `hsxfer lab`: an emulated long fat network on one Linux host, and the research
//! experiments run on it.
//!
//! A lab is a dumbbell in network namespaces: K sender hosts, a router and a receiver joined
//! by veth pairs, all addresses private to the namespaces. The router's egress toward the
//! receiver is the bottleneck: a token-bucket shaper feeding a drop-tail queue of exactly N
//! packets. The round-trip delay is added on the ACK direction by the delay element
//! ([`element`]), an NFQUEUE program in the router (the kernel here has no netem), which can
//! also drop data packets at random with a small XDP program ([`loss`]).
//!
//! [`topology::Lab`] builds, inspects and removes labs; [`selfcheck`] verifies a new lab;
//! [`flows`] runs hsxfer transfers across it; [`experiments`] reproduces the seed papers'
//! measurements.

pub mod config;
pub mod counters;
pub mod delay;
pub mod element;
pub mod experiments;
pub mod flows;
pub mod loss;
pub mod nfqueue;
pub mod own;
pub mod selfcheck;
pub mod topology;
pub mod traffic;

pub use config::{Host, LabSpec, QueueSize};
pub use topology::Lab;

/// Why a lab operation failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A setting is out of range.
    #[error("{0}")]
    Invalid(String),
    /// Labs need root (network namespaces, qdiscs, netfilter).
    #[error("the lab needs root (network namespaces, qdiscs and netfilter): run it with sudo")]
    NotRoot,
    /// A program the lab drives is missing.
    #[error("'{program}' is not installed: {hint}")]
    Missing {
        /// The program.
        program: String,
        /// How to get it.
        hint: String,
    },
    /// A lab of that name exists already.
    #[error("a lab named '{0}' is already up: run `hsxfer lab down --name {0}` first, or pick another --name")]
    Exists(String),
    /// No lab of that name.
    #[error("no lab named '{0}' is up: start one with `hsxfer lab up`")]
    NotFound(String),
    /// A command the lab ran failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A step took too long.
    #[error("{0}")]
    Timeout(String),
    /// File or process I/O.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl LabError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
        let context = context.into();
        move |source| LabError::Io { context, source }
    }
}
