//! `keling trace` against the real kernel: real eBPF programs, real processes.
use keling_tests::{ChildGuard, Fixture, trace, workload_bin};
use serde_json::Value;

fn wl() -> String {
    workload_bin().to_string_lossy().into_owned()
}

#[test]
fn fork_exec_exit_tree_is_exact() {
    let Some(fx) = Fixture::new("fork_exec_exit_tree_is_exact") else {
        return;
    };
    let dir = &fx.dir;
    let report = dir.join("pids.json");
    let t = trace(&[], &[&wl(), "forktree", report.to_str().unwrap()]);
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let pids: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let (parent, exec_true, exit7, sleeper) = (
        pids["parent"].as_u64().unwrap(),
        pids["exec_true"].as_u64().unwrap(),
        pids["exit7"].as_u64().unwrap(),
        pids["sleeper"].as_u64().unwrap(),
    );

    // Every fork appears, from the right parent, as a new process.
    for child in [exec_true, exit7, sleeper] {
        let forks: Vec<_> = t
            .of_type("fork")
            .filter(|f| f["child_pid"] == child)
            .collect();
        assert_eq!(forks.len(), 1, "fork of {child}: {forks:?}");
        assert_eq!(forks[0]["pid"], parent);
        assert_eq!(forks[0]["thread"], false);
    }
    // The exec of /bin/true by the first child (and of the workload by the parent).
    let execs: Vec<_> = t
        .of_type("exec")
        .filter(|e| e["pid"] == exec_true)
        .collect();
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(execs[0]["filename"], "/bin/true");
    assert_eq!(execs[0]["comm"], "true");
    assert_eq!(t.of_type("exec").filter(|e| e["pid"] == parent).count(), 1);
    // Exactly one process exit each, with the right codes.
    for (pid, code) in [(parent, 0), (exec_true, 0), (exit7, 7), (sleeper, 0)] {
        let exits: Vec<_> = t.of_type("exit").filter(|e| e["pid"] == pid).collect();
        assert_eq!(exits.len(), 1, "exit of {pid}: {exits:?}");
        assert_eq!(exits[0]["exit_code"], code, "exit of {pid}");
    }
    // The summary agrees, with parents.
    for (pid, ppid, code) in [
        (exec_true, parent, 0),
        (exit7, parent, 7),
        (sleeper, parent, 0),
    ] {
        let p = t.process(pid);
        assert_eq!(p["ppid"], ppid);
        assert_eq!(p["exit_code"], code);
    }
    assert_eq!(t.process(exec_true)["comm"], "true");
    // The sleeper slept 20 times: at least 20 voluntary switches.
    let s = t.process(sleeper);
    assert!(
        s["voluntary_switches"].as_u64().unwrap() >= 20,
        "sleeper: {s}"
    );
    assert!(s["on_cpu_ns"].as_u64().unwrap() > 0, "sleeper: {s}");
    // Nothing lost at this rate.
    assert_eq!(t.summary()["drops"], 0);
    assert_eq!(t.summary()["decode_errors"], 0);
    let drops: Vec<_> = t.of_type("drops").collect();
    assert!(!drops.is_empty(), "a drops line is always written");
    assert!(drops.iter().all(|d| d["total"] == 0), "{drops:?}");
}

#[test]
fn exit_code_of_command_is_keling_exit_code() {
    let Some(_fx) = Fixture::new("exit_code_of_command_is_keling_exit_code") else {
        return;
    };
    let t = trace(&[], &["sh", "-c", "sleep 0.1; exit 3"]);
    assert_eq!(t.exit_code, 3, "keling: {}", t.stderr);
    let root = t.root();
    assert_eq!(root["exit_code"], 3);
    assert_eq!(root["comm"], "sh");

    let t = trace(&[], &["sh", "-c", "kill -9 $$"]);
    assert_eq!(t.exit_code, 128 + 9);
    let root = t.root();
    assert_eq!(root["signal"], 9);
}

#[test]
fn missing_command_is_a_clear_error() {
    let Some(_fx) = Fixture::new("missing_command_is_a_clear_error") else {
        return;
    };
    let out = std::process::Command::new(keling_tests::keling_bin())
        .args(["trace", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot execute /nonexistent/program"),
        "{stderr}"
    );
}

#[test]
fn untracked_busy_process_produces_no_switch_events() {
    let Some(_fx) = Fixture::new("untracked_busy_process_produces_no_switch_events") else {
        return;
    };
    // Both pinned to CPU 0, so the busy process and the traced one must take turns.
    // It spins longer than any trace start-up takes (it is killed at the end).
    let busy = ChildGuard(
        std::process::Command::new(wl())
            .args(["busy", "30000"])
            .env("KELING_WL_CPU", "0")
            .spawn()
            .unwrap(),
    );
    let busy_pid = busy.0.id() as u64;
    let t = trace(
        &[],
        &["env", "KELING_WL_CPU=0", &wl(), "sleeper", "30", "5"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let switches: Vec<_> = t.of_type("switch").collect();
    assert!(
        switches.len() >= 30,
        "the sleeper's own switches are traced"
    );
    for s in &switches {
        assert!(
            !s["prev_pid"].is_null() || !s["next_pid"].is_null(),
            "switch with no tracked side: {s}"
        );
        assert_ne!(s["prev_pid"], busy_pid, "{s}");
        assert_ne!(s["next_pid"], busy_pid, "{s}");
    }
    // The busy process really did share the CPU with the traced one (else this test
    // would prove nothing), and appears only as the untracked side of a switch.
    assert!(
        switches
            .iter()
            .any(|s| s["prev_tid"] == busy_pid || s["next_tid"] == busy_pid),
        "busy process never met the traced one on CPU 0"
    );
    drop(busy);
}

#[test]
fn threads_are_traced_from_their_creation() {
    let Some(fx) = Fixture::new("threads_are_traced_from_their_creation") else {
        return;
    };
    let dir = &fx.dir;
    let report = dir.join("threads.json");
    let t = trace(
        &[],
        &[&wl(), "threads", "4", "30", report.to_str().unwrap()],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let root = t.root();
    let threads = root["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 5, "main + 4 threads: {root}");
    assert_eq!(t.of_type("fork").filter(|f| f["thread"] == true).count(), 4);
    // Keling's on-CPU time per thread matches the kernel's own CPU clock, read by each
    // thread just before it ended (Keling also counts the few instructions after).
    let own: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for o in &own {
        let th = threads
            .iter()
            .find(|th| th["tid"] == o["tid"])
            .expect("thread in summary");
        let keling = th["on_cpu_ns"].as_u64().unwrap() as i64;
        let own_ns = o["cpu_ns"].as_u64().unwrap() as i64;
        let diff = keling - own_ns;
        assert!(
            (-200_000..=2_000_000).contains(&diff),
            "thread {}: keling says {keling} ns on CPU, the thread's own clock {own_ns} ns \
             (events the kernel could not deliver: {})",
            o["tid"],
            t.summary()["drops"]
        );
    }
}

#[test]
fn attach_to_running_process_by_pid() {
    let Some(fx) = Fixture::new("attach_to_running_process_by_pid") else {
        return;
    };
    // A shell that waits for a file, then forks a child that exits 5, then exits.
    let dir = &fx.dir;
    let go = dir.join("go");
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.02; done; sh -c 'exit 5'; exit 0",
        go = go.display()
    );
    let target = ChildGuard(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .unwrap(),
    );
    let pid = target.0.id();
    let out_path = dir.join("trace.jsonl");
    let mut keling = ChildGuard(
        std::process::Command::new(keling_tests::keling_bin())
            .args(["trace", "--format", "jsonl", "--output"])
            .arg(&out_path)
            .args(["--pid", &pid.to_string()])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Wait until keling has attached: its output file exists once probes are loaded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !out_path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "keling never attached"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::write(&go, b"").unwrap();
    let status = keling.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&out_path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let procs = summary["processes"].as_array().unwrap();
    let root = procs
        .iter()
        .find(|p| p["pid"] == pid)
        .expect("attached process");
    assert_eq!(root["exit_code"], 0);
    // The `sh -c 'exit 5'` it forked after we attached (besides its `sleep`s).
    let child = procs
        .iter()
        .find(|p| p["ppid"] == pid && p["exit_code"] == 5)
        .unwrap_or_else(|| panic!("no child with exit code 5: {procs:?}"));
    assert_eq!(child["comm"], "sh");
    drop(target);
}

/// A program this kernel cannot attach (simulated with KELING_SKIP_PROGRAMS) is
/// skipped with a message saying what is lost when the command can do without it,
/// and stops the command with a clear error when it cannot.
#[test]
fn missing_programs_degrade_or_refuse_by_what_was_asked() {
    let Some(_fx) = Fixture::new("missing_programs_degrade_or_refuse_by_what_was_asked") else {
        return;
    };
    // `keling trace -- true` with `program` not attached.
    let trace_without = |program: &str| {
        std::process::Command::new(keling_tests::keling_bin())
            .env("KELING_SKIP_PROGRAMS", program)
            .args([
                "trace",
                "--format",
                "jsonl",
                "--output",
                "/dev/null",
                "--",
                "true",
            ])
            .output()
            .unwrap()
    };
    // A trace can do without dup3 (an fd variant) ...
    let out = trace_without("sys_exit_dup3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("sys_exit_dup3 not attached") && stderr.contains("first ioctl"),
        "{stderr}"
    );
    // ... but not without context switches, which it is asked to report.
    let out = trace_without("sched_switch");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("sched_switch is required"), "{stderr}");
}

/// `keling floor` (the bench's floor): Keling's object with exactly two programs
/// loaded, both of the tracepoint type (with `--raw-syscalls`, both raw
/// tracepoints), held until Ctrl-C, which detaches them and exits 0.
#[test]
fn the_bench_floor_holds_two_empty_tracepoint_programs_until_interrupted() {
    let Some(_fx) =
        Fixture::new("the_bench_floor_holds_two_empty_tracepoint_programs_until_interrupted")
    else {
        return;
    };
    // BPF_PROG_TYPE_TRACEPOINT is 5, BPF_PROG_TYPE_RAW_TRACEPOINT 17.
    floor_holds(&[], "5");
    floor_holds(&["--raw-syscalls"], "17");
}

/// Runs `keling floor ARGS` and checks that it holds exactly two eBPF programs,
/// both of `prog_type`, until SIGINT.
fn floor_holds(args: &[&str], prog_type: &str) {
    use std::io::{BufRead, BufReader};
    let mut floor = ChildGuard(
        std::process::Command::new(keling_tests::keling_bin())
            .arg("floor")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut said = String::new();
    for line in BufReader::new(floor.0.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains(keling_common::lines::FLOOR_READY) {
            break;
        }
    }
    assert!(
        said.contains(keling_common::lines::FLOOR_READY),
        "{args:?}: {said}"
    );
    let pid = floor.0.id();
    // The eBPF programs it holds: one fd each, whose fdinfo names the type.
    let prog_types: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_type:"))
                .map(|t| t.trim().to_owned())
        })
        .collect();
    assert_eq!(prog_types, [prog_type, prog_type], "{args:?}: {said}");
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = floor.0.wait().unwrap();
    assert!(status.success(), "{args:?}: {status:?}");
}

/// SIGUSR1 asks for a snapshot from the moment the traced command runs: the
/// command signals Keling first thing and waits (bounded, 20 s) for the
/// snapshot line. Keling used to take the signal over only after letting the
/// command run, so a SIGUSR1 sent early ended Keling (the signal's default).
#[test]
fn a_snapshot_asked_for_as_soon_as_the_command_runs_is_written() {
    let Some(_fx) = Fixture::new("a_snapshot_asked_for_as_soon_as_the_command_runs_is_written")
    else {
        return;
    };
    let dir = keling_tests::tempdir();
    let out = dir.join("trace.jsonl");
    let script = format!(
        "kill -USR1 $PPID; i=0; \
         while ! grep -q gpu_snapshot '{0}' 2>/dev/null && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
         grep -q gpu_snapshot '{0}'",
        out.display()
    );
    let o = std::process::Command::new(keling_tests::keling_bin())
        .args(["trace", "--format", "jsonl", "--output"])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .output()
        .expect("run keling");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "keling {:?}: {stderr}", o.status);
    let text = std::fs::read_to_string(&out).expect("the trace's output");
    let snapshot = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "gpu_snapshot")
        .unwrap_or_else(|| panic!("no gpu_snapshot line; keling said: {stderr}"));
    assert_eq!(snapshot["seq"], 1, "{snapshot}");
    let _ = std::fs::remove_dir_all(&dir);
}
