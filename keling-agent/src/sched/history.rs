//! What the agent remembers of each task for the people whose jobs it schedules:
//! its transitions and its decisions with their latencies (`keling status TASK`),
//! who owns it after its process is gone, and since when it is in its state (why
//! a preempted task waits, how long a resumed one was frozen).
//!
//! Bounded: the last [`HISTORY_MAX`] transitions and decisions per task, and only
//! tasks the scheduler core still knows (the daemon forgets the others with
//! [`Histories::retain`] when it prunes archived tasks). Nothing here decides
//! anything; the core never reads it.
use std::collections::{HashMap, VecDeque};

use keling_sched::{ActionKind, Reason, TaskId, TaskState, TaskView, Transition};

use crate::{
    control::{DecisionRecord, HISTORY_MAX, TaskRef, Waiting},
    latency::{DecisionTimes, StageDurations, Verdict},
};

/// One task's history.
#[derive(Debug, Default)]
pub struct History {
    /// Whose task it is (kept after its process is gone).
    pub uid: Option<u32>,
    pub transitions: VecDeque<Transition>,
    pub decisions: VecDeque<DecisionRecord>,
    pub transitions_dropped: u64,
    pub decisions_dropped: u64,
    /// When it entered its present state (the core's clock).
    pub state_since_ns: u64,
    /// Its last move to PREEMPTED, while it is preempted.
    pub preempted: Option<Reason>,
}

/// Every task's [`History`].
#[derive(Debug, Default)]
pub struct Histories(HashMap<TaskId, History>);

impl Histories {
    /// Notes who owns a task (at launch or adoption).
    pub fn owner(&mut self, id: TaskId, uid: u32) {
        self.0.entry(id).or_default().uid = Some(uid);
    }

    /// Records a transition; returns how long the task was in the state it left
    /// (ns).
    pub fn transition(&mut self, t: &Transition) -> u64 {
        let h = self.0.entry(t.task).or_default();
        let was_for_ns = if h.transitions.is_empty() {
            0
        } else {
            t.timestamp_ns.saturating_sub(h.state_since_ns)
        };
        h.state_since_ns = t.timestamp_ns;
        h.preempted = (t.to == TaskState::Preempted).then_some(t.reason);
        if h.transitions.len() == HISTORY_MAX {
            h.transitions.pop_front();
            h.transitions_dropped += 1;
        }
        h.transitions.push_back(t.clone());
        was_for_ns
    }

    /// Records one decision about `id` and its latency.
    pub fn decision(&mut self, id: TaskId, times: &DecisionTimes, verdict: &Verdict) {
        let h = self.0.entry(id).or_default();
        let d = StageDurations::of(times);
        if h.decisions.len() == HISTORY_MAX {
            h.decisions.pop_front();
            h.decisions_dropped += 1;
        }
        h.decisions.push_back(DecisionRecord {
            action: times.action.clone(),
            decided_ns: times.decided_ns,
            delivery_ns: d.delivery_ns,
            decision_ns: d.decision_ns,
            actuation_ns: d.actuation_ns,
            confirmation_ns: d.confirmation_ns,
            end_to_end_ns: d.end_to_end_ns,
            timeout_ns: verdict.timeout_ns,
            late: verdict.late,
        });
    }

    pub fn get(&self, id: TaskId) -> Option<&History> {
        self.0.get(&id)
    }

    /// Forgets the tasks `keep` says no to.
    pub fn retain(&mut self, mut keep: impl FnMut(TaskId) -> bool) {
        self.0.retain(|&id, _| keep(id));
    }
}

/// The tasks that hold the slots of `task`'s GPU now, or are about to (a thaw in
/// flight), best ranked first: what a frozen task yielded to, or waits behind.
pub fn slot_holders(views: &[TaskView], task: &TaskView) -> Vec<TaskRef> {
    let mut holders: Vec<&TaskView> = views
        .iter()
        .filter(|v| v.spec.id != task.spec.id && v.gpu == task.gpu && v.state.is_live())
        .filter(|v| match v.in_flight {
            Some(ActionKind::Thaw) => true,
            Some(ActionKind::Freeze | ActionKind::Stop) => false,
            // A yielded task runs without a slot.
            _ => matches!(v.state, TaskState::Running | TaskState::Pending) && !v.yielded,
        })
        .collect();
    holders.sort_by_key(|v| (!v.wants_gpu, v.spec.priority, v.spec.id));
    holders
        .into_iter()
        .map(|v| TaskRef {
            task: v.spec.id,
            name: v.spec.name.clone(),
            priority: v.spec.priority,
        })
        .collect()
}

/// Why a preempted task waits; `None` for a task that is not preempted.
pub fn waiting(
    views: &[TaskView],
    task: &TaskView,
    history: Option<&History>,
    now_ns: u64,
) -> Option<Waiting> {
    if task.state != TaskState::Preempted {
        return None;
    }
    let since_ns = history.map_or(task.arrived_ns, |h| h.state_since_ns);
    Some(Waiting {
        reason: history.and_then(|h| h.preempted).unwrap_or(Reason::Queued),
        behind: slot_holders(views, task),
        for_ms: now_ns.saturating_sub(since_ns) / 1_000_000,
    })
}

#[cfg(test)]
mod tests {
    use keling_sched::{Class, TaskSpec};

    use super::*;

    fn view(id: TaskId, priority: u8, gpu: u32, state: TaskState) -> TaskView {
        TaskView {
            spec: TaskSpec {
                id,
                pid: 100 + id as u32,
                name: format!("t{id}"),
                priority,
                gpu: Some(gpu),
                mem_quota_bytes: None,
                max_duration_ms: None,
                grace_ms: None,
                hard_kill: None,
                expected_runtime_ms: None,
            },
            state,
            gpu: Some(gpu),
            mem_bytes: Default::default(),
            mem_unsure: false,
            on_gpu_ns: 0,
            on_gpu_ms: 0,
            wants_gpu: true,
            yielded: false,
            class: Class::Background,
            quantum_ms: 100,
            in_flight: None,
            ending_reason: None,
            arrived_ns: 0,
            started_ns: None,
            finished_ns: None,
            exit_code: None,
        }
    }

    #[test]
    fn holders_are_the_running_tasks_of_the_same_gpu_best_first() {
        let me = view(1, 8, 0, TaskState::Preempted);
        let mut thawing = view(4, 8, 0, TaskState::Preempted);
        thawing.in_flight = Some(ActionKind::Thaw);
        let mut freezing = view(5, 2, 0, TaskState::Running);
        freezing.in_flight = Some(ActionKind::Freeze);
        let mut idle = view(6, 0, 0, TaskState::Running);
        idle.wants_gpu = false;
        let views = vec![
            me.clone(),
            view(2, 4, 0, TaskState::Running),
            view(3, 1, 1, TaskState::Running),
            thawing,
            freezing,
            idle,
            view(7, 0, 0, TaskState::Completed),
        ];
        let ids: Vec<u64> = slot_holders(&views, &me).iter().map(|r| r.task).collect();
        assert_eq!(ids, [2, 4, 6]);
    }

    #[test]
    fn a_preempted_task_waits_for_its_last_reason_since_it_was_frozen() {
        let mut h = Histories::default();
        let t = |ts, from, to, reason| Transition {
            event_id: 1,
            task: 1,
            name: "t1".into(),
            pid: 101,
            gpu: Some(0),
            priority: 8,
            from,
            to,
            reason,
            timestamp_ns: ts,
            exit_code: None,
        };
        assert_eq!(
            h.transition(&t(
                1_000,
                TaskState::Pending,
                TaskState::Running,
                Reason::Placed
            )),
            0
        );
        assert_eq!(
            h.transition(&t(
                5_000_000,
                TaskState::Running,
                TaskState::Preempted,
                Reason::PreemptedByHigherPriority
            )),
            4_999_000
        );
        let me = view(1, 8, 0, TaskState::Preempted);
        let views = vec![me.clone(), view(2, 3, 0, TaskState::Running)];
        let w = waiting(&views, &me, h.get(1), 1_005_000_000).unwrap();
        assert_eq!(w.reason, Reason::PreemptedByHigherPriority);
        assert_eq!(w.for_ms, 1000);
        assert_eq!(w.behind.len(), 1);
        assert_eq!(w.behind[0].task, 2);
        assert!(waiting(&views, &views[1], None, 0).is_none());
        assert_eq!(
            h.transition(&t(
                2_005_000_000,
                TaskState::Preempted,
                TaskState::Running,
                Reason::Resumed
            )),
            2_000_000_000
        );
        assert_eq!(h.get(1).unwrap().preempted, None);
    }

    #[test]
    fn history_keeps_the_most_recent_entries() {
        let mut h = Histories::default();
        let times = DecisionTimes {
            action: "freeze".into(),
            event_ns: 1,
            received_ns: 2,
            decided_ns: 4,
            actuated_ns: 8,
            confirmed_ns: Some(16),
        };
        let verdict = Verdict {
            late: false,
            end_to_end_ns: 15,
            timeout_ns: 100,
        };
        for _ in 0..HISTORY_MAX + 3 {
            h.decision(1, &times, &verdict);
        }
        let h1 = h.get(1).unwrap();
        assert_eq!(h1.decisions.len(), HISTORY_MAX);
        assert_eq!(h1.decisions_dropped, 3);
        let d = &h1.decisions[0];
        assert_eq!(
            (
                d.delivery_ns,
                d.decision_ns,
                d.actuation_ns,
                d.confirmation_ns,
                d.end_to_end_ns
            ),
            (1, 2, 4, Some(8), 15)
        );
        h.retain(|id| id != 1);
        assert!(h.get(1).is_none());
    }
}
