//! The scheduler: a pure core (`core`) and, around it, the agent's actuators
//! (`cgroup`), the fail-safe that outlives the agent (`supervisor`), and the
//! daemon that joins them to the trace (`daemon`).
pub mod cgroup;
pub mod config;
pub mod control;
pub mod core;
pub mod daemon;
pub mod supervisor;
