//! What a replay reports: per-task queueing delay, GPU busy share, preemptions,
//! evictions and the load-balance error, measured from the core's own inputs and
//! outputs on the virtual clock (the inputs' timestamps).
//!
//! **Queueing delay** of a task: the time it wanted the GPU without holding it.
//! A wait starts at arrival, at a preemption for any reason but `idle`, or at
//! the first `Active` after an idle preemption (the task wants the GPU again);
//! it ends when the task runs (`→ RUNNING`), ends (`→ COMPLETED | FAILED`), or an
//! `Idle` input says it no longer wants the GPU. A task placed straight into a
//! slot waits 0. Waits still open at the end of the log are closed there.
//!
//! **Turnaround** of a task: from arrival to its end (`→ COMPLETED | FAILED`),
//! for the tasks that ended within the log.
//!
//! **GPU busy share**: the fraction of the replayed span (first to last input)
//! during which at least one task on the GPU was `RUNNING`. The **load-balance
//! error** is [`keling_sched::load_balance_error`] of the GPUs' busy times:
//! (max - min) / mean across the GPUs the config names (or, with none
//! configured, those tasks were placed on). The **memory load-balance error** is
//! the same over each GPU's time-averaged memory held (from `MemAlloc`, `MemFree`
//! and exits), the figure `keling status` shows at one instant.
//!
//! **Idle while queued**: GPU-seconds during which a GPU had a free slot (fewer
//! tasks `RUNNING` or being thawed than `slots_per_gpu`) while a task that may
//! run there was waiting. A waiting task may run on any GPU until it has run
//! once (a CUDA context does not move); after that, and for a task whose spec
//! names a GPU, only on its own. Synthetic runs count their pinning placements'
//! GPUs as choices, not constraints ([`Metrics::movable_until_run`]): the figure
//! is what a placement decided at arrival costs. Late binding keeps it at 0.
use std::collections::{BTreeMap, HashMap};

use keling_sched::{Action, Input, Output, Reason, TaskId, TaskState};
use serde::Serialize;

use crate::log_format::TransitionLine;

/// A wait that ended: the task, its GPU, when it started and how long it lasted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub task: TaskId,
    pub gpu: Option<u32>,
    pub start_ns: u64,
    pub ns: u64,
}

#[derive(Clone, Debug, Default)]
struct TaskStat {
    name: String,
    priority: u8,
    gpu: Option<u32>,
    state: Option<TaskState>,
    waiting_since: Option<u64>,
    waited_ns: u64,
    first_wait_ns: Option<u64>,
    /// Memory held, per GPU.
    mem: Vec<(u32, u64)>,
    arrived_ns: u64,
    /// When it completed or failed (`None`: it has not ended).
    ended_ns: Option<u64>,
    /// Its spec names its GPU, and that is a constraint.
    pinned: bool,
    /// It has been `RUNNING`: it may run on its GPU only.
    has_run: bool,
    /// A `Thaw` is out for it and it is not `RUNNING` yet.
    thawing: bool,
    /// How it is counted among the waiting tasks: `Some(None)` on any GPU,
    /// `Some(Some(g))` on GPU g only, `None` not at all.
    counted: Option<Option<u32>>,
    /// Its declared memory budget (the spec's quota).
    budget: Option<u64>,
    /// The most it has held, all GPUs together.
    peak: u64,
}

impl TaskStat {
    /// What it may still take on `gpu` under memory sharing: its budget,
    /// else what it holds and has peaked at, less what it holds there (the
    /// core's demand).
    fn extra_on(&self, gpu: u32) -> u64 {
        let held: u64 = self.mem.iter().map(|m| m.1).sum();
        let here = self.mem.iter().find(|m| m.0 == gpu).map_or(0, |m| m.1);
        self.budget
            .unwrap_or(held.max(self.peak))
            .saturating_sub(here)
    }
}

/// Memory sharing as the core's config has it, for "idle while queued".
#[derive(Clone, Debug)]
struct Sharing {
    /// Tasks at most at once on a GPU.
    cap: u32,
    /// Each GPU's capacity (unknown: memory never keeps a task out).
    capacity: BTreeMap<u32, u64>,
    /// Priorities count (not under FIFO and round robin).
    priorities: bool,
    /// Tasks counted among the waiting ones.
    waiting: std::collections::BTreeSet<TaskId>,
    /// Something changed since the GPUs' flags were computed.
    dirty: bool,
}

#[derive(Clone, Debug, Default)]
struct GpuStat {
    running: u32,
    busy_since: u64,
    busy_ns: u64,
    mem_bytes: u64,
    mem_since: u64,
    /// Bytes held times ns.
    mem_byte_ns: f64,
    /// Tasks with a `Thaw` out and not yet `RUNNING`.
    thawing: u32,
    /// Time with a free slot while a task that may run here waited.
    idle_queued_ns: u64,
    /// Memory held here by processes in no task.
    outside: u64,
    /// The tasks `RUNNING` here.
    running_ids: std::collections::BTreeSet<TaskId>,
    /// The tasks with a `Thaw` out here (they run next).
    thawing_ids: std::collections::BTreeSet<TaskId>,
    /// Under memory sharing: a waiting task could run here now.
    could_run: bool,
}

impl GpuStat {
    fn mem_change(&mut self, now: u64, add: u64, sub: u64) {
        self.mem_byte_ns += self.mem_bytes as f64 * now.saturating_sub(self.mem_since) as f64;
        self.mem_since = now;
        self.mem_bytes = self.mem_bytes.saturating_add(add).saturating_sub(sub);
    }
}

/// Accumulates what a replay reports, one step at a time.
#[derive(Debug)]
pub struct Metrics {
    tasks: HashMap<TaskId, TaskStat>,
    gpus: BTreeMap<u32, GpuStat>,
    first_ns: Option<u64>,
    now_ns: u64,
    inputs: u64,
    preemptions: BTreeMap<&'static str, u64>,
    evictions: u64,
    endings: BTreeMap<&'static str, u64>,
    /// Every finished wait, when asked to keep them (reports draw them).
    waits: Option<Vec<Wait>>,
    /// Slots per GPU, for "idle while queued".
    slots: u32,
    /// Specs' GPUs are choices of a placement, not constraints.
    movable: bool,
    /// Waiting tasks that may run on any GPU.
    waiting_anywhere: u64,
    /// Per GPU, waiting tasks that may run there only.
    waiting_on: BTreeMap<u32, u64>,
    /// Under memory sharing, what "idle while queued" needs.
    sharing: Option<Sharing>,
}

impl Metrics {
    /// Metrics over `gpus` (the configured ones: a GPU nobody used counts as idle).
    pub fn new(gpus: impl IntoIterator<Item = u32>) -> Self {
        Metrics {
            tasks: HashMap::new(),
            gpus: gpus.into_iter().map(|g| (g, GpuStat::default())).collect(),
            first_ns: None,
            now_ns: 0,
            inputs: 0,
            preemptions: BTreeMap::new(),
            evictions: 0,
            endings: BTreeMap::new(),
            waits: None,
            slots: 1,
            movable: false,
            waiting_anywhere: 0,
            waiting_on: BTreeMap::new(),
            sharing: None,
        }
    }

    /// Metrics over `config`'s GPUs, counting "idle while queued" as its
    /// sharing has it: under [`keling_sched::Sharing::Memory`] a GPU is idle
    /// while a task waits that could run there (below the cap, its memory
    /// fitting beside what is held there, nobody of a higher priority
    /// running there); by slots, while a slot is free.
    pub fn for_config(config: &keling_sched::SchedConfig, policy: keling_sched::Policy) -> Self {
        let mut m = Metrics::new(config.gpus.iter().map(|g| g.index)).with_slots(config.slots());
        if config.sharing == keling_sched::Sharing::Memory {
            m.sharing = Some(Sharing {
                cap: u32::try_from(config.cap()).unwrap_or(u32::MAX),
                capacity: config
                    .gpus
                    .iter()
                    .map(|g| (g.index, g.capacity_bytes))
                    .collect(),
                priorities: matches!(
                    policy,
                    keling_sched::Policy::Hybrid | keling_sched::Policy::Goav
                ),
                waiting: Default::default(),
                dirty: false,
            });
        }
        m
    }

    /// Under memory sharing: which GPUs a waiting task could run on now.
    fn recompute_could_run(&mut self) {
        let Some(sh) = &mut self.sharing else {
            return;
        };
        if !std::mem::take(&mut sh.dirty) {
            return;
        }
        for (&gpu, g) in self.gpus.iter_mut() {
            let n = g.running + g.thawing;
            g.could_run = n < sh.cap && {
                // The running tasks and those being thawed (they run next):
                // their best priority, and what they may still take (the core
                // keeps it for them).
                let admitted = || {
                    g.running_ids
                        .iter()
                        .chain(&g.thawing_ids)
                        .filter_map(|id| self.tasks.get(id))
                };
                let best = admitted().map(|t| t.priority).min();
                let headroom: u64 = admitted().map(|t| t.extra_on(gpu)).sum();
                let avail = sh.capacity.get(&gpu).map(|&c| {
                    c.saturating_sub(g.outside)
                        .saturating_sub(g.mem_bytes)
                        .saturating_sub(headroom)
                });
                sh.waiting.iter().any(|id| {
                    let Some(t) = self.tasks.get(id) else {
                        return false;
                    };
                    // A task being thawed is on its way to run: admitted.
                    let here = !t.thawing
                        && match t.counted {
                            Some(None) => true,
                            Some(Some(on)) => on == gpu,
                            None => false,
                        };
                    // The first task on a GPU always fits (as in the core).
                    here && (n == 0
                        || ((!sh.priorities || best.is_none_or(|b| b >= t.priority))
                            && avail.is_none_or(|a| t.extra_on(gpu) <= a)))
                })
            };
        }
    }

    /// The config's slots per GPU (default 1), for "idle while queued".
    pub fn with_slots(mut self, slots: usize) -> Self {
        self.slots = u32::try_from(slots.max(1)).unwrap_or(u32::MAX);
        self
    }

    /// Count a task whose spec names a GPU as movable until it has run: the
    /// synthetic placements' pins are their decisions, not the jobs' needs.
    pub fn movable_until_run(mut self) -> Self {
        self.movable = true;
        self
    }

    /// Adds the time since the last input to the GPUs that had a free slot
    /// while a task that may run there waited.
    fn accrue_idle_while_queued(&mut self, ts: u64) {
        if self.first_ns.is_none() || ts <= self.now_ns {
            return;
        }
        let elapsed = ts - self.now_ns;
        if self.sharing.is_some() {
            for g in self.gpus.values_mut() {
                if g.could_run {
                    g.idle_queued_ns += elapsed;
                }
            }
            return;
        }
        let slots = self.slots;
        for (gpu, g) in self.gpus.iter_mut() {
            let waiting =
                self.waiting_anywhere > 0 || self.waiting_on.get(gpu).is_some_and(|&n| n > 0);
            if waiting && g.running + g.thawing < slots {
                g.idle_queued_ns += elapsed;
            }
        }
    }

    /// Brings how `id` is counted among the waiting tasks up to date.
    fn recount(&mut self, id: TaskId) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        let now = if t.waiting_since.is_some() && t.ended_ns.is_none() {
            if t.pinned || t.has_run {
                t.gpu.map(Some)
            } else {
                Some(None)
            }
        } else {
            None
        };
        if now == t.counted {
            return;
        }
        match std::mem::replace(&mut t.counted, now) {
            Some(None) => self.waiting_anywhere -= 1,
            Some(Some(g)) => {
                if let Some(n) = self.waiting_on.get_mut(&g) {
                    *n -= 1;
                }
            }
            None => {}
        }
        match now {
            Some(None) => self.waiting_anywhere += 1,
            Some(Some(g)) => *self.waiting_on.entry(g).or_default() += 1,
            None => {}
        }
        if let Some(sh) = &mut self.sharing {
            if now.is_some() {
                sh.waiting.insert(id);
            } else {
                sh.waiting.remove(&id);
            }
        }
    }

    /// Keep every wait (for [`Metrics::waits`]).
    pub fn keep_waits(mut self) -> Self {
        self.waits = Some(Vec::new());
        self
    }

    /// One step of the core: the input and what it returned.
    pub fn observe(&mut self, input: &Input, out: &Output) {
        self.inputs += 1;
        let ts = input.ts_ns().max(self.now_ns);
        self.accrue_idle_while_queued(ts);
        self.first_ns.get_or_insert(ts);
        self.now_ns = ts;
        match input {
            Input::Arrive { spec, .. } => {
                let pinned = spec.gpu.is_some() && !self.movable;
                self.tasks.entry(spec.id).or_insert_with(|| TaskStat {
                    name: spec.name.clone(),
                    priority: spec.priority.min(keling_sched::LOWEST_PRIORITY),
                    gpu: spec.gpu,
                    waiting_since: Some(ts),
                    arrived_ns: ts,
                    pinned,
                    budget: spec.mem_quota_bytes,
                    ..TaskStat::default()
                });
            }
            Input::OutsideMem { gpu, bytes, .. } => {
                self.gpus.entry(*gpu).or_default().outside = *bytes;
            }
            Input::Idle { id, .. } => self.end_wait(*id, ts),
            Input::MemAlloc { id, gpu, bytes, .. } => self.memory(*id, *gpu, *bytes, 0, ts),
            Input::MemFree { id, gpu, bytes, .. } => self.memory(*id, *gpu, 0, *bytes, ts),
            _ => {}
        }
        for a in &out.actions {
            match *a {
                Action::Place { id, gpu } => {
                    if let Some(t) = self.tasks.get_mut(&id) {
                        t.gpu = Some(gpu);
                        self.gpus.entry(gpu).or_default();
                    }
                }
                Action::Thaw { id } => {
                    if let Some(t) = self.tasks.get_mut(&id)
                        && !t.thawing
                        && t.ended_ns.is_none()
                        && let Some(g) = t.gpu.and_then(|g| self.gpus.get_mut(&g))
                    {
                        t.thawing = true;
                        g.thawing += 1;
                        g.thawing_ids.insert(id);
                    }
                }
                _ => {}
            }
        }
        for tr in &out.transitions {
            self.transition(tr.task, tr.from, tr.to, tr.reason, tr.timestamp_ns);
        }
        if let Some(id) = input.task() {
            self.recount(id);
        }
        for id in out.actions.iter().map(Action::task) {
            self.recount(id);
        }
        for tr in &out.transitions {
            self.recount(tr.task);
        }
        if let Some(sh) = &mut self.sharing {
            sh.dirty |= !out.actions.is_empty()
                || !out.transitions.is_empty()
                || !matches!(input, Input::Tick { .. } | Input::Active { .. });
        }
        self.recompute_could_run();
    }

    /// A placement record of a scheduling log (for reports): the task arrived
    /// then (the agent logs it when it places the task, at arrival).
    pub fn observe_placement(&mut self, task: TaskId, gpu: u32, ts_ns: u64) {
        let ts = ts_ns.max(self.now_ns);
        self.first_ns.get_or_insert(ts);
        self.now_ns = ts;
        self.gpus.entry(gpu).or_default();
        self.tasks.entry(task).or_insert_with(|| TaskStat {
            gpu: Some(gpu),
            waiting_since: Some(ts),
            arrived_ns: ts,
            ..TaskStat::default()
        });
    }

    /// A transition line of a scheduling log, without the inputs behind it
    /// (for reports): a task's placement record, or else its first line, stands
    /// for its arrival. Lines whose states have no name are skipped.
    pub fn observe_line(&mut self, line: &TransitionLine) {
        let Some((from, to)) = line.states() else {
            return;
        };
        let ts = line.timestamp_ns.max(self.now_ns);
        self.first_ns.get_or_insert(ts);
        self.now_ns = ts;
        if let Some(g) = line.gpu {
            self.gpus.entry(g).or_default();
        }
        let t = self.tasks.entry(line.task).or_insert_with(|| TaskStat {
            waiting_since: (from == TaskState::Pending).then_some(ts),
            arrived_ns: ts,
            ..TaskStat::default()
        });
        if t.name.is_empty() {
            t.name = line.name.clone();
            t.priority = line.priority;
        }
        t.gpu = t.gpu.or(line.gpu);
        self.transition(line.task, from, to, line.reason, ts);
    }

    fn transition(&mut self, id: TaskId, from: TaskState, to: TaskState, reason: Reason, ts: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        let gpu = t.gpu;
        if to == TaskState::Running {
            t.has_run = true;
        }
        if (to == TaskState::Running || matches!(to, TaskState::Completed | TaskState::Failed))
            && std::mem::take(&mut t.thawing)
            && let Some(g) = gpu.and_then(|g| self.gpus.get_mut(&g))
        {
            g.thawing = g.thawing.saturating_sub(1);
            g.thawing_ids.remove(&id);
        }
        if to == TaskState::Running {
            self.end_wait(id, ts);
            if let Some(g) = gpu.and_then(|g| self.gpus.get_mut(&g)) {
                if g.running == 0 {
                    g.busy_since = ts;
                }
                g.running += 1;
                g.running_ids.insert(id);
            }
        } else if from == TaskState::Running
            && let Some(g) = gpu.and_then(|g| self.gpus.get_mut(&g))
        {
            g.running = g.running.saturating_sub(1);
            g.running_ids.remove(&id);
            if g.running == 0 {
                g.busy_ns += ts.saturating_sub(g.busy_since);
            }
        }
        match to {
            TaskState::Preempted if from == TaskState::Running => {
                *self.preemptions.entry(reason.as_str()).or_default() += 1;
                // Logs of older versions froze idle tasks (reason `idle`):
                // an idle task does not wait.
                if let Some(t) = self.tasks.get_mut(&id)
                    && reason != Reason::Idle
                {
                    t.waiting_since.get_or_insert(ts);
                }
            }
            TaskState::Completed | TaskState::Failed => {
                self.end_wait(id, ts);
                if reason == Reason::EvictedForMemory {
                    self.evictions += 1;
                }
                *self.endings.entry(reason.as_str()).or_default() += 1;
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.ended_ns.get_or_insert(ts);
                    // The driver frees a dead process's memory.
                    for (gpu, bytes) in std::mem::take(&mut t.mem) {
                        self.gpus.entry(gpu).or_default().mem_change(ts, 0, bytes);
                    }
                }
            }
            _ => {}
        }
        if let Some(t) = self.tasks.get_mut(&id) {
            t.state = Some(to);
        }
    }

    /// A live task's memory on `gpu` grows by `add` or shrinks by `sub`.
    fn memory(&mut self, id: TaskId, gpu: u32, add: u64, sub: u64, ts: u64) {
        let Some(t) = self.tasks.get_mut(&id).filter(|t| t.ended_ns.is_none()) else {
            return;
        };
        let held = match t.mem.iter_mut().find(|(g, _)| *g == gpu) {
            Some((_, held)) => held,
            None => {
                t.mem.push((gpu, 0));
                &mut t.mem.last_mut().expect("pushed").1
            }
        };
        let sub = sub.min(*held);
        *held = held.saturating_add(add) - sub;
        let total: u64 = t.mem.iter().map(|m| m.1).sum();
        t.peak = t.peak.max(total);
        self.gpus.entry(gpu).or_default().mem_change(ts, add, sub);
    }

    fn end_wait(&mut self, id: TaskId, ts: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        let Some(since) = t.waiting_since.take() else {
            return;
        };
        let ns = ts.saturating_sub(since);
        t.waited_ns += ns;
        t.first_wait_ns.get_or_insert(ns);
        if let Some(waits) = &mut self.waits {
            waits.push(Wait {
                task: id,
                gpu: t.gpu,
                start_ns: since,
                ns,
            });
        }
    }

    /// How many inputs were observed.
    pub fn inputs(&self) -> u64 {
        self.inputs
    }

    /// Closes what is still open at the last input and sums everything up.
    pub fn finish(mut self) -> (Summary, Vec<Wait>) {
        let end = self.now_ns;
        let open: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.waiting_since.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in open {
            self.end_wait(id, end);
        }
        for g in self.gpus.values_mut() {
            g.mem_change(end, 0, 0);
            if g.running > 0 {
                g.busy_ns += end.saturating_sub(g.busy_since);
                g.running = 0;
            }
        }
        let span_ns = end.saturating_sub(self.first_ns.unwrap_or(end));
        let mut tasks: Vec<(TaskId, TaskStat)> = self.tasks.into_iter().collect();
        tasks.sort_by_key(|(id, _)| *id);
        let per_task: Vec<TaskDelay> = tasks
            .iter()
            .map(|(id, t)| TaskDelay {
                task: *id,
                name: t.name.clone(),
                priority: t.priority,
                gpu: t.gpu,
                arrived_ns: t.arrived_ns,
                queueing_delay_ms: ms(t.waited_ns),
                wait_to_start_ms: ms(t.first_wait_ns.unwrap_or(0)),
                turnaround_ms: t.ended_ns.map(|e| ms(e.saturating_sub(t.arrived_ns))),
            })
            .collect();
        let mut by_name: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for d in &per_task {
            by_name
                .entry(&d.name)
                .or_default()
                .push(d.queueing_delay_ms);
        }
        let by_name = by_name
            .into_iter()
            .map(|(name, delays)| {
                let priority = per_task
                    .iter()
                    .find(|d| d.name == name)
                    .map_or(0, |d| d.priority);
                NameDelay {
                    name: name.to_owned(),
                    priority,
                    tasks: delays.len(),
                    queueing_delay_ms: Stats::of(delays),
                }
            })
            .collect();
        let busy: Vec<f64> = self.gpus.values().map(|g| g.busy_ns as f64).collect();
        let mem: Vec<f64> = self.gpus.values().map(|g| g.mem_byte_ns).collect();
        let gpus = self
            .gpus
            .iter()
            .map(|(&gpu, g)| GpuBusy {
                gpu,
                busy_share: if span_ns == 0 {
                    0.0
                } else {
                    g.busy_ns as f64 / span_ns as f64
                },
                tasks: per_task.iter().filter(|d| d.gpu == Some(gpu)).count(),
                mean_mem_bytes: if span_ns == 0 {
                    0.0
                } else {
                    g.mem_byte_ns / span_ns as f64
                },
                idle_while_queued_s: g.idle_queued_ns as f64 / 1e9,
            })
            .collect();
        let idle_while_queued_gpu_s =
            self.gpus.values().map(|g| g.idle_queued_ns).sum::<u64>() as f64 / 1e9;
        let summary = Summary {
            inputs: self.inputs,
            span_s: span_ns as f64 / 1e9,
            tasks: per_task.len(),
            queueing_delay_ms: Stats::of(per_task.iter().map(|d| d.queueing_delay_ms).collect()),
            wait_to_start_ms: Stats::of(per_task.iter().map(|d| d.wait_to_start_ms).collect()),
            turnaround_ms: Stats::of(per_task.iter().filter_map(|d| d.turnaround_ms).collect()),
            preemptions: self.preemptions.values().sum(),
            preemptions_by_reason: self
                .preemptions
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            evictions: self.evictions,
            endings: self
                .endings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            gpus,
            load_balance_error: keling_sched::load_balance_error(&busy),
            memory_load_balance_error: keling_sched::load_balance_error(&mem),
            idle_while_queued_gpu_s,
            by_name,
            per_task,
        };
        (summary, self.waits.unwrap_or_default())
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Mean and percentiles of a set of values (nearest rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(mut values: Vec<f64>) -> Stats {
        if values.is_empty() {
            return Stats::default();
        }
        values.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let r = (q * values.len() as f64).ceil() as usize;
            values[r.clamp(1, values.len()) - 1]
        };
        Stats {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: rank(0.5),
            p99: rank(0.99),
            max: values[values.len() - 1],
        }
    }
}

/// One task's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskDelay {
    pub task: TaskId,
    pub name: String,
    pub priority: u8,
    pub gpu: Option<u32>,
    pub arrived_ns: u64,
    /// Every wait added up.
    pub queueing_delay_ms: f64,
    /// The first wait: from arrival to first running.
    pub wait_to_start_ms: f64,
    /// Arrival to completion (or failure); None if it had not ended by the
    /// end of the span.
    pub turnaround_ms: Option<f64>,
}

/// The queueing delay of the tasks of one name (the job class, in synthetic runs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NameDelay {
    pub name: String,
    pub priority: u8,
    pub tasks: usize,
    pub queueing_delay_ms: Stats,
}

/// One GPU's busy share.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuBusy {
    pub gpu: u32,
    pub busy_share: f64,
    pub tasks: usize,
    /// Memory held, averaged over the span.
    pub mean_mem_bytes: f64,
    /// Seconds it had a free slot while a task that may run here waited.
    pub idle_while_queued_s: f64,
}

/// Everything a replay reports about what happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub inputs: u64,
    pub span_s: f64,
    pub tasks: usize,
    /// Over tasks: each task's queueing delay (all its waits added up).
    pub queueing_delay_ms: Stats,
    /// Over tasks: arrival to first running.
    pub wait_to_start_ms: Stats,
    /// Over the tasks that ended: arrival to completion (or failure), the
    /// time a job spent in the system, waits and sharing the GPU included.
    pub turnaround_ms: Stats,
    pub preemptions: u64,
    pub preemptions_by_reason: BTreeMap<String, u64>,
    pub evictions: u64,
    /// How tasks ended, by reason.
    pub endings: BTreeMap<String, u64>,
    pub gpus: Vec<GpuBusy>,
    /// (max - min) / mean of the GPUs' busy time.
    pub load_balance_error: f64,
    /// (max - min) / mean of the GPUs' time-averaged memory held.
    pub memory_load_balance_error: f64,
    /// GPU-seconds with a free slot while a task that may run there waited
    /// (all GPUs together): 0 when no GPU idles while work waits.
    pub idle_while_queued_gpu_s: f64,
    pub by_name: Vec<NameDelay>,
    pub per_task: Vec<TaskDelay>,
}

#[cfg(test)]
mod tests {
    use keling_sched::{ActionKind, GpuInfo, SchedConfig, Scheduler, TaskSpec};

    use super::*;

    const MS: u64 = 1_000_000;

    fn spec(id: TaskId, priority: u8, gpu: u32) -> TaskSpec {
        TaskSpec {
            id,
            pid: id as u32,
            name: format!("p{priority}"),
            priority,
            gpu: Some(gpu),
            mem_quota_bytes: None,
            max_duration_ms: None,
            grace_ms: None,
            hard_kill: None,
            expected_runtime_ms: None,
        }
    }

    /// Two GPUs, one slot each. Task 1 runs on GPU 0 from 0 to 100 ms; task 2
    /// waits for GPU 0 from 10 ms to 101 ms (pinned there by a placement at
    /// arrival) while GPU 1 idles: 91 ms idle while queued, or none when the
    /// pin is a constraint. Late binding starts task 2 on GPU 1 at once: none.
    #[test]
    fn idle_while_queued_counts_a_free_gpu_a_waiting_task_may_use() {
        let run = |binding: keling_sched::Binding, pin: Option<u32>, movable: bool| {
            let config = SchedConfig {
                gpus: (0..2)
                    .map(|index| GpuInfo {
                        index,
                        capacity_bytes: 1 << 34,
                    })
                    .collect(),
                idle_timeout_ms: 1_000_000,
                binding,
                ..SchedConfig::default()
            };
            let mut sched = Scheduler::new(config);
            let m = Metrics::new([0, 1]);
            let mut m = if movable { m.movable_until_run() } else { m };
            let mut step = |input: Input| {
                let out = sched.step(&input);
                m.observe(&input, &out);
                out
            };
            step(Input::Arrive {
                spec: TaskSpec {
                    gpu: pin,
                    ..spec(1, 5, 0)
                },
                ts_ns: 0,
            });
            let out = step(Input::Arrive {
                spec: TaskSpec {
                    gpu: pin,
                    ..spec(2, 5, 0)
                },
                ts_ns: 10 * MS,
            });
            if out.actions.contains(&Action::Freeze { id: 2 }) {
                step(Input::Confirmed {
                    id: 2,
                    action: ActionKind::Freeze,
                    ts_ns: 11 * MS,
                });
            }
            let out = step(Input::Exit {
                id: 1,
                exit_code: 0,
                ts_ns: 100 * MS,
            });
            if out.actions.contains(&Action::Thaw { id: 2 }) {
                step(Input::Confirmed {
                    id: 2,
                    action: ActionKind::Thaw,
                    ts_ns: 101 * MS,
                });
            }
            step(Input::Tick { ts_ns: 200 * MS });
            m.finish().0
        };
        use keling_sched::Binding::{AtArrival, Late};
        let s = run(AtArrival, Some(0), true);
        assert!((s.idle_while_queued_gpu_s - 0.091).abs() < 1e-12, "{s:?}");
        assert!((s.gpus[1].idle_while_queued_s - 0.091).abs() < 1e-12);
        assert_eq!(s.gpus[0].idle_while_queued_s, 0.0, "thawing is not idle");
        assert_eq!(run(AtArrival, Some(0), false).idle_while_queued_gpu_s, 0.0);
        let late = run(Late, None, false);
        assert_eq!(late.idle_while_queued_gpu_s, 0.0);
        assert_eq!(late.queueing_delay_ms.max, 0.0, "started on GPU 1 at once");
    }

    /// Under memory sharing a GPU is idle while queued when a waiting task's
    /// demand fits beside what is held and promised there, not merely when
    /// it runs fewer tasks than a cap.
    #[test]
    fn idle_while_queued_by_memory_counts_where_the_waiting_task_fits() {
        const GIB: u64 = 1 << 30;
        let config = SchedConfig {
            gpus: (0..2)
                .map(|index| GpuInfo {
                    index,
                    capacity_bytes: 8 * GIB,
                })
                .collect(),
            idle_timeout_ms: 1_000_000,
            sharing: keling_sched::Sharing::Memory,
            slots_per_gpu: 0,
            ..SchedConfig::default()
        };
        let mut sched = Scheduler::new(config.clone());
        // Pins are a placement's choices: the waiting task could run on GPU 1.
        let mut m = Metrics::for_config(&config, keling_sched::Policy::Hybrid).movable_until_run();
        let mut step = |input: Input| {
            let out = sched.step(&input);
            m.observe(&input, &out);
            out
        };
        let budget = |id, gib| TaskSpec {
            mem_quota_bytes: Some(gib * GIB),
            ..spec(id, 5, 0)
        };
        step(Input::Arrive {
            spec: budget(1, 6),
            ts_ns: 0,
        });
        // Task 1 holds 2 GiB of its 6: the 4 left are its, task 2's 4 do not fit.
        step(Input::MemAlloc {
            id: 1,
            gpu: 0,
            bytes: 2 * GIB,
            ts_ns: MS,
        });
        let out = step(Input::Arrive {
            spec: budget(2, 4),
            ts_ns: 10 * MS,
        });
        assert!(
            out.actions.contains(&Action::Freeze { id: 2 }),
            "task 2 waits for memory: {out:?}"
        );
        step(Input::Confirmed {
            id: 2,
            action: ActionKind::Freeze,
            ts_ns: 11 * MS,
        });
        step(Input::Tick { ts_ns: 110 * MS });
        let s = m.finish().0;
        assert_eq!(
            s.gpus[0].idle_while_queued_s, 0.0,
            "it does not fit on GPU 0"
        );
        assert!(
            (s.gpus[1].idle_while_queued_s - 0.1).abs() < 1e-12,
            "GPU 1 ran nothing while task 2, which fits it, waited: {s:?}"
        );
    }

    #[test]
    fn stats_use_nearest_rank() {
        let s = Stats::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (s.count, s.mean, s.p50, s.p99, s.max),
            (100, 50.5, 50.0, 99.0, 100.0)
        );
        assert_eq!(Stats::of(vec![]), Stats::default());
        assert_eq!(Stats::of(vec![7.0]).p99, 7.0);
    }

    /// A hand-worked run on two GPUs: who waited how long, busy shares, one
    /// preemption, and an idle task that yields its slot (not a wait) and takes
    /// it back when it is active again.
    #[test]
    fn waits_busy_time_and_preemptions_of_a_known_run() {
        let config = SchedConfig {
            gpus: (0..2)
                .map(|index| GpuInfo {
                    index,
                    capacity_bytes: 1 << 34,
                })
                .collect(),
            idle_timeout_ms: 1_000_000,
            ..SchedConfig::default()
        };
        let mut sched = Scheduler::new(config);
        let mut m = Metrics::new([0, 1]).keep_waits();
        let mut step = |m: &mut Metrics, input: Input| {
            let out = sched.step(&input);
            m.observe(&input, &out);
            out
        };
        // 0 ms: task 1 (priority 9) runs on GPU 0.
        step(
            &mut m,
            Input::Arrive {
                spec: spec(1, 9, 0),
                ts_ns: 0,
            },
        );
        step(
            &mut m,
            Input::MemAlloc {
                id: 1,
                gpu: 0,
                bytes: 1000,
                ts_ns: 0,
            },
        );
        // 10 ms: task 2 (priority 1) preempts it; the freeze lands at 12 ms.
        step(
            &mut m,
            Input::Arrive {
                spec: spec(2, 1, 0),
                ts_ns: 10 * MS,
            },
        );
        step(
            &mut m,
            Input::Confirmed {
                id: 1,
                action: ActionKind::Freeze,
                ts_ns: 12 * MS,
            },
        );
        // 50 ms: task 2 ends; 1 is thawed, confirmed at 51 ms.
        step(
            &mut m,
            Input::Exit {
                id: 2,
                exit_code: 0,
                ts_ns: 50 * MS,
            },
        );
        step(
            &mut m,
            Input::Confirmed {
                id: 1,
                action: ActionKind::Thaw,
                ts_ns: 51 * MS,
            },
        );
        // 60 ms: task 3 on GPU 1 goes idle, 4 arrives there and takes the slot.
        step(
            &mut m,
            Input::Arrive {
                spec: spec(3, 5, 1),
                ts_ns: 60 * MS,
            },
        );
        step(
            &mut m,
            Input::MemAlloc {
                id: 3,
                gpu: 1,
                bytes: 1000,
                ts_ns: 60 * MS,
            },
        );
        step(
            &mut m,
            Input::MemFree {
                id: 3,
                gpu: 1,
                bytes: 600,
                ts_ns: 80 * MS,
            },
        );
        step(
            &mut m,
            Input::Idle {
                id: 3,
                ts_ns: 61 * MS,
            },
        );
        step(
            &mut m,
            Input::Arrive {
                spec: spec(4, 5, 1),
                ts_ns: 62 * MS,
            },
        );
        // 3 yields its slot, unfrozen; it wants the GPU again at 80 ms and
        // takes the slot back (it is ahead of 4 in the rotation); 4's freeze is
        // still in flight when it leaves at 90 ms.
        step(
            &mut m,
            Input::Active {
                id: 3,
                ts_ns: 80 * MS,
            },
        );
        step(
            &mut m,
            Input::Exit {
                id: 4,
                exit_code: 0,
                ts_ns: 90 * MS,
            },
        );
        step(&mut m, Input::Tick { ts_ns: 100 * MS });
        let (s, waits) = m.finish();
        let delay: BTreeMap<TaskId, f64> = s
            .per_task
            .iter()
            .map(|d| (d.task, d.queueing_delay_ms))
            .collect();
        assert_eq!(delay, [(1, 39.0), (2, 0.0), (3, 0.0), (4, 0.0)].into());
        assert_eq!(
            s.preemptions_by_reason,
            [("preempted_by_higher_priority".to_owned(), 1)].into()
        );
        assert_eq!(s.preemptions, 1);
        assert_eq!(s.evictions, 0);
        // GPU 0 busy 0-100 ms except 50-51; GPU 1 busy 60-100 ms.
        assert_eq!(s.gpus[0].busy_share, 0.99);
        assert_eq!(s.gpus[1].busy_share, 0.4);
        assert!(
            (s.load_balance_error - 0.59 / 0.695).abs() < 1e-9,
            "{}",
            s.load_balance_error
        );
        assert_eq!(s.queueing_delay_ms.mean, 9.75);
        // 2 ended at 50 ms (arrived at 10), 4 at 90 (it says 62, but the
        // clock was at 80 already and never goes back); 1 and 3 had not ended.
        let turnaround: Vec<(TaskId, Option<f64>)> = s
            .per_task
            .iter()
            .map(|d| (d.task, d.turnaround_ms))
            .collect();
        assert_eq!(
            turnaround,
            vec![(1, None), (2, Some(40.0)), (3, None), (4, Some(10.0))]
        );
        assert_eq!((s.turnaround_ms.count, s.turnaround_ms.mean), (2, 25.0));
        assert_eq!(waits.iter().filter(|w| w.ns > 0).count(), 1);
        assert_eq!(s.endings, [("exited".to_owned(), 2)].into());
        // GPU 0: 1000 bytes all along; GPU 1: 1000 from 60 to 80 ms, 400 after.
        assert_eq!(s.gpus[0].mean_mem_bytes, 1000.0);
        assert_eq!(
            s.gpus[1].mean_mem_bytes,
            (1000.0 * 20.0 + 400.0 * 20.0) / 100.0
        );
        assert!((s.memory_load_balance_error - (1000.0 - 280.0) / 640.0).abs() < 1e-9);
    }
}
