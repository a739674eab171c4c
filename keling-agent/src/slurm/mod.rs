//! Keling under Slurm: what the agent tells Slurm and what it does for a job
//! step's tasks. Slurm places jobs (by GPU memory: 1 shard = 1 GiB of one
//! GPU); Keling runs them, counts their memory exactly and enforces it.
//!
//! - [`gres`]: this node's `gres.conf` lines (a `gpu` per GPU, its memory in GiB
//!   as `shard`s) and the `plugstack.conf` line that loads the plugin
//!   (`keling slurm gres`, `keling slurm plugstack`).
//! - [`job`]: a job step's task attached by the SPANK plugin (`keling-spank`,
//!   `{"slurm_attach": ...}` on the control socket, handled in `sched::daemon`): what
//!   `keling launch` would print goes to the task's standard error (the job's
//!   output file), and a task Keling ends is requeued (`--requeue` jobs) or its
//!   reason set as the job's `AdminComment`, off the event loop.
//!
//!
//! It runs Slurm's commands (`scontrol`) as Slurm's own commands find the
//! controller: `SLURM_CONF`, else the default config. It never blocks the event
//! loop: each command runs on tokio's blocking pool with a deadline, and a
//! controller that is down or slow only delays what it was told.
//! - [`node`]: the node drained while GPU memory is held outside Slurm's jobs
//!   (`keling run --slurm-report`), resumed when it is gone.
pub mod gres;
pub mod job;
pub mod node;
