//! Probes, one module per subsystem.
pub mod process;
pub mod sched;
