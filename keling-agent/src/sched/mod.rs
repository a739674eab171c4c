//! The scheduler around its pure core (`keling-sched`): the daemon that joins the
//! trace to the core ([`daemon`]), with launches ([`launch`]), which process is
//! whose ([`members`]) and what clients hear ([`notify`]) beside it, and the
//! machine they act on behind one trait ([`host`]); the actuators that carry out
//! its decisions ([`actuator`], [`cgroup`], [`boost`]) on a thread of their own
//! ([`worker`]), who may ask for what ([`access`]), the logs ([`log`]), the rules
//! file ([`config`]) and the fail-safe that outlives and watches the agent
//! ([`supervisor`]).
pub mod access;
pub mod actuator;
pub mod boost;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod history;
pub mod host;
pub mod launch;
pub mod log_writer;
pub mod members;
pub mod notify;
pub mod records;
pub mod sharing;
pub mod supervisor;
pub mod worker;
