//! `keling run` for the scheduler's tests, and how they look at its tasks from the
//! outside: cgroup files and `/proc`, not Keling's own view.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use keling_agent::{control::StatusReply, log_format::SchedLine};
use serde_json::Value;

use crate::{ChildGuard, Nvsim, gpu_workload_bin, keling_bin, tempdir};

/// The cgroup v2 mount point.
pub fn cgroup2() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split(' ').next()? == "cgroup2")
            .then(|| PathBuf::from(left.split(' ').nth(4).unwrap()))
    })
}

/// The task cgroups under `<cgroup2>/keling`.
pub fn task_cgroups() -> Vec<PathBuf> {
    task_cgroups_in("keling")
}

/// The cgroup root of an agent instance: `keling` (the default one) or
/// `keling-NAME` (`--instance NAME`).
pub fn instance_root(instance: Option<&str>) -> String {
    match instance {
        None => "keling".into(),
        Some(n) => format!("keling-{n}"),
    }
}

/// The task cgroups under `<cgroup2>/ROOT`.
pub fn task_cgroups_in(root: &str) -> Vec<PathBuf> {
    let Some(root) = cgroup2().map(|c| c.join(root)) else {
        return Vec::new();
    };
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// Thaws, kills and removes every task cgroup under `<cgroup2>/keling`, then the
/// root itself if that left it empty (an agent killed with SIGKILL cannot remove
/// it; an agent still running makes it again for its next task).
pub fn cleanup_cgroups() {
    cleanup_cgroups_in("keling");
}

/// [`cleanup_cgroups`] for the cgroup root `<cgroup2>/ROOT` ([`instance_root`]).
pub fn cleanup_cgroups_in(root: &str) {
    for dir in task_cgroups_in(root) {
        let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if let Some(cg) = cgroup2() {
        let _ = std::fs::remove_dir(cg.join(root));
    }
}

/// `keling run` for one test: stopped by pid on drop; whatever it left frozen is
/// thawed and killed, and its cgroups removed. Its standard error is kept.
pub struct Agent {
    child: Option<Child>,
    dir: PathBuf,
    pub pid: u32,
    pub socket: PathBuf,
    pub sched_log: PathBuf,
    stderr: Arc<Mutex<Vec<String>>>,
    /// Says (by closing) that standard error reached its end: every line the
    /// agent wrote is in `stderr`.
    stderr_done: std::sync::mpsc::Receiver<()>,
    /// `--instance NAME` among its arguments, if any.
    pub instance: Option<String>,
}

/// How to start an agent.
#[derive(Default)]
pub struct AgentOptions<'a> {
    /// Arguments after `run`'s own.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(&'a str, &'a str)>,
    /// Run it through this program and arguments (e.g. `unshare ... --`); the
    /// agent's command line follows them.
    pub wrapper: Vec<std::ffi::OsString>,
    /// `--sched-log` (default: a file in the agent's directory).
    pub sched_log: Option<PathBuf>,
    /// `--status-interval` in seconds (default 1; 0: only the final status line).
    pub status_interval_s: Option<u64>,
    /// Run with the agent's own defaults for how GPUs are shared and tasks
    /// bound. Otherwise (false, the default) the tests written before memory
    /// sharing became the default get the model they were written for:
    /// [`SLOT_MODEL`], each flag unless `args` sets it.
    pub agent_defaults: bool,
    /// `--socket` (default: one in the agent's own directory). A restart test
    /// gives the next agent the socket of the one before.
    pub socket: Option<PathBuf>,
}

/// What `keling run` did by default before memory sharing and late binding
/// (issue 34): one task per GPU, placed at arrival.
pub const SLOT_MODEL: [(&str, &str); 3] = [
    ("--sharing", "slots"),
    ("--slots", "1"),
    ("--binding", "at-arrival"),
];

impl AgentOptions<'_> {
    /// Just these arguments after `run`'s own.
    pub fn args(extra: &[&str]) -> Self {
        AgentOptions {
            args: extra.iter().map(|s| s.to_string()).collect(),
            ..AgentOptions::default()
        }
    }
}

impl Agent {
    /// Starts `keling run` on the simulated driver.
    pub fn start(sim: &Nvsim, extra: &[&str]) -> Agent {
        Self::start_with(sim, AgentOptions::args(extra))
    }

    /// Starts `keling run` with options. Waits (up to a minute) while another
    /// agent holds the one-agent lock (someone else's test on a shared machine).
    pub fn start_with(sim: &Nvsim, opts: AgentOptions) -> Agent {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match Self::try_start(sim, &opts) {
                Ok(agent) => return agent,
                Err(why) if why.contains("another keling agent") && Instant::now() < deadline => {
                    eprintln!("waiting for another agent to stop: {why}");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(why) => panic!("keling run exited before it was ready:\n{why}"),
            }
        }
    }

    fn try_start(sim: &Nvsim, opts: &AgentOptions) -> Result<Agent, String> {
        let dir = tempdir();
        let socket = opts
            .socket
            .clone()
            .unwrap_or_else(|| dir.join("keling.sock"));
        let sched_log = opts
            .sched_log
            .clone()
            .unwrap_or_else(|| dir.join("sched.jsonl"));
        let mut cmd = match opts.wrapper.split_first() {
            Some((prog, rest)) => {
                let mut c = Command::new(prog);
                c.args(rest).arg(keling_bin());
                c
            }
            None => Command::new(keling_bin()),
        };
        let status_interval_s = opts.status_interval_s.unwrap_or(1).to_string();
        cmd.args(["run", "--status-interval", &status_interval_s])
            .args(["--dev-dir", sim.dev_dir(), "--socket"])
            .arg(&socket)
            .arg("--sched-log")
            .arg(&sched_log)
            .arg("--input-log")
            .arg(dir.join("inputs.jsonl"))
            .args(sim.capacity_args());
        if !opts.agent_defaults {
            for (flag, value) in SLOT_MODEL {
                let given = opts
                    .args
                    .iter()
                    .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
                if !given {
                    cmd.args([flag, value]);
                }
            }
        }
        cmd.args(&opts.args)
            .envs(opts.env.iter().copied())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut said = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            eprintln!("agent: {line}");
            said.push_str(&line);
            said.push('\n');
            stderr.lock().unwrap().push(line.clone());
            if line.contains(keling_common::lines::AGENT_READY) {
                let keep = stderr.clone();
                let (ended, stderr_done) = std::sync::mpsc::channel::<()>();
                std::thread::spawn(move || {
                    for l in lines.map_while(Result::ok) {
                        eprintln!("agent: {l}");
                        keep.lock().unwrap().push(l);
                    }
                    drop(ended);
                });
                let instance = opts
                    .args
                    .iter()
                    .position(|a| a == "--instance")
                    .and_then(|i| opts.args.get(i + 1).cloned());
                return Ok(Agent {
                    child: Some(child),
                    dir,
                    pid,
                    socket,
                    sched_log,
                    stderr,
                    stderr_done,
                    instance,
                });
            }
        }
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        Err(said)
    }

    /// The input log every agent here writes (`--input-log`).
    pub fn input_log(&self) -> PathBuf {
        self.dir.join("inputs.jsonl")
    }

    /// What the agent has said on standard error so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// `keling launch ... -- keling-gpu-workload --scenario busy ...` in the background.
    pub fn launch(
        &self,
        opts: &[&str],
        sim: &Nvsim,
        iterations: u64,
        alloc_mib: u64,
        progress: &Path,
    ) -> ChildGuard {
        let (iterations, alloc_mib) = (iterations.to_string(), alloc_mib.to_string());
        self.launch_busy(
            opts,
            sim,
            &["--iterations", &iterations, "--alloc-mib", &alloc_mib],
            progress,
        )
    }

    /// `keling launch OPTS -- keling-gpu-workload busy WORKLOAD_ARGS`, its
    /// progress written to `progress`.
    pub fn launch_busy(
        &self,
        opts: &[&str],
        sim: &Nvsim,
        workload_args: &[&str],
        progress: &Path,
    ) -> ChildGuard {
        ChildGuard(
            Command::new(keling_bin())
                .arg("launch")
                .arg("--socket")
                .arg(&self.socket)
                .args(opts)
                .arg("--")
                .arg(gpu_workload_bin())
                .args(["--dev-dir", sim.dev_dir(), "--scenario", "busy"])
                .args(workload_args)
                .arg("--progress")
                .arg(progress)
                .spawn()
                .unwrap(),
        )
    }

    /// `keling status --json` (it must succeed), as JSON; most tests read the
    /// typed [`Agent::status_reply`].
    pub fn status(&self) -> Value {
        let out = Command::new(keling_bin())
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "keling status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `keling status --json`, typed: the agent's own [`StatusReply`] (a field
    /// renamed or retyped there fails to compile here, not at run time). The
    /// raw [`Agent::status`] is for tests of the JSON's shape itself.
    pub fn status_reply(&self) -> StatusReply {
        let raw = self.status();
        serde_json::from_value(raw.clone())
            .unwrap_or_else(|e| panic!("keling status --json is not a StatusReply ({e}): {raw}"))
    }

    /// The scheduling log's lines, typed as the agent writes them (lines that
    /// do not parse are left out).
    pub fn sched_lines(&self) -> Vec<SchedLine> {
        std::fs::read_to_string(&self.sched_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The scheduling log's lines as raw JSON (for tests of their shape).
    pub fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.sched_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Sends `signal` to the agent (by pid: our own child).
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.pid as i32, signal) };
    }

    /// Whether the agent process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Stops the agent with SIGINT, as an operator would, and waits (bounded) for
    /// it to exit and for what it said last to be read (`stderr` holds every
    /// line after this); its directory and logs stay until drop. Returns how it
    /// exited.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(libc::SIGINT);
        wait_for("the agent to stop", Duration::from_secs(15), || {
            !self.alive()
        });
        let child = self.child.as_mut().expect("stop() after sigkill()");
        // Reaped already by alive(): this returns the status it kept.
        let status = child.wait().expect("the agent's exit status");
        // The pipe ends when the last process holding it exits (the agent, and a
        // fail-safe that outlives it by moments): bounded, as a child that kept
        // it open would otherwise hang the test.
        let _ = self.stderr_done.recv_timeout(Duration::from_secs(10));
        status
    }

    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The agent's fail-safe (its child named `keling-guard`).
    pub fn fail_safe_pid(&self) -> Option<u32> {
        children_of(self.pid)
            .into_iter()
            .find(|&p| comm(p).as_deref() == Some("keling-guard"))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // An agent that has exited (and been reaped by stop()) is not signalled: its
        // pid may be someone else's by now.
        if let Some(mut child) = self.child.take()
            && child.try_wait().ok().flatten().is_none()
        {
            // A stopped agent cannot handle SIGINT.
            // SAFETY: signalling our own child by pid.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGCONT);
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        cleanup_cgroups_in(&instance_root(self.instance.as_deref()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The children of `pid` (from every process's `/proc/PID/stat`).
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat_field(p, 1).and_then(|s| s.parse().ok()) == Some(pid))
        .collect()
}

/// Field `n` after the comm of `/proc/PID/stat` (0: the state, 1: the ppid, ...).
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(n)
        .map(str::to_owned)
}

/// `/proc/PID/comm`.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
}

/// /proc's view of a process's state (`R`, `S`, `T`, ...; `?` when gone).
pub fn proc_state(pid: u32) -> char {
    stat_field(pid, 0)
        .and_then(|s| s.chars().next())
        .unwrap_or('?')
}

/// Threads of `pid` in a real-time class (SCHED_FIFO or SCHED_RR: `stat`'s
/// field 41, `policy`).
pub fn realtime_threads(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        // /proc/TID/stat is the thread's own.
        .filter(|&tid| matches!(stat_field(tid, 38).as_deref(), Some("1" | "2")))
        .collect()
}

/// Whether a cgroup says `frozen 1`.
pub fn frozen(cg: &Path) -> bool {
    std::fs::read_to_string(cg.join("cgroup.events"))
        .unwrap_or_default()
        .lines()
        .any(|l| l == "frozen 1")
}

/// The host path of the cgroup `pid` is in (from `/proc/PID/cgroup`).
pub fn cgroup_of(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2()?.join(rel.trim_start_matches('/')))
}

/// The number a `--progress` file holds.
pub fn progress(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (bounded) for `cond`; panics with `what` if it never holds.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The cgroup Keling says the task `pid` is in (its status entry's `cgroup`).
pub fn task_cgroup(status: &StatusReply, pid: u32) -> PathBuf {
    let t = status
        .tasks
        .iter()
        .find(|t| t.pid == pid)
        .expect("task in status");
    PathBuf::from(t.cgroup.as_deref().expect("cgroup path"))
}

/// The pid of the task whose workload writes `progress_file` (the newest task),
/// once it has made progress.
pub fn task_pid(agent: &Agent, progress_file: &Path) -> u32 {
    let mut pid = 0;
    wait_for("the task to start", Duration::from_secs(20), || {
        if let Some(t) = agent.status_reply().tasks.last() {
            pid = t.pid;
        }
        progress(progress_file) > 0
    });
    pid
}

/// `keling replay` of the agent's input log (stopped first) against its
/// scheduling log matches every one of at least `min_recorded` decisions.
pub fn assert_replays_exactly(agent: &Agent, min_recorded: u64) {
    let out = Command::new(keling_bin())
        .arg("replay")
        .arg(agent.input_log())
        .arg("--sched-log")
        .arg(&agent.sched_log)
        .arg("--json")
        .output()
        .unwrap();
    let replay: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{replay}");
    let c = &replay["comparison"];
    assert!(c["recorded"].as_u64().unwrap() >= min_recorded, "{replay}");
    assert_eq!(c["matched"], c["recorded"], "{replay}");
    assert_eq!(c["match_rate"], 1.0, "{replay}");
}
