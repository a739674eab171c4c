//! `keling trace`'s event loop: [`Tracer`] holds what the trace keeps between
//! events (the process model, the output sink, the command Keling started, the
//! followed scheduling log, the counts) and [`Tracer::run`] waits on every
//! source at once and hands each to its one method, until the trace ends: every
//! tracked process gone (the kernel's tracked map is the judge), `--duration`,
//! or a second Ctrl-C (the first goes to the command). Then the summary is
//! written. The command (`cmd::trace`) parses the arguments, starts or finds the
//! processes and wires the sources in; the kernel's maps, the ring buffer and
//! the signals are behind traits, so the loop's tests run without root.
use std::{
    fs::File,
    future::Future,
    io::{BufRead, BufReader},
    os::fd::OwnedFd,
    time::Duration,
};

use anyhow::Context;
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    signal::unix::{Signal, SignalKind, signal},
    time::Instant,
};

use crate::{
    bpf::Probes,
    defaults,
    event::{EventSource, decode::ExitStatus},
    gpu::{
        nvml::{NvmlCheck, RuleParts},
        stats::{CallCounts, GpuAccounting, gpu_stats},
    },
    os::{self, monotonic_ns},
    output::{Sink, Summary, decision::SchedLogReader},
    process_model::Model,
};

#[cfg(test)]
mod tests;

/// The kernel's maps, as the trace reads them.
pub trait TraceKernel {
    /// The exact GPU figures.
    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting>;
    /// Events lost per CPU (ring buffer full).
    fn drops_per_cpu(&self) -> anyhow::Result<Vec<u64>>;
    /// How many processes are traced.
    fn tracked_processes(&self) -> anyhow::Result<usize>;
    /// Waits (at most `limit`) for the releases of files the traced processes
    /// shared with others to be torn down.
    fn settle_orphans(&self, limit: Duration) -> impl Future<Output = anyhow::Result<()>>;
    /// The calls the traced processes made.
    fn call_counts(&self) -> anyhow::Result<CallCounts>;
    /// Which ioctl probes are attached (the summary says).
    fn ioctl_backend(&self) -> &'static str;
    /// Per (pid, GPU), what the driver branch's rule for NVML's per-process
    /// figure leaves out of Keling's driver figure and adds to it.
    fn nvml_rule(&self) -> anyhow::Result<RuleParts>;
}

impl TraceKernel for Probes {
    fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting> {
        Probes::gpu_accounting(self)
    }

    fn drops_per_cpu(&self) -> anyhow::Result<Vec<u64>> {
        Probes::drops_per_cpu(self)
    }

    fn tracked_processes(&self) -> anyhow::Result<usize> {
        Probes::tracked_processes(self)
    }

    fn settle_orphans(&self, limit: Duration) -> impl Future<Output = anyhow::Result<()>> {
        Probes::settle_orphans(self, limit)
    }

    fn call_counts(&self) -> anyhow::Result<CallCounts> {
        Probes::call_counts(self)
    }

    fn ioctl_backend(&self) -> &'static str {
        self.ioctl_backend.name()
    }

    fn nvml_rule(&self) -> anyhow::Result<RuleParts> {
        Probes::nvml_rule(self)
    }
}

/// What the trace is asked from outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGUSR1: the exact GPU figures now.
    Snapshot,
}

/// Where the trace hears [`Ask`]s from.
pub trait Asks {
    /// Waits for the next one.
    fn next(&mut self) -> impl Future<Output = Ask>;
}

/// SIGINT, SIGTERM and SIGUSR1.
pub struct UnixSignals {
    interrupt: Signal,
    terminate: Signal,
    snapshot: Signal,
}

impl UnixSignals {
    /// Takes the three signals over (needs a tokio reactor).
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            snapshot: signal(SignalKind::user_defined1())?,
        })
    }
}

impl Asks for UnixSignals {
    async fn next(&mut self) -> Ask {
        tokio::select! {
            _ = self.interrupt.recv() => Ask::Interrupt,
            _ = self.terminate.recv() => Ask::Terminate,
            _ = self.snapshot.recv() => Ask::Snapshot,
        }
    }
}

/// The command Keling started: the trace waits for it and exits with its code.
/// (Absent when attached to processes someone else started.)
pub struct Child {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

impl Child {
    /// Our unreaped child `pid` (needs a tokio reactor).
    pub fn new(pid: u32) -> anyhow::Result<Self> {
        let pidfd = os::pidfd_open(pid).context("pidfd_open")?;
        Ok(Self {
            pid,
            pidfd: os::async_fd(pidfd)?,
        })
    }
}

/// Resolves when the child's pidfd is readable (it exited); never without a child.
async fn child_readable(child: &Option<Child>) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match child {
        Some(c) => c.pidfd.readable().await,
        None => std::future::pending().await,
    }
}

/// Resolves at `at`; never without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When the trace ends besides Ctrl-C.
pub struct End {
    /// `--comm`: processes may still exec into a followed name, so the trace does
    /// not end when none is left.
    pub wait_for_comms: bool,
    pub duration: Option<Duration>,
}

/// Whether the loop goes on.
enum Flow {
    Continue,
    Stop,
}

/// What woke the loop.
enum Step {
    Events(std::io::Result<()>),
    ChildExited(Option<ExitStatus>),
    Deadline,
    Tick,
    Ask(Ask),
}

/// The trace's state. See the module doc.
pub struct Tracer<K, E> {
    kernel: K,
    events: E,
    model: Model,
    sink: Box<dyn Sink + Send>,
    child: Option<Child>,
    child_status: Option<ExitStatus>,
    start_ns: u64,
    end: End,
    sched_log: Option<BufReader<File>>,
    decisions: SchedLogReader,
    pending_line: String,
    nvml: NvmlCheck,
    snapshots: u64,
    interrupts: u32,
    reported_drops: u64,
    ticks: u64,
    timed_out: bool,
}

impl<K: TraceKernel, E: EventSource> Tracer<K, E> {
    /// The trace of what `model` holds (and `child`, when Keling started it),
    /// written to `sink`, timed from `start_ns`; with `sched_log`, the agent's
    /// decisions about the traced processes too.
    #[expect(
        clippy::too_many_arguments,
        reason = "the sources (kernel, events, command), where it goes (model, sink, start), \
                  when it ends, and the scheduling log"
    )]
    pub fn new(
        kernel: K,
        events: E,
        model: Model,
        sink: Box<dyn Sink + Send>,
        child: Option<Child>,
        start_ns: u64,
        end: End,
        sched_log: Option<BufReader<File>>,
    ) -> Self {
        Self {
            kernel,
            events,
            model,
            sink,
            child,
            child_status: None,
            start_ns,
            end,
            sched_log,
            decisions: SchedLogReader::default(),
            pending_line: String::new(),
            nvml: NvmlCheck::open(),
            snapshots: 0,
            interrupts: 0,
            reported_drops: 0,
            ticks: 0,
            timed_out: false,
        }
    }

    /// Traces until the end (see the module doc), writes the summary and returns
    /// the exit code: the command's, 0 without one or after `--duration`, 130 when
    /// stopped before the command ended.
    pub async fn run(mut self, mut asks: impl Asks) -> anyhow::Result<i32> {
        let stop_at = self.end.duration.map(|d| Instant::now() + d);
        // Detail events (switches, plain ioctls) do not wake us: drain on this tick too.
        let mut tick = tokio::time::interval(Duration::from_millis(defaults::TRACE_TICK_MS));
        loop {
            let child_running = self.child_running();
            let step = tokio::select! {
                ready = self.events.ready() => Step::Events(ready),
                guard = child_readable(&self.child), if child_running => {
                    let mut guard = guard?;
                    let pid = self.child.as_ref().expect("child_running").pid;
                    let status = os::try_wait(pid).map(ExitStatus::from_wait_status);
                    if status.is_none() {
                        guard.clear_ready(); // spurious wake-up
                    }
                    Step::ChildExited(status)
                }
                _ = until(stop_at) => Step::Deadline,
                _ = tick.tick() => Step::Tick,
                ask = asks.next() => Step::Ask(ask),
            };
            let flow = match step {
                Step::Events(ready) => {
                    ready?;
                    self.drain()?;
                    Flow::Continue
                }
                Step::ChildExited(status) => {
                    self.child_status = status;
                    Flow::Continue
                }
                Step::Deadline => {
                    log::info!("--duration reached: tracing stops");
                    self.timed_out = true;
                    Flow::Stop
                }
                Step::Tick => self.on_tick().await?,
                Step::Ask(Ask::Snapshot) => {
                    self.on_snapshot()?;
                    Flow::Continue
                }
                Step::Ask(ask) => self.on_stop_signal(ask),
            };
            if let Flow::Stop = flow {
                break;
            }
        }
        self.finish()
    }

    fn child_running(&self) -> bool {
        self.child.is_some() && self.child_status.is_none()
    }

    /// Decodes everything waiting into the model and the sink.
    fn drain(&mut self) -> anyhow::Result<()> {
        let Self {
            events,
            model,
            sink,
            ..
        } = self;
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

    /// Detail events drained, the scheduling log followed, the output flushed;
    /// NVML's view now and then, lost events when there are more; the end once
    /// no process is left to trace.
    async fn on_tick(&mut self) -> anyhow::Result<Flow> {
        let nvml_every = (defaults::NVML_CHECK_EVERY_S * 1000 / defaults::TRACE_TICK_MS).max(1);
        // Drops are checked a few times a second.
        let drops_every = (400 / defaults::TRACE_TICK_MS).max(1);
        self.drain()?;
        self.follow_sched_log()?;
        self.sink.flush()?;
        self.ticks += 1;
        // Every few seconds, when NVML is there: its view next to ours.
        if self.ticks.is_multiple_of(nvml_every) && self.nvml.available() {
            let (procs, _) = gpu_stats(&self.kernel.gpu_accounting()?);
            let rule = self.kernel.nvml_rule()?;
            self.sink
                .nvml_check(monotonic_ns(), &self.nvml.compare(&procs, &rule))?;
        }
        if self.ticks.is_multiple_of(drops_every) {
            let per_cpu = self.kernel.drops_per_cpu()?;
            let total: u64 = per_cpu.iter().sum();
            if total > self.reported_drops {
                self.reported_drops = total;
                self.sink.drops(monotonic_ns(), &per_cpu)?;
            }
        }
        if !self.child_running()
            && !self.end.wait_for_comms
            && self.kernel.tracked_processes()? == 0
        {
            // Files the traced processes shared with others may have been
            // released by them just now.
            self.kernel.settle_orphans(Duration::from_secs(1)).await?;
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }

    /// SIGUSR1: everything the kernel wrote so far first, then the exact figures.
    fn on_snapshot(&mut self) -> anyhow::Result<()> {
        self.drain()?;
        let (procs, gpus) = gpu_stats(&self.kernel.gpu_accounting()?);
        self.snapshots += 1;
        self.sink
            .gpu_snapshot(monotonic_ns(), self.snapshots, &procs, &gpus)?;
        let rule = if self.nvml.available() {
            self.kernel.nvml_rule()?
        } else {
            RuleParts::default()
        };
        self.sink
            .nvml_check(monotonic_ns(), &self.nvml.compare(&procs, &rule))?;
        Ok(())
    }

    /// SIGINT or SIGTERM: the first goes to a command Keling started and still
    /// runs; any other stops the trace.
    fn on_stop_signal(&mut self, ask: Ask) -> Flow {
        self.interrupts += 1;
        let (Some(c), true, 1) = (&self.child, self.child_running(), self.interrupts) else {
            return Flow::Stop;
        };
        let signal = if ask == Ask::Interrupt {
            log::info!("interrupt: passed to the traced command; again to stop tracing");
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(c.pid as i32, signal) };
        Flow::Continue
    }

    /// The decisions the scheduling log gained since the last call, about processes
    /// the trace follows, to the sink (complete lines only: a line being written is
    /// read on a later call).
    fn follow_sched_log(&mut self) -> anyhow::Result<()> {
        let Some(log) = &mut self.sched_log else {
            return Ok(());
        };
        loop {
            let n = log
                .read_line(&mut self.pending_line)
                .context("reading the scheduling log")?;
            if n == 0 || !self.pending_line.ends_with('\n') {
                return Ok(());
            }
            if let Some(d) = self
                .decisions
                .line(self.pending_line.trim_end(), monotonic_ns())
                && self.model.has_process(d.pid)
            {
                self.sink.decision(&d).context("writing the trace")?;
            }
            self.pending_line.clear();
        }
    }

    /// Whatever the kernel wrote before the trace stopped, then the summary; the
    /// exit code.
    fn finish(mut self) -> anyhow::Result<i32> {
        self.drain()?;
        self.follow_sched_log()?;
        let per_cpu = self.kernel.drops_per_cpu()?;
        let now = monotonic_ns();
        self.sink.drops(now, &per_cpu)?;
        let acc = self.kernel.gpu_accounting()?;
        let calls = self.kernel.call_counts()?;
        let (gpu_procs, gpus) = gpu_stats(&acc);
        let processes = self.model.summary(gpu_procs);
        if self.model.unreported_switch_ins > 0 {
            log::debug!(
                "{} switches onto a traced thread reached no tracepoint (docs/limits.md); \
                 on-CPU times come from the kernel's own counter",
                self.model.unreported_switch_ins
            );
        }
        self.sink.summary(&Summary {
            ts_ns: now,
            duration_ns: now.saturating_sub(self.start_ns),
            events: self.model.events,
            drops: per_cpu.iter().sum(),
            decode_errors: self.events.decode_errors(),
            processes: &processes,
            gpus: &gpus,
            undecoded: &acc.undecoded_per_reason,
            table_full_at: &acc.table_full_at,
            calls: &calls,
            ioctl_backend: self.kernel.ioctl_backend(),
        })?;
        self.sink.flush()?;
        Ok(match (self.child, self.child_status) {
            (Some(_), Some(status)) => status.code(),
            (Some(c), None) if self.timed_out => {
                // Traced for as long as asked: it goes on untraced.
                log::info!("command {} goes on untraced", c.pid);
                0
            }
            (Some(c), None) => {
                // Stopped tracing before the command ended: it goes on untraced.
                log::warn!("stopped tracing; command {} is still running", c.pid);
                130
            }
            (None, _) => 0,
        })
    }
}
