//! Memory sharing around the core: the GPU memory held by processes in no task
//! (the core admits tasks against each GPU's capacity less it), and what
//! `keling status` shows per GPU.
//!
//! The trace sees every video allocation, free, teardown and moving charge on
//! the NVIDIA device files, whoever makes it; the ones of processes that belong
//! to no task are booked here per process and GPU, and each GPU's total goes to
//! the core as [`Input::OutsideMem`] once per tick when it changed (the input
//! log then holds one line per change and tick, not one per call).

use std::collections::BTreeMap;

use keling_sched::{Input, Scheduler, TaskId, WaitReason};

use crate::control::GpuMemoryStatus;
use crate::event::decode::{Event, MemKind};

/// Video memory held by processes in no task, per process and GPU.
#[derive(Debug, Default)]
pub struct OutsideMemory {
    held: BTreeMap<(u32, u32), u64>,
    /// The totals the core was last told, per GPU.
    told: BTreeMap<u32, u64>,
}

impl OutsideMemory {
    /// Books one kernel event: only the memory of processes `task_of` places
    /// in no task.
    pub fn on_event(&mut self, event: &Event, task_of: impl Fn(u32) -> Option<TaskId>) {
        let outside = |pid: u32| task_of(pid).is_none();
        match event {
            Event::GpuAlloc(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
                let pid = event.header().pid;
                if let Some(gpu) = e.gpu
                    && outside(pid)
                {
                    self.add(pid, gpu, e.bytes);
                }
            }
            Event::GpuFree(e) if e.mem_kind == Some(MemKind::Video) && e.bytes > 0 => {
                if let (Some(gpu), Some(pid)) = (e.gpu, e.freed_pid) {
                    self.sub(pid, gpu, e.bytes);
                }
            }
            Event::GpuTeardown(e) if e.bytes > 0 => {
                if let Some(gpu) = e.gpu {
                    self.sub(e.owner_pid, gpu, e.bytes);
                }
            }
            Event::GpuCharge(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
                if let Some(gpu) = e.gpu {
                    self.sub(e.from_pid, gpu, e.bytes);
                    if outside(e.to_pid) {
                        self.add(e.to_pid, gpu, e.bytes);
                    }
                }
            }
            _ => {}
        }
    }

    /// A process is gone: the driver gave its memory back.
    pub fn exited(&mut self, pid: u32) {
        self.held.retain(|&(p, _), _| p != pid);
    }

    /// A process joined a task: its memory is the task's from now on (the
    /// core books what it allocates next; what it held before stays unseen).
    pub fn joined_task(&mut self, pid: u32) {
        self.exited(pid);
    }

    fn add(&mut self, pid: u32, gpu: u32, bytes: u64) {
        let held = self.held.entry((pid, gpu)).or_insert(0);
        *held = held.saturating_add(bytes);
    }

    fn sub(&mut self, pid: u32, gpu: u32, bytes: u64) {
        if let Some(held) = self.held.get_mut(&(pid, gpu)) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                self.held.remove(&(pid, gpu));
            }
        }
    }

    /// Per GPU, the memory held outside any task now.
    pub fn totals(&self) -> BTreeMap<u32, u64> {
        let mut totals: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(_, gpu), &bytes) in &self.held {
            let t = totals.entry(gpu).or_insert(0);
            *t = t.saturating_add(bytes);
        }
        totals
    }

    /// The inputs that tell the core what changed since it was last told,
    /// stamped `ts_ns`.
    pub fn changes(&mut self, ts_ns: u64) -> Vec<Input> {
        let now = self.totals();
        let mut inputs = Vec::new();
        for (&gpu, &bytes) in &now {
            if self.told.get(&gpu) != Some(&bytes) {
                inputs.push(Input::OutsideMem { gpu, bytes, ts_ns });
            }
        }
        for &gpu in self.told.keys() {
            if !now.contains_key(&gpu) {
                inputs.push(Input::OutsideMem {
                    gpu,
                    bytes: 0,
                    ts_ns,
                });
            }
        }
        self.told = now;
        inputs
    }
}

/// Per configured GPU: capacity, memory held by tasks, held outside any task
/// (as the core was last told), and free.
pub fn gpu_memory(sched: &Scheduler) -> Vec<GpuMemoryStatus> {
    let live = sched.live_tasks();
    let outside: BTreeMap<u32, u64> = sched.outside_mem().into_iter().collect();
    sched
        .config()
        .gpus
        .iter()
        .map(|g| {
            let tasks_bytes = live
                .iter()
                .filter(|t| t.state.is_live())
                .filter_map(|t| t.mem_bytes.get(&g.index))
                .fold(0u64, |sum, &b| sum.saturating_add(b));
            let outside_bytes = outside.get(&g.index).copied().unwrap_or(0);
            GpuMemoryStatus {
                gpu: g.index,
                capacity_bytes: g.capacity_bytes,
                tasks_bytes,
                outside_bytes,
                free_bytes: g
                    .capacity_bytes
                    .saturating_sub(tasks_bytes)
                    .saturating_sub(outside_bytes),
            }
        })
        .collect()
}

/// One GPU's figures for the memory-pressure report to Slurm
/// (`crate::slurm::node`): what it holds, who waits for memory on it, and how
/// many of its tasks' video allocations the driver refused since the agent
/// started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPressure {
    pub gpu: u32,
    pub capacity_bytes: u64,
    /// Held by live tasks and by processes in no task.
    pub held_bytes: u64,
    /// Live tasks placed on this GPU (or queued pinned to it) that wait for
    /// memory (wait reason `memory`).
    pub waiting: usize,
    /// Video allocations of its tasks the driver refused for lack of memory
    /// (`NO_MEMORY`), since the agent started: a count that only grows.
    pub refused: u64,
}

/// Per configured GPU, its [`MemoryPressure`] figures; `refused` per GPU as
/// the daemon counted them.
pub fn memory_pressure(sched: &Scheduler, refused: &BTreeMap<u32, u64>) -> Vec<MemoryPressure> {
    let live = sched.live_tasks();
    gpu_memory(sched)
        .into_iter()
        .map(|g| MemoryPressure {
            gpu: g.gpu,
            capacity_bytes: g.capacity_bytes,
            held_bytes: g.tasks_bytes.saturating_add(g.outside_bytes),
            waiting: live
                .iter()
                // Placed there, or queued unbound pinned to it (late binding).
                .filter(|t| t.gpu.or(t.spec.gpu) == Some(g.gpu))
                .filter(|t| sched.wait_reason(t.spec.id) == Some(WaitReason::Memory))
                .count(),
            refused: refused.get(&g.gpu).copied().unwrap_or(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use keling_common::{
        EventHeader, EventKind,
        nvidia::{ObjectKind, escape},
    };

    use super::*;
    use crate::event::decode::{GpuAllocEvent, GpuFreeEvent, GpuTeardownEvent, TeardownReason};

    fn hdr(kind: EventKind, pid: u32) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 0,
            ts_ns: 1,
            pid,
            tid: pid,
        }
    }

    fn alloc(pid: u32, bytes: u64) -> Event {
        Event::GpuAlloc(GpuAllocEvent {
            header: hdr(EventKind::GpuAlloc, pid),
            client: 1,
            parent: 2,
            handle: 3,
            class: 0x40,
            mem_kind: MemKind::Video,
            gpu: Some(0),
            escape: escape::ALLOC,
            via_xfer: false,
            bytes,
        })
    }

    #[test]
    fn only_memory_of_processes_in_no_task_is_booked_and_changes_are_told_once() {
        let mut o = OutsideMemory::default();
        let task_of = |pid: u32| (pid == 7).then_some(1);
        o.on_event(&alloc(7, 100), task_of);
        o.on_event(&alloc(9, 300), task_of);
        o.on_event(&alloc(9, 200), task_of);
        assert_eq!(
            o.changes(5),
            vec![Input::OutsideMem {
                gpu: 0,
                bytes: 500,
                ts_ns: 5
            }]
        );
        assert_eq!(o.changes(6), vec![], "nothing changed");
        o.on_event(
            &Event::GpuFree(GpuFreeEvent {
                header: hdr(EventKind::GpuFree, 9),
                client: 1,
                handle: 3,
                class: 0x40,
                kind: ObjectKind::VideoMemory,
                gpu: Some(0),
                mem_kind: Some(MemKind::Video),
                freed_pid: Some(9),
                escape: escape::FREE,
                bytes: 200,
            }),
            task_of,
        );
        assert_eq!(o.totals().get(&0), Some(&300));
        o.on_event(
            &Event::GpuTeardown(GpuTeardownEvent {
                header: hdr(EventKind::GpuTeardown, 9),
                client: 1,
                reason: TeardownReason::FileReleased,
                owner_pid: 9,
                gpu: Some(0),
                device: 1,
                sub: None,
                objects: 1,
                bytes: 300,
                host_bytes: 0,
                egm_bytes: 0,
            }),
            task_of,
        );
        assert_eq!(
            o.changes(7),
            vec![Input::OutsideMem {
                gpu: 0,
                bytes: 0,
                ts_ns: 7
            }]
        );
        o.on_event(&alloc(11, 50), task_of);
        o.exited(11);
        assert!(o.totals().is_empty());
    }
}
