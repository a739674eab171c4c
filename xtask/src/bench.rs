//! `cargo xtask bench`: what Keling's probes cost, measured side by side in one run.
//!
//! These machines are noisy, so every figure is a ratio between measurements taken
//! interleaved in the same run (A, B, A, B, ...), reported as medians. Absolute
//! nanoseconds are shown for context only.
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};

/// `keling run` in the background; stopped (SIGINT, by pid) and reaped on drop.
struct Agent(Child);

impl Agent {
    fn start(keling: &Path, dev_dir: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(keling)
            .args(["run", "--status-interval", "0", "--dev-dir"])
            .arg(dev_dir)
            .stderr(Stdio::piped())
            .spawn()
            .context("start keling run")?;
        let stderr = child.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        let agent = Agent(child);
        // Wait for "ready" so measurements only start once the probes are attached.
        for line in lines.by_ref() {
            let line = line?;
            if line.contains("ready") {
                std::thread::spawn(move || lines.for_each(drop));
                return Ok(agent);
            }
            eprintln!("{line}");
        }
        bail!("keling run exited before it was ready")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the workload and parses the one number it prints.
fn workload(dir: &Path, args: &[&str]) -> anyhow::Result<f64> {
    let out = Command::new(dir.join("keling-workload"))
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!("keling-workload {args:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

pub fn bench(dir: &Path, rounds: usize) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark loads eBPF programs: run it as root");
    }
    // KELING_BENCH_ONLY=decision: only the decision-latency measurement (the
    // freeze/thaw figures), for when that is what is being worked on.
    if std::env::var("KELING_BENCH_ONLY").as_deref() == Ok("decision") {
        return decision_latency(dir, rounds.max(10) * 2);
    }
    let keling = dir.join("keling");
    const CALLS: &str = "2000000";
    // A stand-in device directory: DIR/nvidiactl is a plain file, so an RM ioctl on
    // it is recognised and decoded by the probes but fails at once in the kernel.
    let dev = std::env::temp_dir().join(format!("keling-bench-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dev)?;
    std::fs::write(dev.join("nvidiactl"), b"")?;
    let dev_s = dev.to_string_lossy().into_owned();
    println!(
        "Keling bench: {rounds} interleaved rounds, medians; ratios are the figures to compare.\n"
    );

    // 1. A tight syscall loop with and without the agent (system-wide probes
    //    on fork/exec/exit and sched_switch) loaded.
    // 1b. ioctls: one on a pipe (not an NVIDIA fd: filtered out in the kernel) and an
    //     RM_CONTROL on a tracked NVIDIA fd (decoded at entry and exit, reported).
    const IOCTLS: &str = "300000";
    let (mut bare, mut loaded) = (Vec::new(), Vec::new());
    let (mut io_bare, mut io_loaded, mut rm_bare, mut rm_loaded) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        bare.push(workload(dir, &["syscalls", CALLS])?);
        io_bare.push(workload(dir, &["ioctls", IOCTLS])?);
        rm_bare.push(workload(dir, &["rmctl", &dev_s, IOCTLS])?);
        let agent = Agent::start(&keling, &dev)?;
        loaded.push(workload(dir, &["syscalls", CALLS])?);
        io_loaded.push(workload(dir, &["ioctls", IOCTLS])?);
        rm_loaded.push(workload(dir, &["rmctl", &dev_s, IOCTLS])?);
        drop(agent);
    }
    let _ = std::fs::remove_dir_all(&dev);
    let (b, l) = (median(&mut bare), median(&mut loaded));
    println!("syscall loop (getppid x {CALLS}):");
    println!("  without agent  {b:8.1} ns/call");
    println!("  agent loaded   {l:8.1} ns/call   ratio {:.3}", l / b);
    let (ib, il) = (median(&mut io_bare), median(&mut io_loaded));
    let (rb, rl) = (median(&mut rm_bare), median(&mut rm_loaded));
    println!("\nioctl, each against the same call without the agent (x {IOCTLS}):");
    println!(
        "  untraced (FIONREAD on a pipe)      {ib:7.1} -> {il:7.1} ns/call   ratio {:.3}",
        il / ib
    );
    println!(
        "  traced NVIDIA (RM_CONTROL on nvidiactl) {rb:7.1} -> {rl:7.1} ns/call   ratio {:.3}",
        rl / rb
    );

    // 2. Context-switch tracing: two processes ping-pong a byte over pipes, so
    //    every round trip is context switches of tracked threads, all reported.
    //    Untraced and traced runs interleave; the workload reports its own rate.
    const TRIPS: &str = "100000";
    let (mut plain, mut traced, mut carried) = (Vec::new(), Vec::new(), Vec::new());
    let mut drops_total = 0u64;
    let mut events_total = 0u64;
    for _ in 0..rounds {
        plain.push(workload(dir, &["pingpong", TRIPS])?);
        let tmp = std::env::temp_dir().join(format!("keling-bench-{}.jsonl", std::process::id()));
        let out = Command::new(&keling)
            .args(["trace", "--format", "jsonl", "--output"])
            .arg(&tmp)
            .arg("--")
            .arg(dir.join("keling-workload"))
            .args(["pingpong", TRIPS])
            .output()?;
        let text = std::fs::read_to_string(&tmp)?;
        let _ = std::fs::remove_file(&tmp);
        if !out.status.success() {
            bail!("traced pingpong failed");
        }
        traced.push(String::from_utf8_lossy(&out.stdout).trim().parse::<f64>()?);
        let summary: serde_json::Value =
            serde_json::from_str(text.lines().last().context("empty trace")?)?;
        let events = summary["events"].as_u64().unwrap_or(0);
        let dur = Duration::from_nanos(summary["duration_ns"].as_u64().unwrap_or(1));
        drops_total += summary["drops"].as_u64().unwrap_or(0);
        events_total += events;
        carried.push(events as f64 / dur.as_secs_f64());
    }
    let (p, t) = (median(&mut plain), median(&mut traced));
    println!("\ncontext-switch tracing (pipe ping-pong x {TRIPS} between two processes):");
    println!("  untraced       {p:10.0} round trips/s");
    println!(
        "  traced         {t:10.0} round trips/s   ratio {:.3}",
        t / p
    );
    println!(
        "  ring buffer carried {:.0} events/s (median), {events_total} events in all, {drops_total} dropped",
        median(&mut carried)
    );
    decision_latency(dir, rounds.max(10) * 2)?;
    Ok(())
}

/// 3. Decision latency: a 16-thread busy background task is frozen each time an
///    interactive task arrives and thawed when it leaves; per stage and action,
///    p50 / p99 / max next to the timeout the model chose.
fn decision_latency(dir: &Path, rounds: usize) -> anyhow::Result<()> {
    let base = std::env::temp_dir().join(format!("keling-bench-sched-{}", std::process::id()));
    let dev = base.join("dev");
    let socket = base.join("keling.sock");
    let sim = crate::demo::Simulator::mount(&dir.join("keling-nvsim"), &dev)?;
    let mut agent = Command::new(dir.join("keling"))
        .args(["run", "--status-interval", "0", "--dev-dir"])
        .arg(&dev)
        .arg("--socket")
        .arg(&socket)
        .stderr(Stdio::piped())
        .spawn()?;
    let agent_pid = agent.id();
    let mut lines = BufReader::new(agent.stderr.take().expect("piped")).lines();
    for line in lines.by_ref() {
        if line?.contains("ready") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let launch = |prio: &str, cmd: &[&str]| {
        Command::new(dir.join("keling"))
            .arg("launch")
            .arg("--socket")
            .arg(&socket)
            .args(["--priority", prio, "--gpu", "0", "--"])
            .args(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let workload = dir.join("keling-workload").to_string_lossy().into_owned();
    let gpu_workload = dir
        .join("keling-gpu-workload")
        .to_string_lossy()
        .into_owned();
    let dev_s = dev.to_string_lossy().into_owned();
    let mut background = launch("10", &[&workload, "threads", "16", "600000", "/dev/null"])?;
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..rounds {
        let mut fg = launch(
            "3",
            &[
                &gpu_workload,
                "--dev-dir",
                &dev_s,
                "--scenario",
                "busy",
                "--iterations",
                "40",
            ],
        )?;
        fg.wait()?;
        std::thread::sleep(Duration::from_millis(150));
    }
    let out = Command::new(dir.join("keling"))
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()?;
    // SAFETY: signalling our own children by pid.
    unsafe { libc::kill(agent_pid as i32, libc::SIGINT) };
    let _ = agent.wait();
    crate::demo::end_demo_tasks(agent_pid);
    let _ = background.wait();
    drop(sim);
    let _ = std::fs::remove_dir_all(&base);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).context("keling status")?;
    let l = &status["latency"];
    println!(
        "\ndecision latency, 16-thread busy task frozen/thawed {rounds} times (keling run, adaptive model):"
    );
    println!(
        "  timeout chosen {:.2} ms; {} of {} decisions late",
        l["timeout_ms"].as_f64().unwrap_or(0.0),
        l["late"],
        l["decisions"]
    );
    println!(
        "  {:<7} {:<13} {:>10} {:>10} {:>10} {:>6}",
        "action", "stage", "p50 ms", "p99 ms", "max ms", "count"
    );
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
            println!(
                "  {action:<7} {stage:<13} {:>10.3} {:>10.3} {:>10.3} {:>6}",
                ms("p50_ns"),
                ms("p99_ns"),
                ms("max_ns"),
                p["count"]
            );
        }
    }
    Ok(())
}
