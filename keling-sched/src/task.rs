//! The scheduler's private record of one task: what it knows ([`Task`]), the
//! actuation in flight ([`Actuation`]), how Keling is ending it ([`Ending`]), how it
//! ranks for a slot, and the [`TaskView`] it shows.

use std::collections::BTreeMap;

use crate::action::ActionKind;
use crate::input::TaskSpec;
use crate::policy::{PREEMPTION_MIN_REMAINING_MS, Policy};
use crate::reason::Reason;
use crate::state::{TaskState, TaskView, WaitReason, class_of, quantum_ms};
use crate::{NS_PER_MS, TaskId, ms_to_ns};

/// Which way an actuation in flight moves a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Freeze,
    Thaw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Actuation {
    pub(crate) direction: Direction,
    /// The transition reason to log when it takes effect.
    pub(crate) reason: Reason,
    /// Freeze: `Stop` was sent. Thaw: the `Thaw` was sent a second time.
    pub(crate) escalated: bool,
}

/// Keling has started to end the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ending {
    /// The first enforcement that applied; the `Failed` transition's reason.
    pub(crate) reason: Reason,
    pub(crate) terminate_sent: bool,
    pub(crate) kill_sent: bool,
    /// When the `Kill` that follows a `Terminate` is due.
    pub(crate) kill_at_ns: Option<u64>,
}

#[derive(Clone, Debug)]
pub(crate) struct Task {
    /// Priority already clamped to 0..=15.
    pub(crate) spec: TaskSpec,
    pub(crate) state: TaskState,
    /// `None` while it waits unbound (late binding); once bound it never changes.
    pub(crate) gpu: Option<u32>,
    pub(crate) mem_bytes: BTreeMap<u32, u64>,
    /// Per GPU, the most it has held there (memory sharing's demand without a
    /// budget).
    pub(crate) mem_peak: BTreeMap<u32, u64>,
    /// Why it waits on its GPU, as the last reconciliation found (`None` while
    /// it may run there, or unbound).
    pub(crate) wait: Option<WaitReason>,
    /// The overload rule: the most memory its GPU had in use (tasks and
    /// outside) while it was bound there. Kept only while the rule is on.
    pub(crate) gpu_peak_bytes: u64,
    /// A table the kernel needed for this task's books was full
    /// ([`crate::Input::MemUnsure`]): `mem_bytes` may be wrong, and is not held
    /// against its quota.
    pub(crate) mem_unsure: bool,
    pub(crate) arrived_ns: u64,
    /// Where its expected runtime counts from: arrival, or when late binding
    /// bound it (a task held before exec has not started).
    pub(crate) expected_from_ns: u64,
    pub(crate) started_ns: Option<u64>,
    pub(crate) finished_ns: Option<u64>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) on_gpu_ns: u64,
    /// Late binding under memory sharing: its share of its GPU's time so far,
    /// each stretch of running divided by how many tasks ran on that GPU at
    /// once (a GPU time-slices the contexts on it about equally): the work it
    /// has had, against which its expected runtime counts down for placement.
    pub(crate) share_ns: u64,
    pub(crate) quantum_used_ns: u64,
    /// Position in the round-robin queue of its priority: lower goes first.
    pub(crate) queue_seq: u64,
    pub(crate) wants_gpu: bool,
    /// Running without its slot: it went idle while another task waited, so it
    /// gave up the slot but was not frozen (frozen, it could never show that it
    /// wants the GPU again). Cleared when it holds a slot again or is frozen.
    pub(crate) yielded: bool,
    pub(crate) last_active_ns: u64,
    pub(crate) actuation: Option<Actuation>,
    pub(crate) warned: bool,
    pub(crate) duration_enforced: bool,
    pub(crate) ending: Option<Ending>,
    /// What the policy schedules it as: `spec.priority` under the hybrid policy.
    pub(crate) sched_priority: u8,
}

/// Lower ranks first for a slot: wanting the GPU, priority, queue position, id.
pub(crate) type Rank = (bool, u8, u64, TaskId);

impl Task {
    /// A task that has just arrived: `Pending`, wanting the GPU, scheduled with
    /// its own priority (the scheduler sets another for other policies).
    pub(crate) fn arrived(spec: TaskSpec, gpu: Option<u32>, now_ns: u64, queue_seq: u64) -> Self {
        Task {
            sched_priority: spec.priority,
            spec,
            state: TaskState::Pending,
            gpu,
            mem_bytes: BTreeMap::new(),
            mem_peak: BTreeMap::new(),
            wait: None,
            gpu_peak_bytes: 0,
            mem_unsure: false,
            arrived_ns: now_ns,
            expected_from_ns: now_ns,
            started_ns: None,
            finished_ns: None,
            exit_code: None,
            on_gpu_ns: 0,
            share_ns: 0,
            quantum_used_ns: 0,
            queue_seq,
            wants_gpu: true,
            yielded: false,
            last_active_ns: now_ns,
            actuation: None,
            warned: false,
            duration_enforced: false,
            ending: None,
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        self.state.is_live()
    }

    /// The priority the policy schedules it with (its own under the hybrid
    /// policy).
    pub(crate) fn priority(&self) -> u8 {
        self.sched_priority
    }

    /// Waiting unbound for a GPU (late binding).
    pub(crate) fn is_unbound(&self) -> bool {
        self.gpu.is_none()
    }

    /// Holds a slot and nothing is about to take it away: not being frozen.
    pub(crate) fn holds_slot_stably(&self) -> bool {
        self.holds_slot()
            && !self
                .actuation
                .is_some_and(|a| a.direction == Direction::Freeze)
    }

    /// Running (and not yielded), or about to (a thaw is in flight).
    pub(crate) fn holds_slot(&self) -> bool {
        (self.state == TaskState::Running && !self.yielded)
            || self
                .actuation
                .is_some_and(|a| a.direction == Direction::Thaw)
    }

    pub(crate) fn rank(&self) -> Rank {
        (
            !self.wants_gpu,
            self.priority(),
            self.queue_seq,
            self.spec.id,
        )
    }

    /// [`Task::rank`] under `policy`: FIFO ranks by arrival alone (idle holders
    /// keep their slot, and its queue positions never rotate).
    pub(crate) fn rank_under(&self, policy: Policy) -> Rank {
        match policy {
            Policy::Fifo => (false, self.priority(), self.queue_seq, self.spec.id),
            Policy::Hybrid | Policy::RoundRobin | Policy::Goav => self.rank(),
        }
    }

    /// The GPUs it uses: the one it is placed on and every GPU it holds memory
    /// on (whatever it was pinned to), sorted. Empty while it is unbound (held
    /// before exec, it uses none).
    pub(crate) fn gpus_used(&self) -> Vec<u32> {
        let Some(home) = self.gpu else {
            return Vec::new();
        };
        let mut gpus: Vec<u32> = self
            .mem_bytes
            .iter()
            .filter(|&(_, &bytes)| bytes > 0)
            .map(|(&g, _)| g)
            .collect();
        if !gpus.contains(&home) {
            gpus.push(home);
            gpus.sort_unstable();
        }
        gpus
    }

    pub(crate) fn mem_on(&self, gpu: u32) -> u64 {
        self.mem_bytes.get(&gpu).copied().unwrap_or(0)
    }

    /// Memory sharing: the memory it may take on `gpu`. Its budget
    /// (`mem_quota_bytes`, all GPUs together) on the GPU it is placed on (any
    /// GPU while unbound), less what it holds on others; elsewhere, or without
    /// a budget, the most it has held there. Never less than it holds.
    pub(crate) fn mem_demand_on(&self, gpu: u32) -> u64 {
        let held = self.mem_on(gpu);
        let peak = self.mem_peak.get(&gpu).copied().unwrap_or(0).max(held);
        match self.spec.mem_quota_bytes {
            Some(quota) if self.gpu.is_none_or(|home| home == gpu) => {
                let elsewhere: u64 = self
                    .mem_bytes
                    .iter()
                    .filter(|&(&g, _)| g != gpu)
                    .fold(0, |sum, (_, &b)| sum.saturating_add(b));
                quota.saturating_sub(elsewhere).max(held)
            }
            _ => peak,
        }
    }

    /// Memory sharing: what it may still take on `gpu` beyond what it holds.
    pub(crate) fn mem_extra_on(&self, gpu: u32) -> u64 {
        self.mem_demand_on(gpu).saturating_sub(self.mem_on(gpu))
    }

    pub(crate) fn total_mem(&self) -> u128 {
        self.mem_bytes.values().map(|&b| u128::from(b)).sum()
    }

    pub(crate) fn elapsed_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.arrived_ns)
    }

    pub(crate) fn expected_remaining_ms(&self, now_ns: u64) -> Option<u64> {
        let elapsed_ms = now_ns.saturating_sub(self.expected_from_ns) / NS_PER_MS;
        self.spec
            .expected_runtime_ms
            .map(|expected| expected.saturating_sub(elapsed_ms))
    }

    /// Round robin: it runs, nothing is in flight for it, and its quantum is
    /// used up.
    pub(crate) fn quantum_used_up(&self) -> bool {
        self.state == TaskState::Running
            && self.actuation.is_none()
            && self.quantum_used_ns >= ms_to_ns(quantum_ms(self.priority()))
    }

    /// Round robin: it waits for a turn where it is bound (it wants the GPU
    /// and holds no slot). Under memory sharing (`memory`) only when a cap
    /// keeps it waiting, as the last reconciliation found (a task waiting for
    /// memory or a higher priority gains nothing from a turn).
    pub(crate) fn waits_for_turn(&self, memory: bool) -> bool {
        self.wants_gpu
            && !self.holds_slot()
            && (!memory || self.wait.is_none_or(|w| w == WaitReason::SlotsHeld))
    }

    /// Under goav, whether the guard lets it be preempted at `now_ns`: it
    /// declares no runtime, or expects more than
    /// [`PREEMPTION_MIN_REMAINING_MS`] of it still. Only ever turns false as
    /// the clock moves.
    pub(crate) fn preemption_candidate(&self, now_ns: u64) -> bool {
        self.expected_remaining_ms(now_ns)
            .is_none_or(|ms| ms > PREEMPTION_MIN_REMAINING_MS)
    }

    /// Memory sharing: the GPU time it is expected still to need, from its
    /// expected runtime less its share so far; a task past its expected
    /// runtime is taken to need a tenth of it more. 0 without an expected runtime.
    pub(crate) fn remaining_work_ns(&self) -> u64 {
        let Some(expected) = self.spec.expected_runtime_ms else {
            return 0;
        };
        let expected = expected.saturating_mul(NS_PER_MS);
        expected.saturating_sub(self.share_ns).max(expected / 10)
    }

    /// What placement expects the task still to need the GPU for.
    pub(crate) fn expected_work_ms(&self, now_ns: u64) -> u64 {
        self.expected_remaining_ms(now_ns).unwrap_or_else(|| {
            quantum_ms(self.priority()).saturating_sub(self.quantum_used_ns / NS_PER_MS)
        })
    }

    pub(crate) fn view(&self) -> TaskView {
        TaskView {
            spec: self.spec.clone(),
            state: self.state,
            gpu: self.gpu,
            mem_bytes: self.mem_bytes.clone(),
            mem_unsure: self.mem_unsure,
            on_gpu_ns: self.on_gpu_ns,
            on_gpu_ms: self.on_gpu_ns / NS_PER_MS,
            wants_gpu: self.wants_gpu,
            // Only a running task can have yielded (an exit leaves the flag).
            yielded: self.yielded && self.state == TaskState::Running,
            class: class_of(self.spec.priority),
            quantum_ms: quantum_ms(self.spec.priority),
            in_flight: self.actuation.map(|a| match (a.direction, a.escalated) {
                (Direction::Freeze, false) => ActionKind::Freeze,
                (Direction::Freeze, true) => ActionKind::Stop,
                (Direction::Thaw, _) => ActionKind::Thaw,
            }),
            ending_reason: self.ending.map(|e| e.reason),
            arrived_ns: self.arrived_ns,
            started_ns: self.started_ns,
            finished_ns: self.finished_ns,
            exit_code: self.exit_code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: TaskId, priority: u8) -> Task {
        let spec = TaskSpec {
            id,
            pid: 1,
            name: String::new(),
            priority,
            gpu: None,
            mem_quota_bytes: None,
            max_duration_ms: None,
            grace_ms: None,
            hard_kill: None,
            expected_runtime_ms: None,
        };
        Task::arrived(spec, Some(0), 1_000, id)
    }

    #[test]
    fn wanting_the_gpu_ranks_before_priority_then_queue_then_id() {
        let mut idle_high = task(1, 0);
        idle_high.wants_gpu = false;
        let active_low = task(2, 15);
        let mut early = task(3, 5);
        early.queue_seq = 0;
        let late = task(4, 5);
        assert!(active_low.rank() < idle_high.rank());
        assert!(early.rank() < late.rank());
    }

    #[test]
    fn in_flight_shows_an_escalated_freeze_as_stop() {
        let mut t = task(1, 5);
        let shown = |t: &Task| t.view().in_flight;
        assert_eq!(shown(&t), None);
        t.actuation = Some(Actuation {
            direction: Direction::Freeze,
            reason: Reason::Queued,
            escalated: false,
        });
        assert_eq!(shown(&t), Some(ActionKind::Freeze));
        assert!(!t.holds_slot(), "a pending task being frozen holds no slot");
        t.actuation = Some(Actuation {
            escalated: true,
            ..t.actuation.unwrap()
        });
        assert_eq!(shown(&t), Some(ActionKind::Stop));
        t.actuation = Some(Actuation {
            direction: Direction::Thaw,
            reason: Reason::Resumed,
            escalated: true,
        });
        assert_eq!(shown(&t), Some(ActionKind::Thaw));
        assert!(t.holds_slot(), "a thaw in flight holds the slot");
    }

    #[test]
    fn expected_work_is_the_runtime_left_or_the_quantum_left() {
        let mut t = task(1, 7); // quantum 100 ms, arrived at 1 µs
        t.quantum_used_ns = 30 * NS_PER_MS;
        assert_eq!(t.expected_work_ms(2_000 * NS_PER_MS), 70);
        t.spec.expected_runtime_ms = Some(5_000);
        assert_eq!(
            t.expected_remaining_ms(2_000 * NS_PER_MS + 1_000),
            Some(3_000)
        );
        assert_eq!(t.expected_work_ms(9_000 * NS_PER_MS), 0);
    }
}
