//! The scheduler around its pure core (`keling-sched`): the daemon that joins the
//! trace to the core ([`daemon`]), the actuators that carry out its decisions
//! ([`actuator`], [`cgroup`]) on a thread of their own ([`worker`]), who may ask for
//! what ([`access`]), the logs ([`log`]), the rules file ([`config`]) and the
//! fail-safe that outlives and watches the agent ([`supervisor`]).
pub mod access;
pub mod actuator;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod history;
pub mod log;
pub mod supervisor;
pub mod worker;
