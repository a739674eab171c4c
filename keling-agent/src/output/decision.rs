//! Keling's scheduler decisions as a trace shows them: read back from the running
//! agent's scheduling log (`keling run --sched-log FILE`, followed by `keling trace
//! --sched-log FILE`). Only parsing here; the caller reads the file.
use serde_json::Value;

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
    /// The decision on one line, or None for a line that is not one (or not JSON).
    /// `now_ns` stands in for records that carry no timestamp.
    pub fn line(&mut self, line: &str, now_ns: u64) -> Option<Decision> {
        let v: Value = serde_json::from_str(line).ok()?;
        let task = v["task"].as_u64()?;
        let pid = match v["pid"].as_u64() {
            Some(p) => {
                self.task_pid.insert(task, p as u32);
                p as u32
            }
            None => *self.task_pid.get(&task)?,
        };
        let ts_ns = v["timestamp_ns"].as_u64().unwrap_or(now_ns);
        let what = if let Some(t) = v["state_transition"].as_str() {
            let (from, to) = t.split_once('→')?;
            DecisionKind::Transition {
                from: from.to_owned(),
                to: to.to_owned(),
                reason: v["reason"].as_str().unwrap_or("").to_owned(),
                exit_code: v["exit_code"].as_i64(),
            }
        } else {
            let kind = v["type"].as_str()?.to_owned();
            if kind == "late_decision" {
                DecisionKind::Late {
                    action: v["action"].as_str().unwrap_or("").to_owned(),
                    end_to_end_ns: v["end_to_end_ns"].as_u64().unwrap_or(0),
                    timeout_ns: v["timeout_ns"].as_u64().unwrap_or(0),
                    confirmed: v["confirmed"].as_bool().unwrap_or(false),
                }
            } else {
                let mut rest = v.clone();
                if let Some(o) = rest.as_object_mut() {
                    for k in ["type", "task", "pid", "timestamp_ns"] {
                        o.remove(k);
                    }
                }
                DecisionKind::Other {
                    kind,
                    detail: rest.to_string(),
                }
            }
        };
        Some(Decision {
            ts_ns,
            pid,
            task,
            what,
        })
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
            r.line(r#"{"type":"late_decision","task":9,"action":"thaw"}"#, 1)
                .is_none()
        );
        assert!(r.line("not json", 1).is_none());
    }
}
