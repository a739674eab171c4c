//! The scheduler end to end: `keling run` as root with real eBPF, the simulated
//! driver, tasks started with `keling launch` in their own cgroups, and the
//! kernel's freezer. These tests share the host's cgroup tree, so they run one at
//! a time (the fixture's lock), and every one cleans up in Drop guards even when it
//! fails.
use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use keling_agent::{
    control::StatusReply,
    log_format::{InputLogHeader, Record, SchedLine},
};
use keling_sched::{Policy, Reason};
use keling_tests::{
    ChildGuard, Fixture, Nvsim,
    agent::{Agent, AgentOptions, frozen, proc_state, progress, task_pid, wait_for},
    gpu_workload_bin, keling_bin, tempdir,
};

/// `keling run` with no periodic status lines (these tests read none).
fn start_agent(sim: &Nvsim, extra: &[&str]) -> Agent {
    Agent::start_with(
        sim,
        AgentOptions {
            status_interval_s: Some(0),
            ..AgentOptions::args(extra)
        },
    )
}

/// The cgroup Keling says the task `pid` is in.
fn task_cgroup(status: &StatusReply, pid: u32) -> PathBuf {
    let t = status
        .tasks
        .iter()
        .find(|t| t.pid == pid)
        .expect("task in status");
    PathBuf::from(t.cgroup.as_deref().expect("cgroup path"))
}

#[test]
fn interactive_task_preempts_background_and_it_resumes() {
    let Some(fx) = Fixture::scheduler(
        "interactive_task_preempts_background_and_it_resumes",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut agent = start_agent(sim, &[]);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 100_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = task_cgroup(&agent.status_reply(), pid_a);
    let mut b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 300, 0, &pb);
    // The background task is frozen: in cgroup.events, in /proc, and it stops.
    wait_for(
        "the background task to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_a),
    );
    assert_ne!(proc_state(pid_a), 'R', "a frozen task is not running");
    let before = progress(&pa);
    wait_for(
        "the interactive task to progress",
        Duration::from_secs(10),
        || progress(&pb) >= 100,
    );
    assert_eq!(
        progress(&pa),
        before,
        "the background task ran while frozen"
    );
    // When the interactive task exits, the background task runs again.
    assert!(b.0.wait().unwrap().success());
    wait_for(
        "the background task to be thawed",
        Duration::from_secs(10),
        || !frozen(&cg_a),
    );
    let after = progress(&pa);
    wait_for(
        "the background task to progress again",
        Duration::from_secs(10),
        || progress(&pa) > after,
    );
    // The freeze was within the timeout model, and every move is logged.
    let status = agent.status_reply();
    let freeze = status.latency.by_action.get("freeze");
    assert!(freeze.is_some_and(|f| f.count >= 1), "{status:?}");
    assert_eq!(
        status.latency.late_by_action.get("freeze"),
        Some(&0),
        "the freeze was late: {status:?}"
    );
    // The histograms export for tuning.
    let export = |format: &str| {
        let out = Command::new(keling_bin())
            .args(["status", "--export", format, "--socket"])
            .arg(&agent.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--export {format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let prom = export("prometheus");
    assert!(
        prom.contains("# TYPE keling_decision_latency_seconds histogram"),
        "{prom}"
    );
    assert!(prom.contains("action=\"freeze\""), "{prom}");
    assert!(export("tune").to_lowercase().contains("adaptive"));
    assert!(export("percentiles").contains("Percentile"));
    let moves: Vec<String> = agent
        .sched_lines()
        .into_iter()
        .filter_map(|l| match l {
            SchedLine::Transition(t) if t.pid == pid_a => Some(t.state_transition),
            _ => None,
        })
        .collect();
    assert!(moves.iter().any(|m| m == "RUNNING→PREEMPTED"), "{moves:?}");
    assert!(moves.iter().any(|m| m == "PREEMPTED→RUNNING"), "{moves:?}");
    // Every transition line has every field (the JSON itself).
    let log = agent.log();
    for l in log.iter().filter(|l| l["state_transition"].is_string()) {
        for field in [
            "event_id",
            "state_transition",
            "timestamp_ns",
            "task",
            "pid",
            "gpu",
            "priority",
            "reason",
        ] {
            assert!(
                !l[field].is_null() || field == "gpu",
                "{field} missing in {l}"
            );
        }
    }
    // The agent's own input log replays to the very decisions it made, with no
    // flags: its header carries the policy and configuration.
    drop(_a);
    assert!(agent.stop().success(), "keling run exits 0 on SIGINT");
    let inputs = std::fs::read_to_string(agent.input_log()).unwrap();
    let header: InputLogHeader = serde_json::from_str(inputs.lines().next().unwrap()).unwrap();
    assert_eq!(header.keling_input_log, 1, "{header:?}");
    assert_eq!(header.policy, Policy::Hybrid, "{header:?}");
    assert_eq!(header.config.gpus.len(), 1, "{header:?}");
    keling_tests::agent::assert_replays_exactly(&agent, 4);
}

#[test]
fn equal_priorities_take_turns() {
    let Some(fx) = Fixture::scheduler("equal_priorities_take_turns", &["--gpus", "1"]) else {
        return;
    };
    let sim = fx.sim();
    let agent = start_agent(sim, &[]);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "8", "--gpu", "0"], sim, 100_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let _b = agent.launch(&["--priority", "8", "--gpu", "0"], sim, 100_000, 0, &pb);
    wait_for("both tasks to progress", Duration::from_secs(20), || {
        progress(&pa) > 50 && progress(&pb) > 50
    });
    let pid_b = agent
        .status_reply()
        .tasks
        .iter()
        .map(|t| t.pid)
        .find(|&p| p != pid_a)
        .unwrap();
    // Each is preempted and resumed repeatedly: they alternate.
    wait_for("several turns each", Duration::from_secs(20), || {
        let log = agent.sched_lines();
        let turns = |pid: u32| {
            log.iter()
                .filter(|l| {
                    matches!(l, SchedLine::Transition(t)
                        if t.pid == pid && t.state_transition == "PREEMPTED→RUNNING")
                })
                .count()
        };
        turns(pid_a) >= 3 && turns(pid_b) >= 3
    });
}

#[test]
fn duration_limit_warns_then_kills_with_the_4003_record() {
    let Some(fx) = Fixture::scheduler(
        "duration_limit_warns_then_kills_with_the_4003_record",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = start_agent(sim, &[]);
    let dir = &fx.dir;
    let pa = dir.join("a");
    let mut a = agent.launch(
        &[
            "--priority",
            "5",
            "--max-duration-ms",
            "1500",
            "--grace-ms",
            "1000",
        ],
        sim,
        1_000_000,
        0,
        &pa,
    );
    let status = a.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "killed at the limit: {status:?}"
    );
    let remaining_ms = agent
        .sched_lines()
        .into_iter()
        .find_map(|l| match l {
            SchedLine::Record(Record::Warning { remaining_ms, .. }) => Some(remaining_ms),
            _ => None,
        })
        .expect("a warning before the limit");
    assert!(remaining_ms <= 1000);
    // The enforcement record as the client sees it: its JSON itself.
    let log = agent.log();
    let e = log
        .iter()
        .find(|l| l["type"] == "enforcement")
        .expect("the enforcement record");
    let record = &e["record"];
    assert_eq!(record["code"], 4003);
    assert_eq!(record["message"], "session duration exceeded limit");
    assert_eq!(record["data"]["reason"], "server_enforced");
    assert_eq!(record["data"]["allowed_ms"], 1500);
    let actual = record["data"]["actual_ms"].as_u64().unwrap();
    // Within one scheduler tick (10 ms) of the deadline, plus the tick's jitter.
    assert!((1500..=1600).contains(&actual), "actual_ms {actual}");
    let keys: Vec<&String> = record.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["code", "data", "message"]);
}

#[test]
fn memory_pressure_evicts_the_minimal_lower_priority_set() {
    let Some(fx) = Fixture::scheduler(
        "memory_pressure_evicts_the_minimal_lower_priority_set",
        &["--gpus", "1", "--mem-per-gpu", "1073741824"],
    ) else {
        return;
    };
    let sim = fx.sim();
    // Three slots: the three tasks run side by side, so only memory is contended.
    let agent = start_agent(sim, &["--slots", "3"]);
    let dir = &fx.dir;
    let (p1, p2, ph) = (dir.join("l1"), dir.join("l2"), dir.join("h"));
    // Two low-priority tasks hold 400 MiB each; 224 MiB are free.
    let mut l1 = agent.launch(
        &["--priority", "10", "--gpu", "0"],
        sim,
        1_000_000,
        400,
        &p1,
    );
    let pid1 = task_pid(&agent, &p1);
    let mut l2 = agent.launch(
        &["--priority", "12", "--gpu", "0"],
        sim,
        1_000_000,
        400,
        &p2,
    );
    wait_for(
        "both low tasks to hold memory",
        Duration::from_secs(20),
        || {
            let s = sim.state();
            s["gpus"][0]["used_bytes"].as_u64().unwrap_or(0) >= 800 << 20
        },
    );
    let pid2 = agent
        .status_reply()
        .tasks
        .iter()
        .map(|t| t.pid)
        .find(|&p| p != pid1)
        .unwrap();
    // A high-priority task needs 600 MiB: one victim suffices, and the lowest
    // priority one (12) is chosen.
    let mut h = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 50, 600, &ph);
    assert!(
        h.0.wait().unwrap().success(),
        "the high-priority task got its memory and finished"
    );
    let victim = l2.0.wait().unwrap();
    assert!(
        !victim.success(),
        "the priority-12 task was evicted: {victim:?}"
    );
    // The other low task was not touched, and the victim's memory is free.
    assert!(
        l1.0.try_wait().unwrap().is_none(),
        "only the minimal set is evicted"
    );
    let state = sim.state();
    let held = |pid: u32| {
        state["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pid"] == pid)
            .flat_map(|p| p["gpus"].as_array().unwrap().iter())
            .map(|g| g["bytes"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        held(pid2),
        0,
        "the victim's memory is free (simulator ground truth)"
    );
    assert_eq!(held(pid1), 400 << 20);
    let log = agent.sched_lines();
    assert!(
        log.iter().any(|l| matches!(l, SchedLine::Transition(t)
            if t.pid == pid2 && t.reason == Reason::EvictedForMemory)),
        "{log:?}"
    );
    let _ = l1.0.kill();
}

#[test]
fn frozen_tasks_run_again_within_a_second_after_the_agent_is_killed() {
    let Some(fx) = Fixture::scheduler(
        "frozen_tasks_run_again_within_a_second_after_the_agent_is_killed",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    for round in 0..20 {
        let mut agent = start_agent(sim, &[]);
        let dir = tempdir();
        let (pa, pb) = (dir.join("a"), dir.join("b"));
        let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
        let pid_a = task_pid(&agent, &pa);
        let cg_a = task_cgroup(&agent.status_reply(), pid_a);
        let _b = agent.launch(&["--priority", "1", "--gpu", "0"], sim, 1_000_000, 0, &pb);
        wait_for("the low task to be frozen", Duration::from_secs(10), || {
            frozen(&cg_a)
        });
        agent.sigkill();
        let killed = Instant::now();
        wait_for(
            "the task to be thawed after SIGKILL",
            Duration::from_secs(5),
            || !frozen(&cg_a),
        );
        let thawed_after = killed.elapsed();
        assert!(
            thawed_after < Duration::from_secs(1),
            "round {round}: thawed only after {thawed_after:?}"
        );
        let p = progress(&pa);
        wait_for("the thawed task to run", Duration::from_secs(5), || {
            progress(&pa) > p
        });
        drop(agent);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn invalid_config_is_refused_with_file_and_line() {
    let dir = tempdir();
    let path = dir.join("keling.toml");
    std::fs::write(
        &path,
        "[defaults]\npriority = 4\n\n[[rule]]\nname = \"x\"\ncomm = \"a\"\npriority = 16\n",
    )
    .unwrap();
    let out = Command::new(keling_bin())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:7: priority 16 is out of range",
            path.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPU process Keling did not launch is adopted through a config rule and
/// preempted with SIGSTOP/SIGCONT (it has no cgroup of Keling's).
#[test]
fn config_rule_adopts_an_unlaunched_gpu_process_and_preempts_it() {
    let Some(fx) = Fixture::scheduler(
        "config_rule_adopts_an_unlaunched_gpu_process_and_preempts_it",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let config = dir.join("keling.toml");
    // comm is cut to 15 bytes by the kernel.
    std::fs::write(
        &config,
        "[[rule]]\nname = \"batch\"\ncomm = \"keling-gpu-work\"\npriority = 12\ngpu = 0\n",
    )
    .unwrap();
    let agent = start_agent(sim, &["--config", config.to_str().unwrap()]);
    let pa = dir.join("a");
    let a = ChildGuard(
        Command::new(gpu_workload_bin())
            .args([
                "--dev-dir",
                sim.dev_dir(),
                "--scenario",
                "busy",
                "--iterations",
                "1000000",
                "--progress",
            ])
            .arg(&pa)
            .spawn()
            .unwrap(),
    );
    let pid_a = a.0.id();
    wait_for("the process to be adopted", Duration::from_secs(10), || {
        agent
            .status_reply()
            .tasks
            .iter()
            .any(|t| t.pid == pid_a && t.priority == 12)
    });
    let pb = dir.join("b");
    let mut b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 300, 0, &pb);
    wait_for(
        "the adopted process to be stopped",
        Duration::from_secs(10),
        || proc_state(pid_a) == 'T',
    );
    let before = progress(&pa);
    wait_for(
        "the launched task to progress",
        Duration::from_secs(10),
        || progress(&pb) >= 100,
    );
    assert_eq!(progress(&pa), before, "a stopped process ran");
    assert!(b.0.wait().unwrap().success());
    wait_for(
        "the adopted process to be continued",
        Duration::from_secs(10),
        || proc_state(pid_a) != 'T',
    );
    let p = progress(&pa);
    wait_for(
        "the adopted process to progress",
        Duration::from_secs(10),
        || progress(&pa) > p,
    );
    // Stopped again, then the agent is SIGKILLed: the fail-safe continues it.
    let pc = dir.join("c");
    let _c = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 1_000_000, 0, &pc);
    wait_for(
        "the adopted process to be stopped again",
        Duration::from_secs(10),
        || proc_state(pid_a) == 'T',
    );
    let mut agent = agent;
    agent.sigkill();
    let killed = Instant::now();
    wait_for(
        "the adopted process to be continued",
        Duration::from_secs(5),
        || proc_state(pid_a) != 'T',
    );
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "continued only after {:?}",
        killed.elapsed()
    );
    drop(a);
    drop(agent);
}

/// A process adopted with no priority from a rule gets `--default-priority`, as a
/// launched one does (it used to get 8 whatever the flag said).
#[test]
fn adopted_process_without_a_rule_priority_gets_the_default_priority() {
    let Some(fx) = Fixture::scheduler(
        "adopted_process_without_a_rule_priority_gets_the_default_priority",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let config = dir.join("keling.toml");
    std::fs::write(&config, "[defaults]\nmanage_unmatched = true\n").unwrap();
    let agent = start_agent(
        sim,
        &[
            "--config",
            config.to_str().unwrap(),
            "--default-priority",
            "5",
        ],
    );
    let a = ChildGuard(
        Command::new(gpu_workload_bin())
            .args([
                "--dev-dir",
                sim.dev_dir(),
                "--scenario",
                "busy",
                "--iterations",
                "1000000",
                "--progress",
            ])
            .arg(dir.join("a"))
            .spawn()
            .unwrap(),
    );
    let pid_a = a.0.id();
    wait_for("the process to be adopted", Duration::from_secs(10), || {
        agent.status_reply().tasks.iter().any(|t| t.pid == pid_a)
    });
    let status = agent.status_reply();
    let task = status.tasks.iter().find(|t| t.pid == pid_a).unwrap();
    assert_eq!(task.priority, 5, "{task:?}");
    drop(a);
    drop(agent);
}
