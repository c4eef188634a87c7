//! Tuning: defaults, BDP-sized buffers against the host's limits, and the desynchronization
//! plans (stagger, pacing). Host checks, the congestion-control registry and the path probe
//! plug in here.

pub mod bdp;
pub mod defaults;
pub mod desync;
pub mod registry;
pub mod sysctl;
