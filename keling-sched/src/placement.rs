//! Where an unpinned task goes: the placement weight of a GPU, the per-GPU
//! allocation success rate over a sliding window that feeds it, the tie-break
//! between equally good free GPUs under late binding, and
//! [`load_balance_error`], the status figure of how evenly the GPUs are used.
//! See "Placement" and "Binding" in the crate doc.
//!
//! The [`Scheduler`](crate::Scheduler) gathers each GPU's figures (memory used,
//! queued work) from its tasks; this module turns them into weights.

use std::collections::{BTreeMap, VecDeque};

use crate::{NS_PER_S, TaskId};

/// The window of the allocation success rate used by placement.
pub const ALLOC_SUCCESS_WINDOW_S: u64 = 300;
/// Placement weight of the free-memory fraction.
pub const PLACEMENT_FREE_MEMORY_WEIGHT: f64 = 0.4;
/// Placement weight of `1 / (1 + expected queue time in s)`.
pub const PLACEMENT_QUEUE_WEIGHT: f64 = 0.35;
/// Placement weight of the allocation success rate.
pub const PLACEMENT_ALLOC_SUCCESS_WEIGHT: f64 = 0.25;
/// Late binding: free GPUs whose weights differ by no more than this are tied.
pub const PLACEMENT_WEIGHT_TIE: f64 = 1e-9;

/// Late binding under memory sharing: how far ahead the memory the tasks on
/// a GPU may hold counts against it when choosing where a task goes (added to
/// the memory it has held over time).
pub const MEM_HORIZON_S: u64 = 60;

/// `(max - min) / mean` of per-device values: 0 when balanced, and for an empty
/// slice or a zero (or non-finite) mean.
pub fn load_balance_error(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if mean == 0.0 || !mean.is_finite() {
        return 0.0;
    }
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    (max - min) / mean
}

/// `W = 0.4 × free fraction + 0.35 / (1 + queue_s) + 0.25 × success_rate` of a GPU
/// with `capacity` bytes of which `used` are held, and `queue_ms` of expected work
/// shared by `slots` slots. A GPU of capacity 0 has no free memory.
pub(crate) fn placement_weight(
    capacity: u64,
    used: u128,
    queue_ms: u128,
    slots: usize,
    success_rate: f64,
) -> f64 {
    let free_fraction = if capacity == 0 {
        0.0
    } else {
        1.0 - (used as f64 / capacity as f64).min(1.0)
    };
    let queue_s = queue_ms as f64 / 1000.0 / slots as f64;
    PLACEMENT_FREE_MEMORY_WEIGHT * free_fraction
        + PLACEMENT_QUEUE_WEIGHT / (1.0 + queue_s)
        + PLACEMENT_ALLOC_SUCCESS_WEIGHT * success_rate
}

/// The GPU with the highest weight; ties: the first listed (the lowest index, as
/// weights come sorted by index). GPU 0 when there are none.
pub(crate) fn best_gpu(weights: impl IntoIterator<Item = (u32, f64)>) -> u32 {
    let mut best: Option<(u32, f64)> = None;
    for (gpu, weight) in weights {
        if best.is_none_or(|(_, best_weight)| weight > best_weight) {
            best = Some((gpu, weight));
        }
    }
    best.map_or(0, |(gpu, _)| gpu)
}

/// A GPU with a free slot, as late binding compares them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FreeGpu {
    pub(crate) gpu: u32,
    /// Its placement weight (higher is better).
    pub(crate) weight: f64,
    /// How long it has had a task running.
    pub(crate) busy_ns: u64,
}

/// Late binding's choice among free GPUs: the highest weight; among weights
/// within [`PLACEMENT_WEIGHT_TIE`] of it, the least busy time; among those, the
/// smallest [`tie_hash`] of `seed`, the task and the GPU. Never the index.
/// `None` when there are none.
pub(crate) fn choose_free_gpu(gpus: &[FreeGpu], seed: u64, task: TaskId) -> Option<u32> {
    let best = gpus
        .iter()
        .map(|g| g.weight)
        .fold(f64::NEG_INFINITY, f64::max);
    let tied = || {
        gpus.iter()
            .filter(move |g| g.weight >= best - PLACEMENT_WEIGHT_TIE)
    };
    let least_busy = tied().map(|g| g.busy_ns).min()?;
    tied()
        .filter(|g| g.busy_ns == least_busy)
        .min_by_key(|g| (tie_hash(seed, task, g.gpu), g.gpu))
        .map(|g| g.gpu)
}

/// A pseudo-random, well-mixed function of the seed, the task and the GPU
/// (SplitMix64's finalizer, three times): the same inputs always give the same
/// value, so replays reproduce it, and no GPU index is favoured.
pub(crate) fn tie_hash(seed: u64, task: TaskId, gpu: u32) -> u64 {
    mix(seed ^ mix(task ^ mix(u64::from(gpu) ^ 0x6B65_6C69_6E67)))
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Allocation outcomes on one GPU during one second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AllocBucket {
    second: u64,
    successes: u64,
    failures: u64,
}

/// Per GPU, allocation outcomes of the last [`ALLOC_SUCCESS_WINDOW_S`] seconds, in
/// 1 s buckets. Recording assumes the clock never goes back (the core's does not).
#[derive(Clone, Debug, Default)]
pub(crate) struct AllocHistory {
    gpus: BTreeMap<u32, VecDeque<AllocBucket>>,
}

impl AllocHistory {
    /// One allocation on `gpu` at `now_ns`; drops what fell out of the window.
    pub(crate) fn record(&mut self, gpu: u32, now_ns: u64, success: bool) {
        let second = now_ns / NS_PER_S;
        let history = self.gpus.entry(gpu).or_default();
        match history.back_mut() {
            Some(bucket) if bucket.second == second => {}
            _ => history.push_back(AllocBucket {
                second,
                successes: 0,
                failures: 0,
            }),
        }
        if let Some(bucket) = history.back_mut() {
            if success {
                bucket.successes = bucket.successes.saturating_add(1);
            } else {
                bucket.failures = bucket.failures.saturating_add(1);
            }
        }
        while history
            .front()
            .is_some_and(|b| b.second + ALLOC_SUCCESS_WINDOW_S <= second)
        {
            history.pop_front();
        }
    }

    /// Successful allocations over all attempts on `gpu` in the window up to
    /// `ts_ns`; 1.0 with no attempts.
    pub(crate) fn success_rate(&self, gpu: u32, ts_ns: u64) -> f64 {
        let second = ts_ns / NS_PER_S;
        let (successes, failures) = self
            .gpus
            .get(&gpu)
            .into_iter()
            .flatten()
            .filter(|b| b.second <= second && b.second + ALLOC_SUCCESS_WINDOW_S > second)
            .fold((0u64, 0u64), |(s, f), b| {
                (s.saturating_add(b.successes), f.saturating_add(b.failures))
            });
        let attempts = successes.saturating_add(failures);
        if attempts == 0 {
            1.0
        } else {
            successes as f64 / attempts as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn load_balance_error_is_range_over_mean() {
        assert_eq!(load_balance_error(&[]), 0.0);
        assert_eq!(load_balance_error(&[0.0, 0.0]), 0.0);
        assert_eq!(load_balance_error(&[3.0, 3.0, 3.0]), 0.0);
        assert_eq!(load_balance_error(&[1.0, 3.0]), 1.0);
        assert_eq!(load_balance_error(&[2.0, 4.0, 9.0]), 7.0 / 5.0);
    }

    #[test]
    fn load_balance_error_of_a_non_finite_mean_is_0() {
        assert_eq!(load_balance_error(&[f64::INFINITY, 1.0]), 0.0);
        assert_eq!(load_balance_error(&[f64::NAN, 1.0]), 0.0);
    }

    #[test]
    fn weight_adds_the_three_weighted_terms() {
        let w = placement_weight(10, 2, 3_000, 2, 0.5);
        let want = 0.4 * 0.8 + 0.35 / (1.0 + 1.5) + 0.25 * 0.5;
        assert!((w - want).abs() < 1e-12, "{w} != {want}");
        assert_eq!(placement_weight(0, 0, 0, 1, 1.0), 0.35 + 0.25, "capacity 0");
        assert_eq!(
            placement_weight(10, 20, 0, 1, 1.0),
            0.35 + 0.25,
            "over-full counts as full"
        );
        assert_eq!(
            PLACEMENT_FREE_MEMORY_WEIGHT + PLACEMENT_QUEUE_WEIGHT + PLACEMENT_ALLOC_SUCCESS_WEIGHT,
            1.0
        );
    }

    #[test]
    fn best_gpu_takes_the_highest_weight_and_the_first_on_ties() {
        assert_eq!(best_gpu([]), 0);
        assert_eq!(best_gpu([(3, 0.5)]), 3);
        assert_eq!(best_gpu([(1, 0.5), (2, 0.7), (4, 0.7)]), 2);
    }

    fn free(gpu: u32, weight: f64, busy_ns: u64) -> FreeGpu {
        FreeGpu {
            gpu,
            weight,
            busy_ns,
        }
    }

    #[test]
    fn free_gpus_go_by_weight_then_least_busy_time() {
        assert_eq!(choose_free_gpu(&[], 0, 1), None);
        let gpus = [free(0, 0.5, 0), free(1, 0.9, 50), free(2, 0.9, 40)];
        assert_eq!(
            choose_free_gpu(&gpus, 0, 1),
            Some(2),
            "least busy of the best"
        );
        let gpus = [free(0, 0.5, 0), free(1, 0.9, 50), free(2, 0.8, 0)];
        assert_eq!(choose_free_gpu(&gpus, 0, 1), Some(1), "weight first");
        let gpus = [
            free(0, 0.9 + PLACEMENT_WEIGHT_TIE / 2.0, 50),
            free(1, 0.9, 40),
        ];
        assert_eq!(choose_free_gpu(&gpus, 0, 1), Some(1), "a tie within 1e-9");
    }

    /// Full ties go to a seeded pseudo-random GPU: every GPU is chosen for some
    /// task or seed, about equally often, and the same seed and task always
    /// give the same one.
    #[test]
    fn full_ties_are_seeded_not_by_index() {
        let gpus: Vec<FreeGpu> = (0..4).map(|g| free(g, 1.0, 7)).collect();
        let mut chosen = [0u32; 4];
        for task in 0..4_000 {
            let g = choose_free_gpu(&gpus, 3, task).unwrap();
            assert_eq!(choose_free_gpu(&gpus, 3, task), Some(g));
            chosen[g as usize] += 1;
        }
        assert!(
            chosen.iter().all(|&n| (850..1150).contains(&n)),
            "{chosen:?}"
        );
        let by_seed: BTreeSet<u32> = (0..64)
            .map(|seed| choose_free_gpu(&gpus, seed, 1).unwrap())
            .collect();
        assert_eq!(by_seed.len(), 4, "the seed changes the choice");
        // Reversing the list changes nothing: the order given is not a tie-break.
        let mut reversed = gpus.clone();
        reversed.reverse();
        for task in 0..64 {
            assert_eq!(
                choose_free_gpu(&gpus, 5, task),
                choose_free_gpu(&reversed, 5, task)
            );
        }
    }

    #[test]
    fn success_rate_window_slides_by_whole_seconds() {
        const S: u64 = NS_PER_S;
        let mut h = AllocHistory::default();
        assert_eq!(h.success_rate(0, 0), 1.0, "no data");
        h.record(0, 0, false);
        h.record(0, S / 2, true);
        h.record(0, S, true);
        h.record(1, S, false);
        assert_eq!(h.success_rate(0, S - 1), 0.5, "second 0 only");
        assert_eq!(h.success_rate(0, S), 2.0 / 3.0);
        assert_eq!(h.success_rate(1, S), 0.0);
        assert_eq!(h.success_rate(0, 300 * S), 1.0, "second 0 fell out");
        assert_eq!(h.success_rate(0, 301 * S), 1.0, "all fell out");
        // Recording far later drops the old buckets for good.
        h.record(0, 1_000 * S, false);
        assert_eq!(h.gpus[&0].len(), 1);
        assert_eq!(h.success_rate(0, S), 1.0, "dropped");
    }
}
