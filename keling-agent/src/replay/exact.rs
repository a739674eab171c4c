//! Exact replay: every recorded input, feedback included, through a fresh core
//! with the recording's policy and config. The core is deterministic, so the
//! decisions must be the recorded ones; [`Comparison`] says how many are.
use std::collections::BTreeMap;

use keling_sched::{Input, Policy, SchedConfig, Scheduler};
use serde::Serialize;

use super::{Metrics, Summary, log::Decision};
use crate::log_format::SchedLine;

/// What the replay's decisions have in common with the recorded ones.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Decisions in the recorded scheduling log (late-decision records are not
    /// decisions and are left out).
    pub recorded: usize,
    /// Decisions the replay made.
    pub replayed: usize,
    /// Decisions found in both, counted as multisets.
    pub matched: usize,
    /// `matched / max(recorded, replayed)`; 1 when both are empty.
    pub match_rate: f64,
    /// The first position where the two sequences differ, with both sides.
    pub first_difference: Option<Difference>,
}

/// Where the recorded and replayed decisions first differ.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Difference {
    pub index: usize,
    pub recorded: Option<String>,
    pub replayed: Option<String>,
}

impl Comparison {
    /// Compares two sequences of decisions.
    pub fn of(recorded: &[Decision], replayed: &[Decision]) -> Comparison {
        let mut counts: BTreeMap<&Decision, i64> = BTreeMap::new();
        for d in recorded {
            *counts.entry(d).or_default() += 1;
        }
        let mut matched = 0;
        for d in replayed {
            if let Some(c) = counts.get_mut(d)
                && *c > 0
            {
                *c -= 1;
                matched += 1;
            }
        }
        let most = recorded.len().max(replayed.len());
        let first_difference =
            (0..most)
                .find(|&i| recorded.get(i) != replayed.get(i))
                .map(|index| Difference {
                    index,
                    recorded: recorded.get(index).map(|d| format!("{d:?}")),
                    replayed: replayed.get(index).map(|d| format!("{d:?}")),
                });
        Comparison {
            recorded: recorded.len(),
            replayed: replayed.len(),
            matched,
            match_rate: if most == 0 {
                1.0
            } else {
                matched as f64 / most as f64
            },
            first_difference,
        }
    }
}

/// The recorded decisions of a scheduling log, in order.
pub fn recorded_decisions(lines: &[SchedLine]) -> Vec<Decision> {
    lines.iter().filter_map(Decision::of_line).collect()
}

/// What an exact replay found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Reproduction {
    pub policy: Policy,
    pub inputs: u64,
    /// Against the recorded scheduling log, when one was given.
    pub comparison: Option<Comparison>,
    pub summary: Summary,
}

/// Feeds `inputs` through a core with `config` and `policy`, comparing its
/// decisions with `recorded` when given.
pub fn replay(
    inputs: impl IntoIterator<Item = anyhow::Result<Input>>,
    config: SchedConfig,
    policy: Policy,
    recorded: Option<&[Decision]>,
) -> anyhow::Result<Reproduction> {
    let mut metrics = Metrics::for_config(&config, policy);
    let mut sched = Scheduler::with_policy(config, policy);
    let mut replayed = Vec::new();
    for input in inputs {
        let input = input?;
        let out = sched.step(&input);
        metrics.observe(&input, &out);
        if recorded.is_some() {
            Decision::of_output(&out, &mut replayed);
        }
    }
    let inputs = metrics.inputs();
    let comparison = recorded.map(|r| Comparison::of(r, &replayed));
    Ok(Reproduction {
        policy,
        inputs,
        comparison,
        summary: metrics.finish().0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(task: u64) -> Decision {
        Decision::Placement { task, gpu: 0 }
    }

    #[test]
    fn comparison_counts_multisets_and_finds_the_first_difference() {
        let rec = [placement(1), placement(2), placement(3)];
        let same = Comparison::of(&rec, &rec);
        assert_eq!(
            (same.matched, same.match_rate, same.first_difference),
            (3, 1.0, None)
        );

        let rep = [placement(1), placement(3)];
        let c = Comparison::of(&rec, &rep);
        assert_eq!((c.matched, c.recorded, c.replayed), (2, 3, 2));
        assert!((c.match_rate - 2.0 / 3.0).abs() < 1e-12);
        let d = c.first_difference.unwrap();
        assert_eq!(d.index, 1);
        assert!(d.recorded.unwrap().contains("task: 2"));
        assert!(d.replayed.unwrap().contains("task: 3"));

        let empty = Comparison::of(&[], &[]);
        assert_eq!(empty.match_rate, 1.0);
        let extra = Comparison::of(&[], &[placement(1)]);
        assert_eq!(extra.match_rate, 0.0);
        assert_eq!(extra.first_difference.unwrap().recorded, None);
    }
}
