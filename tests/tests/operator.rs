//! What operators see of a running agent (root, real eBPF, the simulated driver):
//! Prometheus `/metrics` scraped by a real HTTP client (curl) and checked by
//! `promtool`, its figures against the simulator's ground truth and the agent's
//! own status; the latency interval log read back by the hdrhistogram crate's own
//! reader after the agent is gone, and by `keling histo`; docs/latency.md's commands.
//!
//! They share the one-agent lock and the host's cgroup tree: one at a time.
use std::{
    collections::BTreeMap,
    io::Write,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use base64::Engine;
use hdrhistogram::{
    Histogram,
    serialization::{
        Deserializer,
        interval_log::{IntervalLogIterator, LogEntry},
    },
};
use keling_agent::log_format::SchedLine;
use keling_sched::Reason;
use keling_tests::{
    ChildGuard, Fixture, Nvsim,
    agent::{Agent, cleanup_cgroups, progress, task_pid, wait_for},
    keling_bin, skip, tempdir,
};
use serde_json::Value;

/// `promtool` (Debian package `prometheus`, which `cargo xtask setup` installs).
fn promtool(test: &str) -> bool {
    let ok = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            test,
            "no promtool (`cargo xtask setup` installs the Debian package prometheus)",
        );
    }
    ok
}

/// `promtool check metrics` on `text`: (passed, what it said).
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The address the agent said it serves `/metrics` on.
fn metrics_url(agent: &Agent) -> String {
    agent
        .stderr()
        .iter()
        .find_map(|l| {
            let at = l.split("metrics http://").nth(1)?;
            Some(format!("http://{}", at.split_whitespace().next()?))
        })
        .expect("the ready line names the metrics address")
}

/// One scrape with curl: (response headers, body).
fn scrape(url: &str) -> (String, String) {
    let dir = tempdir();
    let headers = dir.join("headers");
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--max-time", "10"])
        .arg("--dump-header")
        .arg(&headers)
        .arg(url)
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let h = std::fs::read_to_string(&headers).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (h, String::from_utf8(out.stdout).expect("UTF-8 exposition"))
}

/// A sample of the text exposition: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition format's samples (comments skipped).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name_labels, value) = line.rsplit_once(' ').expect("NAME VALUE");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
        };
        let (name, mut rest) = match name_labels.split_once('{') {
            Some((n, r)) => (
                n.to_owned(),
                r.strip_suffix('}').expect("labels end with }"),
            ),
            None => (name_labels.to_owned(), ""),
        };
        let mut labels = BTreeMap::new();
        while !rest.is_empty() {
            let (k, r) = rest.split_once("=\"").expect("label=\"value\"");
            let mut v = String::new();
            let mut chars = r.char_indices();
            let end = loop {
                match chars.next().expect("a closing quote") {
                    (_, '\\') => match chars.next().unwrap().1 {
                        'n' => v.push('\n'),
                        c => v.push(c),
                    },
                    (i, '"') => break i,
                    (_, c) => v.push(c),
                }
            };
            labels.insert(k.to_owned(), v);
            rest = r[end + 1..].trim_start_matches(',');
        }
        out.push((name, labels, value));
    }
    out
}

/// The one sample named `name` whose labels include `want`.
fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(found.len() <= 1, "{name} {want:?}: {found:?}");
    found.first().map(|s| s.2)
}

const MIB: u64 = 1 << 20;

/// The endpoint during a simulated workload: served to curl with the text format's
/// content type, valid for promtool, per-process figures equal to the simulator's
/// ground truth and labelled with the agent's task, task states and decisions equal
/// to `keling status`; an exited process leaves after the grace period.
#[test]
fn metrics_pass_promtool_and_equal_the_truth_and_the_agents_state() {
    let Some(fx) = Fixture::needs("metrics_pass_promtool_and_equal_the_truth_and_the_agents_state")
        .cgroups()
        .check(promtool)
        .sim(&["--gpus", "1"])
        .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(
        sim,
        &["--metrics-addr", "127.0.0.1:0", "--metrics-grace-s", "1"],
    );
    let url = metrics_url(&agent);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    // A long background task holding 64 MiB, then a short interactive one that
    // preempts it (decisions to count), exits, and must leave the endpoint.
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 64, &pa);
    let pid_a = task_pid(&agent, &pa);
    let b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 1500, 32, &pb);
    let pid_b = {
        let mut pid = 0;
        wait_for("the second task", Duration::from_secs(20), || {
            pid = agent
                .status_reply()
                .tasks
                .iter()
                .map(|t| t.pid)
                .find(|&p| p != pid_a)
                .unwrap_or(0);
            pid != 0 && progress(&pb) > 0
        });
        pid
    };
    let (headers, text) = scrape(&url);
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let (ok, said) = promtool_check(&text);
    assert!(ok, "promtool check metrics: {said}\n{text}");

    // Every figure against a truth Keling did not compute.
    let truth = sim.state();
    let s = samples(&text);
    let status = agent.status_reply();
    let task_of = |pid: u32| -> String {
        status
            .tasks
            .iter()
            .find(|t| t.pid == pid)
            .map(|t| t.id.to_string())
            .unwrap_or_default()
    };
    for (pid, mib) in [(pid_a, 64), (pid_b, 32)] {
        let p = pid.to_string();
        let sim_bytes = truth["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["pid"] == pid)
            .and_then(|q| {
                q["gpus"]
                    .as_array()?
                    .iter()
                    .find(|g| g["gpu"] == 0)
                    .cloned()
            })
            .map(|g| g["bytes"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("pid {pid} in the simulator's state: {truth}"));
        assert_eq!(sim_bytes, mib * MIB, "the simulator holds what was asked");
        let labels = [
            ("pid", p.as_str()),
            ("gpu", "0"),
            ("memory", "video"),
            ("comm", "keling-gpu-work"),
            ("user", "root"),
        ];
        assert_eq!(
            value(&s, "keling_process_gpu_memory_bytes", &labels),
            Some(sim_bytes as f64),
            "pid {pid}\n{text}"
        );
        let task = s
            .iter()
            .find(|(n, l, _)| n == "keling_process_gpu_memory_bytes" && l["pid"] == p)
            .map(|(_, l, _)| l["task"].clone())
            .unwrap();
        assert_eq!(task, task_of(pid), "pid {pid}'s task label");
        assert!(
            value(
                &s,
                "keling_process_gpu_allocations_total",
                &[("pid", &p), ("gpu", "0")]
            )
            .is_some_and(|v| v >= 1.0),
            "{text}"
        );
    }
    let capacity = truth["gpus"][0]["capacity_bytes"].as_u64().unwrap();
    assert_eq!(
        value(&s, "keling_gpu_capacity_bytes", &[("gpu", "0")]),
        Some(capacity as f64)
    );
    // Task states and decisions: the agent's own state, read just after.
    let mut by_state: BTreeMap<String, f64> = BTreeMap::new();
    for t in &status.tasks {
        *by_state.entry(t.state.clone()).or_default() += 1.0;
    }
    for state in ["RUNNING", "PREEMPTED", "PENDING"] {
        // The states can move between the scrape and the status: scrape again
        // until both agree (a bounded wait on two live readings).
        let want = by_state.get(state).copied().unwrap_or(0.0);
        let got = value(&s, "keling_tasks", &[("state", state)]);
        if got != Some(want) {
            let mut last = None;
            wait_for(
                "/metrics and status to agree on task states",
                Duration::from_secs(5),
                || {
                    let now = agent.status_reply();
                    let n = now.tasks.iter().filter(|t| t.state == state).count() as f64;
                    last = value(
                        &samples(&scrape(&url).1),
                        "keling_tasks",
                        &[("state", state)],
                    );
                    last == Some(n)
                },
            );
        }
    }
    drop(b);
    // Decisions: the scrape's counters equal status's once nothing is in flight.
    wait_for("the short task to exit", Duration::from_secs(30), || {
        std::fs::metadata(format!("/proc/{pid_b}")).is_err()
    });
    wait_for(
        "decision counters to agree",
        Duration::from_secs(10),
        || {
            let st = agent.status_reply().latency;
            let text = scrape(&url).1;
            let s = samples(&text);
            value(&s, "keling_decisions_total", &[]) == Some(st.decisions as f64)
                && value(&s, "keling_decisions_late_total", &[]) == Some(st.late as f64)
                && value(
                    &s,
                    "keling_decision_latency_all_actions_seconds_count",
                    &[("stage", "end_to_end")],
                ) == Some(st.decisions as f64)
        },
    );
    let st = agent.status_reply();
    assert!(
        st.latency.decisions >= 2,
        "placements and a preemption were decided: {st:?}"
    );
    // Bounded labels: the exited process (which freed everything) leaves after
    // the grace period; the living one stays.
    let pb_label = pid_b.to_string();
    wait_for(
        "the exited process to leave /metrics",
        Duration::from_secs(10),
        || {
            let s = samples(&scrape(&url).1);
            !s.iter().any(|(_, l, _)| l.get("pid") == Some(&pb_label))
        },
    );
    let s = samples(&scrape(&url).1);
    assert!(
        s.iter()
            .any(|(_, l, _)| l.get("pid") == Some(&pid_a.to_string())),
        "the living task stays"
    );
}

/// A non-loopback `--metrics-addr` needs `--metrics-public`; a port in use stops
/// the agent at once with a clear word. Neither touches the host.
#[test]
fn metrics_address_is_checked_before_anything_starts() {
    let Some(fx) = Fixture::needs("metrics_address_is_checked_before_anything_starts")
        .cgroups()
        .ready()
    else {
        return;
    };
    let dir = &fx.dir;
    let run = |addr: &str| {
        Command::new(keling_bin())
            .args(["run", "--metrics-addr", addr, "--lock"])
            .arg(dir.join("lock"))
            .arg("--socket")
            .arg(dir.join("sock"))
            .output()
            .unwrap()
    };
    let out = run("0.0.0.0:0");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("--metrics-public"), "{said}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = run(&taken.local_addr().unwrap().to_string());
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("serve /metrics on 127.0.0.1:"), "{said}");
    assert!(!dir.join("sock").exists(), "no control socket was made");
    let out = Command::new(keling_bin())
        .args(["run", "--metrics-addr", "nonsense"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("IP:PORT"));
}

/// (tag, histogram) of every interval of an interval log, read by the
/// hdrhistogram crate's own reader (it knows nothing of Keling's comments).
fn crate_read(log: &[u8]) -> Vec<(Option<String>, Histogram<u64>)> {
    let mut de = Deserializer::new();
    IntervalLogIterator::new(log)
        .filter_map(|e| match e.expect("the crate reads every line") {
            LogEntry::Interval(h) => Some(h),
            _ => None,
        })
        .map(|h| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(h.encoded_histogram())
                .unwrap();
            let hist: Histogram<u64> = de.deserialize(&mut &bytes[..]).unwrap();
            (h.tag().map(|t| t.as_str().to_owned()), hist)
        })
        .collect()
}

/// The interval log outlives the agent: the hdrhistogram crate reads it back with
/// the counts the agent reported; `keling histo export` keeps every count in each
/// format (promtool accepts its Prometheus text); `keling histo tune` recommends;
/// a corrupt line is named.
#[test]
fn histogram_log_outlives_the_agent_and_reads_back_exactly() {
    let Some(fx) = Fixture::needs("histogram_log_outlives_the_agent_and_reads_back_exactly")
        .cgroups()
        .check(promtool)
        .sim(&["--gpus", "1"])
        .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let hlog = dir.join("latency.hlog");
    // An earlier run's header and intervals stay: the log is appended to.
    std::fs::write(&hlog, "#[an earlier line]\n").unwrap();
    let mut agent = Agent::start(
        sim,
        &[
            "--histo-log",
            hlog.to_str().unwrap(),
            "--histo-interval",
            "1",
            "--metrics-addr",
            "off",
        ],
    );
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let _ = task_pid(&agent, &pa);
    let mut b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 200, 0, &pb);
    assert!(b.0.wait().unwrap().success(), "the interactive task ran");
    // At least one interval is written while the agent runs.
    wait_for("an interval in the log", Duration::from_secs(5), || {
        std::fs::read_to_string(&hlog).is_ok_and(|t| t.contains("#[Keling interval: "))
    });
    let live = agent.status_reply();
    agent.stop();
    let bytes = std::fs::read(&hlog).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.starts_with("#[an earlier line]\n#[Logged with Keling"),
        "{text}"
    );
    assert!(text.contains("#[Histogram log format version 1.3]"));
    let read = crate_read(&bytes);
    let total = |tag: Option<&str>| -> u64 {
        read.iter()
            .filter(|(t, _)| t.as_deref() == tag)
            .map(|(_, h)| h.len())
            .sum()
    };
    let decisions: u64 = text
        .lines()
        .filter_map(|l| {
            l.split("decisions=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let e2e = total(None);
    assert!(
        e2e >= live.latency.decisions && e2e >= 2,
        "{e2e} decisions in the log, status said {:?}",
        live.latency
    );
    assert_eq!(
        e2e, decisions,
        "the untagged histograms hold every decision"
    );
    // Per action, end to end: the actions add up to all of them.
    let by_action: u64 = read
        .iter()
        .filter(|(t, _)| t.as_deref().is_some_and(|t| t.starts_with("end_to_end/")))
        .map(|(_, h)| h.len())
        .sum();
    assert_eq!(by_action, e2e);

    let keling = |args: &[&str]| {
        Command::new(keling_bin())
            .arg("histo")
            .args(args)
            .output()
            .unwrap()
    };
    let h = hlog.to_str().unwrap();
    let out = keling(&["export", h, "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hists = json["histograms"].as_array().unwrap();
    for (stage, action, tag) in [
        ("end_to_end", Value::Null, None),
        ("delivery", Value::Null, Some("delivery".to_owned())),
        ("actuation", Value::Null, Some("actuation".to_owned())),
    ] {
        let count = hists
            .iter()
            .find(|x| x["stage"] == stage && x["action"] == action)
            .map_or(0, |x| x["count"].as_u64().unwrap());
        assert_eq!(
            count,
            total(tag.as_deref()),
            "{stage}: export keeps every count"
        );
    }
    let per_action: Vec<&Value> = hists
        .iter()
        .filter(|x| x["stage"] == "end_to_end" && x["action"].is_string())
        .collect();
    for x in &per_action {
        let tag = format!("end_to_end/{}", x["action"].as_str().unwrap());
        assert_eq!(x["count"].as_u64().unwrap(), total(Some(&tag)), "{tag}");
    }
    let out = keling(&["export", h, "--format", "prom"]);
    assert!(out.status.success());
    let prom = String::from_utf8(out.stdout).unwrap();
    let (ok, said) = promtool_check(&prom);
    assert!(ok, "promtool: {said}\n{prom}");
    assert_eq!(
        value(
            &samples(&prom),
            "keling_decision_latency_all_actions_seconds_count",
            &[("stage", "end_to_end")]
        ),
        Some(e2e as f64)
    );
    let out = keling(&["export", h, "--stage", "actuation"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Percentile"));
    let out = keling(&["tune", h]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("recommend"), "{said}");
    let out = keling(&["tune", h, "--json"]);
    assert!(out.status.success());
    let tune: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(tune.is_object(), "{tune}");

    // A corrupt histogram is named by its line.
    let lines: Vec<&str> = text.lines().collect();
    let victim = lines
        .iter()
        .rposition(|l| l.starts_with("Tag=") || l.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap();
    let mut broken: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let (head, _) = broken[victim].rsplit_once(',').unwrap();
    broken[victim] = format!("{head},HISTFAAAAnot-base64!");
    let bad = dir.join("bad.hlog");
    std::fs::write(&bad, broken.join("\n") + "\n").unwrap();
    let out = keling(&["export", bad.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains(&format!("line {}", victim + 1)), "{said}");
}

/// Stops what a docs block started: its process group (the shell we started
/// leads it), then whatever task cgroups and mount it left, even on failure.
struct Cleanup {
    pgid: u32,
    nvsim: PathBuf,
    mount: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // SAFETY: signalling the process group we created, by its id.
        unsafe { libc::kill(-(self.pgid as i32), libc::SIGKILL) };
        cleanup_cgroups();
        let _ = Command::new(&self.nvsim)
            .arg("umount")
            .arg(&self.mount)
            .stderr(Stdio::null())
            .status();
    }
}

/// docs/latency.md's "Latency histograms" block for a host without a GPU, run as written
/// (one shell script): `target/debug/` is where the test's binaries are,
/// `/tmp/keling-nvsim` a fresh directory, the working directory a fresh one.
#[test]
fn readme_latency_histograms_commands_work() {
    let Some(fx) = Fixture::needs("readme_latency_histograms_commands_work")
        .cgroups()
        .ready()
    else {
        return;
    };
    let block = keling_tests::doc_block(
        "docs/latency.md",
        "Latency histograms for tuning",
        "# Without a GPU",
    );
    let block = block.as_str();
    let bin_dir = keling_bin().parent().unwrap().to_owned();
    let work = &fx.dir;
    let dev = work.join("nvsim");
    std::fs::create_dir_all(&dev).unwrap();
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("cargo xtask build"))
        .map(|l| {
            l.replace("target/debug/", &format!("{}/", bin_dir.display()))
                .replace("/tmp/keling-nvsim", dev.to_str().unwrap())
                + "\n"
        })
        .collect();
    eprintln!("{script}");
    let child = Command::new("sh")
        .args(["-e", "-c", &script])
        .current_dir(work)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let _cleanup = Cleanup {
        pgid: child.id(),
        nvsim: bin_dir.join("keling-nvsim"),
        mount: dev.clone(),
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let hlog = std::fs::read(work.join("latency.hlog")).expect("latency.hlog written");
    assert!(
        crate_read(&hlog).iter().map(|(_, h)| h.len()).sum::<u64>() > 0,
        "decisions in the log"
    );
    assert!(stdout.contains("Percentile"), "the export ran:\n{stdout}");
    assert!(
        stdout.contains("recommend"),
        "the tuning report ran:\n{stdout}"
    );
    drop(_cleanup);
}

/// `KELING_MAX_DURATION_MS=1500 KELING_GRACE_PERIOD_MS=500 keling launch [FLAGS] --
/// job`: (exit code, Keling's `keling: ` lines on its standard error, the rest).
fn launch_limited(
    agent: &Agent,
    sim: &Nvsim,
    flags: &[&str],
) -> (Option<i32>, Vec<String>, String) {
    let out = Command::new(keling_bin())
        .arg("launch")
        .arg("--socket")
        .arg(&agent.socket)
        .args(flags)
        .args(["--priority", "5", "--"])
        .arg(keling_tests::gpu_workload_bin())
        .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
        .args(["--iterations", "1000000"])
        .env("KELING_MAX_DURATION_MS", "1500")
        .env("KELING_GRACE_PERIOD_MS", "500")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let (ours, rest): (Vec<&str>, Vec<&str>) = err.lines().partition(|l| l.starts_with("keling: "));
    (
        out.status.code(),
        ours.iter()
            .map(|l| l["keling: ".len()..].to_owned())
            .collect(),
        rest.join("\n"),
    )
}

/// The person at the terminal hears what happens to their job, in order and
/// before `keling launch` exits with the job's own code: placement, the duration
/// warning, the 4003 record (with `--json` exactly the one the scheduling log
/// holds), and why Keling ended it; `--quiet` prints none of it.
#[test]
fn launch_tells_the_user_of_the_warning_and_the_4003_record_in_order() {
    let Some(fx) = Fixture::scheduler(
        "launch_tells_the_user_of_the_warning_and_the_4003_record_in_order",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(sim, &["--metrics-addr", "off"]);

    let (code, lines, _) = launch_limited(&agent, sim, &[]);
    assert_eq!(code, Some(128 + 9), "killed at the limit: {lines:?}");
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what:?} in {lines:#?}"))
    };
    let placed = at("placed on GPU 0 at priority 5");
    let warning = at("reaches its session limit of 1.50 s in");
    let enforced = at("ran past its session limit");
    assert!(placed < warning && warning < enforced, "{lines:#?}");
    assert!(
        lines[enforced].contains("of 1500 ms allowed (4003"),
        "{lines:#?}"
    );
    assert!(
        lines[warning].contains("it will then be killed"),
        "{lines:#?}"
    );

    let (code, lines, _) = launch_limited(&agent, sim, &["--json"]);
    assert_eq!(code, Some(128 + 9));
    let notices: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let record = notices
        .iter()
        .find(|n| n["code"] == 4003)
        .unwrap_or_else(|| panic!("the 4003 record in {notices:#?}"));
    // Exactly the record the scheduling log holds for that task (the second one).
    let logged: Vec<Value> = agent
        .log()
        .into_iter()
        .filter(|l| l["type"] == "enforcement")
        .map(|l| l["record"].clone())
        .collect();
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert_eq!(record, &logged[1]);
    let keys: Vec<&String> = record.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["code", "data", "message"]);
    let first_warning = notices
        .iter()
        .position(|n| n.to_string().contains("remaining_ms"))
        .expect("the warning as JSON");
    let record_at = notices.iter().position(|n| n["code"] == 4003).unwrap();
    assert!(first_warning < record_at, "{notices:#?}");

    let (code, lines, rest) = launch_limited(&agent, sim, &["--quiet"]);
    assert_eq!(code, Some(128 + 9), "the exit code stays the job's");
    assert!(lines.is_empty(), "--quiet: {lines:#?}");
    assert!(!rest.contains("keling"), "--quiet: {rest}");
}

/// `keling run` hears that a task works, not each of its calls: at most one
/// activity signal per tracked root process per 5 ms, decided in the kernel, so
/// 30 000 RM_CONTROLs reach the agent as a few hundred signals (and no GPU events).
#[test]
fn the_agent_gets_rate_limited_activity_not_an_event_per_call() {
    let Some(fx) = Fixture::scheduler(
        "the_agent_gets_rate_limited_activity_not_an_event_per_call",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let started = std::time::Instant::now();
    let mut agent = Agent::start(sim, &["--metrics-addr", "off"]);
    const CALLS: u64 = 300 * 100;
    let out = Command::new(keling_bin())
        .arg("launch")
        .arg("--socket")
        .arg(&agent.socket)
        .args(["--quiet", "--"])
        .arg(keling_tests::gpu_workload_bin())
        .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
        .args(["--iterations", "300", "--calls-per-iteration", "100"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent.stop();
    let up_ms = started.elapsed().as_millis() as u64;
    let mut last = None;
    wait_for(
        "the agent's final status line",
        Duration::from_secs(5),
        || {
            last = agent
                .stderr()
                .into_iter()
                .rev()
                .find(|l| l.contains("(stopped)"));
            last.is_some()
        },
    );
    let line = last.unwrap();
    let count_before = |what: &str| -> u64 {
        let head = line.split(what).next().unwrap();
        head.rsplit(' ')
            .find(|w| !w.is_empty())
            .unwrap()
            .parse()
            .unwrap()
    };
    let active = count_before(" activity signals");
    let gpu = count_before(" GPU events traced");
    // One root (the task), one signal per 5 ms at most while the agent ran.
    let bound = up_ms / 5 + 1;
    assert!(
        active <= bound,
        "{active} activity signals in {up_ms} ms for {CALLS} calls (at most {bound}): {line}"
    );
    assert!(active > 0, "the task's work was seen: {line}");
    // The calls changed no memory: none of them is a GPU event of its own.
    assert!(
        gpu < CALLS / 100,
        "{gpu} GPU events for {CALLS} plain calls: {line}"
    );
}

/// Issue 32: a process past its NVIDIA fd table registers nothing host-wide for
/// fds it made nothing on: an unprivileged process opening nvidiactl (mode 0666)
/// 300 times leaves the kernel's `FILES` table (65 536 for the whole host) as it
/// was, so it cannot fill it and leave other processes' clients unaccounted
/// (before, each such open took an entry); and another process's memory is
/// accounted meanwhile, its books unflagged.
#[test]
fn opens_past_the_fd_table_with_nothing_on_them_take_no_host_wide_entry() {
    let Some(fx) =
        Fixture::needs("opens_past_the_fd_table_with_nothing_on_them_take_no_host_wide_entry")
            .cgroups()
            .sim(&["--gpus", "1"])
            .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(sim, &["--metrics-addr", "127.0.0.1:0"]);
    let url = metrics_url(&agent);
    let files = || {
        keling_tests::bpfmaps::map_entries(agent.pid)
            .get("FILES")
            .copied()
            .unwrap_or(0)
    };
    let before = files();
    let mut hoard = ChildGuard(
        Command::new(keling_tests::gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "fd-hoard"])
            .args(["--fds", "300", "--checkpoints"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hoard.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "checkpoint 1");
    // Another process, meanwhile: its memory is accounted, nothing is full.
    let other = Command::new(keling_tests::gpu_workload_bin())
        .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
        .args(["--alloc-mib", "3", "--iterations", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(other.status.success(), "{other:?}");
    let now = files();
    assert!(
        now <= before + 2,
        "300 opens with nothing on them took {} FILES entries",
        now - before
    );
    let s = samples(&scrape(&url).1);
    let total: f64 = s
        .iter()
        .filter(|(n, _, _)| n == "keling_table_full_total")
        .map(|(_, _, v)| v)
        .sum();
    assert_eq!(total, 0.0, "no table was full for anyone");
    writeln!(hoard.0.stdin.as_mut().unwrap()).unwrap();
    assert!(hoard.0.wait().unwrap().success());
}

/// Issue 32: the kernel's per-process rows of full tables and undecoded calls
/// (`TABLE_FULL_PID`, `UNDECODED_PID`) go once their process exited and
/// `/metrics` stopped showing it: processes that each fill a table (10 clients on
/// one nvidiactl file) and exit leave the maps, as the kernel counts their
/// entries, where they were. Before, every such process left its rows forever (a
/// reused pid started flagged; past 16 384 processes new ones were not flagged).
#[test]
fn rows_of_full_tables_go_with_their_processes() {
    let Some(fx) = Fixture::needs("rows_of_full_tables_go_with_their_processes")
        .cgroups()
        .sim(&["--gpus", "1"])
        .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(
        sim,
        &["--metrics-addr", "127.0.0.1:0", "--metrics-grace-s", "1"],
    );
    let url = metrics_url(&agent);
    let rows = || {
        let m = keling_tests::bpfmaps::map_entries(agent.pid);
        let n = |name: &str| m.get(name).copied().unwrap_or(0);
        (n("TABLE_FULL_PID"), n("UNDECODED_PID"))
    };
    let before = rows();
    const PROCESSES: u64 = 4;
    for _ in 0..PROCESSES {
        let out = Command::new(keling_tests::gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args(["--clients", "9", "--alloc-mib", "1", "--iterations", "1"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // Each filled its file's table of clients (the kernel counted it) ...
    wait_for("the full tables counted", Duration::from_secs(10), || {
        let s = samples(&scrape(&url).1);
        value(&s, "keling_table_full_total", &[("table", "file_clients")]).unwrap_or(0.0)
            >= PROCESSES as f64
    });
    // ... and once the grace is over, their rows are gone.
    let mut now = rows();
    wait_for(
        "the rows of the exited processes gone",
        Duration::from_secs(10),
        || {
            now = rows();
            now == before
        },
    );
    assert_eq!(now, before);
}

/// Issue 32: when a kernel table Keling needs for a task's books is full (here an
/// open file's table of clients: 10 clients on one nvidiactl file against 8), the
/// task's GPU memory figure may be wrong from then on. It is flagged in `keling
/// status` and on `/metrics`, and the full table is counted by name. But a task
/// that fills its own table on purpose does not escape its quota (the bypass the
/// review found: before, its quota was simply suspended and it ran to its end):
/// it is judged on a sound lower bound of its memory (what the kernel's objects
/// say is certainly still allocated: here all of it, its file being open), which
/// is over the quota, so it is ended as over quota.
#[test]
fn a_full_table_flags_the_figure_and_the_quota_holds_on_a_sound_bound() {
    let Some(fx) =
        Fixture::needs("a_full_table_flags_the_figure_and_the_quota_holds_on_a_sound_bound")
            .cgroups()
            .sim(&["--gpus", "1"])
            .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(
        sim,
        &["--metrics-addr", "127.0.0.1:0", "--metrics-grace-s", "60"],
    );
    let url = metrics_url(&agent);
    let progress_file = fx.dir.join("progress");
    let quota = 40 * MIB;
    let mut launch = ChildGuard(
        Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--gpu", "0", "--mem-quota", &quota.to_string(), "--"])
            .arg(keling_tests::gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args([
                "--clients",
                "9",
                "--alloc-mib",
                "32",
                "--iterations",
                "1500",
            ])
            .arg("--progress")
            .arg(&progress_file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The figure goes over the quota (9 MiB under the extra clients, then 32 MiB)
    // and is flagged as unsure; the task is ended as over quota all the same (it
    // may be gone before its first progress: its task is found by status alone).
    let mut task = None;
    wait_for(
        "the task ended as over quota",
        Duration::from_secs(10),
        || {
            if let Some(t) = agent.status_reply().tasks.pop() {
                task = Some(t);
            }
            task.as_ref()
                .is_some_and(|t| t.ending_reason == Some(Reason::OverQuota))
        },
    );
    let task = task.expect("a task");
    let pid = task.pid;
    assert!(task.mem_unsure, "{task:?}");
    let s = samples(&scrape(&url).1);
    let p = pid.to_string();
    assert_eq!(
        value(&s, "keling_process_gpu_memory_unsure", &[("pid", &p)]),
        Some(1.0)
    );
    assert!(
        value(&s, "keling_table_full_total", &[("table", "file_clients")]).unwrap_or(0.0) >= 1.0,
        "the full table is counted by name"
    );
    let code = launch.0.wait().unwrap().code();
    assert_ne!(code, Some(0), "the task was ended before its own end");
    let done: u64 = std::fs::read_to_string(&progress_file)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        done < 1500,
        "it was stopped after {done} of 1500 iterations"
    );
    let over_quota: Vec<SchedLine> = agent
        .sched_lines()
        .into_iter()
        .filter(|l| matches!(l, SchedLine::Transition(t) if t.reason == Reason::OverQuota))
        .collect();
    assert!(!over_quota.is_empty(), "the sched log says why");
}
