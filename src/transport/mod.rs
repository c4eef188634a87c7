//! Sockets and the kernel: the only module that creates sockets and sets socket options.
//! Everything above it sees tokio streams.

pub mod buffers;
pub mod cc;
mod ip_mptcp;
pub mod mptcp;
mod mptcp_limits;
pub mod mptcp_pm;
pub mod ns_settings;
pub mod route;
pub mod sock_diag;
pub mod subflow_pacing;
pub mod tcp;
pub mod tcp_info;
pub mod tls;

pub use tcp::{bind, connect, keep_alive, listen, set_max_pacing_rate, Bound, SocketOptions};

/// What a transfer's data channels run as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Plain TCP connections (also MPTCP ones that fell back to TCP).
    #[default]
    Tcp,
    /// Multipath TCP connections.
    Mptcp,
}
