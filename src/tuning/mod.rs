//! Tuning: defaults now; BDP-sized buffers, host checks, the congestion-control registry and
//! the path probe plug in here.

pub mod defaults;
