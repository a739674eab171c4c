//! `cargo xtask soak --minutes N`: the agent driven at random for a long time
//! against the simulated driver, checked against the driver's truth.
//!
//! A seeded RNG launches tasks (`keling launch` of `keling-gpu-workload`, scenario
//! `churn`: random allocations and frees as it runs, or `busy`: one allocation held),
//! at random priorities, pinned or not; they exit on their own or are killed
//! (SIGKILL, by the pid `keling status` gives). Every `--checkpoint-s` the launches
//! stop and the workloads stop allocating (a pause file), and the soak checks, until
//! they hold or `SETTLE_LIMIT` passes:
//! * every process `/metrics` shows has the simulator's figures (video and host
//!   bytes, peak, allocations, frees on each GPU), every process holding memory in
//!   the simulator is shown, and each GPU's video and host bytes are the simulator's;
//! * each live task's `mem_bytes_per_gpu` (`keling status --json`) is the
//!   simulator's video bytes for its pid;
//! * no task cgroup is frozen (`cgroup.events`, the kernel's word) unless its task
//!   is PREEMPTED.
//!
//! Then it records the agent's RSS (VmRSS), its open fds and the entries of its
//! kernel hash maps (counted with the bpf syscall: the maps are found through the
//! agent's fds, opened by id and walked with BPF_MAP_GET_NEXT_KEY; array maps have a
//! fixed count and are left out). At the end: a table over time and the growth per
//! hour of each (least squares over the checkpoints); non-zero exit on any mismatch
//! or leftover frozen task. Everything it started is ended by pid on the way out,
//! Ctrl-C included (the guards' Drop).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use keling_bpfmaps::map_entries;
use serde_json::Value;

use crate::demo::{Simulator, cgroup2_mount, end_demo_tasks};

/// The heading of the soak's section of BENCHMARKS.md, which `cargo xtask bench`
/// keeps when it rewrites the file.
pub const BENCHMARKS_HEADING: &str = "## Soak";

/// The simulated machine: small GPUs, so that memory runs short now and then.
const GPUS: u32 = 2;
const MEM_PER_GPU: u64 = 1 << 30;
/// Tasks alive at once, at most.
const MAX_TASKS: usize = 6;
/// How long a checkpoint may take to see the figures agree.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// splitmix64, as the workload's.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// The soak's directory, removed on drop (after the guards declared after it).
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `keling run`: SIGINT then SIGKILL by pid on drop; its task cgroups are then
/// thawed, killed and removed.
struct Agent {
    child: Child,
    pid: u32,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: signalling our own child by pid.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGCONT);
                libc::kill(self.pid as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        end_demo_tasks(self.pid);
    }
}

/// The `keling launch` clients: SIGTERM by pid and reaped on drop.
#[derive(Default)]
struct Launchers(Vec<Child>);

impl Launchers {
    /// Reaps those that exited; returns their exit codes (None: a signal).
    fn reap(&mut self) -> Vec<Option<i32>> {
        let mut codes = Vec::new();
        self.0.retain_mut(|c| match c.try_wait() {
            Ok(Some(st)) => {
                codes.push(st.code());
                false
            }
            _ => true,
        });
        codes
    }
}

impl Drop for Launchers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// One checkpoint's record.
struct Sample {
    at_s: f64,
    rss_kib: u64,
    fds: u64,
    map_entries: u64,
    /// Entries per hash map, by name.
    maps: BTreeMap<String, u64>,
    tasks_live: usize,
    settle_ms: u128,
    /// The simulator's video bytes in use on all GPUs, MiB.
    sim_mib: u64,
    /// The simulator's live objects (clients and the objects under them).
    sim_objects: u64,
    /// (pid, GPU) pairs compared.
    compared: usize,
}

#[derive(Default)]
struct Counts {
    launched: u64,
    killed: u64,
    exits: BTreeMap<String, u64>,
}

/// `cargo xtask soak`'s options.
#[derive(clap::Args)]
pub struct Args {
    /// How long to run, minutes.
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// The RNG's seed (default: from the clock; printed, to repeat a run).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of random work between checkpoints.
    #[arg(long, default_value_t = 20)]
    checkpoint_s: u64,
    /// Soak the optimised release build (default: the debug build the tests use).
    #[arg(long)]
    release: bool,
    /// Use the binaries in DIR as they are (keling, keling-nvsim,
    /// keling-gpu-workload) instead of building them.
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
}

/// Runs the soak with the binaries `build(release)` makes (or `--bin-dir`'s).
pub fn soak(args: Args, build: fn(bool) -> anyhow::Result<PathBuf>) -> anyhow::Result<()> {
    let Args {
        minutes,
        seed,
        checkpoint_s,
        release,
        bin_dir,
    } = args;
    let bin_dir = match bin_dir {
        Some(d) => d,
        None => build(release)?,
    };
    let bin_dir = bin_dir.as_path();
    if !crate::is_root() {
        bail!(
            "the soak mounts a FUSE filesystem, loads eBPF and makes cgroups: run it as root \
             (sudo -E cargo xtask soak)"
        );
    }
    if minutes.is_nan() || minutes <= 0.0 {
        bail!("--minutes must be above 0 (got {minutes})");
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!(
        "soak: seed {seed} (repeat with --seed {seed}), {minutes} min, a checkpoint every \
         {checkpoint_s} s"
    );
    // SAFETY: installing a handler that only stores to an atomic. Not SIG_IGN: a
    // handler is reset by exec, so the children still stop on Ctrl-C.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let result = drive(bin_dir, minutes, seed, checkpoint_s);
    if let Err(e) = &result {
        eprintln!("soak: FAILED (seed {seed}): {e:#}");
    }
    result
}

fn drive(bin_dir: &Path, minutes: f64, seed: u64, checkpoint_s: u64) -> anyhow::Result<()> {
    let base = crate::root().join(format!("target/soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let dir = Dir(base.clone());
    let dev = base.join("dev");
    let socket = base.join("keling.sock");
    let pause = base.join("pause");
    let sim = Simulator::mount_with(&bin_dir.join("keling-nvsim"), &dev, GPUS, MEM_PER_GPU)?;
    let metrics_port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let agent = start_agent(bin_dir, &dev, &socket, &base, metrics_port)?;
    eprintln!(
        "soak: agent pid {}, simulator at {}, /metrics on 127.0.0.1:{metrics_port}",
        agent.pid,
        dev.display()
    );
    let launch_log = File::create(base.join("launches.log"))?;
    let mut launchers = Launchers::default();
    let mut rng = Rng(seed);
    let mut counts = Counts::default();
    let mut samples: Vec<Sample> = Vec::new();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(minutes * 60.0);
    let mut failure: Option<String> = None;
    let mut checkpoint = 0u64;
    loop {
        // A run phase: random launches and kills.
        let _ = std::fs::remove_file(&pause);
        let phase_end = (Instant::now() + Duration::from_secs(checkpoint_s)).min(end);
        while Instant::now() < phase_end && !INTERRUPTED.load(Ordering::Relaxed) {
            for code in launchers.reap() {
                let key = code.map_or("signal".to_string(), |c| format!("exit {c}"));
                *counts.exits.entry(key).or_default() += 1;
            }
            match rng.below(10) {
                0..=4 if launchers.0.len() < MAX_TASKS => {
                    let child = launch(bin_dir, &socket, &dev, &pause, &mut rng, &launch_log)?;
                    launchers.0.push(child);
                    counts.launched += 1;
                }
                5 => {
                    if let Some(pid) = random_task_pid(bin_dir, &socket, &mut rng) {
                        // SAFETY: a task of the agent this soak started.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                        counts.killed += 1;
                    }
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(200 + rng.below(1300)));
        }
        if INTERRUPTED.load(Ordering::Relaxed) {
            failure = Some("interrupted (Ctrl-C)".into());
            break;
        }
        // A checkpoint: nothing launched, nothing allocated or freed.
        checkpoint += 1;
        std::fs::write(&pause, "")?;
        let settle = Instant::now();
        let mut seen = Seen::default();
        let verdict = loop {
            let problems = check(
                bin_dir,
                &socket,
                &sim.dir,
                metrics_port,
                agent.pid,
                &mut seen,
            );
            if problems.is_empty() {
                break Ok(());
            }
            if settle.elapsed() > SETTLE_LIMIT || INTERRUPTED.load(Ordering::Relaxed) {
                break Err(problems);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let maps = map_entries(agent.pid);
        let sample = Sample {
            at_s: start.elapsed().as_secs_f64(),
            rss_kib: rss_kib(agent.pid),
            fds: fd_count(agent.pid),
            map_entries: maps.values().sum(),
            maps,
            tasks_live: launchers.0.len(),
            settle_ms: settle.elapsed().as_millis(),
            sim_mib: seen.sim_bytes >> 20,
            sim_objects: seen.sim_objects,
            compared: seen.compared,
        };
        eprintln!(
            "soak: checkpoint {checkpoint} at {:.0} s: {} ({} tasks, {} (pid, GPU) compared, {} \
             MiB and {} objects in the simulator; rss {} KiB, {} fds, {} map entries, settled in \
             {} ms)",
            sample.at_s,
            if verdict.is_ok() { "ok" } else { "MISMATCH" },
            sample.tasks_live,
            sample.compared,
            sample.sim_mib,
            sample.sim_objects,
            sample.rss_kib,
            sample.fds,
            sample.map_entries,
            sample.settle_ms
        );
        samples.push(sample);
        if let Err(problems) = verdict {
            failure = Some(format!(
                "checkpoint {checkpoint} at {:.0} s: after {} s the agent still differs from the \
                 simulator:\n  {}",
                start.elapsed().as_secs_f64(),
                SETTLE_LIMIT.as_secs(),
                problems.join("\n  ")
            ));
            break;
        }
        if Instant::now() >= end {
            break;
        }
    }
    for code in launchers.reap() {
        let key = code.map_or("signal".to_string(), |c| format!("exit {c}"));
        *counts.exits.entry(key).or_default() += 1;
    }
    report(&samples, &counts, seed, minutes, checkpoint_s);
    // Keep the logs of a failed run for a look (the agent's, the launches').
    if failure.is_some() {
        let kept = crate::root().join("target/soak-failed");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = std::fs::create_dir_all(&kept);
        for f in ["agent.log", "launches.log", "sched.jsonl"] {
            let _ = std::fs::copy(base.join(f), kept.join(f));
        }
        let _ = std::fs::copy(
            sim.dir.join("nvsim-state.json"),
            kept.join("nvsim-state.json"),
        );
        eprintln!("soak: logs kept in {}", kept.display());
    }
    let cleanup = Instant::now();
    let agent_pid = agent.pid;
    drop(launchers);
    drop(agent);
    drop(sim);
    drop(dir);
    eprintln!(
        "soak: cleaned up (launchers, agent, task cgroups, simulator) in {:.1} s",
        cleanup.elapsed().as_secs_f64()
    );
    // Nothing of the agent's may be left behind, frozen or not.
    let left = task_cgroups(agent_pid);
    if !left.is_empty() && failure.is_none() {
        failure = Some(format!(
            "task cgroups left after the agent stopped (name, frozen): {:?}",
            left.iter().map(|(_, n, f)| (n, f)).collect::<Vec<_>>()
        ));
    }
    match failure {
        Some(f) => bail!("{f}"),
        None => {
            eprintln!("soak: passed {checkpoint} checkpoints (seed {seed})");
            Ok(())
        }
    }
}

fn start_agent(
    bin_dir: &Path,
    dev: &Path,
    socket: &Path,
    base: &Path,
    metrics_port: u16,
) -> anyhow::Result<Agent> {
    let mut c = Command::new(bin_dir.join("keling"));
    c.args(["run", "--status-interval", "30", "--dev-dir"])
        .arg(dev)
        .arg("--socket")
        .arg(socket)
        .arg("--sched-log")
        .arg(base.join("sched.jsonl"))
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--metrics-grace-s", "0"]);
    for gpu in 0..GPUS {
        c.arg("--gpu-capacity").arg(format!("{gpu}={MEM_PER_GPU}"));
    }
    let mut child = c
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .context("start keling run")?;
    let pid = child.id();
    let stderr = child.stderr.take().expect("piped");
    let agent = Agent { child, pid };
    let mut log = File::create(base.join("agent.log"))?;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line?;
        writeln!(log, "{line}")?;
        if line.contains(keling_common::lines::AGENT_READY) {
            std::thread::spawn(move || {
                for l in lines.map_while(Result::ok) {
                    let _ = writeln!(log, "{l}");
                }
            });
            return Ok(agent);
        }
        eprintln!("agent: {line}");
    }
    bail!(
        "keling run exited before it was ready (its log: {})",
        base.join("agent.log").display()
    )
}

/// `keling launch` of a random workload, in the background.
fn launch(
    bin_dir: &Path,
    socket: &Path,
    dev: &Path,
    pause: &Path,
    rng: &mut Rng,
    log: &File,
) -> anyhow::Result<Child> {
    let mut c = Command::new(bin_dir.join("keling"));
    c.arg("launch")
        .arg("--socket")
        .arg(socket)
        .args(["--priority", &(1 + rng.below(10)).to_string()]);
    let gpu = rng.below(u64::from(GPUS) + 1);
    if gpu < u64::from(GPUS) {
        c.args(["--gpu", &gpu.to_string()]);
    }
    c.arg("--")
        .arg(bin_dir.join("keling-gpu-workload"))
        .arg("--dev-dir")
        .arg(dev);
    // 2 ms a iteration plus the calls: about 1 .. 60 s of work.
    let iterations = 300 + rng.below(20_000);
    if rng.below(3) == 0 {
        c.args(["--scenario", "busy", "--alloc-mib"])
            .arg((rng.below(300)).to_string());
    } else {
        c.args(["--scenario", "churn", "--alloc-mib", "96", "--seed"])
            .arg(rng.next().to_string())
            .arg("--pause-file")
            .arg(pause);
    }
    c.args(["--iterations", &iterations.to_string()]);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.try_clone()?)
        .spawn()
        .context("start keling launch")
}

fn status(bin_dir: &Path, socket: &Path) -> Result<Value, String> {
    let out = Command::new(bin_dir.join("keling"))
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .map_err(|e| format!("keling status: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "keling status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("keling status --json: {e}"))
}

const LIVE_STATES: [&str; 3] = ["PENDING", "RUNNING", "PREEMPTED"];

fn random_task_pid(bin_dir: &Path, socket: &Path, rng: &mut Rng) -> Option<u32> {
    let s = status(bin_dir, socket).ok()?;
    let pids: Vec<u32> = s["tasks"]
        .as_array()?
        .iter()
        .filter(|t| LIVE_STATES.contains(&t["state"].as_str().unwrap_or("")))
        .filter_map(|t| t["pid"].as_u64().map(|p| p as u32))
        .filter(|&p| p > 1)
        .collect();
    (!pids.is_empty()).then(|| pids[rng.below(pids.len() as u64) as usize])
}

/// What the last check looked at.
#[derive(Default)]
struct Seen {
    sim_bytes: u64,
    sim_objects: u64,
    compared: usize,
}

/// Every disagreement between the agent and the simulator (or the kernel's
/// freezer) now; empty when none.
fn check(
    bin_dir: &Path,
    socket: &Path,
    sim_dir: &Path,
    metrics_port: u16,
    agent_pid: u32,
    seen: &mut Seen,
) -> Vec<String> {
    let state: Value = match std::fs::read_to_string(sim_dir.join("nvsim-state.json"))
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(v) => v,
        Err(e) => return vec![format!("nvsim-state.json: {e}")],
    };
    let metrics = match scrape(metrics_port) {
        Ok(m) => m,
        Err(e) => return vec![format!("/metrics: {e}")],
    };
    let status = match status(bin_dir, socket) {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    compare(&state, &metrics, &status, &task_cgroups(agent_pid), seen)
}

/// The task cgroups of agent `agent_pid` (`task-<agent pid>-<task id>`): (task
/// id, name, whether `cgroup.events` says `frozen 1`).
fn task_cgroups(agent_pid: u32) -> Vec<(Option<u64>, String, bool)> {
    let Some(cg) = cgroup2_mount() else {
        return Vec::new();
    };
    let prefix = format!("task-{agent_pid}-");
    std::fs::read_dir(cg.join("keling"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_prefix(&prefix)?.parse().ok();
            let frozen = std::fs::read_to_string(e.path().join("cgroup.events"))
                .unwrap_or_default()
                .lines()
                .any(|l| l == "frozen 1");
            Some((id, name, frozen))
        })
        .collect()
}

/// One `/metrics` sample: name, labels, value.
type MetricSample = (String, BTreeMap<String, String>, u64);
type Samples = [MetricSample];

/// The disagreements between the simulator's `state`, the agent's `/metrics`
/// samples and `keling status --json`, and the frozen task cgroups whose task is
/// not PREEMPTED.
fn compare(
    state: &Value,
    metrics: &Samples,
    status: &Value,
    cgroups: &[(Option<u64>, String, bool)],
    seen: &mut Seen,
) -> Vec<String> {
    let mut problems = Vec::new();
    // (pid, gpu) -> [video, peak, host, allocs, frees], the simulator's.
    let mut truth: BTreeMap<(u64, u64), [u64; 5]> = BTreeMap::new();
    for p in state["processes"].as_array().into_iter().flatten() {
        for g in p["gpus"].as_array().into_iter().flatten() {
            let f = ["bytes", "peak_bytes", "host_bytes", "allocs", "frees"]
                .map(|k| g[k].as_u64().unwrap_or(0));
            truth.insert(
                (
                    p["pid"].as_u64().unwrap_or(0),
                    g["gpu"].as_u64().unwrap_or(0),
                ),
                f,
            );
        }
    }
    // The same from /metrics.
    let mut ours: BTreeMap<(u64, u64), [u64; 5]> = BTreeMap::new();
    let mut gpus_ours: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for (name, labels, v) in metrics {
        let num = |k: &str| labels.get(k).and_then(|s| s.parse::<u64>().ok());
        if name == "keling_gpu_memory_bytes" {
            if let (Some(g), Some(m)) = (num("gpu"), labels.get("memory")) {
                gpus_ours.insert((g, m.clone()), *v);
            }
            continue;
        }
        let (Some(pid), Some(gpu)) = (num("pid"), num("gpu")) else {
            continue;
        };
        let memory = labels.get("memory").map(String::as_str);
        let slot = match (name.as_str(), memory) {
            ("keling_process_gpu_memory_bytes", Some("video")) => 0,
            ("keling_process_gpu_memory_peak_bytes", Some("video")) => 1,
            ("keling_process_gpu_memory_bytes", Some("host")) => 2,
            ("keling_process_gpu_allocations_total", _) => 3,
            ("keling_process_gpu_frees_total", _) => 4,
            _ => continue,
        };
        ours.entry((pid, gpu)).or_default()[slot] = *v;
    }
    const NAMES: &str = "[video, peak, host, allocs, frees]";
    seen.compared = ours.len();
    seen.sim_bytes = state["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["used_bytes"].as_u64())
        .sum();
    seen.sim_objects = state["clients"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| 1 + c["objects"].as_u64().unwrap_or(0))
        .sum();
    for (k, f) in &ours {
        let t = truth.get(k).copied().unwrap_or_default();
        if &t != f {
            problems.push(format!(
                "/metrics pid {} gpu {}: {NAMES} keling {f:?}, simulator {t:?}",
                k.0, k.1
            ));
        }
    }
    for (k, t) in &truth {
        if (t[0] > 0 || t[2] > 0) && !ours.contains_key(k) {
            problems.push(format!(
                "/metrics lacks pid {} gpu {}, which holds memory: simulator {NAMES} {t:?}",
                k.0, k.1
            ));
        }
    }
    for g in state["gpus"].as_array().into_iter().flatten() {
        let i = g["index"].as_u64().unwrap_or(0);
        for (memory, field) in [("video", "used_bytes"), ("host", "host_bytes")] {
            let t = g[field].as_u64().unwrap_or(0);
            let o = gpus_ours
                .get(&(i, memory.to_string()))
                .copied()
                .unwrap_or(0);
            if t != o {
                problems.push(format!("GPU {i} {memory} bytes: keling {o}, simulator {t}"));
            }
        }
    }
    // Each live task's memory in `keling status`.
    let mut live_tasks: BTreeMap<u64, String> = BTreeMap::new();
    for t in status["tasks"].as_array().into_iter().flatten() {
        let st = t["state"].as_str().unwrap_or("").to_string();
        let id = t["id"].as_u64().unwrap_or(0);
        if !LIVE_STATES.contains(&st.as_str()) {
            continue;
        }
        live_tasks.insert(id, st.clone());
        let pid = t["pid"].as_u64().unwrap_or(0);
        let mine: BTreeMap<u64, u64> = t["mem_bytes_per_gpu"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(g, b)| Some((g.parse().ok()?, b.as_u64()?)))
            .filter(|&(_, b)| b > 0)
            .collect();
        let sims: BTreeMap<u64, u64> = truth
            .iter()
            .filter(|((p, _), f)| *p == pid && f[0] > 0)
            .map(|((_, g), f)| (*g, f[0]))
            .collect();
        if pid > 1 && mine != sims {
            problems.push(format!(
                "keling status task {id} (pid {pid}, {st}): memory per GPU {mine:?}, simulator \
                 {sims:?}"
            ));
        }
    }
    // The kernel's freezer: a frozen task cgroup's task must be PREEMPTED.
    for (id, name, frozen) in cgroups {
        let state = id
            .and_then(|id| live_tasks.get(&id))
            .map_or("not live", String::as_str);
        if *frozen && state != "PREEMPTED" {
            problems.push(format!("cgroup {name} is frozen, its task is {state}"));
        }
    }
    problems
}

/// `/metrics`, as (name, labels, value) of each sample.
fn scrape(port: u16) -> anyhow::Result<Vec<MetricSample>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .context("no HTTP body")?;
    let mut out = Vec::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').context("a sample without a value")?;
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        out.push((name.to_string(), labels, value as u64));
    }
    Ok(out)
}

/// `a="x",b="y\"z"` into a map.
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        val.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => break,
                c => val.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').trim().to_string(), val);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn report(samples: &[Sample], counts: &Counts, seed: u64, minutes: f64, checkpoint_s: u64) {
    println!("\nsoak: seed {seed}, --minutes {minutes}, --checkpoint-s {checkpoint_s}");
    println!(
        "{:>4} {:>8} {:>10} {:>6} {:>12} {:>6} {:>8} {:>8} {:>8} {:>10}",
        "cp",
        "time_s",
        "rss_kib",
        "fds",
        "map_entries",
        "tasks",
        "compared",
        "sim_mib",
        "sim_objs",
        "settle_ms"
    );
    for (i, s) in samples.iter().enumerate() {
        println!(
            "{:>4} {:>8.0} {:>10} {:>6} {:>12} {:>6} {:>8} {:>8} {:>8} {:>10}",
            i + 1,
            s.at_s,
            s.rss_kib,
            s.fds,
            s.map_entries,
            s.tasks_live,
            s.compared,
            s.sim_mib,
            s.sim_objects,
            s.settle_ms
        );
    }
    let per_hour = |f: &dyn Fn(&Sample) -> u64| {
        slope(
            &samples
                .iter()
                .map(|s| (s.at_s / 3600.0, f(s) as f64))
                .collect::<Vec<_>>(),
        )
    };
    println!(
        "growth per hour (least squares over {} checkpoints): rss {:+.0} KiB/h, fds {:+.1}/h, \
         map entries {:+.1}/h",
        samples.len(),
        per_hour(&|s| s.rss_kib),
        per_hour(&|s| s.fds),
        per_hour(&|s| s.map_entries)
    );
    println!(
        "tasks: {} launched, {} killed by the soak; launch exits: {:?}",
        counts.launched, counts.killed, counts.exits
    );
    let names: BTreeSet<&String> = samples.iter().flat_map(|s| s.maps.keys()).collect();
    for name in names {
        let at = |s: &Sample| s.maps.get(name).copied().unwrap_or(0);
        println!(
            "  map {name}: {} entries at the end, {:+.1}/h",
            samples.last().map_or(0, at),
            per_hour(&at)
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::{Seen, compare, parse_labels, slope};

    /// The simulator with pid 100 holding 8 MiB video and 1 MiB host on GPU 1
    /// (3 allocations, 1 free, peak 12 MiB), and pid 101 gone, all freed.
    fn state() -> Value {
        json!({
            "gpus": [
                {"index": 0, "used_bytes": 0, "host_bytes": 0},
                {"index": 1, "used_bytes": 8 << 20, "host_bytes": 1 << 20}
            ],
            "processes": [
                {"pid": 100, "gpus": [{"gpu": 1, "bytes": 8 << 20, "peak_bytes": 12 << 20,
                    "host_bytes": 1 << 20, "allocs": 3, "frees": 1}]},
                {"pid": 101, "gpus": [{"gpu": 0, "bytes": 0, "peak_bytes": 4 << 20,
                    "host_bytes": 0, "allocs": 1, "frees": 1}]}
            ],
            "clients": [{"handle": 1, "objects": 4}]
        })
    }

    /// What /metrics says when it agrees with [`state`] (pid 101 has left it).
    fn metrics() -> Vec<(String, BTreeMap<String, String>, u64)> {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p = [("pid", "100"), ("comm", "w"), ("task", "7"), ("gpu", "1")];
        let with = |m: &str| {
            let mut v = p.to_vec();
            v.push(("memory", m));
            l(&v)
        };
        vec![
            (
                "keling_process_gpu_memory_bytes".into(),
                with("video"),
                8 << 20,
            ),
            (
                "keling_process_gpu_memory_bytes".into(),
                with("host"),
                1 << 20,
            ),
            (
                "keling_process_gpu_memory_peak_bytes".into(),
                with("video"),
                12 << 20,
            ),
            (
                "keling_process_gpu_memory_peak_bytes".into(),
                with("host"),
                1 << 20,
            ),
            ("keling_process_gpu_allocations_total".into(), l(&p), 3),
            ("keling_process_gpu_frees_total".into(), l(&p), 1),
            (
                "keling_gpu_memory_bytes".into(),
                l(&[("gpu", "1"), ("memory", "video")]),
                8 << 20,
            ),
            (
                "keling_gpu_memory_bytes".into(),
                l(&[("gpu", "1"), ("memory", "host")]),
                1 << 20,
            ),
            (
                "keling_gpu_memory_bytes".into(),
                l(&[("gpu", "0"), ("memory", "video")]),
                0,
            ),
        ]
    }

    fn status() -> Value {
        json!({"tasks": [
            {"id": 7, "pid": 100, "state": "RUNNING", "mem_bytes_per_gpu": {"1": 8 << 20}},
            {"id": 8, "pid": 102, "state": "PREEMPTED", "mem_bytes_per_gpu": {}},
            {"id": 6, "pid": 101, "state": "COMPLETED", "mem_bytes_per_gpu": {"0": 1}}
        ]})
    }

    fn problems(
        state: &Value,
        metrics: &[(String, BTreeMap<String, String>, u64)],
        status: &Value,
        cgroups: &[(Option<u64>, String, bool)],
    ) -> Vec<String> {
        compare(state, metrics, status, cgroups, &mut Seen::default())
    }

    #[test]
    fn agreement_is_no_problem() {
        let cgroups = [
            (Some(7), "task-1-7".to_string(), false),
            (Some(8), "task-1-8".to_string(), true),
        ];
        let mut seen = Seen::default();
        assert_eq!(
            compare(&state(), &metrics(), &status(), &cgroups, &mut seen),
            Vec::<String>::new()
        );
        assert_eq!(
            (seen.compared, seen.sim_bytes, seen.sim_objects),
            (1, 8 << 20, 5)
        );
    }

    #[test]
    fn each_difference_is_reported() {
        // A process figure differs (allocations).
        let mut m = metrics();
        m[4].2 = 4;
        let p = problems(&state(), &m, &status(), &[]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("pid 100 gpu 1"), "{p:?}");
        // A process holding memory is missing from /metrics (and so is its GPU's use).
        let m: Vec<_> = metrics()
            .into_iter()
            .filter(|(n, l, _)| !n.starts_with("keling_process") || l["pid"] != "100")
            .collect();
        let p = problems(&state(), &m, &status(), &[]);
        assert!(p.iter().any(|p| p.contains("lacks pid 100 gpu 1")), "{p:?}");
        // A GPU's total differs.
        let mut m = metrics();
        m[7].2 = 2 << 20;
        let p = problems(&state(), &m, &status(), &[]);
        assert_eq!(
            p,
            vec!["GPU 1 host bytes: keling 2097152, simulator 1048576"]
        );
        // A live task's memory differs from its process's.
        let mut s = status();
        s["tasks"][0]["mem_bytes_per_gpu"] = json!({"1": 4 << 20});
        let p = problems(&state(), &metrics(), &s, &[]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("task 7"), "{p:?}");
        // A frozen cgroup whose task runs, or has ended, or is no task of ours.
        for (id, st) in [
            (Some(7), "RUNNING"),
            (Some(6), "not live"),
            (None, "not live"),
        ] {
            let p = problems(
                &state(),
                &metrics(),
                &status(),
                &[(id, "task-1-x".to_string(), true)],
            );
            assert_eq!(
                p,
                vec![format!("cgroup task-1-x is frozen, its task is {st}")]
            );
        }
    }

    #[test]
    fn slope_is_least_squares() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), 2.0);
        assert_eq!(slope(&[(0.0, 7.0)]), 0.0);
        let s = slope(&[(0.0, 0.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0)]);
        assert!((s - 0.2).abs() < 1e-9, "{s}");
    }

    #[test]
    fn labels_parse_with_escapes() {
        let l = parse_labels(r#"pid="12",comm="a\"b,c",gpu="0""#);
        assert_eq!(l["pid"], "12");
        assert_eq!(l["comm"], "a\"b,c");
        assert_eq!(l["gpu"], "0");
    }
}
