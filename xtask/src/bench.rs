//! `cargo xtask bench`: what Keling costs, measured side by side in one run, against
//! the floor (empty eBPF programs on the same tracepoints, loaded as Keling loads
//! its own) and bpftrace doing the least it can for the same work. Writes
//! BENCHMARKS.md and BENCHMARKS.json.
//!
//! These machines are noisy, so every cost is taken interleaved in the same run
//! (bare, floor, raw syscall floor, bpftrace's floor, bpftrace, Keling, bare, ...) and reported as
//! medians and ratios; absolute nanoseconds are there for context only. The goals
//! (issues 11 and 17) are shown next to the figures; they are goals, not assertions.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use keling_common::lines::{self, SlowActuation};
use serde_json::{Value, json};

/// A tracer in the background (`keling run` or bpftrace); stopped (SIGINT, by
/// pid) and reaped on drop. Keeps the lines it says about slow actuations.
struct Tracer(Child, Arc<Mutex<Vec<String>>>);

impl Tracer {
    /// Starts `cmd` and waits for the line (on stderr or stdout) that says its
    /// probes are attached.
    fn start(mut cmd: Command, ready: &str, on_stdout: bool) -> anyhow::Result<Self> {
        let mut child = if on_stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped())
        } else {
            cmd.stderr(Stdio::piped()).stdout(Stdio::null())
        }
        .spawn()
        .with_context(|| format!("start {cmd:?}"))?;
        let out: Box<dyn Read + Send> = if on_stdout {
            Box::new(child.stdout.take().expect("piped"))
        } else {
            Box::new(child.stderr.take().expect("piped"))
        };
        let errors = on_stdout.then(|| child.stderr.take().expect("piped"));
        let kept = Arc::new(Mutex::new(Vec::new()));
        let tracer = Tracer(child, kept.clone());
        let mut lines = BufReader::new(out).lines();
        let mut said = String::new();
        for line in lines.by_ref() {
            let line = line?;
            if line.contains(ready) {
                std::thread::spawn(move || {
                    for l in lines.map_while(Result::ok) {
                        if let Some((_, slow)) = l.split_once(SlowActuation::PREFIX) {
                            kept.lock().expect("not poisoned").push(slow.to_owned());
                        }
                    }
                });
                if let Some(e) = errors {
                    std::thread::spawn(move || BufReader::new(e).lines().for_each(drop));
                }
                return Ok(tracer);
            }
            said += &line;
            said.push('\n');
        }
        if let Some(mut e) = errors {
            let _ = e.read_to_string(&mut said);
        }
        bail!("{cmd:?} stopped before it was ready:\n{said}")
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Asks it to stop (one SIGINT) and waits up to `limit` for it to exit: how
    /// long it took, or `None` (drop then asks again, and kills it).
    fn stop(&mut self, limit: Duration) -> Option<Duration> {
        // SAFETY: signalling our own unreaped child by pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let asked = Instant::now();
        while asked.elapsed() < limit {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return Some(asked.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    /// The slow actuations it has logged so far.
    fn slow_actuations(&self) -> Vec<String> {
        self.1.lock().expect("not poisoned").clone()
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // bpftrace sometimes loses a SIGINT that comes just after it attached
        // (seen here: it then waited forever, and so did the bench): asked again
        // each second, and killed after five.
        for _ in 0..5 {
            if self.stop(Duration::from_secs(1)).is_some() {
                return;
            }
        }
        eprintln!(
            "xtask: the tracer (pid {}) did not stop on SIGINT in 5 s: killed",
            self.0.id()
        );
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `keling run` on `dev_dir` (metrics off, so nothing else may hold its port),
/// with `extra` arguments.
fn agent(keling: &Path, dev_dir: &Path, extra: &[&std::ffi::OsStr]) -> anyhow::Result<Tracer> {
    let mut c = Command::new(keling);
    c.args([
        "run",
        "--status-interval",
        "0",
        "--metrics-addr",
        "off",
        "--dev-dir",
    ])
    .arg(dev_dir)
    .args(extra);
    Tracer::start(c, lines::AGENT_READY, false)
}

/// `keling floor`: Keling's object with only two empty programs attached to the
/// ioctl tracepoints (the floor, loaded and attached as Keling's own are).
fn floor(keling: &Path, raw_syscalls: bool) -> anyhow::Result<Tracer> {
    let mut c = Command::new(keling);
    c.arg("floor");
    if raw_syscalls {
        c.arg("--raw-syscalls");
    }
    Tracer::start(c, lines::FLOOR_READY, false)
}

fn bpftrace(script: &str) -> anyhow::Result<Tracer> {
    let mut c = Command::new("bpftrace");
    c.arg("-e").arg(script);
    Tracer::start(c, "Attaching", true)
}

/// bpftrace's empty programs on the tracepoints an ioctl passes through in Keling.
const FLOOR_BPFTRACE: &str =
    "tracepoint:syscalls:sys_enter_ioctl {} tracepoint:syscalls:sys_exit_ioctl {}";

/// The least bpftrace can do for Keling's work on an RM_CONTROL: remember the
/// NVIDIA fds at open, read the params at entry and the driver's status at exit.
fn bpftrace_script(nvidiactl: &Path) -> String {
    format!(
        "tracepoint:syscalls:sys_enter_openat /str(args->filename) == \"{}\"/ {{ @opening[tid] = 1; }}
tracepoint:syscalls:sys_exit_openat /@opening[tid]/ {{ if (args->ret >= 0) {{ @nv[pid, args->ret] = 1; }} delete(@opening[tid]); }}
tracepoint:syscalls:sys_enter_ioctl /@nv[pid, args->fd]/ {{ @argp[tid] = args->arg; @cmd[tid] = *(uint32 *)uptr(args->arg + 8); }}
tracepoint:syscalls:sys_exit_ioctl /@argp[tid]/ {{ @status = *(uint32 *)uptr(@argp[tid] + 28); @calls = count(); delete(@argp[tid]); delete(@cmd[tid]); }}",
        nvidiactl.display()
    )
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile of `v` (nearest rank); NaN when empty.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A figure over the rounds: its median and interquartile range, so a reader sees
/// whether a difference is larger than the noise.
#[derive(Clone, Copy, Debug)]
struct Spread {
    median: f64,
    p25: f64,
    p75: f64,
    n: usize,
}

impl Spread {
    fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        Spread {
            median: quantile(&mut v, 0.5),
            p25: quantile(&mut v, 0.25),
            p75: quantile(&mut v, 0.75),
            n: v.len(),
        }
    }

    /// `1225 (IQR 1190-1260, n 15)` with `digits` decimals.
    fn text(&self, digits: usize) -> String {
        format!(
            "{:.digits$} (IQR {:.digits$} to {:.digits$}, n {})",
            self.median, self.p25, self.p75, self.n
        )
    }

    fn json(&self) -> Value {
        json!({"median": self.median, "p25": self.p25, "p75": self.p75, "n": self.n})
    }
}

/// Runs the workload and parses the one number it prints.
fn workload(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<f64> {
    let out = Command::new(dir.join("keling-workload"))
        .args(args)
        .envs(env.iter().copied())
        .output()?;
    if !out.status.success() {
        bail!("keling-workload {args:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// What the run found: rows for BENCHMARKS.md, the same as JSON.
#[derive(Default)]
struct Report {
    /// (section, what, figure, goal).
    rows: Vec<(String, String, String, String)>,
    json: BTreeMap<String, Value>,
}

impl Report {
    fn row(&mut self, section: &str, what: &str, figure: String, goal: &str) {
        println!(
            "  {what:<58} {figure}{}",
            if goal.is_empty() {
                String::new()
            } else {
                format!("   (goal: {goal})")
            }
        );
        self.rows
            .push((section.into(), what.into(), figure, goal.into()));
    }

    fn section(&mut self, title: &str) {
        println!("\n{title}");
    }
}

/// The ways a call runs: bare; under the floor (Keling's object with two empty
/// programs, `keling floor`); under two empty programs on the raw syscall
/// tracepoints instead (`keling floor --raw-syscalls`: the other way of seeing
/// syscalls, run on every one); under bpftrace's empty programs; under bpftrace
/// doing the least it can for Keling's work; under Keling.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Under {
    Bare,
    Floor,
    FloorRaw,
    FloorBpftrace,
    Bpftrace,
    Keling,
}

impl Under {
    const ALL: [Under; 6] = [
        Under::Bare,
        Under::Floor,
        Under::FloorRaw,
        Under::FloorBpftrace,
        Under::Bpftrace,
        Under::Keling,
    ];

    fn name(self) -> &'static str {
        match self {
            Under::Bare => "bare",
            Under::Floor => "floor",
            Under::FloorRaw => "floor_raw_syscalls",
            Under::FloorBpftrace => "floor_bpftrace",
            Under::Bpftrace => "bpftrace",
            Under::Keling => "keling",
        }
    }
}

/// Mounts tracefs at /sys/kernel/tracing unless it (or debugfs's copy) is there.
fn ensure_tracefs() -> anyhow::Result<()> {
    let mounted = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .iter()
    .any(|p| Path::new(p).is_dir());
    if mounted {
        return Ok(());
    }
    let status = Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("tracefs is not mounted and `mount -t tracefs tracefs /sys/kernel/tracing` failed");
    }
    Ok(())
}

pub fn bench(dir: &Path, rounds: usize) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    let rounds = rounds.max(1);
    let mut report = Report::default();
    // KELING_BENCH_ONLY=calls,switches,ring,decision,replay,agent,slurm: only those parts
    // (for when one is being worked on); BENCHMARKS.md is then not written.
    let only = std::env::var("KELING_BENCH_ONLY").ok();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    if part("calls") || part("switches") {
        crate::setup::debian_packages(&["bpftrace"])?;
    }
    // bpftrace finds tracepoints through tracefs, which a fresh machine has not
    // mounted (the agent mounts it itself, but bpftrace may run first).
    ensure_tracefs()?;
    println!(
        "Keling bench: {rounds} interleaved rounds, medians; ratios are the figures to compare."
    );
    let started = Instant::now();
    if part("calls") {
        call_costs(dir, rounds, &mut report)?;
    }
    if part("switches") {
        switch_costs(dir, rounds, &mut report)?;
    }
    if part("ring") {
        ring_buffer(dir, &mut report)?;
    }
    if part("decision") {
        decision_latency(dir, &mut report)?;
    }
    if part("replay") {
        replay_speed(dir, &mut report)?;
    }
    if part("agent") {
        footprint(dir, &mut report)?;
    }
    if part("slurm") {
        slurm_step_start(dir, &mut report)?;
    }
    if only.is_some() {
        println!("\nxtask: KELING_BENCH_ONLY is set: BENCHMARKS.md is left as it was");
        return Ok(());
    }
    write_report(&report, rounds, started.elapsed())
}

/// What the Slurm plugin adds to a job step's start: `srun true` on a
/// two-daemon Slurm cluster (tests/src/slurm.rs) with and without the plugin
/// handing the task to the node's agent; the ignored test
/// `slurm_step_start_cost` measures, interleaved, and prints the medians.
fn slurm_step_start(dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    report.section("Slurm: a job step's start");
    let out = crate::cargo()
        .args(["test", "-p", "keling-tests", "--test", "slurm"])
        .args(if dir.ends_with("release") {
            &["--release"][..]
        } else {
            &[][..]
        })
        .args([
            "--",
            "--ignored",
            "--nocapture",
            "--exact",
            "slurm_step_start_cost",
        ])
        .env("KELING_BIN", dir.join("keling"))
        .current_dir(crate::root())
        .output()
        .context("cargo test slurm_step_start_cost")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().find(|l| l.starts_with("slurm step start ms:")) else {
        println!(
            "  skipped: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        );
        return Ok(());
    };
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (without, with) = (
        nums.first().copied().unwrap_or(0.0),
        nums.get(1).copied().unwrap_or(0.0),
    );
    report.row(
        "slurm",
        "srun --gres=shard:1 true, median ms: without / with the plugin (and its agent)",
        format!("{without:.1} / {with:.1} (+{:.1} ms)", with - without),
        "at most 20 ms more",
    );
    report.json.insert(
        "slurm_step_start_ms".into(),
        serde_json::json!({"without": without, "with": with}),
    );
    Ok(())
}

/// 1. The cost of a call under each tracer: getppid (no tracepoint of Keling's on
///    its path), FIONREAD on a pipe (an ioctl Keling filters out in the kernel)
///    and an RM_CONTROL on a tracked `nvidiactl` (decoded at entry and exit).
fn call_costs(dir: &Path, rounds: usize, report: &mut Report) -> anyhow::Result<()> {
    let keling = dir.join("keling");
    const CALLS: &str = "2000000";
    const IOCTLS: &str = "300000";
    // A stand-in device directory: DIR/nvidiactl is a plain file, so an RM ioctl on
    // it is recognised and decoded by Keling's probes (the agent records the file's
    // identity at start) but fails at once in the kernel (ENOTTY): what is measured
    // is the tracing, not a driver.
    let dev = std::env::temp_dir().join(format!("keling-bench-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dev)?;
    std::fs::write(dev.join("nvidiactl"), b"")?;
    let dev_s = dev.to_string_lossy().into_owned();
    let script = bpftrace_script(&dev.join("nvidiactl"));
    let mut got: BTreeMap<(Under, &str), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        eprint!("\rcall costs: round {}/{rounds}", round + 1);
        // The order rotates, so no tracer always runs first (or last) in a round.
        let mut order = Under::ALL;
        order.rotate_left(round % Under::ALL.len());
        for under in order {
            let _tracer = match under {
                Under::Bare => None,
                Under::Floor => Some(floor(&keling, false)?),
                Under::FloorRaw => Some(floor(&keling, true)?),
                Under::FloorBpftrace => Some(bpftrace(FLOOR_BPFTRACE)?),
                Under::Bpftrace => Some(bpftrace(&script)?),
                Under::Keling => Some(agent(&keling, &dev, &[])?),
            };
            for (name, args) in [
                ("getppid", vec!["syscalls", CALLS]),
                ("fionread", vec!["ioctls", IOCTLS]),
                ("rm_control", vec!["rmctl", &dev_s, IOCTLS]),
            ] {
                // The median of three runs: one disturbed run does not decide.
                let mut runs = (0..3)
                    .map(|_| workload(dir, &args, &[]))
                    .collect::<anyhow::Result<Vec<f64>>>()?;
                got.entry((under, name))
                    .or_default()
                    .push(median(&mut runs));
            }
        }
    }
    eprintln!();
    let _ = std::fs::remove_dir_all(&dev);
    report.section(&format!(
        "Cost per call, ns: median over {rounds} interleaved rounds (IQR: the middle half of the rounds)"
    ));
    let per_round = |under: Under, name: &str| got[&(under, name)].clone();
    for (name, label) in [
        (
            "getppid",
            "getppid (no Keling program runs for it; the kernel's syscall tracing does)",
        ),
        (
            "fionread",
            "ioctl FIONREAD on a pipe (untraced: filtered in the kernel)",
        ),
        (
            "rm_control",
            "ioctl RM_CONTROL on nvidiactl (traced, decoded)",
        ),
    ] {
        let spreads: BTreeMap<&str, Spread> = Under::ALL
            .iter()
            .map(|&u| (u.name(), Spread::of(&per_round(u, name))))
            .collect();
        report.row(
            "calls",
            label,
            Under::ALL
                .iter()
                .map(|u| format!("{} {}", u.name(), spreads[u.name()].text(0)))
                .collect::<Vec<_>>()
                .join("; "),
            "",
        );
        report.json.insert(
            format!("call_ns.{name}"),
            json!(
                spreads
                    .iter()
                    .map(|(u, s)| (*u, s.json()))
                    .collect::<BTreeMap<_, _>>()
            ),
        );
    }
    // Each round's figures were taken minutes apart at most, the rounds' far more:
    // differences and ratios are taken within a round, then summarised.
    let paired = |f: &dyn Fn(usize) -> f64| Spread::of(&(0..rounds).map(f).collect::<Vec<_>>());
    let over = |u: Under, name: &str, r: usize| got[&(u, name)][r] - got[&(Under::Bare, name)][r];
    let keling_over = paired(&|r| over(Under::Keling, "rm_control", r));
    let floor_over = paired(&|r| over(Under::Floor, "rm_control", r));
    let floor_bpftrace_over = paired(&|r| over(Under::FloorBpftrace, "rm_control", r));
    let bpftrace_over = paired(&|r| over(Under::Bpftrace, "rm_control", r));
    let vs_floor =
        paired(&|r| over(Under::Keling, "rm_control", r) / over(Under::Floor, "rm_control", r));
    let vs_bpftrace =
        paired(&|r| over(Under::Keling, "rm_control", r) / over(Under::Bpftrace, "rm_control", r));
    report.row(
        "calls",
        "traced RM_CONTROL: overhead over the bare call, ns",
        format!(
            "keling {}; floor {}; bpftrace's empty programs {}; bpftrace {}",
            keling_over.text(0),
            floor_over.text(0),
            floor_bpftrace_over.text(0),
            bpftrace_over.text(0)
        ),
        "",
    );
    report.row(
        "calls",
        "traced ioctl overhead: Keling / floor (per round)",
        format!("{}x", vs_floor.text(2)),
        "at most 1.5x",
    );
    report.row(
        "calls",
        "traced ioctl overhead: Keling / bpftrace (per round)",
        format!("{}x", vs_bpftrace.text(2)),
        "at most 0.5x",
    );
    let mut untraced = BTreeMap::new();
    for name in ["fionread", "getppid"] {
        let d = paired(&|r| got[&(Under::Keling, name)][r] - got[&(Under::Floor, name)][r]);
        report.row(
            "calls",
            &format!("untraced {name}: Keling - floor, ns (per round)"),
            d.text(0),
            "within 10 ns",
        );
        untraced.insert(name, d.json());
    }
    // What tracing syscalls costs every process on the host: each of its syscalls
    // pays the kernel's syscall-tracing path while any syscall tracepoint has a
    // program (TIF_SYSCALL_TRACEPOINT on every task), and each ioctl the ioctl
    // tracepoints besides. The raw floor's programs run for every syscall instead.
    let mut host = BTreeMap::new();
    for (name, what) in [
        ("getppid", "any other syscall (getppid)"),
        ("fionread", "an ioctl Keling does not decode (FIONREAD)"),
        ("rm_control", "an NVIDIA ioctl (RM_CONTROL)"),
    ] {
        let keling = paired(&|r| over(Under::Keling, name, r));
        let floor = paired(&|r| over(Under::Floor, name, r));
        let raw = paired(&|r| over(Under::FloorRaw, name, r));
        report.row(
            "calls",
            &format!("cost to {what} over the bare call, ns (per round)"),
            format!(
                "keling {}; floor {}; raw syscall floor {}",
                keling.text(0),
                floor.text(0),
                raw.text(0)
            ),
            "",
        );
        host.insert(
            name,
            json!({"keling": keling.json(), "floor": floor.json(), "floor_raw_syscalls": raw.json()}),
        );
    }
    report.json.insert(
        "ratios".into(),
        json!({
            "traced_overhead_vs_floor": vs_floor.json(),
            "traced_overhead_vs_bpftrace": vs_bpftrace.json(),
            "traced_overhead_ns": {
                "keling": keling_over.json(),
                "floor": floor_over.json(),
                "floor_bpftrace": floor_bpftrace_over.json(),
                "bpftrace": bpftrace_over.json(),
            },
            "untraced_minus_floor_ns": untraced,
            "over_bare_ns": host,
        }),
    );
    Ok(())
}

/// `keling trace --format jsonl` of a workload (NVIDIA files under `dev_dir`):
/// (what the workload printed, the trace's summary line).
fn traced(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    ringbuf_kib: u32,
    dev_dir: Option<&Path>,
) -> anyhow::Result<(f64, Value)> {
    let tmp = std::env::temp_dir().join(format!("keling-bench-{}.jsonl", std::process::id()));
    let mut c = Command::new(dir.join("keling"));
    c.args(["trace", "--format", "jsonl", "--ringbuf-kib"])
        .arg(ringbuf_kib.to_string());
    if let Some(d) = dev_dir {
        c.arg("--dev-dir").arg(d);
    }
    let out = c
        .arg("--output")
        .arg(&tmp)
        .arg("--")
        .arg(dir.join("keling-workload"))
        .args(args)
        .envs(env.iter().copied())
        .output()?;
    let text = std::fs::read_to_string(&tmp).unwrap_or_default();
    let _ = std::fs::remove_file(&tmp);
    if !out.status.success() {
        bail!(
            "keling trace of {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let printed = String::from_utf8_lossy(&out.stdout).trim().parse::<f64>()?;
    let summary: Value = serde_json::from_str(text.lines().last().context("empty trace")?)?;
    Ok((printed, summary))
}

/// 2. Context-switch tracing: two processes ping-pong a byte over pipes (each
///    round trip is switches of traced threads, all reported), pinned to one CPU
///    and, separately, to two, untraced and traced interleaved.
fn switch_costs(dir: &Path, rounds: usize, report: &mut Report) -> anyhow::Result<()> {
    const TRIPS: &str = "100000";
    report.section("Context-switch tracing (pipe ping-pong x 100000, round trips/s)");
    for (label, env) in [
        ("both processes on CPU 0", vec![("KELING_WL_CPU", "0")]),
        (
            "one process on CPU 0, the other on CPU 1",
            vec![("KELING_WL_CPU", "0"), ("KELING_WL_CHILD_CPU", "1")],
        ),
    ] {
        let (mut plain, mut with) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            eprint!("\rping-pong, {label}: round {}/{rounds}", round + 1);
            plain.push(workload(dir, &["pingpong", TRIPS], &env)?);
            with.push(traced(dir, &["pingpong", TRIPS], &env, 4096, None)?.0);
        }
        eprintln!();
        let (p, t) = (median(&mut plain), median(&mut with));
        report.row(
            "switches",
            label,
            format!(
                "untraced {p:.0}, traced {t:.0}: a traced round trip takes {:.2}x as long, {:+.0} ns",
                p / t,
                1e9 / t - 1e9 / p
            ),
            "",
        );
        report.json.insert(
            format!(
                "pingpong.{}",
                if env.len() == 1 {
                    "one_cpu"
                } else {
                    "two_cpus"
                }
            ),
            json!({"untraced_round_trips_s": p, "traced_round_trips_s": t}),
        );
    }
    Ok(())
}

/// 3. The ring buffer: RM_CONTROLs at a given rate under `keling trace` (each one an
///    event), at rising rates and two ring sizes: events carried per second, and
///    drops, with received + dropped set against the calls the workload made.
fn ring_buffer(dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let dev = std::env::temp_dir().join(format!("keling-bench-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dev)?;
    std::fs::write(dev.join("nvidiactl"), b"")?;
    let dev_s = dev.to_string_lossy().into_owned();
    let producers = std::thread::available_parallelism().map_or(2, |n| n.get());
    report.section(&format!(
        "Ring buffer (keling trace, one RM_CONTROL event per call, 2 s at each rate, from {producers} producer processes: one per CPU)"
    ));
    let mut json_rows = Vec::new();
    for ring_kib in [64u32, 4096] {
        let mut best_clean = 0.0f64;
        let mut lost = false;
        // (asked, made, dropped) at the highest rate asked.
        let mut last = (0.0, 0.0, 0.0);
        for rate in [
            50_000u64, 200_000, 350_000, 500_000, 700_000, 1_000_000, 5_000_000,
        ] {
            eprint!("\rring buffer {ring_kib} KiB at {rate} calls/s ...   ");
            let (calls, summary) = traced(
                dir,
                &[
                    "rmctl-rate",
                    &dev_s,
                    &rate.to_string(),
                    "2",
                    &producers.to_string(),
                ],
                &[],
                ring_kib,
                Some(&dev),
            )?;
            let events = summary["events"].as_u64().unwrap_or(0) as f64;
            let drops = summary["drops"].as_u64().unwrap_or(0) as f64;
            // The workload's 2 s: the rate the events came at.
            let made = calls / 2.0;
            // The highest rate below the first that lost events: a rate that
            // happens to lose none above one that lost some is not "carried".
            if drops == 0.0 && !lost {
                best_clean = best_clean.max(made);
            }
            lost |= drops > 0.0;
            report.row(
                "ring",
                &format!("{ring_kib} KiB ring, asked {rate} calls/s"),
                format!(
                    "{made:.0} events/s made ({calls:.0} calls), {events:.0} received, {drops:.0} dropped; received + dropped - calls = {:+.0} (the process's own fork, exec, exit and switch events)",
                    events + drops - calls
                ),
                "",
            );
            let carried = made;
            last = (rate as f64, made, drops);
            json_rows.push(
                json!({"ring_kib": ring_kib, "asked_rate": rate, "calls": calls,
                "events": events, "drops": drops, "events_per_s": carried}),
            );
        }
        eprintln!();
        report.row(
            "ring",
            &format!("{ring_kib} KiB ring: highest rate carried with zero drops, as at every rate below it"),
            format!("{best_clean:.0} events/s"),
            "1 000 000 events/s",
        );
        let (asked, made, drops) = last;
        let limit = if drops > 0.0 {
            format!(
                "the consumer: at {made:.0} events/s made, {drops:.0} were dropped (keling trace \
                 did not read the ring fast enough)"
            )
        } else if made < asked * 0.95 {
            format!(
                "the producers: {producers} processes made only {made:.0} calls/s of the \
                 {asked:.0} asked, the CPUs shared with keling trace reading the ring ({:.0} ns \
                 of the machine's CPU time per event, all of it: producers and consumer), and \
                 the ring carried every one",
                1e9 * producers as f64 / made
            )
        } else {
            "not reached at these rates".into()
        };
        report.row(
            "ring",
            &format!("{ring_kib} KiB ring: where the limit comes from"),
            limit,
            "",
        );
    }
    report
        .json
        .insert("ring_buffer".into(), Value::Array(json_rows));
    let _ = std::fs::remove_dir_all(&dev);
    Ok(())
}

/// Freeze/thaw cycles per host condition: enough that a p99 is not a maximum.
const DECISION_CYCLES: u64 = 1100;

/// The tasks an agent launched (its `task-<pid>-*` cgroups), ended on drop.
struct EndTasks(u32);

impl Drop for EndTasks {
    fn drop(&mut self) {
        crate::demo::end_demo_tasks(self.0);
    }
}

/// Processes started for the bench, killed by pid and reaped on drop.
struct Started(Vec<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// 4. Decision latency: a 16-thread busy background task is frozen each time an
///    interactive task becomes active and thawed when it goes idle (bursts of GPU
///    calls 50 ms apart, idle timeout 20 ms), ~1100 times, on an idle host and on
///    one with a spinning process per CPU besides; per stage and action, p50 / p99
///    / max and n, and where the slow actuations' time went.
fn decision_latency(dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let mut json_rows = BTreeMap::new();
    for busy in [false, true] {
        let host = if busy { "busy host" } else { "idle host" };
        let steal_before = HostTimes::now()?;
        let (status, slow) = decision_run(dir, busy)?;
        let steal = HostTimes::now()?.steal_since(&steal_before);
        let l = &status["latency"];
        report.section(&format!(
            "Decision latency, {host}: 16-thread busy task frozen/thawed {DECISION_CYCLES} times (keling run, {} model, timeout {:.2} ms; {} of {} decisions late)",
            l["model"].as_str().unwrap_or("?"),
            l["timeout_ms"].as_f64().unwrap_or(0.0),
            l["late"],
            l["decisions"]
        ));
        let mut rows = BTreeMap::new();
        for action in ["freeze", "thaw"] {
            for stage in [
                "delivery",
                "decision",
                "actuation",
                "confirmation",
                "end_to_end",
            ] {
                let p = &status["stages_by_action"][action][stage];
                if p.is_null() {
                    continue;
                }
                let ms = |k: &str| p[k].as_f64().unwrap_or(0.0) / 1e6;
                let n = p["count"].as_u64().unwrap_or(0);
                report.row(
                    "decisions",
                    &format!("{host}: {action} {stage}"),
                    format!(
                        "p50 {:.3} ms, p99 {}, max {:.3} ms, n {n}",
                        ms("p50_ns"),
                        if n >= 1000 {
                            format!("{:.3} ms", ms("p99_ns"))
                        } else {
                            "- (n < 1000)".into()
                        },
                        ms("max_ns"),
                    ),
                    if stage == "end_to_end" {
                        "p99 at most 2 ms, n >= 1000"
                    } else {
                        ""
                    },
                );
                rows.insert(format!("{action}.{stage}"), p.clone());
            }
        }
        // Where the slow ones' time went (the agent logs every actuation over 2 ms
        // with its hand-over to the actuation thread, its boost and write, the
        // context switches in them and the thread's CPU time).
        let causes = slow_causes(&slow);
        report.row(
            "decisions",
            &format!("{host}: actuations over 2 ms from their decision"),
            format!(
                "{} ({} mostly the hand-over to the actuation thread, {} mostly the boost or \
                 write on the CPU, {} mostly blocked or preempted in the guest, {} mostly \
                 with the vCPU not running{}){}",
                slow.len(),
                causes.handoff,
                causes.on_cpu,
                causes.switched,
                causes.vcpu_held,
                if causes.unread > 0 {
                    format!(", {} unreadable", causes.unread)
                } else {
                    String::new()
                },
                slow.first()
                    .map(|l| format!("; e.g. {l}"))
                    .unwrap_or_default()
            ),
            "",
        );
        rows.insert("slow_actuations".into(), json!(slow));
        // The kernel's own floor, side by side: the same task frozen and thawed by
        // a SCHED_FIFO thread writing cgroup.freeze directly, no Keling; then the
        // same with the freeze boost (`keling run`'s default) done by hand, so the
        // boost's gain shows against the kernel alone in the same run.
        let floor_before = HostTimes::now()?;
        let floor = freezer_floor(dir, busy, false)?;
        let boosted = freezer_floor(dir, busy, true)?;
        let floor_steal = HostTimes::now()?.steal_since(&floor_before);
        // Keling's run and the kernel's alone are minutes apart: how much the
        // hypervisor took in each says whether their tails can be compared.
        report.row(
            "decisions",
            &format!("{host}: CPU time the hypervisor took (steal, /proc/stat)"),
            format!(
                "{:.2}% of the vCPUs' time during Keling's run, {:.2}% during the kernel-alone runs",
                steal * 100.0,
                floor_steal * 100.0
            ),
            "",
        );
        rows.insert("steal_fraction".into(), json!(steal));
        rows.insert("kernel_alone_steal_fraction".into(), json!(floor_steal));
        for (action, write, confirmed, slow_writes) in [
            (
                "freeze",
                &floor.freeze_write,
                &floor.freeze_confirmed,
                floor.freeze_slow,
            ),
            (
                "thaw",
                &floor.thaw_write,
                &floor.thaw_confirmed,
                floor.thaw_slow,
            ),
            (
                "freeze_boost",
                &boosted.freeze_write,
                &boosted.freeze_confirmed,
                boosted.freeze_slow,
            ),
        ] {
            let mut w = write.clone();
            let mut c = confirmed.clone();
            let n = w.len();
            let label = match action {
                "freeze_boost" => "freeze, kernel alone with the boost: boost and write",
                "freeze" => "freeze, kernel alone: write",
                _ => "thaw, kernel alone: write",
            };
            report.row(
                "decisions",
                &format!("{host}: {label} / to confirmed"),
                format!(
                    "p50 {:.3} / {:.3} ms, p99 {:.3} / {:.3} ms, max {:.3} / {:.3} ms, n {n}; \
                     {} writes over 1 ms, {} of them mostly with the vCPU not running",
                    quantile(&mut w, 0.5),
                    quantile(&mut c, 0.5),
                    quantile(&mut w, 0.99),
                    quantile(&mut c, 0.99),
                    quantile(&mut w, 1.0),
                    quantile(&mut c, 1.0),
                    slow_writes.over_1ms,
                    slow_writes.vcpu_held,
                ),
                "",
            );
            let summary = |v: &mut Vec<f64>| {
                json!({"p50": quantile(v, 0.5), "p99": quantile(v, 0.99),
                    "max": quantile(v, 1.0), "n": v.len()})
            };
            let key = match action {
                "freeze_boost" => "freeze.kernel_alone_boost_ms".to_string(),
                _ => format!("{action}.kernel_alone_ms"),
            };
            rows.insert(
                key,
                json!({"write": summary(&mut w), "confirmed": summary(&mut c),
                    "writes_over_1ms": slow_writes.over_1ms,
                    "writes_over_1ms_vcpu_held": slow_writes.vcpu_held}),
            );
        }
        json_rows.insert(if busy { "busy_host" } else { "idle_host" }, rows);
        if !busy {
            report
                .json
                .insert("decision_timeout_ms".into(), l["timeout_ms"].clone());
        }
    }
    report
        .json
        .insert("decision_latency".into(), json!(json_rows));
    Ok(())
}

/// [`freezer_floor`]'s samples, in ms: each write of `cgroup.freeze`, and from
/// the write to `cgroup.events` saying so; and how many writes were slow, and why.
#[derive(Default)]
struct FreezerFloor {
    freeze_write: Vec<f64>,
    freeze_confirmed: Vec<f64>,
    freeze_slow: SlowWrites,
    thaw_write: Vec<f64>,
    thaw_confirmed: Vec<f64>,
    thaw_slow: SlowWrites,
}

/// Writes (boost included) over 1 ms, and those of them with the vCPU not running
/// for most of it ([`vcpu_held`]).
#[derive(Default, Clone, Copy)]
struct SlowWrites {
    over_1ms: usize,
    vcpu_held: usize,
}

/// The CPU time and context switches (voluntary + involuntary) of the calling
/// thread so far: (ns, switches).
fn thread_usage() -> (u64, u64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer; the clock exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    (
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
        (u.ru_nvcsw + u.ru_nivcsw) as u64,
    )
}

/// The host's CPU times from `/proc/stat`'s first line, in USER_HZ ticks: the
/// total and the steal (time the hypervisor gave the vCPUs' physical CPUs to
/// others while they had work).
struct HostTimes {
    total: u64,
    steal: u64,
}

impl HostTimes {
    fn now() -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .context("/proc/stat has no cpu line")?
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal guest guest_nice; guest
        // time is inside user already.
        Ok(Self {
            total: fields.iter().take(8).sum(),
            steal: fields.get(7).copied().unwrap_or(0),
        })
    }

    /// The share of the CPUs' time since `before` that was stolen.
    fn steal_since(&self, before: &Self) -> f64 {
        let total = self.total.saturating_sub(before.total);
        if total == 0 {
            return 0.0;
        }
        self.steal.saturating_sub(before.steal) as f64 / total as f64
    }
}

/// Whether a boost or write of `wall_ms` was mostly time its vCPU did not run:
/// its thread never switched out, yet was on the CPU for less than half of it
/// (in a VM that accounts steal, the hypervisor's time is not the thread's).
fn vcpu_held(wall_ms: f64, on_cpu_ms: f64, switches: u64) -> bool {
    switches == 0 && on_cpu_ms < wall_ms / 2.0
}

/// The slow actuations the agent logged, by what took most of their time.
#[derive(Default)]
struct SlowCauses {
    handoff: usize,
    on_cpu: usize,
    switched: usize,
    vcpu_held: usize,
    /// Lines that do not read as [`SlowActuation`]s.
    unread: usize,
}

fn slow_causes(slow: &[String]) -> SlowCauses {
    let mut c = SlowCauses::default();
    for l in slow {
        let Some(a) = SlowActuation::parse(l) else {
            eprintln!("xtask: not a slow-actuation line: {l}");
            c.unread += 1;
            continue;
        };
        let work = a.boost_ms + a.write_ms;
        let switches = a.voluntary + a.involuntary;
        if a.handoff_ms > work {
            c.handoff += 1;
        } else if switches > 0 {
            c.switched += 1;
        } else if vcpu_held(work, a.on_cpu_ms, switches) {
            c.vcpu_held += 1;
        } else {
            c.on_cpu += 1;
        }
    }
    c
}

/// A busy host: one spinning `keling-workload busy` per CPU, ended with `started`.
fn spawn_spinners(workload: &Path, started: &mut Started) -> anyhow::Result<()> {
    for _ in 0..std::thread::available_parallelism().map_or(2, |n| n.get()) {
        started.0.push(
            Command::new(workload)
                .args(["busy", "900000"])
                .stdout(Stdio::null())
                .spawn()?,
        );
    }
    Ok(())
}

/// Cgroup removed (its processes killed first) on drop.
struct FloorCgroup(PathBuf, Started);

impl Drop for FloorCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.freeze"), "0");
        for c in &mut (self.1).0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `struct sched_attr` (linux/sched/types.h, 56 bytes), for the boost by hand.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

fn sched_getattr(tid: i32) -> Option<SchedAttr> {
    let mut a = SchedAttr::default();
    // SAFETY: a valid, writable sched_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &raw mut a,
            std::mem::size_of::<SchedAttr>() as u32,
            0u32,
        )
    };
    (r == 0).then_some(a)
}

fn sched_setattr(tid: i32, a: &SchedAttr) -> bool {
    let mut a = *a;
    a.size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: a valid sched_attr whose size field is set.
    unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &raw const a, 0u32) == 0 }
}

/// The freeze boost done by hand, as `keling run` does it: each thread of the
/// cgroup in a fair class (SCHED_OTHER, BATCH, IDLE) raised to SCHED_FIFO 1 with
/// reset-on-fork before the freeze, and put back (class, nice, flags) after it,
/// or when dropped.
struct HandBoost(Vec<(i32, SchedAttr)>);

impl HandBoost {
    fn raise(threads: &std::fs::File, buf: &mut [u8]) -> anyhow::Result<Self> {
        use std::os::unix::fs::FileExt;
        let n = threads.read_at(buf, 0)?;
        let mut raised = Vec::new();
        for tid in std::str::from_utf8(&buf[..n])?
            .lines()
            .filter_map(|l| l.parse::<i32>().ok())
        {
            let Some(a) = sched_getattr(tid).filter(|a| matches!(a.policy, 0 | 3 | 5)) else {
                continue;
            };
            let boost = SchedAttr {
                policy: libc::SCHED_FIFO as u32,
                priority: 1,
                flags: 1, // SCHED_FLAG_RESET_ON_FORK
                ..SchedAttr::default()
            };
            if sched_setattr(tid, &boost) {
                raised.push((tid, a));
            }
        }
        Ok(Self(raised))
    }
}

impl Drop for HandBoost {
    fn drop(&mut self) {
        for (tid, a) in &self.0 {
            let back = SchedAttr {
                policy: a.policy,
                nice: a.nice,
                flags: a.flags & 1,
                ..SchedAttr::default()
            };
            sched_setattr(*tid, &back);
        }
    }
}

/// What the kernel's freezer costs by itself: the decision bench's 16-thread busy
/// task in a cgroup of its own, frozen and thawed 1000 times (frozen 20 ms, then
/// running 30 ms, as in the decision runs) from a
/// SCHED_FIFO 50 thread (the actuator's priority) writing `cgroup.freeze` and
/// waiting for `cgroup.events` to say so; with a spinning process per CPU besides
/// when `busy`. With `boost`, each freeze is boosted by hand first ([`HandBoost`];
/// its time counts in the write's and the confirmation's).
fn freezer_floor(dir: &Path, busy: bool, boost: bool) -> anyhow::Result<FreezerFloor> {
    use std::os::unix::fs::FileExt;
    let root = crate::demo::cgroup2_mount().context("no cgroup v2 hierarchy mounted")?;
    let cg = root.join(format!("keling-bench-freezer-{}", std::process::id()));
    std::fs::create_dir(&cg).with_context(|| format!("creating {}", cg.display()))?;
    let workload = dir.join("keling-workload");
    let mut guard = FloorCgroup(cg.clone(), Started(Vec::new()));
    let task = Command::new(&workload)
        .args(["threads", "16", "900000", "/dev/null"])
        .stdout(Stdio::null())
        .spawn()?;
    let pid = task.id();
    guard.1.0.push(task);
    if busy {
        spawn_spinners(&workload, &mut guard.1)?;
    }
    std::fs::write(cg.join("cgroup.procs"), pid.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let cg2 = cg.clone();
    let worker = std::thread::spawn(move || -> anyhow::Result<_> {
        let param = libc::sched_param { sched_priority: 50 };
        // SAFETY: a valid sched_param for this thread.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            bail!("SCHED_FIFO: {}", std::io::Error::last_os_error());
        }
        let freeze = std::fs::OpenOptions::new()
            .write(true)
            .open(cg2.join("cgroup.freeze"))?;
        let events = std::fs::File::open(cg2.join("cgroup.events"))?;
        let threads = std::fs::File::open(cg2.join("cgroup.threads"))?;
        let mut threads_buf = vec![0u8; 4096];
        let mut out = FreezerFloor::default();
        let mut buf = [0u8; 256];
        for _ in 0..1000 {
            for (value, want) in [(b"1", "frozen 1"), (b"0", "frozen 0")] {
                let usage0 = thread_usage();
                let t0 = Instant::now();
                let raised = if boost && value == b"1" {
                    Some(HandBoost::raise(&threads, &mut threads_buf)?)
                } else {
                    None
                };
                freeze.write_at(value, 0)?;
                let write = t0.elapsed();
                let usage1 = thread_usage();
                loop {
                    let n = events.read_at(&mut buf, 0)?;
                    if String::from_utf8_lossy(&buf[..n]).contains(want) {
                        break;
                    }
                    let mut pfd = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&events),
                        events: libc::POLLPRI,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 50) };
                    if t0.elapsed() > Duration::from_secs(5) {
                        bail!("the freezer never reported {want}");
                    }
                }
                let confirmed = t0.elapsed();
                drop(raised); // put back
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                let (w, c, slow) = if value == b"1" {
                    (
                        &mut out.freeze_write,
                        &mut out.freeze_confirmed,
                        &mut out.freeze_slow,
                    )
                } else {
                    (
                        &mut out.thaw_write,
                        &mut out.thaw_confirmed,
                        &mut out.thaw_slow,
                    )
                };
                w.push(ms(write));
                c.push(ms(confirmed));
                if write > Duration::from_millis(1) {
                    slow.over_1ms += 1;
                    let on_cpu = usage1.0.saturating_sub(usage0.0) as f64 / 1e6;
                    if vcpu_held(ms(write), on_cpu, usage1.1 - usage0.1) {
                        slow.vcpu_held += 1;
                    }
                }
                // The decision bench's rhythm: frozen ~20 ms, running ~30 ms.
                // (A freeze within ~10 ms of a thaw is slow, kernel alone too:
                // each thread the thaw woke must run once before it can freeze.)
                std::thread::sleep(Duration::from_millis(if value == b"1" { 20 } else { 30 }));
            }
        }
        Ok(out)
    });
    let out = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the freezer thread panicked"))??;
    drop(guard);
    Ok(out)
}

/// One agent's decision run: its final `keling status --json` and the slow
/// actuations it logged.
fn decision_run(dir: &Path, busy: bool) -> anyhow::Result<(Value, Vec<String>)> {
    let base = std::env::temp_dir().join(format!(
        "keling-bench-sched-{}-{}",
        std::process::id(),
        u8::from(busy)
    ));
    let dev = base.join("dev");
    let socket = base.join("keling.sock");
    let sim = crate::demo::Simulator::mount(&dir.join("keling-nvsim"), &dev)?;
    let agent = agent(
        &dir.join("keling"),
        &dev,
        &[
            "--socket".as_ref(),
            socket.as_os_str(),
            "--idle-timeout-ms".as_ref(),
            "20".as_ref(),
        ],
    )?;
    let agent_pid = agent.pid();
    // Whatever happens below, the tasks this agent launched end with the run.
    let _tasks = EndTasks(agent_pid);
    let keling = dir.join("keling");
    let launch = |prio: &str, cmd: &[&str]| {
        Command::new(&keling)
            .arg("launch")
            .arg("--socket")
            .arg(&socket)
            .args(["--quiet", "--priority", prio, "--gpu", "0", "--"])
            .args(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let status = || -> anyhow::Result<Value> {
        let out = Command::new(&keling)
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()?;
        serde_json::from_slice(&out.stdout).context("keling status")
    };
    let workload = dir.join("keling-workload").to_string_lossy().into_owned();
    let dev_s = dev.to_string_lossy().into_owned();
    let mut started = Started(vec![launch(
        "10",
        &[&workload, "threads", "16", "900000", "/dev/null"],
    )?]);
    // The background task runs before the interactive one arrives.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !status()?["tasks"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["state"] == "RUNNING"))
    {
        if Instant::now() > deadline {
            bail!("the background task never ran");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if busy {
        // Outside Keling: one spinning process per CPU, all along.
        spawn_spinners(Path::new(&workload), &mut started)?;
    }
    let mut fg = launch(
        "3",
        &[
            &workload,
            "bursts",
            &dev_s,
            &DECISION_CYCLES.to_string(),
            "20",
            "50",
        ],
    )?;
    let deadline = Instant::now() + Duration::from_secs(DECISION_CYCLES / 5 + 60);
    loop {
        if fg.try_wait()?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = fg.kill();
            let _ = fg.wait();
            bail!(
                "the interactive task did not finish its {DECISION_CYCLES} bursts in time \
                 (decisions stopped at {})",
                status()?["latency"]["decisions"]
            );
        }
        let decisions = status()?["latency"]["decisions"].as_u64().unwrap_or(0);
        eprint!(
            "\rdecision latency ({}): {decisions} decisions   ",
            if busy { "busy host" } else { "idle host" }
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!();
    // The last thaw lands after the interactive task's end.
    std::thread::sleep(Duration::from_millis(200));
    let status = status()?;
    let slow = agent.slow_actuations();
    drop(started);
    drop(agent);
    crate::demo::end_demo_tasks(agent_pid);
    drop(sim);
    let _ = std::fs::remove_dir_all(&base);
    Ok((status, slow))
}

/// 5. Replay speed: the synthetic 72-hour, 8-GPU workload through the scheduler core.
fn replay_speed(dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let out = Command::new(dir.join("keling"))
        .args(["replay", "--synthetic", "--seed", "1", "--stats"])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("keling replay --synthetic failed:\n{text}");
    }
    let rates: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let (head, _) = l.split_once(" M inputs/s")?;
            head.rsplit(' ').next()?.parse().ok()
        })
        .collect();
    report.section("Replay");
    let best = rates.iter().copied().fold(f64::NAN, f64::max);
    report.row(
        "replay",
        "keling replay --synthetic (one thread, simulation included)",
        format!("{best:.2} M inputs/s"),
        "1 M events/s",
    );
    report
        .json
        .insert("replay_m_inputs_per_s".into(), json!(best));
    Ok(())
}

/// (resident KiB, CPU time used so far in ns) of `pid`, from `/proc`: the sum of
/// its threads' `schedstat` run times (exact to the ns; `stat`'s utime and stime
/// come in 10 ms ticks, too coarse for an agent that uses a fraction of a percent).
fn usage_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let mut cpu_ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        // A thread that ended between the listing and the read: its time is gone
        // from the process's sum, as it is from the kernel's.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            cpu_ns += text
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .context("schedstat")?;
        }
    }
    Ok((rss, cpu_ns))
}

/// 6. The agent's footprint: resident memory and CPU at idle and while a process
///    makes 10 000 traced GPU ioctls a second.
fn footprint(dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let dev = std::env::temp_dir().join(format!("keling-bench-fp-{}", std::process::id()));
    std::fs::create_dir_all(&dev)?;
    std::fs::write(dev.join("nvidiactl"), b"")?;
    // Start (to the ready line: every program verified and attached) and stop (from
    // SIGINT to exit: the kernel detaches each tracepoint in turn), 3 times.
    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        let mut a = agent(&dir.join("keling"), &dev, &[])?;
        starts.push(t.elapsed().as_secs_f64());
        let stopped = a.stop(Duration::from_secs(10));
        drop(a);
        let stopped = stopped.context("keling run did not stop within 10 s of SIGINT")?;
        stops.push(stopped.as_secs_f64());
    }
    let a = agent(&dir.join("keling"), &dev, &[])?;
    std::thread::sleep(Duration::from_secs(2)); // settle after start-up
    let window = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<(u64, f64)> {
        let (_, t0) = usage_of(a.pid())?;
        let start = Instant::now();
        f()?;
        let (rss, t1) = usage_of(a.pid())?;
        Ok((
            rss,
            (t1 - t0) as f64 / 1e9 / start.elapsed().as_secs_f64() * 100.0,
        ))
    };
    let (idle_rss, idle_cpu) = window(&mut || {
        std::thread::sleep(Duration::from_secs(5));
        Ok(())
    })?;
    let dev_s = dev.to_string_lossy().into_owned();
    let mut calls = 0.0;
    let (busy_rss, busy_cpu) = window(&mut || {
        calls = workload(dir, &["rmctl-rate", &dev_s, "10000", "5"], &[])?;
        Ok(())
    })?;
    drop(a);
    let _ = std::fs::remove_dir_all(&dev);
    report.section("The agent (keling run) itself");
    report.row(
        "agent",
        "idle, 5 s",
        format!(
            "{:.1} MiB resident, {idle_cpu:.2}% of one CPU",
            idle_rss as f64 / 1024.0
        ),
        "under 32 MiB",
    );
    report.row(
        "agent",
        &format!("10 000 GPU ioctls/s, 5 s ({calls:.0} calls)"),
        format!(
            "{:.1} MiB resident, {busy_cpu:.2}% of one CPU",
            busy_rss as f64 / 1024.0
        ),
        "under 32 MiB and 2% of one CPU",
    );
    let (start, stop) = (median(&mut starts), median(&mut stops));
    report.row(
        "agent",
        "start and stop (median of 3)",
        format!("ready {start:.2} s after it was started; gone {stop:.2} s after SIGINT"),
        "",
    );
    report.json.insert(
        "agent".into(),
        json!({"idle_rss_kib": idle_rss, "idle_cpu_percent": idle_cpu,
            "busy_rss_kib": busy_rss, "busy_cpu_percent": busy_cpu, "busy_calls": calls,
            "start_s": start, "stop_s": stop}),
    );
    Ok(())
}

/// The machine, in a few words.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let bpftrace = Command::new("bpftrace")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "{} CPUs ({cpu}), {:.0} GiB memory, Linux {}, {bpftrace}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem as f64 / (1 << 20) as f64,
        kernel.trim()
    )
}

fn write_report(report: &Report, rounds: usize, took: Duration) -> anyhow::Result<()> {
    let root = crate::root();
    let machine = machine();
    let mut md = format!(
        "# Keling benchmarks\n\n\
         Written by `sudo cargo xtask bench --rounds {rounds}` (root: it loads eBPF), which \
         took {:.0} s. Machine: {machine}.\n\n\
         Every cost is measured interleaved in this one run (bare, floor, raw syscall floor, \
         bpftrace's floor, bpftrace, Keling, then again, the order rotating each round; each figure the median of three runs) \
         and given as the median of the rounds with its interquartile range (IQR: the middle \
         half of the rounds) and n; differences and ratios are taken within each round and \
         then summarised, so a drift between rounds cancels. A difference smaller than its \
         IQR is noise. Compare ratios, not absolute figures, across runs and machines. \
         Percentiles of decisions are printed only with n >= 1000. *Floor*: two empty eBPF programs on the two \
         tracepoints an ioctl passes through in Keling, loaded and attached as Keling's own \
         are (`keling floor`). *Raw syscall floor*: two empty programs on the raw \
         `sys_enter` and `sys_exit` tracepoints instead, which run for every syscall \
         (`keling floor --raw-syscalls`). *bpftrace's floor*: the same empty programs as \
         the floor's, written in bpftrace. *bpftrace*: \
         bpftrace doing the least it can for Keling's work on an RM_CONTROL (remember \
         NVIDIA fds at open, read the params at entry and the status at exit). The \
         `nvidiactl` is a plain file the agent knows by its identity, so the RM_CONTROL \
         fails at once in the kernel and what is measured is the tracing. The goals are \
         issue 17's: goals to report against, not assertions. The same figures are in \
         `BENCHMARKS.json`.\n\n\
         | section | what | figure | goal |\n|---|---|---|---|\n",
        took.as_secs_f64()
    );
    for (section, what, figure, goal) in &report.rows {
        md += &format!("| {section} | {what} | {figure} | {goal} |\n");
    }
    md += "\nRerun: `sudo cargo xtask bench` (`--rounds N`; `KELING_BENCH_ONLY=PART,...` for some parts alone: \
           calls, switches, ring, decision, replay, agent, slurm).\n";
    let md_path: PathBuf = root.join("BENCHMARKS.md");
    // The soak's section (`cargo xtask soak`, written by hand from its output) stays.
    if let Some(soak) = std::fs::read_to_string(&md_path)
        .ok()
        .and_then(|old| Some(old[old.find(crate::soak::BENCHMARKS_HEADING)?..].to_string()))
    {
        md += "\n";
        md += &soak;
    }
    std::fs::write(&md_path, md)?;
    let mut json = report.json.clone();
    json.insert("machine".into(), json!(machine));
    json.insert("rounds".into(), json!(rounds));
    std::fs::write(
        root.join("BENCHMARKS.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    println!("\nxtask: wrote {} and BENCHMARKS.json", md_path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slow-actuation line as `keling run` logs it (after its prefix).
    fn line(
        handoff_ms: f64,
        boost_ms: f64,
        write_ms: f64,
        switches: u64,
        on_cpu_ms: f64,
    ) -> String {
        SlowActuation {
            kind: "Freeze",
            task: 1,
            took_ms: handoff_ms + boost_ms + write_ms,
            handoff_ms,
            boost_ms,
            threads: 17,
            write_ms,
            voluntary: switches,
            involuntary: 0,
            on_cpu_ms,
        }
        .to_string()
    }

    #[test]
    fn slow_actuations_are_sorted_by_what_took_their_time() {
        let vcpu_held = line(0.062, 0.203, 2.227, 0, 0.613);
        let lines = [
            vcpu_held.clone(),
            line(5.648, 0.0, 0.072, 0, 0.068),
            line(0.1, 0.0, 3.0, 3, 0.5),
            line(0.1, 2.0, 0.9, 0, 2.8),
            vcpu_held,
            "something else".to_owned(),
        ];
        let c = slow_causes(&lines);
        assert_eq!(
            (c.handoff, c.on_cpu, c.switched, c.vcpu_held, c.unread),
            (1, 1, 1, 2, 1)
        );
    }
}
