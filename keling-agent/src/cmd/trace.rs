//! `keling trace`: trace one command (or one running process) and its descendants.
//!
//! The pipeline: kernel ring buffer -> [`EventStream`] (decode) -> [`Model`] +
//! an output [`Sink`]. The trace ends when every tracked process has exited (the
//! kernel's tracked map is the judge, so dropped events cannot make it hang or end
//! early) or on a second Ctrl-C.
use std::{
    ffi::OsString,
    fs::File,
    io::{BufWriter, Write},
    os::fd::OwnedFd,
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    signal::unix::{SignalKind, signal},
};

use crate::{
    bpf::{LoadOptions, Probes, programs::Feature},
    defaults,
    event::{EventStream, decode::ExitStatus, model::Model},
    gpu::{env::GpuArgs, nvml::NvmlCheck, stats::gpu_stats},
    os::{self, monotonic_ns, spawn::HeldChild},
    output::{self, Format, Sink, Summary},
};

/// What a trace cannot do without.
const REQUIRED: &[Feature] = &[Feature::ProcessLifecycle, Feature::ContextSwitches];
/// ... and with an NVIDIA driver (or the simulated one) present.
const REQUIRED_WITH_GPU: &[Feature] = &[
    Feature::ProcessLifecycle,
    Feature::ContextSwitches,
    Feature::NvidiaFiles,
    Feature::NvidiaIoctls,
];

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Attach to this running process (and the children it forks from now on)
    /// instead of starting a command.
    #[arg(long, conflicts_with = "command")]
    pub pid: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the trace to FILE instead of standard output (keeps it apart from the
    /// traced command's own output).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show every context switch in the text timeline (jsonl always has them).
    #[arg(long)]
    pub switches: bool,
    /// Size of the kernel ring buffer in KiB (a power of two, at least 4).
    #[arg(long, default_value_t = defaults::RINGBUF_KIB, value_name = "KIB")]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The command to run and trace, after `--`. It is held before exec until the
    /// probes track it, so nothing it does is missed.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// The command we started: we wait for it and exit with its code. (Absent when
/// attached to a process someone else started.)
struct Child {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

/// Resolves when the child's pidfd is readable (it exited); never without a child.
async fn child_readable(child: &Option<Child>) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match child {
        Some(c) => c.pidfd.readable().await,
        None => std::future::pending().await,
    }
}

/// Runs the trace; returns the exit code `keling` should exit with.
pub fn trace(args: TraceArgs) -> anyhow::Result<i32> {
    if args.pid.is_none() && args.command.is_empty() {
        anyhow::bail!(
            "nothing to trace: give a command after `--` or --pid PID (see `keling trace --help`)"
        );
    }
    os::check_privileges()?;
    // Fork first, before the probes and the runtime exist: a child that is only
    // forked (not exec'd) is cheap to throw away if loading fails.
    let held = if args.command.is_empty() {
        None
    } else {
        Some(HeldChild::spawn(&args.command)?)
    };
    let mut opts = LoadOptions::new(&args.gpu, false, args.ringbuf_kib, REQUIRED)?;
    if opts.has_gpu() {
        opts.required = REQUIRED_WITH_GPU;
    }
    let mut probes = Probes::load(&opts)?;
    let out: Box<dyn Write + Send> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("create {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout())),
    };
    let start_ns = monotonic_ns();
    let mut model = Model::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _enter = runtime.enter();
    let child = match held {
        Some(held) => {
            let pid = held.pid();
            probes.track(pid, pid)?;
            let comm = args.command[0].to_string_lossy();
            let comm = comm.rsplit('/').next().unwrap_or_default().to_owned();
            model.add_process(pid, std::process::id(), comm, &[pid]);
            let pid = held.release(&args.command[0])?;
            let pidfd = os::pidfd_open(pid).context("pidfd_open")?;
            Some(Child {
                pid,
                pidfd: os::async_fd(pidfd)?,
            })
        }
        None => {
            let pid = args.pid.expect("checked above");
            let stat = os::proc::stat(pid)?;
            probes.track(pid, pid)?;
            probes.adopt_existing_fds(Some(&[pid]), false)?;
            log::info!(
                "tracing process {pid} ({}) and the children it forks from now on",
                stat.comm
            );
            let tids: Vec<u32> = os::proc::tids(pid)?.into_iter().collect();
            model.add_process(pid, stat.ppid, stat.comm, &tids);
            None
        }
    };
    let sink = output::open(args.format, out, start_ns, args.switches);
    runtime.block_on(event_loop(probes, model, sink, child, start_ns))
}

/// Decodes everything waiting into the model and the sink.
fn drain(
    events: &mut EventStream,
    model: &mut Model,
    sink: &mut Box<dyn Sink + Send>,
) -> anyhow::Result<()> {
    let mut failed = None;
    events.drain(|event| {
        model.apply(event);
        if failed.is_none()
            && let Err(e) = sink.event(event)
        {
            failed = Some(e);
        }
    });
    failed.map_or(Ok(()), |e| Err(e).context("writing the trace"))
}

async fn event_loop(
    mut probes: Probes,
    mut model: Model,
    mut sink: Box<dyn Sink + Send>,
    child: Option<Child>,
    start_ns: u64,
) -> anyhow::Result<i32> {
    let mut events = EventStream::new(probes.take_events()?)?;
    // Detail events (switches, plain ioctls) do not wake us: drain on this tick too.
    let tick_period = Duration::from_millis(defaults::TRACE_TICK_MS);
    let mut tick = tokio::time::interval(tick_period);
    let nvml_every = (defaults::NVML_CHECK_EVERY_S * 1000 / defaults::TRACE_TICK_MS).max(1);
    // Drops are checked a few times a second.
    let drops_every = (400 / defaults::TRACE_TICK_MS).max(1);
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigusr1 = signal(SignalKind::user_defined1())?;
    let nvml = NvmlCheck::open();
    let mut snapshots = 0u64;
    let mut interrupts = 0;
    let mut reported_drops = 0u64;
    let mut ticks = 0u64;
    let mut child_status: Option<ExitStatus> = None;
    loop {
        let child_running = child.is_some() && child_status.is_none();
        tokio::select! {
            ready = events.ready() => {
                ready?;
                drain(&mut events, &mut model, &mut sink)?;
            }
            guard = child_readable(&child), if child_running => {
                let mut guard = guard?;
                let pid = child.as_ref().expect("child_running").pid;
                child_status = os::try_wait(pid).map(ExitStatus::from_wait_status);
                if child_status.is_none() {
                    guard.clear_ready(); // spurious wake-up
                }
            }
            _ = tick.tick() => {
                drain(&mut events, &mut model, &mut sink)?;
                sink.flush()?;
                ticks += 1;
                // Every few seconds, when NVML is there: its view next to ours.
                if ticks.is_multiple_of(nvml_every) && nvml.available() {
                    let (procs, _) = gpu_stats(&probes.gpu_accounting()?);
                    sink.nvml_check(monotonic_ns(), &nvml.compare(&procs))?;
                }
                if ticks.is_multiple_of(drops_every) {
                    let per_cpu = probes.drops_per_cpu()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > reported_drops {
                        reported_drops = total;
                        sink.drops(monotonic_ns(), &per_cpu)?;
                    }
                }
                if !child_running && probes.tracked_processes()? == 0 {
                    // Files the traced processes shared with others may have been
                    // released by them just now.
                    probes.settle_orphans(Duration::from_secs(1)).await?;
                    break;
                }
            }
            _ = sigusr1.recv() => {
                // Everything the kernel wrote so far first, then the exact figures.
                drain(&mut events, &mut model, &mut sink)?;
                let (procs, gpus) = gpu_stats(&probes.gpu_accounting()?);
                snapshots += 1;
                sink.gpu_snapshot(monotonic_ns(), snapshots, &procs, &gpus)?;
                sink.nvml_check(monotonic_ns(), &nvml.compare(&procs))?;
            }
            _ = sigint.recv() => {
                interrupts += 1;
                if let (Some(c), true, 1) = (&child, child_running, interrupts) {
                    log::info!("interrupt: passed to the traced command; again to stop tracing");
                    // SAFETY: our own child, not yet reaped.
                    unsafe { libc::kill(c.pid as i32, libc::SIGINT) };
                } else {
                    break;
                }
            }
            _ = sigterm.recv() => {
                interrupts += 1;
                if let (Some(c), true, 1) = (&child, child_running, interrupts) {
                    // SAFETY: our own child, not yet reaped.
                    unsafe { libc::kill(c.pid as i32, libc::SIGTERM) };
                } else {
                    break;
                }
            }
        }
    }
    // Whatever the kernel wrote before we stopped.
    drain(&mut events, &mut model, &mut sink)?;
    let per_cpu = probes.drops_per_cpu()?;
    let now = monotonic_ns();
    sink.drops(now, &per_cpu)?;
    let acc = probes.gpu_accounting()?;
    let (gpu_procs, gpus) = gpu_stats(&acc);
    let processes = model.summary(gpu_procs);
    sink.summary(&Summary {
        ts_ns: now,
        duration_ns: now.saturating_sub(start_ns),
        events: model.events,
        drops: per_cpu.iter().sum(),
        decode_errors: events.decode_errors,
        processes: &processes,
        gpus: &gpus,
        undecoded: &acc.undecoded_per_reason,
    })?;
    sink.flush()?;
    Ok(match (child, child_status) {
        (Some(_), Some(status)) => status.code(),
        (Some(c), None) => {
            // Stopped tracing before the command ended: it goes on untraced.
            log::warn!("stopped tracing; command {} is still running", c.pid);
            130
        }
        (None, _) => 0,
    })
}
