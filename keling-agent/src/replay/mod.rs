//! `keling replay`: recorded input logs fed back through the scheduler core
//! (`keling-sched`) on a virtual clock, the inputs' own timestamps, and synthetic
//! workloads run against it in closed loop.
//!
//! Three ways to run the core:
//!
//! | mode | inputs | feedback (`Confirmed`, `TimedOut`) | says |
//! |---|---|---|---|
//! | [`exact`]: the recording's policy and config | every recorded input, in order | as recorded | whether every decision and transition is reproduced: the match rate against the recorded scheduling log (anything under 100% is a bug) |
//! | [`what_if`]: another policy or config | what the tasks did, as recorded (arrivals, activity, memory, exits) | a perfect actuator: every freeze, thaw and stop confirmed after a fixed latency; a kill or terminate ends the task | what would have happened ([`figures`]) |
//! | [`synthetic`]: a generated mix of 12 job classes (`mixed` or `transcode`) | generated in closed loop: a task's GPU work progresses only while it runs | the same perfect actuator | policies, placements and late binding compared on the same workload |
//!
//! The core is deterministic and reads no clock, so replay needs nothing but the
//! inputs, the [`SchedConfig`] and the [`Policy`]. The agent's input log does not
//! record its config yet: `keling replay` takes the same flags as `keling run`
//! (and reads a first-line [`crate::log_format::InputLogHeader`] when a log has
//! one; synthetic runs write one).
//!
//! This module reads and writes files only through [`log`]; it never reads a
//! clock (the command measures its own speed).
pub mod exact;
pub mod figures;
pub mod log;
pub mod seeds;
pub mod synthetic;
pub mod what_if;

pub use figures::{Metrics, Stats, Summary};
