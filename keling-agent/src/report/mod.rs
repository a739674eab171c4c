//! `keling report`: one self-contained HTML page (inline CSS and SVG, nothing
//! fetched) from scheduling logs and input logs: the queueing-delay heatmaps (GPU
//! x 15 s windows and task x 15 s windows), the longest waits with the GPUs idle
//! through them ([`waits`]), the root-cause findings ([`grid`]), per-task state
//! timelines, and the decision-latency distribution ([`svg`]).
//!
//! Each LOG is read by its first line: an input log (a header, or a serde
//! `Input`) is replayed exactly through the core (`replay::exact`) with its
//! header's config, or the agent's defaults; a scheduling log is read as it is.
//! Queueing delay is measured as `replay::figures` defines it. A scheduling log
//! alone has no `Active`/`Idle` inputs, so the time between a preemption for
//! idleness and the task's next run is not counted as delay (the log cannot say
//! when the task wanted the GPU again); an input log can.
//!
//! Decision latency comes from the `late_decision` records of the scheduling logs
//! (only the late ones are logged), or, given `--latency FILE`, from the full
//! end-to-end histogram of `keling status --export json`.
pub mod grid;
pub mod svg;
pub mod waits;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use keling_sched::{Input, Policy, SchedConfig, TaskId, TaskState};
use serde::{Deserialize, Serialize};

use self::{
    grid::{Finding, Grid, GridBuilder},
    svg::{Timeline, esc},
    waits::LongWait,
};
use crate::{
    log_format::{Record, SchedLine, TransitionLine},
    replay::{
        Metrics, Summary,
        figures::Wait,
        log::{InputLogReader, read_sched_log},
    },
};

/// How many of the longest waits the report tells.
pub const LONG_WAITS_SHOWN: usize = 10;

/// How a report is made.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    pub window_ns: u64,
    /// Rows of the task heatmap and the timelines: the tasks that waited longest.
    pub task_rows: usize,
    /// `keling status --export json` output, for the latency distribution.
    pub latency_json: Option<PathBuf>,
    /// The config to replay input logs without a header with.
    pub config: SchedConfig,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            window_ns: grid::WINDOW_NS,
            task_rows: 40,
            latency_json: None,
            config: SchedConfig::default(),
        }
    }
}

/// One log, read.
struct Source {
    name: String,
    transitions: Vec<TransitionLine>,
    waits: Vec<Wait>,
    summary: Summary,
    /// `(end_to_end_ns, 1)` of late decisions, and the timeouts they were late for.
    late: Vec<(u64, u64)>,
    timeout_ns: Option<u64>,
}

fn first_line(path: &Path) -> anyhow::Result<String> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("read {}", path.display()))?;
        if !line.trim().is_empty() {
            return Ok(line);
        }
    }
    Ok(String::new())
}

fn load(path: &Path, opts: &ReportOptions) -> anyhow::Result<Source> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let first = first_line(path)?;
    let is_input_log =
        first.starts_with("{\"keling_input_log\"") || serde_json::from_str::<Input>(&first).is_ok();
    if is_input_log {
        let reader = InputLogReader::open(path)?;
        let (config, policy) = match &reader.header {
            Some(h) => (h.config.clone(), h.policy),
            None => (opts.config.clone(), Policy::Hybrid),
        };
        let mut metrics = Metrics::new(config.gpus.iter().map(|g| g.index)).keep_waits();
        let mut sched = keling_sched::Scheduler::with_policy(config, policy);
        let mut transitions = Vec::new();
        for input in reader {
            let input = input?;
            let out = sched.step(&input);
            metrics.observe(&input, &out);
            transitions.extend(out.transitions.iter().map(TransitionLine::from));
        }
        let (summary, waits) = metrics.finish();
        return Ok(Source {
            name,
            transitions,
            waits,
            summary,
            late: Vec::new(),
            timeout_ns: None,
        });
    }
    let lines = read_sched_log(path)?;
    let mut metrics = Metrics::new([]).keep_waits();
    let mut transitions = Vec::new();
    let mut late = Vec::new();
    let mut timeout_ns = None;
    for line in lines {
        match line {
            SchedLine::Transition(t) => {
                metrics.observe_line(&t);
                transitions.push(t);
            }
            SchedLine::Record(Record::Placement {
                task,
                gpu,
                timestamp_ns,
                ..
            }) => metrics.observe_placement(task, gpu, timestamp_ns),
            SchedLine::Record(Record::LateDecision {
                end_to_end_ns,
                timeout_ns: t,
                ..
            }) => {
                late.push((end_to_end_ns, 1));
                timeout_ns = Some(t);
            }
            SchedLine::Record(_) => {}
        }
    }
    let (summary, waits) = metrics.finish();
    Ok(Source {
        name,
        transitions,
        waits,
        summary,
        late,
        timeout_ns,
    })
}

/// The end-to-end histogram of all actions in a `keling status --export json`
/// document: `(value_ns, count)` buckets and the timeout.
#[derive(Deserialize)]
struct LatencyExport {
    timeout_ns: Option<u64>,
    histograms: Vec<LatencyHistogram>,
}

#[derive(Deserialize)]
struct LatencyHistogram {
    stage: String,
    action: Option<String>,
    buckets: Vec<[u64; 2]>,
}

/// `(value_ns, count)` buckets of a latency distribution.
type Buckets = Vec<(u64, u64)>;

fn load_latency(path: &Path) -> anyhow::Result<(Buckets, Option<u64>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let doc: LatencyExport = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `keling status --export json` document",
            path.display()
        )
    })?;
    let Some(h) = doc
        .histograms
        .iter()
        .find(|h| h.stage == "end_to_end" && h.action.is_none())
    else {
        bail!("{}: no end_to_end histogram of all actions", path.display());
    };
    Ok((
        h.buckets.iter().map(|b| (b[0], b[1])).collect(),
        doc.timeout_ns,
    ))
}

/// Everything the page shows, also written as `report.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub sources: Vec<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub gpu_grid: Grid,
    pub task_grid: Grid,
    /// The longest waits (at most [`LONG_WAITS_SHOWN`]), longest first, each
    /// with the GPUs idle through it.
    pub long_waits: Vec<LongWait>,
    pub gpu_findings: Vec<Finding>,
    pub task_findings: Vec<Finding>,
    pub summaries: Vec<Summary>,
    /// How many tasks the task heatmap and the timelines leave out.
    pub tasks_left_out: usize,
    pub latency_source: String,
    pub latency_decisions: u64,
    #[serde(skip)]
    html: String,
}

impl Report {
    /// The page.
    pub fn html(&self) -> &str {
        &self.html
    }

    /// Writes `index.html` and `report.json` into `dir` (created if needed);
    /// returns the page's path.
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let page = dir.join("index.html");
        std::fs::write(&page, &self.html).with_context(|| format!("write {}", page.display()))?;
        let json = dir.join("report.json");
        std::fs::write(&json, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("write {}", json.display()))?;
        Ok(page)
    }
}

/// Reads `logs` and makes the report.
pub fn build(logs: &[PathBuf], opts: &ReportOptions) -> anyhow::Result<Report> {
    if logs.is_empty() {
        bail!("no logs given");
    }
    let sources = logs
        .iter()
        .map(|p| load(p, opts))
        .collect::<anyhow::Result<Vec<Source>>>()?;
    let many = sources.len() > 1;
    let prefix = |s: &Source| {
        if many {
            format!("{}: ", s.name)
        } else {
            String::new()
        }
    };

    let times = sources.iter().flat_map(|s| {
        s.transitions
            .iter()
            .map(|t| t.timestamp_ns)
            .chain(s.waits.iter().flat_map(|w| [w.start_ns, w.start_ns + w.ns]))
    });
    let (start_ns, end_ns) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (start_ns, end_ns) = if start_ns > end_ns {
        (0, 0)
    } else {
        (start_ns, end_ns)
    };

    // GPU rows: every GPU any source placed a task on.
    let mut gpu_rows: BTreeMap<(usize, u32), usize> = BTreeMap::new();
    for (i, s) in sources.iter().enumerate() {
        for t in &s.transitions {
            if let Some(g) = t.gpu {
                gpu_rows.insert((i, g), 0);
            }
        }
        for g in &s.summary.gpus {
            gpu_rows.insert((i, g.gpu), 0);
        }
    }
    let gpu_labels: Vec<String> = gpu_rows
        .keys()
        .map(|&(i, g)| format!("{}GPU {g}", prefix(&sources[i])))
        .collect();
    for (row, v) in gpu_rows.values_mut().enumerate() {
        *v = row;
    }
    let mut gpus = GridBuilder::new(gpu_labels, start_ns, end_ns, opts.window_ns);
    for (i, s) in sources.iter().enumerate() {
        for w in &s.waits {
            if let Some(&row) = w.gpu.and_then(|g| gpu_rows.get(&(i, g))) {
                gpus.add(row, w.start_ns + w.ns, w.ns as f64 / 1e6);
            }
        }
    }
    let gpu_grid = gpus.build();

    // The longest waits, and the GPUs of the same log idle through them.
    let mut long = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let busy = waits::busy_intervals(&s.transitions, end_ns);
        let known: Vec<u32> = gpu_rows.keys().filter(|k| k.0 == i).map(|k| k.1).collect();
        let names: BTreeMap<TaskId, &str> = s
            .summary
            .per_task
            .iter()
            .map(|d| (d.task, d.name.as_str()))
            .collect();
        let label = |task: TaskId| match names.get(&task) {
            Some(name) => format!("{}task {task} ({name})", prefix(s)),
            None => format!("{}task {task}", prefix(s)),
        };
        long.extend(waits::long_waits(&s.waits, &busy, &known, &label, start_ns));
    }
    let long_waits = waits::longest(long, LONG_WAITS_SHOWN);

    // Task rows: the tasks that waited longest, in arrival order.
    let mut tasks: Vec<(usize, TaskId, f64, u64, String)> = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        for d in &s.summary.per_task {
            tasks.push((
                i,
                d.task,
                d.queueing_delay_ms,
                d.arrived_ns,
                format!("{}task {} ({})", prefix(s), d.task, d.name),
            ));
        }
    }
    // A task that never waited explains no queueing: it is not a row.
    tasks.retain(|t| t.2 > 0.0);
    let total_tasks = tasks.len();
    tasks.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.3.cmp(&b.3)));
    tasks.truncate(opts.task_rows);
    tasks.sort_by_key(|t| (t.3, t.0, t.1));
    let task_row: BTreeMap<(usize, TaskId), usize> = tasks
        .iter()
        .enumerate()
        .map(|(row, t)| ((t.0, t.1), row))
        .collect();
    let mut task_builder = GridBuilder::new(
        tasks.iter().map(|t| t.4.clone()).collect(),
        start_ns,
        end_ns,
        opts.window_ns,
    );
    for (i, s) in sources.iter().enumerate() {
        for w in &s.waits {
            if let Some(&row) = task_row.get(&(i, w.task)) {
                task_builder.add(row, w.start_ns + w.ns, w.ns as f64 / 1e6);
            }
        }
    }
    let task_grid = task_builder.build();

    // Timelines of the same tasks.
    let mut timelines: Vec<Timeline> = tasks
        .iter()
        .map(|t| Timeline {
            label: t.4.clone(),
            segments: Vec::new(),
        })
        .collect();
    for (i, s) in sources.iter().enumerate() {
        let mut last: BTreeMap<TaskId, (u64, TaskState)> = BTreeMap::new();
        for t in &s.transitions {
            let Some(&row) = task_row.get(&(i, t.task)) else {
                continue;
            };
            let Some((from, to)) = t.states() else {
                continue;
            };
            let (since, state) = last.get(&t.task).copied().unwrap_or((t.timestamp_ns, from));
            timelines[row].segments.push((since, t.timestamp_ns, state));
            if matches!(to, TaskState::Completed | TaskState::Failed) {
                timelines[row]
                    .segments
                    .push((t.timestamp_ns, t.timestamp_ns, to));
            }
            last.insert(t.task, (t.timestamp_ns, to));
        }
        for (task, (since, state)) in last {
            if state.is_live()
                && let Some(&row) = task_row.get(&(i, task))
            {
                timelines[row].segments.push((since, end_ns, state));
            }
        }
    }

    // Decision latency.
    let (latency, timeout_ns, latency_source) = match &opts.latency_json {
        Some(path) => {
            let (buckets, timeout) = load_latency(path)?;
            (
                buckets,
                timeout,
                format!("every decision, from {}", path.display()),
            )
        }
        None => {
            let late: Vec<(u64, u64)> = sources.iter().flat_map(|s| s.late.clone()).collect();
            let timeout = sources.iter().find_map(|s| s.timeout_ns);
            (
                late,
                timeout,
                "late decisions only (the scheduling log records no others; give --latency FILE \
                 from `keling status --export json` for all of them)"
                    .to_owned(),
            )
        }
    };
    let latency_decisions: u64 = latency.iter().map(|&(_, n)| n).sum();

    let gpu_findings = gpu_grid.findings();
    let task_findings = task_grid.findings();
    let mut report = Report {
        sources: sources.iter().map(|s| s.name.clone()).collect(),
        start_ns,
        end_ns,
        long_waits,
        gpu_findings,
        task_findings,
        summaries: sources.iter().map(|s| s.summary.clone()).collect(),
        tasks_left_out: total_tasks - tasks.len(),
        latency_source,
        latency_decisions,
        html: String::new(),
        gpu_grid,
        task_grid,
    };
    let latency_svg = if latency.is_empty() {
        None
    } else {
        Some(svg::latency_histogram(
            &latency,
            timeout_ns,
            "decision latency, end to end",
        ))
    };
    report.html = page(&report, &timelines, latency_svg.as_deref());
    Ok(report)
}

fn findings_html(title: &str, findings: &[Finding], grid_id: &str) -> String {
    let mut s = format!("<h3>{}</h3>", esc(title));
    if findings.is_empty() {
        s.push_str(r#"<p class="none">No findings: no hot cell (&#8805; 200 ms) stands out.</p>"#);
        return s;
    }
    s.push_str(&format!(r#"<ul class="findings" data-grid="{grid_id}">"#));
    for f in findings {
        let kind = serde_json::to_value(f.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = write!(
            s,
            r#"<li class="finding {kind}" data-kind="{kind}" data-rows="{}" data-first-window="{}" data-last-window="{}" data-peak-ms="{:.3}">{}</li>"#,
            esc(&f.rows.join("|")),
            f.first_window,
            f.last_window,
            f.peak_ms,
            esc(&f.text)
        );
    }
    s.push_str("</ul>");
    s
}

fn page(r: &Report, timelines: &[Timeline], latency_svg: Option<&str>) -> String {
    let mut s = String::new();
    s.push_str(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Keling report</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
.finding.global_cause { color: #a50026; } .finding.saturated { color: #d73027; } .finding.local_imbalance { color: #984807; }
.note { color: #555; font-size: 12px; } figure { margin: 8px 0; overflow-x: auto; }
</style></head><body>
<h1>Keling report</h1>
"#,
    );
    let span_s = r.end_ns.saturating_sub(r.start_ns) / 1_000_000_000;
    let _ = write!(
        s,
        r#"<p>Logs: {}. Span: {} (h:mm:ss), from the first to the last timestamp.</p>"#,
        esc(&r.sources.join(", ")),
        svg::clock(span_s)
    );
    s.push_str("<table><tr><th>log</th><th>tasks</th><th>queueing delay mean</th><th>p99</th><th>preemptions</th><th>evictions</th><th>load-balance error (busy)</th></tr>");
    for (name, sum) in r.sources.iter().zip(&r.summaries) {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{:.1} ms</td><td>{:.1} ms</td><td>{}</td><td>{}</td><td>{:.2}%</td></tr>",
            esc(name),
            sum.tasks,
            sum.queueing_delay_ms.mean,
            sum.queueing_delay_ms.p99,
            sum.preemptions,
            sum.evictions,
            sum.load_balance_error * 100.0
        );
    }
    s.push_str("</table>");

    s.push_str("<h2>Longest waits</h2>");
    if r.long_waits.is_empty() {
        s.push_str(r#"<p class="none" id="no-long-waits">No task waited 200 ms or more.</p>"#);
    } else {
        s.push_str(r#"<p class="note">The longest waits for a GPU (200 ms or more), and the other GPUs of the same log on which no task was running for all of the wait, or for at least half of it. Seconds are counted from the log's start.</p><ul class="long-waits">"#);
        for w in &r.long_waits {
            let _ = write!(
                s,
                r#"<li class="long-wait" data-wait-ms="{}" data-idle-gpus="{}">{}</li>"#,
                w.wait_ns / 1_000_000,
                w.idle_gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                esc(&w.text)
            );
        }
        s.push_str("</ul>");
    }

    s.push_str("<h2>Root-cause findings</h2>");
    s.push_str(r#"<p class="note">A hot cell has a mean queueing delay of 200 ms or more. A window hot on at least half the rows (and at least two) points at a global cause; three or more consecutive hot windows in one row, at one saturated GPU or task; a hot cell in neither whose 3x3 neighbourhood variance exceeds 85 ms², at a local imbalance. Windows are 15 s, counted from the log's start.</p>"#);
    s.push_str(&findings_html("By GPU", &r.gpu_findings, "gpu-heatmap"));
    s.push_str(&findings_html("By task", &r.task_findings, "task-heatmap"));

    s.push_str("<h2>Queueing delay by GPU</h2><figure>");
    s.push_str(&svg::heatmap(&r.gpu_grid, "gpu-heatmap"));
    s.push_str("</figure><h2>Queueing delay by task</h2>");
    if r.tasks_left_out > 0 {
        let _ = write!(
            s,
            r#"<p class="note">The {} tasks that waited longest; {} others are left out.</p>"#,
            r.task_grid.rows.len(),
            r.tasks_left_out
        );
    }
    s.push_str("<figure>");
    s.push_str(&svg::heatmap(&r.task_grid, "task-heatmap"));
    s.push_str("</figure><h2>Task states over time</h2><figure>");
    s.push_str(&svg::timelines(timelines, r.start_ns, r.end_ns));
    s.push_str("</figure><h2>Decision latency</h2>");
    let _ = write!(
        s,
        r#"<p class="note">Source: {}.</p>"#,
        esc(&r.latency_source)
    );
    match latency_svg {
        Some(svg) => {
            s.push_str("<figure>");
            s.push_str(svg);
            s.push_str("</figure>");
        }
        None => {
            s.push_str(r#"<p class="none" id="no-latency">No decision latency in these logs.</p>"#)
        }
    }
    s.push_str(r#"<h2>How to read this</h2><p class="note">Queueing delay is the time a task wanted the GPU without holding it: from its arrival or a preemption (not one for idleness) until it runs again or ends. A cell is the mean of the waits that ended in its window. Generated by <code>keling report</code>; the same figures are in report.json beside this page.</p>"#);
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_needs_logs() {
        assert!(build(&[], &ReportOptions::default()).is_err());
    }

    /// A constructed scheduling log: GPUs 1-3 run a short task each and idle
    /// from 1 s on; task 164 (training) waits on GPU 4 behind task 1 from 1 s to
    /// 106 s; task 7 waits 150 ms on GPU 4, too short to tell.
    #[test]
    fn the_longest_wait_names_the_task_its_gpu_and_the_idle_ones() {
        const S: u64 = 1_000_000_000;
        let line = |task: TaskId, name: &str, gpu: u32, ts: u64, from: &str, to: &str| {
            let t = TransitionLine {
                event_id: 0,
                state_transition: format!("{from}\u{2192}{to}"),
                timestamp_ns: ts,
                task,
                name: name.to_owned(),
                pid: 1000 + task as u32,
                gpu: Some(gpu),
                priority: 0,
                reason: keling_sched::Reason::Placed,
                exit_code: None,
            };
            serde_json::to_string(&t).unwrap()
        };
        let mut log = Vec::new();
        for g in 1..=3 {
            log.push(line(10 + u64::from(g), "short", g, 0, "PENDING", "RUNNING"));
        }
        log.push(line(1, "serving", 4, 0, "PENDING", "RUNNING"));
        for g in 1..=3 {
            log.push(line(
                10 + u64::from(g),
                "short",
                g,
                S,
                "RUNNING",
                "COMPLETED",
            ));
        }
        log.push(line(164, "training", 4, S, "PENDING", "PREEMPTED"));
        log.push(line(1, "serving", 4, 106 * S, "RUNNING", "COMPLETED"));
        log.push(line(164, "training", 4, 106 * S, "PREEMPTED", "RUNNING"));
        log.push(line(7, "probe", 4, 106 * S, "PENDING", "PREEMPTED"));
        log.push(line(
            7,
            "probe",
            4,
            106 * S + 150_000_000,
            "PREEMPTED",
            "RUNNING",
        ));
        log.push(line(164, "training", 4, 200 * S, "RUNNING", "COMPLETED"));
        log.push(line(7, "probe", 4, 200 * S, "RUNNING", "COMPLETED"));
        let dir = std::env::temp_dir().join(format!("keling-report-waits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sched.jsonl");
        std::fs::write(&path, log.join("\n") + "\n").unwrap();
        let r = build(std::slice::from_ref(&path), &ReportOptions::default()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        let texts: Vec<&str> = r.long_waits.iter().map(|w| w.text.as_str()).collect();
        assert_eq!(
            texts,
            ["task 164 (training) waited 105 s on GPU 4 (from 1 s) while GPUs 1-3 were idle"],
            "the 150 ms wait is not told"
        );
        assert_eq!(r.long_waits[0].idle_gpus, [1, 2, 3]);
        assert_eq!(r.long_waits[0].wait_ns, 105 * S);
        assert!(
            r.html()
                .contains("waited 105 s on GPU 4 (from 1 s) while GPUs 1-3 were idle</li>"),
            "the page tells it"
        );
    }
}
