//! Probes, one module per subsystem.
pub mod accounting;
pub mod active;
pub mod files;
pub mod nvidia;
pub mod orphans;
pub mod process;
pub mod sched;
