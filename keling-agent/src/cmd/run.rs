//! `keling run`: the long-running agent. It watches every process's lifecycle,
//! tracks every process that opens an NVIDIA device, and runs the scheduler over
//! the tasks launched through its control socket (`keling launch`).
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use keling_sched::{GpuInfo, SchedConfig, Scheduler};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use crate::{
    bpf::{LoadOptions, Probes, programs::Feature},
    control::{self, server},
    defaults,
    event::{
        EventStream,
        decode::{Event, ExitStatus},
    },
    gpu::{env::GpuArgs, stats::GpuAccounting},
    latency::{LatencyRecorder, ModelKind},
    sched::{
        cgroup,
        config::Config,
        daemon::{Confirmation, Daemon, DaemonSettings},
        log::Logs,
        supervisor,
    },
};

/// What the agent cannot do without: seeing processes and their GPU memory.
const REQUIRED: &[Feature] = &[
    Feature::ProcessLifecycle,
    Feature::NvidiaFiles,
    Feature::NvidiaIoctls,
];

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Seconds between status lines on standard error (0: only the final one).
    #[arg(long, default_value_t = defaults::STATUS_INTERVAL_S, value_name = "SECS")]
    pub status_interval: u64,
    /// Size of the kernel ring buffer in KiB (a power of two, at least 4).
    #[arg(long, default_value_t = defaults::RINGBUF_KIB, value_name = "KIB")]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// A GPU's memory capacity, as INDEX=BYTES (repeat for each GPU). Memory
    /// pressure needs it; default: NVML's, or the config file's `[[gpu]]` tables.
    #[arg(long = "gpu-capacity", value_name = "INDEX=BYTES", value_parser = parse_capacity)]
    pub gpu_capacity: Vec<GpuInfo>,
    /// The control socket `keling launch` and `keling status` use (root only).
    #[arg(long, default_value = control::DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Write one JSON line per task state transition here.
    #[arg(long, value_name = "FILE")]
    pub sched_log: Option<PathBuf>,
    /// Write every scheduler input here (JSON lines), to replay decisions.
    #[arg(long, value_name = "FILE")]
    pub input_log: Option<PathBuf>,
    /// How many tasks may run at once on one GPU.
    #[arg(long, default_value_t = defaults::SLOTS_PER_GPU)]
    pub slots: u32,
    /// Decision timeout model.
    #[arg(long, value_enum, default_value_t = ModelKind::Adaptive)]
    pub timeout_model: ModelKind,
    /// Priority of tasks that neither `keling launch` nor a config rule gives one
    /// (launched and adopted alike).
    #[arg(long, default_value_t = defaults::PRIORITY, value_parser = clap::value_parser!(u8).range(0..=15))]
    pub default_priority: u8,
    /// Default session duration limit, ms.
    #[arg(long, env = "KELING_MAX_DURATION_MS", default_value_t = defaults::MAX_DURATION_MS)]
    pub max_duration_ms: u64,
    /// Default warning window before the limit, ms.
    #[arg(long, env = "KELING_GRACE_PERIOD_MS", default_value_t = defaults::GRACE_PERIOD_MS)]
    pub grace_period_ms: u64,
    /// Kill at the limit (true) or SIGTERM first (false).
    #[arg(long, env = "KELING_HARD_KILL", default_value_t = true, action = clap::ArgAction::Set)]
    pub hard_kill: bool,
    /// A task is idle after this long without GPU calls or CPU time, ms.
    #[arg(long, default_value_t = defaults::IDLE_TIMEOUT_MS)]
    pub idle_timeout_ms: u64,
    /// Rules (TOML) that give GPU processes priorities, GPUs, quotas and limits;
    /// the agent refuses to start on an invalid file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn parse_capacity(s: &str) -> Result<GpuInfo, String> {
    let (index, bytes) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected INDEX=BYTES, e.g. 0=85899345920"))?;
    Ok(GpuInfo {
        index: index
            .trim()
            .parse()
            .map_err(|e| format!("GPU index {index:?}: {e}"))?,
        capacity_bytes: bytes
            .trim()
            .parse()
            .map_err(|e| format!("capacity {bytes:?}: {e}"))?,
    })
}

#[derive(Default)]
struct Counters {
    forks: u64,
    execs: u64,
    exits: u64,
    switches: u64,
    gpu: u64,
}

impl Counters {
    fn count(&mut self, event: &Event) {
        match event {
            Event::Fork(_) => self.forks += 1,
            Event::Exec(_) => self.execs += 1,
            Event::Exit(_) => self.exits += 1,
            Event::Switch(_) => self.switches += 1,
            _ => self.gpu += 1,
        }
    }
}

fn gpu_line(acc: &GpuAccounting) -> String {
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

fn status_line(
    started: Instant,
    c: &Counters,
    decode_errors: u64,
    drops: u64,
    tracked: usize,
) -> String {
    format!(
        "keling: up {}s, processes seen: {} forks, {} execs, {} exits; {} switches and {} GPU events traced; \
         {tracked} tracked; {drops} events lost; {} undecodable",
        started.elapsed().as_secs(),
        c.forks,
        c.execs,
        c.exits,
        c.switches,
        c.gpu,
        decode_errors
    )
}

/// GPU capacities: the flag, else the config file, else NVML.
fn gpu_infos(args: &RunArgs, config: &Config) -> Vec<GpuInfo> {
    if !args.gpu_capacity.is_empty() {
        return args.gpu_capacity.clone();
    }
    if !config.gpus.is_empty() {
        return config.gpus.clone();
    }
    crate::gpu::nvml::capacities()
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
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    crate::os::check_privileges()?;
    // Whatever a previous agent left frozen or stopped runs again first.
    let thawed = cgroup::thaw_all();
    if thawed > 0 {
        log::warn!("thawed {thawed} task(s) a previous keling run left frozen or stopped");
    }
    // The fail-safe, forked before any thread or probe exists.
    let guard = supervisor::spawn()?;
    let mut probes = Probes::load(&LoadOptions::new(
        &args.gpu,
        true,
        args.ringbuf_kib,
        REQUIRED,
    )?)?;
    probes.adopt_existing_fds(None, true)?;
    let gpus = gpu_infos(&args, &file_config);
    if gpus.is_empty() {
        log::info!(
            "no GPU capacities known (no --gpu-capacity, config [[gpu]] or NVML): \
             memory pressure is not scheduled"
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let (confirm_tx, mut confirm_rx) = mpsc::unbounded_channel::<Confirmation>();
        let mut daemon = Daemon::new(
            Scheduler::new(config),
            LatencyRecorder::new(args.timeout_model),
            Logs::open(args.sched_log.as_deref(), args.input_log.as_deref())?,
            confirm_tx,
            file_config,
            DaemonSettings {
                default_priority: args.default_priority,
            },
        )?;
        let (request_tx, mut requests) = mpsc::channel(64);
        server::spawn(bind_socket(&args.socket)?, request_tx);
        let mut events = EventStream::new(probes.take_events()?)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigchld = signal(SignalKind::child())?;
        let period = Duration::from_secs(args.status_interval.max(1));
        let mut status = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // Scheduler clock, and the drain of detail events (they do not wake us).
        let mut tick = tokio::time::interval(Duration::from_millis(defaults::RUN_TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let started = Instant::now();
        let mut c = Counters::default();
        eprintln!(
            "keling: ready: probes attached, watching every process; control socket {} (Ctrl-C to stop)",
            args.socket.display()
        );
        loop {
            tokio::select! {
                ready = events.ready() => {
                    if let Err(e) = ready {
                        log::warn!("event ring buffer: {e}");
                    }
                    events.drain(|e| { c.count(e); daemon.on_event(e); });
                }
                _ = tick.tick() => {
                    events.drain(|e| { c.count(e); daemon.on_event(e); });
                    daemon.tick();
                }
                Some(conf) = confirm_rx.recv() => daemon.confirmed(conf),
                _ = sigchld.recv() => {
                    while let Some((pid, status)) = crate::os::reap_any() {
                        daemon.exited(pid, ExitStatus::from_wait_status(status));
                    }
                }
                Some(incoming) = requests.recv() => {
                    daemon.handle(incoming, &mut |pid| probes.track(pid, pid));
                }
                _ = status.tick(), if args.status_interval > 0 => {
                    eprintln!("{}", status_report(&probes, started, &c, events.decode_errors));
                }
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
            }
        }
        daemon.shutdown();
        let _ = std::fs::remove_file(&args.socket);
        eprintln!("{} (stopped)", status_report(&probes, started, &c, events.decode_errors));
        anyhow::Ok(0)
    });
    drop(guard);
    result
}

/// The periodic status line; a failure to read the maps is shown, not fatal.
fn status_report(probes: &Probes, started: Instant, c: &Counters, decode_errors: u64) -> String {
    let read = || -> anyhow::Result<String> {
        let drops = probes.drops_per_cpu()?.iter().sum();
        let gpu = gpu_line(&probes.gpu_accounting()?);
        Ok(format!(
            "{}{gpu}",
            status_line(
                started,
                c,
                decode_errors,
                drops,
                probes.tracked_processes()?
            )
        ))
    };
    read().unwrap_or_else(|e| format!("keling: status unavailable: {e:#}"))
}
