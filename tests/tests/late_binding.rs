//! Late binding end to end (`keling run --binding late`): root, real eBPF, the
//! simulated driver with two GPUs, tasks started with `keling launch`. Queued
//! tasks wait held before exec, unbound; the first GPU to free takes the oldest
//! of them, whose process then sees that GPU in `CUDA_VISIBLE_DEVICES`; the
//! agent's input log replays to the very decisions it made. What is checked
//! comes from outside Keling where it can: `/proc` (a held process has not
//! exec'd and is not frozen; the environment it exec'd with), the workloads'
//! progress files and the clients' own words.
use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use keling_agent::control::{StatusReply, TaskStatus};
use keling_sched::WaitReason;
use keling_tests::{
    ChildGuard, Fixture, Nvsim,
    agent::{Agent, AgentOptions, proc_state, progress, wait_for},
    gpu_workload_bin, keling_bin,
};
use serde_json::Value;

/// `keling launch` (unpinned, priority 8) of a busy workload writing `progress`,
/// its standard error kept for the notices.
fn launch(agent: &Agent, sim: &Nvsim, progress: &Path) -> ChildGuard {
    ChildGuard(
        Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--priority", "8", "--"])
            .arg(gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args(["--iterations", "1000000", "--alloc-mib", "64", "--progress"])
            .arg(progress)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// The status entry of the task whose pid is `pid`.
fn task_by_pid(status: &StatusReply, pid: u32) -> Option<&TaskStatus> {
    status.tasks.iter().find(|t| t.pid == pid)
}

/// The newest task in `keling status` that is not in `known`.
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

/// `/proc/PID/environ`'s `CUDA_VISIBLE_DEVICES`.
fn visible_devices(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|e| e.strip_prefix(b"CUDA_VISIBLE_DEVICES="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The client's standard error, once it has exited.
fn client_said(client: &mut ChildGuard) -> String {
    let mut text = String::new();
    if let Some(mut err) = client.0.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

#[test]
fn the_first_gpu_to_free_takes_the_oldest_queued_job() {
    let Some(fx) = Fixture::scheduler(
        "the_first_gpu_to_free_takes_the_oldest_queued_job",
        &["--gpus", "2"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start_with(
        sim,
        AgentOptions {
            args: ["--binding", "late", "--placement-seed", "7"]
                .map(String::from)
                .to_vec(),
            ..AgentOptions::default()
        },
    );
    let dir = &fx.dir;
    let files: Vec<PathBuf> = (0..5).map(|i| dir.join(format!("progress-{i}"))).collect();

    // Two jobs take the two GPUs, one each (work-conserving: neither waits).
    let mut holders = Vec::new();
    let mut pids = Vec::new();
    for f in &files[..2] {
        holders.push(launch(&agent, sim, f));
        wait_for("a holder to run", Duration::from_secs(20), || {
            progress(f) > 0
        });
        pids.push(newest_task(&agent, &pids).pid);
    }
    let status = agent.status_reply();
    let gpu_of = |pid: u32| task_by_pid(&status, pid).unwrap().gpu.unwrap();
    let held_gpus = [gpu_of(pids[0]), gpu_of(pids[1])];
    assert_ne!(held_gpus[0], held_gpus[1], "{status:#?}");
    for (i, &pid) in pids.iter().enumerate() {
        assert_eq!(
            visible_devices(pid),
            Some(held_gpus[i].to_string()),
            "holder {i}"
        );
    }

    // Three more while both are held: each waits unbound, in arrival order.
    let mut queued = Vec::new();
    for (n, f) in files[2..].iter().enumerate() {
        queued.push(launch(&agent, sim, f));
        let t = newest_task(&agent, &pids);
        pids.push(t.pid);
        assert_eq!(t.state, "PENDING", "{t:#?}");
        assert!(t.gpu.is_none(), "{t:#?}");
        let q = t.queued.as_ref().expect("queued");
        assert_eq!(q.position, n + 1, "{t:#?}");
        assert_eq!(q.ahead, n, "{t:#?}");
        assert_eq!(q.reason, WaitReason::SlotsHeld, "{t:#?}");
    }
    // Held before exec: not the workload yet, running nothing, not frozen.
    std::thread::sleep(Duration::from_millis(300));
    for (i, f) in files[2..].iter().enumerate() {
        let pid = pids[2 + i];
        assert_eq!(progress(f), 0, "queued job {i} made progress");
        assert_ne!(
            keling_tests::agent::comm(pid).as_deref(),
            Some("keling-gpu-work"),
            "queued job {i} exec'd"
        );
        assert_eq!(proc_state(pid), 'S', "queued job {i} (pid {pid})");
        assert_eq!(visible_devices(pid), None, "queued job {i} has a GPU");
    }

    // The first GPU to free takes the oldest queued job.
    // SAFETY: signalling a task's root process by the pid keling status gave,
    // while it runs (its progress grows).
    unsafe { libc::kill(pids[0] as i32, libc::SIGTERM) };
    wait_for(
        "the oldest queued job to run",
        Duration::from_secs(20),
        || progress(&files[2]) > 0,
    );
    let status = agent.status_reply();
    let oldest = task_by_pid(&status, pids[2]).unwrap();
    assert_eq!(oldest.state, "RUNNING", "{oldest:#?}");
    assert_eq!(oldest.gpu, Some(held_gpus[0]), "{oldest:#?}");
    assert!(oldest.queued.is_none(), "{oldest:#?}");
    assert_eq!(
        visible_devices(pids[2]),
        Some(held_gpus[0].to_string()),
        "the oldest queued job's environment"
    );
    for (n, &pid) in pids[3..].iter().enumerate() {
        let t = task_by_pid(&status, pid).unwrap();
        assert_eq!(t.queued.as_ref().map(|q| q.position), Some(n + 1), "{t:#?}");
        assert_eq!(progress(&files[3 + n]), 0);
    }

    // Ctrl-C at the last one's client: it leaves the queue, never having run.
    let last = queued.last_mut().unwrap();
    // SAFETY: our own child, by pid.
    unsafe { libc::kill(last.0.id() as i32, libc::SIGINT) };
    let code = last.0.wait().unwrap();
    let said = client_said(last);
    assert!(!code.success(), "{said}");
    assert!(said.contains("queued behind 2 jobs"), "{said}");
    assert!(said.contains("its command never ran"), "{said}");
    assert_eq!(progress(&files[4]), 0);
    wait_for(
        "the cancelled job to be reaped",
        Duration::from_secs(10),
        || proc_state(pids[4]) == '?',
    );

    // The other holder frees its GPU: the next queued job takes it.
    // SAFETY: as above.
    unsafe { libc::kill(pids[1] as i32, libc::SIGTERM) };
    wait_for(
        "the next queued job to run",
        Duration::from_secs(20),
        || progress(&files[3]) > 0,
    );
    assert_eq!(visible_devices(pids[3]), Some(held_gpus[1].to_string()));

    // The clients heard where they were placed.
    for &i in &[2usize, 3] {
        // SAFETY: a task's root process, by the pid keling status gave.
        unsafe { libc::kill(pids[i] as i32, libc::SIGTERM) };
    }
    for (i, client) in queued.iter_mut().take(2).enumerate() {
        let _ = client.0.wait();
        let said = client_said(client);
        assert!(
            said.contains(&format!(
                "queued behind {}",
                if i == 0 { "0 jobs" } else { "1 job" }
            )),
            "{said}"
        );
        assert!(
            said.contains(&format!("placed on GPU {}", held_gpus[i])),
            "{said}"
        );
    }
    for h in &mut holders {
        let _ = h.0.wait();
    }

    // The input log replays to the very decisions the agent made: its header
    // carries late binding and the seed.
    let mut agent = agent;
    agent.stop();
    let inputs = std::fs::read_to_string(agent.input_log()).unwrap();
    let header: Value = serde_json::from_str(inputs.lines().next().unwrap()).unwrap();
    assert_eq!(header["config"]["binding"], "late", "{header}");
    assert_eq!(header["config"]["placement_seed"], 7, "{header}");
    keling_tests::agent::assert_replays_exactly(&agent, 8);
}
