//! Tuning: defaults, BDP-sized buffers against the host's limits, the desynchronization
//! plans (stagger, pacing), the congestion-control registry and the host checks of
//! `hsxfer doctor`. The path probe plugs in here.

pub mod bdp;
pub mod bundled;
pub mod defaults;
pub mod desync;
pub mod doctor;
pub mod estimate;
pub mod models;
pub mod online;
#[cfg(test)]
mod pathsim;
pub mod probe;
pub mod registry;
pub mod sysctl;
