//! Task states and what is shown of them: [`TaskState`] and which moves between
//! states are legal ([`is_legal`]), the scheduling log's [`Transition`], the
//! read-only [`TaskView`], and the priority tables ([`Class`], [`quantum_ms`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::TaskId;
use crate::action::ActionKind;
use crate::input::TaskSpec;
use crate::reason::Reason;

/// The lowest priority (highest number); anything above is treated as this.
pub const LOWEST_PRIORITY: u8 = 15;

/// Where a task is in its life. See "States" in the crate doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskState {
    /// Arrived, not yet decided.
    Pending,
    /// Holds a slot and runs.
    Running,
    /// Frozen, waiting for a slot.
    Preempted,
    /// Exited with code 0.
    Completed,
    /// Exited with a non-zero code, or after Keling started ending it.
    Failed,
    /// Finished, and one tick has passed since.
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
    /// Priorities 0-2.
    RealTime,
    /// Priorities 3-6.
    Interactive,
    /// Priorities 7-15 (and above, treated as 15).
    Background,
}

/// The class of a priority.
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

/// One line of the scheduling log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// 1, 2, 3, ... over the scheduler's life.
    pub event_id: u64,
    /// The task.
    pub task: TaskId,
    /// Its name, from its spec.
    pub name: String,
    /// Its process, from its spec.
    pub pid: u32,
    /// The GPU it is placed on.
    pub gpu: Option<u32>,
    /// Its priority, clamped to 0..=15.
    pub priority: u8,
    /// The state before.
    pub from: TaskState,
    /// The state after.
    pub to: TaskState,
    /// Why; serialized in snake_case: `placed`, `queued`, ...
    pub reason: Reason,
    /// The core's clock when it happened.
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

/// A read-only picture of one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskView {
    /// As given on arrival, priority clamped to 0..=15.
    pub spec: TaskSpec,
    /// Its state now.
    pub state: TaskState,
    /// The GPU it is placed on.
    pub gpu: Option<u32>,
    /// Memory held now, per GPU index.
    pub mem_bytes: BTreeMap<u32, u64>,
    /// `mem_bytes` may be wrong: a table the kernel needed for the task's books
    /// was full ([`crate::Input::MemUnsure`]); its quota is not enforced on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mem_unsure: bool,
    /// Time spent holding a slot (`Running`, not yielded).
    pub on_gpu_ns: u64,
    /// `on_gpu_ns` in whole ms.
    pub on_gpu_ms: u64,
    /// Whether it wants the GPU (active, as opposed to idle).
    pub wants_gpu: bool,
    /// `Running` without its slot: it went idle while another task waited for
    /// the GPU and gave the slot up without being frozen; when it is active
    /// again it takes a slot back or is frozen to wait for one.
    #[serde(default)]
    pub yielded: bool,
    /// Its priority's class.
    pub class: Class,
    /// Its priority's quantum.
    pub quantum_ms: u64,
    /// `Freeze`, `Stop` (an escalated freeze) or `Thaw` while one is in flight.
    pub in_flight: Option<ActionKind>,
    /// Why Keling is ending the task, once it started to: `DurationLimit`,
    /// `EvictedForMemory` or `OverQuota`.
    pub ending_reason: Option<Reason>,
    /// The core's clock at arrival.
    pub arrived_ns: u64,
    /// First time it became `Running`.
    pub started_ns: Option<u64>,
    /// When it exited.
    pub finished_ns: Option<u64>,
    /// Its exit code, once it exited.
    pub exit_code: Option<i32>,
}

/// Why a task waits: unbound in the host-level queue (late binding;
/// [`QueuedView::reason`]), or bound to a GPU that does not run it now
/// ([`Scheduler::wait_reason`](crate::Scheduler::wait_reason)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// A cap: every GPU it may use runs as many tasks as it may at once
    /// (`slots_per_gpu`), by tasks it does not outrank (equal or higher
    /// priority, or any holder under FIFO), by tasks being frozen (their place
    /// is handed over once the freeze is confirmed), or by tasks already bound
    /// there that come before it.
    SlotsHeld,
    /// Keling is ending it (its session limit): it will not be bound.
    Ending,
    /// Memory sharing: the memory it may take (its budget, else what it holds
    /// and has peaked at) does not fit in what the GPU has left.
    Memory,
    /// Memory sharing: a task of higher priority that wants the GPU works
    /// there; it waits (keeping its memory) until that one is done.
    HigherPriority,
}

impl WaitReason {
    /// `slots_held`, `ending`, `memory`, `higher_priority`.
    pub const fn as_str(self) -> &'static str {
        match self {
            WaitReason::SlotsHeld => "slots_held",
            WaitReason::Ending => "ending",
            WaitReason::Memory => "memory",
            WaitReason::HigherPriority => "higher_priority",
        }
    }
}

/// A task waiting unbound in the host-level queue (late binding): where it
/// stands and why. Its [`TaskView`] says `Pending` with `gpu: None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedView {
    /// The task.
    pub id: TaskId,
    /// 1 for the task bound next; the queue is in the policy's order
    /// (priority, then arrival).
    pub position: usize,
    /// Tasks ahead of it in the queue (`position - 1`): "queued behind N jobs".
    pub ahead: usize,
    /// Why it is not bound yet.
    pub reason: WaitReason,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::TaskState::{Archived, Completed, Failed, Pending, Preempted, Running};
    use super::*;

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
    fn live_states_are_the_ones_before_an_exit() {
        let live: Vec<TaskState> = [Pending, Running, Preempted, Completed, Failed, Archived]
            .into_iter()
            .filter(|s| s.is_live())
            .collect();
        assert_eq!(live, [Pending, Running, Preempted]);
    }

    fn a_transition() -> Transition {
        Transition {
            event_id: 2,
            task: 7,
            name: "train \"x\"".to_string(),
            pid: 1234,
            gpu: Some(0),
            priority: 3,
            from: Running,
            to: Failed,
            reason: Reason::OverQuota,
            timestamp_ns: 3_000,
            exit_code: Some(0),
        }
    }

    /// The scheduling log's format, byte for byte, as written when the reason was a
    /// string.
    #[test]
    fn transition_serializes_exactly_as_before() {
        let t = a_transition();
        let json = r#"{"event_id":2,"task":7,"name":"train \"x\"","pid":1234,"gpu":0,"priority":3,"from":"Running","to":"Failed","reason":"over_quota","timestamp_ns":3000,"exit_code":0}"#;
        assert_eq!(serde_json::to_string(&t).unwrap(), json);
        assert_eq!(serde_json::from_str::<Transition>(json).unwrap(), t);
        assert_eq!(t.state_transition(), "RUNNING\u{2192}FAILED");
    }

    #[test]
    fn task_view_serializes_exactly_as_before() {
        let view = TaskView {
            spec: TaskSpec {
                id: 7,
                pid: 1234,
                name: "train \"x\"".to_string(),
                priority: 3,
                gpu: Some(0),
                mem_quota_bytes: Some(1 << 30),
                max_duration_ms: None,
                grace_ms: Some(500),
                hard_kill: Some(false),
                expected_runtime_ms: Some(60_000),
            },
            state: Running,
            gpu: Some(0),
            mem_bytes: [(0, 2 << 30)].into(),
            mem_unsure: false,
            on_gpu_ns: 1_000,
            on_gpu_ms: 0,
            wants_gpu: true,
            yielded: false,
            class: Class::Interactive,
            quantum_ms: 20,
            in_flight: None,
            ending_reason: Some(Reason::OverQuota),
            arrived_ns: 1_000,
            started_ns: Some(1_000),
            finished_ns: None,
            exit_code: None,
        };
        let json = r#"{"spec":{"id":7,"pid":1234,"name":"train \"x\"","priority":3,"gpu":0,"mem_quota_bytes":1073741824,"max_duration_ms":null,"grace_ms":500,"hard_kill":false,"expected_runtime_ms":60000},"state":"Running","gpu":0,"mem_bytes":{"0":2147483648},"on_gpu_ns":1000,"on_gpu_ms":0,"wants_gpu":true,"yielded":false,"class":"Interactive","quantum_ms":20,"in_flight":null,"ending_reason":"over_quota","arrived_ns":1000,"started_ns":1000,"finished_ns":null,"exit_code":null}"#;
        assert_eq!(serde_json::to_string(&view).unwrap(), json);
        assert_eq!(serde_json::from_str::<TaskView>(json).unwrap(), view);
    }
}
