//! `keling report` on a constructed scheduling log whose findings are known: a
//! local imbalance (GPU 1, window 2), a global cause (every GPU, window 8) and a
//! saturated GPU and task (GPU 3 and the task on it, windows 12-15). The test
//! parses the page: the findings' kinds, rows and windows, heatmap cells, the
//! timelines and the latency histogram, and that the page fetches nothing.
//!
//! Built with the agent's own log writer (`sched::log_writer::Logs`), so the log is
//! exactly what `keling run --sched-log` writes.
use std::path::{Path, PathBuf};

use keling_agent::{
    log_format::Record,
    report::{ReportOptions, build},
    sched::log_writer::Logs,
};
use keling_sched::{Reason, TaskState, Transition};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// The agent's clock is CLOCK_MONOTONIC: the log starts far from 0.
const BASE: u64 = 5_000 * S;

/// Collects transitions, then writes them in time order (as the agent does: the
/// core's clock never goes back) with event ids counting up.
struct LogBuilder {
    path: PathBuf,
    lines: Vec<(u64, usize, Transition)>,
}

impl LogBuilder {
    fn new(path: &Path) -> Self {
        LogBuilder {
            path: path.to_owned(),
            lines: Vec::new(),
        }
    }

    #[expect(clippy::too_many_arguments, reason = "one transition's fields")]
    fn t(
        &mut self,
        task: u64,
        name: &str,
        gpu: u32,
        from: TaskState,
        to: TaskState,
        reason: Reason,
        at_ns: u64,
    ) {
        let terminal = matches!(
            to,
            TaskState::Completed | TaskState::Failed | TaskState::Archived
        );
        let n = self.lines.len();
        self.lines.push((
            at_ns,
            n,
            Transition {
                event_id: 0,
                task,
                name: name.to_owned(),
                pid: 1000 + task as u32,
                gpu: Some(gpu),
                priority: 5,
                from,
                to,
                reason,
                timestamp_ns: BASE + at_ns,
                exit_code: terminal.then_some(0),
            },
        ));
    }

    /// A task queued at `at_ns` that waits `wait_ns`, runs 1 s and completes.
    fn queued(&mut self, task: u64, gpu: u32, at_ns: u64, wait_ns: u64) {
        use TaskState::*;
        let name = format!("job{task}");
        self.t(task, &name, gpu, Pending, Preempted, Reason::Queued, at_ns);
        self.t(
            task,
            &name,
            gpu,
            Preempted,
            Running,
            Reason::Resumed,
            at_ns + wait_ns,
        );
        self.t(
            task,
            &name,
            gpu,
            Running,
            Completed,
            Reason::Exited,
            at_ns + wait_ns + S,
        );
    }

    /// Writes the transitions in time order, then `records`.
    fn write(mut self, records: &[Record]) {
        let mut logs = Logs::open(Some(&self.path), None).unwrap();
        self.lines.sort_by_key(|(at, n, _)| (*at, *n));
        for (i, (_, _, mut t)) in self.lines.into_iter().enumerate() {
            t.event_id = i as u64 + 1;
            logs.transition(&t);
        }
        for r in records {
            logs.record(r);
        }
        logs.flush();
    }
}

fn constructed_log(dir: &Path) -> PathBuf {
    use TaskState::*;
    let path = dir.join("sched.jsonl");
    let mut b = LogBuilder::new(&path);
    // t = 0: a task placed at once on GPU 0 (anchors window 0).
    b.t(1, "anchor", 0, Pending, Running, Reason::Placed, 0);
    b.t(1, "anchor", 0, Running, Completed, Reason::Exited, S);
    // Local imbalance: GPU 1, a 500 ms wait ending at 31.5 s (window 2).
    b.queued(2, 1, 31 * S, 500 * MS);
    // Global cause: every GPU waits 1 s, ending at 122 s (window 8).
    for gpu in 0..4 {
        b.queued(10 + u64::from(gpu), gpu, 121 * S, S);
    }
    // Saturated: task 20 on GPU 3 is preempted for 2 s in each of windows 12-15.
    b.t(20, "render", 3, Pending, Running, Reason::Placed, 170 * S);
    for k in 0..4 {
        let at = 178 * S + k * 15 * S;
        b.t(
            20,
            "render",
            3,
            Running,
            Preempted,
            Reason::QuantumExpired,
            at,
        );
        b.t(
            20,
            "render",
            3,
            Preempted,
            Running,
            Reason::Resumed,
            at + 2 * S,
        );
    }
    b.t(20, "render", 3, Running, Completed, Reason::Exited, 240 * S);
    let late: Vec<Record> = [(2, 30), (20, 40), (11, 25)]
        .into_iter()
        .map(|(task, ms)| Record::LateDecision {
            task,
            action: "freeze".into(),
            end_to_end_ns: ms * MS,
            timeout_ns: 23_800_000,
            confirmed: true,
        })
        .collect();
    b.write(&late);
    path
}

/// The value of `name="..."` in `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let len = tag[at..].find('"').expect("closing quote");
    &tag[at..at + len]
}

/// Every `<li class="finding ...">` of the list for `grid`: (kind, rows, first, last).
fn findings(html: &str, grid: &str) -> Vec<(String, String, usize, usize)> {
    let start = html
        .find(&format!(r#"data-grid="{grid}""#))
        .unwrap_or_else(|| panic!("no findings list for {grid}"));
    let list = &html[start..start + html[start..].find("</ul>").unwrap()];
    list.split("<li ")
        .skip(1)
        .map(|li| {
            let tag = &li[..li.find('>').unwrap()];
            (
                attr(tag, "data-kind").to_owned(),
                attr(tag, "data-rows").to_owned(),
                attr(tag, "data-first-window").parse().unwrap(),
                attr(tag, "data-last-window").parse().unwrap(),
            )
        })
        .collect()
}

/// The `data-ms` of the heatmap cell at (row label, window).
fn cell_ms(html: &str, svg_id: &str, row: &str, window: usize) -> f64 {
    let start = html
        .find(&format!(r#" id="{svg_id}" class="heatmap""#))
        .unwrap();
    let svg = &html[start..start + html[start..].find("</svg>").unwrap()];
    svg.split("<rect ")
        .skip(1)
        .map(|r| &r[..r.find('>').unwrap()])
        .find(|tag| attr(tag, "data-row") == row && attr(tag, "data-window") == window.to_string())
        .map(|tag| attr(tag, "data-ms").parse().unwrap())
        .unwrap_or_else(|| panic!("no cell {row} {window}"))
}

#[test]
fn a_constructed_log_gives_its_known_findings() {
    let dir = keling_tests::tempdir();
    let log = constructed_log(&dir);
    let report = build(&[log], &ReportOptions::default()).unwrap();
    let page = report.write(&dir.join("out")).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();

    assert_eq!(
        findings(&html, "gpu-heatmap"),
        vec![
            (
                "global_cause".into(),
                "GPU 0|GPU 1|GPU 2|GPU 3".into(),
                8,
                8
            ),
            ("saturated".into(), "GPU 3".into(), 12, 15),
            ("local_imbalance".into(), "GPU 1".into(), 2, 2),
        ]
    );
    assert_eq!(
        findings(&html, "task-heatmap"),
        vec![
            (
                "global_cause".into(),
                "task 10 (job10)|task 11 (job11)|task 12 (job12)|task 13 (job13)".into(),
                8,
                8
            ),
            ("saturated".into(), "task 20 (render)".into(), 12, 15),
            ("local_imbalance".into(), "task 2 (job2)".into(), 2, 2),
        ]
    );
    // Each finding names its GPU or task and its window in words too.
    assert!(
        html.contains("local imbalance: GPU 1 in window 2 (30-45 s): waits of 500 ms on average"),
        "{html}"
    );
    // A task that never waited is no row of the task heatmap.
    assert!(!html.contains("task 1 (anchor)"), "{html}");
    assert!(
        html.contains("saturated: GPU 3 hot for 4 consecutive windows, windows 12-15 (180-240 s)")
    );

    // Cells: the mean wait ending in the window, ms.
    assert_eq!(cell_ms(&html, "gpu-heatmap", "GPU 1", 2), 500.0);
    assert_eq!(cell_ms(&html, "gpu-heatmap", "GPU 2", 8), 1000.0);
    assert_eq!(cell_ms(&html, "gpu-heatmap", "GPU 3", 13), 2000.0);
    assert_eq!(cell_ms(&html, "gpu-heatmap", "GPU 0", 0), 0.0);
    assert_eq!(
        cell_ms(&html, "task-heatmap", "task 20 (render)", 15),
        2000.0
    );

    // Timelines: every task that waited (6: the anchor never did), with running
    // and preempted spans and ends.
    assert!(html.contains(r#"id="timelines""#) && html.contains(r#"data-tasks="6""#));
    assert!(
        html.contains(r#"data-state="PREEMPTED""#) && html.contains(r#"data-state="COMPLETED""#)
    );

    // Latency: the three late decisions and the timeout they were late for.
    let latency = &html[html.find(r#"id="latency""#).expect("a latency figure")..];
    assert!(latency.contains(r#"data-decisions="3""#));
    assert!(latency.contains(r#"data-timeout-ns="23800000""#));

    // Self-contained: nothing to fetch.
    for external in ["<script", "<link", "src=", "@import", "url("] {
        assert!(!html.contains(external), "the page refers to {external}");
    }
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    // report.json beside it has the same findings.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/report.json")).unwrap())
            .unwrap();
    assert_eq!(json["gpu_findings"].as_array().unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A report from an input log replays it through the core: a synthetic run's
/// input log and scheduling log give the same heatmap.
#[test]
fn an_input_log_and_its_scheduling_log_give_the_same_heatmap() {
    use keling_agent::replay::synthetic::{Placement, RunLogs, SyntheticOptions, run, workload};
    let dir = keling_tests::tempdir();
    let opts = SyntheticOptions {
        gpus: 2,
        hours: 1.0,
        load: 0.9,
        tick_ms: 100,
        active_ms: 200,
        ..SyntheticOptions::default()
    };
    let logs = RunLogs {
        input_log: Some(dir.join("in.jsonl")),
        sched_log: Some(dir.join("sched.jsonl")),
    };
    run(
        &opts,
        &workload(&opts),
        keling_sched::Policy::Hybrid,
        Placement::Weighted,
        &logs,
    )
    .unwrap();
    let from_inputs = build(&[dir.join("in.jsonl")], &ReportOptions::default()).unwrap();
    let from_sched = build(&[dir.join("sched.jsonl")], &ReportOptions::default()).unwrap();
    assert_eq!(from_inputs.gpu_grid.rows, from_sched.gpu_grid.rows);
    // The scheduling log cannot see idle periods; this workload has none, so the
    // waits agree, except those still open at the end: the input log ends at the
    // last tick, the scheduling log at the last transition.
    let settled = from_sched.gpu_grid.windows() - 1;
    assert!(settled > 100, "an hour of 15 s windows");
    let mut hot = 0;
    for (a, b) in from_inputs
        .gpu_grid
        .cells
        .iter()
        .zip(&from_sched.gpu_grid.cells)
    {
        assert_eq!(a[..settled], b[..settled]);
        hot += a[..settled].iter().filter(|&&ms| ms >= 200.0).count();
    }
    assert!(hot > 0, "the run has hot cells to compare");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The command line writes the same page, when the binary is there.
#[test]
fn keling_report_writes_the_page_and_prints_the_findings() {
    let Some(bin) = keling_bin() else {
        return;
    };
    let dir = keling_tests::tempdir();
    let log = constructed_log(&dir);
    let out = std::process::Command::new(bin)
        .args(["report", "--out"])
        .arg(dir.join("out"))
        .arg(&log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("index.html"), "{stdout}");
    assert!(
        stdout.contains("global cause: 4 of 4 rows hot in window 8"),
        "{stdout}"
    );
    assert!(dir.join("out/index.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `$KELING_BIN`, else a `keling` built next to this test; a skip when neither.
fn keling_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("KELING_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("keling"))
        })?;
    if bin.exists() {
        Some(bin)
    } else {
        keling_tests::skip(
            "keling_report_writes_the_page",
            "no keling binary (cargo xtask test builds one; or set KELING_BIN)",
        );
        None
    }
}
