//! `keling run`: the long-running agent. For now it watches every process's
//! lifecycle and prints a status line; the scheduler and GPU tracing build on it.
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use crate::{
    decode::{self, Event},
    probes::{LoadOptions, Probes},
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

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    args.gpu.check_dev_dir()?;
    let driver_major = args.gpu.driver_major()?;
    let mut probes = Probes::load(&LoadOptions {
        system_wide: true,
        ringbuf_bytes: args.ringbuf_kib.saturating_mul(1024),
        dev_dir: args.gpu.dev_dir.clone(),
        driver_major,
    })?;
    probes.adopt_existing_fds(&args.gpu.dev_dir, None, true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut ring = crate::sys::async_fd(probes.take_events()?)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let period = Duration::from_secs(args.status_interval.max(1));
        let mut status = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // Detail events do not wake us; collect them on this tick.
        let mut drain = tokio::time::interval(std::time::Duration::from_millis(20));
        let started = Instant::now();
        let mut c = Counters::default();
        eprintln!("keling: ready: probes attached, watching every process (Ctrl-C to stop)");
        loop {
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    while let Some(item) = guard.get_inner_mut().next() {
                        match decode::decode(&item) {
                            Ok(event) => c.count(&event),
                            Err(_) => c.decode_errors += 1,
                        }
                    }
                    guard.clear_ready();
                }
                _ = drain.tick() => {
                    while let Some(item) = ring.get_mut().next() {
                        match decode::decode(&item) {
                            Ok(event) => c.count(&event),
                            Err(_) => c.decode_errors += 1,
                        }
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
        let drops = probes.drops_per_cpu()?.iter().sum();
        eprintln!(
            "{} (stopped)",
            status_line(started, &c, drops, probes.tracked_processes()?)
        );
        Ok(0)
    })
}
