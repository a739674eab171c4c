//! The agent stops (an upgrade, a systemd restart) while a launched task runs:
//! the task goes on, and its `keling launch` client says so and exits with its
//! own code (not 1, as any other failure).
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use keling_tests::{
    ChildGuard, Fixture,
    agent::{Agent, AgentOptions, progress, task_pid, wait_for},
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
            .args(["--gpu", "0", "--"])
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
