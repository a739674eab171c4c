//! `keling run`'s event loop: [`Agent`] holds what the loop keeps between
//! events (the daemon, the kernel's event source and maps, the fail-safe,
//! `/metrics`, the histogram log, the tick) and [`Agent::run`] waits on every
//! source at once and hands each to its one method, until `shutdown`. The
//! command (`cmd::run`) parses the arguments, sets up the host and wires the
//! sources in; the kernel, the ring buffer and the fail-safe are behind the
//! traits of [`sources`], so the loop's behaviour tests drive it with no root
//! and no kernel, against the daemon's fake host.
//!
//! Every kernel event goes through one path, `Agent::drain`: the full tables
//! first, then each event counted, noted for `/metrics` and handed to the daemon.
use std::{
    collections::HashMap,
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use keling_sched::GpuInfo;
use tokio::{
    sync::mpsc,
    time::{Instant, Interval},
};

use crate::{
    control::server::Incoming,
    defaults,
    event::decode::Event,
    gpu::stats::GpuAccounting,
    latency::{LatencyRecorder, intervals::IntervalLogAppender},
    os::monotonic_ns,
    prometheus::{Metrics, Sources, http::Scrape},
    sched::{daemon::Daemon, host::Wake, supervisor::Notice, worker::Confirmation},
};

pub mod sources;
#[cfg(test)]
mod tests;

pub use sources::{EventSource, Guard, Kernel};

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Seconds between status lines on standard error (0: only the final one).
    pub status_interval_s: u64,
    /// Seconds per interval of the histogram log (at least 1).
    pub histo_interval_s: u64,
    /// The fail-safe's watchdog, ms: the heartbeat rides on the tick, so the
    /// idle tick is a quarter of it at most.
    pub watchdog_ms: u64,
    /// An exited process leaves `/metrics` this long after its exit, ns.
    pub metrics_grace_ns: u64,
    /// The GPUs' capacities, as `/metrics` shows them.
    pub capacities: Vec<GpuInfo>,
}

/// What reaches the loop from its other threads and tasks.
pub struct Inputs {
    /// Control socket requests (the server's tasks).
    pub requests: mpsc::Receiver<Incoming>,
    /// What the actuation thread saw take effect, or time out.
    pub confirmations: mpsc::UnboundedReceiver<Confirmation>,
    /// What the host learned off the loop (an exit, an exec's outcome).
    pub wakes: mpsc::UnboundedReceiver<Wake>,
    /// `/metrics` scrapes (the HTTP server's tasks).
    pub scrapes: mpsc::Receiver<Scrape>,
}

/// The loop's state. See the module doc.
pub struct Agent<K, E, G> {
    daemon: Daemon,
    kernel: K,
    events: E,
    failsafe: G,
    inputs: Inputs,
    metrics: Metrics,
    histo: Option<HistoLog>,
    histo_tick: Interval,
    status_tick: Interval,
    settings: Settings,
    counters: Counters,
    books: Books,
    ticks: Ticks,
    started: Instant,
    /// `--slurm-report`: told each second what GPU memory is held outside
    /// Slurm's jobs (`crate::slurm::node`).
    slurm: Option<crate::slurm::node::NodeReport>,
}

/// The scheduler's clock, and what rides on it.
struct Ticks {
    /// Scheduler clock, heartbeats, and the drain of detail events (they do not
    /// wake the loop): every `RUN_TICK_MS` while a task lives, else every
    /// `idle_ms` (nothing then depends on the time; an arrival wakes the loop
    /// anyway).
    next: Instant,
    idle_ms: u64,
    /// When the kernel's drops were last looked at.
    last_check: Instant,
    /// When membership was last checked against the truth.
    last_reconcile: Instant,
    /// The kernel's drops at the last look.
    drops_seen: u64,
}

/// What woke the loop.
enum Step {
    Events(std::io::Result<()>),
    Tick,
    Confirmed(Confirmation),
    Woken(Wake),
    Request(Incoming),
    FailSafe(Notice),
    Scrape(Scrape),
    Histo,
    Status,
    Stop,
}

impl<K: Kernel, E: EventSource, G: Guard> Agent<K, E, G> {
    /// The loop over `daemon`, reading `events` and `kernel`, beating `failsafe`'s
    /// heart; with `histo`, the latency histograms are appended to it every
    /// interval.
    pub fn new(
        mut daemon: Daemon,
        kernel: K,
        events: E,
        failsafe: G,
        inputs: Inputs,
        histo: Option<HistoLog>,
        settings: Settings,
    ) -> Self {
        daemon.exclude(failsafe.pid());
        if histo.is_some() {
            daemon.latency_mut().keep_intervals();
        }
        let now = Instant::now();
        let histo_every = Duration::from_secs(settings.histo_interval_s.max(1));
        let status_every = Duration::from_secs(settings.status_interval_s.max(1));
        Self {
            daemon,
            kernel,
            events,
            failsafe,
            inputs,
            metrics: Metrics::new(settings.metrics_grace_ns),
            histo,
            histo_tick: tokio::time::interval_at(now + histo_every, histo_every),
            status_tick: tokio::time::interval_at(now + status_every, status_every),
            ticks: Ticks {
                next: now,
                idle_ms: defaults::IDLE_TICK_MS
                    .min((settings.watchdog_ms / 4).max(defaults::RUN_TICK_MS)),
                last_check: now,
                last_reconcile: now,
                drops_seen: 0,
            },
            settings,
            counters: Counters::default(),
            books: Books::default(),
            started: now,
            slurm: None,
        }
    }

    /// Also tells Slurm, through `report`, about this node (once a second, with
    /// the membership check).
    pub fn reporting_to_slurm(mut self, report: Option<crate::slurm::node::NodeReport>) -> Self {
        self.slurm = report;
        self
    }

    /// Runs until `shutdown` completes (`Ok(0)`), or a fail-safe that died cannot
    /// be restarted (`Err`): every other error is reported and survived. Then
    /// every task is thawed, the histograms are appended a last time and the
    /// final status line is written; the daemon (its actuation thread) and then
    /// the fail-safe are closed before it returns.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> anyhow::Result<i32> {
        tokio::pin!(shutdown);
        let result = loop {
            self.failsafe.heartbeat();
            if self.daemon.needs_clock() {
                // A task arrived while the clock ran slow: back to full rate now.
                let full = Instant::now() + Duration::from_millis(defaults::RUN_TICK_MS);
                self.ticks.next = self.ticks.next.min(full);
            }
            let step = tokio::select! {
                ready = self.events.ready() => Step::Events(ready),
                _ = tokio::time::sleep_until(self.ticks.next) => Step::Tick,
                Some(c) = self.inputs.confirmations.recv() => Step::Confirmed(c),
                Some(w) = self.inputs.wakes.recv() => Step::Woken(w),
                Some(i) = self.inputs.requests.recv() => Step::Request(i),
                notice = self.failsafe.notice() => Step::FailSafe(notice),
                Some(s) = self.inputs.scrapes.recv() => Step::Scrape(s),
                _ = self.histo_tick.tick(), if self.histo.is_some() => Step::Histo,
                _ = self.status_tick.tick(), if self.settings.status_interval_s > 0 => Step::Status,
                () = &mut shutdown => Step::Stop,
            };
            match step {
                Step::Events(ready) => self.on_events(ready),
                Step::Tick => self.on_tick(),
                Step::Confirmed(c) => self.daemon.confirmed(c),
                Step::Woken(w) => self.on_wake(w),
                Step::Request(i) => self.on_request(i),
                Step::FailSafe(notice) => {
                    if let Err(e) = self.on_failsafe(notice) {
                        break Err(e);
                    }
                }
                Step::Scrape(s) => self.on_scrape(s),
                Step::Histo => self.on_histo(),
                Step::Status => eprintln!("{}", self.status_report()),
                Step::Stop => break Ok(0),
            }
        };
        self.daemon.shutdown();
        self.on_histo();
        eprintln!("{} (stopped)", self.status_report());
        let Self {
            daemon, failsafe, ..
        } = self;
        drop(daemon);
        drop(failsafe);
        result
    }

    /// The one path of kernel events into the agent: the full tables looked at
    /// first, then every event waiting [`ingest`]ed in order.
    fn drain(&mut self) {
        let Self {
            daemon,
            kernel,
            events,
            metrics,
            counters,
            books,
            settings,
            ..
        } = self;
        let grace = Duration::from_nanos(settings.metrics_grace_ns);
        books.check(kernel, daemon, grace);
        events.drain(|e| ingest(e, counters, daemon, metrics, kernel, books, grace));
        books.judge_unsure(kernel, daemon);
    }

    /// The kernel woke the loop.
    fn on_events(&mut self, ready: std::io::Result<()>) {
        if let Err(e) = ready {
            log::warn!("event ring buffer: {e}");
        }
        self.drain();
    }

    /// The scheduler's clock: detail events drained, time rules applied, the next
    /// tick set (from now: a late tick is not made up for), and membership
    /// checked every second or when the kernel lost events.
    fn on_tick(&mut self) {
        self.drain();
        self.daemon.tick();
        let period = if self.daemon.needs_clock() {
            defaults::RUN_TICK_MS
        } else {
            self.ticks.idle_ms
        };
        let t = &mut self.ticks;
        t.next = Instant::now() + Duration::from_millis(period);
        if t.last_check.elapsed() < Duration::from_millis(100) {
            return;
        }
        t.last_check = Instant::now();
        // Lost events may have been exits or forks: check who is whose.
        let drops = self.kernel.drops().unwrap_or(0);
        if drops > t.drops_seen || t.last_reconcile.elapsed() >= Duration::from_secs(1) {
            if drops > t.drops_seen {
                log::debug!(
                    "{} events lost: checking task membership",
                    drops - t.drops_seen
                );
            }
            t.drops_seen = drops;
            t.last_reconcile = Instant::now();
            self.daemon.reconcile_members();
            if let Some(r) = &mut self.slurm {
                r.observe_kernel(self.kernel.gpu_accounting(), |pid| {
                    self.daemon.in_slurm_task(pid)
                });
            }
        }
    }

    /// Something the host learned off the loop.
    fn on_wake(&mut self, wake: Wake) {
        if matches!(wake, Wake::Exited(_)) {
            // The trace's exit event (with the code) is handled first.
            self.drain();
        }
        self.daemon.woken(wake);
    }

    /// A control socket request (a launch's root is traced from its fork).
    fn on_request(&mut self, incoming: Incoming) {
        let kernel = &mut self.kernel;
        self.daemon.handle(incoming, &mut |pid| kernel.track(pid));
    }

    /// The fail-safe tripped (freeze again what the core holds frozen) or died
    /// (start another; stop if none can be started).
    fn on_failsafe(&mut self, notice: Notice) -> anyhow::Result<()> {
        match notice {
            Notice::Tripped => self.daemon.refreeze_after_failsafe(),
            Notice::Gone => {
                log::warn!(
                    "the fail-safe (pid {}) died: starting another",
                    self.failsafe.pid()
                );
                match self.failsafe.restart() {
                    Ok(f) => {
                        self.daemon.exclude(f.pid());
                        log::info!("fail-safe restarted as pid {}", f.pid());
                        self.failsafe = f;
                    }
                    Err(e) => anyhow::bail!(
                        "the fail-safe died and cannot be restarted ({e:#}): \
                         stopping rather than freezing tasks without one"
                    ),
                }
            }
        }
        Ok(())
    }

    /// The `/metrics` text: the last one when it is recent enough (a burst of
    /// scrapes costs one rendering), else rendered from the maps and the daemon now.
    fn on_scrape(&mut self, scrape: Scrape) {
        let text = self.render_metrics();
        let _ = scrape.reply.send(text);
    }

    fn render_metrics(&mut self) -> Arc<String> {
        let now_ns = monotonic_ns();
        if let Some(text) = self.metrics.cached(now_ns) {
            return text;
        }
        let accounting = self
            .kernel
            .gpu_accounting()
            .inspect_err(|e| log::debug!("metrics: GPU accounting unavailable: {e:#}"))
            .ok();
        let drops = self.kernel.drops().unwrap_or(0);
        let status = self.daemon.status();
        let c = &self.counters;
        let daemon = &self.daemon;
        self.metrics.render(&Sources {
            accounting: accounting.as_ref(),
            capacities: &self.settings.capacities,
            events: c.forks + c.execs + c.exits + c.active + c.gpu,
            drops,
            decode_errors: self.events.decode_errors(),
            status: &status,
            latency: daemon.latency(),
            task_of: &|pid| daemon.task_of(pid),
            slurm_of: &|pid| daemon.slurm_of(pid).map(|s| s.step_label()),
            now_ns,
        })
    }

    /// Appends the latency histograms of the interval to the log, if any.
    fn on_histo(&mut self) {
        if let Some(h) = &mut self.histo {
            h.append(self.daemon.latency_mut());
        }
    }

    /// The periodic status line; a failure to read the maps is shown, not fatal.
    fn status_report(&self) -> String {
        let read = || -> anyhow::Result<String> {
            let drops = self.kernel.drops()?;
            let gpu = gpu_line(&self.kernel.gpu_accounting()?);
            Ok(format!(
                "{}{gpu}",
                status_line(
                    self.started,
                    &self.counters,
                    self.events.decode_errors(),
                    drops,
                    self.kernel.tracked_processes()?
                )
            ))
        };
        read().unwrap_or_else(|e| format!("keling: status unavailable: {e:#}"))
    }
}

/// What the loop keeps of the kernel's per-process books: which processes' full
/// tables are still to be told to their task, and when exited processes' rows
/// are to be removed.
#[derive(Default)]
struct Books {
    /// Processes the kernel found a table full for whose task is not known yet
    /// (a child whose fork is still in the ring buffer): told at the next look,
    /// forgotten at their exit.
    pending: std::collections::BTreeSet<u32>,
    /// `UNSURE_LOST` as last seen: when it grows, the whole map is read once.
    lost_seen: u64,
    /// Exited processes whose rows go once `/metrics` no longer shows them.
    forget: std::collections::VecDeque<(Instant, u32)>,
    /// When [`Books::judge_unsure`] last read the kernel's objects, and each
    /// task's figure then.
    judged_at: Option<Instant>,
    judged: HashMap<keling_sched::TaskId, u128>,
}

/// How often at most [`Books::judge_unsure`] reads the kernel's objects.
const JUDGE_UNSURE_EVERY: Duration = Duration::from_millis(100);

impl Books {
    /// Tells the daemon of every process whose books the kernel found a table
    /// full for since the last look: the kernel queues each process once, when
    /// its row in `TABLE_FULL_PID` is created, so this reads only what changed
    /// (the whole map only after the queue overflowed). Done before each batch
    /// of events, so that an allocation the batch holds is judged knowing the
    /// figure may be wrong. Also removes the rows of processes that exited
    /// longer than `grace` ago.
    fn check(&mut self, kernel: &mut impl Kernel, daemon: &mut Daemon, grace: Duration) {
        match kernel.new_unsure_pids() {
            Ok((pids, lost)) => {
                self.pending.extend(pids);
                if lost > self.lost_seen {
                    self.lost_seen = lost;
                    match kernel.table_full_pids() {
                        Ok(all) => self.pending.extend(all.into_keys()),
                        Err(e) => log::debug!("full tables per process unavailable: {e:#}"),
                    }
                }
            }
            Err(e) => log::debug!("full tables per process unavailable: {e:#}"),
        }
        // Kept only while its task is unknown.
        self.pending.retain(|&pid| !daemon.books_unsure(pid));
        while let Some(&(at, pid)) = self.forget.front() {
            if at.elapsed() < grace {
                break;
            }
            self.forget.pop_front();
            if let Err(e) = kernel.forget_books(pid) {
                log::debug!("the books of exited pid {pid} stay: {e:#}");
            }
        }
    }

    /// `pid` exited: nothing more to tell of it, and its kernel rows go after
    /// `/metrics` showed them for the grace period (a new process with its pid
    /// starts clean anyway: the kernel clears them at its fork).
    fn exited(&mut self, pid: u32) {
        self.pending.remove(&pid);
        self.forget.push_back((Instant::now(), pid));
    }

    /// A task whose figure a full table made unsure is judged, while that figure
    /// is over its quota, on a sound lower bound read from the kernel's objects
    /// (`Probes::sure_video_bytes`), at most every [`JUDGE_UNSURE_EVERY`] (the
    /// read walks whole maps) and only once its figure grew since it was last
    /// judged (the bound rises only with an allocation). See docs/limits.md.
    fn judge_unsure(&mut self, kernel: &impl Kernel, daemon: &mut Daemon) {
        if self
            .judged_at
            .is_some_and(|at| at.elapsed() < JUDGE_UNSURE_EVERY)
        {
            return;
        }
        let tasks = daemon.unsure_over_quota();
        self.judged
            .retain(|id, _| tasks.iter().any(|(t, _, _)| t == id));
        let tasks: Vec<_> = tasks
            .into_iter()
            .filter(|(id, held, _)| self.judged.get(id).is_none_or(|judged| held > judged))
            .collect();
        if tasks.is_empty() {
            return;
        }
        self.judged_at = Some(Instant::now());
        for (id, held, pids) in tasks {
            self.judged.insert(id, held);
            match kernel.sure_video_bytes(&pids) {
                Ok(bytes) => daemon.judge_unsure(id, bytes),
                Err(e) => log::warn!("task {id}: its sure GPU memory could not be read: {e:#}"),
            }
        }
    }
}

/// One decoded event: counted, handed to the scheduler, and an exit noted for
/// `/metrics`. Memory that would take a task over its quota is judged after one
/// more look at the full tables: the kernel counted any before it sent the
/// event, so the core knows whether the figure may be wrong before it decides.
fn ingest(
    e: &Event,
    c: &mut Counters,
    daemon: &mut Daemon,
    metrics: &mut Metrics,
    kernel: &mut impl Kernel,
    books: &mut Books,
    grace: Duration,
) {
    c.count(e);
    let charged = match e {
        Event::GpuAlloc(a) => Some((a.header.pid, a.bytes)),
        Event::GpuCharge(m) => Some((m.to_pid, m.bytes)),
        _ => None,
    };
    if let Some((pid, bytes)) = charged
        && daemon.would_pass_quota(pid, bytes)
    {
        books.check(kernel, daemon, grace);
    }
    if let Event::Exit(x) = e
        && x.group_dead != 0
    {
        metrics.table.exited(x.header.pid, monotonic_ns());
        books.exited(x.header.pid);
    }
    daemon.on_event(e);
}

/// `--histo-log`: the interval log the agent appends to.
pub struct HistoLog {
    path: PathBuf,
    log: IntervalLogAppender<std::fs::File>,
    failed: bool,
}

impl HistoLog {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = crate::os::files::open_for_writing(path, crate::os::files::Write::Append)
            .with_context(|| format!("open the histogram log {}", path.display()))?;
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let log = IntervalLogAppender::start(file, wall, monotonic_ns())
            .with_context(|| format!("write the histogram log {}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            log,
            failed: false,
        })
    }

    /// Appends what `latency` recorded since the last call. A write error is said
    /// once and survived (the scheduler does not depend on the log).
    fn append(&mut self, latency: &mut LatencyRecorder) {
        let Some(iv) = latency.take_interval() else {
            return;
        };
        match self.log.append(&iv, latency.model(), monotonic_ns()) {
            Ok(()) if self.failed => {
                self.failed = false;
                log::info!("histogram log {}: writing again", self.path.display());
            }
            Ok(()) => {}
            Err(e) if !self.failed => {
                self.failed = true;
                log::warn!(
                    "histogram log {}: {e} (an interval is lost)",
                    self.path.display()
                );
            }
            Err(_) => {}
        }
    }
}

/// Events seen, by kind, for the status line and `/metrics`.
#[derive(Default)]
struct Counters {
    forks: u64,
    execs: u64,
    exits: u64,
    active: u64,
    gpu: u64,
}

impl Counters {
    fn count(&mut self, event: &Event) {
        match event {
            Event::Fork(_) => self.forks += 1,
            Event::Exec(_) => self.execs += 1,
            Event::Exit(_) => self.exits += 1,
            Event::Switch(_) | Event::Active(_) => self.active += 1,
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
        "keling: up {}s, processes seen: {} forks, {} execs, {} exits; {} activity signals and {} GPU events traced; \
         {tracked} tracked; {drops} events lost; {} undecodable",
        started.elapsed().as_secs(),
        c.forks,
        c.execs,
        c.exits,
        c.active,
        c.gpu,
        decode_errors
    )
}
