//! A burst of short tasks through a real agent (issue 32, defect 5): root, real
//! eBPF, the simulated driver, `true` launched a few thousand times with
//! `keling launch`. Afterwards the archive is capped by count, `keling status`
//! stays small and fast and still tells how many tasks finished, and more of the
//! archive can be asked for a page at a time. `KELING_ARCHIVE_TEST_TASKS=N` launches
//! N tasks instead of 3000 (at least 2000), to measure a longer burst.
use std::{
    process::{Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use keling_agent::control::StatusReply;
use keling_tests::{
    Fixture,
    agent::{Agent, wait_for},
    keling_bin,
};

/// Tasks launched by default, and clients launching at once.
const DEFAULT_TASKS: u64 = 3000;
const CLIENTS: u64 = 8;
/// `keling run --archive-max`'s default (keling-agent's `defaults::ARCHIVE_MAX`).
const ARCHIVE_MAX: u64 = 2000;
/// Archived tasks a plain `keling status` lists, and `--all` at most.
const LISTED: usize = 50;
const LISTED_MAX: usize = 1000;

/// `keling status ARGS` (it must succeed): its standard output and how long it took.
fn status(agent: &Agent, args: &[&str]) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let out = Command::new(keling_bin())
        .arg("status")
        .args(args)
        .arg("--socket")
        .arg(&agent.socket)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "keling status {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.stdout, took)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_burst_of_short_tasks_leaves_status_small_and_counted() {
    let Some(fx) = Fixture::scheduler(
        "a_burst_of_short_tasks_leaves_status_small_and_counted",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let tasks: u64 = std::env::var("KELING_ARCHIVE_TEST_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_TASKS)
        .max(ARCHIVE_MAX);
    let agent = Agent::start(fx.sim(), &["--slots", "16"]);
    let rss_before = rss_kib(agent.pid);
    let next = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < tasks {
                    let st = Command::new(keling_bin())
                        .arg("launch")
                        .arg("--socket")
                        .arg(&agent.socket)
                        .args(["--priority", "8", "--", "true"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .unwrap();
                    assert!(st.success(), "keling launch -- true: {st}");
                }
            });
        }
    });
    eprintln!(
        "{tasks} launches of true by {CLIENTS} clients in {:?}",
        started.elapsed()
    );
    // Every task finished and is archived (at the next tick), the last one too.
    let mut s = None;
    wait_for("every task archived", Duration::from_secs(30), || {
        let now = agent.status_reply();
        let done = now.tasks.iter().all(|t| t.state == "ARCHIVED")
            && now.tasks.iter().any(|t| t.id == tasks);
        s = Some(now);
        done
    });
    let s = s.expect("a status");

    // Small and fast, as text and as JSON.
    let (json, json_took) = status(&agent, &["--json"]);
    let (text, text_took) = status(&agent, &[]);
    let text = String::from_utf8(text).unwrap();
    eprintln!(
        "after {tasks} tasks: keling status --json {} bytes in {json_took:?}, \
         keling status {} bytes in {text_took:?}; agent RSS {rss_before} -> {} KiB",
        json.len(),
        text.len(),
        rss_kib(agent.pid)
    );
    assert!(json.len() < 128 << 10, "{} bytes", json.len());
    let archive = &s.archive;
    assert_eq!(archive.kept as u64, ARCHIVE_MAX, "{archive:?}");
    assert_eq!(archive.forgotten, tasks - ARCHIVE_MAX, "{archive:?}");
    assert_eq!(archive.completed, tasks, "{archive:?}");
    assert_eq!(archive.failed, 0, "{archive:?}");
    // The status lists only the archived tasks that finished last: the last
    // launched among them (at most CLIENTS - 1 others ran with it).
    let listed = &s.tasks;
    assert_eq!(listed.len(), LISTED, "{archive:?}");
    assert!(listed.iter().any(|t| t.id == tasks), "task {tasks} listed");

    assert!(
        text.contains(&format!(
            "finished tasks: {ARCHIVE_MAX} kept (the last {ARCHIVE_MAX} for 10m 00s), \
             {LISTED} of them listed; since the agent started {tasks} completed, 0 failed, \
             {} forgotten",
            tasks - ARCHIVE_MAX
        )),
        "{text}"
    );
    // More on request: the most one reply lists, then a page further on.
    let (all, all_took) = status(&agent, &["--all", "--json"]);
    let all: StatusReply = serde_json::from_slice(&all).unwrap();
    eprintln!("keling status --all --json in {all_took:?}");
    assert_eq!(all.tasks.len(), LISTED_MAX);
    let (page, _) = status(&agent, &["--archived", "10", "--skip", "1995", "--json"]);
    let page: StatusReply = serde_json::from_slice(&page).unwrap();
    assert_eq!(page.tasks.len(), 5);
    assert_eq!(page.archive.skipped, 1995);
    // A page past a reply's limit is the client's error.
    let out = Command::new(keling_bin())
        .args(["status", "--archived", "5000", "--socket"])
        .arg(&agent.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--skip"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
