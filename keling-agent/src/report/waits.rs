//! The longest waits, told for people: "task 164 (training) waited 105 s on GPU 4
//! (from 13530 s) while GPUs 1-3 were idle".
//!
//! A GPU is **idle** while no task on it is `RUNNING` (from the log's
//! transitions: a task runs on the GPU its `→ RUNNING` line names until its next
//! transition). For each of the longest waits (at least [`LONG_WAIT_MIN_NS`]), the
//! other GPUs of the same log that were idle for the whole wait are named, then
//! those idle for at least half of it, with how long. Whether the waiting task
//! could have run there (a CUDA context does not move once made) is not judged
//! here: `idle_while_queued_gpu_s` in the summary counts only what it could use.
//!
//! Pure: no I/O, no clock.
use std::collections::BTreeMap;

use keling_sched::{TaskId, TaskState};
use serde::Serialize;

use crate::{log_format::TransitionLine, replay::figures::Wait};

/// Waits shorter than this are not told (the heatmaps' hot cell, 200 ms).
pub const LONG_WAIT_MIN_NS: u64 = 200_000_000;

/// One long wait, with the GPUs that idled through it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LongWait {
    /// "task 164 (training)" (prefixed with its log when there are several).
    pub task: String,
    /// The GPU it waited on; none when it waited to be placed.
    pub gpu: Option<u32>,
    /// Its start, from the report's start.
    pub from_ns: u64,
    pub wait_ns: u64,
    /// The log's other GPUs idle for the whole wait.
    pub idle_gpus: Vec<u32>,
    /// Other GPUs idle for at least half of it (not all of it): `(gpu, idle ns)`.
    pub partly_idle_gpus: Vec<(u32, u64)>,
    /// The sentence.
    pub text: String,
}

/// When each GPU was busy (a task `RUNNING` on it), from one log's transitions:
/// sorted, disjoint `[start, end)` intervals; an interval still open at `end_ns`
/// ends there.
pub fn busy_intervals(
    transitions: &[TransitionLine],
    end_ns: u64,
) -> BTreeMap<u32, Vec<(u64, u64)>> {
    // The GPU each running task runs on, and each task's GPU (its first line
    // that names one, as the replay's figures have it).
    let mut running: BTreeMap<TaskId, u32> = BTreeMap::new();
    let mut gpu_of: BTreeMap<TaskId, u32> = BTreeMap::new();
    // Per GPU: how many run there, and since when it is busy.
    let mut count: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    let mut busy: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for t in transitions {
        let Some((_, to)) = t.states() else {
            continue;
        };
        let ts = t.timestamp_ns;
        if let Some(g) = t.gpu {
            gpu_of.entry(t.task).or_insert(g);
        }
        if let Some(g) = running.remove(&t.task) {
            let c = count.entry(g).or_default();
            c.0 = c.0.saturating_sub(1);
            if c.0 == 0 && ts > c.1 {
                busy.entry(g).or_default().push((c.1, ts));
            }
        }
        if to == TaskState::Running
            && let Some(&g) = gpu_of.get(&t.task)
        {
            running.insert(t.task, g);
            let c = count.entry(g).or_default();
            if c.0 == 0 {
                c.1 = ts;
            }
            c.0 += 1;
        }
    }
    for (g, (n, since)) in count {
        if n > 0 && end_ns > since {
            busy.entry(g).or_default().push((since, end_ns));
        }
    }
    busy
}

/// How long `[a, b)` overlaps the sorted intervals `busy`.
fn busy_within(busy: &[(u64, u64)], a: u64, b: u64) -> u64 {
    busy.iter()
        .map(|&(s, e)| e.min(b).saturating_sub(s.max(a)))
        .sum()
}

/// One log's long waits: `gpus` are the GPUs the log knows (placed on or
/// configured), `label` names a task, `start_ns` is the report's start.
pub fn long_waits(
    waits: &[Wait],
    busy: &BTreeMap<u32, Vec<(u64, u64)>>,
    gpus: &[u32],
    label: &dyn Fn(TaskId) -> String,
    start_ns: u64,
) -> Vec<LongWait> {
    let none = Vec::new();
    waits
        .iter()
        .filter(|w| w.ns >= LONG_WAIT_MIN_NS)
        .map(|w| {
            let (a, b) = (w.start_ns, w.start_ns.saturating_add(w.ns));
            let mut idle_gpus = Vec::new();
            let mut partly_idle_gpus = Vec::new();
            for &g in gpus.iter().filter(|&&g| Some(g) != w.gpu) {
                let idle = w.ns - busy_within(busy.get(&g).unwrap_or(&none), a, b).min(w.ns);
                if idle == w.ns {
                    idle_gpus.push(g);
                } else if idle * 2 >= w.ns {
                    partly_idle_gpus.push((g, idle));
                }
            }
            let task = label(w.task);
            let from_ns = a.saturating_sub(start_ns);
            let text = sentence(&task, w.gpu, from_ns, w.ns, &idle_gpus, &partly_idle_gpus);
            LongWait {
                task,
                gpu: w.gpu,
                from_ns,
                wait_ns: w.ns,
                idle_gpus,
                partly_idle_gpus,
                text,
            }
        })
        .collect()
}

/// The `n` longest of `waits` (longest first; equal ones by their start).
pub fn longest(mut waits: Vec<LongWait>, n: usize) -> Vec<LongWait> {
    waits.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.from_ns.cmp(&b.from_ns)));
    waits.truncate(n);
    waits
}

fn sentence(
    task: &str,
    gpu: Option<u32>,
    from_ns: u64,
    ns: u64,
    idle: &[u32],
    partly: &[(u32, u64)],
) -> String {
    let mut s = format!("{task} waited {}", duration(ns));
    match gpu {
        Some(g) => s.push_str(&format!(" on GPU {g}")),
        None => s.push_str(" for a GPU"),
    }
    s.push_str(&format!(" (from {} s)", from_ns / 1_000_000_000));
    if idle.is_empty() && partly.is_empty() {
        s.push_str(" while every other GPU was busy for at least half of it");
        return s;
    }
    let mut clauses = Vec::new();
    if !idle.is_empty() {
        let verb = if idle.len() == 1 { "was" } else { "were" };
        clauses.push(format!("{} {verb} idle", gpu_list(idle)));
    }
    for (i, &(g, idle_ns)) in partly.iter().enumerate() {
        if i == 0 && idle.is_empty() {
            clauses.push(format!("GPU {g} was idle for {} of it", duration(idle_ns)));
        } else {
            clauses.push(format!("GPU {g} for {} of it", duration(idle_ns)));
        }
    }
    s.push_str(" while ");
    s.push_str(&join_and(&clauses));
    s
}

/// "350 ms", "1.2 s", "105 s", "25 min", "9 h 25 min".
fn duration(ns: u64) -> String {
    let s = (ns + 500_000_000) / 1_000_000_000;
    if ns < 1_000_000_000 {
        format!("{} ms", ns / 1_000_000)
    } else if ns < 10_000_000_000 {
        format!("{:.1} s", ns as f64 / 1e9)
    } else if s < 600 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min", (s + 30) / 60)
    } else {
        let m = (s + 30) / 60;
        format!("{} h {} min", m / 60, m % 60)
    }
}

/// "GPU 2", "GPUs 1-3", "GPUs 0, 2 and 5", "GPUs 0-2 and 5" (`gpus` sorted).
fn gpu_list(gpus: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &g in gpus {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == g => r.1 = g,
            _ => runs.push((g, g)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .flat_map(|&(a, b)| match b - a {
            0 => vec![a.to_string()],
            1 => vec![a.to_string(), b.to_string()],
            _ => vec![format!("{a}-{b}")],
        })
        .collect();
    let noun = if gpus.len() == 1 { "GPU" } else { "GPUs" };
    format!("{noun} {}", join_and(&parts))
}

/// "a", "a and b", "a, b and c".
fn join_and(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use keling_sched::Reason;

    use super::*;

    const S: u64 = 1_000_000_000;

    fn line(task: TaskId, gpu: u32, ts_s: u64, from: &str, to: &str) -> TransitionLine {
        TransitionLine {
            event_id: 0,
            state_transition: format!("{from}\u{2192}{to}"),
            timestamp_ns: ts_s * S,
            task,
            name: format!("t{task}"),
            pid: 100 + task as u32,
            gpu: Some(gpu),
            priority: 0,
            reason: Reason::Placed,
            exit_code: None,
        }
    }

    #[test]
    fn gpu_lists_and_durations_read_as_words() {
        assert_eq!(gpu_list(&[2]), "GPU 2");
        assert_eq!(gpu_list(&[1, 2, 3]), "GPUs 1-3");
        assert_eq!(gpu_list(&[0, 1]), "GPUs 0 and 1");
        assert_eq!(gpu_list(&[0, 2, 5]), "GPUs 0, 2 and 5");
        assert_eq!(gpu_list(&[0, 1, 2, 5]), "GPUs 0-2 and 5");
        assert_eq!(duration(350_000_000), "350 ms");
        assert_eq!(duration(1_240_000_000), "1.2 s");
        assert_eq!(duration(104_600_000_000), "105 s");
        assert_eq!(duration(1_500 * S), "25 min");
        assert_eq!(duration(33_900 * S), "9 h 25 min");
    }

    #[test]
    fn gpus_idle_for_part_of_a_wait_are_told_with_how_long() {
        // Task 9 waits on GPU 0 from 2 s to 12 s. GPU 1 runs until 6 s (idle 6 of
        // the 10 s), GPU 2 throughout (not told), GPU 3 never (idle throughout),
        // GPU 4 until 8 s (idle 4 s: under half, not told).
        let t = [
            line(1, 1, 0, "PENDING", "RUNNING"),
            line(2, 2, 0, "PENDING", "RUNNING"),
            line(4, 4, 0, "PENDING", "RUNNING"),
            line(1, 1, 6, "RUNNING", "COMPLETED"),
            line(4, 4, 8, "RUNNING", "COMPLETED"),
        ];
        let busy = busy_intervals(&t, 20 * S);
        let wait = Wait {
            task: 9,
            gpu: Some(0),
            start_ns: 2 * S,
            ns: 10 * S,
        };
        let label = |task: TaskId| format!("task {task} (render)");
        let w = long_waits(&[wait], &busy, &[0, 1, 2, 3, 4], &label, S);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].idle_gpus, [3]);
        assert_eq!(w[0].partly_idle_gpus, [(1, 6 * S)]);
        assert_eq!(
            w[0].text,
            "task 9 (render) waited 10 s on GPU 0 (from 1 s) while GPU 3 was idle and GPU 1 for 6.0 s of it"
        );
        // With every other GPU busy, it says so.
        let w = long_waits(&[wait], &busy, &[0, 2], &label, 0);
        assert_eq!(
            w[0].text,
            "task 9 (render) waited 10 s on GPU 0 (from 2 s) while every other GPU was busy for at least half of it"
        );
        // Short waits are not told.
        let short = Wait {
            ns: LONG_WAIT_MIN_NS - 1,
            ..wait
        };
        assert!(long_waits(&[short], &busy, &[0, 3], &label, 0).is_empty());
    }

    #[test]
    fn busy_gpus_are_those_with_a_running_task() {
        let t = [
            line(1, 0, 10, "PENDING", "RUNNING"),
            line(2, 0, 12, "PENDING", "RUNNING"),
            line(1, 0, 20, "RUNNING", "COMPLETED"),
            line(2, 0, 25, "RUNNING", "PREEMPTED"),
            line(3, 1, 30, "PENDING", "RUNNING"),
        ];
        let busy = busy_intervals(&t, 40 * S);
        assert_eq!(busy[&0], vec![(10 * S, 25 * S)]);
        assert_eq!(
            busy[&1],
            vec![(30 * S, 40 * S)],
            "open at the end: closed there"
        );
    }
}
