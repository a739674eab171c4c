//! Joins the trace to the scheduler core: turns kernel events into scheduler
//! inputs, carries out the core's actions through the [`Actuator`]s, feeds
//! confirmations back, measures each decision's latency, answers control requests,
//! and writes the logs.
//!
//! "Active" (what the core's `Active` input means here): a task is active when a
//! process of it made an NVIDIA call (any GPU event of that process) or was switched
//! onto a CPU; at most one `Active` per task per [`ACTIVE_MIN_INTERVAL_NS`] reaches
//! the core. It becomes idle after the core's idle timeout without one (a frozen task
//! is neither, by construction).
//!
//! Memory inputs come from video memory only ([`memory_inputs`]).
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ffi::OsString,
    os::fd::{AsRawFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use keling_common::nvidia::{ObjectKind, status};
use keling_sched::{Action, ActionKind, Input, Output, Scheduler, TaskId, TaskSpec};
use tokio::sync::mpsc;

use super::{
    actuator::{Actuator, CgroupActuator, SignalActuator, StoppedList},
    cgroup::{CgroupRoot, TaskCgroup},
    config::Config,
    log::{Logs, Record},
};
use crate::{
    control::{
        Accepted, ExportFormat, LaunchRequest, PlacementStatus, Reply, Request, StatusReply,
        TaskStatus,
        server::{Incoming, Replier},
    },
    event::decode::{DeviceFile, Event, ExitStatus, MemKind},
    latency::{DecisionTimes, LatencyRecorder, Stage, Verdict},
    os::{
        monotonic_ns,
        proc::ProcessFacts,
        spawn::{HeldChild, SpawnOptions},
    },
};

/// At most one `Active` input per task per this many ns.
pub const ACTIVE_MIN_INTERVAL_NS: u64 = 5_000_000;
/// Recent decisions kept for `--export tune`.
const TUNE_SERIES_MAX: usize = 100_000;

/// What the agent keeps about a task beside the core's view.
struct TaskRuntime {
    pid: u32,
    actuator: Arc<dyn Actuator>,
    /// Tasks Keling launched: their cgroup.
    cgroup: Option<TaskCgroup>,
    /// Where to send the exit code (the `keling launch` connection).
    reply: Option<Replier>,
    last_active_ns: u64,
}

/// A confirmation (or its absence) coming back from a blocking waiter.
pub struct Confirmation {
    pub id: TaskId,
    pub action: ActionKind,
    pub times: DecisionTimes,
    pub confirmed: bool,
}

/// Settings of the daemon that are not the core's.
pub struct DaemonSettings {
    /// Priority of tasks that neither the request nor a config rule gives one.
    pub default_priority: u8,
}

pub struct Daemon {
    sched: Scheduler,
    latency: LatencyRecorder,
    cgroups: CgroupRoot,
    tasks: BTreeMap<TaskId, TaskRuntime>,
    /// Processes of tasks (the launched process and everything it forks).
    pid_task: HashMap<u32, TaskId>,
    next_id: TaskId,
    logs: Logs,
    confirm_tx: mpsc::UnboundedSender<Confirmation>,
    /// (event_ns, received_ns) of the input being handled.
    cause: (u64, u64),
    /// When the kernel event now being turned into inputs reached the agent.
    received_ns: Option<u64>,
    config: Config,
    settings: DaemonSettings,
    /// When the daemon started (the interval log's start).
    started_ns: u64,
    /// (timestamp, end-to-end latency) of recent decisions, for `--export tune`.
    series: VecDeque<(u64, u64)>,
    stopped: StoppedList,
}

impl Daemon {
    pub fn new(
        sched: Scheduler,
        latency: LatencyRecorder,
        logs: Logs,
        confirm_tx: mpsc::UnboundedSender<Confirmation>,
        config: Config,
        settings: DaemonSettings,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            sched,
            latency,
            cgroups: CgroupRoot::open()?,
            tasks: BTreeMap::new(),
            pid_task: HashMap::new(),
            next_id: 1,
            logs,
            confirm_tx,
            cause: (0, 0),
            received_ns: None,
            config,
            settings,
            stopped: StoppedList::default(),
            started_ns: monotonic_ns(),
            series: VecDeque::new(),
        })
    }

    /// Feeds one input to the core, logs it, and carries out what comes back.
    pub fn step(&mut self, input: Input) {
        // The decisions this input leads to are timed from it: its kernel timestamp
        // and when the agent received it.
        self.cause = (input.ts_ns(), self.received_ns.unwrap_or_else(monotonic_ns));
        self.logs.input(&input);
        let out = self.sched.step(&input);
        self.apply(out);
    }

    fn apply(&mut self, out: Output) {
        for t in &out.transitions {
            log::info!(
                "task {} ({}, pid {}, priority {}) {}: {}",
                t.task,
                t.name,
                t.pid,
                t.priority,
                t.state_transition(),
                t.reason
            );
            self.logs.transition(t);
        }
        for a in out.actions {
            self.act(a);
        }
        self.logs.flush();
    }

    /// Carries out one action, timing it. Freezes, thaws and stops are confirmed on
    /// a blocking thread, which reports back through the confirmation channel.
    fn act(&mut self, action: Action) {
        let decided_ns = monotonic_ns();
        // Enforce is logged with the Kill/Terminate that follows it.
        let (id, kind) = (action.task(), action.kind().unwrap_or(ActionKind::Warn));
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let (pid, actuator) = (task.pid, task.actuator.clone());
        let (event_ns, received_ns) = self.cause;
        let mut times = DecisionTimes {
            action: format!("{kind:?}").to_lowercase(),
            event_ns,
            received_ns,
            decided_ns,
            actuated_ns: decided_ns,
            confirmed_ns: None,
        };
        match action {
            Action::Freeze { .. } | Action::Thaw { .. } | Action::Stop { .. } => {
                let started = match kind {
                    ActionKind::Freeze => actuator.set_frozen(true),
                    ActionKind::Thaw => actuator.set_frozen(false),
                    _ => actuator.stop(),
                };
                if let Err(e) = started {
                    log::warn!("task {id}: {e:#}");
                }
                times.actuated_ns = monotonic_ns();
                self.confirm_later(id, kind, actuator, times);
                return;
            }
            Action::Terminate { .. } => actuator.terminate(),
            Action::Kill { .. } => {
                if let Err(e) = actuator.kill() {
                    log::warn!("task {id}: {e:#}");
                }
            }
            Action::Place { gpu, .. } => self.logs.record(&Record::Placement {
                task: id,
                pid,
                gpu,
                timestamp_ns: decided_ns,
            }),
            Action::Warn { remaining_ms, .. } => {
                log::warn!("task {id} (pid {pid}) reaches its duration limit in {remaining_ms} ms");
                self.logs.record(&Record::Warning {
                    task: id,
                    pid,
                    remaining_ms,
                    timestamp_ns: decided_ns,
                });
            }
            Action::Enforce { record, .. } => {
                log::warn!(
                    "task {id} (pid {pid}): {}",
                    serde_json::to_string(&record).unwrap_or_default()
                );
                self.logs.record(&Record::Enforcement {
                    task: id,
                    pid,
                    timestamp_ns: decided_ns,
                    record: &record,
                });
            }
        }
        times.actuated_ns = monotonic_ns();
        self.record(&times);
    }

    /// Waits for `kind` to take effect on a blocking thread and reports back.
    fn confirm_later(
        &self,
        id: TaskId,
        kind: ActionKind,
        actuator: Arc<dyn Actuator>,
        mut times: DecisionTimes,
    ) {
        let timeout = Duration::from_nanos(self.latency.timeout_ns());
        let tx = self.confirm_tx.clone();
        tokio::task::spawn_blocking(move || {
            let confirmed = match kind {
                ActionKind::Freeze => actuator.wait_frozen(true, timeout),
                ActionKind::Thaw => actuator.wait_frozen(false, timeout),
                _ => actuator.wait_stopped(timeout),
            };
            if confirmed {
                times.confirmed_ns = Some(monotonic_ns());
            }
            let _ = tx.send(Confirmation {
                id,
                action: kind,
                times,
                confirmed,
            });
        });
    }

    /// Records one decision's latency.
    fn record(&mut self, times: &DecisionTimes) -> Verdict {
        let verdict = self.latency.record(times);
        if self.series.len() == TUNE_SERIES_MAX {
            self.series.pop_front();
        }
        self.series
            .push_back((times.decided_ns, verdict.end_to_end_ns));
        verdict
    }

    /// The latency figures in one of the export formats (`keling status --export`).
    pub fn export(&self, format: ExportFormat) -> anyhow::Result<String> {
        let mut out = Vec::new();
        match format {
            ExportFormat::Prometheus => self.latency.write_prometheus(&mut out)?,
            ExportFormat::Percentiles => self.latency.write_percentile_table(&mut out)?,
            ExportFormat::IntervalLog => {
                self.latency.write_interval_log(&mut out, self.started_ns)?
            }
            ExportFormat::Json => self.latency.write_json(&mut out)?,
            ExportFormat::Tune => {
                let series: Vec<(u64, u64)> = self.series.iter().copied().collect();
                out.extend(
                    crate::latency::tune_report(&series)
                        .to_string()
                        .into_bytes(),
                );
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// A confirmation came back: record its latency and tell the core.
    pub fn confirmed(&mut self, c: Confirmation) {
        let verdict = self.record(&c.times);
        if verdict.late || !c.confirmed {
            self.logs.record(&Record::LateDecision {
                task: c.id,
                action: &c.times.action,
                end_to_end_ns: verdict.end_to_end_ns,
                timeout_ns: verdict.timeout_ns,
                confirmed: c.confirmed,
            });
        }
        let ts_ns = c.times.confirmed_ns.unwrap_or_else(monotonic_ns);
        let input = if c.confirmed {
            Input::Confirmed {
                id: c.id,
                action: c.action,
                ts_ns,
            }
        } else {
            Input::TimedOut {
                id: c.id,
                action: c.action,
                ts_ns,
            }
        };
        self.step(input);
    }

    /// Answers one control request.
    pub fn handle(&mut self, incoming: Incoming, track: &mut dyn FnMut(u32) -> anyhow::Result<()>) {
        let Incoming {
            request,
            fds,
            reply,
            ..
        } = incoming;
        match request {
            Request::Status(_) => reply.send(Reply::Status(Box::new(self.status()))),
            Request::Export(format) => reply.send(match self.export(format) {
                Ok(text) => Reply::Export(text),
                Err(e) => Reply::Error(format!("{e:#}")),
            }),
            Request::Launch(req) => match self.launch(&req, &fds, track) {
                Ok(accepted) => {
                    log::info!(
                        "task {}: pid {} {:?} on GPU {:?}",
                        accepted.task,
                        accepted.pid,
                        req.argv,
                        accepted.gpu
                    );
                    if let Some(t) = self.tasks.get_mut(&accepted.task) {
                        t.reply = Some(reply.clone());
                    }
                    reply.send(Reply::Accepted(accepted));
                }
                Err(e) => reply.send(Reply::Error(format!("{e:#}"))),
            },
        }
    }

    /// Starts a launched task: its own cgroup, held until tracked, then exec'd.
    fn launch(
        &mut self,
        req: &LaunchRequest,
        stdio: &[OwnedFd],
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Accepted> {
        let id = self.next_id;
        self.next_id += 1;
        // The config's rules fill in what the request leaves out.
        let argv0 = req.argv.first().map(String::as_str).unwrap_or_default();
        let facts = ProcessFacts {
            comm: argv0
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .chars()
                .take(15)
                .collect(),
            uid: Some(0),
            cgroup: None,
            exe: argv0.starts_with('/').then(|| argv0.to_owned()),
        };
        let (rule, _) = self.config.settings_for(&facts);
        let gpu = match req.gpu.or(rule.gpu) {
            Some(g) => Some(g),
            None => {
                let weights = self.sched.placement_weights(monotonic_ns());
                weights
                    .iter()
                    .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
                    .map(|&(g, _)| g)
            }
        };
        // Unique across agents: a test or a restart may run several in turn.
        let cgroup = self
            .cgroups
            .create_task(&format!("task-{}-{id}", std::process::id()))?;
        let fds: Option<[i32; 3]> = (stdio.len() == 3).then(|| {
            [
                stdio[0].as_raw_fd(),
                stdio[1].as_raw_fd(),
                stdio[2].as_raw_fd(),
            ]
        });
        let argv: Vec<OsString> = req.argv.iter().map(OsString::from).collect();
        let mut env = Vec::new();
        if let Some(g) = gpu {
            env.push((
                OsString::from("CUDA_VISIBLE_DEVICES"),
                OsString::from(g.to_string()),
            ));
        }
        let opts = SpawnOptions {
            env,
            stdio: fds,
            cgroup_procs: Some(cgroup.procs_file()),
            cwd: Some(req.cwd.clone()),
        };
        let started = HeldChild::spawn_with(&argv, &opts).and_then(|held| {
            track(held.pid())?;
            held.release(&argv[0])
        });
        let pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                // A failed launch leaves no cgroup behind.
                let _ = cgroup.remove();
                return Err(e);
            }
        };
        let name = argv0.rsplit('/').next().unwrap_or_default().to_owned();
        self.tasks.insert(
            id,
            TaskRuntime {
                pid,
                actuator: Arc::new(CgroupActuator {
                    cgroup: cgroup.clone(),
                }),
                cgroup: Some(cgroup),
                reply: None,
                last_active_ns: 0,
            },
        );
        self.pid_task.insert(pid, id);
        let spec = TaskSpec {
            id,
            pid,
            name,
            priority: req
                .priority
                .or(rule.priority)
                .unwrap_or(self.settings.default_priority),
            gpu,
            mem_quota_bytes: req.mem_quota_bytes.or(rule.mem_quota_bytes),
            max_duration_ms: req.max_duration_ms.or(rule.max_duration_ms),
            grace_ms: req.grace_ms.or(rule.grace_ms),
            hard_kill: req.hard_kill.or(rule.hard_kill),
            expected_runtime_ms: req.expected_runtime_ms,
        };
        self.step(Input::Arrive {
            spec,
            ts_ns: monotonic_ns(),
        });
        Ok(Accepted { task: id, gpu, pid })
    }

    /// The task's root process ended (we reaped it, or the kernel said so for an
    /// adopted one): tell the core and the client.
    pub fn exited(&mut self, pid: u32, status: ExitStatus) {
        let Some(&id) = self.pid_task.get(&pid) else {
            return;
        };
        self.step(Input::Exit {
            id,
            exit_code: status.code(),
            ts_ns: monotonic_ns(),
        });
        if let Some(task) = self.tasks.remove(&id) {
            if let Some(reply) = &task.reply {
                reply.send(Reply::ExitCode(status.code()));
            }
            if let Some(cg) = task.cgroup {
                // Whatever the task left behind goes with it.
                let _ = cg.kill();
                let _ = cg.remove();
            }
        }
        self.pid_task.retain(|_, t| *t != id);
    }

    /// Turns one kernel event into scheduler inputs.
    pub fn on_event(&mut self, event: &Event) {
        self.received_ns = Some(monotonic_ns());
        self.on_event_inner(event);
        self.received_ns = None;
    }

    fn on_event_inner(&mut self, event: &Event) {
        let h = *event.header();
        match event {
            Event::GpuOpen(o) if !self.pid_task.contains_key(&h.pid) => {
                // However it came to have the fd (open, dup, receipt, first use).
                self.maybe_adopt(h.pid, o.device, h.ts_ns);
                return;
            }
            Event::Exit(e) if e.group_dead != 0 => {
                // Tasks Keling did not launch are not its children: their end comes
                // from the kernel. (Launched ones are reaped, see `exited`.)
                let adopted = self
                    .pid_task
                    .get(&h.pid)
                    .and_then(|id| self.tasks.get(id))
                    .is_some_and(|t| t.pid == h.pid && t.cgroup.is_none());
                if adopted {
                    self.exited(h.pid, ExitStatus::from_wait_status(e.exit_status));
                }
            }
            Event::Fork(f) if f.tracked != 0 => {
                if let Some(&id) = self.pid_task.get(&h.pid) {
                    self.pid_task.insert(f.child_pid, id);
                }
            }
            Event::Switch(s) => {
                if let Some(&id) = self.pid_task.get(&s.next_pid) {
                    self.activity(id, h.ts_ns);
                }
            }
            _ => {}
        }
        if !event.is_gpu() {
            return;
        }
        let inputs = memory_inputs(
            event,
            |pid| self.pid_task.get(&pid).copied(),
            |id| self.sched.task(id).and_then(|t| t.gpu),
        );
        for input in inputs {
            self.step(input);
        }
        if let Some(&id) = self.pid_task.get(&h.pid) {
            self.activity(id, h.ts_ns);
        }
    }

    /// A process Keling did not launch opened an NVIDIA device: it becomes a task
    /// (frozen and thawed with SIGSTOP/SIGCONT) when a config rule matches it, or
    /// when the defaults say to manage unmatched processes.
    fn maybe_adopt(&mut self, pid: u32, device: DeviceFile, ts_ns: u64) {
        let facts = ProcessFacts::of_pid(pid);
        let (settings, managed) = self.config.settings_for(&facts);
        if !managed {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let gpu = settings.gpu.or(device.gpu());
        log::info!(
            "adopting pid {pid} ({}) as task {id} (rule {:?})",
            facts.comm,
            settings.rule
        );
        self.tasks.insert(
            id,
            TaskRuntime {
                pid,
                actuator: Arc::new(SignalActuator {
                    pid,
                    stopped: self.stopped.clone(),
                }),
                cgroup: None,
                reply: None,
                last_active_ns: 0,
            },
        );
        self.pid_task.insert(pid, id);
        let spec = TaskSpec {
            id,
            pid,
            name: facts.comm,
            priority: settings.priority.unwrap_or(self.settings.default_priority),
            gpu,
            mem_quota_bytes: settings.mem_quota_bytes,
            max_duration_ms: settings.max_duration_ms,
            grace_ms: settings.grace_ms,
            hard_kill: settings.hard_kill,
            expected_runtime_ms: None,
        };
        self.step(Input::Arrive { spec, ts_ns });
    }

    fn activity(&mut self, id: TaskId, ts_ns: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        if ts_ns.saturating_sub(t.last_active_ns) < ACTIVE_MIN_INTERVAL_NS {
            return;
        }
        t.last_active_ns = ts_ns;
        self.step(Input::Active { id, ts_ns });
    }

    pub fn tick(&mut self) {
        let now = monotonic_ns();
        self.latency.tick(now);
        self.step(Input::Tick { ts_ns: now });
    }

    /// What `keling status` shows.
    pub fn status(&self) -> StatusReply {
        let now = monotonic_ns();
        let tasks = self
            .sched
            .tasks()
            .iter()
            .map(|t| TaskStatus {
                id: t.spec.id,
                pid: t.spec.pid,
                name: t.spec.name.clone(),
                priority: t.spec.priority,
                class: t.class,
                state: t.state.as_str().to_owned(),
                gpu: t.gpu,
                mem_bytes: t.mem_bytes.values().sum(),
                mem_bytes_per_gpu: t.mem_bytes.clone(),
                on_gpu_ms: t.on_gpu_ms,
                elapsed_ms: t.finished_ns.unwrap_or(now).saturating_sub(t.arrived_ns) / 1_000_000,
                wants_gpu: t.wants_gpu,
                in_flight: t.in_flight,
                cgroup: self
                    .tasks
                    .get(&t.spec.id)
                    .and_then(|r| r.cgroup.as_ref())
                    .map(|c| c.dir.clone()),
            })
            .collect();
        // Per stage, for the actions that are confirmed (what `cargo xtask bench` shows).
        let stages_by_action = ["freeze", "thaw"]
            .into_iter()
            .map(|action| {
                let per = Stage::ALL
                    .iter()
                    .filter_map(|&stage| {
                        let p = self.latency.percentiles(stage, Some(action))?;
                        Some((stage.as_str().to_owned(), p))
                    })
                    .collect();
                (action.to_owned(), per)
            })
            .collect();
        let weights = self.sched.placement_weights(now);
        let mut used: BTreeMap<u32, f64> = weights.iter().map(|&(g, _)| (g, 0.0)).collect();
        for t in self.sched.tasks() {
            for (g, b) in &t.mem_bytes {
                *used.entry(*g).or_default() += *b as f64;
            }
        }
        let used: Vec<f64> = used.into_values().collect();
        StatusReply {
            tasks,
            latency: self.latency.status(),
            stages_by_action,
            placement: PlacementStatus {
                weights,
                load_balance_error: keling_sched::load_balance_error(&used),
            },
        }
    }

    /// Thaws every task and continues every process it stopped (the agent is
    /// stopping; the tasks run on).
    pub fn shutdown(&mut self) {
        self.stopped.continue_all();
        for t in self.tasks.values() {
            if let Some(cg) = &t.cgroup {
                let _ = cg.set_frozen(false);
                cg.signal(libc::SIGCONT);
            }
        }
    }
}

/// The scheduler's memory inputs for one GPU event, given the task of a process
/// (`task_of`) and the GPU a task was placed on (`task_gpu`).
///
/// Only video memory counts (quotas and memory pressure use one GPU's video bytes):
/// an allocation is the caller's, a free or teardown gives back the bytes of the
/// process that was charged, a moving charge leaves one task for another, and a
/// video allocation the driver refused with NO_MEMORY is memory pressure. Memory
/// of an unknown GPU is not attributed.
fn memory_inputs(
    event: &Event,
    task_of: impl Fn(u32) -> Option<TaskId>,
    task_gpu: impl Fn(TaskId) -> Option<u32>,
) -> Vec<Input> {
    let h = event.header();
    let ts_ns = h.ts_ns;
    let mut out = Vec::new();
    match event {
        Event::GpuAlloc(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
            if let (Some(gpu), Some(id)) = (e.gpu, task_of(h.pid)) {
                out.push(Input::MemAlloc {
                    id,
                    gpu,
                    bytes: e.bytes,
                    ts_ns,
                });
            }
        }
        Event::GpuFree(e) if e.mem_kind == Some(MemKind::Video) && e.bytes > 0 => {
            if let (Some(gpu), Some(id)) = (e.gpu, e.freed_pid.and_then(&task_of)) {
                out.push(Input::MemFree {
                    id,
                    gpu,
                    bytes: e.bytes,
                    ts_ns,
                });
            }
        }
        Event::GpuTeardown(e) if e.bytes > 0 => {
            if let (Some(gpu), Some(id)) = (e.gpu, task_of(e.owner_pid)) {
                out.push(Input::MemFree {
                    id,
                    gpu,
                    bytes: e.bytes,
                    ts_ns,
                });
            }
        }
        Event::GpuCharge(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
            let (from, to) = (task_of(e.from_pid), task_of(e.to_pid));
            if let Some(gpu) = e.gpu
                && from != to
            {
                if let Some(id) = from {
                    out.push(Input::MemFree {
                        id,
                        gpu,
                        bytes: e.bytes,
                        ts_ns,
                    });
                }
                if let Some(id) = to {
                    out.push(Input::MemAlloc {
                        id,
                        gpu,
                        bytes: e.bytes,
                        ts_ns,
                    });
                }
            }
        }
        // The probes set `requested_bytes` only for video classes; a class that is
        // named and not video memory is never memory pressure either way.
        Event::GpuIoctl(e)
            if e.status == status::NO_MEMORY
                && e.requested_bytes > 0
                && (e.class == 0 || ObjectKind::of_class(e.class) == ObjectKind::VideoMemory) =>
        {
            if let Some(id) = task_of(h.pid) {
                out.push(Input::AllocFailed {
                    id,
                    gpu: e.gpu.or_else(|| task_gpu(id)).unwrap_or(0),
                    bytes: e.requested_bytes,
                    ts_ns,
                });
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use keling_common::{EventHeader, EventKind, nvidia::escape};

    use super::*;
    use crate::event::decode::{
        Call, GpuAllocEvent, GpuChargeEvent, GpuFreeEvent, GpuIoctlEvent, GpuTeardownEvent,
        IoctlOutcome, TeardownReason,
    };

    const TS: u64 = 77;

    fn hdr(kind: EventKind, pid: u32) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 0,
            ts_ns: TS,
            pid,
            tid: pid,
        }
    }

    /// pid 100 and 101 are task 1, pid 200 task 2; task 1 is placed on GPU 3.
    fn inputs(event: &Event) -> Vec<Input> {
        memory_inputs(
            event,
            |pid| match pid {
                100 | 101 => Some(1),
                200 => Some(2),
                _ => None,
            },
            |id| (id == 1).then_some(3),
        )
    }

    fn alloc(pid: u32, mem_kind: MemKind, gpu: Option<u32>) -> Event {
        Event::GpuAlloc(GpuAllocEvent {
            header: hdr(EventKind::GpuAlloc, pid),
            client: 1,
            parent: 2,
            handle: 3,
            class: 0x40,
            mem_kind,
            gpu,
            escape: escape::ALLOC,
            via_xfer: false,
            bytes: 4096,
        })
    }

    #[test]
    fn only_video_allocations_of_a_task_count() {
        assert_eq!(
            inputs(&alloc(101, MemKind::Video, Some(0))),
            vec![Input::MemAlloc {
                id: 1,
                gpu: 0,
                bytes: 4096,
                ts_ns: TS
            }]
        );
        assert!(inputs(&alloc(101, MemKind::Host, Some(0))).is_empty());
        assert!(inputs(&alloc(101, MemKind::Egm, Some(0))).is_empty());
        assert!(inputs(&alloc(101, MemKind::Video, None)).is_empty());
        assert!(inputs(&alloc(999, MemKind::Video, Some(0))).is_empty());
    }

    #[test]
    fn frees_and_teardowns_go_to_the_charged_process() {
        let free = |mem_kind, freed_pid, bytes| {
            Event::GpuFree(GpuFreeEvent {
                header: hdr(EventKind::GpuFree, 999),
                client: 1,
                handle: 3,
                class: 0x40,
                kind: ObjectKind::VideoMemory,
                gpu: Some(0),
                mem_kind,
                freed_pid,
                escape: escape::FREE,
                bytes,
            })
        };
        assert_eq!(
            inputs(&free(Some(MemKind::Video), Some(200), 10)),
            vec![Input::MemFree {
                id: 2,
                gpu: 0,
                bytes: 10,
                ts_ns: TS
            }]
        );
        assert!(inputs(&free(Some(MemKind::Video), None, 0)).is_empty());
        assert!(inputs(&free(Some(MemKind::Host), Some(200), 10)).is_empty());
        assert!(inputs(&free(None, Some(200), 10)).is_empty());
        let teardown = Event::GpuTeardown(GpuTeardownEvent {
            header: hdr(EventKind::GpuTeardown, 999),
            client: 1,
            reason: TeardownReason::FileReleased,
            owner_pid: 100,
            gpu: Some(1),
            device: 2,
            sub: None,
            objects: 3,
            bytes: 30,
            host_bytes: 40,
            egm_bytes: 50,
        });
        assert_eq!(
            inputs(&teardown),
            vec![Input::MemFree {
                id: 1,
                gpu: 1,
                bytes: 30,
                ts_ns: TS
            }]
        );
    }

    #[test]
    fn a_moving_charge_leaves_one_task_for_another() {
        let charge = |from_pid, to_pid, mem_kind| {
            Event::GpuCharge(GpuChargeEvent {
                header: hdr(EventKind::GpuCharge, from_pid),
                from_pid,
                to_pid,
                gpu: Some(0),
                mem_kind,
                client: 1,
                handle: 2,
                bytes: 64,
            })
        };
        let free = |id| Input::MemFree {
            id,
            gpu: 0,
            bytes: 64,
            ts_ns: TS,
        };
        let alloc = |id| Input::MemAlloc {
            id,
            gpu: 0,
            bytes: 64,
            ts_ns: TS,
        };
        assert_eq!(
            inputs(&charge(100, 200, MemKind::Video)),
            vec![free(1), alloc(2)]
        );
        assert_eq!(inputs(&charge(999, 200, MemKind::Video)), vec![alloc(2)]);
        assert_eq!(inputs(&charge(100, 999, MemKind::Video)), vec![free(1)]);
        // Within one task, or between processes that are no task: nothing moves.
        assert!(inputs(&charge(100, 101, MemKind::Video)).is_empty());
        assert!(inputs(&charge(998, 999, MemKind::Video)).is_empty());
        assert!(inputs(&charge(100, 200, MemKind::Host)).is_empty());
    }

    #[test]
    fn only_a_refused_video_allocation_is_memory_pressure() {
        let ioctl = |pid, class, gpu, status, requested_bytes| {
            Event::GpuIoctl(GpuIoctlEvent {
                header: hdr(EventKind::GpuIoctl, pid),
                fd: 3,
                device: DeviceFile::Ctl,
                call: Call::Rm(escape::ALLOC),
                cmd: 0xC030_462B,
                control_cmd: None,
                class,
                gpu,
                status,
                outcome: IoctlOutcome::Decoded,
                via_xfer: false,
                ret: 0,
                requested_bytes,
            })
        };
        let failed = |gpu| {
            vec![Input::AllocFailed {
                id: 1,
                gpu,
                bytes: 1 << 30,
                ts_ns: TS,
            }]
        };
        let no_mem = status::NO_MEMORY;
        assert_eq!(
            inputs(&ioctl(100, 0x40, Some(2), no_mem, 1 << 30)),
            failed(2)
        );
        // The GPU of the task when the event does not know it.
        assert_eq!(inputs(&ioctl(100, 0x40, None, no_mem, 1 << 30)), failed(3));
        assert_eq!(inputs(&ioctl(100, 0, None, no_mem, 1 << 30)), failed(3));
        // Host and virtual NO_MEMORY, other statuses, no size, no task: nothing.
        assert!(inputs(&ioctl(100, 0x3E, Some(2), no_mem, 0)).is_empty());
        assert!(inputs(&ioctl(100, 0x3E, Some(2), no_mem, 1 << 30)).is_empty());
        assert!(inputs(&ioctl(100, 0x50A0, Some(2), no_mem, 1 << 30)).is_empty());
        assert!(
            inputs(&ioctl(
                100,
                0x40,
                Some(2),
                status::INVALID_ARGUMENT,
                1 << 30
            ))
            .is_empty()
        );
        assert!(inputs(&ioctl(999, 0x40, Some(2), no_mem, 1 << 30)).is_empty());
    }
}
