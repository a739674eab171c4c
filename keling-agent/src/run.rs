//! `keling run`: the long-running agent. It watches every process's lifecycle,
//! tracks every process that opens an NVIDIA device, and runs the scheduler over
//! the tasks launched through its control socket (`keling launch`).
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::{
    io::AsyncBufReadExt,
    net::UnixListener,
    signal::unix::{SignalKind, signal},
};

use crate::{
    decode::{self, Event, ExitStatus},
    latency::{LatencyRecorder, ModelKind},
    probes::{LoadOptions, Probes},
    sched::{
        cgroup,
        control::{self, Request},
        core::{GpuInfo, SchedConfig, Scheduler},
        daemon::{Confirmation, Daemon},
        supervisor,
    },
};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Seconds between status lines on standard error (0: only the final one).
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub status_interval: u64,
    /// Size of the kernel ring buffer in KiB (a power of two, at least 4).
    #[arg(long, default_value_t = 4096, value_name = "KIB")]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub gpu: crate::gpu_env::GpuArgs,
    /// The control socket `keling launch` and `keling status` use (root only).
    #[arg(long, default_value = control::DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Write one JSON line per task state transition here.
    #[arg(long, value_name = "FILE")]
    pub sched_log: Option<PathBuf>,
    /// Write every scheduler input here (JSON lines), to replay decisions.
    #[arg(long, value_name = "FILE")]
    pub input_log: Option<PathBuf>,
    /// How tasks may run at once on one GPU.
    #[arg(long, default_value_t = 1)]
    pub slots: u32,
    /// Decision timeout model: static (mean + 3 sigma) or adaptive (p99 x 1.2).
    #[arg(long, value_enum, default_value_t = TimeoutModelArg::Adaptive)]
    pub timeout_model: TimeoutModelArg,
    /// Priority of launched tasks that do not give one.
    #[arg(long, default_value_t = 8)]
    pub default_priority: u8,
    /// Default session duration limit, ms.
    #[arg(long, env = "KELING_MAX_DURATION_MS", default_value_t = 3_600_000)]
    pub max_duration_ms: u64,
    /// Default warning window before the limit, ms.
    #[arg(long, env = "KELING_GRACE_PERIOD_MS", default_value_t = 30_000)]
    pub grace_period_ms: u64,
    /// Kill at the limit (true) or SIGTERM first (false).
    #[arg(long, env = "KELING_HARD_KILL", default_value_t = true, action = clap::ArgAction::Set)]
    pub hard_kill: bool,
    /// A task is idle after this long without GPU calls or CPU time, ms.
    #[arg(long, default_value_t = 300)]
    pub idle_timeout_ms: u64,
    /// Rules (TOML) that give GPU processes priorities, GPUs, quotas and limits;
    /// the agent refuses to start on an invalid file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeoutModelArg {
    Static,
    Adaptive,
}

#[derive(Default)]
struct Counters {
    forks: u64,
    execs: u64,
    exits: u64,
    switches: u64,
    gpu: u64,
    decode_errors: u64,
}

impl Counters {
    fn count(&mut self, event: &Event) {
        match event {
            Event::Fork(_) => self.forks += 1,
            Event::Exec(_) => self.execs += 1,
            Event::Exit(_) => self.exits += 1,
            Event::Switch(_) => self.switches += 1,
            Event::GpuFile(_) | Event::Gpu(_) => self.gpu += 1,
        }
    }
}

fn gpu_line(acc: &crate::probes::GpuAccounting) -> String {
    let holders = acc
        .totals
        .iter()
        .filter(|((pid, gpu), t)| *pid != 0 && *gpu == keling_common::ALL_GPUS && t.bytes > 0)
        .count();
    let per_gpu: Vec<String> = acc
        .totals
        .iter()
        .filter(|((pid, gpu), _)| *pid == 0 && *gpu < keling_common::NO_GPU)
        .map(|((_, gpu), t)| {
            format!(
                "gpu{gpu} {} MiB (peak {} MiB)",
                t.bytes >> 20,
                t.peak_bytes >> 20
            )
        })
        .collect();
    let undecoded: u64 = acc.undecoded_per_reason.iter().sum();
    if per_gpu.is_empty() {
        return "; no GPU memory seen yet".into();
    }
    format!(
        "; GPU memory: {} held by {holders} processes; {undecoded} calls undecoded",
        per_gpu.join(", ")
    )
}

fn status_line(started: Instant, c: &Counters, drops: u64, tracked: usize) -> String {
    format!(
        "keling: up {}s, processes seen: {} forks, {} execs, {} exits; {} switches and {} GPU events traced; \
         {tracked} tracked; {drops} events lost; {} undecodable",
        started.elapsed().as_secs(),
        c.forks,
        c.execs,
        c.exits,
        c.switches,
        c.gpu,
        c.decode_errors
    )
}

/// GPU capacities: from the simulated driver's state file, else NVML.
fn gpu_infos(dev_dir: &std::path::Path) -> Vec<GpuInfo> {
    if let Ok(text) = std::fs::read_to_string(dev_dir.join("nvsim-state.json"))
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
    {
        return v["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| {
                Some(GpuInfo {
                    index: g["index"].as_u64()? as u32,
                    capacity_bytes: g["capacity_bytes"].as_u64()?,
                })
            })
            .collect();
    }
    let nvml = nvml_wrapper::Nvml::init();
    if let Ok(nvml) = nvml {
        let n = nvml.device_count().unwrap_or(0);
        return (0..n)
            .filter_map(|i| {
                let mem = nvml.device_by_index(i).ok()?.memory_info().ok()?;
                Some(GpuInfo {
                    index: i,
                    capacity_bytes: mem.total,
                })
            })
            .collect();
    }
    Vec::new()
}

/// Binds the control socket in a directory only root can enter.
fn bind_socket(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another keling agent is already listening on {}",
                path.display()
            );
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let file_config = match &args.config {
        Some(path) => crate::sched::config::Config::load(path)?,
        None => crate::sched::config::Config::default(),
    };
    crate::sys::check_privileges()?;
    // Whatever a previous agent left frozen or stopped runs again first.
    let thawed = cgroup::thaw_all();
    if thawed > 0 {
        log::warn!("thawed {thawed} task(s) a previous keling run left frozen or stopped");
    }
    // The fail-safe, forked before any thread or probe exists.
    let guard = supervisor::spawn()?;
    args.gpu.check_dev_dir()?;
    let driver_major = args.gpu.driver_major()?;
    let mut probes = Probes::load(&LoadOptions {
        system_wide: true,
        ringbuf_bytes: args.ringbuf_kib.saturating_mul(1024),
        dev_dir: args.gpu.dev_dir.clone(),
        driver_major,
    })?;
    probes.adopt_existing_fds(&args.gpu.dev_dir, None, true)?;
    let mut gpus = gpu_infos(&args.gpu.dev_dir);
    if gpus.is_empty() {
        gpus = file_config.gpus.clone();
    }
    if gpus.is_empty() {
        log::info!(
            "no GPU capacities known (no NVML, no simulator): memory pressure is not scheduled"
        );
    }
    let config = SchedConfig {
        gpus,
        slots_per_gpu: args.slots.max(1),
        idle_timeout_ms: args.idle_timeout_ms,
        default_max_duration_ms: args.max_duration_ms,
        default_grace_ms: args.grace_period_ms,
        default_hard_kill: args.hard_kill,
        ..SchedConfig::default()
    };
    let model = match args.timeout_model {
        TimeoutModelArg::Static => ModelKind::Static,
        TimeoutModelArg::Adaptive => ModelKind::Adaptive,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let (confirm_tx, mut confirm_rx) = tokio::sync::mpsc::unbounded_channel::<Confirmation>();
        let mut daemon = Daemon::new(
            Scheduler::new(config),
            LatencyRecorder::new(model),
            args.sched_log.clone(),
            args.input_log.clone(),
            confirm_tx,
            file_config,
        )?;
        let listener = bind_socket(&args.socket)?;
        let mut ring = crate::sys::async_fd(probes.take_events()?)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigchld = signal(SignalKind::child())?;
        let period = Duration::from_secs(args.status_interval.max(1));
        let mut status = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // Scheduler clock, and the drain of detail events (they do not wake us).
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let started = Instant::now();
        let mut c = Counters::default();
        eprintln!(
            "keling: ready: probes attached, watching every process; control socket {} (Ctrl-C to stop)",
            args.socket.display()
        );
        loop {
            let mut track = |pid: u32| probes_track(&mut probes, pid);
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    while let Some(item) = guard.get_inner_mut().next() {
                        match decode::decode(&item) {
                            Ok(event) => { c.count(&event); daemon.on_event(&event); }
                            Err(_) => c.decode_errors += 1,
                        }
                    }
                    guard.clear_ready();
                }
                _ = tick.tick() => {
                    while let Some(item) = ring.get_mut().next() {
                        match decode::decode(&item) {
                            Ok(event) => { c.count(&event); daemon.on_event(&event); }
                            Err(_) => c.decode_errors += 1,
                        }
                    }
                    daemon.tick();
                }
                Some(conf) = confirm_rx.recv() => daemon.confirmed(conf),
                _ = sigchld.recv() => reap(&mut daemon),
                accepted = listener.accept() => {
                    let (stream, _) = accepted?;
                    if let Err(e) = serve(stream, &mut daemon, &mut track, args.default_priority).await {
                        log::warn!("control request failed: {e:#}");
                    }
                }
                _ = status.tick(), if args.status_interval > 0 => {
                    let drops = probes.drops_per_cpu()?.iter().sum();
                    let gpu = gpu_line(&probes.gpu_accounting()?);
                    eprintln!("{}{gpu}", status_line(started, &c, drops, probes.tracked_processes()?));
                }
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
            }
        }
        daemon.shutdown();
        let _ = std::fs::remove_file(&args.socket);
        let drops = probes.drops_per_cpu()?.iter().sum();
        eprintln!("{} (stopped)", status_line(started, &c, drops, probes.tracked_processes()?));
        anyhow::Ok(0)
    });
    drop(guard);
    result
}

fn probes_track(probes: &mut Probes, pid: u32) -> anyhow::Result<()> {
    probes.track(pid, pid)
}

/// Reaps every child that ended and tells the daemon.
fn reap(daemon: &mut Daemon) {
    loop {
        let mut status = 0;
        // SAFETY: reaping our own children without blocking.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        daemon.exited(pid as u32, ExitStatus::from_wait_status(status as u32));
    }
}

/// One control connection: a launch (answered now and at the task's exit) or a
/// status request.
async fn serve(
    stream: tokio::net::UnixStream,
    daemon: &mut Daemon,
    track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    default_priority: u8,
) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncWriteExt;
    let (bytes, fds) = loop {
        stream.readable().await?;
        match control::recv_with_fds(stream.as_raw_fd()) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => break other?,
        }
    };
    let (read, mut write) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if !text.ends_with('\n') {
        reader.read_line(&mut text).await?;
    }
    let request: Request = serde_json::from_str(text.trim()).context("bad control request")?;
    match request {
        Request::Status(_) => {
            let line = format!("{}\n", daemon.status_json());
            write.write_all(line.as_bytes()).await?;
        }
        Request::Export(format) => {
            let reply = match daemon.export(&format) {
                Ok(text) => serde_json::json!({ "export": text }),
                Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
            };
            write.write_all(format!("{reply}\n").as_bytes()).await?;
        }
        Request::Launch(req) => {
            match daemon.launch(&req, &fds, track, default_priority) {
                Ok((id, gpu, pid)) => {
                    log::info!("task {id}: pid {pid} {:?} on GPU {gpu:?}", req.argv);
                    let line = format!(
                        "{}\n",
                        serde_json::json!({"accepted": {"task": id, "gpu": gpu, "pid": pid}})
                    );
                    write.write_all(line.as_bytes()).await?;
                    // Exits are handled in the same loop, after this returns.
                    daemon.set_reply(id, write);
                }
                Err(e) => {
                    let line = format!("{}\n", serde_json::json!({"error": format!("{e:#}")}));
                    write.write_all(line.as_bytes()).await?;
                }
            }
        }
    }
    Ok(())
}
