//! Tuning: defaults, BDP-sized buffers against the host's limits, the desynchronization
//! plans (stagger, pacing) and the host checks of `hsxfer doctor`. The congestion-control
//! registry and the path probe plug in here.

pub mod bdp;
pub mod defaults;
pub mod desync;
pub mod doctor;
pub mod sysctl;
