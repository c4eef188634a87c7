//! Sockets and the kernel: the only module that creates sockets and sets socket options.
//! Everything above it sees tokio streams.

pub mod buffers;
pub mod cc;
pub mod route;
pub mod tcp;
pub mod tcp_info;

pub use tcp::{connect, keep_alive, listen, set_max_pacing_rate, SocketOptions};
