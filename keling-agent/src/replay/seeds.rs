//! Synthetic runs over many seeds: each run reduced to the figures the goals
//! name ([`Figures`]), then per mix, policy and placement the median and the
//! worst seed of each ([`Aggregate`]), and the docs' table ([`markdown`]).
//!
//! Every figure here is better when lower, so a seed's figure is worst when it
//! is the highest; ties go to the lowest seed. The median of an even number of
//! seeds is the mean of the two middle ones.
use keling_sched::{Class, Policy, class_of};
use serde::Serialize;

use super::{
    Stats,
    synthetic::{Mix, Placement, SyntheticRun},
};

/// One run's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    pub mix: Mix,
    pub seed: u64,
    pub policy: Policy,
    pub placement: Placement,
    /// What `keling run` does with its defaults.
    pub default: bool,
    /// The overload rule was on.
    pub overload: bool,
    /// Load-balance error of busy time across the GPUs.
    pub lbe_busy: f64,
    /// Load-balance error of memory held over time.
    pub lbe_mem: f64,
    pub queue_mean_ms: f64,
    /// Mean time from arrival to completion of the jobs that ended.
    pub turnaround_mean_s: f64,
    /// Queueing delay p99 of the real-time classes' jobs, pooled (None: the
    /// mix has none).
    pub rt_p99_ms: Option<f64>,
    pub idle_while_queued_gpu_s: f64,
    pub preemptions: u64,
    pub evictions: u64,
    pub jobs: usize,
    pub completed: u64,
    pub work_done_share: f64,
}

impl Figures {
    pub fn of(run: &SyntheticRun) -> Figures {
        let s = &run.summary;
        let rt: Vec<f64> = s
            .per_task
            .iter()
            .filter(|d| class_of(d.priority) == Class::RealTime)
            .map(|d| d.queueing_delay_ms)
            .collect();
        Figures {
            mix: run.mix,
            seed: run.seed,
            policy: run.policy,
            placement: run.placement,
            default: run.default,
            overload: run.config.overload.is_some(),
            lbe_busy: s.load_balance_error,
            lbe_mem: s.memory_load_balance_error,
            queue_mean_ms: s.queueing_delay_ms.mean,
            turnaround_mean_s: s.turnaround_ms.mean / 1e3,
            rt_p99_ms: (!rt.is_empty()).then(|| Stats::of(rt).p99),
            idle_while_queued_gpu_s: s.idle_while_queued_gpu_s,
            preemptions: s.preemptions,
            evictions: s.evictions,
            jobs: run.jobs,
            completed: run.completed,
            work_done_share: run.work_done_share,
        }
    }
}

/// A figure over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OverSeeds {
    pub median: f64,
    pub worst: f64,
    /// The seed with the worst figure.
    pub worst_seed: u64,
}

impl OverSeeds {
    /// `None` for no values.
    pub fn of(values: &[(u64, f64)]) -> Option<OverSeeds> {
        let (worst_seed, worst) = values.iter().copied().reduce(|w, v| {
            if v.1 > w.1 || (v.1 == w.1 && v.0 < w.0) {
                v
            } else {
                w
            }
        })?;
        let mut sorted: Vec<f64> = values.iter().map(|v| v.1).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(OverSeeds {
            median,
            worst,
            worst_seed,
        })
    }
}

/// One mix, policy and placement over its seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Aggregate {
    pub mix: Mix,
    pub policy: Policy,
    pub placement: Placement,
    /// The overload rule was on.
    pub overload: bool,
    /// Every seed's run was the agent's default.
    pub default: bool,
    pub seeds: Vec<u64>,
    pub lbe_busy: OverSeeds,
    pub lbe_mem: OverSeeds,
    pub queue_mean_ms: OverSeeds,
    pub turnaround_mean_s: OverSeeds,
    /// None: the mix has no real-time class.
    pub rt_p99_ms: Option<OverSeeds>,
    pub idle_while_queued_gpu_s: OverSeeds,
    pub evictions: OverSeeds,
    /// Share of the offered work not done by the end (lower is better).
    pub work_not_done: OverSeeds,
}

/// Groups `runs` by mix, policy and placement, in the order each group first
/// appears.
pub fn aggregate(runs: &[Figures]) -> Vec<Aggregate> {
    let key = |r: &Figures| (r.mix, r.policy, r.placement, r.overload);
    let mut keys: Vec<(Mix, Policy, Placement, bool)> = Vec::new();
    for r in runs {
        if !keys.contains(&key(r)) {
            keys.push(key(r));
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let (mix, policy, placement, overload) = k;
            let group: Vec<&Figures> = runs.iter().filter(|r| key(r) == k).collect();
            let over = |f: &dyn Fn(&Figures) -> f64| {
                OverSeeds::of(&group.iter().map(|r| (r.seed, f(r))).collect::<Vec<_>>())
            };
            let rt: Vec<(u64, f64)> = group
                .iter()
                .filter_map(|r| Some((r.seed, r.rt_p99_ms?)))
                .collect();
            Some(Aggregate {
                mix,
                policy,
                placement,
                overload,
                default: group.iter().all(|r| r.default),
                seeds: group.iter().map(|r| r.seed).collect(),
                lbe_busy: over(&|r| r.lbe_busy)?,
                lbe_mem: over(&|r| r.lbe_mem)?,
                queue_mean_ms: over(&|r| r.queue_mean_ms)?,
                turnaround_mean_s: over(&|r| r.turnaround_mean_s)?,
                rt_p99_ms: OverSeeds::of(&rt),
                idle_while_queued_gpu_s: over(&|r| r.idle_while_queued_gpu_s)?,
                evictions: over(&|r| r.evictions as f64)?,
                work_not_done: over(&|r| 1.0 - r.work_done_share)?,
            })
        })
        .collect()
}

/// The goals of issue 34 for the agent's defaults (reported, never asserted).
pub mod goals {
    /// Transcode: load-balance error of busy time and of memory, every seed.
    pub const TRANSCODE_LBE: f64 = 0.01;
    /// Transcode: mean queueing delay, every seed (the articles' figure), ms.
    pub const TRANSCODE_QUEUE_MEAN_MS: f64 = 42.3;
    /// Mixed: load-balance error of busy time, median over seeds.
    pub const MIXED_LBE_MEDIAN: f64 = 0.05;
    /// Mixed: load-balance error of busy time, worst seed.
    pub const MIXED_LBE_WORST: f64 = 0.10;
    /// Mixed: real-time classes' queueing p99, ms (every seed).
    pub const MIXED_RT_P99_MS: f64 = 20.0;
}

/// One goal: what it is, the figure, and whether it is met.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Goal {
    pub goal: String,
    pub figure: String,
    pub met: bool,
}

/// The goals for an aggregate of the agent's default runs of its mix.
pub fn goals(a: &Aggregate) -> Vec<Goal> {
    let pct = |x: f64| format!("{:.2}%", x * 100.0);
    let worst = |o: &OverSeeds, f: &dyn Fn(f64) -> String| {
        format!(
            "worst {} (seed {}), median {}",
            f(o.worst),
            o.worst_seed,
            f(o.median)
        )
    };
    let ms = |x: f64| format!("{x:.1} ms");
    let goal = |goal: String, figure: String, met: bool| Goal { goal, figure, met };
    match a.mix {
        Mix::Transcode => vec![
            goal(
                format!(
                    "load-balance error of busy time <= {}, every seed",
                    pct(goals::TRANSCODE_LBE)
                ),
                worst(&a.lbe_busy, &pct),
                a.lbe_busy.worst <= goals::TRANSCODE_LBE,
            ),
            goal(
                format!(
                    "load-balance error of memory held <= {}, every seed",
                    pct(goals::TRANSCODE_LBE)
                ),
                worst(&a.lbe_mem, &pct),
                a.lbe_mem.worst <= goals::TRANSCODE_LBE,
            ),
            goal(
                format!(
                    "mean queueing <= {} ms, every seed",
                    goals::TRANSCODE_QUEUE_MEAN_MS
                ),
                worst(&a.queue_mean_ms, &ms),
                a.queue_mean_ms.worst <= goals::TRANSCODE_QUEUE_MEAN_MS,
            ),
        ],
        Mix::Mixed => vec![
            goal(
                format!(
                    "load-balance error of busy time <= {} median, <= {} worst seed",
                    pct(goals::MIXED_LBE_MEDIAN),
                    pct(goals::MIXED_LBE_WORST)
                ),
                worst(&a.lbe_busy, &pct),
                a.lbe_busy.median <= goals::MIXED_LBE_MEDIAN
                    && a.lbe_busy.worst <= goals::MIXED_LBE_WORST,
            ),
            goal(
                format!(
                    "real-time classes' queueing p99 <= {} ms, every seed",
                    goals::MIXED_RT_P99_MS
                ),
                a.rt_p99_ms
                    .as_ref()
                    .map_or("no real-time jobs".to_owned(), |o| worst(o, &ms)),
                a.rt_p99_ms
                    .is_none_or(|o| o.worst <= goals::MIXED_RT_P99_MS),
            ),
            goal(
                "idle while queued 0 GPU-s, every seed".to_owned(),
                worst(&a.idle_while_queued_gpu_s, &|x| format!("{x:.1} GPU-s")),
                a.idle_while_queued_gpu_s.worst == 0.0,
            ),
        ],
    }
}

/// The first line of [`markdown`]'s table: the docs' table must start with it
/// (a test checks docs/replay.md against it).
pub const MARKDOWN_HEADER: &str = "| mix | policy | placement | LBE busy median / worst (seed) | LBE mem median / worst (seed) | queue mean median / worst (seed) | real-time p99 median / worst (seed) | idle-q GPU-s median / worst (seed) | evictions median / worst (seed) | work not done median / worst (seed) |";
/// The table's second line.
pub const MARKDOWN_RULE: &str = "|---|---|---|---|---|---|---|---|---|---|";
/// Marks around the table in a Markdown file that `--markdown FILE` rewrites.
pub const MARKDOWN_BEGIN: &str = "<!-- keling replay --markdown: begin -->";
pub const MARKDOWN_END: &str = "<!-- keling replay --markdown: end -->";

/// The table of `aggregates`, one row each, the agent's default runs in bold
/// with "(default)" after the placement. `what` is said in a line above it.
pub fn markdown(what: &str, aggregates: &[Aggregate]) -> String {
    let pct = |x: f64| format!("{:.2}%", x * 100.0);
    let ms = |x: f64| format!("{x:.1} ms");
    let num = |x: f64| format!("{x:.0}");
    let cell = |o: &OverSeeds, f: &dyn Fn(f64) -> String| {
        format!("{} / {} ({})", f(o.median), f(o.worst), o.worst_seed)
    };
    let mut out = format!("{what}\n\n{MARKDOWN_HEADER}\n{MARKDOWN_RULE}\n");
    for a in aggregates {
        let placement = if a.default {
            format!("**{}** (default)", a.placement.as_str())
        } else {
            a.placement.as_str().to_owned()
        } + if a.overload { ", overload rule" } else { "" };
        let cells = [
            a.mix.as_str().to_owned(),
            a.policy.as_str().to_owned(),
            placement,
            cell(&a.lbe_busy, &pct),
            cell(&a.lbe_mem, &pct),
            cell(&a.queue_mean_ms, &ms),
            a.rt_p99_ms
                .as_ref()
                .map_or("-".to_owned(), |o| cell(o, &ms)),
            cell(&a.idle_while_queued_gpu_s, &num),
            cell(&a.evictions, &num),
            cell(&a.work_not_done, &pct),
        ];
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// `text` with what lies between [`MARKDOWN_BEGIN`] and [`MARKDOWN_END`]
/// replaced by `table`; None when the marks are not there, once each, in order.
pub fn splice(text: &str, table: &str) -> Option<String> {
    let (begin, end) = (text.find(MARKDOWN_BEGIN)?, text.find(MARKDOWN_END)?);
    if text.matches(MARKDOWN_BEGIN).count() != 1
        || text.matches(MARKDOWN_END).count() != 1
        || end < begin
    {
        return None;
    }
    let head = &text[..begin + MARKDOWN_BEGIN.len()];
    Some(format!("{head}\n{}{}", table, &text[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(seed: u64, lbe_busy: f64, rt: Option<f64>) -> Figures {
        Figures {
            mix: Mix::Mixed,
            seed,
            policy: Policy::Hybrid,
            placement: Placement::Late,
            default: true,
            overload: false,
            lbe_busy,
            lbe_mem: lbe_busy / 2.0,
            queue_mean_ms: 10.0 * seed as f64,
            turnaround_mean_s: 60.0,
            rt_p99_ms: rt,
            idle_while_queued_gpu_s: 0.0,
            preemptions: 0,
            evictions: seed,
            jobs: 10,
            completed: 10,
            work_done_share: 1.0 - 0.01 * seed as f64,
        }
    }

    #[test]
    fn median_and_worst_seed_over_known_figures() {
        assert_eq!(OverSeeds::of(&[]), None);
        let o = OverSeeds::of(&[(4, 0.3), (1, 0.1), (2, 0.9), (3, 0.2)]).unwrap();
        assert_eq!((o.worst, o.worst_seed), (0.9, 2));
        assert!(
            (o.median - 0.25).abs() < 1e-12,
            "even count: mean of 0.2 and 0.3"
        );
        let o = OverSeeds::of(&[(5, 7.0), (6, 1.0), (7, 3.0)]).unwrap();
        assert_eq!((o.median, o.worst, o.worst_seed), (3.0, 7.0, 5));
        // Ties: the lowest seed is named.
        let o = OverSeeds::of(&[(9, 2.0), (3, 2.0), (8, 1.0)]).unwrap();
        assert_eq!(o.worst_seed, 3);
    }

    #[test]
    fn runs_are_grouped_by_mix_policy_and_placement() {
        let mut other = figures(1, 0.5, None);
        other.placement = Placement::Weighted;
        other.default = false;
        let runs = vec![
            figures(1, 0.02, Some(3.0)),
            other,
            figures(2, 0.08, Some(30.0)),
            figures(3, 0.04, None),
        ];
        let a = aggregate(&runs);
        assert_eq!(a.len(), 2);
        let late = &a[0];
        assert_eq!(late.placement, Placement::Late);
        assert!(late.default);
        assert_eq!(late.seeds, [1, 2, 3]);
        assert_eq!(
            (
                late.lbe_busy.median,
                late.lbe_busy.worst,
                late.lbe_busy.worst_seed
            ),
            (0.04, 0.08, 2)
        );
        assert_eq!(late.queue_mean_ms.worst_seed, 3);
        // Seed 3 had no real-time jobs: the p99 is over the two that had.
        let rt = late.rt_p99_ms.unwrap();
        assert_eq!((rt.median, rt.worst, rt.worst_seed), (16.5, 30.0, 2));
        assert!((late.work_not_done.worst - 0.03).abs() < 1e-12);
        assert!(!a[1].default);
        assert_eq!(a[1].seeds, [1]);
        // Mixed goals: median 4% <= 5%, worst 8% <= 10%: met; rt p99 30 ms: not.
        let g = goals(late);
        assert!(g[0].met, "{g:?}");
        assert!(!g[1].met, "{g:?}");
        assert!(g[2].met, "{g:?}");
    }

    /// docs/replay.md holds the table `--markdown` writes: between the marks,
    /// a line saying what it is, the header, the rule, then rows of as many
    /// columns naming a mix, a policy and a placement (checked without
    /// running anything).
    #[test]
    fn the_docs_table_is_the_one_the_command_writes() {
        let doc = include_str!("../../../docs/replay.md");
        let (begin, end) = (
            doc.find(MARKDOWN_BEGIN).unwrap(),
            doc.find(MARKDOWN_END).unwrap(),
        );
        let table = doc[begin + MARKDOWN_BEGIN.len()..end]
            .strip_prefix('\n')
            .unwrap();
        assert_eq!(
            splice(doc, table).as_deref(),
            Some(doc),
            "marks once each, in order"
        );
        let lines: Vec<&str> = table.trim().lines().collect();
        assert!(
            lines[0].contains("keling replay --synthetic"),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "");
        assert_eq!(lines[2], MARKDOWN_HEADER);
        assert_eq!(lines[3], MARKDOWN_RULE);
        assert!(lines.len() > 4, "rows");
        let columns = MARKDOWN_HEADER.matches('|').count();
        for row in &lines[4..] {
            assert_eq!(row.matches('|').count(), columns, "{row}");
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(Mix::ALL.iter().any(|m| m.as_str() == cells[1]), "{row}");
            assert!(
                Policy::EVERY.iter().any(|p| p.as_str() == cells[2]),
                "{row}"
            );
            assert!(
                Placement::ALL.iter().any(|p| cells[3].contains(p.as_str())),
                "{row}"
            );
        }
    }

    #[test]
    fn the_markdown_table_has_a_row_per_aggregate_with_every_column() {
        let a = aggregate(&[figures(1, 0.02, Some(3.0)), figures(2, 0.04, Some(5.0))]);
        let md = markdown("Seeds 1-2.", &a);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "Seeds 1-2.");
        assert_eq!(lines[2], MARKDOWN_HEADER);
        assert_eq!(lines[3], MARKDOWN_RULE);
        assert_eq!(lines.len(), 5);
        let columns = |l: &str| l.matches('|').count();
        assert_eq!(columns(lines[4]), columns(MARKDOWN_HEADER));
        assert_eq!(columns(MARKDOWN_RULE), columns(MARKDOWN_HEADER));
        assert!(
            lines[4].starts_with("| mixed | hybrid | **late** (default) | 3.00% / 4.00% (2) |"),
            "{}",
            lines[4]
        );
        let doc = format!("intro\n{MARKDOWN_BEGIN}\nold table\n{MARKDOWN_END}\nafter\n");
        let spliced = splice(&doc, &md).unwrap();
        assert_eq!(
            spliced,
            format!("intro\n{MARKDOWN_BEGIN}\n{md}{MARKDOWN_END}\nafter\n")
        );
        assert_eq!(
            splice(&spliced, &md).as_deref(),
            Some(&spliced[..]),
            "idempotent"
        );
        assert_eq!(splice("no marks", &md), None);
        assert_eq!(
            splice(&format!("{MARKDOWN_END}{MARKDOWN_BEGIN}"), &md),
            None
        );
    }
}
