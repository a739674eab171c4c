//! Issue 32: what a member of the access group, or an unprivileged user on the
//! host, could turn against the agent (root, real eBPF, the simulated driver):
//! file descriptors passed over the control socket until the agent's fd table is
//! full, a launch that fails at its cgroup leaving the cgroup behind, and paths
//! the agent writes (`--sched-log`, `--input-log`) or replaces (`--socket`) that
//! are links or someone else's files.
//!
//! Every assertion is from the outside: `/proc/PID/fd` (the kernel's count of
//! the agent's fds), the cgroup tree, the files themselves.
use std::{
    ffi::OsString,
    io::{BufRead, BufReader, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use keling_agent::control::send_with_fds;
use keling_tests::{
    Fixture, Nvsim,
    agent::{Agent, task_cgroups, wait_for},
    keling_bin, tempdir,
};

/// How many fds the agent has open now (the kernel's count).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `keling launch -- true` succeeds.
fn launch_true(agent: &Agent) {
    let out = Command::new(keling_bin())
        .arg("launch")
        .arg("--socket")
        .arg(&agent.socket)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keling launch -- true: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The task cgroups this agent made (`task-<agent pid>-<task>`).
fn cgroups_of(agent: &Agent) -> Vec<std::path::PathBuf> {
    let prefix = format!("task-{}-", agent.pid);
    task_cgroups()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}

/// Defect 4: a member of the group sends 1-byte messages each carrying 3 fds
/// (SCM_RIGHTS), over and over. Before the fix the agent kept every fd it
/// received until the request's deadline and its fd table filled in about a
/// second. Now the agent's open fds (the kernel's count, sampled throughout)
/// stay near where they were, the client is dropped with an error that says
/// why, and `status` and a launch work right after.
#[test]
fn fds_passed_over_the_socket_cannot_fill_the_agents_fd_table() {
    let Some(fx) = Fixture::scheduler(
        "fds_passed_over_the_socket_cannot_fill_the_agents_fd_table",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let agent = Agent::start(fx.sim(), &[]);
    let before = open_fds(agent.pid);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(before));
    let sampler = {
        let (stop, peak, pid) = (stop.clone(), peak.clone(), agent.pid);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(open_fds(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let null = std::fs::File::open("/dev/null").unwrap();
    let n = null.as_raw_fd();
    let (mut sent, mut dropped, mut said) = (0usize, 0usize, Vec::new());
    let started = Instant::now();
    // Connection after connection, each sending up to 3000 messages of 3 fds.
    while started.elapsed() < Duration::from_secs(2) {
        let s = UnixStream::connect(&agent.socket).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut gone = false;
        for _ in 0..3000 {
            match send_with_fds(s.as_raw_fd(), b"{", &[n, n, n]) {
                Ok(()) => sent += 1,
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            dropped += 1;
        }
        let mut line = String::new();
        let _ = BufReader::new(&s).read_line(&mut line);
        said.push(line);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "{sent} messages of 3 fds on {} connections ({dropped} dropped by the agent); \
         agent fds: {before} before, {peak} at the peak",
        said.len()
    );
    assert!(
        peak < before + 64,
        "the agent's open fds went from {before} to {peak}: the fds sent were kept"
    );
    assert!(
        said[0].contains("more than 3 file descriptors"),
        "the client was told why: {:?}",
        said[0]
    );
    assert!(dropped > 0, "no client was dropped");
    agent.status();
    launch_true(&agent);
    wait_for("the launch's cgroup to go", Duration::from_secs(5), || {
        cgroups_of(&agent).is_empty()
    });
}

/// The agent's soft RLIMIT_NOFILE, from `/proc/PID/limits`.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Sets the agent's soft limit on open files (as root; the hard one is kept).
fn prlimit(pid: u32, soft: u64) {
    let ok = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--nofile={soft}:"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "prlimit");
}

/// Defect 4, second half: a launch that fails at its cgroup step (here: the
/// agent out of fds when it opens the new cgroup's `cgroup.freeze`, as the
/// attack above caused) leaves no cgroup behind. The agent is brought to EMFILE
/// for real: its soft limit is set so that exactly one fd slot is free, which
/// the accepted connection takes. Before the fix the empty task cgroup stayed
/// until the next agent start.
#[test]
fn a_launch_failing_at_its_cgroup_leaves_no_cgroup() {
    let Some(fx) = Fixture::scheduler(
        "a_launch_failing_at_its_cgroup_leaves_no_cgroup",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let agent = Agent::start(fx.sim(), &[]);
    let soft = soft_nofile(agent.pid);
    let line = "{\"launch\":{\"argv\":[\"true\"],\"cwd\":\"/\",\"priority\":null,\"gpu\":null,\
         \"max_duration_ms\":null,\"grace_ms\":null,\"mem_quota_bytes\":null,\"hard_kill\":null,\
         \"expected_runtime_ms\":null}}\n";
    // Something else the agent opens at that moment (it reads /proc when
    // processes exec) may take the slot first: then try again.
    let mut failed_at_cgroup = None;
    for attempt in 0..10 {
        let mut used: Vec<u64> = std::fs::read_dir(format!("/proc/{}/fd", agent.pid))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        used.sort_unstable();
        // The lowest free fd number: with the limit just above it, it is the
        // only slot left.
        let hole = (0..).find(|i| used.binary_search(i).is_err()).unwrap();
        prlimit(agent.pid, hole + 1);
        let mut s = UnixStream::connect(&agent.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(line.as_bytes()).unwrap();
        let mut reply = String::new();
        let _ = BufReader::new(&s).read_line(&mut reply);
        prlimit(agent.pid, soft);
        eprintln!("attempt {attempt}: {}", reply.trim());
        if reply.contains("cgroup.freeze") && reply.contains("Too many open files") {
            failed_at_cgroup = Some(reply);
            break;
        }
    }
    let reply = failed_at_cgroup.expect("no launch failed at its cgroup in 10 attempts");
    assert!(reply.contains("\"start_failed\""), "{reply}");
    assert_eq!(
        cgroups_of(&agent),
        Vec::<std::path::PathBuf>::new(),
        "the failed launch left its cgroup"
    );
    agent.status();
    launch_true(&agent);
    wait_for("the launch's cgroup to go", Duration::from_secs(5), || {
        cgroups_of(&agent).is_empty()
    });
}

/// Runs `keling run` with `args` (after the simulator's) and expects it to
/// refuse to start: returns what it said. An agent that gets ready is stopped and
/// the test fails. Waits while another agent holds the one-agent lock.
fn run_refused(sim: &Nvsim, args: &[OsString]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut child = Command::new(keling_bin())
            .args(["run", "--dev-dir", sim.dev_dir()])
            .args(sim.capacity_args())
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = String::new();
        let mut ready = false;
        for line in BufReader::new(child.stderr.take().unwrap()).lines() {
            let line = line.unwrap();
            eprintln!("agent: {line}");
            said.push_str(&line);
            said.push('\n');
            if line.contains(keling_common::lines::AGENT_READY) {
                ready = true;
                // SAFETY: signalling our own child by pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            }
        }
        let status = child.wait().unwrap();
        keling_tests::agent::cleanup_cgroups();
        assert!(!ready, "the agent started:\n{said}");
        if said.contains("another keling agent") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        assert!(!status.success(), "{said}");
        return said;
    }
}

/// Defect 6: `--sched-log` and `--input-log` at a symbolic link (an
/// unprivileged user's, in /tmp, to a file only root may write) were followed
/// and the target truncated. Now the agent refuses to start, says why, and the
/// target is untouched.
#[test]
fn a_log_path_that_is_a_symlink_is_refused_and_its_target_untouched() {
    let Some(fx) = Fixture::scheduler(
        "a_log_path_that_is_a_symlink_is_refused_and_its_target_untouched",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let dir = tempdir();
    let target = dir.join("precious");
    std::fs::write(&target, "root's file\n").unwrap();
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for flag in ["--sched-log", "--input-log"] {
        let other = if flag == "--sched-log" {
            "--input-log"
        } else {
            "--sched-log"
        };
        let said = run_refused(
            fx.sim(),
            &[
                "--socket".into(),
                dir.join("keling.sock").into(),
                flag.into(),
                link.clone().into(),
                other.into(),
                dir.join("other.jsonl").into(),
            ],
        );
        assert!(said.contains("is a symbolic link"), "{flag}: {said}");
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "root's file\n",
            "{flag}: the link's target was written"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Defect 6: `--socket` naming an existing regular file deleted it without a
/// word. Now the agent refuses to start, says why, and the file is still there.
#[test]
fn a_socket_path_that_is_not_a_socket_is_refused_not_deleted() {
    let Some(fx) = Fixture::scheduler(
        "a_socket_path_that_is_not_a_socket_is_refused_not_deleted",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let dir = tempdir();
    let file = dir.join("important");
    std::fs::write(&file, "keep\n").unwrap();
    let said = run_refused(
        fx.sim(),
        &[
            "--socket".into(),
            file.clone().into(),
            "--sched-log".into(),
            dir.join("sched.jsonl").into(),
        ],
    );
    assert!(said.contains("not a socket"), "{said}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every line the agent sends on one connection for `request`, until it closes.
fn all_replies(socket: &std::path::Path, request: &str) -> Vec<String> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    BufReader::new(s).lines().map_while(Result::ok).collect()
}

/// A launch request for `argv` in `cwd`, with `priority` and `env` as JSON.
fn launch_line(argv: &str, cwd: &str, priority: &str, env: &str) -> String {
    format!(
        "{{\"launch\":{{\"argv\":{argv},\"cwd\":\"{cwd}\",\"priority\":{priority},\"gpu\":null,\
         \"max_duration_ms\":null,\"grace_ms\":null,\"mem_quota_bytes\":null,\"hard_kill\":null,\
         \"expected_runtime_ms\":null,\"env\":{env}}}}}"
    )
}

/// The smaller ones of defect 6, over the socket itself: a priority of 16 or
/// 255 is refused with the range (it was clamped to 15), an environment entry
/// without `=` or with a NUL is refused by name (it was dropped), and a launch
/// that fails to start is told only its error (`placed` came first). Each
/// refusal starts nothing: no cgroup is made.
#[test]
fn out_of_range_priorities_bad_env_entries_and_failed_starts_are_told_plainly() {
    let Some(fx) = Fixture::scheduler(
        "out_of_range_priorities_bad_env_entries_and_failed_starts_are_told_plainly",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let agent = Agent::start(fx.sim(), &[]);
    for p in ["16", "255"] {
        let said = all_replies(
            &agent.socket,
            &launch_line("[\"true\"]", "/", p, "[\"PATH=/usr/bin:/bin\"]"),
        );
        assert_eq!(said.len(), 1, "priority {p}: {said:?}");
        assert!(
            said[0].contains("\"invalid\"")
                && said[0].contains(&format!("priority {p} is out of range"))
                && said[0].contains("0 (highest) to 15"),
            "priority {p}: {said:?}"
        );
    }
    for (entry, why) in [
        ("NO_EQUALS", "has no `=`"),
        ("A=b\\u0000c", "contains a NUL byte"),
    ] {
        let said = all_replies(
            &agent.socket,
            &launch_line(
                "[\"true\"]",
                "/",
                "null",
                &format!("[\"PATH=/usr/bin:/bin\",\"{entry}\"]"),
            ),
        );
        assert_eq!(said.len(), 1, "{entry}: {said:?}");
        assert!(
            said[0].contains("\"invalid\"") && said[0].contains(why),
            "{entry}: {said:?}"
        );
    }
    let said = all_replies(
        &agent.socket,
        &launch_line("[\"true\"]", "/no/such/dir", "null", "null"),
    );
    assert_eq!(said.len(), 1, "only the error: {said:?}");
    assert!(
        said[0].contains("\"start_failed\"")
            && said[0].contains("cannot enter the working directory /no/such/dir"),
        "{said:?}"
    );
    wait_for("no cgroup left", Duration::from_secs(5), || {
        cgroups_of(&agent).is_empty()
    });
}

/// What a launched task inherits comes from the process that asked, never from
/// the agent (root, with its limits raised: open files to the hard limit, locked
/// memory unlimited; under systemd an OOM score of -900): a task started by a
/// shell with 200 open files, 64 KiB of locked memory, an OOM score of 77 and
/// umask 027 has exactly those, as the kernel shows them in `/proc`; and a raw
/// request that passes no stdio gets /dev/null for all three, not the agent's
/// own stdin, stdout and stderr (a member of the access group got root's
/// terminal that way).
#[test]
fn a_launched_task_inherits_the_callers_limits_and_never_the_agents_stdio() {
    let Some(fx) = Fixture::scheduler(
        "a_launched_task_inherits_the_callers_limits_and_never_the_agents_stdio",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let agent = Agent::start(fx.sim(), &[]);
    let dir = tempdir();
    let report = dir.join("attributes");
    let task = format!(
        "grep -E '^Max (open files|locked memory)' /proc/$$/limits > {r}; \
         cat /proc/$$/oom_score_adj >> {r}; grep Umask /proc/$$/status >> {r}",
        r = report.display()
    );
    let caller = format!(
        "ulimit -n 200 && ulimit -l 64 && umask 027 && echo 77 > /proc/self/oom_score_adj && \
         exec {keling} launch --socket {socket} -- sh -c \"$TASK\"",
        keling = keling_bin().display(),
        socket = agent.socket.display()
    );
    let out = Command::new("sh")
        .args(["-c", &caller])
        .env("TASK", &task)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = std::fs::read_to_string(&report).unwrap();
    let fields = |line: &str| -> Vec<String> {
        seen.lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line:?} in {seen}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        fields("Max open files")[3..5],
        ["200", "200"],
        "the caller's, not the agent's (soft {}): {seen}",
        soft_nofile(agent.pid)
    );
    assert_eq!(
        fields("Max locked memory")[3..5],
        ["65536", "65536"],
        "{seen}"
    );
    assert!(seen.lines().any(|l| l == "77"), "OOM score: {seen}");
    assert_eq!(fields("Umask:")[1], "0027", "{seen}");

    let fds = dir.join("fds");
    let said = all_replies(
        &agent.socket,
        &launch_line(
            &format!(
                // Read in command substitutions: the shell's own fds (the
                // task's) stay as they are while they run.
                "[\"sh\",\"-c\",\"a=$(readlink /proc/$$/fd/0); b=$(readlink /proc/$$/fd/1); \
                 c=$(readlink /proc/$$/fd/2); echo $a $b $c > {}\"]",
                fds.display()
            ),
            "/",
            "null",
            "[\"PATH=/usr/bin:/bin\"]",
        ),
    );
    assert!(
        said.iter().any(|l| l.contains("\"exit_code\":0")),
        "{said:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&fds).unwrap(),
        "/dev/null /dev/null /dev/null\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
