//! Keling's scheduler decisions as a trace shows them: read back from the running
//! agent's scheduling log (`keling run --sched-log FILE`, followed by `keling trace
//! --sched-log FILE`). Only parsing here, of [`crate::log_format`]'s lines; the
//! caller reads the file.
use serde_json::json;

use crate::log_format::{Record, SchedLine};

/// One line of the scheduling log that concerns a process.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The log's `timestamp_ns` (the kernel's CLOCK_MONOTONIC, like the trace's
    /// events); for a late-decision record, which has none, the time it was read.
    pub ts_ns: u64,
    /// The task's process (for a late decision: the last process seen for the task).
    pub pid: u32,
    pub task: u64,
    pub what: DecisionKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DecisionKind {
    /// A state transition, e.g. `RUNNING→PREEMPTED` with its reason.
    Transition {
        from: String,
        to: String,
        reason: String,
        exit_code: Option<i64>,
    },
    /// A decision that took longer than the timeout in force.
    Late {
        action: String,
        end_to_end_ns: u64,
        timeout_ns: u64,
        confirmed: bool,
    },
    /// A placement, warning or enforcement record (`type` names it).
    Other { kind: String, detail: String },
}

impl Decision {
    /// Whether this decision froze the task (it left the GPU for another).
    pub fn freezes(&self) -> bool {
        matches!(&self.what, DecisionKind::Transition { to, .. } if to == "PREEMPTED")
    }

    /// Whether this decision let a frozen task run again (or ended it).
    pub fn thaws(&self) -> bool {
        matches!(&self.what, DecisionKind::Transition { from, .. } if from == "PREEMPTED")
    }

    /// One line for people.
    pub fn text(&self) -> String {
        match &self.what {
            DecisionKind::Transition {
                from,
                to,
                reason,
                exit_code,
            } => {
                let mut t = format!("keling: task {} {from}→{to} ({reason})", self.task);
                if let Some(c) = exit_code {
                    t.push_str(&format!(" exit code {c}"));
                }
                t
            }
            DecisionKind::Late {
                action,
                end_to_end_ns,
                timeout_ns,
                confirmed,
            } => format!(
                "keling: task {} {action} took {:.3} ms, over the {:.3} ms timeout{}",
                self.task,
                *end_to_end_ns as f64 / 1e6,
                *timeout_ns as f64 / 1e6,
                if *confirmed { "" } else { " (not confirmed)" }
            ),
            DecisionKind::Other { kind, detail } => {
                format!("keling: task {} {kind} {detail}", self.task)
            }
        }
    }
}

/// Follows the scheduling log's lines: remembers which process each task is, so
/// late-decision records (which name only the task) can be placed.
#[derive(Default)]
pub struct SchedLogReader {
    task_pid: std::collections::BTreeMap<u64, u32>,
}

impl SchedLogReader {
    /// The decision on one line, or None for a line that is not one (not a
    /// scheduling-log line, a record of a type this agent does not know, or a late
    /// decision of a task not seen yet). `now_ns` stands in for records that carry
    /// no timestamp.
    pub fn line(&mut self, line: &str, now_ns: u64) -> Option<Decision> {
        let line: SchedLine = serde_json::from_str(line).ok()?;
        let (task, pid, ts_ns, what) = match line {
            SchedLine::Transition(t) => {
                let (from, to) = t.state_transition.split_once('\u{2192}')?;
                let what = DecisionKind::Transition {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    reason: t.reason.as_str().to_owned(),
                    exit_code: t.exit_code.map(i64::from),
                };
                (t.task, Some(t.pid), t.timestamp_ns, what)
            }
            SchedLine::Record(Record::LateDecision {
                task,
                action,
                end_to_end_ns,
                timeout_ns,
                confirmed,
            }) => {
                let what = DecisionKind::Late {
                    action,
                    end_to_end_ns,
                    timeout_ns,
                    confirmed,
                };
                (task, None, now_ns, what)
            }
            // `detail` is the record's other fields as JSON, as the log has them.
            SchedLine::Record(Record::Placement {
                task,
                pid,
                gpu,
                timestamp_ns,
            }) => {
                let detail = json!({ "gpu": gpu });
                (task, Some(pid), timestamp_ns, other("placement", detail))
            }
            SchedLine::Record(Record::Warning {
                task,
                pid,
                remaining_ms,
                timestamp_ns,
            }) => {
                let detail = json!({ "remaining_ms": remaining_ms });
                (task, Some(pid), timestamp_ns, other("warning", detail))
            }
            SchedLine::Record(Record::Enforcement {
                task,
                pid,
                timestamp_ns,
                record,
            }) => {
                let detail = json!({ "record": record });
                (task, Some(pid), timestamp_ns, other("enforcement", detail))
            }
            SchedLine::Record(Record::Other) => return None,
        };
        let pid = match pid {
            Some(p) => {
                self.task_pid.insert(task, p);
                p
            }
            None => *self.task_pid.get(&task)?,
        };
        Some(Decision {
            ts_ns,
            pid,
            task,
            what,
        })
    }
}

fn other(kind: &str, detail: serde_json::Value) -> DecisionKind {
    DecisionKind::Other {
        kind: kind.to_owned(),
        detail: detail.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_and_late_decisions() {
        let mut r = SchedLogReader::default();
        let d = r
            .line(
                r#"{"event_id":3,"state_transition":"RUNNING→PREEMPTED","timestamp_ns":50,"task":2,"name":"x","pid":77,"gpu":0,"priority":8,"reason":"preempted_by_higher_priority","exit_code":null}"#,
                1,
            )
            .unwrap();
        assert_eq!((d.ts_ns, d.pid, d.task), (50, 77, 2));
        assert!(d.freezes() && !d.thaws());
        assert_eq!(
            d.text(),
            "keling: task 2 RUNNING→PREEMPTED (preempted_by_higher_priority)"
        );
        let late = r
            .line(
                r#"{"type":"late_decision","task":2,"action":"freeze","end_to_end_ns":30000000,"timeout_ns":23800000,"confirmed":true}"#,
                99,
            )
            .unwrap();
        assert_eq!((late.ts_ns, late.pid), (99, 77));
        assert_eq!(
            late.text(),
            "keling: task 2 freeze took 30.000 ms, over the 23.800 ms timeout"
        );
        // A late decision of a task never seen cannot be placed.
        assert!(
            r.line(
                r#"{"type":"late_decision","task":9,"action":"thaw","end_to_end_ns":1,"timeout_ns":1,"confirmed":false}"#,
                1
            )
            .is_none()
        );
        assert!(r.line("not json", 1).is_none());
        // A record of a type this agent does not know is no decision it can show.
        assert!(
            r.line(r#"{"type":"heartbeat","task":2,"pid":77}"#, 1)
                .is_none()
        );
    }

    /// A placement, warning or enforcement shows its fields other than the
    /// task, process and time, as the log has them.
    #[test]
    fn other_records_show_the_rest_of_their_line() {
        let mut r = SchedLogReader::default();
        for (line, kind) in [
            (
                r#"{"type":"placement","task":1,"pid":101,"gpu":3,"timestamp_ns":5}"#,
                "placement",
            ),
            (
                r#"{"type":"warning","task":1,"pid":101,"remaining_ms":400,"timestamp_ns":6}"#,
                "warning",
            ),
            (
                r#"{"type":"enforcement","task":1,"pid":101,"timestamp_ns":7,"record":{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":1000,"actual_ms":1002,"reason":"server_enforced"}}}"#,
                "enforcement",
            ),
        ] {
            let d = r.line(line, 0).unwrap();
            // The line, less the keys the decision has already.
            let mut rest: serde_json::Value = serde_json::from_str(line).unwrap();
            for k in ["type", "task", "pid", "timestamp_ns"] {
                rest.as_object_mut().unwrap().remove(k);
            }
            assert_eq!(
                d.what,
                DecisionKind::Other {
                    kind: kind.into(),
                    detail: rest.to_string()
                }
            );
            assert_eq!((d.task, d.pid), (1, 101));
        }
    }
}
