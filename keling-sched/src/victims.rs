//! Which tasks memory pressure evicts: [`choose_victims`], the smallest set of
//! [`VictimCandidate`]s that frees enough memory, found exactly up to
//! [`EXACT_VICTIM_SEARCH_MAX_CANDIDATES`] candidates and greedily beyond. Who may
//! be a candidate is the scheduler's rule (see "Memory pressure" in the crate doc).

use std::cmp::Reverse;

use crate::TaskId;

/// Eviction candidates must expect to run longer than this.
pub const EVICTION_MIN_REMAINING_MS: u64 = 3_000;
/// Up to this many eviction candidates the victim set is searched exactly.
pub const EXACT_VICTIM_SEARCH_MAX_CANDIDATES: usize = 20;

/// A task that memory pressure may evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VictimCandidate {
    /// The task.
    pub id: TaskId,
    /// Its priority (a higher number is evicted first among equals).
    pub priority: u8,
    /// Memory it holds on the GPU under pressure.
    pub bytes: u64,
}

/// The smallest set of candidates whose bytes cover `need_bytes`: fewest tasks, then
/// fewest bytes, then lowest priorities (the set whose priorities, sorted from lowest
/// priority down, are lexicographically lowest-priority first), then lowest ids
/// (sorted ids, lexicographically). Empty when `need_bytes` is 0 or no set covers it.
/// Returned sorted by id.
///
/// The fewest-tasks count is always exact (the k largest candidates cover the need
/// if any k do). Up to [`EXACT_VICTIM_SEARCH_MAX_CANDIDATES`] candidates the
/// tie-breaks are exact too (every set of that size is tried); beyond, the set
/// starts from the k largest and greedily swaps each member for the smallest
/// candidate that still covers, so its bytes may not be the least possible.
pub fn choose_victims(candidates: &[VictimCandidate], need_bytes: u64) -> Vec<TaskId> {
    if need_bytes == 0 {
        return Vec::new();
    }
    let need = u128::from(need_bytes);
    let mut by_size: Vec<&VictimCandidate> = candidates.iter().filter(|c| c.bytes > 0).collect();
    by_size.sort_by_key(|c| (Reverse(c.bytes), Reverse(c.priority), c.id));
    let mut covered: u128 = 0;
    let mut fewest = None;
    for (i, c) in by_size.iter().enumerate() {
        covered += u128::from(c.bytes);
        if covered >= need {
            fewest = Some(i + 1);
            break;
        }
    }
    let Some(k) = fewest else {
        return Vec::new();
    };
    let chosen = if by_size.len() <= EXACT_VICTIM_SEARCH_MAX_CANDIDATES {
        exact_victims(&by_size, k, need)
    } else {
        greedy_victims(&by_size, k, need)
    };
    let mut ids: Vec<TaskId> = chosen.iter().map(|&i| by_size[i].id).collect();
    ids.sort_unstable();
    ids
}

type VictimSetKey = (u128, Reverse<Vec<u8>>, Vec<TaskId>);

fn victim_set_key(cands: &[&VictimCandidate], members: &[usize]) -> VictimSetKey {
    let total = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
    let mut priorities: Vec<u8> = members.iter().map(|&i| cands[i].priority).collect();
    priorities.sort_unstable_by(|a, b| b.cmp(a));
    let mut ids: Vec<TaskId> = members.iter().map(|&i| cands[i].id).collect();
    ids.sort_unstable();
    (total, Reverse(priorities), ids)
}

/// Every `k`-subset of `cands`, best key wins. `1 <= k <= cands.len()`.
fn exact_victims(cands: &[&VictimCandidate], k: usize, need: u128) -> Vec<usize> {
    let n = cands.len();
    let mut members: Vec<usize> = (0..k).collect();
    let mut best: Option<(VictimSetKey, Vec<usize>)> = None;
    loop {
        let total: u128 = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
        // Building the full key allocates: only do it when the set can win.
        if total >= need && best.as_ref().is_none_or(|(key, _)| total <= key.0) {
            let key = victim_set_key(cands, &members);
            if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
                best = Some((key, members.clone()));
            }
        }
        if !next_combination(&mut members, n) {
            break;
        }
    }
    best.map(|(_, members)| members).unwrap_or_default()
}

/// Advances `members` (strictly increasing indices below `n`) to the next
/// combination in lexicographic order; false after the last.
fn next_combination(members: &mut [usize], n: usize) -> bool {
    let k = members.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if members[i] < n - k + i {
            let mut next = members[i];
            for slot in members.iter_mut().skip(i) {
                next += 1;
                *slot = next;
            }
            return true;
        }
    }
    false
}

/// `cands` sorted largest first; start from the `k` largest and swap each member, in
/// turn, for the smallest non-member that keeps the need covered.
fn greedy_victims(cands: &[&VictimCandidate], k: usize, need: u128) -> Vec<usize> {
    let mut members: Vec<usize> = (0..k).collect();
    let mut total: u128 = members.iter().map(|&i| u128::from(cands[i].bytes)).sum();
    // Smallest first; among equal sizes, lowest priority first, then lowest id.
    let mut by_small: Vec<usize> = (0..cands.len()).collect();
    by_small.sort_by_key(|&i| (cands[i].bytes, Reverse(cands[i].priority), cands[i].id));
    for slot in 0..members.len() {
        let current = members[slot];
        let current_bytes = u128::from(cands[current].bytes);
        let swap = by_small.iter().copied().find(|&c| {
            !members.contains(&c)
                && u128::from(cands[c].bytes) < current_bytes
                && total - current_bytes + u128::from(cands[c].bytes) >= need
        });
        if let Some(c) = swap {
            total = total - current_bytes + u128::from(cands[c].bytes);
            members[slot] = c;
        }
    }
    members
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The minimum over all subsets (fewest tasks, then fewest bytes, lowest
    /// priorities, lowest ids): what `choose_victims` must find.
    pub(crate) fn brute_force_victims(candidates: &[VictimCandidate], need: u64) -> Vec<TaskId> {
        if need == 0 {
            return Vec::new();
        }
        // Fewest tasks, then fewest bytes, lowest priorities, lowest ids.
        type Key = (usize, u128, Reverse<Vec<u8>>, Vec<TaskId>);
        let mut best: Option<Key> = None;
        for mask in 0u32..(1 << candidates.len()) {
            let set: Vec<&VictimCandidate> = candidates
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| c)
                .collect();
            let total: u128 = set.iter().map(|c| u128::from(c.bytes)).sum();
            if total < u128::from(need) {
                continue;
            }
            let mut priorities: Vec<u8> = set.iter().map(|c| c.priority).collect();
            priorities.sort_unstable_by(|a, b| b.cmp(a));
            let mut ids: Vec<TaskId> = set.iter().map(|c| c.id).collect();
            ids.sort_unstable();
            let key = (set.len(), total, Reverse(priorities), ids);
            if best.as_ref().is_none_or(|b| key < *b) {
                best = Some(key);
            }
        }
        best.map(|b| b.3).unwrap_or_default()
    }

    #[test]
    fn greedy_victim_choice_beyond_the_exact_limit_still_uses_the_fewest_tasks() {
        let candidates: Vec<VictimCandidate> = (0..30)
            .map(|id| VictimCandidate {
                id,
                priority: (id % 16) as u8,
                bytes: (id % 7 + 1) * 10,
            })
            .collect();
        let victims = choose_victims(&candidates, 150);
        // The four 70s: two cover 140 < 150, three cover 210.
        assert_eq!(victims.len(), 3);
        let total: u64 = victims
            .iter()
            .map(|&id| candidates[id as usize].bytes)
            .sum();
        assert!((150..210).contains(&total), "greedy swap kept {total}");
        assert!(
            choose_victims(&candidates, 10_000).is_empty(),
            "nothing covers"
        );
        assert!(choose_victims(&candidates, 0).is_empty());
    }

    #[test]
    fn next_combination_walks_every_k_subset_in_order() {
        let mut members = vec![0, 1];
        let mut seen = vec![members.clone()];
        while next_combination(&mut members, 4) {
            seen.push(members.clone());
        }
        assert_eq!(
            seen,
            [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]].map(Vec::from)
        );
    }

    #[test]
    fn candidates_holding_nothing_are_never_chosen() {
        let candidates = [
            VictimCandidate {
                id: 1,
                priority: 15,
                bytes: 0,
            },
            VictimCandidate {
                id: 2,
                priority: 9,
                bytes: 5,
            },
        ];
        assert_eq!(choose_victims(&candidates, 5), vec![2]);
        assert!(choose_victims(&candidates, 6).is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Property 4: the victim set is the minimum that brute force finds over all
        /// subsets (fewest tasks, fewest bytes, lowest priorities, lowest ids).
        #[test]
        fn prop_victim_set_is_minimal(
            candidates in prop::collection::vec((1u8..=15, 0u64..64), 0..=11),
            need in 0u64..400,
        ) {
            let candidates: Vec<VictimCandidate> = candidates
                .into_iter()
                .enumerate()
                .map(|(i, (priority, bytes))| VictimCandidate { id: i as TaskId, priority, bytes })
                .collect();
            let chosen = choose_victims(&candidates, need);
            prop_assert_eq!(&chosen, &brute_force_victims(&candidates, need));
            let total: u64 = chosen.iter().map(|&id| candidates[id as usize].bytes).sum();
            prop_assert!(chosen.is_empty() || total >= need);
        }
    }
}
