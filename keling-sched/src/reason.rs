//! Why a task changed state: the [`Reason`] of every [`Transition`](crate::Transition)
//! and of [`TaskView::ending_reason`](crate::TaskView::ending_reason).
//!
//! The scheduling log writes a reason as its snake_case name (`placed`,
//! `preempted_by_higher_priority`, ...); serde and [`Reason::as_str`] give the same
//! text, so the log's format does not depend on which one a writer uses.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a task changed state. See "States" in the crate doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// `Pending → Running`: the task arrived and ranks among the slot holders.
    Placed,
    /// `Pending → Preempted`: the task arrived without a slot and was frozen.
    Queued,
    /// `Running → Preempted`: its quantum was used up and an active task of its
    /// priority waited.
    QuantumExpired,
    /// `Running → Preempted`: it was idle while an active task waited. Only in
    /// logs of older versions, which froze such a task; the core now lets an
    /// idle task yield its slot without freezing it ([`TaskView::yielded`](crate::TaskView::yielded)).
    /// Kept so those logs still read.
    Idle,
    /// `Running → Preempted`: a task of higher priority took the slot.
    PreemptedByHigherPriority,
    /// `Running → Preempted`: an equal-priority task is ahead in the rotation.
    RoundRobin,
    /// `Preempted → Running`: the thaw was confirmed.
    Resumed,
    /// `Preempted → Running`: the thaw timed out twice; the task is assumed to run.
    ThawUnconfirmed,
    /// `→ Completed`: exit code 0.
    Exited,
    /// `→ Failed`: a non-zero exit code.
    ExitedWithError,
    /// `→ Failed`: ended by Keling for running past its session duration limit.
    DurationLimit,
    /// `→ Failed`: ended by Keling to free memory for a higher-priority task.
    EvictedForMemory,
    /// `→ Failed`: ended by Keling for holding more than its memory quota.
    OverQuota,
    /// `Completed | Failed → Archived`, on the tick after it finished.
    Archived,
    /// `Running → Preempted` under memory sharing: the memory it may still
    /// take no longer fits beside the tasks that rank before it on its GPU.
    NoMemory,
    /// `→ Failed`: truncated by the overload rule (its GPU's memory peak, the
    /// tasks waiting for it and how long the session has run all past their
    /// thresholds at once).
    Overloaded,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 16] = [
        Reason::Placed,
        Reason::Queued,
        Reason::QuantumExpired,
        Reason::Idle,
        Reason::PreemptedByHigherPriority,
        Reason::RoundRobin,
        Reason::Resumed,
        Reason::ThawUnconfirmed,
        Reason::Exited,
        Reason::ExitedWithError,
        Reason::DurationLimit,
        Reason::EvictedForMemory,
        Reason::OverQuota,
        Reason::Archived,
        Reason::NoMemory,
        Reason::Overloaded,
    ];

    /// The name the scheduling log uses: `preempted_by_higher_priority`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Placed => "placed",
            Reason::Queued => "queued",
            Reason::QuantumExpired => "quantum_expired",
            Reason::Idle => "idle",
            Reason::PreemptedByHigherPriority => "preempted_by_higher_priority",
            Reason::RoundRobin => "round_robin",
            Reason::Resumed => "resumed",
            Reason::ThawUnconfirmed => "thaw_unconfirmed",
            Reason::Exited => "exited",
            Reason::ExitedWithError => "exited_with_error",
            Reason::DurationLimit => "duration_limit",
            Reason::EvictedForMemory => "evicted_for_memory",
            Reason::OverQuota => "over_quota",
            Reason::Archived => "archived",
            Reason::NoMemory => "no_memory",
            Reason::Overloaded => "overloaded",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Fails to compile when a variant is added, as a reminder to add it to `ALL`
    /// (the test below then checks the count).
    fn position(reason: Reason) -> usize {
        match reason {
            Reason::Placed => 0,
            Reason::Queued => 1,
            Reason::QuantumExpired => 2,
            Reason::Idle => 3,
            Reason::PreemptedByHigherPriority => 4,
            Reason::RoundRobin => 5,
            Reason::Resumed => 6,
            Reason::ThawUnconfirmed => 7,
            Reason::Exited => 8,
            Reason::ExitedWithError => 9,
            Reason::DurationLimit => 10,
            Reason::EvictedForMemory => 11,
            Reason::OverQuota => 12,
            Reason::Archived => 13,
            Reason::NoMemory => 14,
            Reason::Overloaded => 15,
        }
    }

    #[test]
    fn all_lists_every_reason_once_in_order() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(position(reason), i, "{reason:?}");
        }
    }

    /// The texts the scheduling log has always had.
    #[test]
    fn names_are_the_logs_snake_case_texts() {
        let names: Vec<&str> = Reason::ALL.into_iter().map(Reason::as_str).collect();
        assert_eq!(
            names,
            [
                "placed",
                "queued",
                "quantum_expired",
                "idle",
                "preempted_by_higher_priority",
                "round_robin",
                "resumed",
                "thaw_unconfirmed",
                "exited",
                "exited_with_error",
                "duration_limit",
                "evicted_for_memory",
                "over_quota",
                "archived",
                "no_memory",
                "overloaded",
            ]
        );
        assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len());
    }

    #[test]
    fn serde_and_display_agree_with_as_str() {
        for reason in Reason::ALL {
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
            assert_eq!(reason.to_string(), reason.as_str());
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), reason);
        }
        assert!(serde_json::from_str::<Reason>("\"Placed\"").is_err());
    }
}
