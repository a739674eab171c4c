//! The agent stops (an upgrade, a systemd restart) while a launched task runs:
//! the task goes on. With no agent coming back, its `keling launch` client says
//! so and exits with its own code (not 1, as any other failure); when the next
//! agent starts, it takes the task back (owner, priority, limits, GPU memory)
//! and the client attaches to it again.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use keling_agent::control::{StatusReply, TaskStatus};
use keling_sched::Input;
use keling_tests::{
    ChildGuard, Fixture,
    agent::{Agent, AgentOptions, frozen, progress, task_pid, wait_for},
    gpu_workload_bin, keling_bin,
};

/// `keling launch`'s code when the agent went away and the task runs on
/// (`keling_agent::cmd::launch::EXIT_AGENT_GONE`).
const EXIT_AGENT_GONE: i32 = 75;

#[test]
fn a_launch_client_says_its_task_goes_on_when_the_agent_stops() {
    let Some(fx) = Fixture::scheduler(
        "a_launch_client_says_its_task_goes_on_when_the_agent_stops",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut agent = Agent::start_with(
        sim,
        AgentOptions {
            status_interval_s: Some(0),
            ..AgentOptions::default()
        },
    );
    let p = fx.dir.join("progress");
    let mut client = ChildGuard(
        Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--gpu", "0", "--reconnect-timeout", "1", "--"])
            .arg(gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args(["--iterations", "100000000", "--alloc-mib", "64"])
            .arg("--progress")
            .arg(&p)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The task has the client's standard error too: read it as it comes (it
    // stays open while the task runs).
    let said = Arc::new(Mutex::new(String::new()));
    let lines = BufReader::new(client.0.stderr.take().unwrap()).lines();
    let keep = said.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("launch: {l}");
            let mut s = keep.lock().unwrap();
            s.push_str(&l);
            s.push('\n');
        }
    });
    let pid = task_pid(&agent, &p);
    // The agent stops, by pid, as systemd stops it.
    agent.signal(libc::SIGTERM);
    wait_for("the agent to stop", Duration::from_secs(15), || {
        !agent.alive()
    });
    let mut status = None;
    wait_for("the launch client to exit", Duration::from_secs(10), || {
        status = client.0.try_wait().unwrap();
        status.is_some()
    });
    // What it said before it exited reaches the reader at once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !said.lock().unwrap().contains("goes on") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let said = said.lock().unwrap().clone();
    assert_eq!(
        status.unwrap().code(),
        Some(EXIT_AGENT_GONE),
        "the client's exit code; it said: {said}"
    );
    assert!(
        said.contains(&format!(
            "the task goes on, no longer scheduled by Keling, as pid {pid}"
        )),
        "the client says the task goes on and under which pid: {said}"
    );
    // And it does.
    let before = progress(&p);
    wait_for("the task to go on", Duration::from_secs(10), || {
        progress(&p) > before
    });
    // SAFETY: the task's root process, a child of the stopped agent, by pid
    // (checked alive just now); the fixture removes its cgroup.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// The status entry of the live task whose root is `pid`.
fn task_of(status: StatusReply, pid: u32) -> Option<TaskStatus> {
    status
        .tasks
        .into_iter()
        .find(|t| t.pid == pid && t.state != "COMPLETED" && t.state != "FAILED")
}

/// The video memory the simulated driver charges to `pid`, all GPUs.
fn sim_bytes(sim: &keling_tests::Nvsim, pid: u32) -> u64 {
    keling_tests::truth_figures(&sim.state())
        .iter()
        .filter(|((p, _), _)| *p == u64::from(pid))
        .map(|(_, f)| f[0])
        .sum()
}

/// Issue 32, defect 7: the agent is stopped (`signal`: SIGTERM, as systemd does;
/// SIGKILL, as a crash) while a launched task holding 128 MiB runs, and a new
/// agent of the same instance starts. The task is taken back with its owner,
/// priority, limits and 128 MiB (the simulator's truth), its client attaches
/// again and gets its exit code, and the scheduler acts on it (a higher priority
/// on its GPU freezes it).
fn a_restarted_agent_takes_back_a_running_task(name: &'static str, signal: i32) {
    const MIB: u64 = 1 << 20;
    let Some(fx) = Fixture::scheduler(name, &["--gpus", "1"]) else {
        return;
    };
    let sim = fx.sim();
    let socket = fx.dir.join("keling.sock");
    let options = || AgentOptions {
        status_interval_s: Some(0),
        socket: Some(socket.clone()),
        ..AgentOptions::default()
    };
    let mut first = Agent::start_with(sim, options());
    let p = fx.dir.join("progress");
    let mut client = ChildGuard(
        Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&socket)
            .args([
                "--gpu",
                "0",
                "--priority",
                "9",
                "--max-duration-ms",
                "600000",
            ])
            .args(["--mem-quota", "1073741824", "--notify-preempt", "--"])
            .arg(gpu_workload_bin())
            .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
            .args(["--iterations", "100000000", "--alloc-mib", "128"])
            .arg("--progress")
            .arg(&p)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let said = Arc::new(Mutex::new(String::new()));
    let lines = BufReader::new(client.0.stderr.take().unwrap()).lines();
    let keep = said.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("launch: {l}");
            let mut s = keep.lock().unwrap();
            s.push_str(&l);
            s.push('\n');
        }
    });
    let pid = task_pid(&first, &p);
    wait_for("the task's 128 MiB", Duration::from_secs(10), || {
        task_of(first.status_reply(), pid).is_some_and(|t| t.mem_bytes == 128 * MIB)
    });
    let id = task_of(first.status_reply(), pid).unwrap().id;
    first.signal(signal);
    wait_for("the first agent to stop", Duration::from_secs(15), || {
        !first.alive()
    });
    let second = Agent::start_with(sim, options());
    let t = task_of(second.status_reply(), pid)
        .expect("the task taken back, in the new agent's status");
    let truth = sim_bytes(sim, pid);
    assert_eq!(truth, 128 * MIB, "the simulator's truth");
    assert_eq!(t.id, id, "{t:?}");
    assert_eq!(t.uid, Some(0), "its owner: {t:?}");
    assert_eq!(t.priority, 9, "{t:?}");
    assert_eq!(t.gpu, Some(0), "{t:?}");
    assert_eq!(
        t.mem_bytes, truth,
        "its GPU memory, as the driver has it: {t:?}"
    );
    assert!(t.mem_unsure, "the gap while no agent ran is said: {t:?}");
    // Its limits: the spec the new agent gave the core.
    let spec = std::fs::read_to_string(second.input_log())
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Input>(l).ok())
        .find_map(|l| match l {
            Input::Arrive { spec, .. } if spec.pid == pid => Some(spec),
            _ => None,
        })
        .expect("the task's arrival in the new agent's input log");
    assert_eq!(spec.max_duration_ms, Some(600000), "{spec:?}");
    assert_eq!(spec.mem_quota_bytes, Some(1u64 << 30), "{spec:?}");
    // Its client is back.
    wait_for(
        "the client to attach again",
        Duration::from_secs(15),
        || {
            said.lock()
                .unwrap()
                .contains(&format!("attached again to task {id}"))
        },
    );
    assert!(
        client.0.try_wait().unwrap().is_none(),
        "the client waits on"
    );
    // The scheduler acts on it: a higher priority on its GPU freezes it.
    let cg = std::path::PathBuf::from(t.cgroup.as_deref().unwrap());
    let ph = fx.dir.join("high");
    let _high = second.launch(&["--priority", "0", "--gpu", "0"], sim, 100_000_000, 0, &ph);
    let high_pid = task_pid(&second, &ph);
    wait_for(
        "the taken-back task frozen",
        Duration::from_secs(10),
        || frozen(&cg),
    );
    wait_for("its client told so", Duration::from_secs(10), || {
        said.lock().unwrap().contains(&format!("task {id} frozen"))
    });
    // SAFETY: the high task's root process, by pid (its agent's child, alive).
    unsafe { libc::kill(high_pid as i32, libc::SIGKILL) };
    wait_for(
        "the taken-back task resumed",
        Duration::from_secs(10),
        || !frozen(&cg),
    );
    // Its end reaches its client through the new agent: Ctrl-C forwarded.
    // SAFETY: our own child, by pid.
    unsafe { libc::kill(client.0.id() as i32, libc::SIGINT) };
    let mut status = None;
    wait_for("the client to exit", Duration::from_secs(15), || {
        status = client.0.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(
        status.unwrap().code(),
        Some(128 + libc::SIGINT),
        "the task's own exit code; the client said: {}",
        said.lock().unwrap()
    );
    drop(second);
    drop(first);
}

#[test]
fn a_restarted_agent_takes_back_a_running_task_after_sigterm() {
    a_restarted_agent_takes_back_a_running_task(
        "a_restarted_agent_takes_back_a_running_task_after_sigterm",
        libc::SIGTERM,
    );
}

#[test]
fn a_restarted_agent_takes_back_a_running_task_after_sigkill() {
    a_restarted_agent_takes_back_a_running_task(
        "a_restarted_agent_takes_back_a_running_task_after_sigkill",
        libc::SIGKILL,
    );
}

/// Whether a bpf filesystem is mounted on /sys/fs/bpf in `pid`'s mount namespace.
fn bpffs_mounted_in(pid: u32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (before, after) = (halves.next().unwrap_or(""), halves.next().unwrap_or(""));
        before.split(' ').nth(4) == Some("/sys/fs/bpf") && after.starts_with("bpf ")
    })
}

/// Where no bpf filesystem is on /sys/fs/bpf (in a mount namespace of the
/// test's own, where the host's is unmounted) the agent mounts one for its
/// pins, and a clean stop with no task running on unmounts it: the host is left
/// as it was found. One that finds something else pinned there leaves it
/// mounted.
#[test]
fn an_agent_unmounts_the_bpffs_it_mounted_when_nothing_is_pinned_there() {
    const NAME: &str = "an_agent_unmounts_the_bpffs_it_mounted_when_nothing_is_pinned_there";
    let Some(fx) = Fixture::needs(NAME)
        .cgroups()
        .check(|test| {
            let found = Command::new("unshare").arg("--version").output().is_ok()
                && Command::new("nsenter").arg("--version").output().is_ok();
            if !found {
                keling_tests::skip(test, "no unshare(1) or nsenter(1)");
            }
            found
        })
        .sim(&["--gpus", "1"])
        .ready()
    else {
        return;
    };
    let sim = fx.sim();
    // The namespace, held by a process of the test's own; no bpffs in it.
    let holder = ChildGuard(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "600"])
            .spawn()
            .unwrap(),
    );
    let ns = holder.0.id();
    let enter = |cmd: &str| {
        let st = Command::new("nsenter")
            .args(["-t", &ns.to_string(), "-m", "sh", "-c", cmd])
            .status()
            .unwrap();
        assert!(st.success(), "{cmd}: {st}");
    };
    wait_for("the namespace", Duration::from_secs(5), || {
        std::fs::read_link(format!("/proc/{ns}/exe")).is_ok_and(|p| p.ends_with("sleep"))
    });
    enter(
        "while grep -q ' /sys/fs/bpf ' /proc/self/mountinfo; do umount /sys/fs/bpf || exit 1; done",
    );
    assert!(!bpffs_mounted_in(ns));
    let start = || {
        Agent::start_with(
            sim,
            AgentOptions {
                wrapper: vec![
                    "nsenter".into(),
                    "-t".into(),
                    ns.to_string().into(),
                    "-m".into(),
                    "--".into(),
                ],
                ..AgentOptions::default()
            },
        )
    };

    let mut agent = start();
    assert!(bpffs_mounted_in(ns), "the agent mounted bpffs for its pins");
    assert!(agent.stop().success());
    assert!(
        !bpffs_mounted_in(ns),
        "a clean stop unmounts what the agent mounted: {:?}",
        agent.stderr()
    );
    drop(agent);

    // Someone else's pin (a directory in bpffs, as `bpftool` makes) keeps it.
    let mut agent = start();
    assert!(bpffs_mounted_in(ns));
    enter("mkdir /sys/fs/bpf/someone-elses");
    assert!(agent.stop().success());
    assert!(bpffs_mounted_in(ns), "another's pins keep the mount");
    assert!(
        agent
            .stderr()
            .iter()
            .any(|l| l.contains("stays: someone-elses pinned there")),
        "{:?}",
        agent.stderr()
    );
    drop(agent);
    drop(holder);
}
