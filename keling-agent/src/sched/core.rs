//! The scheduler core: a pure, deterministic state machine that decides which GPU
//! tasks run, which wait and which must end.
//!
//! This module owns the scheduling policy and nothing else. It has no clock, no I/O,
//! no randomness, and never depends on hash-map order: [`Scheduler::step`] takes one
//! timestamped [`Input`] and returns an [`Output`], the [`Action`]s the agent must
//! carry out and the task state [`Transition`]s to log. The same inputs always give
//! the same outputs, which is what lets `keling replay` re-run a recorded session
//! exactly and compare policies offline. It must not touch cgroups, signals, NVML or
//! files: the agent around it does.
//!
//! # Protocol
//!
//! ```text
//!  kernel events ─► agent ── Input ──► Scheduler::step ── Output ──► agent ─► cgroups, signals
//!                     ▲                                                 │
//!                     └────────── Confirmed / TimedOut (feedback) ◄─────┘
//! ```
//!
//! Every input carries `ts_ns`, the kernel timestamp (CLOCK_MONOTONIC, ns) of what it
//! reports. The core's clock is the largest `ts_ns` seen so far: an input stamped
//! earlier is handled at that clock, so time never runs backwards. Every rule that
//! depends on time (quantum, idle timeout, duration limit, kill deadline) is checked
//! on every input; `Tick` exists so they fire even when nothing else happens.
//!
//! ## Inputs: agent → core
//!
//! | Input | The agent sends it when | The core |
//! |---|---|---|
//! | `Arrive` | a task (a GPU process or process tree) is launched or adopted; it is running as it is | places it (`Place`), then lets it run or freezes it |
//! | `Active` | the trace saw the task use the GPU or the CPU; or something outside the trace knows a frozen task has work (a request for a frozen server) | marks the task as wanting the GPU |
//! | `Idle` | the task is known to be idle (optional hint) | marks it as not wanting the GPU |
//! | `MemAlloc` / `MemFree` | the driver granted / released bytes (exact, from the kernel) | updates the task's memory, checks its quota |
//! | `AllocFailed` | the driver answered NO_MEMORY | applies the memory-pressure rule |
//! | `Exit` | the task's process (tree) is gone | ends the task: Completed or Failed |
//! | `Tick` | every `tick_ms`, whether or not anything happened | archives finished tasks; time rules |
//! | `Confirmed` | an action was seen to take effect (`frozen 1` in `cgroup.events`, process state `T`, ...) | completes the state change the action started |
//! | `TimedOut` | an action was not confirmed by the timeout model's deadline | escalates (below) |
//!
//! Inputs naming a task the core does not know are ignored, and so is an `Arrive`
//! for an id it already knows (ids are never reused). Nothing in `step` panics.
//!
//! ## Actions: core → agent
//!
//! Actions in one [`Output`] are listed in the order they should be carried out.
//!
//! | Action | The agent | Feedback the core expects |
//! |---|---|---|
//! | `Place { id, gpu }` | binds the task to `gpu` (`CUDA_VISIBLE_DEVICES` for tasks it launches); once per task, at arrival | none |
//! | `Freeze { id }` | writes 1 to the task's `cgroup.freeze` (SIGSTOP for processes Keling did not launch) | `Confirmed { Freeze }` or `TimedOut { Freeze }` |
//! | `Stop { id }` | sends SIGSTOP to the task's processes: escalation of a freeze that timed out | `Confirmed { Stop }` (a late `Confirmed { Freeze }` counts too) |
//! | `Thaw { id }` | undoes whatever stopped the task: `cgroup.freeze` 0 and SIGCONT | `Confirmed { Thaw }` or `TimedOut { Thaw }` |
//! | `Terminate { id }` | sends SIGTERM | `Exit` (a Kill follows after `kill_grace_ms`) |
//! | `Kill { id }` | sends SIGKILL (or writes `cgroup.kill`) | `Exit` |
//! | `Warn { id, remaining_ms }` | tells the task's owner its session ends in `remaining_ms` | none |
//! | `Enforce { id, record }` | logs/reports the 4003 record; always followed in the same output by the `Kill` or `Terminate` it justifies, unless one was already sent | none |
//!
//! ## Who confirms what
//!
//! Task states are facts, not intentions. A task being frozen stays `Running` until
//! the agent confirms the freeze, and keeps its slot until then; a task being
//! thawed stays `Preempted` until the thaw is confirmed, but holds its slot already.
//! [`TaskView::in_flight`] shows the actuation in flight. At most one actuation is in
//! flight per task and it is never contradicted: if the core changes its mind while a
//! freeze is in flight, it waits for the confirmation and then thaws. Feedback for an
//! action that is not in flight (late, duplicate, wrong kind) is ignored.
//!
//! Escalation when the timeout model says an action is late:
//! - `TimedOut { Freeze }` → `Stop` (SIGSTOP cannot be ignored). The freeze stays in
//!   flight until `Confirmed { Stop }` or `Confirmed { Freeze }`; `TimedOut { Stop }`
//!   is ignored (a task stuck in the kernel stops when it leaves it).
//! - `TimedOut { Thaw }` → `Thaw` again, once. If that one times out too, the core
//!   assumes the task runs (`Preempted → Running`, reason `thaw_unconfirmed`): a thaw
//!   only removes a restriction, and waiting forever would hold the slot forever.
//! - `TimedOut` of any other action is ignored: `Terminate` is followed by `Kill`
//!   on the kill deadline anyway, and a task ends only on `Exit`.
//!
//! # Policy
//!
//! ## States
//!
//! ```text
//!            ┌───────────────► COMPLETED ─┐
//!  PENDING ──┼──► RUNNING ◄──► PREEMPTED  ├──► ARCHIVED
//!            └───────────────► FAILED ────┘
//! ```
//! (see [`is_legal`] for the exact list). A task arrives `Pending` and is placed on a
//! GPU at once. If it ranks among the tasks that should hold that GPU's slots it
//! becomes `Running` in the same step (reason `placed`; it is already running, so no
//! action is needed); otherwise it is frozen and becomes `Preempted` when the freeze
//! is confirmed (reason `queued`). `Running → Preempted` reasons:
//! `quantum_expired`, `idle`, `preempted_by_higher_priority`, `round_robin` (an
//! equal-priority task is ahead in the rotation); `Preempted → Running`: `resumed`.
//! `Exit` makes a task `Completed` (exit code 0, reason `exited`) or `Failed`
//! (non-zero: `exited_with_error`; or any exit after Keling started ending it: the
//! first enforcement's reason, `duration_limit`, `evicted_for_memory` or
//! `over_quota`). Finished tasks become `Archived` on the next `Tick` (reason
//! `archived`), so a reader sees the final state and exit code for one tick first.
//!
//! ## Who holds the slots
//!
//! Each GPU runs at most `slots_per_gpu` tasks at once. After every input, the live
//! tasks placed on a GPU are ranked by
//! 1. wanting the GPU first (idle tasks never hold a slot against active ones),
//! 2. priority (0 first),
//! 3. position in the round-robin queue of that priority,
//! 4. id,
//!
//! and the first `slots_per_gpu` should hold the slots. Tasks outside that set that
//! run are frozen at once (a higher-priority task preempts immediately); tasks in it
//! that are frozen are thawed as soon as a slot is free, that is when the freezes in
//! flight are confirmed. The one exception to "never more than the slots": a task
//! that arrives and ranks among the holders is already running, so it becomes
//! `Running` at once, and the task it displaces runs too until its freeze lands.
//! Once the actuations in flight are confirmed the scheduler is work-conserving:
//! while there are at least as many tasks as slots every slot is held, by idle tasks
//! if nobody active waits, and no task runs while an active task of higher priority
//! waits on its GPU.
//!
//! **Wanting the GPU.** `Active` makes a task want the GPU; `Idle`, or
//! `idle_timeout_ms` of running without an `Active`, makes it idle. A newly arrived
//! task wants the GPU (it is starting and has never had the chance to show
//! activity). A frozen task cannot show activity, so it keeps what it had when frozen
//! and the idle timeout only counts while it runs (it restarts when the task
//! resumes). A consequence: a task frozen while idle stays frozen until a slot is
//! free or the agent sends `Active` for it.
//!
//! **Round robin.** A task's quantum ([`quantum_ms`]) is used only while it is
//! `Running`. When it is used up and an active task of the same priority on the same
//! GPU waits, the task goes to the back of its priority's queue (and is frozen with
//! reason `quantum_expired`); if nobody of its priority waits it starts a fresh
//! quantum. A task preempted by a higher priority keeps its queue position and what
//! is left of its quantum.
//!
//! ## Memory pressure
//!
//! On `AllocFailed { id, gpu, bytes }` the requester needs `bytes` minus the GPU's
//! free bytes (capacity minus the memory all live tasks hold there), minus the memory
//! of tasks already being ended (it is on its way back, so repeated failures while
//! victims exit do not evict more). Candidates are live tasks of strictly lower
//! priority that hold memory on that GPU, are not already being ended, and expect
//! more than 3 s of remaining time (`expected_runtime_ms` minus elapsed wall time;
//! unknown counts as more). The evicted set is the smallest that covers the need:
//! fewest tasks, then fewest bytes, then lowest priorities, then lowest ids (see
//! [`choose_victims`]). If no set covers it, nobody is evicted: that would not make
//! the allocation succeed. A GPU missing from the config has no known capacity and
//! evicts nobody. Eviction is `Terminate`, then `Kill` after `kill_grace_ms` if the
//! task has not exited. A `MemAlloc` that takes a task's memory on all GPUs together
//! strictly over `mem_quota_bytes` ends it the same way (reason `over_quota`). A task
//! that Keling is already ending evicts nobody.
//!
//! ## Session duration limits
//!
//! Elapsed time counts from arrival, in wall time, frozen time included (the limit is
//! on the session, not on GPU time). At `limit - grace` the core emits `Warn` once; at
//! the limit it emits `Enforce` with the 4003 record (`allowed_ms` = the limit,
//! `actual_ms` = elapsed at that input) and `Kill` (`hard_kill`, the default) or
//! `Terminate` followed by `Kill` after `kill_grace_ms`. Because time rules run on
//! every input and the agent ticks every `tick_ms`, it fires within one tick of the
//! deadline. If the first input past the warning point is already past the limit
//! (or `grace_ms` is 0), no `Warn` is sent: the `Enforce` says it all. The limit is
//! enforced even on a task already being ended for another reason.
//!
//! ## Placement
//!
//! A task with `gpu: Some(g)` goes to `g` (even one missing from the config, which is
//! then scheduled with `slots_per_gpu` slots and unknown capacity). Otherwise the core
//! picks the configured GPU with the highest weight
//!
//! `W = 0.4 × (1 − used/capacity) + 0.35 × 1/(1 + expected_queue_s) + 0.25 × success_rate`
//!
//! DESIGN.md's formula mixes a load term (memory used, lower is better) with two
//! goodness terms (higher is better); Keling turns the load term into free memory so
//! that higher W is better throughout. `expected_queue_s` is the expected remaining
//! work of the tasks on that GPU that want it (expected runtime left, or what is left
//! of their quantum when the runtime is unknown), divided by the slots.
//! `success_rate` is successful allocations over all attempts on that GPU in the last
//! 300 s (kept in 1 s buckets), 1.0 with no data. Ties go to the lowest index. With no
//! GPUs configured, tasks go to GPU 0.
//!
//! ## Small decisions
//!
//! Priorities above 15 are treated as 15; `slots_per_gpu` 0 is treated as 1.
//! Archived tasks are kept so that [`Scheduler::task`] can still answer for them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

pub type TaskId = u64;

/// The lowest priority (highest number); anything above is treated as this.
pub const LOWEST_PRIORITY: u8 = 15;
/// Eviction candidates must expect to run longer than this.
pub const EVICTION_MIN_REMAINING_MS: u64 = 3_000;
/// Up to this many eviction candidates the victim set is searched exactly.
pub const EXACT_VICTIM_SEARCH_MAX_CANDIDATES: usize = 20;
/// The window of the allocation success rate used by placement.
pub const ALLOC_SUCCESS_WINDOW_S: u64 = 300;
/// Placement weight of the free-memory fraction.
pub const PLACEMENT_FREE_MEMORY_WEIGHT: f64 = 0.4;
/// Placement weight of `1 / (1 + expected queue time in s)`.
pub const PLACEMENT_QUEUE_WEIGHT: f64 = 0.35;
/// Placement weight of the allocation success rate.
pub const PLACEMENT_ALLOC_SUCCESS_WEIGHT: f64 = 0.25;
/// The code of the session-duration enforcement record.
pub const DURATION_EXCEEDED_CODE: u32 = 4003;

const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000_000_000;

fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(NS_PER_MS)
}

/// What the agent knows about a task when it arrives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub id: TaskId,
    pub pid: u32,
    pub name: String,
    /// 0..=15, 0 highest.
    pub priority: u8,
    /// The GPU to run on; `None`: place automatically.
    pub gpu: Option<u32>,
    /// Most GPU memory the task may hold, all GPUs together.
    pub mem_quota_bytes: Option<u64>,
    /// Session duration limit; `None`: the config's default.
    pub max_duration_ms: Option<u64>,
    /// Warning window before the limit; `None`: the config's default.
    pub grace_ms: Option<u64>,
    /// Kill at the limit (true) or terminate with grace (false); `None`: the default.
    pub hard_kill: Option<bool>,
    /// How long the task expects to run in total, in wall time.
    pub expected_runtime_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskState {
    Pending,
    Running,
    Preempted,
    Completed,
    Failed,
    Archived,
}

impl TaskState {
    /// The name the scheduling log uses: `RUNNING`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "PENDING",
            TaskState::Running => "RUNNING",
            TaskState::Preempted => "PREEMPTED",
            TaskState::Completed => "COMPLETED",
            TaskState::Failed => "FAILED",
            TaskState::Archived => "ARCHIVED",
        }
    }

    /// Pending, Running or Preempted: the task has not ended.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            TaskState::Pending | TaskState::Running | TaskState::Preempted
        )
    }
}

/// Whether the scheduling log may show `from → to`:
/// PENDING → RUNNING | PREEMPTED | COMPLETED | FAILED, RUNNING ↔ PREEMPTED,
/// RUNNING | PREEMPTED → COMPLETED | FAILED, COMPLETED | FAILED → ARCHIVED.
pub fn is_legal(from: TaskState, to: TaskState) -> bool {
    use TaskState::*;
    matches!(
        (from, to),
        (Pending, Running | Preempted | Completed | Failed)
            | (Running, Preempted | Completed | Failed)
            | (Preempted, Running | Completed | Failed)
            | (Completed | Failed, Archived)
    )
}

/// Priority classes: real-time 0-2, interactive 3-6, background 7-15.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Class {
    RealTime,
    Interactive,
    Background,
}

pub fn class_of(priority: u8) -> Class {
    match priority {
        0..=2 => Class::RealTime,
        3..=6 => Class::Interactive,
        _ => Class::Background,
    }
}

/// The time slice of a priority, in ms: linear inside each class (real-time 0→5,
/// 2→10; interactive 3→20, 6→50; background 7→100, 15→200), rounded down.
///
/// | priority   | 0 | 1 | 2  | 3  | 4  | 5  | 6  | 7   | 8   | 9   | 10  | 11  | 12  | 13  | 14  | 15  |
/// |------------|---|---|----|----|----|----|----|-----|-----|-----|-----|-----|-----|-----|-----|-----|
/// | quantum_ms | 5 | 7 | 10 | 20 | 30 | 40 | 50 | 100 | 112 | 125 | 137 | 150 | 162 | 175 | 187 | 200 |
pub fn quantum_ms(priority: u8) -> u64 {
    let p = u64::from(priority.min(LOWEST_PRIORITY));
    match class_of(priority) {
        Class::RealTime => 5 + p * 5 / 2,
        Class::Interactive => 20 + (p - 3) * 10,
        Class::Background => 100 + (p - 7) * 100 / 8,
    }
}

/// `(max - min) / mean` of per-device values: 0 when balanced, and for an empty
/// slice or a zero (or non-finite) mean.
pub fn load_balance_error(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if mean == 0.0 || !mean.is_finite() {
        return 0.0;
    }
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    (max - min) / mean
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub capacity_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedConfig {
    /// The GPUs automatic placement chooses from.
    pub gpus: Vec<GpuInfo>,
    /// Tasks that may run at once on one GPU (0 is treated as 1).
    pub slots_per_gpu: u32,
    /// A running task without `Active` for this long stops wanting the GPU.
    pub idle_timeout_ms: u64,
    pub default_max_duration_ms: u64,
    pub default_grace_ms: u64,
    pub default_hard_kill: bool,
    /// Terminate with grace: SIGTERM, then SIGKILL after this.
    pub kill_grace_ms: u64,
    /// How often the agent sends `Tick`.
    pub tick_ms: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            gpus: Vec::new(),
            slots_per_gpu: 1,
            idle_timeout_ms: 500,
            default_max_duration_ms: 3_600_000,
            default_grace_ms: 30_000,
            default_hard_kill: true,
            kill_grace_ms: 5_000,
            tick_ms: 10,
        }
    }
}

impl SchedConfig {
    pub fn slots(&self) -> usize {
        usize::try_from(self.slots_per_gpu.max(1)).unwrap_or(usize::MAX)
    }
}

/// One timestamped fact from the agent. See the module doc for the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    Arrive {
        spec: TaskSpec,
        ts_ns: u64,
    },
    /// The trace saw the task use the GPU or the CPU.
    Active {
        id: TaskId,
        ts_ns: u64,
    },
    /// Explicit idle hint (idleness is also inferred after `idle_timeout_ms`).
    Idle {
        id: TaskId,
        ts_ns: u64,
    },
    /// A successful allocation (exact, from the kernel).
    MemAlloc {
        id: TaskId,
        gpu: u32,
        bytes: u64,
        ts_ns: u64,
    },
    MemFree {
        id: TaskId,
        gpu: u32,
        bytes: u64,
        ts_ns: u64,
    },
    /// The driver said NO_MEMORY for `bytes`: memory pressure.
    AllocFailed {
        id: TaskId,
        gpu: u32,
        bytes: u64,
        ts_ns: u64,
    },
    Exit {
        id: TaskId,
        exit_code: i32,
        ts_ns: u64,
    },
    Tick {
        ts_ns: u64,
    },
    /// The actuator saw the action take effect.
    Confirmed {
        id: TaskId,
        action: ActionKind,
        ts_ns: u64,
    },
    /// The action was not confirmed within the timeout model's deadline.
    TimedOut {
        id: TaskId,
        action: ActionKind,
        ts_ns: u64,
    },
}

impl Input {
    pub fn ts_ns(&self) -> u64 {
        match self {
            Input::Arrive { ts_ns, .. }
            | Input::Active { ts_ns, .. }
            | Input::Idle { ts_ns, .. }
            | Input::MemAlloc { ts_ns, .. }
            | Input::MemFree { ts_ns, .. }
            | Input::AllocFailed { ts_ns, .. }
            | Input::Exit { ts_ns, .. }
            | Input::Tick { ts_ns }
            | Input::Confirmed { ts_ns, .. }
            | Input::TimedOut { ts_ns, .. } => *ts_ns,
        }
    }

    /// The task the input is about; `None` for `Tick`.
    #[cfg(test)]
    pub fn task(&self) -> Option<TaskId> {
        match self {
            Input::Arrive { spec, .. } => Some(spec.id),
            Input::Active { id, .. }
            | Input::Idle { id, .. }
            | Input::MemAlloc { id, .. }
            | Input::MemFree { id, .. }
            | Input::AllocFailed { id, .. }
            | Input::Exit { id, .. }
            | Input::Confirmed { id, .. }
            | Input::TimedOut { id, .. } => Some(*id),
            Input::Tick { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ActionKind {
    Freeze,
    Thaw,
    /// SIGSTOP: escalation of a freeze that timed out.
    Stop,
    /// SIGTERM.
    Terminate,
    Kill,
    Place,
    Warn,
}

/// What the agent must do. See the module doc for what each means.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Freeze {
        id: TaskId,
    },
    Thaw {
        id: TaskId,
    },
    Stop {
        id: TaskId,
    },
    Terminate {
        id: TaskId,
    },
    Kill {
        id: TaskId,
    },
    Place {
        id: TaskId,
        gpu: u32,
    },
    Warn {
        id: TaskId,
        remaining_ms: u64,
    },
    /// Session duration exceeded: the 4003 record, emitted with the Kill/Terminate.
    Enforce {
        id: TaskId,
        record: EnforcementRecord,
    },
}

impl Action {
    pub fn task(&self) -> TaskId {
        match self {
            Action::Freeze { id }
            | Action::Thaw { id }
            | Action::Stop { id }
            | Action::Terminate { id }
            | Action::Kill { id }
            | Action::Place { id, .. }
            | Action::Warn { id, .. }
            | Action::Enforce { id, .. } => *id,
        }
    }

    /// The kind a `Confirmed`/`TimedOut` for this action names; `None` for `Enforce`.
    pub fn kind(&self) -> Option<ActionKind> {
        match self {
            Action::Freeze { .. } => Some(ActionKind::Freeze),
            Action::Thaw { .. } => Some(ActionKind::Thaw),
            Action::Stop { .. } => Some(ActionKind::Stop),
            Action::Terminate { .. } => Some(ActionKind::Terminate),
            Action::Kill { .. } => Some(ActionKind::Kill),
            Action::Place { .. } => Some(ActionKind::Place),
            Action::Warn { .. } => Some(ActionKind::Warn),
            Action::Enforce { .. } => None,
        }
    }
}

/// `{"code":4003,"message":"session duration exceeded limit","data":{..}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnforcementRecord {
    pub code: u32,
    pub message: String,
    pub data: EnforcementData,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnforcementData {
    pub allowed_ms: u64,
    pub actual_ms: u64,
    pub reason: String,
}

impl EnforcementRecord {
    pub fn duration_exceeded(allowed_ms: u64, actual_ms: u64) -> Self {
        EnforcementRecord {
            code: DURATION_EXCEEDED_CODE,
            message: "session duration exceeded limit".to_string(),
            data: EnforcementData {
                allowed_ms,
                actual_ms,
                reason: "server_enforced".to_string(),
            },
        }
    }
}

/// One line of the scheduling log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// 1, 2, 3, ... over the scheduler's life.
    pub event_id: u64,
    pub task: TaskId,
    pub name: String,
    pub pid: u32,
    pub gpu: Option<u32>,
    pub priority: u8,
    pub from: TaskState,
    pub to: TaskState,
    /// Why, in snake_case: `placed`, `queued`, `preempted_by_higher_priority`, ...
    pub reason: String,
    pub timestamp_ns: u64,
    /// On COMPLETED, FAILED and ARCHIVED.
    pub exit_code: Option<i32>,
}

impl Transition {
    /// `"RUNNING→PREEMPTED"`.
    pub fn state_transition(&self) -> String {
        format!("{}\u{2192}{}", self.from.as_str(), self.to.as_str())
    }
}

#[derive(Clone, Default, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub actions: Vec<Action>,
    pub transitions: Vec<Transition>,
}

/// A read-only picture of one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskView {
    /// As given on arrival, priority clamped to 0..=15.
    pub spec: TaskSpec,
    pub state: TaskState,
    pub gpu: Option<u32>,
    /// Memory held now, per GPU index.
    pub mem_bytes: BTreeMap<u32, u64>,
    /// Time spent `Running`.
    pub on_gpu_ns: u64,
    pub on_gpu_ms: u64,
    pub wants_gpu: bool,
    pub class: Class,
    pub quantum_ms: u64,
    /// `Freeze`, `Stop` (an escalated freeze) or `Thaw` while one is in flight.
    pub in_flight: Option<ActionKind>,
    /// Why Keling is ending the task, once it started to.
    pub ending_reason: Option<String>,
    pub arrived_ns: u64,
    /// First time it became `Running`.
    pub started_ns: Option<u64>,
    pub finished_ns: Option<u64>,
    pub exit_code: Option<i32>,
}

/// A task that memory pressure may evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VictimCandidate {
    pub id: TaskId,
    pub priority: u8,
    /// Memory it holds on the GPU under pressure.
    pub bytes: u64,
}

/// The smallest set of candidates whose bytes cover `need_bytes`: fewest tasks, then
/// fewest bytes, then lowest priorities (the set whose priorities, sorted from lowest
/// priority down, are lexicographically lowest-priority first), then lowest ids
/// (sorted ids, lexicographically). Empty when `need_bytes` is 0 or no set covers it.
/// Returned sorted by id.
///
/// The fewest-tasks count is always exact (the k largest candidates cover the need
/// if any k do). Up to [`EXACT_VICTIM_SEARCH_MAX_CANDIDATES`] candidates the
/// tie-breaks are exact too (every set of that size is tried); beyond, the set
/// starts from the k largest and greedily swaps each member for the smallest
/// candidate that still covers, so its bytes may not be the least possible.
pub fn choose_victims(candidates: &[VictimCandidate], need_bytes: u64) -> Vec<TaskId> {
    if need_bytes == 0 {
        return Vec::new();
    }
    let need = u128::from(need_bytes);
    let mut by_size: Vec<&VictimCandidate> = candidates.iter().filter(|c| c.bytes > 0).collect();
    by_size.sort_by_key(|c| (Reverse(c.bytes), Reverse(c.priority), c.id));
    let mut covered: u128 = 0;
    let mut fewest = None;
    for (i, c) in by_size.iter().enumerate() {
        covered += u128::from(c.bytes);
        if covered >= need {
            fewest = Some(i + 1);
            break;
        }
    }
    let Some(k) = fewest else {
        return Vec::new();
    };
    let chosen = if by_size.len() <= EXACT_VICTIM_SEARCH_MAX_CANDIDATES {
        exact_victims(&by_size, k, need)
    } else {
        greedy_victims(&by_size, k, need)
    };
    let mut ids: Vec<TaskId> = chosen.iter().map(|&i| by_size[i].id).collect();
    ids.sort_unstable();
    ids
}

type VictimSetKey = (u128, Reverse<Vec<u8>>, Vec<TaskId>);

fn victim_set_key(cands: &[&VictimCandidate], members: &[usize]) -> VictimSetKey {
    let total = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
    let mut priorities: Vec<u8> = members.iter().map(|&i| cands[i].priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    let mut ids: Vec<TaskId> = members.iter().map(|&i| cands[i].id).collect();
    ids.sort_unstable();
    (total, Reverse(priorities), ids)
}

/// Every `k`-subset of `cands`, best key wins. `1 <= k <= cands.len()`.
fn exact_victims(cands: &[&VictimCandidate], k: usize, need: u128) -> Vec<usize> {
    let n = cands.len();
    let mut members: Vec<usize> = (0..k).collect();
    let mut best: Option<(VictimSetKey, Vec<usize>)> = None;
    loop {
        let total: u128 = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
        // Building the full key allocates: only do it when the set can win.
        if total >= need && best.as_ref().is_none_or(|(key, _)| total <= key.0) {
            let key = victim_set_key(cands, &members);
            if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
                best = Some((key, members.clone()));
            }
        }
        if !next_combination(&mut members, n) {
            break;
        }
    }
    best.map(|(_, members)| members).unwrap_or_default()
}

/// Advances `members` (strictly increasing indices below `n`) to the next
/// combination in lexicographic order; false after the last.
fn next_combination(members: &mut [usize], n: usize) -> bool {
    let k = members.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if members[i] < n - k + i {
            let mut next = members[i];
            for slot in members.iter_mut().skip(i) {
                next += 1;
                *slot = next;
            }
            return true;
        }
    }
    false
}

/// `cands` sorted largest first; start from the `k` largest and swap each member, in
/// turn, for the smallest non-member that keeps the need covered.
fn greedy_victims(cands: &[&VictimCandidate], k: usize, need: u128) -> Vec<usize> {
    let mut members: Vec<usize> = (0..k).collect();
    let mut total: u128 = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
    // Smallest first; among equal sizes, lowest priority first, then lowest id.
    let mut by_small: Vec<usize> = (0..cands.len()).collect();
    by_small.sort_by_key(|&i| (cands[i].bytes, Reverse(cands[i].priority), cands[i].id));
    for slot in 0..members.len() {
        let current = members[slot];
        let current_bytes = u128::from(cands[current].bytes);
        let swap = by_small.iter().copied().find(|&c| {
            !members.contains(&c)
                && u128::from(cands[c].bytes) < current_bytes
                && total - current_bytes + u128::from(cands[c].bytes) >= need
        });
        if let Some(c) = swap {
            total = total - current_bytes + u128::from(cands[c].bytes);
            members[slot] = c;
        }
    }
    members
}

/// Which way an actuation in flight moves a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Freeze,
    Thaw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Actuation {
    direction: Direction,
    /// The transition reason to log when it takes effect.
    reason: &'static str,
    /// Freeze: `Stop` was sent. Thaw: the `Thaw` was sent a second time.
    escalated: bool,
}

/// Keling has started to end the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ending {
    /// The first enforcement that applied; the `Failed` transition's reason.
    reason: &'static str,
    terminate_sent: bool,
    kill_sent: bool,
    /// When the `Kill` that follows a `Terminate` is due.
    kill_at_ns: Option<u64>,
}

#[derive(Clone, Debug)]
struct Task {
    spec: TaskSpec,
    state: TaskState,
    gpu: u32,
    mem_bytes: BTreeMap<u32, u64>,
    arrived_ns: u64,
    started_ns: Option<u64>,
    finished_ns: Option<u64>,
    exit_code: Option<i32>,
    on_gpu_ns: u64,
    quantum_used_ns: u64,
    /// Position in the round-robin queue of its priority: lower goes first.
    queue_seq: u64,
    wants_gpu: bool,
    last_active_ns: u64,
    actuation: Option<Actuation>,
    warned: bool,
    duration_enforced: bool,
    ending: Option<Ending>,
}

type Rank = (bool, u8, u64, TaskId);

impl Task {
    fn is_live(&self) -> bool {
        self.state.is_live()
    }

    fn priority(&self) -> u8 {
        self.spec.priority
    }

    /// Running, or about to (a thaw is in flight).
    fn holds_slot(&self) -> bool {
        self.state == TaskState::Running
            || self
                .actuation
                .is_some_and(|a| a.direction == Direction::Thaw)
    }

    fn rank(&self) -> Rank {
        (
            !self.wants_gpu,
            self.priority(),
            self.queue_seq,
            self.spec.id,
        )
    }

    fn mem_on(&self, gpu: u32) -> u64 {
        self.mem_bytes.get(&gpu).copied().unwrap_or(0)
    }

    fn total_mem(&self) -> u128 {
        self.mem_bytes.values().map(|&b| u128::from(b)).sum()
    }

    fn elapsed_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.arrived_ns)
    }

    fn expected_remaining_ms(&self, now_ns: u64) -> Option<u64> {
        let elapsed_ms = self.elapsed_ns(now_ns) / NS_PER_MS;
        self.spec
            .expected_runtime_ms
            .map(|expected| expected.saturating_sub(elapsed_ms))
    }

    /// What placement expects the task still to need the GPU for.
    fn expected_work_ms(&self, now_ns: u64) -> u64 {
        self.expected_remaining_ms(now_ns).unwrap_or_else(|| {
            quantum_ms(self.priority()).saturating_sub(self.quantum_used_ns / NS_PER_MS)
        })
    }

    fn view(&self) -> TaskView {
        TaskView {
            spec: self.spec.clone(),
            state: self.state,
            gpu: Some(self.gpu),
            mem_bytes: self.mem_bytes.clone(),
            on_gpu_ns: self.on_gpu_ns,
            on_gpu_ms: self.on_gpu_ns / NS_PER_MS,
            wants_gpu: self.wants_gpu,
            class: class_of(self.priority()),
            quantum_ms: quantum_ms(self.priority()),
            in_flight: self.actuation.map(|a| match (a.direction, a.escalated) {
                (Direction::Freeze, false) => ActionKind::Freeze,
                (Direction::Freeze, true) => ActionKind::Stop,
                (Direction::Thaw, _) => ActionKind::Thaw,
            }),
            ending_reason: self.ending.map(|e| e.reason.to_string()),
            arrived_ns: self.arrived_ns,
            started_ns: self.started_ns,
            finished_ns: self.finished_ns,
            exit_code: self.exit_code,
        }
    }
}

/// Allocation outcomes on one GPU during one second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AllocBucket {
    second: u64,
    successes: u64,
    failures: u64,
}

/// The scheduler core. See the module doc.
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: SchedConfig,
    capacity_bytes: BTreeMap<u32, u64>,
    /// The largest `ts_ns` seen.
    now_ns: u64,
    next_event_id: u64,
    next_queue_seq: u64,
    /// Every task not yet archived.
    tasks: BTreeMap<TaskId, Task>,
    archived: BTreeMap<TaskId, Task>,
    /// Per configured GPU, the last `ALLOC_SUCCESS_WINDOW_S` seconds.
    alloc_history: BTreeMap<u32, VecDeque<AllocBucket>>,
}

impl Scheduler {
    pub fn new(config: SchedConfig) -> Self {
        let capacity_bytes = config
            .gpus
            .iter()
            .map(|g| (g.index, g.capacity_bytes))
            .collect();
        Scheduler {
            config,
            capacity_bytes,
            now_ns: 0,
            next_event_id: 1,
            next_queue_seq: 0,
            tasks: BTreeMap::new(),
            archived: BTreeMap::new(),
            alloc_history: BTreeMap::new(),
        }
    }

    #[cfg(test)]
    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    /// The core's clock: the largest `ts_ns` seen.
    #[cfg(test)]
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Handles one input: the only way the scheduler's state changes.
    pub fn step(&mut self, input: &Input) -> Output {
        let mut out = Output::default();
        self.advance_clock(input.ts_ns());
        match input {
            Input::Arrive { spec, .. } => self.on_arrive(spec, &mut out),
            Input::Active { id, .. } => {
                let now = self.now_ns;
                if let Some(task) = self.live_task_mut(*id) {
                    task.wants_gpu = true;
                    task.last_active_ns = now;
                }
            }
            Input::Idle { id, .. } => {
                if let Some(task) = self.live_task_mut(*id) {
                    task.wants_gpu = false;
                }
            }
            Input::MemAlloc { id, gpu, bytes, .. } => {
                self.on_mem_alloc(*id, *gpu, *bytes, &mut out)
            }
            Input::MemFree { id, gpu, bytes, .. } => {
                if let Some(task) = self.live_task_mut(*id) {
                    let held = task.mem_bytes.entry(*gpu).or_insert(0);
                    *held = held.saturating_sub(*bytes);
                    if *held == 0 {
                        task.mem_bytes.remove(gpu);
                    }
                }
            }
            Input::AllocFailed { id, gpu, bytes, .. } => {
                self.on_alloc_failed(*id, *gpu, *bytes, &mut out)
            }
            Input::Exit { id, exit_code, .. } => self.on_exit(*id, *exit_code, &mut out),
            Input::Tick { .. } => self.archive_finished(&mut out),
            Input::Confirmed { id, action, .. } => self.on_confirmed(*id, *action, &mut out),
            Input::TimedOut { id, action, .. } => self.on_timed_out(*id, *action, &mut out),
        }
        self.apply_time_rules(&mut out);
        self.reconcile(&mut out);
        out
    }

    pub fn task(&self, id: TaskId) -> Option<TaskView> {
        self.tasks
            .get(&id)
            .or_else(|| self.archived.get(&id))
            .map(Task::view)
    }

    /// Every task, archived ones included, sorted by id.
    pub fn tasks(&self) -> Vec<TaskView> {
        let mut views: Vec<TaskView> = self
            .tasks
            .values()
            .chain(self.archived.values())
            .map(Task::view)
            .collect();
        views.sort_by_key(|v| v.spec.id);
        views
    }

    /// The placement weight of each configured GPU at `ts_ns` (normally the latest
    /// input's), sorted by index: higher is better. See "Placement" in the module doc.
    pub fn placement_weights(&self, ts_ns: u64) -> Vec<(u32, f64)> {
        let slots = self.config.slots() as f64;
        self.capacity_bytes
            .iter()
            .map(|(&gpu, &capacity)| {
                let live = self.tasks.values().filter(|t| t.is_live());
                let used: u128 = live.clone().map(|t| u128::from(t.mem_on(gpu))).sum();
                let free_fraction = if capacity == 0 {
                    0.0
                } else {
                    1.0 - (used as f64 / capacity as f64).min(1.0)
                };
                let queue_ms: u128 = live
                    .filter(|t| t.gpu == gpu && t.wants_gpu)
                    .map(|t| u128::from(t.expected_work_ms(ts_ns)))
                    .sum();
                let queue_s = queue_ms as f64 / 1000.0 / slots;
                let weight = PLACEMENT_FREE_MEMORY_WEIGHT * free_fraction
                    + PLACEMENT_QUEUE_WEIGHT / (1.0 + queue_s)
                    + PLACEMENT_ALLOC_SUCCESS_WEIGHT * self.alloc_success_rate(gpu, ts_ns);
                (gpu, weight)
            })
            .collect()
    }

    /// Successful allocations over all attempts on `gpu` in the 300 s up to `ts_ns`;
    /// 1.0 with no attempts.
    pub fn alloc_success_rate(&self, gpu: u32, ts_ns: u64) -> f64 {
        let second = ts_ns / NS_PER_S;
        let (successes, failures) = self
            .alloc_history
            .get(&gpu)
            .into_iter()
            .flatten()
            .filter(|b| b.second <= second && b.second + ALLOC_SUCCESS_WINDOW_S > second)
            .fold((0u64, 0u64), |(s, f), b| {
                (s.saturating_add(b.successes), f.saturating_add(b.failures))
            });
        let attempts = successes.saturating_add(failures);
        if attempts == 0 {
            1.0
        } else {
            successes as f64 / attempts as f64
        }
    }

    fn live_task_mut(&mut self, id: TaskId) -> Option<&mut Task> {
        self.tasks.get_mut(&id).filter(|t| t.is_live())
    }

    /// Moves the clock to `ts_ns` (never back) and charges running tasks for the time.
    fn advance_clock(&mut self, ts_ns: u64) {
        if ts_ns <= self.now_ns {
            return;
        }
        let elapsed_ns = ts_ns - self.now_ns;
        for task in self.tasks.values_mut() {
            if task.state == TaskState::Running {
                task.on_gpu_ns = task.on_gpu_ns.saturating_add(elapsed_ns);
                task.quantum_used_ns = task.quantum_used_ns.saturating_add(elapsed_ns);
            }
        }
        self.now_ns = ts_ns;
    }

    fn on_arrive(&mut self, spec: &TaskSpec, out: &mut Output) {
        if self.tasks.contains_key(&spec.id) || self.archived.contains_key(&spec.id) {
            return;
        }
        let mut spec = spec.clone();
        spec.priority = spec.priority.min(LOWEST_PRIORITY);
        let gpu = spec.gpu.unwrap_or_else(|| self.choose_gpu());
        let id = spec.id;
        let task = Task {
            spec,
            state: TaskState::Pending,
            gpu,
            mem_bytes: BTreeMap::new(),
            arrived_ns: self.now_ns,
            started_ns: None,
            finished_ns: None,
            exit_code: None,
            on_gpu_ns: 0,
            quantum_used_ns: 0,
            queue_seq: self.next_queue_seq,
            wants_gpu: true,
            last_active_ns: self.now_ns,
            actuation: None,
            warned: false,
            duration_enforced: false,
            ending: None,
        };
        self.next_queue_seq += 1;
        self.tasks.insert(id, task);
        out.actions.push(Action::Place { id, gpu });
    }

    /// The configured GPU with the highest placement weight; ties: lowest index.
    fn choose_gpu(&self) -> u32 {
        let mut best: Option<(u32, f64)> = None;
        for (gpu, weight) in self.placement_weights(self.now_ns) {
            if best.is_none_or(|(_, best_weight)| weight > best_weight) {
                best = Some((gpu, weight));
            }
        }
        best.map_or(0, |(gpu, _)| gpu)
    }

    fn record_alloc(&mut self, gpu: u32, success: bool) {
        if !self.capacity_bytes.contains_key(&gpu) {
            return;
        }
        let second = self.now_ns / NS_PER_S;
        let history = self.alloc_history.entry(gpu).or_default();
        match history.back_mut() {
            Some(bucket) if bucket.second == second => {}
            _ => history.push_back(AllocBucket {
                second,
                successes: 0,
                failures: 0,
            }),
        }
        if let Some(bucket) = history.back_mut() {
            if success {
                bucket.successes = bucket.successes.saturating_add(1);
            } else {
                bucket.failures = bucket.failures.saturating_add(1);
            }
        }
        while history
            .front()
            .is_some_and(|b| b.second + ALLOC_SUCCESS_WINDOW_S <= second)
        {
            history.pop_front();
        }
    }

    fn on_mem_alloc(&mut self, id: TaskId, gpu: u32, bytes: u64, out: &mut Output) {
        let now = self.now_ns;
        let kill_grace_ms = self.config.kill_grace_ms;
        let Some(task) = self.live_task_mut(id) else {
            return;
        };
        let held = task.mem_bytes.entry(gpu).or_insert(0);
        *held = held.saturating_add(bytes);
        let over_quota = task
            .spec
            .mem_quota_bytes
            .is_some_and(|quota| task.total_mem() > u128::from(quota));
        if over_quota {
            begin_ending(id, task, "over_quota", false, now, kill_grace_ms, out);
        }
        self.record_alloc(gpu, true);
    }

    fn on_alloc_failed(&mut self, id: TaskId, gpu: u32, bytes: u64, out: &mut Output) {
        let now = self.now_ns;
        let Some(requester) = self.tasks.get(&id).filter(|t| t.is_live()) else {
            return;
        };
        let requester_priority = requester.priority();
        let requester_ending = requester.ending.is_some();
        self.record_alloc(gpu, false);
        let Some(&capacity) = self.capacity_bytes.get(&gpu) else {
            return;
        };
        if requester_ending {
            return;
        }
        let live = || self.tasks.values().filter(|t| t.is_live());
        let used: u128 = live().map(|t| u128::from(t.mem_on(gpu))).sum();
        let releasing: u128 = live()
            .filter(|t| t.ending.is_some())
            .map(|t| u128::from(t.mem_on(gpu)))
            .sum();
        let free = u128::from(capacity).saturating_sub(used);
        let need = u128::from(bytes)
            .saturating_sub(free)
            .saturating_sub(releasing);
        let need = u64::try_from(need).unwrap_or(u64::MAX);
        if need == 0 {
            return;
        }
        let candidates: Vec<VictimCandidate> = self
            .tasks
            .iter()
            .filter(|&(&cid, t)| {
                cid != id
                    && t.is_live()
                    && t.ending.is_none()
                    && t.priority() > requester_priority
                    && t.mem_on(gpu) > 0
                    && t.expected_remaining_ms(now)
                        .is_none_or(|ms| ms > EVICTION_MIN_REMAINING_MS)
            })
            .map(|(&cid, t)| VictimCandidate {
                id: cid,
                priority: t.priority(),
                bytes: t.mem_on(gpu),
            })
            .collect();
        let kill_grace_ms = self.config.kill_grace_ms;
        for victim in choose_victims(&candidates, need) {
            if let Some(task) = self.tasks.get_mut(&victim) {
                begin_ending(
                    victim,
                    task,
                    "evicted_for_memory",
                    false,
                    now,
                    kill_grace_ms,
                    out,
                );
            }
        }
    }

    fn on_exit(&mut self, id: TaskId, exit_code: i32, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let (to, reason) = match task.ending {
            Some(ending) => (TaskState::Failed, ending.reason),
            None if exit_code == 0 => (TaskState::Completed, "exited"),
            None => (TaskState::Failed, "exited_with_error"),
        };
        task.exit_code = Some(exit_code);
        task.finished_ns = Some(now);
        task.actuation = None;
        task.wants_gpu = false;
        // The driver frees a dead process's memory.
        task.mem_bytes.clear();
        record_transition(&mut self.next_event_id, now, task, to, reason, out);
    }

    /// Tick: tasks that finished before this tick become Archived.
    fn archive_finished(&mut self, out: &mut Output) {
        let now = self.now_ns;
        let finished: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.state, TaskState::Completed | TaskState::Failed))
            .map(|(&id, _)| id)
            .collect();
        for id in finished {
            if let Some(mut task) = self.tasks.remove(&id) {
                record_transition(
                    &mut self.next_event_id,
                    now,
                    &mut task,
                    TaskState::Archived,
                    "archived",
                    out,
                );
                self.archived.insert(id, task);
            }
        }
    }

    fn on_confirmed(&mut self, id: TaskId, kind: ActionKind, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let Some(actuation) = task.actuation else {
            return;
        };
        match (actuation.direction, kind) {
            (Direction::Freeze, ActionKind::Freeze | ActionKind::Stop) => {
                task.actuation = None;
                record_transition(
                    &mut self.next_event_id,
                    now,
                    task,
                    TaskState::Preempted,
                    actuation.reason,
                    out,
                );
            }
            (Direction::Thaw, ActionKind::Thaw) => {
                task.actuation = None;
                resume(&mut self.next_event_id, now, task, actuation.reason, out);
            }
            _ => {}
        }
    }

    fn on_timed_out(&mut self, id: TaskId, kind: ActionKind, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let Some(actuation) = task.actuation.as_mut() else {
            return;
        };
        match (actuation.direction, kind, actuation.escalated) {
            (Direction::Freeze, ActionKind::Freeze, false) => {
                actuation.escalated = true;
                out.actions.push(Action::Stop { id });
            }
            (Direction::Thaw, ActionKind::Thaw, false) => {
                actuation.escalated = true;
                out.actions.push(Action::Thaw { id });
            }
            (Direction::Thaw, ActionKind::Thaw, true) => {
                task.actuation = None;
                resume(&mut self.next_event_id, now, task, "thaw_unconfirmed", out);
            }
            _ => {}
        }
    }

    /// Idle timeout, session duration limits and kill deadlines, at the current clock.
    fn apply_time_rules(&mut self, out: &mut Output) {
        let now = self.now_ns;
        let config = &self.config;
        let idle_timeout_ns = ms_to_ns(config.idle_timeout_ms);
        for (&id, task) in self.tasks.iter_mut() {
            if !task.is_live() {
                continue;
            }
            if task.state == TaskState::Running
                && task.wants_gpu
                && now.saturating_sub(task.last_active_ns) >= idle_timeout_ns
            {
                task.wants_gpu = false;
            }

            let limit_ms = task
                .spec
                .max_duration_ms
                .unwrap_or(config.default_max_duration_ms);
            let grace_ms = task.spec.grace_ms.unwrap_or(config.default_grace_ms);
            let elapsed_ns = task.elapsed_ns(now);
            let elapsed_ms = elapsed_ns / NS_PER_MS;
            if !task.duration_enforced && elapsed_ns >= ms_to_ns(limit_ms) {
                task.duration_enforced = true;
                task.warned = true;
                out.actions.push(Action::Enforce {
                    id,
                    record: EnforcementRecord::duration_exceeded(limit_ms, elapsed_ms),
                });
                let hard = task.spec.hard_kill.unwrap_or(config.default_hard_kill);
                begin_ending(
                    id,
                    task,
                    "duration_limit",
                    hard,
                    now,
                    config.kill_grace_ms,
                    out,
                );
            } else if !task.warned && elapsed_ns >= ms_to_ns(limit_ms.saturating_sub(grace_ms)) {
                task.warned = true;
                // elapsed_ns < limit here, so at least 1 ms remains.
                out.actions.push(Action::Warn {
                    id,
                    remaining_ms: limit_ms.saturating_sub(elapsed_ms),
                });
            }

            if let Some(ending) = task.ending.as_mut()
                && !ending.kill_sent
                && ending.kill_at_ns.is_some_and(|at| now >= at)
            {
                ending.kill_sent = true;
                out.actions.push(Action::Kill { id });
            }
        }
    }

    /// Brings every GPU's slot holders in line with the ranking (module doc).
    fn reconcile(&mut self, out: &mut Output) {
        let gpus: BTreeSet<u32> = self
            .tasks
            .values()
            .filter(|t| t.is_live())
            .map(|t| t.gpu)
            .collect();
        for gpu in gpus {
            self.reconcile_gpu(gpu, out);
        }
    }

    fn reconcile_gpu(&mut self, gpu: u32, out: &mut Output) {
        let now = self.now_ns;
        let slots = self.config.slots();
        let rotated = self.rotate_expired_quanta(gpu);

        let mut ranked: Vec<(Rank, TaskId)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.is_live() && t.gpu == gpu)
            .map(|(&id, t)| (t.rank(), id))
            .collect();
        ranked.sort_unstable();
        let ranked: Vec<TaskId> = ranked.into_iter().map(|(_, id)| id).collect();
        let (should_hold, should_wait) = ranked.split_at(slots.min(ranked.len()));
        let best_holder_priority = should_hold
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .map(Task::priority)
            .min();

        // Vacate: freeze whoever runs (or arrived running) but should wait.
        for &id in should_wait {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            if task.actuation.is_some() {
                continue;
            }
            let reason = match task.state {
                TaskState::Pending => "queued",
                TaskState::Running if rotated.contains(&id) => "quantum_expired",
                TaskState::Running if !task.wants_gpu => "idle",
                TaskState::Running if best_holder_priority.is_some_and(|p| p < task.priority()) => {
                    "preempted_by_higher_priority"
                }
                TaskState::Running => "round_robin",
                _ => continue,
            };
            task.actuation = Some(Actuation {
                direction: Direction::Freeze,
                reason,
                escalated: false,
            });
            out.actions.push(Action::Freeze { id });
        }

        // Fill. A task that arrived running and should hold a slot just keeps
        // running (it counts first, since it runs either way); frozen ones are thawed
        // only into a free slot, so freezes in flight are waited for.
        for &id in should_hold {
            if let Some(task) = self.tasks.get_mut(&id)
                && task.state == TaskState::Pending
                && task.actuation.is_none()
            {
                resume(&mut self.next_event_id, now, task, "placed", out);
            }
        }
        let mut holders = ranked
            .iter()
            .filter(|id| self.tasks.get(id).is_some_and(Task::holds_slot))
            .count();
        for &id in should_hold {
            if holders >= slots {
                break;
            }
            if let Some(task) = self.tasks.get_mut(&id)
                && task.state == TaskState::Preempted
                && task.actuation.is_none()
            {
                task.actuation = Some(Actuation {
                    direction: Direction::Thaw,
                    reason: "resumed",
                    escalated: false,
                });
                out.actions.push(Action::Thaw { id });
                holders += 1;
            }
        }
    }

    /// Round robin: a running task whose quantum is used up goes to the back of its
    /// priority's queue if an active task of that priority waits on the GPU;
    /// otherwise it starts a fresh quantum. Returns the tasks sent to the back.
    fn rotate_expired_quanta(&mut self, gpu: u32) -> BTreeSet<TaskId> {
        let on_gpu = |t: &&Task| t.is_live() && t.gpu == gpu;
        let waiting_priorities: BTreeSet<u8> = self
            .tasks
            .values()
            .filter(on_gpu)
            .filter(|t| t.wants_gpu && !t.holds_slot())
            .map(Task::priority)
            .collect();
        let mut expired: Vec<(Rank, TaskId)> = self
            .tasks
            .values()
            .filter(on_gpu)
            .filter(|t| {
                t.state == TaskState::Running
                    && t.actuation.is_none()
                    && t.quantum_used_ns >= ms_to_ns(quantum_ms(t.priority()))
            })
            .map(|t| (t.rank(), t.spec.id))
            .collect();
        expired.sort_unstable();
        let mut rotated = BTreeSet::new();
        for (_, id) in expired {
            let seq = self.next_queue_seq;
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            task.quantum_used_ns = 0;
            if task.wants_gpu && waiting_priorities.contains(&task.priority()) {
                task.queue_seq = seq;
                self.next_queue_seq += 1;
                rotated.insert(id);
            }
        }
        rotated
    }
}

/// Pending or Preempted → Running.
fn resume(next_event_id: &mut u64, now_ns: u64, task: &mut Task, reason: &str, out: &mut Output) {
    record_transition(next_event_id, now_ns, task, TaskState::Running, reason, out);
    task.started_ns.get_or_insert(now_ns);
    // The idle timeout counts running time only: it starts over.
    task.last_active_ns = now_ns;
}

/// Starts (or hurries) ending a task: `Kill` at once when `hard`, else `Terminate`
/// and a `Kill` deadline `kill_grace_ms` later. Never sends either twice.
fn begin_ending(
    id: TaskId,
    task: &mut Task,
    reason: &'static str,
    hard: bool,
    now_ns: u64,
    kill_grace_ms: u64,
    out: &mut Output,
) {
    let ending = task.ending.get_or_insert(Ending {
        reason,
        terminate_sent: false,
        kill_sent: false,
        kill_at_ns: None,
    });
    if hard {
        if !ending.kill_sent {
            ending.kill_sent = true;
            out.actions.push(Action::Kill { id });
        }
    } else if !ending.terminate_sent && !ending.kill_sent {
        ending.terminate_sent = true;
        ending.kill_at_ns = Some(now_ns.saturating_add(ms_to_ns(kill_grace_ms)));
        out.actions.push(Action::Terminate { id });
    }
}

fn record_transition(
    next_event_id: &mut u64,
    now_ns: u64,
    task: &mut Task,
    to: TaskState,
    reason: &str,
    out: &mut Output,
) {
    let from = task.state;
    debug_assert!(is_legal(from, to), "illegal transition {from:?} -> {to:?}");
    if !is_legal(from, to) {
        return;
    }
    task.state = to;
    let terminal = matches!(
        to,
        TaskState::Completed | TaskState::Failed | TaskState::Archived
    );
    out.transitions.push(Transition {
        event_id: *next_event_id,
        task: task.spec.id,
        name: task.spec.name.clone(),
        pid: task.spec.pid,
        gpu: Some(task.gpu),
        priority: task.priority(),
        from,
        to,
        reason: reason.to_string(),
        timestamp_ns: now_ns,
        exit_code: if terminal { task.exit_code } else { None },
    });
    *next_event_id = next_event_id.saturating_add(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::{Archived, Completed, Failed, Pending, Preempted, Running};
    use proptest::prelude::*;

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

    // ---- tables -------------------------------------------------------------------

    #[test]
    fn quantum_is_linear_inside_each_class() {
        let expected = [
            5, 7, 10, 20, 30, 40, 50, 100, 112, 125, 137, 150, 162, 175, 187, 200,
        ];
        for (priority, &quantum) in expected.iter().enumerate() {
            assert_eq!(quantum_ms(priority as u8), quantum, "priority {priority}");
        }
        assert_eq!(quantum_ms(16), 200);
        assert_eq!(quantum_ms(u8::MAX), 200);
    }

    #[test]
    fn classes_split_after_2_and_6() {
        let classes: Vec<Class> = (0..=15).map(class_of).collect();
        assert_eq!(&classes[..3], &[Class::RealTime; 3]);
        assert_eq!(&classes[3..7], &[Class::Interactive; 4]);
        assert_eq!(&classes[7..], &[Class::Background; 9]);
    }

    #[test]
    fn is_legal_allows_exactly_the_design_transitions() {
        let all = [Pending, Running, Preempted, Completed, Failed, Archived];
        let legal: BTreeSet<(TaskState, TaskState)> = [
            (Pending, Running),
            (Pending, Preempted),
            (Pending, Completed),
            (Pending, Failed),
            (Running, Preempted),
            (Preempted, Running),
            (Running, Completed),
            (Running, Failed),
            (Preempted, Completed),
            (Preempted, Failed),
            (Completed, Archived),
            (Failed, Archived),
        ]
        .into();
        for from in all {
            for to in all {
                assert_eq!(
                    is_legal(from, to),
                    legal.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn state_transition_is_uppercase_with_an_arrow() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 9));
        let out = h.arrive(spec(2, 1));
        let out = h.settle(out);
        assert_eq!(
            out.transitions[0].state_transition(),
            "PENDING\u{2192}RUNNING"
        );
        assert_eq!(out.transitions[1].state_transition(), "RUNNING→PREEMPTED");
    }

    #[test]
    fn enforcement_record_serializes_exactly() {
        let json =
            serde_json::to_string(&EnforcementRecord::duration_exceeded(3_600_000, 3_600_007))
                .unwrap();
        assert_eq!(
            json,
            r#"{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":3600000,"actual_ms":3600007,"reason":"server_enforced"}}"#
        );
    }

    // ---- slots, preemption, round robin ---------------------------------------------

    #[test]
    fn first_task_is_placed_and_runs_at_once() {
        let mut h = Harness::new(config(1, 1));
        let out = h.arrive(spec(1, 5));
        assert_eq!(out.actions, vec![Action::Place { id: 1, gpu: 0 }]);
        assert_eq!(moves(&out), vec![(1, Pending, Running, "placed")]);
        assert_eq!(out.transitions[0].event_id, 1);
        assert_eq!(h.view(1).started_ns, Some(0));
    }

    #[test]
    fn arrival_without_a_free_slot_is_frozen_and_queued_on_confirmation() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 5));
        let out = h.arrive(spec(2, 5));
        assert_eq!(
            out.actions,
            vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 2 }]
        );
        assert!(out.transitions.is_empty());
        assert_eq!(h.state(2), Pending);
        assert_eq!(h.view(2).in_flight, Some(ActionKind::Freeze));
        let out = h.confirm(2, ActionKind::Freeze);
        assert_eq!(moves(&out), vec![(2, Pending, Preempted, "queued")]);
        assert!(out.actions.is_empty());
        assert_eq!(h.view(2).in_flight, None);
    }

    #[test]
    fn higher_priority_arrival_preempts_at_once_and_the_victim_stops_on_confirmation() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 9));
        h.at_ms(5);
        let out = h.arrive(spec(2, 1));
        assert_eq!(
            out.actions,
            vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 1 }]
        );
        assert_eq!(moves(&out), vec![(2, Pending, Running, "placed")]);
        // Still running until the freeze is seen to land.
        assert_eq!(h.state(1), Running);
        h.at_ms(7);
        let out = h.confirm(1, ActionKind::Freeze);
        assert_eq!(
            moves(&out),
            vec![(1, Running, Preempted, "preempted_by_higher_priority")]
        );
        assert_eq!(out.transitions[0].timestamp_ns, 7 * MS);
        assert_eq!(h.view(1).on_gpu_ns, 7 * MS);
    }

    #[test]
    fn frozen_higher_priority_task_that_becomes_active_gets_the_slot_after_the_freeze_lands() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 1));
        let out = h.arrive(spec(2, 8));
        h.settle(out);
        h.at_ms(10);
        // An idle task does not hold its slot against an active one.
        let out = h.idle(1);
        assert_eq!(out.actions, vec![Action::Freeze { id: 1 }]);
        let out = h.confirm(1, ActionKind::Freeze);
        assert_eq!(moves(&out), vec![(1, Running, Preempted, "idle")]);
        assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
        let out = h.confirm(2, ActionKind::Thaw);
        assert_eq!(moves(&out), vec![(2, Preempted, Running, "resumed")]);

        h.at_ms(20);
        let out = h.active(1);
        assert_eq!(
            out.actions,
            vec![Action::Freeze { id: 2 }],
            "no thaw before the slot is free"
        );
        let out = h.confirm(2, ActionKind::Freeze);
        assert_eq!(
            moves(&out),
            vec![(2, Running, Preempted, "preempted_by_higher_priority")]
        );
        assert_eq!(out.actions, vec![Action::Thaw { id: 1 }]);
        let out = h.confirm(1, ActionKind::Thaw);
        assert_eq!(moves(&out), vec![(1, Preempted, Running, "resumed")]);
    }

    #[test]
    fn equal_priorities_rotate_by_quantum_to_the_back_of_the_queue() {
        let mut h = Harness::new(config(1, 1));
        for id in 1..=3 {
            let out = h.arrive(spec(id, 7)); // quantum 100 ms
            h.settle(out);
        }
        let mut starts = Vec::new();
        let mut stops = Vec::new();
        for ms in (10..=400).step_by(10) {
            h.at_ms(ms);
            let running: Vec<TaskId> = h
                .sched
                .tasks()
                .iter()
                .filter(|v| v.state == Running)
                .map(|v| v.spec.id)
                .collect();
            let mut out = Output::default();
            for id in running {
                let active = h.active(id);
                let active = h.settle(active);
                out.transitions.extend(active.transitions);
            }
            let tick = h.tick();
            out.transitions.extend(h.settle(tick).transitions);
            for (id, from, to, reason) in moves(&out) {
                match (from, to) {
                    (_, Running) => starts.push((ms, id)),
                    (Running, Preempted) => stops.push((ms, id, reason.to_string())),
                    _ => {}
                }
            }
        }
        assert_eq!(starts, vec![(100, 2), (200, 3), (300, 1), (400, 2)]);
        let expired = |ms, id| (ms, id, "quantum_expired".to_string());
        assert_eq!(
            stops,
            vec![
                expired(100, 1),
                expired(200, 2),
                expired(300, 3),
                expired(400, 1)
            ]
        );
    }

    #[test]
    fn a_task_alone_keeps_running_past_its_quantum() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 0)); // quantum 5 ms
        for ms in 1..=100 {
            h.at_ms(ms);
            assert_eq!(h.active(1), Output::default());
            assert_eq!(h.tick(), Output::default());
        }
        assert_eq!(h.state(1), Running);
        assert_eq!(h.view(1).on_gpu_ms, 100);
    }

    #[test]
    fn lower_priority_task_resumes_when_the_higher_one_exits() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 8));
        let out = h.arrive(spec(2, 2));
        h.settle(out);
        h.at_ms(30);
        let out = h.exit(2, 0);
        assert_eq!(moves(&out), vec![(2, Running, Completed, "exited")]);
        assert_eq!(out.actions, vec![Action::Thaw { id: 1 }]);
        let out = h.confirm(1, ActionKind::Thaw);
        assert_eq!(moves(&out), vec![(1, Preempted, Running, "resumed")]);
    }

    #[test]
    fn idle_tasks_keep_their_slots_when_nobody_waits() {
        let mut h = Harness::new(config(1, 2));
        h.arrive(spec(1, 3));
        h.arrive(spec(2, 9));
        assert_eq!(h.idle(1), Output::default());
        h.at_ms(10_000);
        assert_eq!(h.tick(), Output::default());
        assert_eq!((h.state(1), h.state(2)), (Running, Running));
        assert!(!h.view(2).wants_gpu, "idle after idle_timeout_ms");
    }

    #[test]
    fn idleness_is_inferred_after_the_idle_timeout_and_frees_the_slot() {
        let mut h = Harness::new(config(1, 1)); // idle_timeout_ms 500
        h.arrive(spec(1, 2));
        let out = h.arrive(spec(2, 9));
        h.settle(out);
        h.at_ms(499);
        assert_eq!(h.tick(), Output::default());
        h.at_ms(500);
        let out = h.tick();
        assert_eq!(out.actions, vec![Action::Freeze { id: 1 }]);
        let out = h.settle(out);
        assert_eq!(
            moves(&out),
            vec![
                (1, Running, Preempted, "idle"),
                (2, Preempted, Running, "resumed")
            ]
        );
        // Task 2 waited frozen for 500 ms but its idle timeout starts when it resumes.
        assert!(h.view(2).wants_gpu);
        h.at_ms(999);
        assert_eq!(h.tick(), Output::default());
        h.at_ms(1000);
        // Now both are idle: the higher priority gets the slot back.
        let out = h.tick();
        assert_eq!(out.actions, vec![Action::Freeze { id: 2 }]);
    }

    #[test]
    fn active_input_restarts_the_idle_timeout() {
        let mut h = Harness::new(config(1, 1)); // idle_timeout_ms 500
        h.arrive(spec(1, 2));
        let out = h.arrive(spec(2, 9));
        h.settle(out);
        h.at_ms(400);
        h.active(1);
        h.at_ms(899);
        assert_eq!(h.tick(), Output::default(), "active 499 ms ago");
        assert!(h.view(1).wants_gpu);
        h.at_ms(900);
        assert_eq!(h.tick().actions, vec![Action::Freeze { id: 1 }]);
        assert!(!h.view(1).wants_gpu);
    }

    #[test]
    fn a_freeze_in_flight_is_never_contradicted_by_a_thaw() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 8));
        let out = h.arrive(spec(2, 2));
        assert_eq!(out.actions[1], Action::Freeze { id: 1 });
        // The preemptor leaves before the freeze lands: task 1 should run again, but
        // not while its freeze is in flight.
        let out = h.exit(2, 0);
        assert!(out.actions.is_empty(), "{:?}", out.actions);
        assert_eq!(h.state(1), Running);
        let out = h.confirm(1, ActionKind::Freeze);
        assert_eq!(out.actions, vec![Action::Thaw { id: 1 }]);
        assert_eq!(h.state(1), Preempted);
        let out = h.confirm(1, ActionKind::Thaw);
        assert_eq!(moves(&out), vec![(1, Preempted, Running, "resumed")]);
    }

    #[test]
    fn freeze_timeout_escalates_to_stop_once() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 8));
        h.arrive(spec(2, 2));
        assert_eq!(
            h.timed_out(1, ActionKind::Freeze).actions,
            vec![Action::Stop { id: 1 }]
        );
        assert_eq!(h.view(1).in_flight, Some(ActionKind::Stop));
        assert_eq!(h.timed_out(1, ActionKind::Freeze), Output::default());
        assert_eq!(h.timed_out(1, ActionKind::Stop), Output::default());
        assert_eq!(h.state(1), Running);
        let out = h.confirm(1, ActionKind::Stop);
        assert_eq!(
            moves(&out),
            vec![(1, Running, Preempted, "preempted_by_higher_priority")]
        );
        // A late confirmation of the original freeze is stale and ignored.
        assert_eq!(h.confirm(1, ActionKind::Freeze), Output::default());
    }

    #[test]
    fn thaw_timeout_retries_once_then_assumes_the_task_runs() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 8));
        let out = h.arrive(spec(2, 2));
        h.settle(out);
        assert_eq!(h.exit(2, 0).actions, vec![Action::Thaw { id: 1 }]);
        assert_eq!(
            h.timed_out(1, ActionKind::Thaw).actions,
            vec![Action::Thaw { id: 1 }]
        );
        assert_eq!(h.state(1), Preempted);
        let out = h.timed_out(1, ActionKind::Thaw);
        assert!(out.actions.is_empty());
        assert_eq!(
            moves(&out),
            vec![(1, Preempted, Running, "thaw_unconfirmed")]
        );
        assert_eq!(h.view(1).in_flight, None);
    }

    // ---- memory -------------------------------------------------------------------

    /// GPU 0 of 16 GiB holding 15 GiB: 1 GiB free. Task 1 (priority 1) holds 1 GiB;
    /// 2 (8) 6 GiB, 3 (9) 3 GiB, 4 (10) 3 GiB, 5 (3) 2 GiB.
    fn crowded_gpu() -> Harness {
        let mut h = Harness::new(config(1, 8));
        for (id, priority, gib) in [(1, 1, 1), (2, 8, 6), (3, 9, 3), (4, 10, 3), (5, 3, 2)] {
            h.arrive(spec(id, priority));
            h.alloc(id, 0, gib * GIB);
        }
        h
    }

    #[test]
    fn memory_pressure_evicts_the_smallest_covering_set_then_kills_after_grace() {
        let mut h = crowded_gpu();
        h.at_ms(1);
        // Needs 8 GiB, 1 free: 7 more. No single task covers 7; of the pairs that
        // do (2+3, 2+4: 9 GiB; 2+5: 8 GiB), 2+5 frees the fewest bytes.
        let out = h.alloc_failed(1, 0, 8 * GIB);
        assert_eq!(
            out.actions,
            vec![Action::Terminate { id: 2 }, Action::Terminate { id: 5 }]
        );
        h.at_ms(5_000);
        assert_eq!(h.tick(), Output::default());
        h.at_ms(5_001);
        assert_eq!(
            h.tick().actions,
            vec![Action::Kill { id: 2 }, Action::Kill { id: 5 }]
        );
        h.at_ms(5_002);
        let out = h.exit(2, 137);
        assert_eq!(
            moves(&out),
            vec![(2, Running, Failed, "evicted_for_memory")]
        );
        assert_eq!(out.transitions[0].exit_code, Some(137));
        assert!(h.view(2).mem_bytes.is_empty());
    }

    #[test]
    fn memory_on_its_way_back_from_victims_is_not_evicted_for_twice() {
        let mut h = crowded_gpu();
        assert_eq!(terminated(&h.alloc_failed(1, 0, 8 * GIB)), vec![2, 5]);
        assert_eq!(h.alloc_failed(1, 0, 8 * GIB), Output::default());
        // One GiB more than is on its way back: tasks 3 and 4 both hold 3 GiB, so
        // the lower priority (4, priority 10) goes.
        assert_eq!(terminated(&h.alloc_failed(1, 0, 10 * GIB)), vec![4]);
    }

    #[test]
    fn memory_pressure_with_enough_free_memory_evicts_nobody() {
        let mut h = crowded_gpu();
        assert_eq!(h.alloc_failed(1, 0, GIB), Output::default());
        assert_eq!(
            h.alloc_failed(1, 3, 100 * GIB),
            Output::default(),
            "unknown GPU"
        );
    }

    #[test]
    fn memory_pressure_spares_equal_or_higher_priority_and_nearly_finished_tasks() {
        let mut h = Harness::new(config(1, 8));
        let with_runtime = |id, priority, ms| TaskSpec {
            expected_runtime_ms: Some(ms),
            ..spec(id, priority)
        };
        for (task, gib) in [
            (spec(1, 5), 0),
            (spec(2, 5), 8),                 // equal priority
            (spec(3, 2), 4),                 // higher priority
            (with_runtime(4, 9, 4_000), 2),  // 2.5 s left at 1.5 s
            (with_runtime(5, 9, 10_000), 1), // 8.5 s left
        ] {
            let id = task.id;
            h.arrive(task);
            if gib > 0 {
                h.alloc(id, 0, gib * GIB);
            }
        }
        h.at_ms(1_500);
        // 1 GiB free; needs 2 more: only task 5 is a candidate and it holds 1.
        assert_eq!(h.alloc_failed(1, 0, 3 * GIB), Output::default());
        assert_eq!(terminated(&h.alloc_failed(1, 0, 2 * GIB)), vec![5]);
    }

    #[test]
    fn allocation_over_quota_terminates_then_kills() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(TaskSpec {
            mem_quota_bytes: Some(4 * GIB),
            ..spec(1, 5)
        });
        assert_eq!(h.alloc(1, 0, 3 * GIB), Output::default());
        assert_eq!(h.alloc(1, 1, GIB), Output::default(), "exactly at quota");
        assert_eq!(h.alloc(1, 0, 1).actions, vec![Action::Terminate { id: 1 }]);
        assert_eq!(h.alloc(1, 0, GIB), Output::default(), "never twice");
        h.at_ms(5_000);
        assert_eq!(h.tick().actions, vec![Action::Kill { id: 1 }]);
        let out = h.exit(1, 0);
        assert_eq!(moves(&out), vec![(1, Running, Failed, "over_quota")]);
    }

    // ---- duration limits ----------------------------------------------------------

    fn limited(id: TaskId, max_ms: u64, grace_ms: u64, hard_kill: Option<bool>) -> TaskSpec {
        TaskSpec {
            max_duration_ms: Some(max_ms),
            grace_ms: Some(grace_ms),
            hard_kill,
            ..spec(id, 5)
        }
    }

    /// Ticks every 10 ms up to `until_ms`; the non-empty action lists by time.
    fn tick_until(h: &mut Harness, until_ms: u64) -> Vec<(u64, Vec<Action>)> {
        let mut seen = Vec::new();
        let start = h.ts_ns / MS + 10;
        for ms in (start..=until_ms).step_by(10) {
            h.at_ms(ms);
            let out = h.tick();
            if !out.actions.is_empty() {
                seen.push((ms, out.actions));
            }
        }
        seen
    }

    #[test]
    fn duration_limit_warns_once_then_kills_with_the_4003_record() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(limited(1, 1_000, 300, None));
        assert_eq!(
            tick_until(&mut h, 1_500),
            vec![
                (
                    700,
                    vec![Action::Warn {
                        id: 1,
                        remaining_ms: 300
                    }]
                ),
                (
                    1_000,
                    vec![
                        Action::Enforce {
                            id: 1,
                            record: EnforcementRecord::duration_exceeded(1_000, 1_000),
                        },
                        Action::Kill { id: 1 },
                    ]
                ),
            ]
        );
        let out = h.exit(1, 137);
        assert_eq!(moves(&out), vec![(1, Running, Failed, "duration_limit")]);
    }

    #[test]
    fn duration_limit_without_hard_kill_terminates_then_kills_after_grace() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(limited(1, 1_000, 0, Some(false)));
        assert_eq!(
            tick_until(&mut h, 6_100),
            vec![
                (
                    1_000,
                    vec![
                        Action::Enforce {
                            id: 1,
                            record: EnforcementRecord::duration_exceeded(1_000, 1_000),
                        },
                        Action::Terminate { id: 1 },
                    ]
                ),
                (6_000, vec![Action::Kill { id: 1 }]),
            ]
        );
    }

    #[test]
    fn duration_limit_past_before_the_warning_was_seen_skips_the_warning() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(limited(1, 100, 50, None));
        h.at_ms(150);
        assert_eq!(
            h.tick().actions,
            vec![
                Action::Enforce {
                    id: 1,
                    record: EnforcementRecord::duration_exceeded(100, 150),
                },
                Action::Kill { id: 1 },
            ]
        );
    }

    #[test]
    fn duration_counts_wall_time_including_time_frozen() {
        let mut h = Harness::new(SchedConfig {
            idle_timeout_ms: 10_000,
            ..config(1, 1)
        });
        h.arrive(limited(1, 1_000, 0, None));
        let out = h.arrive(spec(2, 0));
        h.settle(out);
        assert_eq!(h.state(1), Preempted);
        let seen = tick_until(&mut h, 1_000);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, 1_000);
        assert_eq!(h.view(1).on_gpu_ns, 0);
    }

    // ---- placement ----------------------------------------------------------------

    fn unpinned(id: TaskId, priority: u8) -> TaskSpec {
        TaskSpec {
            gpu: None,
            ..spec(id, priority)
        }
    }

    #[test]
    fn placement_prefers_free_memory_short_queues_and_successful_allocations() {
        let mut h = Harness::new(SchedConfig {
            gpus: (0..3)
                .map(|index| GpuInfo {
                    index,
                    capacity_bytes: 10 * GIB,
                })
                .collect(),
            ..SchedConfig::default()
        });
        let out = h.arrive(TaskSpec {
            expected_runtime_ms: Some(60_000),
            ..unpinned(1, 5)
        });
        assert_eq!(
            out.actions,
            vec![Action::Place { id: 1, gpu: 0 }],
            "tie: lowest index"
        );
        h.alloc(1, 0, 8 * GIB);
        let out = h.arrive(unpinned(2, 5));
        assert_eq!(out.actions, vec![Action::Place { id: 2, gpu: 1 }]);
        h.alloc(2, 1, GIB);
        h.alloc_failed(2, 1, 100 * GIB);

        let weights = h.sched.placement_weights(h.ts_ns);
        // GPU 0: 20% free, 60 s of expected work queued, every allocation succeeded.
        let gpu0 = 0.4 * 0.2 + 0.35 / (1.0 + 60.0) + 0.25;
        // GPU 1: 90% free, one 40 ms quantum queued, half the allocations failed.
        let gpu1 = 0.4 * 0.9 + 0.35 / (1.0 + 0.040) + 0.25 * 0.5;
        let expected = [(0, gpu0), (1, gpu1), (2, 1.0)];
        assert_eq!(weights.len(), 3);
        for ((gpu, weight), (want_gpu, want)) in weights.iter().zip(expected) {
            assert_eq!(*gpu, want_gpu);
            assert!(
                (weight - want).abs() < 1e-9,
                "GPU {gpu}: {weight} != {want}"
            );
        }
        assert_eq!(
            h.arrive(unpinned(3, 5)).actions[0],
            Action::Place { id: 3, gpu: 2 }
        );
        let out = h.arrive(TaskSpec {
            gpu: Some(7),
            ..spec(4, 5)
        });
        assert_eq!(
            out.actions,
            vec![Action::Place { id: 4, gpu: 7 }],
            "pinned wins"
        );
        assert_eq!(moves(&out), vec![(4, Pending, Running, "placed")]);
    }

    #[test]
    fn with_no_gpus_configured_tasks_go_to_gpu_0() {
        let mut h = Harness::new(SchedConfig::default());
        assert_eq!(
            h.arrive(unpinned(1, 5)).actions,
            vec![Action::Place { id: 1, gpu: 0 }]
        );
        assert!(h.sched.placement_weights(0).is_empty());
    }

    #[test]
    fn allocation_success_rate_covers_the_last_five_minutes() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 5));
        h.alloc_failed(1, 0, 1);
        assert_eq!(h.sched.alloc_success_rate(0, 0), 0.0);
        h.at_ms(1_000);
        h.alloc(1, 0, 1);
        assert_eq!(h.sched.alloc_success_rate(0, 299_999 * MS), 0.5);
        assert_eq!(h.sched.alloc_success_rate(0, 300_000 * MS), 1.0);
        assert_eq!(h.sched.alloc_success_rate(0, 301_000 * MS), 1.0, "no data");
        assert_eq!(h.sched.alloc_success_rate(5, 0), 1.0, "unknown GPU");
    }

    #[test]
    fn load_balance_error_is_range_over_mean() {
        assert_eq!(load_balance_error(&[]), 0.0);
        assert_eq!(load_balance_error(&[0.0, 0.0]), 0.0);
        assert_eq!(load_balance_error(&[3.0, 3.0, 3.0]), 0.0);
        assert_eq!(load_balance_error(&[1.0, 3.0]), 1.0);
        assert_eq!(load_balance_error(&[2.0, 4.0, 9.0]), 7.0 / 5.0);
    }

    // ---- exits and robustness -----------------------------------------------------

    #[test]
    fn exits_complete_or_fail_then_archive_on_the_next_tick() {
        let mut h = Harness::new(config(1, 2));
        h.arrive(spec(1, 5));
        h.arrive(spec(2, 5));
        let out = h.exit(1, 0);
        assert_eq!(moves(&out), vec![(1, Running, Completed, "exited")]);
        assert_eq!(out.transitions[0].exit_code, Some(0));
        let out = h.exit(2, 3);
        assert_eq!(moves(&out), vec![(2, Running, Failed, "exited_with_error")]);
        assert_eq!(h.exit(2, 0), Output::default(), "exits once");
        h.at_ms(10);
        let out = h.tick();
        assert_eq!(
            moves(&out),
            vec![
                (1, Completed, Archived, "archived"),
                (2, Failed, Archived, "archived")
            ]
        );
        assert_eq!(out.transitions[1].exit_code, Some(3));
        assert_eq!(
            out.transitions[1].event_id, 6,
            "2 placed, 2 exits, 2 archived"
        );
        assert_eq!(h.view(2).finished_ns, Some(0));
        assert_eq!(h.sched.tasks().len(), 2, "archived tasks stay visible");
        assert_eq!(h.tick(), Output::default());
    }

    #[test]
    fn unknown_ids_and_duplicate_arrivals_are_ignored() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 5));
        h.at_ms(1);
        let ts_ns = h.ts_ns;
        let id = 99;
        for input in [
            Input::Active { id, ts_ns },
            Input::Idle { id, ts_ns },
            Input::MemAlloc {
                id,
                gpu: 0,
                bytes: 1,
                ts_ns,
            },
            Input::MemFree {
                id,
                gpu: 0,
                bytes: 1,
                ts_ns,
            },
            Input::AllocFailed {
                id,
                gpu: 0,
                bytes: u64::MAX,
                ts_ns,
            },
            Input::Exit {
                id,
                exit_code: 1,
                ts_ns,
            },
            Input::Confirmed {
                id,
                action: ActionKind::Freeze,
                ts_ns,
            },
            Input::TimedOut {
                id,
                action: ActionKind::Thaw,
                ts_ns,
            },
            Input::Arrive {
                spec: spec(1, 0),
                ts_ns,
            },
        ] {
            assert_eq!(h.step(input.clone()), Output::default(), "{input:?}");
        }
        assert_eq!(h.view(1).spec.priority, 5);
        assert_eq!(h.sched.alloc_success_rate(0, ts_ns), 1.0);
        assert!(h.sched.task(99).is_none());
    }

    #[test]
    fn timestamps_going_backwards_do_not_rewind_the_clock() {
        let mut h = Harness::new(config(1, 1));
        h.at_ms(100);
        h.arrive(spec(1, 5));
        h.at_ms(50);
        h.tick();
        assert_eq!(h.sched.now_ns(), 100 * MS);
        assert_eq!(h.view(1).on_gpu_ns, 0);
        h.at_ms(200);
        h.tick();
        assert_eq!(h.view(1).on_gpu_ns, 100 * MS);
    }

    #[test]
    fn priorities_above_15_are_treated_as_15() {
        let mut h = Harness::new(config(1, 1));
        h.arrive(spec(1, 200));
        let view = h.view(1);
        assert_eq!(
            (view.spec.priority, view.class, view.quantum_ms),
            (15, Class::Background, 200)
        );
    }

    #[test]
    fn greedy_victim_choice_beyond_the_exact_limit_still_uses_the_fewest_tasks() {
        let candidates: Vec<VictimCandidate> = (0..30)
            .map(|id| VictimCandidate {
                id,
                priority: (id % 16) as u8,
                bytes: (id % 7 + 1) * 10,
            })
            .collect();
        let victims = choose_victims(&candidates, 150);
        // The four 70s: two cover 140 < 150, three cover 210.
        assert_eq!(victims.len(), 3);
        let total: u64 = victims
            .iter()
            .map(|&id| candidates[id as usize].bytes)
            .sum();
        assert!((150..210).contains(&total), "greedy swap kept {total}");
        assert!(
            choose_victims(&candidates, 10_000).is_empty(),
            "nothing covers"
        );
        assert!(choose_victims(&candidates, 0).is_empty());
    }

    // ---- property tests -----------------------------------------------------------

    /// What the test asks for, turned into an input at the driver's clock.
    #[derive(Clone, Debug)]
    enum Op {
        Arrive {
            id: TaskId,
            priority: u8,
            gpu: Option<u32>,
            quota_gib: Option<u64>,
            max_ms: Option<u64>,
            grace_ms: Option<u64>,
            hard_kill: Option<bool>,
            expected_ms: Option<u64>,
        },
        Active(TaskId),
        Idle(TaskId),
        Alloc(TaskId, u32, u64),
        Free(TaskId, u32, u64),
        AllocFailed(TaskId, u32, u64),
        Exit(TaskId, i32),
        Tick,
        /// Confirm the n-th actuation in flight (a Tick when there is none).
        Confirm(usize),
        /// Time out the n-th actuation in flight.
        TimeOut(usize),
        /// Feedback about anything.
        Stray(TaskId, ActionKind, bool),
    }

    fn arb_id() -> impl Strategy<Value = TaskId> {
        prop_oneof![10 => 0u64..8, 1 => Just(42u64)]
    }

    /// GPUs 0 and 1 are configured; 2 is not.
    fn arb_gpu() -> impl Strategy<Value = u32> {
        prop_oneof![10 => 0u32..2, 1 => Just(2u32)]
    }

    fn arb_kind() -> impl Strategy<Value = ActionKind> {
        prop::sample::select(vec![
            ActionKind::Freeze,
            ActionKind::Thaw,
            ActionKind::Stop,
            ActionKind::Terminate,
            ActionKind::Kill,
            ActionKind::Place,
            ActionKind::Warn,
        ])
    }

    fn arb_op(feedback: bool) -> BoxedStrategy<Op> {
        let arrive = (
            arb_id(),
            0u8..=17,
            prop::option::of(arb_gpu()),
            prop::option::of(1u64..12),
            prop::option::of(0u64..3_000),
            prop::option::of(0u64..1_000),
            prop::option::of(any::<bool>()),
            prop::option::of(0u64..10_000),
        )
            .prop_map(
                |(id, priority, gpu, quota_gib, max_ms, grace_ms, hard_kill, expected_ms)| {
                    Op::Arrive {
                        id,
                        priority,
                        gpu,
                        quota_gib,
                        max_ms,
                        grace_ms,
                        hard_kill,
                        expected_ms,
                    }
                },
            );
        let base = prop_oneof![
            3 => arrive,
            4 => arb_id().prop_map(Op::Active),
            1 => arb_id().prop_map(Op::Idle),
            2 => (arb_id(), arb_gpu(), 1u64..6).prop_map(|(id, gpu, gib)| Op::Alloc(id, gpu, gib * GIB)),
            1 => (arb_id(), arb_gpu(), 1u64..6).prop_map(|(id, gpu, gib)| Op::Free(id, gpu, gib * GIB)),
            1 => (arb_id(), arb_gpu(), 1u64..12).prop_map(|(id, gpu, gib)| Op::AllocFailed(id, gpu, gib * GIB)),
            1 => (arb_id(), -2i32..3).prop_map(|(id, code)| Op::Exit(id, code)),
            4 => Just(Op::Tick),
        ];
        if feedback {
            prop_oneof![
                12 => base,
                4 => any::<usize>().prop_map(Op::Confirm),
                1 => any::<usize>().prop_map(Op::TimeOut),
                1 => (arb_id(), arb_kind(), any::<bool>()).prop_map(|(id, kind, confirmed)| Op::Stray(id, kind, confirmed)),
            ]
            .boxed()
        } else {
            base.boxed()
        }
    }

    fn random_config(slots: u32) -> SchedConfig {
        SchedConfig {
            slots_per_gpu: slots,
            idle_timeout_ms: 50,
            kill_grace_ms: 30,
            default_grace_ms: 100,
            ..config(2, slots)
        }
    }

    #[derive(Clone, Copy, Debug)]
    struct InFlight {
        kind: ActionKind,
        timeouts: u32,
    }

    /// Feeds inputs and checks every output against the protocol in the module doc,
    /// keeping its own record of task states and actuations in flight.
    struct Driver {
        sched: Scheduler,
        ts_ns: u64,
        inputs: Vec<Input>,
        outputs: Vec<Output>,
        states: BTreeMap<TaskId, TaskState>,
        in_flight: BTreeMap<TaskId, InFlight>,
        last_event_id: u64,
    }

    impl Driver {
        fn new(config: SchedConfig) -> Self {
            Driver {
                sched: Scheduler::new(config),
                ts_ns: 0,
                inputs: Vec::new(),
                outputs: Vec::new(),
                states: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                last_event_id: 0,
            }
        }

        fn nth_in_flight(&self, n: usize) -> Option<(TaskId, InFlight)> {
            if self.in_flight.is_empty() {
                return None;
            }
            self.in_flight
                .iter()
                .nth(n % self.in_flight.len())
                .map(|(&id, &f)| (id, f))
        }

        fn confirmation_kind(f: InFlight) -> ActionKind {
            if f.kind == ActionKind::Freeze && f.timeouts > 0 {
                ActionKind::Stop
            } else {
                f.kind
            }
        }

        fn apply(&mut self, op: &Op, advance_ms: u64) {
            self.ts_ns += advance_ms * MS;
            let ts_ns = self.ts_ns;
            let input = match *op {
                Op::Arrive {
                    id,
                    priority,
                    gpu,
                    quota_gib,
                    max_ms,
                    grace_ms,
                    hard_kill,
                    expected_ms,
                } => Input::Arrive {
                    spec: TaskSpec {
                        gpu,
                        mem_quota_bytes: quota_gib.map(|g| g * GIB),
                        max_duration_ms: max_ms,
                        grace_ms,
                        hard_kill,
                        expected_runtime_ms: expected_ms,
                        ..spec(id, priority)
                    },
                    ts_ns,
                },
                Op::Active(id) => Input::Active { id, ts_ns },
                Op::Idle(id) => Input::Idle { id, ts_ns },
                Op::Alloc(id, gpu, bytes) => Input::MemAlloc {
                    id,
                    gpu,
                    bytes,
                    ts_ns,
                },
                Op::Free(id, gpu, bytes) => Input::MemFree {
                    id,
                    gpu,
                    bytes,
                    ts_ns,
                },
                Op::AllocFailed(id, gpu, bytes) => Input::AllocFailed {
                    id,
                    gpu,
                    bytes,
                    ts_ns,
                },
                Op::Exit(id, exit_code) => Input::Exit {
                    id,
                    exit_code,
                    ts_ns,
                },
                Op::Tick => Input::Tick { ts_ns },
                Op::Confirm(n) => match self.nth_in_flight(n) {
                    Some((id, f)) => Input::Confirmed {
                        id,
                        action: Self::confirmation_kind(f),
                        ts_ns,
                    },
                    None => Input::Tick { ts_ns },
                },
                Op::TimeOut(n) => match self.nth_in_flight(n) {
                    Some((id, f)) => Input::TimedOut {
                        id,
                        action: f.kind,
                        ts_ns,
                    },
                    None => Input::Tick { ts_ns },
                },
                Op::Stray(id, action, true) => Input::Confirmed { id, action, ts_ns },
                Op::Stray(id, action, false) => Input::TimedOut { id, action, ts_ns },
            };
            self.feed(input);
        }

        fn feed(&mut self, input: Input) -> Output {
            let arriving = match &input {
                Input::Arrive { spec, .. } if self.sched.task(spec.id).is_none() => Some(spec.id),
                _ => None,
            };
            let was_live = input
                .task()
                .and_then(|id| self.sched.task(id))
                .is_some_and(|v| v.state.is_live());
            let out = self.sched.step(&input);
            if let Some(id) = arriving {
                self.states.insert(id, Pending);
            }

            // What the protocol says the input did to the actuation in flight.
            let mut stop_expected = None;
            let mut retry_expected = None;
            match input {
                Input::Confirmed { id, action, .. } => {
                    if let Some(f) = self.in_flight.get(&id)
                        && matches!(
                            (f.kind, action),
                            (ActionKind::Freeze, ActionKind::Freeze | ActionKind::Stop)
                                | (ActionKind::Thaw, ActionKind::Thaw)
                        )
                    {
                        self.in_flight.remove(&id);
                    }
                }
                Input::TimedOut { id, action, .. } => {
                    if let Some(f) = self.in_flight.get_mut(&id)
                        && f.kind == action
                    {
                        f.timeouts += 1;
                        match (f.kind, f.timeouts) {
                            (ActionKind::Freeze, 1) => stop_expected = Some(id),
                            (ActionKind::Thaw, 1) => retry_expected = Some(id),
                            (ActionKind::Thaw, _) => {
                                self.in_flight.remove(&id);
                            }
                            _ => {}
                        }
                    }
                }
                Input::Exit { id, .. } if was_live => {
                    self.in_flight.remove(&id);
                }
                _ => {}
            }

            let (mut stops, mut retries, mut places) = (0, 0, 0);
            for action in &out.actions {
                match *action {
                    Action::Freeze { id } => {
                        assert!(
                            !self.in_flight.contains_key(&id),
                            "Freeze for {id} while {:?} is in flight",
                            self.in_flight[&id]
                        );
                        let state = self.sched.task(id).map(|v| v.state);
                        assert!(
                            matches!(state, Some(Running | Pending)),
                            "Freeze for {id} in {state:?}"
                        );
                        self.in_flight.insert(
                            id,
                            InFlight {
                                kind: ActionKind::Freeze,
                                timeouts: 0,
                            },
                        );
                    }
                    Action::Thaw { id } if retry_expected == Some(id) && retries == 0 => {
                        retries += 1;
                    }
                    Action::Thaw { id } => {
                        assert!(
                            !self.in_flight.contains_key(&id),
                            "Thaw for {id} while {:?} is in flight",
                            self.in_flight[&id]
                        );
                        let view = self.sched.task(id).expect("known task");
                        assert_eq!(view.state, Preempted, "Thaw for {id}");
                        // Only into a free slot: whoever is still being frozen holds one.
                        let holders = self
                            .sched
                            .tasks()
                            .iter()
                            .filter(|v| v.gpu == view.gpu && v.state.is_live())
                            .filter(|v| v.state == Running || v.in_flight == Some(ActionKind::Thaw))
                            .count();
                        assert!(
                            holders <= self.sched.config().slots(),
                            "Thaw for {id} overfills GPU {:?}: {holders} holders",
                            view.gpu
                        );
                        self.in_flight.insert(
                            id,
                            InFlight {
                                kind: ActionKind::Thaw,
                                timeouts: 0,
                            },
                        );
                    }
                    Action::Stop { id } => {
                        assert_eq!(stop_expected, Some(id), "unexpected Stop for {id}");
                        stops += 1;
                    }
                    Action::Place { id, .. } => {
                        assert_eq!(arriving, Some(id), "Place for {id} outside its arrival");
                        places += 1;
                    }
                    _ => {}
                }
            }
            assert_eq!(
                stops,
                usize::from(stop_expected.is_some()),
                "freeze escalation"
            );
            assert_eq!(retries, usize::from(retry_expected.is_some()), "thaw retry");
            assert_eq!(
                places,
                usize::from(arriving.is_some()),
                "one Place per task"
            );

            for t in &out.transitions {
                assert_eq!(t.event_id, self.last_event_id + 1, "event ids");
                self.last_event_id = t.event_id;
                assert!(is_legal(t.from, t.to), "illegal {}", t.state_transition());
                assert_eq!(
                    self.states.get(&t.task),
                    Some(&t.from),
                    "task {} {} does not start from its state",
                    t.task,
                    t.state_transition()
                );
                assert_eq!(
                    t.exit_code.is_some(),
                    matches!(t.to, Completed | Failed | Archived),
                    "exit code on {}",
                    t.state_transition()
                );
                assert_eq!(t.timestamp_ns, self.sched.now_ns());
                self.states.insert(t.task, t.to);
            }

            for (&id, &state) in &self.states {
                let view = self.sched.task(id).expect("known task");
                assert_eq!(view.state, state, "task {id}");
                let in_flight = view.in_flight.map(|k| {
                    if k == ActionKind::Stop {
                        ActionKind::Freeze
                    } else {
                        k
                    }
                });
                assert_eq!(
                    in_flight,
                    self.in_flight.get(&id).map(|f| f.kind),
                    "task {id}"
                );
            }
            self.inputs.push(input);
            self.outputs.push(out.clone());
            out
        }

        /// The perfect actuator: confirms everything in flight, now, until nothing is.
        fn settle(&mut self) {
            for _ in 0..16 {
                let pending: Vec<(TaskId, ActionKind)> = self
                    .in_flight
                    .iter()
                    .map(|(&id, &f)| (id, Self::confirmation_kind(f)))
                    .collect();
                if pending.is_empty() {
                    return;
                }
                for (id, action) in pending {
                    let ts_ns = self.ts_ns;
                    self.feed(Input::Confirmed { id, action, ts_ns });
                }
            }
            panic!("actuations never settle: {:?}", self.in_flight);
        }
    }

    /// With no actuation in flight: every task has been decided, no GPU runs more
    /// tasks than slots or leaves a slot empty while a task waits, and no task runs
    /// while an active task of higher priority waits (nor an idle one while an
    /// active one waits).
    fn check_settled_policy(sched: &Scheduler) {
        let slots = sched.config().slots();
        let live: Vec<TaskView> = sched
            .tasks()
            .into_iter()
            .filter(|v| v.state.is_live())
            .collect();
        let gpus: BTreeSet<u32> = live.iter().filter_map(|v| v.gpu).collect();
        for gpu in gpus {
            let on_gpu: Vec<&TaskView> = live.iter().filter(|v| v.gpu == Some(gpu)).collect();
            for v in &on_gpu {
                assert_eq!(v.in_flight, None, "task {}", v.spec.id);
                assert_ne!(v.state, Pending, "task {} never decided", v.spec.id);
            }
            let running: Vec<&TaskView> = on_gpu
                .iter()
                .copied()
                .filter(|v| v.state == Running)
                .collect();
            let waiting: Vec<&TaskView> = on_gpu
                .iter()
                .copied()
                .filter(|v| v.state == Preempted)
                .collect();
            assert!(
                running.len() <= slots,
                "GPU {gpu} runs {} tasks",
                running.len()
            );
            if !waiting.is_empty() {
                assert_eq!(
                    running.len(),
                    slots,
                    "GPU {gpu} leaves a slot empty while tasks wait"
                );
            }
            for high in waiting.iter().filter(|v| v.wants_gpu) {
                for low in &running {
                    assert!(
                        low.wants_gpu,
                        "idle task {} holds a slot on GPU {gpu} while active task {} waits",
                        low.spec.id, high.spec.id
                    );
                    assert!(
                        low.spec.priority <= high.spec.priority,
                        "task {} (priority {}) runs while task {} (priority {}) waits on GPU {gpu}",
                        low.spec.id,
                        low.spec.priority,
                        high.spec.id,
                        high.spec.priority
                    );
                }
            }
        }
    }

    /// Most minus least on-GPU time over all tasks.
    fn on_gpu_spread_ns(sched: &Scheduler) -> u64 {
        let shares: Vec<u64> = sched.tasks().iter().map(|v| v.on_gpu_ns).collect();
        let max = shares.iter().max().copied().unwrap_or(0);
        let min = shares.iter().min().copied().unwrap_or(0);
        max - min
    }

    fn brute_force_victims(candidates: &[VictimCandidate], need: u64) -> Vec<TaskId> {
        if need == 0 {
            return Vec::new();
        }
        // Fewest tasks, then fewest bytes, lowest priorities, lowest ids.
        type Key = (usize, u128, Reverse<Vec<u8>>, Vec<TaskId>);
        let mut best: Option<Key> = None;
        for mask in 0u32..(1 << candidates.len()) {
            let set: Vec<&VictimCandidate> = candidates
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| c)
                .collect();
            let total: u128 = set.iter().map(|c| u128::from(c.bytes)).sum();
            if total < u128::from(need) {
                continue;
            }
            let mut priorities: Vec<u8> = set.iter().map(|c| c.priority).collect();
            priorities.sort_unstable_by(|a, b| b.cmp(a));
            let mut ids: Vec<TaskId> = set.iter().map(|c| c.id).collect();
            ids.sort_unstable();
            let key = (set.len(), total, Reverse(priorities), ids);
            if best.as_ref().is_none_or(|b| key < *b) {
                best = Some(key);
            }
        }
        best.map(|b| b.3).unwrap_or_default()
    }

    fn arb_spec_any() -> impl Strategy<Value = TaskSpec> {
        (
            0u64..4,
            any::<u8>(),
            prop::option::of(prop_oneof![0u32..3, any::<u32>()]),
            prop::option::of(any::<u64>()),
            prop::option::of(prop_oneof![0u64..100, any::<u64>()]),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<u64>()),
        )
            .prop_map(
                |(id, priority, gpu, quota, max_ms, grace_ms, hard_kill, expected)| TaskSpec {
                    gpu,
                    mem_quota_bytes: quota,
                    max_duration_ms: max_ms,
                    grace_ms,
                    hard_kill,
                    expected_runtime_ms: expected,
                    ..spec(id, priority)
                },
            )
    }

    fn arb_input_any() -> impl Strategy<Value = Input> {
        let id = || 0u64..4;
        let ts = || prop_oneof![0u64..10_000_000_000, any::<u64>()];
        let gpu = || prop_oneof![0u32..3, any::<u32>()];
        let bytes = || prop_oneof![0u64..(32 * GIB), any::<u64>()];
        prop_oneof![
            (arb_spec_any(), ts()).prop_map(|(spec, ts_ns)| Input::Arrive { spec, ts_ns }),
            (id(), ts()).prop_map(|(id, ts_ns)| Input::Active { id, ts_ns }),
            (id(), ts()).prop_map(|(id, ts_ns)| Input::Idle { id, ts_ns }),
            (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::MemAlloc {
                id,
                gpu,
                bytes,
                ts_ns
            }),
            (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::MemFree {
                id,
                gpu,
                bytes,
                ts_ns
            }),
            (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::AllocFailed {
                id,
                gpu,
                bytes,
                ts_ns
            }),
            (id(), any::<i32>(), ts()).prop_map(|(id, exit_code, ts_ns)| Input::Exit {
                id,
                exit_code,
                ts_ns
            }),
            ts().prop_map(|ts_ns| Input::Tick { ts_ns }),
            (id(), arb_kind(), ts()).prop_map(|(id, action, ts_ns)| Input::Confirmed {
                id,
                action,
                ts_ns
            }),
            (id(), arb_kind(), ts()).prop_map(|(id, action, ts_ns)| Input::TimedOut {
                id,
                action,
                ts_ns
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Property 1: once the actuations in flight are confirmed, no task runs
        /// while a higher-priority task that wants the same GPU waits.
        #[test]
        fn prop_no_task_runs_while_a_higher_priority_task_waits(
            ops in prop::collection::vec((arb_op(false), 0u64..=15), 1..150),
            slots in 1u32..=3,
        ) {
            let mut driver = Driver::new(random_config(slots));
            for (op, advance_ms) in &ops {
                driver.apply(op, *advance_ms);
                driver.settle();
                check_settled_policy(&driver.sched);
            }
        }

        /// Property 5: every transition is legal, starts from the task's state, and
        /// event ids count up from 1; actuations are never contradicted in flight and
        /// time-outs escalate as documented (the Driver checks all of it per step).
        #[test]
        fn prop_transitions_are_legal_and_consistent(
            ops in prop::collection::vec((arb_op(true), 0u64..=15), 1..250),
            slots in 1u32..=3,
        ) {
            let mut driver = Driver::new(random_config(slots));
            for (op, advance_ms) in &ops {
                driver.apply(op, *advance_ms);
            }
            let ids: Vec<u64> = driver.outputs.iter().flat_map(|o| &o.transitions).map(|t| t.event_id).collect();
            prop_assert_eq!(ids, (1..=driver.last_event_id).collect::<Vec<u64>>());
        }

        /// Property 6: the same inputs give the same outputs, also after a trip
        /// through the JSON lines `keling replay` reads.
        #[test]
        fn prop_same_inputs_give_same_outputs(
            ops in prop::collection::vec((arb_op(true), 0u64..=15), 1..250),
            slots in 1u32..=3,
        ) {
            let mut driver = Driver::new(random_config(slots));
            for (op, advance_ms) in &ops {
                driver.apply(op, *advance_ms);
            }
            let replay = |inputs: &[Input]| {
                let mut sched = Scheduler::new(random_config(slots));
                let outputs: Vec<Output> = inputs.iter().map(|i| sched.step(i)).collect();
                (outputs, sched.tasks())
            };
            let (outputs, tasks) = replay(&driver.inputs);
            prop_assert_eq!(&outputs, &driver.outputs);
            prop_assert_eq!(&tasks, &driver.sched.tasks());
            let jsonl: String = driver
                .inputs
                .iter()
                .map(|i| serde_json::to_string(i).unwrap() + "\n")
                .collect();
            let parsed: Vec<Input> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            prop_assert_eq!(&parsed, &driver.inputs);
            prop_assert_eq!(&replay(&parsed).0, &driver.outputs);
        }

        /// Property 4: the victim set is the minimum that brute force finds over all
        /// subsets (fewest tasks, fewest bytes, lowest priorities, lowest ids).
        #[test]
        fn prop_victim_set_is_minimal(
            candidates in prop::collection::vec((1u8..=15, 0u64..64), 0..=11),
            need in 0u64..400,
        ) {
            let candidates: Vec<VictimCandidate> = candidates
                .into_iter()
                .enumerate()
                .map(|(i, (priority, bytes))| VictimCandidate { id: i as TaskId, priority, bytes })
                .collect();
            let chosen = choose_victims(&candidates, need);
            prop_assert_eq!(&chosen, &brute_force_victims(&candidates, need));
            let total: u64 = chosen.iter().map(|&id| candidates[id as usize].bytes).sum();
            prop_assert!(chosen.is_empty() || total >= need);
        }

        /// Property 4, through `step`: AllocFailed terminates exactly the brute-force
        /// minimum over the candidates the rules allow.
        #[test]
        fn prop_eviction_terminates_the_brute_force_minimum(
            tasks in prop::collection::vec((0u8..=15, 0u64..12, prop::option::of(0u64..10_000)), 1..10),
            requester in any::<prop::sample::Index>(),
            want_units in 1u64..48,
            now_ms in 0u64..6_000,
        ) {
            const UNIT: u64 = 1 << 20;
            const CAPACITY_UNITS: u64 = 40;
            let mut sched = Scheduler::new(SchedConfig {
                gpus: vec![GpuInfo { index: 0, capacity_bytes: CAPACITY_UNITS * UNIT }],
                slots_per_gpu: 16,
                ..SchedConfig::default()
            });
            for (i, &(priority, units, expected)) in tasks.iter().enumerate() {
                let id = i as TaskId;
                sched.step(&Input::Arrive {
                    spec: TaskSpec { expected_runtime_ms: expected, ..spec(id, priority) },
                    ts_ns: 0,
                });
                if units > 0 {
                    sched.step(&Input::MemAlloc { id, gpu: 0, bytes: units * UNIT, ts_ns: 0 });
                }
            }
            let ts_ns = now_ms * MS;
            sched.step(&Input::Tick { ts_ns });
            let requester = requester.index(tasks.len());
            let out = sched.step(&Input::AllocFailed {
                id: requester as TaskId,
                gpu: 0,
                bytes: want_units * UNIT,
                ts_ns,
            });

            let used: u64 = tasks.iter().map(|t| t.1).sum();
            let need_units = want_units.saturating_sub(CAPACITY_UNITS.saturating_sub(used));
            let candidates: Vec<VictimCandidate> = tasks
                .iter()
                .enumerate()
                .filter(|&(i, &(priority, units, expected))| {
                    i != requester
                        && priority > tasks[requester].0
                        && units > 0
                        && expected.is_none_or(|e| e.saturating_sub(now_ms) > 3_000)
                })
                .map(|(i, &(priority, units, _))| VictimCandidate { id: i as TaskId, priority, bytes: units })
                .collect();
            prop_assert_eq!(terminated(&out), brute_force_victims(&candidates, need_units));
        }

        /// Nothing in `step` panics, whatever the input; event ids still count up.
        #[test]
        fn prop_step_never_panics_on_arbitrary_inputs(
            inputs in prop::collection::vec(arb_input_any(), 1..120),
            slots in 0u32..3,
        ) {
            let mut sched = Scheduler::new(SchedConfig { kill_grace_ms: u64::MAX, ..random_config(slots) });
            let mut last_event_id = 0;
            for input in &inputs {
                let out = sched.step(input);
                for t in &out.transitions {
                    prop_assert_eq!(t.event_id, last_event_id + 1);
                    prop_assert!(is_legal(t.from, t.to));
                    last_event_id = t.event_id;
                }
                let _ = sched.placement_weights(input.ts_ns());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Property 2: equal-priority, always-active tasks get equal GPU time to within
        /// one quantum (checked after every tick, so also over a long run), and the
        /// slots never idle. The actuator confirms at once.
        #[test]
        fn prop_round_robin_gives_equal_shares_within_one_quantum(
            tasks in 2u64..=5,
            priority in 0u8..=15,
            slots in 1u32..=2,
            run_ms in 1_000u64..3_000,
        ) {
            let quantum_ns = quantum_ms(priority) * MS;
            let mut driver = Driver::new(SchedConfig { tick_ms: 1, ..config(1, slots) });
            for id in 0..tasks {
                driver.feed(Input::Arrive { spec: spec(id, priority), ts_ns: 0 });
            }
            driver.settle();
            for ms in 1..=run_ms {
                driver.ts_ns = ms * MS;
                let ts_ns = driver.ts_ns;
                let running: Vec<TaskId> = driver.sched.tasks().iter().filter(|v| v.state == Running).map(|v| v.spec.id).collect();
                for id in running {
                    driver.feed(Input::Active { id, ts_ns });
                }
                driver.feed(Input::Tick { ts_ns });
                driver.settle();
                let spread = on_gpu_spread_ns(&driver.sched);
                prop_assert!(spread <= quantum_ns, "at {} ms: spread {} ns", ms, spread);
            }
            let total: u64 = driver.sched.tasks().iter().map(|v| v.on_gpu_ns).sum();
            prop_assert_eq!(total, u64::from(slots) * run_ms * MS);
        }

        /// Property 2 with a slow actuator: every Freeze/Thaw is confirmed one 1 ms
        /// tick later, so a turn lasts a quantum plus that latency, and shares stay
        /// within one quantum plus one tick at all times. One slot: with more, turns
        /// on different slots drift apart and the spread reaches about two quanta
        /// for a moment (it does not grow with time).
        #[test]
        fn prop_round_robin_with_one_tick_actuation_latency(
            tasks in 2u64..=5,
            priority in 0u8..=15,
            run_ms in 1_000u64..3_000,
        ) {
            let bound_ns = (quantum_ms(priority) + 1) * MS;
            let mut driver = Driver::new(SchedConfig { tick_ms: 1, ..config(1, 1) });
            for id in 0..tasks {
                driver.feed(Input::Arrive { spec: spec(id, priority), ts_ns: 0 });
            }
            for ms in 1..=run_ms {
                driver.ts_ns = ms * MS;
                let ts_ns = driver.ts_ns;
                let due: Vec<(TaskId, ActionKind)> = driver
                    .in_flight
                    .iter()
                    .map(|(&id, &f)| (id, Driver::confirmation_kind(f)))
                    .collect();
                for (id, action) in due {
                    driver.feed(Input::Confirmed { id, action, ts_ns });
                }
                let running: Vec<TaskId> = driver.sched.tasks().iter().filter(|v| v.state == Running).map(|v| v.spec.id).collect();
                for id in running {
                    driver.feed(Input::Active { id, ts_ns });
                }
                driver.feed(Input::Tick { ts_ns });
                let spread = on_gpu_spread_ns(&driver.sched);
                prop_assert!(spread <= bound_ns, "at {} ms: spread {} ns", ms, spread);
            }
        }

        /// Property 3: a duration limit fires at the first input at or past the
        /// deadline (so within one tick), with the right record and action, and never
        /// early; the warning likewise at the warning point.
        #[test]
        fn prop_duration_limits_fire_within_one_tick(
            plans in prop::collection::vec(
                (0u64..1_500, 0u64..2_500, 0u64..3_000, any::<bool>(), prop::option::of(0u64..4_000)),
                1..6,
            ),
            // Whole-ms gaps land exactly on deadlines often; ns gaps fall in between.
            gaps_ns in prop_oneof![
                prop::collection::vec((1u64..=10).prop_map(|ms| ms * MS), 300..600),
                prop::collection::vec(1u64..=10 * MS, 300..600),
            ],
        ) {
            const TICK_NS: u64 = 10 * MS;
            const KILL_GRACE_MS: u64 = 20;
            #[derive(Default, Clone)]
            struct Seen {
                arrived_ns: Option<u64>,
                exited: bool,
                warn: Option<(u64, u64)>,
                enforce_ns: Option<u64>,
                terminate_ns: Option<u64>,
                kill_ns: Option<u64>,
            }
            let mut sched = Scheduler::new(SchedConfig {
                tick_ms: 10,
                kill_grace_ms: KILL_GRACE_MS,
                ..config(1, 8)
            });
            let mut seen = vec![Seen::default(); plans.len()];
            let mut ts_ns = 0;
            for gap in gaps_ns {
                ts_ns += gap;
                let mut inputs = Vec::new();
                for (i, &(arrive_ms, limit_ms, grace_ms, hard, exit_after_ms)) in plans.iter().enumerate() {
                    if seen[i].arrived_ns.is_none() && arrive_ms * MS <= ts_ns {
                        seen[i].arrived_ns = Some(ts_ns);
                        inputs.push(Input::Arrive {
                            spec: TaskSpec {
                                max_duration_ms: Some(limit_ms),
                                grace_ms: Some(grace_ms),
                                hard_kill: Some(hard),
                                ..spec(i as TaskId, 5)
                            },
                            ts_ns,
                        });
                    } else if let (Some(arrived), Some(after)) = (seen[i].arrived_ns, exit_after_ms)
                        && !seen[i].exited
                        && arrived + after * MS <= ts_ns
                    {
                        seen[i].exited = true;
                        inputs.push(Input::Exit { id: i as TaskId, exit_code: 0, ts_ns });
                    }
                }
                inputs.push(Input::Tick { ts_ns });
                for input in inputs {
                    let out = sched.step(&input);
                    for (k, action) in out.actions.iter().enumerate() {
                        let id = action.task() as usize;
                        let (_, limit_ms, _, hard, _) = plans[id];
                        let arrived = seen[id].arrived_ns.unwrap();
                        match action {
                            Action::Enforce { record, .. } => {
                                prop_assert!(seen[id].enforce_ns.is_none(), "enforced twice");
                                seen[id].enforce_ns = Some(ts_ns);
                                prop_assert_eq!(
                                    record,
                                    &EnforcementRecord::duration_exceeded(limit_ms, (ts_ns - arrived) / MS)
                                );
                                let follow = if hard { Action::Kill { id: id as TaskId } } else { Action::Terminate { id: id as TaskId } };
                                prop_assert_eq!(out.actions.get(k + 1), Some(&follow));
                            }
                            Action::Warn { remaining_ms, .. } => {
                                prop_assert!(seen[id].warn.is_none(), "warned twice");
                                seen[id].warn = Some((ts_ns, *remaining_ms));
                            }
                            Action::Terminate { .. } => seen[id].terminate_ns = Some(ts_ns),
                            Action::Kill { .. } => {
                                prop_assert!(seen[id].kill_ns.is_none(), "killed twice");
                                seen[id].kill_ns = Some(ts_ns);
                            }
                            _ => {}
                        }
                    }
                    // Whoever is still alive past a deadline has been dealt with.
                    for (i, &(_, limit_ms, grace_ms, _, _)) in plans.iter().enumerate() {
                        let Some(arrived) = seen[i].arrived_ns else { continue };
                        let live = sched.task(i as TaskId).is_some_and(|v| v.state.is_live());
                        if !live {
                            continue;
                        }
                        let deadline = arrived + limit_ms * MS;
                        let warn_point = arrived + limit_ms.saturating_sub(grace_ms) * MS;
                        if ts_ns >= deadline {
                            prop_assert!(seen[i].enforce_ns.is_some(), "task {} not enforced at {}", i, ts_ns);
                        } else if ts_ns >= warn_point {
                            prop_assert!(seen[i].warn.is_some(), "task {} not warned at {}", i, ts_ns);
                        }
                        if let Some(terminated) = seen[i].terminate_ns
                            && ts_ns >= terminated + KILL_GRACE_MS * MS
                        {
                            prop_assert!(seen[i].kill_ns.is_some(), "task {} not killed after grace", i);
                        }
                    }
                }
            }
            for (i, &(_, limit_ms, grace_ms, _, _)) in plans.iter().enumerate() {
                let Some(arrived) = seen[i].arrived_ns else { continue };
                let deadline = arrived + limit_ms * MS;
                if let Some(enforced) = seen[i].enforce_ns {
                    prop_assert!(enforced >= deadline, "task {} enforced early", i);
                    prop_assert!(enforced - deadline <= TICK_NS, "task {} enforced late", i);
                }
                if let Some((warned, remaining_ms)) = seen[i].warn {
                    let warn_point = arrived + limit_ms.saturating_sub(grace_ms) * MS;
                    prop_assert!(warned >= warn_point && warned < deadline, "task {} warned off-window", i);
                    prop_assert!(warned - warn_point <= TICK_NS, "task {} warned late", i);
                    prop_assert_eq!(remaining_ms, limit_ms - (warned - arrived) / MS);
                }
                if let (Some(terminated), Some(killed)) = (seen[i].terminate_ns, seen[i].kill_ns) {
                    let due = terminated + KILL_GRACE_MS * MS;
                    prop_assert!(killed >= due && killed - due <= TICK_NS, "task {} kill at {} due {}", i, killed, due);
                }
            }
        }
    }
}
