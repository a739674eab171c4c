//! Sharing a GPU by memory end to end (issue 34): root, real eBPF, the
//! simulated driver with one GPU of 8 GiB, `keling run` with its own defaults
//! (memory sharing, late binding), tasks started with `keling launch` and
//! memory budgets (`--mem-quota`). Tasks whose budgets fit run at once; one
//! that does not fit waits unbound until one exits; a higher priority that
//! arrives freezes them while it works, and they resume after; the input log
//! replays to the very decisions the agent made. What is checked comes from
//! outside Keling where it can: the workloads' progress files and the
//! kernel's freezer (`cgroup.events`).
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use keling_agent::{
    control::{StatusReply, TaskStatus},
    log_format::{InputLogHeader, SchedLine},
};
use keling_sched::{Binding, Reason, Sharing, WaitReason};
use keling_tests::{
    ChildGuard, Fixture, Nvsim,
    agent::{Agent, AgentOptions, frozen, progress, wait_for},
};

const GIB: u64 = 1 << 30;

/// `keling launch --priority P --mem-quota BUDGET` (unpinned) of a busy
/// workload holding 512 MiB for `iterations` (2 ms each) writing `progress`.
fn launch(
    agent: &Agent,
    sim: &Nvsim,
    priority: u8,
    budget: u64,
    iterations: u64,
    progress: &Path,
) -> ChildGuard {
    let (priority, budget) = (priority.to_string(), budget.to_string());
    agent.launch(
        &["--priority", &priority, "--mem-quota", &budget],
        sim,
        iterations,
        512,
        progress,
    )
}

/// The newest task in `keling status` whose pid is not in `known`.
fn newest_task(agent: &Agent, known: &[u32]) -> TaskStatus {
    let mut found = None;
    wait_for(
        "a new task in keling status",
        Duration::from_secs(20),
        || {
            found = agent
                .status_reply()
                .tasks
                .into_iter()
                .rev()
                .find(|t| !known.contains(&t.pid));
            found.is_some()
        },
    );
    found.unwrap()
}

fn task_by_pid(status: &StatusReply, pid: u32) -> &TaskStatus {
    status
        .tasks
        .iter()
        .find(|t| t.pid == pid)
        .unwrap_or_else(|| panic!("no task with pid {pid}: {status:#?}"))
}

/// Progress of `file` grows within a second or so.
fn progresses(file: &Path) -> bool {
    let before = progress(file);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        if progress(file) > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn tasks_share_a_gpu_while_their_budgets_fit_and_a_higher_priority_freezes_them() {
    let Some(fx) = Fixture::scheduler(
        "tasks_share_a_gpu_while_their_budgets_fit_and_a_higher_priority_freezes_them",
        &["--gpus", "1", "--mem-per-gpu", &(8 * GIB).to_string()],
    ) else {
        return;
    };
    let sim = fx.sim();
    // The agent's own defaults: nothing about sharing or binding is passed.
    let agent = Agent::start_with(
        sim,
        AgentOptions {
            agent_defaults: true,
            status_interval_s: Some(0),
            ..AgentOptions::default()
        },
    );
    let dir = &fx.dir;
    let files: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("progress-{i}"))).collect();

    // Budgets of 3, 3 and 4 GiB launched one right after the other.
    let mut clients = Vec::new();
    let mut pids = Vec::new();
    for (i, budget) in [3 * GIB, 3 * GIB, 4 * GIB].into_iter().enumerate() {
        clients.push(launch(&agent, sim, 8, budget, 1_000_000, &files[i]));
        pids.push(newest_task(&agent, &pids).pid);
    }
    // The first two run at the same time; the third waits unbound, for memory.
    for f in &files[..2] {
        wait_for("a task that fits to run", Duration::from_secs(20), || {
            progress(f) > 0
        });
    }
    assert!(progresses(&files[0]) && progresses(&files[1]));
    let status = agent.status_reply();
    let third = task_by_pid(&status, pids[2]);
    assert_eq!(third.state, "PENDING", "{third:#?}");
    assert_eq!(third.gpu, None, "{third:#?}");
    assert_eq!(
        third.queued.map(|q| q.reason),
        Some(WaitReason::Memory),
        "{third:#?}"
    );
    assert_eq!(third.wait_reason, Some(WaitReason::Memory), "{third:#?}");
    assert_eq!(progress(&files[2]), 0, "the third task ran");
    // Per GPU: capacity, held by tasks (512 MiB each), outside tasks, free.
    let mut status = status;
    wait_for("both to hold their memory", Duration::from_secs(10), || {
        status = agent.status_reply();
        status
            .gpus
            .first()
            .is_some_and(|g| g.tasks_bytes == 1024 << 20)
    });
    let gpu = &status.gpus[0];
    assert_eq!(gpu.capacity_bytes, 8 * GIB, "{status:#?}");
    assert_eq!(gpu.outside_bytes, 0, "{status:#?}");
    assert_eq!(gpu.free_bytes, 8 * GIB - (1024 << 20), "{status:#?}");

    // One exits: the third starts.
    // SAFETY: a task's root process, by the pid keling status gave, while it runs.
    unsafe { libc::kill(pids[0] as i32, libc::SIGTERM) };
    wait_for(
        "the third task to start when one exits",
        Duration::from_secs(20),
        || progress(&files[2]) > 0,
    );
    let status = agent.status_reply();
    let cgroup = |pid: u32| PathBuf::from(task_by_pid(&status, pid).cgroup.as_deref().unwrap());
    let (cg_b, cg_c) = (cgroup(pids[1]), cgroup(pids[2]));
    assert!(progresses(&files[1]) && progresses(&files[2]));

    // A higher priority arrives: both are frozen while it works (they keep
    // their memory), and resume after it exits.
    let mut high = launch(&agent, sim, 2, GIB, 600, &files[3]);
    wait_for("both to be frozen", Duration::from_secs(10), || {
        frozen(&cg_b) && frozen(&cg_c)
    });
    let status = agent.status_reply();
    for &pid in &pids[1..3] {
        let t = task_by_pid(&status, pid);
        assert_eq!(t.wait_reason, Some(WaitReason::HigherPriority), "{t:#?}");
        assert_eq!(t.mem_bytes, 512 << 20, "{t:#?}");
    }
    let frozen_at = (progress(&files[1]), progress(&files[2]));
    wait_for(
        "the higher priority to work",
        Duration::from_secs(10),
        || progress(&files[3]) >= 100,
    );
    assert_eq!(
        (progress(&files[1]), progress(&files[2])),
        frozen_at,
        "a frozen task ran"
    );
    assert!(high.0.wait().unwrap().success());
    wait_for("both to be thawed", Duration::from_secs(10), || {
        !frozen(&cg_b) && !frozen(&cg_c)
    });
    assert!(progresses(&files[1]) && progresses(&files[2]));

    // The recording replays to the very decisions the agent made; its header
    // carries the defaults it ran with.
    for &pid in &pids[1..3] {
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    for c in &mut clients {
        let _ = c.0.wait();
    }
    let mut agent = agent;
    assert!(agent.stop().success());
    let inputs = std::fs::read_to_string(agent.input_log()).unwrap();
    let header: InputLogHeader = serde_json::from_str(inputs.lines().next().unwrap()).unwrap();
    assert_eq!(header.config.sharing, Sharing::Memory, "{header:?}");
    assert_eq!(header.config.binding, Binding::Late, "{header:?}");
    assert_eq!(header.config.slots_per_gpu, 0, "{header:?}");
    let log = agent.sched_lines();
    let moves = |pid: u32| -> Vec<(&str, Reason)> {
        log.iter()
            .filter_map(|l| match l {
                SchedLine::Transition(t) if t.pid == pid => {
                    Some((t.state_transition.as_str(), t.reason))
                }
                _ => None,
            })
            .collect()
    };
    for &pid in &pids[1..3] {
        let m = moves(pid);
        assert!(
            m.contains(&("RUNNING→PREEMPTED", Reason::PreemptedByHigherPriority)),
            "{m:?}"
        );
        assert!(m.contains(&("PREEMPTED→RUNNING", Reason::Resumed)), "{m:?}");
    }
    keling_tests::agent::assert_replays_exactly(&agent, 10);
}
