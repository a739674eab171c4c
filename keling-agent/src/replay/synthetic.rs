//! Reproducible GPU workloads, run in closed loop against the scheduler core:
//! `keling replay --synthetic`.
//!
//! **The mixes.** Twelve job classes each ([`Mix`]): `mixed` ([`CLASSES`]) from
//! real-time inference to multi-hour training, and `transcode`
//! ([`TRANSCODE_CLASSES`]), the design articles' live-transcoding setting:
//! resolution x codec, minutes-long jobs of 1-8 GiB at three priorities. Each
//! class has its priority, GPU memory and mean GPU work. Jobs arrive as one
//! Poisson process; each arrival's class is drawn by the classes' shares, its
//! work from a log-normal distribution (sigma 0.6) around the class mean. The
//! arrival rate is set so the offered work is `load` times the GPUs' capacity
//! (`--load`, default 0.7). The job list depends only on the mix, the seed, the
//! GPU count, the hours and the load, so every policy and placement is run on
//! the same jobs.
//!
//! **The closed loop.** A job is a process that needs `work` of GPU time. Under
//! late binding it is held before exec from its arrival until the core binds it
//! (no activity, no memory), then starts on that GPU. It
//! progresses only while it is not frozen and holds its memory; processes
//! running at once on one GPU share it equally (processor sharing). It allocates
//! its memory the first time it runs (at arrival, unless the core queues it at
//! once): when the GPU's memory is short the allocation fails (`AllocFailed`,
//! memory pressure) and is retried every second, up to 30 times, then the job
//! gives up (exit code 2). Running processes show activity (`Active`) every
//! `active_ms`. The agent's actuator is perfect: freezes, thaws and stops are
//! confirmed `actuation_ms` after the decision; `Kill` ends the process then,
//! `Terminate` 100 ms later. The core is ticked every `tick_ms` (the agent's
//! 10 ms by default).
//!
//! **Placement.** `late` lets the core bind each job when a GPU can run it
//! (late binding, [`keling_sched::Binding::Late`]): the job waits unbound, not
//! started, and starts on the GPU it is bound to; ties between free GPUs go to
//! the least busy, then by the seed. `weighted` lets the core place by its
//! weight W at arrival (the agent's protocol today); `round-robin` pins the n-th
//! job to GPU n mod G; `random` pins each job to a uniformly drawn GPU (seeded);
//! `least-loaded` pins it to the GPU with the fewest unfinished jobs, as a
//! cluster scheduler counting pods would.
use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    path::PathBuf,
};

use keling_sched::{
    Action, ActionKind, Binding, GpuInfo, Input, Output, Policy, SchedConfig, Scheduler, TaskId,
    TaskSpec,
};
use serde::Serialize;

use super::{Metrics, Summary, log::InputLogWriter};
use crate::{
    log_format::{INPUT_LOG_VERSION, InputLogHeader, Record},
    sched::log_writer::Logs,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const GIB: u64 = 1 << 30;
/// Retry period of a failed allocation.
const ALLOC_RETRY_NS: u64 = S;
/// A job gives up after this many failed allocations.
const ALLOC_MAX_FAILURES: u32 = 30;
/// A terminated process exits this long after SIGTERM.
const TERMINATE_EXIT_NS: u64 = 100 * MS;
/// Mixed into the seed for the stream jobs' memory is drawn from.
const MEM_STREAM: u64 = 0x4D45_4D00_B17E_5EED;
/// Exit code of a job that gave up for lack of memory.
const OOM_EXIT_CODE: i32 = 2;

/// One kind of job in the mix.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct JobClass {
    pub name: &'static str,
    pub priority: u8,
    /// GPU memory a job of the class peaks at, GiB: drawn uniformly in
    /// `[mem_gib.0, mem_gib.1]` per job. The upper end is the budget its jobs
    /// declare (as `keling launch --mem-quota` would).
    pub mem_gib: (f64, f64),
    /// Mean GPU work, s.
    pub mean_work_s: f64,
    /// Share of arrivals.
    pub share: f64,
    /// Session limit its jobs ask for (None: the agent's default, 1 h).
    pub max_duration_ms: Option<u64>,
}

const fn class(
    name: &'static str,
    priority: u8,
    mem_gib: (f64, f64),
    mean_work_s: f64,
    share: f64,
    max_duration_ms: Option<u64>,
) -> JobClass {
    JobClass {
        name,
        priority,
        mem_gib,
        mean_work_s,
        share,
        max_duration_ms,
    }
}

/// The twelve job classes: real-time (0-2), interactive (3-6) and background
/// (7-15) priorities; shares add up to 1. Most jobs are short, most GPU time
/// goes to the few long ones (training and fine-tuning are 4% of the jobs and
/// about 80% of the work), as on shared GPU hosts.
pub const CLASSES: [JobClass; 12] = [
    class("rt-inference", 0, (3.0, 4.0), 2.0, 0.20, None),
    class("rt-speech", 1, (1.5, 2.0), 1.0, 0.15, None),
    class("rt-video-preview", 2, (4.0, 6.0), 5.0, 0.10, None),
    class("notebook", 3, (4.0, 8.0), 30.0, 0.08, None),
    class("llm-inference", 4, (12.0, 16.0), 10.0, 0.12, None),
    class("image-generation", 5, (8.0, 10.0), 20.0, 0.10, None),
    class("live-transcode", 6, (2.0, 3.0), 60.0, 0.06, None),
    class("batch-transcode", 8, (2.0, 3.0), 300.0, 0.07, None),
    class(
        "video-generation",
        9,
        (20.0, 24.0),
        600.0,
        0.04,
        Some(6 * 3_600_000),
    ),
    class("embedding", 10, (8.0, 12.0), 180.0, 0.04, None),
    class(
        "fine-tuning",
        12,
        (32.0, 40.0),
        2_700.0,
        0.02,
        Some(12 * 3_600_000),
    ),
    class(
        "training",
        14,
        (48.0, 60.0),
        10_800.0,
        0.02,
        Some(86_400_000),
    ),
];

/// Transcoding classes' session limit: generous for minutes-long jobs that
/// may wait, share a GPU, or run long (log-normal work).
const TRANSCODE_LIMIT_MS: Option<u64> = Some(6 * 3_600_000);

const fn transcode(
    name: &'static str,
    priority: u8,
    mem_gib: (f64, f64),
    mean_work_s: f64,
    share: f64,
) -> JobClass {
    class(
        name,
        priority,
        mem_gib,
        mean_work_s,
        share,
        TRANSCODE_LIMIT_MS,
    )
}

/// The design articles' live-transcoding setting: 4 resolutions x 3 codecs.
/// Memory grows with resolution (1, 2, 4, 8 GiB), work with resolution (1, 2,
/// 4, 10 min for H.264) and codec (HEVC 1.5x, AV1 2.5x). Three priorities:
/// H.264 is the live ladder (3), HEVC the premium one (5), AV1 the catalogue
/// re-encodes (8, background). Shares: the lower rungs of a ladder are asked
/// for most; H.264 half the jobs, HEVC 30%, AV1 20%.
pub const TRANSCODE_CLASSES: [JobClass; 12] = [
    transcode("h264-480p", 3, (0.75, 1.0), 60.0, 0.15),
    transcode("h264-720p", 3, (1.5, 2.0), 120.0, 0.15),
    transcode("h264-1080p", 3, (3.0, 4.0), 240.0, 0.15),
    transcode("h264-2160p", 3, (6.0, 8.0), 600.0, 0.05),
    transcode("hevc-480p", 5, (0.75, 1.0), 90.0, 0.09),
    transcode("hevc-720p", 5, (1.5, 2.0), 180.0, 0.09),
    transcode("hevc-1080p", 5, (3.0, 4.0), 360.0, 0.09),
    transcode("hevc-2160p", 5, (6.0, 8.0), 900.0, 0.03),
    transcode("av1-480p", 8, (0.75, 1.0), 150.0, 0.06),
    transcode("av1-720p", 8, (1.5, 2.0), 300.0, 0.06),
    transcode("av1-1080p", 8, (3.0, 4.0), 600.0, 0.06),
    transcode("av1-2160p", 8, (6.0, 8.0), 1_500.0, 0.02),
];

/// Which job classes a synthetic run draws from.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Real-time inference to multi-hour training ([`CLASSES`]).
    #[default]
    Mixed,
    /// Live transcoding, resolution x codec ([`TRANSCODE_CLASSES`]).
    Transcode,
}

impl Mix {
    pub const ALL: [Mix; 2] = [Mix::Mixed, Mix::Transcode];

    pub fn as_str(self) -> &'static str {
        match self {
            Mix::Mixed => "mixed",
            Mix::Transcode => "transcode",
        }
    }

    pub fn classes(self) -> &'static [JobClass; 12] {
        match self {
            Mix::Mixed => &CLASSES,
            Mix::Transcode => &TRANSCODE_CLASSES,
        }
    }

    /// The offered work per job arrival, s.
    pub fn mean_work_s(self) -> f64 {
        self.classes().iter().map(|c| c.share * c.mean_work_s).sum()
    }
}

/// What runtime each job declares to the core (as `keling launch
/// --expected-runtime-ms` would): what late binding under memory sharing
/// balances GPU time by.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Runtimes {
    /// Its class's mean work: what a launcher knows of a job before it runs.
    #[default]
    ClassMean,
    /// Its exact work: an oracle no launcher has, to show what placement
    /// loses for not knowing.
    Exact,
    /// Nothing: then only the busy time each GPU has given so far is
    /// balanced.
    None,
}

impl Runtimes {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtimes::ClassMean => "class-mean",
            Runtimes::Exact => "exact",
            Runtimes::None => "none",
        }
    }

    /// What a job of class `c` with `work_ns` of work declares, ms.
    fn declared_ms(self, c: &JobClass, work_ns: u64) -> Option<u64> {
        match self {
            Runtimes::ClassMean => Some((c.mean_work_s * 1000.0) as u64),
            Runtimes::Exact => Some(work_ns.div_ceil(MS)),
            Runtimes::None => None,
        }
    }
}

/// Where jobs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Late binding: the core binds a job when a GPU can run it.
    Late,
    /// The core's placement weight W, at arrival.
    Weighted,
    /// Job n to GPU n mod G.
    RoundRobin,
    /// A uniformly drawn GPU (seeded).
    Random,
    /// The GPU with the fewest unfinished jobs.
    LeastLoaded,
}

impl Placement {
    pub const ALL: [Placement; 5] = [
        Placement::Late,
        Placement::Weighted,
        Placement::RoundRobin,
        Placement::Random,
        Placement::LeastLoaded,
    ];

    /// Its jobs name a GPU (the placement's choice, made at arrival).
    pub fn pins(self) -> bool {
        !matches!(self, Placement::Late | Placement::Weighted)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Late => "late",
            Placement::Weighted => "weighted",
            Placement::RoundRobin => "round-robin",
            Placement::Random => "random",
            Placement::LeastLoaded => "least-loaded",
        }
    }
}

/// What to generate and how to run it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyntheticOptions {
    pub mix: Mix,
    pub seed: u64,
    pub gpus: u32,
    pub hours: f64,
    /// Offered GPU work over GPU capacity.
    pub load: f64,
    /// Each GPU's memory.
    pub gpu_capacity_bytes: u64,
    /// Jobs declare their budget (their class's upper end) as `keling launch
    /// --mem-quota` would; without, the core knows a job's memory only once
    /// it has allocated it.
    pub budgets: bool,
    /// The runtime each job declares.
    pub runtimes: Runtimes,
    /// The agent's config but for the GPUs (from `gpus` and
    /// `gpu_capacity_bytes`) and, for the `late` and `weighted` placements, the
    /// binding: [`crate::defaults::sched_config`], `keling run`'s defaults,
    /// unless a flag changes a field.
    pub agent: SchedConfig,
    pub tick_ms: u64,
    pub active_ms: u64,
    pub actuation_ms: u64,
}

/// The synthetic GPUs' memory by default: an H100's 80 GiB (the H200 has 141).
pub const GPU_MEMORY_GIB: u64 = 80;

impl Default for SyntheticOptions {
    fn default() -> Self {
        SyntheticOptions {
            mix: Mix::Mixed,
            seed: 1,
            gpus: 8,
            hours: 24.0,
            load: 0.7,
            gpu_capacity_bytes: GPU_MEMORY_GIB * GIB,
            budgets: true,
            runtimes: Runtimes::ClassMean,
            agent: crate::defaults::sched_config(),
            tick_ms: crate::defaults::RUN_TICK_MS,
            active_ms: 100,
            actuation_ms: 1,
        }
    }
}

impl SyntheticOptions {
    /// The core's config for a run with `placement`: the agent's with these
    /// GPUs; `late` binds late and `weighted` at arrival, and the pinning
    /// placements keep the agent's binding (their jobs name a GPU).
    pub fn sched_config(&self, placement: Placement) -> SchedConfig {
        let mut config = SchedConfig {
            gpus: (0..self.gpus)
                .map(|index| GpuInfo {
                    index,
                    capacity_bytes: self.gpu_capacity_bytes,
                })
                .collect(),
            ..self.agent.clone()
        };
        match placement {
            Placement::Late => config.binding = Binding::Late,
            Placement::Weighted => config.binding = Binding::AtArrival,
            _ => {}
        }
        config
    }

    /// Whether a run under `policy` and `placement` is what `keling run` does
    /// with its defaults on these GPUs: the agent's policy, config and tick,
    /// jobs that name no GPU.
    pub fn is_agent_default(&self, policy: Policy, placement: Placement) -> bool {
        let agent = SchedConfig {
            gpus: self.sched_config(placement).gpus,
            ..crate::defaults::sched_config()
        };
        policy == Policy::default()
            && !placement.pins()
            && self.sched_config(placement) == agent
            && self.tick_ms == crate::defaults::RUN_TICK_MS
    }
}

/// SplitMix64: small, fast, and the same everywhere (no dependency).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n.max(1))) as u32
    }
}

/// One generated job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Job {
    pub id: TaskId,
    pub class: usize,
    pub arrive_ns: u64,
    pub work_ns: u64,
    /// GPU memory it allocates when it first runs and holds to its end (its peak).
    pub mem_bytes: u64,
    /// The budget it declares: its class's upper end.
    pub budget_bytes: u64,
}

/// GiB as bytes, rounded down to a MiB.
fn gib_bytes(gib: f64) -> u64 {
    ((gib * 1024.0) as u64) << 20
}

/// A job of `class`'s peak memory: uniform in the class's range, whole MiB.
fn draw_mem_bytes(class: &JobClass, rng: &mut Rng) -> u64 {
    let (lo, hi) = (gib_bytes(class.mem_gib.0), gib_bytes(class.mem_gib.1));
    let mib = (hi - lo) >> 20;
    lo + ((rng.next_u64() % (mib + 1)) << 20)
}

/// The offered work per job arrival of the mixed mix, s.
pub fn mean_work_s() -> f64 {
    Mix::Mixed.mean_work_s()
}

/// The jobs of a run: depends on the mix, seed, GPUs, hours and load only.
pub fn workload(opts: &SyntheticOptions) -> Vec<Job> {
    let classes = opts.mix.classes();
    let mut rng = Rng::new(opts.seed);
    // Memory from a stream of its own: the arrivals, classes and work are those
    // the seed gave before jobs carried a drawn memory.
    let mut mem_rng = Rng::new(opts.seed ^ MEM_STREAM);
    let horizon_ns = (opts.hours * 3600.0 * S as f64) as u64;
    let rate_per_s = opts.load * f64::from(opts.gpus) / opts.mix.mean_work_s();
    let sigma = 0.6;
    let mut jobs = Vec::new();
    let mut t_s = 0.0;
    loop {
        t_s += rng.exponential(1.0 / rate_per_s);
        let arrive_ns = (t_s * S as f64) as u64;
        if arrive_ns >= horizon_ns {
            break;
        }
        let mut pick = rng.unit();
        let class = classes
            .iter()
            .position(|c| {
                pick -= c.share;
                pick <= 0.0
            })
            .unwrap_or(classes.len() - 1);
        let c = &classes[class];
        // Log-normal with the class mean: exp(mu + sigma z), mu = ln(mean) - sigma²/2.
        let work_s = (c.mean_work_s.ln() - sigma * sigma / 2.0 + sigma * rng.normal()).exp();
        jobs.push(Job {
            id: jobs.len() as TaskId + 1,
            class,
            arrive_ns,
            work_ns: ((work_s * S as f64) as u64).max(MS),
            mem_bytes: draw_mem_bytes(c, &mut mem_rng),
            budget_bytes: gib_bytes(c.mem_gib.1),
        });
    }
    jobs
}

/// Sim events, in time order (ties: the order they were scheduled in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrive(usize),
    /// An actuation lands; then the core hears of it.
    Lands(TaskId, ActionKind),
    /// The process ends with this code.
    Exits(TaskId, i32),
    /// Its work is done, if its progress generation is still this one.
    Done(TaskId, u64),
    /// It retries its allocation.
    Retry(TaskId),
    /// It shows activity, if its activity generation is still this one.
    Active(TaskId, u64),
}

/// The sim's side of one job: the process.
#[derive(Clone, Debug)]
struct Proc {
    job: usize,
    gpu: u32,
    frozen: bool,
    allocated: bool,
    started: bool,
    exited: bool,
    failures: u32,
    /// Work left, ns of a whole GPU.
    remaining_ns: f64,
    progress_gen: u64,
    active_gen: u64,
    /// Retry owed once thawed.
    retry_when_thawed: bool,
    /// Late binding: held before exec until the core binds it.
    held: bool,
}

impl Proc {
    fn progressing(&self) -> bool {
        !self.frozen && self.allocated && !self.exited
    }
}

/// What a synthetic run found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyntheticRun {
    pub mix: Mix,
    pub seed: u64,
    pub policy: Policy,
    pub placement: Placement,
    /// What `keling run` does with its defaults
    /// ([`SyntheticOptions::is_agent_default`]).
    pub default: bool,
    /// The core's config it ran with.
    pub config: SchedConfig,
    pub jobs: usize,
    pub completed: u64,
    pub gave_up_for_memory: u64,
    /// Share of the offered GPU work that was done by the end.
    pub work_done_share: f64,
    pub summary: Summary,
}

/// Where a run writes its logs (both optional).
#[derive(Clone, Debug, Default)]
pub struct RunLogs {
    /// The input log, with a header carrying the policy and config.
    pub input_log: Option<PathBuf>,
    /// The scheduling log, as the agent writes it.
    pub sched_log: Option<PathBuf>,
}

struct Sim<'a> {
    opts: &'a SyntheticOptions,
    jobs: &'a [Job],
    placement: Placement,
    sched: Scheduler,
    metrics: Metrics,
    queue: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    procs: HashMap<TaskId, Proc>,
    /// Per GPU: bytes held, unfinished jobs, processes progressing.
    used_bytes: Vec<u64>,
    unfinished: Vec<u32>,
    progressing: Vec<Vec<TaskId>>,
    last_progress_ns: Vec<u64>,
    pin_rng: Rng,
    input_log: Option<InputLogWriter>,
    sched_log: Option<Logs>,
    completed: u64,
    gave_up: u64,
    work_done_ns: f64,
    /// Held jobs the core bound in the last steps: they start now.
    to_start: Vec<TaskId>,
}

impl Sim<'_> {
    fn at(&mut self, ts_ns: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((ts_ns, self.seq, ev)));
    }

    /// One input to the core, and what the agent would do with the output.
    fn step(&mut self, input: Input) -> anyhow::Result<Output> {
        let now = input.ts_ns();
        if let Some(w) = &mut self.input_log {
            w.input(&input)?;
        }
        let out = self.sched.step(&input);
        self.metrics.observe(&input, &out);
        if let Some(logs) = &mut self.sched_log {
            for t in &out.transitions {
                logs.transition(t);
            }
        }
        for a in &out.actions {
            let land = now + self.opts.actuation_ms * MS;
            match *a {
                Action::Place { id, gpu } => {
                    if let Some(p) = self.procs.get_mut(&id) {
                        p.gpu = gpu;
                        if std::mem::take(&mut p.held) {
                            self.unfinished[gpu as usize] += 1;
                            self.to_start.push(id);
                        }
                    }
                    if let Some(logs) = &mut self.sched_log {
                        let pid = id as u32;
                        logs.record(&Record::Placement {
                            task: id,
                            pid,
                            gpu,
                            timestamp_ns: now,
                        });
                    }
                }
                Action::Freeze { id } => self.at(land, Ev::Lands(id, ActionKind::Freeze)),
                Action::Thaw { id } => self.at(land, Ev::Lands(id, ActionKind::Thaw)),
                Action::Stop { id } => self.at(land, Ev::Lands(id, ActionKind::Stop)),
                Action::Kill { id } => self.at(land, Ev::Exits(id, 137)),
                Action::Terminate { id } => {
                    self.at(land + TERMINATE_EXIT_NS, Ev::Exits(id, 143));
                }
                Action::Warn { id, remaining_ms } => {
                    if let Some(logs) = &mut self.sched_log {
                        logs.record(&Record::Warning {
                            task: id,
                            pid: id as u32,
                            remaining_ms,
                            timestamp_ns: now,
                        });
                    }
                }
                Action::Enforce { id, ref record } => {
                    if let Some(logs) = &mut self.sched_log {
                        logs.record(&Record::Enforcement {
                            task: id,
                            pid: id as u32,
                            timestamp_ns: now,
                            record: record.clone(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Brings the progress of GPU `gpu`'s processes up to `now`, applies `change`,
    /// and reschedules their completions at the new sharing.
    fn reshare(&mut self, gpu: u32, now: u64, change: impl FnOnce(&mut Self)) {
        let g = gpu as usize;
        let elapsed = now.saturating_sub(self.last_progress_ns[g]) as f64;
        let k = self.progressing[g].len();
        if k > 0 {
            let each = elapsed / k as f64;
            for id in &self.progressing[g] {
                if let Some(p) = self.procs.get_mut(id) {
                    let done = each.min(p.remaining_ns);
                    p.remaining_ns -= done;
                    self.work_done_ns += done;
                }
            }
        }
        self.last_progress_ns[g] = now;
        change(self);
        let ids: Vec<TaskId> = self
            .procs
            .iter()
            .filter(|(_, p)| p.gpu == gpu && p.progressing())
            .map(|(&id, _)| id)
            .collect();
        let mut ids = ids;
        ids.sort_unstable();
        let k = ids.len() as f64;
        for &id in &ids {
            let (gen_, at) = {
                let p = self.procs.get_mut(&id).expect("listed");
                p.progress_gen += 1;
                (p.progress_gen, now + (p.remaining_ns * k).ceil() as u64)
            };
            self.at(at, Ev::Done(id, gen_));
        }
        self.progressing[g] = ids;
    }

    /// The process tries to allocate its memory.
    fn allocate(&mut self, id: TaskId, now: u64) -> anyhow::Result<()> {
        let Some(p) = self.procs.get(&id) else {
            return Ok(());
        };
        if p.exited || p.allocated {
            return Ok(());
        }
        if p.frozen {
            self.procs.get_mut(&id).expect("exists").retry_when_thawed = true;
            return Ok(());
        }
        let (gpu, bytes) = (p.gpu, self.jobs[p.job].mem_bytes);
        let g = gpu as usize;
        if self.used_bytes[g] + bytes <= self.opts.gpu_capacity_bytes {
            self.used_bytes[g] += bytes;
            self.reshare(gpu, now, |sim| {
                sim.procs.get_mut(&id).expect("exists").allocated = true;
            });
            self.step(Input::MemAlloc {
                id,
                gpu,
                bytes,
                ts_ns: now,
            })?;
        } else {
            let p = self.procs.get_mut(&id).expect("exists");
            p.failures += 1;
            let give_up = p.failures >= ALLOC_MAX_FAILURES;
            self.step(Input::AllocFailed {
                id,
                gpu,
                bytes,
                ts_ns: now,
            })?;
            if give_up {
                self.at(now, Ev::Exits(id, OOM_EXIT_CODE));
            } else {
                self.at(now + ALLOC_RETRY_NS, Ev::Retry(id));
            }
        }
        Ok(())
    }

    fn pin(&mut self, n: usize) -> Option<u32> {
        let gpus = self.opts.gpus.max(1);
        match self.placement {
            Placement::Late | Placement::Weighted => None,
            Placement::RoundRobin => Some((n as u64 % u64::from(gpus)) as u32),
            Placement::Random => Some(self.pin_rng.below(gpus)),
            Placement::LeastLoaded => (0..gpus).min_by_key(|&g| (self.unfinished[g as usize], g)),
        }
    }

    fn on(&mut self, now: u64, ev: Ev) -> anyhow::Result<()> {
        match ev {
            Ev::Arrive(n) => {
                let job = &self.jobs[n];
                let c = &self.opts.mix.classes()[job.class];
                let id = job.id;
                let pin = self.pin(n);
                let held = self.placement == Placement::Late;
                self.procs.insert(
                    id,
                    Proc {
                        job: n,
                        gpu: pin.unwrap_or(0),
                        frozen: false,
                        allocated: false,
                        started: false,
                        exited: false,
                        failures: 0,
                        remaining_ns: job.work_ns as f64,
                        progress_gen: 0,
                        active_gen: 0,
                        retry_when_thawed: false,
                        held,
                    },
                );
                let spec = TaskSpec {
                    id,
                    pid: id as u32,
                    name: c.name.to_owned(),
                    priority: c.priority,
                    gpu: pin,
                    mem_quota_bytes: self.opts.budgets.then_some(job.budget_bytes),
                    max_duration_ms: c.max_duration_ms,
                    grace_ms: None,
                    hard_kill: None,
                    expected_runtime_ms: self.opts.runtimes.declared_ms(c, job.work_ns),
                };
                let out = self.step(Input::Arrive { spec, ts_ns: now })?;
                if held {
                    // Started when bound: now, or when a GPU can run it.
                    return self.start_bound(now);
                }
                let gpu = self.procs[&id].gpu;
                self.unfinished[gpu as usize] += 1;
                let queued = out
                    .actions
                    .iter()
                    .any(|a| matches!(a, Action::Freeze { id: f } if *f == id));
                if !queued {
                    self.started(id, now)?;
                }
            }
            Ev::Lands(id, kind) => {
                let Some(p) = self.procs.get(&id) else {
                    return Ok(());
                };
                if p.exited {
                    return Ok(());
                }
                let gpu = p.gpu;
                let frozen = matches!(kind, ActionKind::Freeze | ActionKind::Stop);
                self.reshare(gpu, now, |sim| {
                    let p = sim.procs.get_mut(&id).expect("exists");
                    p.frozen = frozen;
                    p.active_gen += 1;
                });
                self.step(Input::Confirmed {
                    id,
                    action: kind,
                    ts_ns: now,
                })?;
                if !frozen {
                    self.started(id, now)?;
                }
            }
            Ev::Exits(id, code) => self.exit(id, now, code)?,
            Ev::Done(id, gen_) => {
                if self
                    .procs
                    .get(&id)
                    .is_some_and(|p| p.progress_gen == gen_ && p.progressing())
                {
                    self.exit(id, now, 0)?;
                }
            }
            Ev::Retry(id) => self.allocate(id, now)?,
            Ev::Active(id, gen_) => {
                if self
                    .procs
                    .get(&id)
                    .is_some_and(|p| p.active_gen == gen_ && !p.frozen && !p.exited)
                {
                    self.step(Input::Active { id, ts_ns: now })?;
                    self.at(now + self.opts.active_ms * MS, Ev::Active(id, gen_));
                }
            }
        }
        Ok(())
    }

    /// Starts the held jobs the core bound (late binding), and those their
    /// start leads it to bind.
    fn start_bound(&mut self, now: u64) -> anyhow::Result<()> {
        while let Some(id) = self.to_start.pop() {
            self.started(id, now)?;
        }
        Ok(())
    }

    /// The process runs (from arrival, bound, or thawed): it shows activity and
    /// allocates what it has not yet.
    fn started(&mut self, id: TaskId, now: u64) -> anyhow::Result<()> {
        let Some(p) = self.procs.get_mut(&id) else {
            return Ok(());
        };
        let gen_ = p.active_gen;
        let first = !p.started;
        p.started = true;
        let retry = std::mem::take(&mut p.retry_when_thawed);
        self.at(now + self.opts.active_ms * MS, Ev::Active(id, gen_));
        if first || retry {
            self.allocate(id, now)?;
        }
        Ok(())
    }

    fn exit(&mut self, id: TaskId, now: u64, code: i32) -> anyhow::Result<()> {
        let Some(p) = self.procs.get(&id) else {
            return Ok(());
        };
        if p.exited {
            return Ok(());
        }
        if p.held {
            // Killed before it was bound (its session limit): it never ran.
            self.procs.remove(&id);
            self.step(Input::Exit {
                id,
                exit_code: code,
                ts_ns: now,
            })?;
            return Ok(());
        }
        let (gpu, allocated, bytes) = (p.gpu, p.allocated, self.jobs[p.job].mem_bytes);
        self.reshare(gpu, now, |sim| {
            sim.procs.get_mut(&id).expect("exists").exited = true;
        });
        if allocated {
            self.used_bytes[gpu as usize] -= bytes;
        }
        self.unfinished[gpu as usize] = self.unfinished[gpu as usize].saturating_sub(1);
        match code {
            0 => self.completed += 1,
            OOM_EXIT_CODE => self.gave_up += 1,
            _ => {}
        }
        self.step(Input::Exit {
            id,
            exit_code: code,
            ts_ns: now,
        })?;
        self.procs.remove(&id);
        Ok(())
    }
}

/// Runs `jobs` under `policy` and `placement` until every job has ended or the
/// horizon (the options' hours) is reached.
pub fn run(
    opts: &SyntheticOptions,
    jobs: &[Job],
    policy: Policy,
    placement: Placement,
    logs: &RunLogs,
) -> anyhow::Result<SyntheticRun> {
    let config = opts.sched_config(placement);
    let default = opts.is_agent_default(policy, placement);
    let gpus = opts.gpus.max(1) as usize;
    let input_log = match &logs.input_log {
        Some(path) => Some(InputLogWriter::create(
            path,
            &InputLogHeader {
                keling_input_log: INPUT_LOG_VERSION,
                policy,
                config: config.clone(),
                core_rules: Some(keling_sched::RULES_REVISION),
            },
        )?),
        None => None,
    };
    let sched_log = match &logs.sched_log {
        Some(path) => Some(Logs::open(Some(path), None)?),
        None => None,
    };
    let mut sim = Sim {
        opts,
        jobs,
        placement,
        metrics: Metrics::for_config(&config, policy).movable_until_run(),
        sched: Scheduler::with_policy(config, policy),
        queue: BinaryHeap::new(),
        seq: 0,
        procs: HashMap::new(),
        used_bytes: vec![0; gpus],
        unfinished: vec![0; gpus],
        progressing: vec![Vec::new(); gpus],
        last_progress_ns: vec![0; gpus],
        pin_rng: Rng::new(opts.seed ^ 0x005E_ED0F_91AC_E000),
        input_log,
        sched_log,
        completed: 0,
        gave_up: 0,
        work_done_ns: 0.0,
        to_start: Vec::new(),
    };
    for (n, job) in jobs.iter().enumerate() {
        sim.at(job.arrive_ns, Ev::Arrive(n));
    }
    let horizon_ns = (opts.hours * 3600.0 * S as f64) as u64;
    let tick_ns = opts.tick_ms.max(1) * MS;
    let mut next_tick = tick_ns;
    loop {
        let next_event = sim.queue.peek().map(|Reverse((ts, _, _))| *ts);
        match next_event {
            Some(ts) if ts <= next_tick && ts <= horizon_ns => {
                let Reverse((ts, _, ev)) = sim.queue.pop().expect("peeked");
                sim.on(ts, ev)?;
                sim.start_bound(ts)?;
            }
            _ if next_tick <= horizon_ns => {
                sim.step(Input::Tick { ts_ns: next_tick })?;
                sim.start_bound(next_tick)?;
                next_tick += tick_ns;
            }
            _ => break,
        }
    }
    // Work done by the processes still progressing at the horizon.
    for g in 0..gpus as u32 {
        sim.reshare(g, horizon_ns, |_| {});
    }
    if let Some(w) = sim.input_log.take() {
        w.finish()?;
    }
    if let Some(logs) = &mut sim.sched_log {
        logs.flush();
    }
    let offered: f64 = jobs.iter().map(|j| j.work_ns as f64).sum();
    Ok(SyntheticRun {
        mix: opts.mix,
        seed: opts.seed,
        policy,
        placement,
        default,
        config: sim.sched.config().clone(),
        jobs: jobs.len(),
        completed: sim.completed,
        gave_up_for_memory: sim.gave_up,
        work_done_share: if offered > 0.0 {
            sim.work_done_ns / offered
        } else {
            0.0
        },
        summary: sim.metrics.finish().0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SyntheticOptions {
        SyntheticOptions {
            gpus: 2,
            hours: 0.5,
            load: 0.8,
            ..SyntheticOptions::default()
        }
    }

    #[test]
    fn the_classes_shares_add_up_and_span_all_three_priority_classes() {
        let total: f64 = CLASSES.iter().map(|c| c.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        let mut priorities: Vec<u8> = CLASSES.iter().map(|c| c.priority).collect();
        priorities.dedup();
        assert_eq!(priorities.len(), 12, "one priority per class");
        for class in [
            keling_sched::Class::RealTime,
            keling_sched::Class::Interactive,
            keling_sched::Class::Background,
        ] {
            assert!(
                CLASSES
                    .iter()
                    .any(|c| keling_sched::class_of(c.priority) == class)
            );
        }
    }

    #[test]
    fn the_transcode_mix_is_resolution_by_codec_minutes_long_1_to_8_gib() {
        let classes = Mix::Transcode.classes();
        let total: f64 = classes.iter().map(|c| c.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        let lo = classes.iter().map(|c| c.mem_gib.0).fold(f64::MAX, f64::min);
        let hi = classes.iter().map(|c| c.mem_gib.1).fold(0.0, f64::max);
        assert_eq!(
            (lo, hi),
            (0.75, 8.0),
            "a few GiB each: 1-8 GiB by resolution"
        );
        assert!(
            classes
                .iter()
                .all(|c| (60.0..=1_800.0).contains(&c.mean_work_s))
        );
        let mut priorities: Vec<u8> = classes.iter().map(|c| c.priority).collect();
        priorities.sort_unstable();
        priorities.dedup();
        assert_eq!(priorities, [3, 5, 8], "a few priorities");
        let names: std::collections::BTreeSet<&str> = classes.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), 12);
        let opts = SyntheticOptions {
            mix: Mix::Transcode,
            hours: 50.0,
            ..small()
        };
        let jobs = workload(&opts);
        assert_ne!(jobs, workload(&small()), "another mix, other jobs");
        let offered_s: f64 = jobs.iter().map(|j| j.work_ns as f64 / 1e9).sum();
        let load = offered_s / (50.0 * 3600.0 * 2.0);
        assert!((0.6..1.0).contains(&load), "offered load {load}");
    }

    /// Late binding in closed loop: jobs wait unbound and start where they are
    /// bound; no GPU idles while one waits; the run is reproducible and its
    /// logs replay exactly.
    #[test]
    fn late_binding_starts_jobs_where_they_are_bound_and_replays_exactly() {
        let opts = SyntheticOptions {
            hours: 3.0,
            load: 0.9,
            tick_ms: 100,
            active_ms: 200,
            mix: Mix::Transcode,
            ..small()
        };
        let jobs = workload(&opts);
        let dir = std::env::temp_dir().join(format!("keling-late-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let logs = RunLogs {
            input_log: Some(dir.join("in.jsonl")),
            sched_log: Some(dir.join("sched.jsonl")),
        };
        let late = run(&opts, &jobs, Policy::Hybrid, Placement::Late, &logs).unwrap();
        assert_eq!(
            late,
            run(
                &opts,
                &jobs,
                Policy::Hybrid,
                Placement::Late,
                &RunLogs::default()
            )
            .unwrap()
        );
        assert_eq!(late.summary.tasks, jobs.len());
        assert!(late.completed > 0);
        assert!(
            late.summary.queueing_delay_ms.max > 0.0,
            "a busy run: jobs wait"
        );
        assert_eq!(late.summary.idle_while_queued_gpu_s, 0.0);

        let reader =
            super::super::log::InputLogReader::open(logs.input_log.as_ref().unwrap()).unwrap();
        let header = reader.header.clone().unwrap();
        assert_eq!(header.config.binding, Binding::Late);
        let recorded = super::super::exact::recorded_decisions(
            &super::super::log::read_sched_log(logs.sched_log.as_ref().unwrap()).unwrap(),
        );
        let r = super::super::exact::replay(reader, header.config, header.policy, Some(&recorded))
            .unwrap();
        let c = r.comparison.unwrap();
        assert!(c.recorded > 100, "{} decisions", c.recorded);
        assert_eq!((c.match_rate, c.first_difference), (1.0, None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The core's decisions on fixed synthetic workloads, as digests pinned
    /// beside [`keling_sched::RULES_REVISION`]: a change to a decision rule
    /// fails here until the revision is raised (input logs record it, and an
    /// exact replay of a log recorded under other rules says so rather than
    /// calling the difference a bug) and the digests are pinned again. The
    /// cases: the agent's defaults on both mixes, FIFO, and the slot model
    /// with binding at arrival under hybrid and round robin. A tripwire, not a
    /// proof: a change no case exercises passes (keeping no empty GPU changes
    /// the FIFO case only).
    #[test]
    fn the_cores_decisions_are_pinned_to_its_rules_revision() {
        /// FNV-1a, 64 bits: stable across toolchains (std's hasher is not).
        fn fnv(bytes: &[u8]) -> u64 {
            bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
        }
        let slots = SchedConfig {
            sharing: keling_sched::Sharing::Slots,
            slots_per_gpu: 1,
            ..crate::defaults::sched_config()
        };
        // Under memory sharing round robin decides as FIFO on this workload
        // (equal priorities run side by side): it is taken under the slot
        // model, where it differs. Goav decides as hybrid on all of them (its
        // guard does not come into play), so it has no case of its own.
        let cases = [
            (Mix::Transcode, Policy::Hybrid, Placement::Late, None),
            (Mix::Mixed, Policy::Hybrid, Placement::Late, None),
            (Mix::Mixed, Policy::Fifo, Placement::Late, None),
            (
                Mix::Mixed,
                Policy::Hybrid,
                Placement::Weighted,
                Some(slots.clone()),
            ),
            (
                Mix::Mixed,
                Policy::RoundRobin,
                Placement::Weighted,
                Some(slots),
            ),
        ];
        let dir = std::env::temp_dir().join(format!("keling-pinned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let digests: Vec<u64> = cases
            .into_iter()
            .enumerate()
            .map(|(i, (mix, policy, placement, agent))| {
                let opts = SyntheticOptions {
                    mix,
                    seed: 7,
                    gpus: 2,
                    hours: 1.0,
                    load: 1.5,
                    tick_ms: 100,
                    agent: agent.unwrap_or_else(crate::defaults::sched_config),
                    ..SyntheticOptions::default()
                };
                let path = dir.join(format!("sched-{i}.jsonl"));
                let logs = RunLogs {
                    input_log: None,
                    sched_log: Some(path.clone()),
                };
                run(&opts, &workload(&opts), policy, placement, &logs).unwrap();
                let decisions = super::super::exact::recorded_decisions(
                    &super::super::log::read_sched_log(&path).unwrap(),
                );
                assert!(
                    decisions.len() > 50,
                    "case {i}: {} decisions",
                    decisions.len()
                );
                fnv(format!("{decisions:?}").as_bytes())
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        const PINNED: (u32, [u64; 5]) = (
            1,
            [
                15_516_830_146_237_007_431,
                7_467_516_879_401_794_138,
                6_228_727_986_505_833_819,
                14_082_272_901_148_979_983,
                16_022_069_151_549_322_798,
            ],
        );
        assert_eq!(
            (keling_sched::RULES_REVISION, digests.as_slice()),
            (PINNED.0, PINNED.1.as_slice()),
            "the core's decisions (or its revision) changed: if a decision rule changed, \
             raise keling_sched::RULES_REVISION and pin the revision and these digests \
             together; if only the synthetic workload or the agent's defaults changed (the \
             header records the config), pin the digests alone"
        );
    }

    /// Jobs carry their memory: a peak within their class's range (whole MiB),
    /// the range's upper end as their budget; the same seed draws the same.
    #[test]
    fn jobs_carry_memory_within_their_class_range() {
        for mix in Mix::ALL {
            let opts = SyntheticOptions {
                mix,
                hours: 20.0,
                ..small()
            };
            let jobs = workload(&opts);
            assert!(jobs.len() > 100, "{}", jobs.len());
            assert_eq!(jobs, workload(&opts), "same seed, same jobs");
            for j in &jobs {
                let c = &mix.classes()[j.class];
                let (lo, hi) = (c.mem_gib.0 * GIB as f64, c.mem_gib.1 * GIB as f64);
                assert!(
                    (lo..=hi).contains(&(j.mem_bytes as f64)),
                    "{}: {} bytes",
                    c.name,
                    j.mem_bytes
                );
                assert_eq!(j.mem_bytes % (1 << 20), 0);
                assert_eq!(j.budget_bytes as f64, hi, "{}", c.name);
            }
            // The draw spreads over the range, not one value per class.
            let first = jobs[0].class;
            let mut mems: Vec<u64> = jobs
                .iter()
                .filter(|j| j.class == first)
                .map(|j| j.mem_bytes)
                .collect();
            mems.sort_unstable();
            mems.dedup();
            assert!(mems.len() > 3, "{mems:?}");
            // Another seed draws other memory.
            let other = workload(&SyntheticOptions { seed: 2, ..opts });
            assert_ne!(
                jobs.iter().map(|j| j.mem_bytes).collect::<Vec<_>>(),
                other.iter().map(|j| j.mem_bytes).collect::<Vec<_>>()
            );
        }
    }

    /// The jobs of `opts` and the spec of each as the core heard it (from
    /// the input log of a run under late binding).
    fn specs_heard(opts: &SyntheticOptions) -> (Vec<Job>, Vec<TaskSpec>) {
        let dir = std::env::temp_dir().join(format!("keling-specs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let jobs = workload(opts);
        // One file per call: tests run at once.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("in-{n}.jsonl"));
        let logs = RunLogs {
            input_log: Some(path.clone()),
            sched_log: None,
        };
        run(opts, &jobs, Policy::Hybrid, Placement::Late, &logs).unwrap();
        let reader = super::super::log::InputLogReader::open(&path).unwrap();
        let specs: Vec<TaskSpec> = reader
            .filter_map(|i| match i.unwrap() {
                Input::Arrive { spec, .. } => Some(spec),
                _ => None,
            })
            .collect();
        let _ = std::fs::remove_file(&path);
        // The last call out removes the directory (it is not empty before).
        let _ = std::fs::remove_dir(&dir);
        assert_eq!(specs.len(), jobs.len());
        (jobs, specs)
    }

    /// The core hears each job's budget in its spec (as `keling launch
    /// --mem-quota`), or none with `budgets` off.
    #[test]
    fn jobs_declare_their_budget_to_the_core() {
        for budgets in [true, false] {
            let (jobs, specs) = specs_heard(&SyntheticOptions {
                hours: 0.2,
                budgets,
                tick_ms: 100,
                ..small()
            });
            for spec in specs {
                let job = &jobs[spec.id as usize - 1];
                assert_eq!(spec.mem_quota_bytes, budgets.then_some(job.budget_bytes));
            }
        }
    }

    /// Each job declares its class's mean work, its exact work, or nothing,
    /// as `runtimes` says (as `keling launch --expected-runtime-ms`).
    #[test]
    fn jobs_declare_the_runtime_the_options_say() {
        for runtimes in [Runtimes::ClassMean, Runtimes::Exact, Runtimes::None] {
            let opts = SyntheticOptions {
                hours: 0.2,
                runtimes,
                tick_ms: 100,
                ..small()
            };
            let (jobs, specs) = specs_heard(&opts);
            for spec in specs {
                let job = &jobs[spec.id as usize - 1];
                let class = &opts.mix.classes()[job.class];
                let want = match runtimes {
                    Runtimes::ClassMean => Some((class.mean_work_s * 1000.0) as u64),
                    Runtimes::Exact => Some(job.work_ns.div_ceil(MS)),
                    Runtimes::None => None,
                };
                assert_eq!(
                    spec.expected_runtime_ms, want,
                    "{runtimes:?}, job {}",
                    spec.id
                );
            }
        }
    }

    #[test]
    fn the_workload_depends_on_the_seed_only_and_offers_the_load() {
        let opts = SyntheticOptions {
            hours: 200.0,
            ..small()
        };
        let a = workload(&opts);
        assert_eq!(a, workload(&opts));
        let b = workload(&SyntheticOptions {
            seed: 2,
            ..opts.clone()
        });
        assert_ne!(a, b);
        let offered_s: f64 = a.iter().map(|j| j.work_ns as f64 / 1e9).sum();
        let capacity_s = 200.0 * 3600.0 * 2.0;
        let load = offered_s / capacity_s;
        assert!((0.5..1.1).contains(&load), "offered load {load}");
        assert!(a.windows(2).all(|w| w[0].arrive_ns <= w[1].arrive_ns));
    }

    #[test]
    fn runs_are_reproducible_and_policies_differ() {
        // One GPU, so a job cannot be placed away from a busy one.
        let opts = SyntheticOptions {
            gpus: 1,
            hours: 8.0,
            tick_ms: 100,
            active_ms: 200,
            ..small()
        };
        let jobs = workload(&opts);
        let run = |policy| {
            run(
                &opts,
                &jobs,
                policy,
                Placement::Weighted,
                &RunLogs::default(),
            )
            .unwrap()
        };
        let hybrid = run(Policy::Hybrid);
        assert_eq!(hybrid, run(Policy::Hybrid));
        assert!(hybrid.completed > 0);
        assert_eq!(hybrid.summary.tasks, jobs.len(), "every job arrived");
        let fifo = run(Policy::Fifo);
        assert_eq!(fifo.summary.preemptions, 0, "FIFO never preempts");
        // Real-time jobs wait less under the hybrid policy than under FIFO.
        let rt = |r: &SyntheticRun| -> f64 {
            r.summary
                .per_task
                .iter()
                .filter(|d| d.priority <= 2)
                .map(|d| d.queueing_delay_ms)
                .sum()
        };
        assert!(rt(&fifo) > 0.0, "FIFO makes real-time jobs wait");
        assert!(
            rt(&hybrid) < rt(&fifo) / 10.0,
            "{} vs {}",
            rt(&hybrid),
            rt(&fifo)
        );
    }
}
