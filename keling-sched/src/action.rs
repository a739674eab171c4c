//! What the core tells the agent: the [`Action`]s of an output, the [`ActionKind`]
//! that feedback (`Confirmed` / `TimedOut`) names, and the 4003
//! [`EnforcementRecord`] of a session-duration enforcement. See "Actions" in the
//! crate doc for what the agent does with each.

use serde::{Deserialize, Serialize};

use crate::TaskId;

/// The code of the session-duration enforcement record.
pub const DURATION_EXCEEDED_CODE: u32 = 4003;

/// The code of the overload rule's truncation record.
pub const OVERLOADED_CODE: u32 = 4004;

/// The kind of an action, as feedback names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ActionKind {
    /// `cgroup.freeze` 1 (SIGSTOP for processes Keling did not launch).
    Freeze,
    /// Undo whatever stopped the task.
    Thaw,
    /// SIGSTOP: escalation of a freeze that timed out.
    Stop,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// Bind to a GPU.
    Place,
    /// Warn the owner.
    Warn,
}

/// What the agent must do. See the crate doc for what each means.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Freeze the task; feedback expected.
    Freeze {
        /// The task.
        id: TaskId,
    },
    /// Thaw the task; feedback expected.
    Thaw {
        /// The task.
        id: TaskId,
    },
    /// SIGSTOP the task's processes (a freeze timed out).
    Stop {
        /// The task.
        id: TaskId,
    },
    /// SIGTERM; a `Kill` follows after `kill_grace_ms` unless it exits.
    Terminate {
        /// The task.
        id: TaskId,
    },
    /// SIGKILL (or `cgroup.kill`).
    Kill {
        /// The task.
        id: TaskId,
    },
    /// Bind the task to `gpu`; once per task: at arrival, or under late binding
    /// when a queued task can run (the agent then starts the task it held).
    Place {
        /// The task.
        id: TaskId,
        /// The GPU index.
        gpu: u32,
    },
    /// Tell the task's owner its session ends in `remaining_ms`.
    Warn {
        /// The task.
        id: TaskId,
        /// Time left before the session limit.
        remaining_ms: u64,
    },
    /// A session ended by a rule: the 4003 record of a duration limit, or the
    /// 4004 one of the overload rule; emitted with the Kill/Terminate.
    Enforce {
        /// The task.
        id: TaskId,
        /// What to log and report.
        record: EnforcementRecord,
    },
}

impl Action {
    /// The task the action is for.
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
    /// [`DURATION_EXCEEDED_CODE`].
    pub code: u32,
    /// `session duration exceeded limit`.
    pub message: String,
    /// The limit and the elapsed time.
    pub data: EnforcementData,
}

/// The `data` of an [`EnforcementRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnforcementData {
    /// The session limit.
    pub allowed_ms: u64,
    /// Elapsed wall time since arrival at the input that enforced it.
    pub actual_ms: u64,
    /// `server_enforced` (`overloaded` for the overload rule). Not a
    /// transition [`Reason`](crate::Reason): the record's own text, kept as the
    /// clients that read it expect.
    pub reason: String,
    /// The overload rule's other two figures; absent from a 4003 record.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub overload: Option<OverloadData>,
}

/// What the overload rule saw when it truncated a session (with
/// `allowed_ms` its session threshold and `actual_ms` the session's length).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverloadData {
    /// The GPU.
    pub gpu: u32,
    /// Its memory peak during the session, in thousandths of its capacity
    /// (971: 97.1 %).
    pub mem_peak_permille: u32,
    /// The rule's memory threshold, in percent of capacity.
    pub mem_peak_min_pct: u32,
    /// How many tasks waited for the GPU.
    pub waiting: u32,
    /// The rule's queue threshold.
    pub min_waiting: u32,
}

impl EnforcementRecord {
    /// The 4003 record for a session limit of `allowed_ms` enforced at `actual_ms`.
    pub fn duration_exceeded(allowed_ms: u64, actual_ms: u64) -> Self {
        EnforcementRecord {
            code: DURATION_EXCEEDED_CODE,
            message: "session duration exceeded limit".to_string(),
            data: EnforcementData {
                allowed_ms,
                actual_ms,
                reason: "server_enforced".to_string(),
                overload: None,
            },
        }
    }

    /// The 4004 record of the overload rule: the session had run `actual_ms`
    /// (past `rule.min_session_ms`) when its GPU's memory peak was
    /// `mem_peak_permille` thousandths of capacity with `waiting` tasks waiting.
    pub fn overloaded(
        rule: &crate::config::OverloadRule,
        actual_ms: u64,
        gpu: u32,
        mem_peak_permille: u32,
        waiting: u32,
    ) -> Self {
        EnforcementRecord {
            code: OVERLOADED_CODE,
            message: "session truncated: GPU overloaded".to_string(),
            data: EnforcementData {
                allowed_ms: rule.min_session_ms,
                actual_ms,
                reason: "overloaded".to_string(),
                overload: Some(OverloadData {
                    gpu,
                    mem_peak_permille,
                    mem_peak_min_pct: rule.mem_peak_pct,
                    waiting,
                    min_waiting: rule.min_waiting,
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn overload_record_names_the_three_figures_and_reads_back() {
        let record =
            EnforcementRecord::overloaded(&crate::config::OverloadRule::default(), 215, 0, 971, 10);
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(
            json,
            r#"{"code":4004,"message":"session truncated: GPU overloaded","data":{"allowed_ms":200,"actual_ms":215,"reason":"overloaded","gpu":0,"mem_peak_permille":971,"mem_peak_min_pct":95,"waiting":10,"min_waiting":8}}"#
        );
        assert_eq!(
            serde_json::from_str::<EnforcementRecord>(&json).unwrap(),
            record
        );
        let old = EnforcementRecord::duration_exceeded(1, 2);
        let json = serde_json::to_string(&old).unwrap();
        assert_eq!(
            serde_json::from_str::<EnforcementRecord>(&json).unwrap(),
            old
        );
    }

    fn every_action() -> Vec<Action> {
        vec![
            Action::Freeze { id: 1 },
            Action::Thaw { id: 1 },
            Action::Stop { id: 1 },
            Action::Terminate { id: 1 },
            Action::Kill { id: 1 },
            Action::Place { id: 1, gpu: 2 },
            Action::Warn {
                id: 1,
                remaining_ms: 300,
            },
            Action::Enforce {
                id: 1,
                record: EnforcementRecord::duration_exceeded(1000, 1001),
            },
        ]
    }

    #[test]
    fn every_action_serializes_exactly_as_before() {
        let expected = [
            r#"{"Freeze":{"id":1}}"#,
            r#"{"Thaw":{"id":1}}"#,
            r#"{"Stop":{"id":1}}"#,
            r#"{"Terminate":{"id":1}}"#,
            r#"{"Kill":{"id":1}}"#,
            r#"{"Place":{"id":1,"gpu":2}}"#,
            r#"{"Warn":{"id":1,"remaining_ms":300}}"#,
            r#"{"Enforce":{"id":1,"record":{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":1000,"actual_ms":1001,"reason":"server_enforced"}}}}"#,
        ];
        let actions = every_action();
        assert_eq!(actions.len(), expected.len());
        for (action, json) in actions.iter().zip(expected) {
            assert_eq!(serde_json::to_string(action).unwrap(), json);
            assert_eq!(&serde_json::from_str::<Action>(json).unwrap(), action);
        }
    }

    #[test]
    fn accessors_name_the_task_and_the_feedback_kind() {
        let kinds: Vec<Option<ActionKind>> = every_action().iter().map(Action::kind).collect();
        assert_eq!(
            kinds,
            vec![
                Some(ActionKind::Freeze),
                Some(ActionKind::Thaw),
                Some(ActionKind::Stop),
                Some(ActionKind::Terminate),
                Some(ActionKind::Kill),
                Some(ActionKind::Place),
                Some(ActionKind::Warn),
                None,
            ]
        );
        assert!(every_action().iter().all(|a| a.task() == 1));
    }
}
