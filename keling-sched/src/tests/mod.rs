//! Scenario and property tests of the whole state machine, driven through
//! [`Scheduler::step`] only and split by topic. Unit tests of the pieces live beside
//! them, in each module. [`Harness`] drives a scheduler at chosen times and plays a
//! perfect actuator on request; the property tests' `Driver` (in `properties`)
//! checks every output against the protocol in the crate doc.

mod binding;
mod duration;
mod immunity;
mod memory;
mod placement;
mod policies;
mod properties;
mod properties_sharing;
mod robustness;
mod sharing;
mod slots;
mod strategies;
mod wire;

use crate::state::TaskState::{Archived, Completed, Failed, Pending, Preempted, Running};
use crate::*;

const GIB: u64 = 1 << 30;
const MS: u64 = NS_PER_MS;

fn spec(id: TaskId, priority: u8) -> TaskSpec {
    TaskSpec {
        id,
        pid: 1000 + id as u32,
        name: format!("task{id}"),
        priority,
        gpu: Some(0),
        mem_quota_bytes: None,
        max_duration_ms: None,
        grace_ms: None,
        hard_kill: None,
        expected_runtime_ms: None,
    }
}

fn config(gpus: u32, slots: u32) -> SchedConfig {
    SchedConfig {
        gpus: (0..gpus)
            .map(|index| GpuInfo {
                index,
                capacity_bytes: 16 * GIB,
            })
            .collect(),
        slots_per_gpu: slots,
        // What these tests were written for (the agent's default is 300 ms).
        idle_timeout_ms: 500,
        ..SchedConfig::default()
    }
}

/// Drives a scheduler at chosen times; `settle` plays a perfect actuator.
struct Harness {
    sched: Scheduler,
    ts_ns: u64,
}

impl Harness {
    fn new(config: SchedConfig) -> Self {
        Harness {
            sched: Scheduler::new(config),
            ts_ns: 0,
        }
    }
    fn at_ms(&mut self, ms: u64) {
        self.ts_ns = ms * MS;
    }
    fn step(&mut self, input: Input) -> Output {
        self.sched.step(&input)
    }
    fn arrive(&mut self, spec: TaskSpec) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Arrive { spec, ts_ns })
    }
    fn active(&mut self, id: TaskId) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Active { id, ts_ns })
    }
    fn idle(&mut self, id: TaskId) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Idle { id, ts_ns })
    }
    fn tick(&mut self) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Tick { ts_ns })
    }
    fn exit(&mut self, id: TaskId, exit_code: i32) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Exit {
            id,
            exit_code,
            ts_ns,
        })
    }
    fn alloc(&mut self, id: TaskId, gpu: u32, bytes: u64) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::MemAlloc {
            id,
            gpu,
            bytes,
            ts_ns,
        })
    }
    fn alloc_failed(&mut self, id: TaskId, gpu: u32, bytes: u64) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::AllocFailed {
            id,
            gpu,
            bytes,
            ts_ns,
        })
    }
    fn confirm(&mut self, id: TaskId, action: ActionKind) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::Confirmed { id, action, ts_ns })
    }
    fn timed_out(&mut self, id: TaskId, action: ActionKind) -> Output {
        let ts_ns = self.ts_ns;
        self.step(Input::TimedOut { id, action, ts_ns })
    }
    /// Confirms every Freeze/Stop/Thaw in `out`, and in what that produces, at
    /// the current time. Returns everything, `out` included.
    fn settle(&mut self, out: Output) -> Output {
        let mut all = out;
        let mut pending = actuations(&all);
        for _ in 0..32 {
            if pending.is_empty() {
                return all;
            }
            let mut next = Vec::new();
            for (id, kind) in pending {
                let out = self.confirm(id, kind);
                next.extend(actuations(&out));
                all.actions.extend(out.actions);
                all.transitions.extend(out.transitions);
            }
            pending = next;
        }
        panic!("actuations never settle");
    }
    fn view(&self, id: TaskId) -> TaskView {
        self.sched.task(id).expect("known task")
    }
    fn state(&self, id: TaskId) -> TaskState {
        self.view(id).state
    }
}

fn actuations(out: &Output) -> Vec<(TaskId, ActionKind)> {
    out.actions
        .iter()
        .filter_map(|a| match a {
            Action::Freeze { id } => Some((*id, ActionKind::Freeze)),
            Action::Stop { id } => Some((*id, ActionKind::Stop)),
            Action::Thaw { id } => Some((*id, ActionKind::Thaw)),
            _ => None,
        })
        .collect()
}

fn moves(out: &Output) -> Vec<(TaskId, TaskState, TaskState, &str)> {
    out.transitions
        .iter()
        .map(|t| (t.task, t.from, t.to, t.reason.as_str()))
        .collect()
}

fn terminated(out: &Output) -> Vec<TaskId> {
    let mut ids: Vec<TaskId> = out
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Terminate { id } => Some(*id),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids
}
