//! The scheduler around its pure core (`keling-sched`): the daemon that joins the
//! trace to the core ([`daemon`]), the actuators that carry out its decisions
//! ([`actuator`], [`cgroup`]), the logs ([`log`]), the rules file ([`config`]) and
//! the fail-safe that outlives the agent ([`supervisor`]).
pub mod actuator;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod log;
pub mod supervisor;
