//! What the loop reads and talks to besides its channels, each behind a trait so
//! that a test drives the loop without root or a kernel: the kernel's maps
//! ([`Kernel`]), the event ring buffer ([`EventSource`], the event module's)
//! and the fail-safe ([`Guard`]). The real ones are the probes,
//! [`EventStream`](crate::event::EventStream) and [`FailSafe`].
use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
};

pub use crate::event::EventSource;
use crate::{
    bpf::Probes,
    gpu::stats::GpuAccounting,
    sched::supervisor::{self, FailSafe, Notice},
};

/// The kernel's maps, as the loop reads and writes them.
pub trait Kernel {
    /// Traces `pid` (a launched task's root) and what it starts.
    fn track(&mut self, pid: u32) -> anyhow::Result<()>;
    /// Per process, how often a table its GPU memory books needed was full.
    fn table_full_pids(&self) -> anyhow::Result<BTreeMap<u32, u64>>;
    /// Events the kernel could not hand over (ring buffer full), on all CPUs.
    fn drops(&self) -> anyhow::Result<u64>;
    /// The exact GPU figures.
    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting>;
    /// How many processes are traced.
    fn tracked_processes(&self) -> anyhow::Result<usize>;
    /// A sound lower bound of the video memory charged to `pids`, for a task
    /// whose figure a full table made unsure (`Probes::sure_video_bytes`).
    fn sure_video_bytes(&self, pids: &BTreeSet<u32>) -> anyhow::Result<u64>;
    /// Processes whose full-table row the kernel created since the last call, and
    /// how many it could not queue so far (`Probes::new_unsure_pids`).
    fn new_unsure_pids(&mut self) -> anyhow::Result<(Vec<u32>, u64)>;
    /// Removes an exited process's rows of full tables and undecoded calls.
    fn forget_books(&mut self, pid: u32) -> anyhow::Result<()>;
}

impl Kernel for Probes {
    fn track(&mut self, pid: u32) -> anyhow::Result<()> {
        Probes::track(self, pid, pid)
    }

    fn table_full_pids(&self) -> anyhow::Result<BTreeMap<u32, u64>> {
        Probes::table_full_pids(self)
    }

    fn drops(&self) -> anyhow::Result<u64> {
        Ok(self.drops_per_cpu()?.iter().sum())
    }

    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting> {
        Probes::gpu_accounting(self)
    }

    fn tracked_processes(&self) -> anyhow::Result<usize> {
        Probes::tracked_processes(self)
    }

    fn sure_video_bytes(&self, pids: &BTreeSet<u32>) -> anyhow::Result<u64> {
        Probes::sure_video_bytes(self, pids)
    }

    fn new_unsure_pids(&mut self) -> anyhow::Result<(Vec<u32>, u64)> {
        Probes::new_unsure_pids(self)
    }

    fn forget_books(&mut self, pid: u32) -> anyhow::Result<()> {
        Probes::forget_books(self, pid)
    }
}

/// The agent's link to the fail-safe that thaws everything when it stops
/// sending heartbeats.
pub trait Guard: Sized {
    /// The fail-safe's pid (the daemon never schedules it).
    fn pid(&self) -> u32;
    /// Sends a heartbeat if one is due. Never blocks.
    fn heartbeat(&self);
    /// Waits for the fail-safe to say something.
    fn notice(&self) -> impl Future<Output = Notice>;
    /// Starts another fail-safe as this one was started (this one is gone).
    fn restart(&self) -> anyhow::Result<Self>;
}

impl Guard for FailSafe {
    fn pid(&self) -> u32 {
        FailSafe::pid(self)
    }

    fn heartbeat(&self) {
        FailSafe::heartbeat(self);
    }

    fn notice(&self) -> impl Future<Output = Notice> {
        FailSafe::notice(self)
    }

    fn restart(&self) -> anyhow::Result<Self> {
        supervisor::spawn(self.settings())
    }
}
