//! `keling trace`: trace one command (or one running process) and its descendants.
//!
//! The pipeline: kernel ring buffer -> [`decode`] -> [`Model`] + [`Output`]. The trace
//! ends when every tracked process has exited (the kernel's tracked map is the
//! judge, so dropped events cannot make it hang or end early) or on a second Ctrl-C.
use std::{
    ffi::OsString,
    fs::File,
    io::{BufWriter, Write},
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    signal::unix::{SignalKind, signal},
};

use crate::{
    decode::{self, ExitStatus},
    model::Model,
    output::{Format, Output, Summary},
    probes::{LoadOptions, Probes},
    spawn::HeldChild,
};

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
    #[arg(long, default_value_t = 4096, value_name = "KIB")]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub gpu: crate::gpu_env::GpuArgs,
    /// The command to run and trace, after `--`. It is held before exec until the
    /// probes track it, so nothing it does is missed.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer; CLOCK_MONOTONIC is the clock of bpf_ktime_get_ns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

fn pidfd_open(pid: u32) -> anyhow::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("pidfd_open");
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reaps our child if it has exited.
fn try_wait(pid: u32) -> Option<ExitStatus> {
    let mut status = 0;
    // SAFETY: our own child; WNOHANG never blocks.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    (r == pid as i32).then(|| ExitStatus::from_wait_status(status as u32))
}

/// Reads `/proc/PID/stat` for (ppid, comm).
fn proc_identity(pid: u32) -> anyhow::Result<(u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process {pid}"))?;
    // "pid (comm) state ppid ...": comm may contain spaces and parentheses.
    let open = stat.find('(').context("bad stat")?;
    let close = stat.rfind(')').context("bad stat")?;
    let comm = stat[open + 1..close].to_owned();
    let ppid = stat[close + 2..]
        .split(' ')
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((ppid, comm))
}

fn tids_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the trace; returns the exit code `keling` should exit with.
pub fn trace(args: TraceArgs) -> anyhow::Result<i32> {
    if args.pid.is_none() && args.command.is_empty() {
        anyhow::bail!(
            "nothing to trace: give a command after `--` or --pid PID (see `keling trace --help`)"
        );
    }
    crate::sys::check_privileges()?;
    // Fork first, before the probes and the runtime exist: a child that is only
    // forked (not exec'd) is cheap to throw away if loading fails.
    let held = if args.command.is_empty() {
        None
    } else {
        Some(HeldChild::spawn(&args.command)?)
    };
    args.gpu.check_dev_dir()?;
    let driver_major = args.gpu.driver_major()?;
    let mut probes = Probes::load(&LoadOptions {
        system_wide: false,
        ringbuf_bytes: args.ringbuf_kib.saturating_mul(1024),
        dev_dir: args.gpu.dev_dir.clone(),
        driver_major,
    })?;
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
            Some(Child {
                pid,
                pidfd: crate::sys::async_fd(pidfd_open(pid)?)?,
            })
        }
        None => {
            let pid = args.pid.expect("checked above");
            let (ppid, comm) = proc_identity(pid)?;
            probes.track(pid, pid)?;
            probes.adopt_existing_fds(&args.gpu.dev_dir, Some(&[pid]), false)?;
            log::info!("tracing process {pid} ({comm}) and the children it forks from now on");
            model.add_process(pid, ppid, comm, &tids_of(pid));
            None
        }
    };
    let output = Output::new(args.format, out, start_ns, args.switches);
    runtime.block_on(event_loop(probes, model, output, child, start_ns))
}

struct Loop {
    model: Model,
    output: Output,
    decode_errors: u64,
}

impl Loop {
    fn drain(&mut self, ring: &mut RingBuf<MapData>) -> anyhow::Result<()> {
        while let Some(item) = ring.next() {
            match decode::decode(&item) {
                Ok(event) => {
                    self.model.apply(&event);
                    self.output.event(&event)?;
                }
                Err(e) => {
                    if self.decode_errors == 0 {
                        log::warn!("undecodable event from the kernel: {e}");
                    }
                    self.decode_errors += 1;
                }
            }
        }
        self.output.flush()?;
        Ok(())
    }
}

async fn event_loop(
    mut probes: Probes,
    model: Model,
    output: Output,
    child: Option<Child>,
    start_ns: u64,
) -> anyhow::Result<i32> {
    let mut ring = crate::sys::async_fd(probes.take_events()?)?;
    let mut state = Loop {
        model,
        output,
        decode_errors: 0,
    };
    // Detail events (switches, plain ioctls) do not wake us: drain on this tick too.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigusr1 = signal(SignalKind::user_defined1())?;
    let nvml = crate::nvml::NvmlCheck::open();
    let mut snapshots = 0u64;
    let mut interrupts = 0;
    let mut reported_drops = 0u64;
    let mut ticks = 0u64;
    let mut child_status: Option<ExitStatus> = None;
    loop {
        let child_running = child.is_some() && child_status.is_none();
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                state.drain(guard.get_inner_mut())?;
                guard.clear_ready();
            }
            guard = child_readable(&child), if child_running => {
                let mut guard = guard?;
                let pid = child.as_ref().expect("child_running").pid;
                child_status = try_wait(pid);
                if child_status.is_none() {
                    guard.clear_ready(); // spurious wake-up
                }
            }
            _ = tick.tick() => {
                // Detail events do not wake us: collect them here.
                state.drain(ring.get_mut())?;
                ticks += 1;
                // Every 5 s, when NVML is there: its view next to ours.
                if ticks.is_multiple_of(250) && nvml.available() {
                    let (procs, _) = crate::model::gpu_stats(&probes.gpu_accounting()?);
                    state.output.nvml_check(monotonic_ns(), &nvml.compare(&procs))?;
                }
                if ticks.is_multiple_of(20) {
                    let per_cpu = probes.drops_per_cpu()?;
                    let total: u64 = per_cpu.iter().sum();
                    if total > reported_drops {
                        reported_drops = total;
                        state.output.drops(crate::trace::monotonic_ns(), &per_cpu)?;
                    }
                }
                if !child_running && probes.tracked_processes()? == 0 {
                    break;
                }
            }
            _ = sigusr1.recv() => {
                // Everything the kernel wrote so far first, then the exact figures.
                state.drain(ring.get_mut())?;
                let acc = probes.gpu_accounting()?;
                let (procs, gpus) = crate::model::gpu_stats(&acc);
                snapshots += 1;
                state.output.gpu_snapshot(monotonic_ns(), snapshots, &procs, &gpus)?;
                state.output.nvml_check(monotonic_ns(), &nvml.compare(&procs))?;
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
    state.drain(ring.get_mut())?;
    let per_cpu = probes.drops_per_cpu()?;
    let now = monotonic_ns();
    state.output.drops(now, &per_cpu)?;
    let acc = probes.gpu_accounting()?;
    let (gpu_procs, gpus) = crate::model::gpu_stats(&acc);
    let processes = state.model.summary(gpu_procs);
    state.output.summary(&Summary {
        ts_ns: now,
        duration_ns: now.saturating_sub(start_ns),
        events: state.model.events,
        drops: per_cpu.iter().sum(),
        decode_errors: state.decode_errors,
        processes: &processes,
        gpus: &gpus,
        undecoded: &acc.undecoded_per_reason,
    })?;
    state.output.flush()?;
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
