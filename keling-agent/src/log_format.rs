//! The scheduler's logs as data: every line of the scheduling log ([`SchedLine`]:
//! a [`TransitionLine`] or a typed [`Record`]) and the input log's header
//! ([`InputLogHeader`]; the input log's other lines are serde
//! [`keling_sched::Input`]s).
//!
//! The one definition of both formats: the writer (`sched::log`) serializes these
//! types and every reader (`replay`, `report`, `keling trace --sched-log`)
//! deserializes them, so a field added here is written and read alike. No I/O and
//! nothing else of the agent: the writer and the readers import this module, never
//! each other. The bytes are a contract with logs already on disk: field names and
//! their order are what the log has always had (a test below pins one line of
//! each kind).
use keling_sched::{EnforcementRecord, Policy, Reason, SchedConfig, TaskId, TaskState, Transition};
use serde::{Deserialize, Serialize};

/// The header line `keling replay` reads first when there is one:
/// `{"keling_input_log":1,"policy":"hybrid","config":{...},"core_rules":1}`. Synthetic runs write
/// it, and so does the agent, at the top of every input-log file it writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputLogHeader {
    /// The header's format version: [`INPUT_LOG_VERSION`].
    pub keling_input_log: u32,
    /// The policy that made the recorded decisions.
    #[serde(default)]
    pub policy: Policy,
    /// The core's configuration when the log was written.
    pub config: SchedConfig,
    /// The [`keling_sched::RULES_REVISION`] of the core that made the recorded
    /// decisions; absent in logs written before Keling recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_rules: Option<u32>,
}

/// The header format this agent writes and reads.
pub const INPUT_LOG_VERSION: u32 = 1;

/// One line of the scheduling log: a transition (no `type` key) or a record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SchedLine {
    Transition(TransitionLine),
    Record(Record),
}

/// A task's state transition, as the scheduling log has it: one line per
/// [`Transition`] the core made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionLine {
    pub event_id: u64,
    /// `"RUNNING→PREEMPTED"`.
    pub state_transition: String,
    pub timestamp_ns: u64,
    pub task: TaskId,
    pub name: String,
    pub pid: u32,
    pub gpu: Option<u32>,
    pub priority: u8,
    pub reason: Reason,
    pub exit_code: Option<i32>,
}

impl From<&Transition> for TransitionLine {
    fn from(t: &Transition) -> Self {
        TransitionLine {
            event_id: t.event_id,
            state_transition: t.state_transition(),
            timestamp_ns: t.timestamp_ns,
            task: t.task,
            name: t.name.clone(),
            pid: t.pid,
            gpu: t.gpu,
            priority: t.priority,
            reason: t.reason,
            exit_code: t.exit_code,
        }
    }
}

impl TransitionLine {
    /// The states either side of the arrow; `None` for a name no state has.
    pub fn states(&self) -> Option<(TaskState, TaskState)> {
        let (from, to) = self.state_transition.split_once('\u{2192}')?;
        Some((state_named(from)?, state_named(to)?))
    }
}

fn state_named(name: &str) -> Option<TaskState> {
    [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Preempted,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Archived,
    ]
    .into_iter()
    .find(|s| s.as_str() == name)
}

/// A line of the scheduling log that is not a transition: `{"type":"placement",...}`.
/// The `timestamp_ns` of records is the agent's CLOCK_MONOTONIC when it acted on
/// the decision, not the core's time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The task was given a GPU.
    Placement {
        task: TaskId,
        pid: u32,
        gpu: u32,
        timestamp_ns: u64,
    },
    /// The task nears its duration limit.
    Warning {
        task: TaskId,
        pid: u32,
        remaining_ms: u64,
        timestamp_ns: u64,
    },
    /// The task's limit was enforced (the Kill or Terminate follows).
    Enforcement {
        task: TaskId,
        pid: u32,
        timestamp_ns: u64,
        record: EnforcementRecord,
    },
    /// A decision took longer than the timeout in force, or was never confirmed.
    /// A measurement, not a decision; it names no process.
    LateDecision {
        task: TaskId,
        action: String,
        end_to_end_ns: u64,
        timeout_ns: u64,
        confirmed: bool,
    },
    /// A record of a type this reader does not know (a newer agent's): kept
    /// readable, not a decision. Never written: serializing it is an error.
    #[serde(other, skip_serializing)]
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line of each kind, as the agent has always written them: each reads as
    /// the typed line and writes back to the same bytes.
    #[test]
    fn every_kind_of_line_round_trips_to_the_same_bytes() {
        let lines = [
            r#"{"event_id":3,"state_transition":"RUNNING→PREEMPTED","timestamp_ns":50,"task":2,"name":"job \"2\"","pid":77,"gpu":0,"priority":8,"reason":"preempted_by_higher_priority","exit_code":null}"#,
            r#"{"event_id":9,"state_transition":"PREEMPTED→FAILED","timestamp_ns":1200000000,"task":2,"name":"x","pid":77,"gpu":null,"priority":1,"reason":"exited_with_error","exit_code":137}"#,
            r#"{"type":"placement","task":1,"pid":101,"gpu":3,"timestamp_ns":5}"#,
            r#"{"type":"warning","task":1,"pid":101,"remaining_ms":400,"timestamp_ns":6}"#,
            r#"{"type":"enforcement","task":1,"pid":101,"timestamp_ns":7,"record":{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":1000,"actual_ms":1002,"reason":"server_enforced"}}}"#,
            r#"{"type":"late_decision","task":1,"action":"freeze","end_to_end_ns":30000000,"timeout_ns":23800000,"confirmed":true}"#,
        ];
        for line in lines {
            let parsed: SchedLine = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&parsed).unwrap(), line);
        }
        let kinds: Vec<&str> = lines
            .iter()
            .map(|l| match serde_json::from_str(l).unwrap() {
                SchedLine::Transition(_) => "transition",
                SchedLine::Record(Record::Placement { .. }) => "placement",
                SchedLine::Record(Record::Warning { .. }) => "warning",
                SchedLine::Record(Record::Enforcement { .. }) => "enforcement",
                SchedLine::Record(Record::LateDecision { .. }) => "late_decision",
                SchedLine::Record(Record::Other) => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "transition",
                "transition",
                "placement",
                "warning",
                "enforcement",
                "late_decision"
            ]
        );
    }

    /// The enforcement line above is the core's own record, unchanged.
    #[test]
    fn an_enforcement_line_carries_the_cores_record() {
        let r = Record::Enforcement {
            task: 1,
            pid: 101,
            timestamp_ns: 7,
            record: EnforcementRecord::duration_exceeded(1000, 1002),
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"type":"enforcement","task":1,"pid":101,"timestamp_ns":7,"record":{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":1000,"actual_ms":1002,"reason":"server_enforced"}}}"#
        );
    }

    #[test]
    fn unknown_records_read_as_other_and_are_never_written() {
        let line: SchedLine = serde_json::from_str(r#"{"type":"heartbeat","ts_ns":1}"#).unwrap();
        assert_eq!(line, SchedLine::Record(Record::Other));
        assert!(serde_json::to_string(&line).is_err());
    }

    #[test]
    fn a_transition_line_names_its_states() {
        let t = Transition {
            event_id: 1,
            task: 4,
            name: "x".into(),
            pid: 9,
            gpu: Some(0),
            priority: 3,
            from: TaskState::Running,
            to: TaskState::Preempted,
            reason: Reason::RoundRobin,
            timestamp_ns: 10,
            exit_code: None,
        };
        let line = TransitionLine::from(&t);
        assert_eq!(
            line.states(),
            Some((TaskState::Running, TaskState::Preempted))
        );
        let odd = TransitionLine {
            state_transition: "RUNNING→ASLEEP".into(),
            ..line
        };
        assert_eq!(odd.states(), None);
    }
}
