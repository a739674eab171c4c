//! Agent instances (`--instance NAME`): two agents on one host, each with its own
//! cgroup root, run directory, socket and lock, never touch each other's tasks.
//! The kernel's `cgroup.events` is the truth.
use std::{path::PathBuf, process::Command, time::Duration};

use keling_agent::control::StatusReply;
use keling_tests::{
    Fixture, Nvsim,
    agent::{Agent, AgentOptions, cgroup2, cleanup_cgroups_in, frozen, task_pid, wait_for},
    keling_bin,
};

/// An agent of `instance` (with /metrics on a free port: two agents cannot both
/// have the default one).
fn start_agent(sim: &Nvsim, instance: &str) -> Agent {
    Agent::start_with(
        sim,
        AgentOptions {
            status_interval_s: Some(0),
            ..AgentOptions::args(&["--instance", instance, "--metrics-addr", "127.0.0.1:0"])
        },
    )
}

fn task_cgroup(status: &StatusReply, pid: u32) -> PathBuf {
    let t = status
        .tasks
        .iter()
        .find(|t| t.pid == pid)
        .expect("task in status");
    PathBuf::from(t.cgroup.as_deref().expect("cgroup path"))
}

fn thaw_all(instance: &str) {
    let out = Command::new(keling_bin())
        .args(["thaw", "--all", "--instance", instance])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keling thaw: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes an instance's cgroups however the test ends (before the agents'
/// own Drop, which does the same once they are stopped).
struct Cleanup(&'static [&'static str]);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in self.0 {
            cleanup_cgroups_in(&format!("keling-{name}"));
            // The instance's run directory (its lock file stays, as the
            // default instance's does, when nobody removes it).
            let _ = std::fs::remove_dir_all(format!("/run/keling/{name}"));
            // The GPU memory books it kept for tasks that ran on at its stop.
            let _ = std::fs::remove_dir_all(format!("/sys/fs/bpf/keling-{name}"));
        }
    }
}

#[test]
fn another_instance_neither_cleans_up_nor_thaws_an_instances_frozen_task() {
    let Some(fx) = Fixture::scheduler(
        "another_instance_neither_cleans_up_nor_thaws_an_instances_frozen_task",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let _cleanup = Cleanup(&["itest-a", "itest-b"]);
    let sim_a = fx.sim();
    let sim_b = Nvsim::mount(&["--gpus", "1"]);
    let a = start_agent(sim_a, "itest-a");
    let (pl, ph) = (fx.dir.join("low"), fx.dir.join("high"));
    let _low = a.launch(
        &["--priority", "10", "--gpu", "0"],
        sim_a,
        10_000_000,
        0,
        &pl,
    );
    let pid_low = task_pid(&a, &pl);
    let cg_low = task_cgroup(&a.status_reply(), pid_low);
    assert_eq!(
        cg_low.parent(),
        Some(cgroup2().unwrap().join("keling-itest-a").as_path()),
        "a named instance's tasks are under <cgroup2>/keling-NAME"
    );
    let _high = a.launch(
        &["--priority", "4", "--gpu", "0"],
        sim_a,
        10_000_000,
        0,
        &ph,
    );
    wait_for(
        "instance a's low priority task to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_low),
    );
    // A second agent, of another instance, on its own simulator: its start-up
    // cleanup of what earlier runs left does not touch instance a's cgroups.
    let b = start_agent(&sim_b, "itest-b");
    assert!(
        frozen(&cg_low),
        "instance b's start-up cleanup thawed instance a's frozen task"
    );
    // Nor does `keling thaw --all` for instance b.
    thaw_all("itest-b");
    assert!(
        frozen(&cg_low),
        "`keling thaw --all --instance itest-b` thawed instance a's frozen task"
    );
    // Both serve at once, each its own tasks.
    assert_eq!(b.status_reply().tasks.len(), 0);
    assert_eq!(a.status_reply().tasks.len(), 2);
    // `thaw --all` for instance a reaches it.
    thaw_all("itest-a");
    wait_for(
        "`keling thaw --all --instance itest-a` to thaw its task",
        Duration::from_secs(10),
        || !frozen(&cg_low),
    );
}
