//! What the core tells the agent: the [`Action`]s of an output, the [`ActionKind`]
//! that feedback (`Confirmed` / `TimedOut`) names, and the 4003
//! [`EnforcementRecord`] of a session-duration enforcement. See "Actions" in the
//! crate doc for what the agent does with each.

use serde::{Deserialize, Serialize};

use crate::TaskId;

/// The code of the session-duration enforcement record.
pub const DURATION_EXCEEDED_CODE: u32 = 4003;

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
    /// Session duration exceeded: the 4003 record, emitted with the Kill/Terminate.
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
    /// `server_enforced`. Not a transition [`Reason`](crate::Reason): the record's
    /// own text, kept as the clients that read it expect.
    pub reason: String,
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
