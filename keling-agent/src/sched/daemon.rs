//! Joins the trace to the scheduler core: turns kernel events into scheduler
//! inputs, carries out the core's actions through the [`Actuator`]s, feeds
//! confirmations back, measures each decision's latency, answers control requests,
//! and writes the logs.
//!
//! "Active" (what the core's `Active` input means here): a task is active when a
//! process of it made an NVIDIA ioctl or was switched onto a CPU; at most one
//! `Active` per task per [`ACTIVE_MIN_INTERVAL_NS`] reaches the core. It becomes idle
//! after the core's idle timeout without one (a frozen task is neither, by
//! construction).
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ffi::OsString,
    os::fd::{AsRawFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use keling_common::{EventKind, nvidia::status};
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
    event::decode::{Event, ExitStatus},
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
            Event::GpuFile(f)
                if EventKind::from_u32(h.kind) == Some(EventKind::GpuOpen)
                    && !self.pid_task.contains_key(&h.pid) =>
            {
                self.maybe_adopt(h.pid, f.device, h.ts_ns);
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
            Event::Gpu(g) => {
                let Some(&id) = self.pid_task.get(&h.pid) else {
                    return;
                };
                match EventKind::from_u32(h.kind) {
                    Some(EventKind::GpuAlloc) if g.gpu < keling_common::NO_GPU => {
                        self.step(Input::MemAlloc {
                            id,
                            gpu: g.gpu,
                            bytes: g.bytes,
                            ts_ns: h.ts_ns,
                        })
                    }
                    Some(EventKind::GpuFree) if g.gpu < keling_common::NO_GPU => {
                        if let Some(&owner) = self.pid_task.get(&g.owner_pid) {
                            self.step(Input::MemFree {
                                id: owner,
                                gpu: g.gpu,
                                bytes: g.bytes,
                                ts_ns: h.ts_ns,
                            })
                        }
                    }
                    Some(EventKind::GpuIoctl) if g.status == status::NO_MEMORY && g.bytes > 0 => {
                        let gpu = self.sched.task(id).and_then(|t| t.gpu).unwrap_or(0);
                        self.step(Input::AllocFailed {
                            id,
                            gpu,
                            bytes: g.bytes,
                            ts_ns: h.ts_ns,
                        })
                    }
                    _ => {}
                }
                self.activity(id, h.ts_ns);
            }
            _ => {}
        }
        // Teardowns free memory of whoever allocated it.
        if let Event::Gpu(g) = event
            && EventKind::from_u32(h.kind) == Some(EventKind::GpuTeardown)
            && g.gpu < keling_common::NO_GPU
            && let Some(&owner) = self.pid_task.get(&g.owner_pid)
        {
            self.step(Input::MemFree {
                id: owner,
                gpu: g.gpu,
                bytes: g.bytes,
                ts_ns: h.ts_ns,
            })
        }
    }

    /// A process Keling did not launch opened an NVIDIA device: it becomes a task
    /// (frozen and thawed with SIGSTOP/SIGCONT) when a config rule matches it, or
    /// when the defaults say to manage unmatched processes.
    fn maybe_adopt(&mut self, pid: u32, device: u32, ts_ns: u64) {
        let facts = ProcessFacts::of_pid(pid);
        let (settings, managed) = self.config.settings_for(&facts);
        if !managed {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let gpu = settings
            .gpu
            .or((device < keling_common::device_file::CTL).then_some(device));
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
