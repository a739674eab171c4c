//! `keling run`: the long-running agent. It watches every process's lifecycle,
//! tracks every process that opens an NVIDIA device, and runs the scheduler over
//! the tasks launched through its control socket (`keling launch`).
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use keling_sched::{GpuInfo, Policy, SchedConfig, Scheduler};
use tokio::{
    net::{TcpListener, UnixListener},
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use crate::{
    agent_loop::{Agent, HistoLog, Inputs, Settings as LoopSettings},
    bpf::{LoadOptions, Probes, programs::Feature},
    cmd::replay::BindingArg,
    cmd::values::SharingArg,
    control::server,
    defaults,
    event::EventStream,
    gpu::env::GpuArgs,
    latency::{LatencyRecorder, ModelKind},
    log_format::{INPUT_LOG_VERSION, InputLogHeader},
    os::lock::{InstanceLock, LockError},
    prometheus::http,
    sched::{
        access::AccessPolicy,
        cgroup,
        config::Config,
        daemon::{Daemon, DaemonSettings, restart},
        host::{RealHost, Wake},
        log_writer::Logs,
        supervisor,
        worker::Confirmation,
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
    #[arg(long = "gpu-capacity", value_name = "INDEX=BYTES", value_parser = super::values::gpu_capacity)]
    pub gpu_capacity: Vec<GpuInfo>,
    /// The control socket `keling launch` and `keling status` use (root and the
    /// members of the config's `[access] group`, default `keling`).
    /// Default: the instance's (`/run/keling/keling.sock`, or
    /// `/run/keling/NAME/keling.sock` with `--instance NAME`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Write one JSON line per task state transition here.
    #[arg(long, value_name = "FILE")]
    pub sched_log: Option<PathBuf>,
    /// Write every scheduler input here (JSON lines), to replay decisions.
    #[arg(long, value_name = "FILE")]
    pub input_log: Option<PathBuf>,
    /// How the tasks placed on one GPU share it. `memory` (default): every task
    /// whose memory fits runs at once: its budget (`--mem-quota`), or without
    /// one what it holds and has peaked at, against the GPU's capacity less the
    /// memory held by processes in no task; one that does not fit waits. A
    /// higher priority that works still freezes the lower ones on its GPU (they
    /// keep their memory) and gets memory by evicting lower priorities. `slots`:
    /// at most `--slots` tasks run at once whatever they hold (the time-slice
    /// model of Keling before 0.x; `--slots 1` runs one task per GPU).
    #[arg(long, value_enum, default_value_t = defaults::SHARING.into(), value_name = "SHARING")]
    pub sharing: SharingArg,
    /// How many tasks may run at once on one GPU: a cap under `--sharing
    /// memory` (0: none), the number of slots under `--sharing slots` (0 counts
    /// as 1). Equal priorities take turns by time slice only while a cap makes
    /// one of them wait.
    #[arg(long, default_value_t = defaults::SLOTS_PER_GPU)]
    pub slots: u32,
    /// When a launched task that names no GPU is bound to one. `late`
    /// (default): it waits unbound, held before exec, in one host-level queue
    /// (priority, then arrival) and is bound when a GPU can run it (its memory
    /// fits there), so no GPU idles while a task that could run there waits;
    /// its CUDA_VISIBLE_DEVICES is set then. `at-arrival`: placed by weight as
    /// it arrives and frozen there if it must wait, even while another GPU is
    /// free. Adopted processes and launches given `--gpu` run where they are.
    #[arg(long, value_enum, default_value_t = BindingArg::Late, value_name = "BINDING")]
    pub binding: BindingArg,
    /// Late binding: the seed of the last tie-break between equally good free
    /// GPUs (the input log records it, so a replay decides the same).
    #[arg(long, default_value_t = 0, value_name = "SEED")]
    pub placement_seed: u64,
    /// The first design article's overload rule (off by default): truncate a
    /// running session (a 4004 record to its owner, then the kill or SIGTERM of
    /// `--hard-kill`) when at once it has run more than
    /// `--overload-session-ms` since it arrived, its GPU's memory in use peaked
    /// at `--overload-mem-pct` % of capacity or more during it, and at least
    /// `--overload-waiting` tasks wait for that GPU. Without this flag, the
    /// config file's `[overload]` section (if any) turns it on with its own
    /// thresholds.
    #[arg(long)]
    pub overload: bool,
    /// The overload rule's session threshold, ms (the article's 200).
    #[arg(long, default_value_t = keling_sched::DEFAULT_OVERLOAD_SESSION_MS, value_name = "MS")]
    pub overload_session_ms: u64,
    /// The overload rule's memory threshold, % of the GPU's capacity (the article's 95).
    #[arg(long, default_value_t = keling_sched::DEFAULT_OVERLOAD_MEM_PEAK_PCT, value_name = "PCT",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub overload_mem_pct: u32,
    /// The overload rule's queue threshold: tasks waiting for the GPU (the article's 8).
    #[arg(long, default_value_t = keling_sched::DEFAULT_OVERLOAD_MIN_WAITING, value_name = "N")]
    pub overload_waiting: u32,
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
    /// The fail-safe thaws and continues everything when the agent sends no
    /// heartbeat for this long (stopped, hung, starved), as it does when it dies, ms.
    #[arg(long, default_value_t = defaults::WATCHDOG_MS, value_name = "MS")]
    pub watchdog_ms: u64,
    /// SCHED_FIFO priority of the actuation thread and the fail-safe, 1-99 (0: the
    /// ordinary class; thaws of busy tasks are then much slower).
    #[arg(long, default_value_t = defaults::ACTUATOR_RT_PRIORITY, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub actuator_priority: u8,
    /// SCHED_FIFO priority of the event loop (the thread that reads the kernel's
    /// events, decides and answers clients), 1-99, below the actuation thread's;
    /// 0: the ordinary class, where a host busy on every CPU delays the events
    /// behind a freeze by its time slices (tens of ms). The kernel's real-time
    /// throttling still leaves other tasks 5% of each CPU.
    #[arg(long, default_value_t = defaults::LOOP_RT_PRIORITY, value_parser = clap::value_parser!(u8).range(0..=99))]
    pub loop_priority: u8,
    /// Do not boost freezes. By default, just before a launched task's cgroup is
    /// frozen, each of its threads in the ordinary classes is raised to SCHED_FIFO
    /// 1 (reset on fork) so that it runs at once and enters the freezer, and is put
    /// back as it was (class, nice, flags, slice) as soon as the freeze shows, times
    /// out or fails, or a thaw comes first. On a host busy on every CPU this takes
    /// the freeze of a 16-thread busy task on 2 CPUs from 5.7 ms to 0.3 ms (p50,
    /// measured). The price: for that instant (at most the freeze's timeout) the
    /// task's threads run ahead of every ordinary thread on the host (not of
    /// Keling's, nor of other real-time ones). If the agent dies or stalls
    /// mid-freeze, the fail-safe puts them back before it thaws them (from a record
    /// in /run/keling/boosted). Off anyway with `--actuator-priority 0`.
    #[arg(long = "no-freeze-boost", action = clap::ArgAction::SetFalse)]
    pub freeze_boost: bool,
    /// Only one agent runs at a time: it holds this lock (a second one exits at once
    /// and touches nothing). Default: the instance's (`/run/keling/keling.lock`, or
    /// `/run/keling/NAME/keling.lock` with `--instance NAME`).
    #[arg(long, value_name = "PATH")]
    pub lock: Option<PathBuf>,
    /// Finished tasks stay in `keling status` this long, s.
    #[arg(long, default_value_t = defaults::ARCHIVE_RETENTION_S, value_name = "SECS")]
    pub archive_retention_s: u64,
    /// At most this many finished tasks are kept (those that finished first are
    /// forgotten first), whatever `--archive-retention-s` says: a burst of short
    /// tasks costs a bounded archive, and `keling status` stays small.
    #[arg(long, default_value_t = defaults::ARCHIVE_MAX, value_name = "N")]
    pub archive_max: usize,
    /// The scheduling log and the input log each rotate at this size (one old file
    /// kept, `FILE.1`), MiB; 0: never.
    #[arg(long, default_value_t = defaults::LOG_MAX_MIB, value_name = "MIB")]
    pub log_max_mib: u64,
    /// Append the decision-latency histograms to this HdrHistogram interval log
    /// (the standard format, V2 compressed) every `--histo-interval`, so they outlive
    /// the agent. Appended to, never truncated: each start adds a header. Read it
    /// with `keling histo export FILE` and `keling histo tune FILE`.
    #[arg(long, value_name = "FILE")]
    pub histo_log: Option<PathBuf>,
    /// Seconds per interval of `--histo-log` (1 lets `keling histo tune` replay the
    /// timeout models exactly as the agent ran them).
    #[arg(long, default_value_t = defaults::HISTO_INTERVAL_S, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub histo_interval: u64,
    /// Slurm: drain this node while GPU memory is held outside Slurm's jobs
    /// (one GiB or more on a GPU), resume it once that is gone (`scontrol`, as
    /// Slurm's commands find the controller: `SLURM_CONF`, else the default
    /// config). The node is named by `--slurm-node`, else the instance's name,
    /// else the host's (docs/slurm.md).
    #[arg(long)]
    pub slurm_report: bool,
    /// Slurm: this node's name (implies `--slurm-report`).
    #[arg(long, value_name = "NAME", value_parser = crate::slurm::gres::parse_node_name)]
    pub slurm_node: Option<String>,
    /// Serve Prometheus `/metrics` on this address (host:port, port 0: any free
    /// one, said at start); `off`: serve none. Only a loopback address unless
    /// `--metrics-public`.
    #[arg(long, default_value = defaults::METRICS_ADDR, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
    /// Let `--metrics-addr` be an address other hosts can reach: anyone who can
    /// connect then sees every GPU process's pid, command, user and memory.
    #[arg(long)]
    pub metrics_public: bool,
    /// An exited process leaves `/metrics` this long after its exit (unless the
    /// driver still holds memory charged to it), s.
    #[arg(long, default_value_t = defaults::METRICS_GRACE_S, value_name = "SECS")]
    pub metrics_grace_s: u64,
    /// Run as the fail-safe (the agent starts it so; fds 3 and 4 are its pipes).
    #[arg(long, hide = true)]
    pub fail_safe: bool,
}

/// `--metrics-addr`: an address, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    Off,
    At(SocketAddr),
}

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr::Off);
    }
    s.parse().map(MetricsAddr::At).map_err(|e| {
        format!("{s:?}: {e}: expected IP:PORT (e.g. 127.0.0.1:9475, [::1]:9475) or `off`")
    })
}

/// Refuses a `--metrics-addr` other hosts can reach unless `--metrics-public`.
fn check_metrics_addr(addr: MetricsAddr, public: bool) -> anyhow::Result<()> {
    match addr {
        MetricsAddr::At(a) if !a.ip().is_loopback() && !public => anyhow::bail!(
            "--metrics-addr {a} is reachable from other hosts, and /metrics shows every GPU \
             process's pid, command, user and memory: add --metrics-public to mean it, or use \
             127.0.0.1:PORT"
        ),
        _ => Ok(()),
    }
}

/// Binds the metrics listener (before anything on the host is touched, so that a
/// port in use stops the agent at once with a clear word).
fn bind_metrics(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!(
            "serve /metrics on {addr} (choose another with --metrics-addr, or `--metrics-addr off`)"
        )
    })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
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

/// Binds the control socket. A socket at its path is stale (this agent holds the
/// instance lock) and is replaced; anything else there is refused, never removed. The socket, and a directory the agent creates for it (or the
/// default one), let in root and the access group only.
fn bind_socket(path: &Path, access: &AccessPolicy) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let gid = access.group.as_ref().map(|(_, gid)| *gid);
    let chown = |p: &Path| -> anyhow::Result<()> {
        std::os::unix::fs::chown(p, Some(0), Some(gid.unwrap_or(0)))
            .with_context(|| format!("chown {}", p.display()))
    };
    let (dir_mode, sock_mode) = if gid.is_some() {
        (0o750, 0o660)
    } else {
        (0o700, 0o600)
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let ours = !dir.exists() || dir == crate::instance::current().run_dir();
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        if ours {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))?;
            chown(dir)?;
        }
    }
    // A socket there is stale; anything else is someone's file, and is kept.
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(path)
                .with_context(|| format!("remove the stale socket {}", path.display()))?;
        }
        Ok(m) => anyhow::bail!(
            "--socket {}: there is a {} there, not a socket: Keling removes only a stale \
             socket; move it away or give another path",
            path.display(),
            if m.file_type().is_symlink() {
                "symbolic link"
            } else if m.is_dir() {
                "directory"
            } else {
                "file"
            }
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("look at {}", path.display())),
    }
    let listener = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(sock_mode))?;
    chown(path)?;
    Ok(listener)
}

/// Who may connect, as the server asks it.
fn admit(access: &AccessPolicy) -> server::Admit {
    let access = access.clone();
    Arc::new(move |c| {
        if access.may_connect(c) {
            return Ok(());
        }
        Err(match &access.group {
            Some((name, _)) => format!(
                "uid {} may not use the Keling agent: only root and the members of group {name} may",
                c.uid
            ),
            None => format!(
                "uid {} may not use the Keling agent: only root may (there is no `keling` group, \
                 and the config names no [access] group)",
                c.uid
            ),
        })
    })
}

/// The scheduler core's config from `keling run`'s flags and the GPUs found.
/// With every flag at its default it is [`defaults::sched_config`] with `gpus`
/// (`keling replay --synthetic`'s default run relies on it; a test checks).
pub(crate) fn sched_config(args: &RunArgs, gpus: Vec<GpuInfo>) -> SchedConfig {
    SchedConfig {
        gpus,
        slots_per_gpu: args.slots,
        sharing: args.sharing.into(),
        overload: args.overload.then_some(keling_sched::OverloadRule {
            min_session_ms: args.overload_session_ms,
            mem_peak_pct: args.overload_mem_pct,
            min_waiting: args.overload_waiting,
        }),
        idle_timeout_ms: args.idle_timeout_ms,
        default_max_duration_ms: args.max_duration_ms,
        default_grace_ms: args.grace_period_ms,
        default_hard_kill: args.hard_kill,
        binding: args.binding.into(),
        placement_seed: args.placement_seed,
        ..SchedConfig::default()
    }
}

pub fn run(mut args: RunArgs) -> anyhow::Result<i32> {
    let failsafe_settings = supervisor::Settings {
        watchdog: Duration::from_millis(args.watchdog_ms.max(1)),
        rt_priority: args.actuator_priority,
    };
    if args.fail_safe {
        supervisor::supervise(failsafe_settings);
    }
    let file_config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::parse("").map_err(|(_, what)| anyhow::anyhow!("{what}"))?,
    };
    check_metrics_addr(args.metrics_addr, args.metrics_public)?;
    crate::os::check_privileges()?;
    // One agent at a time: taken before anything that touches the host.
    let instance = crate::instance::current();
    let lock_path = args.lock.clone().unwrap_or_else(|| instance.lock());
    let socket = args.socket.take().unwrap_or_else(|| instance.socket());
    let _lock = match InstanceLock::acquire(&lock_path) {
        Ok(lock) => lock,
        Err(e @ LockError::Held { .. }) => anyhow::bail!(
            "{e}: one agent runs at a time. This one stopped before touching anything \
             (stop the other first, or use `keling status` to talk to it)"
        ),
        Err(e) => return Err(e.into()),
    };
    let metrics_listener = match args.metrics_addr {
        MetricsAddr::At(addr) => Some(bind_metrics(addr)?),
        MetricsAddr::Off => None,
    };
    let nofile = crate::os::raise_nofile();
    log::debug!("open files limit {nofile}");
    // Whatever earlier runs left frozen, stopped or behind runs again or goes.
    let left = cgroup::clean_leftovers();
    if left != cgroup::Leftovers::default() {
        log::warn!(
            "an earlier keling run left {} empty task cgroup(s) (removed), {} with processes still \
             running (thawed, left alone), {} stopped process(es) (continued) and {} thread(s) \
             raised by a freeze boost (put back)",
            left.removed,
            left.still_running,
            left.continued,
            left.unboosted
        );
    }
    let mut load = LoadOptions::new(&args.gpu, true, args.ringbuf_kib, REQUIRED)?;
    // The scheduler needs to know a task works, not each of its switches and calls.
    load.active_interval_ns = defaults::active_interval_ns(args.idle_timeout_ms);
    // Restart without loss (sched/daemon/restart.rs): an earlier run's tasks, its books.
    let records = restart::read_records(instance);
    let pins = restart::pins(instance, restart::any_alive(&records));
    load.pin_dir = pins.as_ref().map(|p| p.dir.clone());
    let mut probes = Probes::load(&load)?;
    probes.adopt_existing_fds(None, true)?;
    let gpus = gpu_infos(&args, &file_config);
    if gpus.is_empty() {
        log::info!(
            "no GPU capacities known (no --gpu-capacity, config [[gpu]] or NVML): \
             memory pressure is not scheduled"
        );
    }
    match &file_config.access_policy.group {
        Some((name, gid)) => log::info!("control socket: root and group {name} ({gid})"),
        None => log::info!("control socket: root only (no `keling` group and no [access] group)"),
    }
    let capacities = gpus.clone();
    let mut config = sched_config(&args, gpus);
    // Without --overload, the config file's [overload] section.
    config.overload = config.overload.or_else(|| file_config.overload_rule());
    if config.binding == keling_sched::Binding::Late {
        if config.gpus.is_empty() {
            log::warn!(
                "late binding without a GPU list (no --gpu-capacity, config [[gpu]] or NVML): \
                 every launched task is bound to GPU 0, one at a time per slot"
            );
        } else {
            log::info!(
                "late binding: unpinned launches wait unbound for one of {} GPU(s)",
                config.gpus.len()
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if args.loop_priority > 0 {
        // This thread runs the event loop (a current-thread runtime). Threads and
        // processes it starts from now on do not inherit the class (reset on fork).
        match crate::os::set_thread_realtime(args.loop_priority) {
            Ok(()) => log::info!(
                "event loop in the real-time class (SCHED_FIFO {})",
                args.loop_priority
            ),
            Err(e) => log::warn!(
                "event loop: SCHED_FIFO {} refused ({e}); running in the ordinary class \
                 (decisions are slower on a busy host)",
                args.loop_priority
            ),
        }
    }
    // A Slurm job's notices read as `keling launch` prints them.
    crate::slurm::job::set_notice_text(|n| super::launch::notice_line(n, false));
    let slurm_report = slurm_report(&args)?;
    runtime.block_on(async move {
        // The fail-safe, before anything can be frozen.
        let failsafe = supervisor::spawn(failsafe_settings)?;
        let (confirm_tx, confirm_rx) = mpsc::unbounded_channel::<Confirmation>();
        let (wake_tx, wake_rx) = mpsc::unbounded_channel::<Wake>();
        let access = file_config.access_policy.clone();
        let mut logs = Logs::open_bounded(
            args.sched_log.as_deref(),
            args.input_log.as_deref(),
            args.log_max_mib.saturating_mul(1 << 20),
        )?;
        logs.input_header(&InputLogHeader {
            keling_input_log: INPUT_LOG_VERSION,
            policy: Policy::Hybrid,
            config: config.clone(),
            core_rules: Some(keling_sched::RULES_REVISION),
        });
        let host = RealHost::new(
            args.actuator_priority,
            args.freeze_boost,
            confirm_tx,
            wake_tx,
        )?;
        let mut daemon = Daemon::new(
            Scheduler::new(config),
            LatencyRecorder::new(args.timeout_model),
            logs,
            file_config,
            DaemonSettings {
                default_priority: args.default_priority,
                archive_retention_ns: args.archive_retention_s.saturating_mul(1_000_000_000),
                archive_max: args.archive_max,
            },
            Box::new(host),
        );
        restart::take_back_at_start(&mut daemon, &mut probes, instance, records, pins.as_ref());
        let histo = match &args.histo_log {
            Some(path) => Some(HistoLog::open(path)?),
            None => None,
        };
        // Kept here, so that with no endpoint the channel stays open and quiet.
        let (scrape_tx, scrapes) = mpsc::channel::<http::Scrape>(http::QUEUE);
        let metrics_at = match metrics_listener {
            Some(listener) => {
                let listener = TcpListener::from_std(listener)?;
                let at = listener.local_addr()?;
                http::spawn(listener, scrape_tx.clone());
                Some(at)
            }
            None => None,
        };
        let (request_tx, requests) = mpsc::channel(64);
        server::spawn(bind_socket(&socket, &access)?, request_tx, admit(&access));
        let events = EventStream::new(probes.take_events()?)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sighup = signal(SignalKind::hangup())?;
        let shutdown = async move {
            tokio::select! {
                _ = sigint.recv() => {}
                _ = sigterm.recv() => {}
                _ = sighup.recv() => {}
            }
        };
        let agent = Agent::new(
            daemon,
            probes,
            events,
            failsafe,
            Inputs {
                requests,
                confirmations: confirm_rx,
                wakes: wake_rx,
                scrapes,
            },
            histo,
            LoopSettings {
                status_interval_s: args.status_interval,
                histo_interval_s: args.histo_interval,
                watchdog_ms: args.watchdog_ms,
                metrics_grace_ns: args.metrics_grace_s.saturating_mul(1_000_000_000),
                capacities,
            },
        )
        .reporting_to_slurm(slurm_report);
        let mut outputs = String::new();
        if let Some(at) = metrics_at {
            outputs += &format!("; metrics http://{at}/metrics");
        }
        if let Some(path) = &args.histo_log {
            outputs += &format!("; latency histograms to {} every {}s", path.display(), args.histo_interval);
        }
        eprintln!(
            "{} probes attached, watching every process; control socket {}{outputs} (Ctrl-C to stop)",
            keling_common::lines::AGENT_READY,
            socket.display()
        );
        // Nothing in there ends the agent but a signal to stop, or a fail-safe
        // that cannot be restarted: every other error is reported and survived.
        let result = agent.run(shutdown).await;
        restart::at_stop(instance, pins.as_ref());
        drop(scrape_tx);
        // Only the socket: a file someone put in its place stays.
        if std::fs::symlink_metadata(&socket)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            let _ = std::fs::remove_file(&socket);
        }
        result
    })
}

/// `--slurm-report` / `--slurm-node`: the reporter of this node, if asked for.
fn slurm_report(args: &RunArgs) -> anyhow::Result<Option<crate::slurm::node::NodeReport>> {
    if !args.slurm_report && args.slurm_node.is_none() {
        return Ok(None);
    }
    let node = match &args.slurm_node {
        Some(n) => n.clone(),
        None => super::slurm::default_node()?,
    };
    Ok(Some(crate::slurm::node::NodeReport::start(node)?))
}
