//! Nothing a task's owner declares buys immunity (issue 32's attacks, reproduced
//! against the simulated driver with real eBPF and the kernel's freezer): a claimed
//! runtime does not keep a lower priority from being evicted for a higher one, and a
//! pin to one GPU does not keep a job from being preempted on the GPU it works on.
//! The truth is the kernel's (`cgroup.events`, exit statuses) and the simulator's
//! (`nvsim-state.json`), not Keling's own view.
use std::{path::Path, process::Command, time::Duration};

use keling_agent::{
    control::{StatusReply, TaskStatus},
    log_format::SchedLine,
};
use keling_sched::Reason;
use keling_tests::{
    Fixture, Nvsim,
    agent::{Agent, AgentOptions, frozen, progress, task_pid, wait_for},
    keling_bin,
};

fn start_agent(sim: &Nvsim, extra: &[&str]) -> Agent {
    Agent::start_with(
        sim,
        AgentOptions {
            status_interval_s: Some(0),
            ..AgentOptions::args(extra)
        },
    )
}

fn task(status: &StatusReply, pid: u32) -> &TaskStatus {
    status
        .tasks
        .iter()
        .find(|t| t.pid == pid)
        .expect("task in status")
}

/// Bytes the simulator says `pid` holds on `gpu`.
fn sim_held(sim: &Nvsim, pid: u32, gpu: u64) -> u64 {
    sim.state()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .flat_map(|p| p["gpus"].as_array().unwrap().iter())
        .filter(|g| g["gpu"] == gpu)
        .map(|g| g["bytes"].as_u64().unwrap())
        .sum()
}

/// Before: a priority-15 job launched with `--expected-runtime-ms 1` was never a
/// candidate (its "remaining time" was 0), so a priority-3 job that needed its
/// memory waited for as long as it held it.
#[test]
fn a_claimed_runtime_does_not_buy_immunity_from_eviction() {
    let Some(fx) = Fixture::scheduler(
        "a_claimed_runtime_does_not_buy_immunity_from_eviction",
        &["--gpus", "1", "--mem-per-gpu", "1073741824"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = start_agent(sim, &[]);
    let (pl, ph) = (fx.dir.join("low"), fx.dir.join("high"));
    let mut low = agent.launch_busy(
        &[
            "--priority",
            "15",
            "--gpu",
            "0",
            "--expected-runtime-ms",
            "1",
        ],
        sim,
        &["--iterations", "100000000", "--alloc-mib", "700"],
        &pl,
    );
    let pid_low = task_pid(&agent, &pl);
    wait_for(
        "the low task to hold its memory",
        Duration::from_secs(20),
        || sim_held(sim, pid_low, 0) >= 700 << 20,
    );
    let mut high = agent.launch_busy(
        &["--priority", "3", "--gpu", "0"],
        sim,
        &["--iterations", "50", "--alloc-mib", "600"],
        &ph,
    );
    let mut low_status = None;
    wait_for(
        "the low task to be evicted",
        Duration::from_secs(30),
        || {
            low_status = low.0.try_wait().unwrap();
            low_status.is_some()
        },
    );
    assert!(!low_status.unwrap().success(), "{low_status:?}");
    let mut high_status = None;
    wait_for(
        "the high task to get its memory and finish",
        Duration::from_secs(30),
        || {
            high_status = high.0.try_wait().unwrap();
            high_status.is_some()
        },
    );
    assert!(high_status.unwrap().success(), "{high_status:?}");
    assert_eq!(sim_held(sim, pid_low, 0), 0, "the victim's memory is free");
    let log = agent.sched_lines();
    assert!(
        log.iter().any(|l| matches!(l, SchedLine::Transition(t)
            if t.pid == pid_low && t.reason == Reason::EvictedForMemory)),
        "{log:?}"
    );
}

/// Before: a priority-15 job pinned with `--gpu 1` that opened and worked on GPU 0
/// was never frozen for a priority-3 job on GPU 0, although `keling status` showed
/// its memory there.
#[test]
fn a_job_pinned_to_one_gpu_is_preempted_on_the_gpu_it_works_on() {
    let Some(fx) = Fixture::scheduler(
        "a_job_pinned_to_one_gpu_is_preempted_on_the_gpu_it_works_on",
        &["--gpus", "2"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = start_agent(sim, &[]);
    let (pl, ph) = (fx.dir.join("low"), fx.dir.join("high"));
    let _low = agent.launch_busy(
        &["--priority", "15", "--gpu", "1"],
        sim,
        &[
            "--use-gpu",
            "0",
            "--iterations",
            "100000000",
            "--alloc-mib",
            "64",
        ],
        &pl,
    );
    let pid_low = task_pid(&agent, &pl);
    let held = (0..2000).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        sim_held(sim, pid_low, 0) >= 64 << 20
    });
    assert!(
        held,
        "the pinned task (pid {pid_low}) holds no memory on GPU 0: {} / {}",
        sim.state(),
        agent.status()
    );
    let status = agent.status_reply();
    let low = task(&status, pid_low);
    assert_eq!(low.gpu, Some(1), "it was pinned to GPU 1: {low:?}");
    let cg_low = Path::new(low.cgroup.as_deref().unwrap()).to_path_buf();
    assert!(!frozen(&cg_low));
    let mut high = agent.launch_busy(
        &["--priority", "3", "--gpu", "0"],
        sim,
        &["--iterations", "300", "--alloc-mib", "0"],
        &ph,
    );
    wait_for(
        "the pinned task to be frozen on GPU 0",
        Duration::from_secs(10),
        || frozen(&cg_low),
    );
    let before = progress(&pl);
    wait_for("the high task to progress", Duration::from_secs(10), || {
        progress(&ph) >= 100
    });
    assert_eq!(progress(&pl), before, "the frozen task ran");
    assert!(high.0.wait().unwrap().success());
    wait_for(
        "the pinned task to be thawed",
        Duration::from_secs(10),
        || !frozen(&cg_low),
    );
    let log = agent.sched_lines();
    assert!(
        log.iter().any(|l| matches!(l, SchedLine::Transition(t)
            if t.pid == pid_low
                && t.state_transition == "RUNNING→PREEMPTED"
                && t.reason == Reason::PreemptedByHigherPriority)),
        "{log:?}"
    );
}

/// Before: `--gpu 7`, `--gpu 99` and `--gpu 4294967295` were accepted on a 2-GPU
/// host (and never scheduled against anyone).
#[test]
fn a_gpu_the_host_does_not_have_is_refused() {
    let Some(fx) = Fixture::scheduler("a_gpu_the_host_does_not_have_is_refused", &["--gpus", "2"])
    else {
        return;
    };
    let sim = fx.sim();
    let agent = start_agent(sim, &[]);
    for gpu in ["7", "99", "4294967295"] {
        let out = Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--gpu", gpu, "--", "/bin/true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--gpu {gpu} was accepted: {err}");
        assert!(
            err.contains(&format!("GPU {gpu} does not exist")) && err.contains("0, 1"),
            "{err}"
        );
    }
    assert!(agent.status_reply().tasks.is_empty(), "nothing was started");
}
