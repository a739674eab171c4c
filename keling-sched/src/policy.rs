//! Which rule decides who holds a GPU's slots: the agent's [`Policy::Hybrid`], the
//! design articles' guarded variant of it ([`Policy::Goav`]), and two textbook
//! policies `keling replay` compares them with. See "Policies" in the crate doc.
//!
//! A policy changes only the priority a task is *scheduled* with and how the
//! slot holders are ranked; the transitions and [`TaskView`](crate::TaskView)s
//! still show the priority the task asked for. Placement, quotas, session duration
//! limits, feedback and escalation are the same under every policy.

use serde::{Deserialize, Serialize};

use crate::state::LOWEST_PRIORITY;

/// The one priority every task is scheduled with under [`Policy::Fifo`] and
/// [`Policy::RoundRobin`]: 7, the first background priority, so the round-robin
/// quantum is 100 ms.
pub const EQUAL_PRIORITY: u8 = 7;

/// [`Policy::Goav`]: a lower-priority task is a preferred preemption (and
/// eviction) candidate if it expects more than this much remaining time (unknown
/// counts as more).
pub const PREEMPTION_MIN_REMAINING_MS: u64 = 3_000;
/// [`Policy::Goav`]: the guard prefers candidates only when at least this many
/// qualify; with fewer, a higher priority preempts as under [`Policy::Hybrid`].
pub const PREEMPTION_MIN_CANDIDATES: usize = 2;

/// Who holds a GPU's slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The agent's policy: priorities, immediate preemption by a higher priority,
    /// round robin by quantum among equal priorities, idle tasks yield, memory
    /// pressure evicts lower priorities (the crate doc's "Who holds the slots").
    #[default]
    Hybrid,
    /// First come, first served per GPU, without preemption: the slots go to the
    /// live tasks placed on the GPU in arrival order, and a holder keeps its slot
    /// until it exits, idle or not. Priorities are ignored (every task is scheduled
    /// as [`EQUAL_PRIORITY`]), so there are no quantum rotations and memory
    /// pressure evicts nobody.
    Fifo,
    /// Round robin with equal priorities for everyone: the hybrid rules with every
    /// task scheduled as [`EQUAL_PRIORITY`]. Active tasks take turns by a 100 ms
    /// quantum, idle tasks yield, nobody preempts by priority, and memory pressure
    /// evicts nobody (no task has a lower priority than another).
    RoundRobin,
    /// The hybrid rules with the design articles' preemption guard as a
    /// preference: a task of lower priority is a candidate if it expects more
    /// than [`PREEMPTION_MIN_REMAINING_MS`] of remaining time; when at least
    /// [`PREEMPTION_MIN_CANDIDATES`] candidates qualify among the GPUs a higher
    /// priority may use, the victim is the candidate that ranks last, and
    /// otherwise the higher priority preempts as under the hybrid policy (a
    /// declared runtime never keeps it waiting). Idle tasks still yield, equal
    /// priorities still rotate; memory pressure evicts candidates first, and
    /// others when candidates cannot free enough.
    Goav,
}

impl Policy {
    /// The agent's policy and the two textbook ones, as `keling replay` first
    /// compared them (the agent's first). [`Policy::EVERY`] adds
    /// [`Policy::Goav`].
    pub const ALL: [Policy; 3] = [Policy::Hybrid, Policy::Fifo, Policy::RoundRobin];

    /// Every policy: the agent's, the guarded one, the two textbook ones.
    pub const EVERY: [Policy; 4] = [
        Policy::Hybrid,
        Policy::Goav,
        Policy::Fifo,
        Policy::RoundRobin,
    ];

    /// `hybrid`, `fifo`, `rr`, `goav`: the names `keling replay --policy` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            Policy::Hybrid => "hybrid",
            Policy::Fifo => "fifo",
            Policy::RoundRobin => "rr",
            Policy::Goav => "goav",
        }
    }

    /// The priority a task that asked for `priority` (already clamped) is
    /// scheduled with.
    pub fn scheduled_priority(self, priority: u8) -> u8 {
        match self {
            Policy::Hybrid | Policy::Goav => priority.min(LOWEST_PRIORITY),
            Policy::Fifo | Policy::RoundRobin => EQUAL_PRIORITY,
        }
    }

    /// Whether priority preemption goes through the articles' guard.
    pub fn guarded(self) -> bool {
        matches!(self, Policy::Goav)
    }

    /// Whether idle tasks yield their slot and used-up quanta rotate (everything
    /// but FIFO).
    pub fn preemptive(self) -> bool {
        !matches!(self, Policy::Fifo)
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_scheduled_priorities() {
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names, ["hybrid", "fifo", "rr"]);
        assert_eq!(Policy::Hybrid.scheduled_priority(3), 3);
        assert_eq!(Policy::Hybrid.scheduled_priority(99), 15);
        assert_eq!(Policy::Fifo.scheduled_priority(0), EQUAL_PRIORITY);
        assert_eq!(Policy::RoundRobin.scheduled_priority(15), EQUAL_PRIORITY);
        assert_eq!(crate::quantum_ms(EQUAL_PRIORITY), 100);
        assert_eq!(Policy::default(), Policy::Hybrid);
        assert_eq!(
            serde_json::to_string(&Policy::RoundRobin).unwrap(),
            "\"round_robin\""
        );
    }

    #[test]
    fn goav_is_the_hybrid_priorities_with_the_guard() {
        assert_eq!(Policy::Goav.as_str(), "goav");
        assert_eq!(Policy::Goav.scheduled_priority(3), 3);
        assert!(Policy::Goav.preemptive() && Policy::Goav.guarded());
        assert!(!Policy::Hybrid.guarded());
        assert_eq!(serde_json::to_string(&Policy::Goav).unwrap(), "\"goav\"");
        assert_eq!(&Policy::EVERY[..1], &Policy::ALL[..1]);
        assert!(Policy::ALL.iter().all(|p| Policy::EVERY.contains(p)));
    }
}
