//! Chaos: `keling run` (root, real eBPF, the simulated driver) under what a root
//! daemon that freezes other people's processes must survive: hostile clients,
//! being stopped, a second agent, a dead fail-safe, no file descriptors left, lost
//! exit events with a reused pid, non-root users, a cgroup mount point that is not
//! UTF-8, leftovers of earlier runs, logs that cannot be written.
//!
//! Every test asserts from `/proc` and cgroup files, not from Keling's own view:
//! nothing stays frozen, no foreign process is touched, nothing is lost. They share
//! the host's cgroup tree and the one-agent lock, so they run one at a time.
use std::{
    ffi::{OsStr, OsString},
    io::{BufRead, BufReader, Read, Write},
    os::unix::{ffi::OsStrExt, fs::MetadataExt, net::UnixStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use keling_tests::{
    ChildGuard, Fixture, Nvsim,
    agent::{
        Agent, AgentOptions, cgroup_of, cgroup2, children_of, frozen, proc_state, progress,
        realtime_threads, task_cgroups, task_pid, wait_for,
    },
    gpu_workload_bin, keling_bin, skip,
};
use serde_json::Value;

/// The task in `status` whose pid is not one of `known`.
fn other_task_pid(agent: &Agent, known: &[u32]) -> u32 {
    let mut pid = 0;
    wait_for("the new task in status", Duration::from_secs(20), || {
        pid = agent
            .status_reply()
            .tasks
            .iter()
            .filter(|t| t.state != "ARCHIVED" && t.state != "COMPLETED")
            .map(|t| t.pid)
            .find(|p| !known.contains(p))
            .unwrap_or(0);
        pid != 0
    });
    pid
}

/// A pidfd on a process that is not our child (to learn the moment it exits).
fn pidfd_open(pid: u32) -> i32 {
    // SAFETY: pidfd_open(pid, 0).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(
        fd >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    fd
}

/// Waits until the process behind `pidfd` has exited.
fn wait_pidfd(pidfd: i32, timeout: Duration) -> Instant {
    let mut pfd = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    assert_eq!(n, 1, "the process did not exit within {timeout:?}");
    let at = Instant::now();
    // SAFETY: closing our fd.
    unsafe { libc::close(pidfd) };
    at
}

fn workload_config(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("keling.toml");
    std::fs::write(&path, body).unwrap();
    path
}

/// A GPU process Keling did not launch (adopted through a config rule).
fn unlaunched_gpu_process(sim: &Nvsim, progress: &Path) -> ChildGuard {
    ChildGuard(
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
            .arg(progress)
            .spawn()
            .unwrap(),
    )
}

/// The config rule that adopts `keling-gpu-workload` (comm cut to 15 bytes).
const ADOPT_WORKLOAD: &str =
    "[[rule]]\nname = \"batch\"\ncomm = \"keling-gpu-work\"\npriority = 12\ngpu = 0\n";

/// One JSON request on a fresh connection, and the first reply line.
fn raw_request(socket: &Path, line: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).unwrap();
    reply
}

/// Keeps `n` connections open that never send anything, reconnecting each one the
/// agent closes (after its request deadline). Stops on drop.
struct SilentCrowd {
    stop: Arc<AtomicBool>,
    closed_by_agent: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentCrowd {
    fn new(socket: &Path, n: usize) -> Self {
        let connect = {
            let socket = socket.to_owned();
            move || {
                let s = UnixStream::connect(&socket).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            }
        };
        let mut crowd: Vec<UnixStream> = (0..n).map(|_| connect()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let closed_by_agent = Arc::new(AtomicUsize::new(0));
        let (stop2, closed2) = (stop.clone(), closed_by_agent.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                for s in crowd.iter_mut() {
                    let mut buf = [0u8; 512];
                    match s.read(&mut buf) {
                        // The agent gave up on it (an error reply, then EOF).
                        Ok(_) => {
                            closed2.fetch_add(1, Ordering::Relaxed);
                            *s = connect();
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => *s = connect(),
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            closed_by_agent,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentCrowd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// While 100 silent clients stay connected, and others are slow, send garbage,
/// send 1 GiB or connect and leave by the hundred, a preemption happens: the
/// background task is frozen in the kernel (it makes no progress), is thawed
/// after the higher-priority task exits and progresses again, and `keling status`
/// answers throughout.
///
/// How soon is not asserted here, against a wall clock: the daemon's tests assert
/// that the thaw is submitted in the step that learns of the exit and that status
/// is answered while clients never read (`keling-agent/src/sched/daemon/behaviour.rs`),
/// and that a request is served while a hundred clients stay silent
/// (`control/server.rs`); the milliseconds are `cargo xtask bench`'s. This test
/// prints what it measured.
#[test]
fn hostile_clients_delay_neither_preemption_nor_status() {
    let Some(fx) = Fixture::scheduler(
        "hostile_clients_delay_neither_preemption_nor_status",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(sim, &[]);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();

    let crowd = SilentCrowd::new(&agent.socket, 100);
    let stop = Arc::new(AtomicBool::new(false));
    let mut hostile = Vec::new();
    // Slow: a byte every 100 ms, never a whole request.
    let (sock, stop2) = (agent.socket.clone(), stop.clone());
    hostile.push(std::thread::spawn(move || {
        let mut s = UnixStream::connect(&sock).unwrap();
        for b in b"{\"status\": tru".iter().cycle() {
            if stop2.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }));
    // A flood: connect and leave, hundreds of times.
    let (sock, stop2) = (agent.socket.clone(), stop.clone());
    hostile.push(std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            for _ in 0..100 {
                drop(UnixStream::connect(&sock));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }));
    // 1 GiB: refused at the size limit, long before.
    let sock = agent.socket.clone();
    let oversized = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&sock).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let started = Instant::now();
        let mut sent = 0u64;
        while sent < 1 << 30 {
            if s.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        (sent, started.elapsed())
    });
    // Garbage: a clear error.
    let garbage = raw_request(&agent.socket, "garbage, not JSON");
    let reply: Value = serde_json::from_str(&garbage).expect("the error reply is JSON");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad request"),
        "{garbage}"
    );
    assert_eq!(reply["error"]["kind"], "invalid", "{garbage}");

    let mut b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 300, 0, &pb);
    wait_for(
        "the background task to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_a),
    );
    assert_ne!(proc_state(pid_a), 'R', "a frozen task is not running");
    let pid_b = other_task_pid(&agent, &[pid_a]);
    let b_exit = pidfd_open(pid_b);
    std::thread::sleep(Duration::from_millis(20));
    let before = progress(&pa);
    // Status, with the crowd at the door: answered, every time.
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        let status = agent.status_reply();
        slowest = slowest.max(t.elapsed());
        assert!(status.tasks.len() >= 2);
    }
    assert!(frozen(&cg_a), "the interactive task still runs");
    assert_eq!(
        progress(&pa),
        before,
        "the background task ran while frozen"
    );
    let exited = wait_pidfd(b_exit, Duration::from_secs(30));
    wait_for(
        "the background task to be thawed",
        Duration::from_secs(5),
        || !frozen(&cg_a),
    );
    let thawed_after = exited.elapsed();
    assert!(b.0.wait().unwrap().success());
    let status = agent.status_reply();
    let timeout_ms = status.latency.timeout_ms;
    // Measured from outside (the exit seen through a pidfd, the thaw in
    // cgroup.events, both polled), for the record.
    eprintln!(
        "thawed {thawed_after:?} after the interactive task exited (timeout {timeout_ms:.2} ms, \
         {} late thaw(s)); status took at most {slowest:?}; {} silent connections closed by \
         the agent",
        status
            .latency
            .late_by_action
            .get("thaw")
            .copied()
            .unwrap_or(0),
        crowd.closed_by_agent.load(Ordering::Relaxed)
    );
    wait_for(
        "the background task to progress again",
        Duration::from_secs(10),
        || progress(&pa) > before,
    );
    stop.store(true, Ordering::Relaxed);
    drop(crowd);
    for h in hostile {
        h.join().unwrap();
    }
    let (sent, took) = oversized.join().unwrap();
    assert!(
        sent < 64 << 20,
        "the agent read {sent} bytes of an oversized request"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// `kill -STOP` of the agent: within 1.5 s every task it froze runs again (a
/// launched one in its cgroup, an adopted one stopped with SIGSTOP); once the
/// agent runs again, it freezes them again.
#[test]
fn a_stopped_agent_leaves_nothing_frozen_past_1_5_s() {
    let Some(fx) = Fixture::scheduler(
        "a_stopped_agent_leaves_nothing_frozen_past_1_5_s",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let config = workload_config(dir, ADOPT_WORKLOAD);
    let agent = Agent::start(sim, &["--config", config.to_str().unwrap()]);
    let (pa, pb, pc) = (dir.join("a"), dir.join("b"), dir.join("c"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();
    let c = unlaunched_gpu_process(sim, &pc);
    let pid_c = c.0.id();
    wait_for("the process to be adopted", Duration::from_secs(10), || {
        agent.status_reply().tasks.iter().any(|t| t.pid == pid_c)
    });
    let _b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 1_000_000, 0, &pb);
    wait_for(
        "both lower tasks to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_a) && proc_state(pid_c) == 'T',
    );
    agent.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    wait_for("everything to run again", Duration::from_secs(5), || {
        !frozen(&cg_a) && proc_state(pid_c) != 'T' && proc_state(pid_a) != 'T'
    });
    let after = stopped.elapsed();
    eprintln!("every frozen task ran again {after:?} after the agent was stopped");
    // Frozen with the freeze boost (its threads raised to SCHED_FIFO for the
    // freeze): running again, not one thread is left in the real-time class.
    assert_eq!(
        realtime_threads(pid_a),
        Vec::<u32>::new(),
        "task a's threads"
    );
    let (a0, c0) = (progress(&pa), progress(&pc));
    wait_for("both to progress", Duration::from_secs(5), || {
        progress(&pa) > a0 && progress(&pc) > c0
    });
    assert!(
        after < Duration::from_millis(1500),
        "frozen tasks ran again only {after:?} after the agent was stopped"
    );
    agent.signal(libc::SIGCONT);
    wait_for(
        "the agent, running again, to freeze them again",
        Duration::from_secs(5),
        || frozen(&cg_a) && proc_state(pid_c) == 'T',
    );
    assert!(
        agent
            .stderr()
            .iter()
            .any(|l| l.contains("no heartbeat from the agent")),
        "the fail-safe said why"
    );
    drop(c);
}

/// A second `keling run` while one runs: it exits at once with a clear message,
/// and the first one's frozen task stays frozen, its socket and cgroups intact.
#[test]
fn a_second_agent_exits_at_once_and_touches_nothing() {
    let Some(fx) = Fixture::scheduler(
        "a_second_agent_exits_at_once_and_touches_nothing",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start(sim, &[]);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();
    let _b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 1_000_000, 0, &pb);
    wait_for("the low task to be frozen", Duration::from_secs(10), || {
        frozen(&cg_a)
    });
    let cgroups_before = task_cgroups();
    let mut second = Command::new(keling_bin())
        .args(["run", "--dev-dir", sim.dev_dir(), "--socket"])
        .arg(&agent.socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = second.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the second agent did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut said = String::new();
    second
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("another keling agent") && said.contains(&format!("pid {}", agent.pid)),
        "{said}"
    );
    assert!(
        frozen(&cg_a),
        "the second agent thawed the first one's task"
    );
    assert_eq!(task_cgroups(), cgroups_before);
    // The first agent's socket is still its own.
    let s = agent.status_reply();
    assert_eq!(s.tasks.len(), 2, "{s:?}");
}

/// The fail-safe is killed: the agent starts another, which does its job.
#[test]
fn a_killed_fail_safe_is_replaced_and_the_new_one_thaws() {
    let Some(fx) = Fixture::scheduler(
        "a_killed_fail_safe_is_replaced_and_the_new_one_thaws",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut agent = Agent::start(sim, &[]);
    let old = agent.fail_safe_pid().expect("a fail-safe");
    // SAFETY: killing the agent's fail-safe by pid (it is alive: we just saw it).
    unsafe { libc::kill(old as i32, libc::SIGKILL) };
    let mut new = None;
    wait_for("a new fail-safe", Duration::from_secs(5), || {
        new = agent.fail_safe_pid().filter(|&p| p != old);
        new.is_some()
    });
    assert!(
        !children_of(agent.pid).contains(&old),
        "the dead fail-safe was reaped"
    );
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();
    let _b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 1_000_000, 0, &pb);
    wait_for("the low task to be frozen", Duration::from_secs(10), || {
        frozen(&cg_a)
    });
    agent.sigkill();
    let killed = Instant::now();
    wait_for("the new fail-safe to thaw", Duration::from_secs(5), || {
        !frozen(&cg_a)
    });
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
}

/// The agent runs out of file descriptors while clients keep connecting: accept
/// fails with EMFILE, is reported, and survived; afterwards the agent answers and
/// schedules as before.
#[test]
fn running_out_of_file_descriptors_is_survived() {
    let Some(fx) = Fixture::scheduler(
        "running_out_of_file_descriptors_is_survived",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut agent = Agent::start(sim, &[]);
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();
    let agent_pid = agent.pid;
    // The soft limit only: raising a hard limit again needs CAP_SYS_RESOURCE, which
    // a container's root may lack.
    let prlimit = |limit: usize| {
        let ok = Command::new("prlimit")
            .arg("--pid")
            .arg(agent_pid.to_string())
            .arg(format!("--nofile={limit}:"))
            .status()
            .unwrap()
            .success();
        assert!(ok, "prlimit");
    };
    let used = std::fs::read_dir(format!("/proc/{}/fd", agent.pid))
        .unwrap()
        .count();
    prlimit(used + 4);
    let clients: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(&agent.socket).unwrap())
        .collect();
    wait_for("the agent to report EMFILE", Duration::from_secs(5), || {
        agent
            .stderr()
            .iter()
            .any(|l| l.contains("accept failed") && l.contains("Too many open files"))
    });
    assert!(agent.alive(), "the agent died of EMFILE");
    drop(clients);
    prlimit(4096);
    wait_for("status to answer again", Duration::from_secs(5), || {
        assert!(agent.alive(), "the agent died of EMFILE");
        Command::new(keling_bin())
            .args(["status", "--json", "--socket"])
            .arg(&agent.socket)
            .output()
            .unwrap()
            .status
            .success()
    });
    let mut b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 200, 0, &pb);
    wait_for("the low task to be frozen", Duration::from_secs(10), || {
        frozen(&cg_a)
    });
    assert!(b.0.wait().unwrap().success());
    wait_for("the low task to be thawed", Duration::from_secs(5), || {
        !frozen(&cg_a)
    });
}

/// The ring buffer overflows (4 KiB, the agent stopped while processes come and
/// go), so an adopted process's exit event is lost, and its pid is then given to
/// another process. Keling must never touch that process: the task ends through
/// its pidfd, and a preemption that would have stopped it stops nobody.
#[test]
fn lost_exit_events_and_a_reused_pid_never_reach_a_foreign_process() {
    let Some(fx) = Fixture::scheduler(
        "lost_exit_events_and_a_reused_pid_never_reach_a_foreign_process",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let config = workload_config(dir, ADOPT_WORKLOAD);
    let agent = Agent::start(
        sim,
        &["--ringbuf-kib", "4", "--config", config.to_str().unwrap()],
    );
    let pc = dir.join("c");
    let mut c = unlaunched_gpu_process(sim, &pc);
    let pid_c = c.0.id();
    wait_for("the process to be adopted", Duration::from_secs(10), || {
        agent.status_reply().tasks.iter().any(|t| t.pid == pid_c)
    });
    agent.signal(libc::SIGSTOP);
    // Fill the ring: every fork, exec and exit on the host is an event.
    for _ in 0..300 {
        let _ = Command::new("true").status();
    }
    let _ = c.0.kill();
    let _ = c.0.wait(); // its exit event finds the ring full
    // The pid goes to someone else: ask the kernel for it.
    let mut foreign = None;
    for _ in 0..2000 {
        let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", (pid_c - 1).to_string());
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        if child.id() == pid_c {
            foreign = Some(ChildGuard(child));
            break;
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    agent.signal(libc::SIGCONT);
    let Some(foreign) = foreign else {
        skip(
            fx.name,
            &format!("could not get pid {pid_c} reused (a busy host)"),
        );
        return;
    };
    // A high-priority task on the GPU the adopted one had: if Keling still
    // believed in it, it would SIGSTOP its pid.
    let pb = dir.join("b");
    let _b = agent.launch(&["--priority", "2", "--gpu", "0"], sim, 1_000_000, 0, &pb);
    wait_for("the launched task to run", Duration::from_secs(20), || {
        progress(&pb) > 0
    });
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let state = proc_state(pid_c);
        assert!(
            matches!(state, 'S' | 'R'),
            "the process that reused pid {pid_c} was touched: state {state}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The adopted task is over (its pidfd said so), whatever the trace lost.
    let status = agent.status_reply();
    let task = status.tasks.iter().find(|t| t.pid == pid_c);
    assert!(
        task.is_none_or(|t| ["COMPLETED", "FAILED", "ARCHIVED"].contains(&t.state.as_str())),
        "{task:?}"
    );
    // The overflow did happen (the agent's status line counts lost events).
    wait_for(
        "the agent to report lost events",
        Duration::from_secs(3),
        || {
            agent.stderr().iter().any(|l| {
                l.split("; ")
                    .find_map(|p| p.strip_suffix(" events lost"))
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n > 0)
            })
        },
    );
    drop(foreign);
}

/// A user and a group of their own, removed on drop.
struct TestUser {
    user: String,
    group: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn create() -> Option<TestUser> {
        let tag = std::process::id() % 100_000;
        let (user, group) = (format!("kltu{tag}"), format!("kltg{tag}"));
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        let _ = Command::new("userdel").arg(&user).status();
        let _ = Command::new("groupdel").arg(&group).status();
        if !ok(Command::new("groupadd").arg(&group)) {
            return None;
        }
        let guard = TestUser {
            user: user.clone(),
            group: group.clone(),
            uid: 0,
            gid: 0,
        };
        if !ok(Command::new("useradd").args(["-M", "-N", "-g", &group, "-s", "/bin/sh", &user])) {
            return None;
        }
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").arg(flag).arg(&user).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        let mut guard = guard;
        guard.uid = id("-u");
        guard.gid = id("-g");
        Some(guard)
    }

    /// `setpriv` as this user (uid, gid, the groups initgroups gives).
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            &self.user,
            "--regid",
            &self.group,
            "--init-groups",
            "--",
        ])
        .arg(program);
        c
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.user).status();
        let _ = Command::new("groupdel").arg(&self.group).status();
    }
}

/// The `uid`, `gid` or `groups` line of `/proc/PID/status`, as numbers.
fn status_ids(pid: u32, key: &str) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A request through perl (any user can run it; it sends one line and prints the
/// first reply line that is not a `{"notice": ...}`, which may precede the reply).
fn perl_request(c: &mut Command, socket: &Path, line: &str) -> String {
    let out = c
        .args([
            "-MIO::Socket::UNIX",
            "-e",
            "my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die \"connect: $!\\n\"; \
             print $s $ARGV[1], \"\\n\"; my $r; do { $r = <$s> } while (defined $r && $r =~ /^\\{\"notice\"/); \
             print $r // '';",
        ])
        .arg(socket)
        .arg(line)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A user in the access group launches: the task runs as them (uid, gid, groups),
/// in their directory, with their environment and not the agent's; the real-time
/// class is refused to them; their Ctrl-C, SIGTERM and SIGHUP reach the task; they
/// may not signal root's task, root may; someone outside the group is turned away.
#[test]
fn a_user_launches_as_themselves_within_their_limits() {
    let Some(fx) = Fixture::scheduler(
        "a_user_launches_as_themselves_within_their_limits",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let Some(user) = TestUser::create() else {
        skip(
            fx.name,
            "cannot create a user and a group (useradd, groupadd)",
        );
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let config = workload_config(dir, &format!("[access]\ngroup = \"{}\"\n", user.group));
    let agent = Agent::start_with(
        sim,
        AgentOptions {
            args: vec!["--config".into(), config.to_str().unwrap().into()],
            env: vec![("KELING_AGENT_SECRET", "agent-only")],
            ..AgentOptions::default()
        },
    );
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(user.uid), Some(user.gid)).unwrap();
    let launch_as_user = |priority: &str, script: &str| {
        let mut c = user.command(keling_bin());
        c.arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args([
                "--priority",
                priority,
                "--gpu",
                "0",
                "--",
                "sh",
                "-c",
                script,
            ])
            .current_dir(&work)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("KELING_MARK", "from-the-caller")
            .stderr(Stdio::piped());
        c
    };
    // Real-time is not theirs; nothing is left behind by the refusal.
    let cgroups_before = task_cgroups().len();
    let out = launch_as_user("1", "true").output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("priority 1 is not allowed"), "{said}");
    assert_eq!(task_cgroups().len(), cgroups_before);

    // A task as the user.
    let client = ChildGuard(
        launch_as_user("5", "echo \"$KELING_MARK\" > marker; exec sleep 60")
            .spawn()
            .unwrap(),
    );
    let mut pid = 0;
    wait_for("the user's task to run", Duration::from_secs(10), || {
        pid = agent
            .status_reply()
            .tasks
            .iter()
            .rev()
            .find(|t| t.uid == Some(user.uid))
            .map_or(0, |t| t.pid);
        pid != 0 && keling_tests::agent::comm(pid).as_deref() == Some("sleep")
    });
    assert_eq!(status_ids(pid, "Uid:"), vec![user.uid; 4]);
    assert_eq!(status_ids(pid, "Gid:"), vec![user.gid; 4]);
    assert_eq!(status_ids(pid, "Groups:"), vec![user.gid]);
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        work
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
    assert!(environ.contains(&&b"KELING_MARK=from-the-caller"[..]));
    assert!(environ.contains(&&b"CUDA_VISIBLE_DEVICES=0"[..]));
    assert!(
        !environ
            .iter()
            .any(|e| e.starts_with(b"KELING_AGENT_SECRET")),
        "the agent's environment leaked into the user's task"
    );
    let marker = work.join("marker");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "from-the-caller\n"
    );
    assert_eq!(std::fs::metadata(&marker).unwrap().uid(), user.uid);

    // They may not signal root's task; root may.
    let root_client = ChildGuard(
        Command::new(keling_bin())
            .arg("launch")
            .arg("--socket")
            .arg(&agent.socket)
            .args(["--priority", "9", "--gpu", "0", "--", "sleep", "60"])
            .spawn()
            .unwrap(),
    );
    let mut root_task = 0;
    wait_for("root's task", Duration::from_secs(10), || {
        root_task = agent
            .status_reply()
            .tasks
            .iter()
            .find(|t| t.uid == Some(0) && t.state != "ARCHIVED")
            .map_or(0, |t| t.id);
        root_task != 0
    });
    let signal = format!("{{\"signal\":{{\"task\":{root_task},\"signal\":15}}}}");
    let reply = perl_request(&mut user.command("perl"), &agent.socket, &signal);
    assert!(reply.contains("only its owner or root"), "{reply}");
    let reply = perl_request(&mut Command::new("perl"), &agent.socket, &signal);
    assert!(reply.contains("\"signalled\":1"), "{reply}");
    let mut root_client = root_client;
    assert_eq!(root_client.0.wait().unwrap().code(), Some(128 + 15));

    // Their Ctrl-C reaches their task (forwarded by their client).
    let mut client = client;
    // SAFETY: signalling our own child (setpriv exec'd keling launch) by pid.
    unsafe { libc::kill(client.0.id() as i32, libc::SIGINT) };
    assert_eq!(client.0.wait().unwrap().code(), Some(128 + 2));
    wait_for("the task to be gone", Duration::from_secs(5), || {
        proc_state(pid) == '?'
    });
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let mut client = ChildGuard(launch_as_user("6", "exec sleep 60").spawn().unwrap());
        wait_for("the task to run", Duration::from_secs(10), || {
            children_of_any_sleep(user.uid)
        });
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(client.0.id() as i32, sig) };
        assert_eq!(client.0.wait().unwrap().code(), Some(code), "signal {sig}");
    }

    // Outside the group: turned away.
    let mut nobody = Command::new("setpriv");
    nobody.args([
        "--reuid",
        "nobody",
        "--regid",
        "nogroup",
        "--clear-groups",
        "--",
        "perl",
    ]);
    let reply = perl_request(&mut nobody, &agent.socket, "{\"status\":true}");
    assert!(!reply.contains("\"status\""), "{reply}");
    // ... and told why and what to do, not that the agent is not running.
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ])
        .arg(keling_bin())
        .arg("status")
        .arg("--socket")
        .arg(&agent.socket)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "admits only root and the members of group {}",
            user.group
        )) && said.contains(&format!("usermod -aG {}", user.group))
            && !said.contains("is `keling run` running"),
        "{said}"
    );
}

/// Whether a `sleep` runs as `uid` (a task of the user's, started).
fn children_of_any_sleep(uid: u32) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                return false;
            };
            keling_tests::agent::comm(pid).as_deref() == Some("sleep")
                && status_ids(pid, "Uid:").first() == Some(&uid)
        })
}

/// cgroup v2 mounted (in the agent's mount namespace) at a path that is not UTF-8:
/// the agent finds it, creates, freezes and thaws task cgroups there, and its
/// status still serialises.
#[test]
fn a_cgroup_mount_point_that_is_not_utf8_works_end_to_end() {
    let Some(fx) = Fixture::needs("a_cgroup_mount_point_that_is_not_utf8_works_end_to_end")
        .cgroups()
        .check(has_unshare)
        .sim(&["--gpus", "1"])
        .ready()
    else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let mut bytes = dir.as_os_str().as_bytes().to_vec();
    bytes.extend_from_slice(b"/cg-\xff\xfe");
    let mount = PathBuf::from(OsString::from(OsStr::from_bytes(&bytes)));
    std::fs::create_dir(&mount).unwrap();
    let host_cgroup2 = cgroup2().unwrap();
    // A mount namespace of its own where the only cgroup2 is at `mount`.
    let wrapper: Vec<OsString> = vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        "m=$1; h=$2; shift 2; mount -t cgroup2 none \"$m\" && umount -l \"$h\" && exec \"$@\""
            .into(),
        "sh".into(),
        mount.clone().into(),
        host_cgroup2.into(),
    ];
    let agent = Agent::start_with(
        sim,
        AgentOptions {
            wrapper,
            ..AgentOptions::default()
        },
    );
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    // The host's view of the same cgroup.
    let cg_a = cgroup_of(pid_a).unwrap();
    assert!(
        cg_a.starts_with(cgroup2().unwrap().join("keling")),
        "{cg_a:?}"
    );
    let status = agent.status_reply();
    let shown = status.tasks[0].cgroup.as_deref().unwrap();
    assert!(shown.contains("cg-\u{fffd}"), "{shown}");
    let mut b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 300, 0, &pb);
    wait_for(
        "the background task to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_a),
    );
    assert!(b.0.wait().unwrap().success());
    wait_for(
        "the background task to be thawed",
        Duration::from_secs(5),
        || !frozen(&cg_a),
    );
    drop(agent);
    let _ = std::fs::remove_dir(&mount);
}

/// Whether unshare(1) is here; records a skip if not.
fn has_unshare(test: &str) -> bool {
    let found = Command::new("unshare").arg("--version").output().is_ok();
    if !found {
        skip(test, "no unshare(1)");
    }
    found
}

/// What earlier runs left is cleaned at start (an empty task cgroup removed, a
/// process on the stopped list continued, but not one whose start time says it is
/// another process with the listed pid); launches that fail leave no cgroup.
#[test]
fn leftovers_go_at_start_and_failed_launches_leave_no_cgroup() {
    let Some(fx) = Fixture::scheduler(
        "leftovers_go_at_start_and_failed_launches_leave_no_cgroup",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let root = cgroup2().unwrap().join("keling");
    let leftover = root.join("task-4000000-1");
    // The root too when it is not there (agents remove it, empty, at their stop).
    std::fs::create_dir_all(&leftover).unwrap();
    let stopped = |_: ()| {
        let child = ChildGuard(Command::new("sleep").arg("60").spawn().unwrap());
        let pid = child.0.id();
        // SAFETY: stopping our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        wait_for("a stopped process", Duration::from_secs(5), || {
            proc_state(pid) == 'T'
        });
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let start: u64 = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .nth(19)
            .unwrap()
            .parse()
            .unwrap();
        (child, pid, start)
    };
    let (s1, pid1, start1) = stopped(());
    let (s2, pid2, start2) = stopped(());
    std::fs::create_dir_all("/run/keling").unwrap();
    std::fs::write(
        "/run/keling/stopped",
        format!("{pid1} {start1}\n{pid2} {}\n", start2 + 7),
    )
    .unwrap();
    let agent = Agent::start(sim, &[]);
    assert!(!leftover.exists(), "the empty leftover cgroup was removed");
    wait_for(
        "the listed process to be continued",
        Duration::from_secs(2),
        || proc_state(pid1) != 'T',
    );
    assert_eq!(
        proc_state(pid2),
        'T',
        "a process that is not the one listed was continued"
    );
    assert!(
        agent
            .stderr()
            .iter()
            .any(|l| l.contains("an earlier keling run left"))
    );

    let before = task_cgroups().len();
    let out = Command::new(keling_bin())
        .arg("launch")
        .arg("--socket")
        .arg(&agent.socket)
        .args(["--", "/no/such/command"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("cannot execute /no/such/command"), "{said}");
    let reply = perl_request(
        &mut Command::new("perl"),
        &agent.socket,
        "{\"launch\":{\"argv\":[\"true\"],\"cwd\":\"/no/such/dir\",\"priority\":null,\"gpu\":null,\
         \"max_duration_ms\":null,\"grace_ms\":null,\"mem_quota_bytes\":null,\"hard_kill\":null,\
         \"expected_runtime_ms\":null}}",
    );
    assert!(
        reply.contains("cannot enter the working directory /no/such/dir"),
        "{reply}"
    );
    wait_for(
        "no cgroup left by failed launches",
        Duration::from_secs(5),
        || task_cgroups().len() == before,
    );
    drop((s1, s2));
}

/// A scheduling log that cannot be written (`/dev/full`): reported, survived, and
/// the scheduler works as before.
#[test]
fn log_write_errors_are_survived() {
    let Some(fx) = Fixture::scheduler("log_write_errors_are_survived", &["--gpus", "1"]) else {
        return;
    };
    let sim = fx.sim();
    let agent = Agent::start_with(
        sim,
        AgentOptions {
            sched_log: Some("/dev/full".into()),
            ..AgentOptions::default()
        },
    );
    let dir = &fx.dir;
    let (pa, pb) = (dir.join("a"), dir.join("b"));
    let _a = agent.launch(&["--priority", "10", "--gpu", "0"], sim, 1_000_000, 0, &pa);
    let pid_a = task_pid(&agent, &pa);
    let cg_a = cgroup_of(pid_a).unwrap();
    let mut b = agent.launch(&["--priority", "4", "--gpu", "0"], sim, 200, 0, &pb);
    wait_for(
        "the background task to be frozen",
        Duration::from_secs(10),
        || frozen(&cg_a),
    );
    assert!(b.0.wait().unwrap().success());
    wait_for(
        "the background task to be thawed",
        Duration::from_secs(5),
        || !frozen(&cg_a),
    );
    assert!(
        agent
            .stderr()
            .iter()
            .any(|l| l.contains("cannot write /dev/full")),
        "the write error was reported"
    );
}
