//! Joins the trace to the scheduler core: turns kernel events into scheduler
//! inputs, carries out its actions with the actuators, confirms them, measures
//! each decision's latency, and writes the scheduling and input logs.
//!
//! "Active" (what the core's `Active` input means here): a task is active when a
//! process of it made an NVIDIA ioctl or was switched onto a CPU; at most one
//! `Active` per task per 5 ms reaches the core. It becomes idle after the core's
//! idle timeout without one (a frozen task is neither, by construction).
use std::{
    collections::{BTreeMap, HashMap},
    ffi::OsString,
    fs::File,
    io::{BufWriter, Write},
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use keling_common::{EventKind, nvidia::status};
use serde_json::json;
use tokio::sync::mpsc;

use super::{
    cgroup::{CgroupRoot, TaskCgroup},
    config::{Config, ProcessFacts},
    control::LaunchRequest,
    core::{Action, ActionKind, Input, Output, Scheduler, TaskId, TaskSpec, Transition},
};
use crate::{
    decode::{Event, ExitStatus},
    latency::{DecisionTimes, LatencyRecorder},
    spawn::{HeldChild, SpawnOptions},
    trace::monotonic_ns,
};

/// What the agent keeps about a task beside the core's view.
struct TaskRuntime {
    pid: u32,
    cgroup: Option<TaskCgroup>,
    /// Where to send `{"exit_code": N}` (the `keling launch` connection).
    reply: Option<tokio::net::unix::OwnedWriteHalf>,
    last_active_ns: u64,
}

/// A confirmation (or its absence) coming back from a blocking waiter.
pub struct Confirmation {
    pub id: TaskId,
    pub action: ActionKind,
    pub times: DecisionTimes,
    pub confirmed: bool,
}

pub struct Daemon {
    pub sched: Scheduler,
    pub latency: LatencyRecorder,
    cgroups: CgroupRoot,
    tasks: BTreeMap<TaskId, TaskRuntime>,
    /// Processes of tasks (the launched process and everything it forks).
    pid_task: HashMap<u32, TaskId>,
    next_id: TaskId,
    sched_log: Option<BufWriter<File>>,
    input_log: Option<BufWriter<File>>,
    confirm_tx: mpsc::UnboundedSender<Confirmation>,
    /// (event_ns, received_ns) of the input being handled.
    cause: (u64, u64),
    /// When the kernel event now being turned into inputs reached the agent.
    received_ns: Option<u64>,
    config: Config,
    /// When the daemon started (the interval log's start).
    started_ns: u64,
    /// (timestamp, end-to-end latency) of recent decisions, for `--export tune`.
    series: std::collections::VecDeque<(u64, u64)>,
    /// Processes Keling stopped with SIGSTOP (tasks it did not launch), mirrored in
    /// `/run/keling/stopped` for the fail-safe.
    stopped: std::collections::BTreeSet<u32>,
}

/// Waits until every process in `pids` shows state `T` (stopped) in /proc.
fn wait_stopped(pids: &[u32], timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let all = pids.iter().all(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Gone counts as stopped: it will not run again.
            stat.is_empty()
                || stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.trim().chars().next())
                    == Some('T')
        });
        if all {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Daemon {
    pub fn new(
        sched: Scheduler,
        latency: LatencyRecorder,
        sched_log: Option<PathBuf>,
        input_log: Option<PathBuf>,
        confirm_tx: mpsc::UnboundedSender<Confirmation>,
        config: Config,
    ) -> anyhow::Result<Self> {
        let open = |p: Option<PathBuf>| -> anyhow::Result<Option<BufWriter<File>>> {
            p.map(|p| {
                File::create(&p)
                    .map(BufWriter::new)
                    .with_context(|| format!("create {}", p.display()))
            })
            .transpose()
        };
        Ok(Self {
            sched,
            latency,
            cgroups: CgroupRoot::open()?,
            tasks: BTreeMap::new(),
            pid_task: HashMap::new(),
            next_id: 1,
            sched_log: open(sched_log)?,
            input_log: open(input_log)?,
            confirm_tx,
            cause: (0, 0),
            received_ns: None,
            config,
            stopped: Default::default(),
            started_ns: monotonic_ns(),
            series: Default::default(),
        })
    }

    /// Feeds one input to the core, logs it, and carries out what comes back.
    pub fn step(&mut self, input: Input) {
        // The decisions this input leads to are timed from it: its kernel timestamp
        // and when the agent received it.
        self.cause = (input.ts_ns(), self.received_ns.unwrap_or_else(monotonic_ns));
        if let Some(log) = &mut self.input_log {
            let _ = serde_json::to_writer(&mut *log, &input);
            let _ = log.write_all(b"\n");
        }
        let out = self.sched.step(&input);
        self.apply(out);
    }

    fn apply(&mut self, out: Output) {
        for t in &out.transitions {
            self.log_transition(t);
        }
        for a in out.actions {
            self.act(a);
        }
        if let Some(log) = &mut self.sched_log {
            let _ = log.flush();
        }
        if let Some(log) = &mut self.input_log {
            let _ = log.flush();
        }
    }

    fn log_transition(&mut self, t: &Transition) {
        log::info!(
            "task {} ({}, pid {}, priority {}) {}: {}",
            t.task,
            t.name,
            t.pid,
            t.priority,
            t.state_transition(),
            t.reason
        );
        if let Some(log) = &mut self.sched_log {
            let line = json!({
                "event_id": t.event_id,
                "state_transition": t.state_transition(),
                "timestamp_ns": t.timestamp_ns,
                "task": t.task,
                "name": t.name,
                "pid": t.pid,
                "gpu": t.gpu,
                "priority": t.priority,
                "reason": t.reason,
                "exit_code": t.exit_code,
            });
            let _ = serde_json::to_writer(&mut *log, &line);
            let _ = log.write_all(b"\n");
        }
    }

    fn log_line(&mut self, v: serde_json::Value) {
        if let Some(log) = &mut self.sched_log {
            let _ = serde_json::to_writer(&mut *log, &v);
            let _ = log.write_all(b"\n");
        }
    }

    /// Carries out one action, timing it; freezes and thaws are confirmed on a
    /// blocking thread, which reports back through the confirmation channel.
    fn act(&mut self, action: Action) {
        let decided_ns = monotonic_ns();
        // Enforce is logged with the Kill/Terminate that follows it.
        let (id, kind) = (action.task(), action.kind().unwrap_or(ActionKind::Warn));
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let (pid, cgroup) = (task.pid, task.cgroup.clone());
        let (cause_ns, received_ns) = self.cause;
        let mut times = DecisionTimes {
            action: format!("{kind:?}").to_lowercase(),
            event_ns: cause_ns,
            received_ns,
            decided_ns,
            actuated_ns: decided_ns,
            confirmed_ns: None,
        };
        let signal_all = |sig: i32| match &cgroup {
            Some(cg) => cg.signal(sig),
            // SAFETY: a signal to the task's own process, by pid.
            None => unsafe {
                libc::kill(pid as i32, sig);
            },
        };
        match action {
            Action::Freeze { .. } | Action::Thaw { .. } => {
                let freeze = kind == ActionKind::Freeze;
                let Some(cg) = cgroup else {
                    // Not launched by Keling: SIGSTOP/SIGCONT, listed for the fail-safe
                    // before the stop and after the continue.
                    if freeze {
                        self.stopped.insert(pid);
                        self.save_stopped();
                    }
                    signal_all(if freeze { libc::SIGSTOP } else { libc::SIGCONT });
                    if !freeze {
                        self.stopped.remove(&pid);
                        self.save_stopped();
                    }
                    times.actuated_ns = monotonic_ns();
                    times.confirmed_ns = Some(times.actuated_ns);
                    let _ = self.confirm_tx.send(Confirmation {
                        id,
                        action: kind,
                        times,
                        confirmed: true,
                    });
                    return;
                };
                if let Err(e) = cg.set_frozen(freeze) {
                    log::warn!("task {id}: {e:#}");
                }
                if !freeze {
                    // A freeze escalated to SIGSTOP is undone too.
                    cg.signal(libc::SIGCONT);
                }
                times.actuated_ns = monotonic_ns();
                let timeout = Duration::from_nanos(self.latency.timeout_ns());
                let tx = self.confirm_tx.clone();
                tokio::task::spawn_blocking(move || {
                    let confirmed = cg.wait_frozen(freeze, timeout).unwrap_or(false);
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
                return;
            }
            Action::Stop { .. } => {
                if cgroup.is_none() {
                    self.stopped.insert(pid);
                    self.save_stopped();
                }
                signal_all(libc::SIGSTOP);
                times.actuated_ns = monotonic_ns();
                let pids = match &cgroup {
                    Some(cg) => cg.pids(),
                    None => vec![pid],
                };
                let timeout = Duration::from_nanos(self.latency.timeout_ns());
                let tx = self.confirm_tx.clone();
                tokio::task::spawn_blocking(move || {
                    let confirmed = wait_stopped(&pids, timeout);
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
                return;
            }
            Action::Terminate { .. } => signal_all(libc::SIGTERM),
            Action::Kill { .. } => match &cgroup {
                Some(cg) => {
                    if let Err(e) = cg.kill() {
                        log::warn!("task {id}: {e:#}");
                    }
                }
                None => signal_all(libc::SIGKILL),
            },
            Action::Place { gpu, .. } => {
                self.log_line(json!({"type": "placement", "task": id, "pid": pid, "gpu": gpu, "timestamp_ns": decided_ns}));
            }
            Action::Warn { remaining_ms, .. } => {
                log::warn!("task {id} (pid {pid}) reaches its duration limit in {remaining_ms} ms");
                self.log_line(json!({"type": "warning", "task": id, "pid": pid, "remaining_ms": remaining_ms, "timestamp_ns": decided_ns}));
            }
            Action::Enforce { record, .. } => {
                log::warn!(
                    "task {id} (pid {pid}): {}",
                    serde_json::to_string(&record).unwrap_or_default()
                );
                self.log_line(json!({"type": "enforcement", "task": id, "pid": pid, "timestamp_ns": decided_ns, "record": record}));
            }
        }
        times.actuated_ns = monotonic_ns();
        self.record(&times);
    }

    /// Records one decision's latency.
    fn record(&mut self, times: &DecisionTimes) -> crate::latency::Verdict {
        let verdict = self.latency.record(times);
        if self.series.len() == 100_000 {
            self.series.pop_front();
        }
        self.series
            .push_back((times.decided_ns, verdict.end_to_end_ns));
        verdict
    }

    /// The latency figures in one of the export formats (`keling status --export`).
    pub fn export(&self, format: &str) -> anyhow::Result<String> {
        let mut out = Vec::new();
        match format {
            "prometheus" => self.latency.write_prometheus(&mut out)?,
            "percentiles" => self.latency.write_percentile_table(&mut out)?,
            "interval-log" => self.latency.write_interval_log(&mut out, self.started_ns)?,
            "json" => self.latency.write_json(&mut out)?,
            "tune" => {
                let series: Vec<(u64, u64)> = self.series.iter().copied().collect();
                out.extend(
                    crate::latency::tune_report(&series)
                        .to_string()
                        .into_bytes(),
                );
            }
            other => anyhow::bail!(
                "unknown export {other:?}: prometheus, percentiles, interval-log, json or tune"
            ),
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn save_stopped(&self) {
        let pids: Vec<u32> = self.stopped.iter().copied().collect();
        if let Err(e) = super::cgroup::write_stopped(&pids) {
            log::warn!("cannot record stopped processes for the fail-safe: {e:#}");
        }
    }

    /// A confirmation came back: record its latency and tell the core.
    pub fn confirmed(&mut self, c: Confirmation) {
        let verdict = self.record(&c.times);
        if verdict.late || !c.confirmed {
            let line = json!({
                "type": "late_decision", "task": c.id, "action": c.times.action,
                "end_to_end_ns": verdict.end_to_end_ns, "timeout_ns": verdict.timeout_ns,
                "confirmed": c.confirmed,
            });
            self.log_line(line);
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

    /// Starts a launched task: its own cgroup, held until tracked, then exec'd.
    /// Returns (task id, gpu, pid).
    pub fn launch(
        &mut self,
        req: &LaunchRequest,
        stdio: &[OwnedFd],
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
        default_priority: u8,
    ) -> anyhow::Result<(TaskId, Option<u32>, u32)> {
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
                let now = monotonic_ns();
                let weights = self.sched.placement_weights(now);
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
        let held = HeldChild::spawn_with(&argv, &opts)?;
        let pid = held.pid();
        track(pid)?;
        let pid = held.release(&argv[0])?;
        let name = req.argv[0]
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let now = monotonic_ns();
        self.tasks.insert(
            id,
            TaskRuntime {
                pid,
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
            priority: req.priority.or(rule.priority).unwrap_or(default_priority),
            gpu,
            mem_quota_bytes: req.mem_quota_bytes.or(rule.mem_quota_bytes),
            max_duration_ms: req.max_duration_ms.or(rule.max_duration_ms),
            grace_ms: req.grace_ms.or(rule.grace_ms),
            hard_kill: req.hard_kill.or(rule.hard_kill),
            expected_runtime_ms: req.expected_runtime_ms,
        };
        self.step(Input::Arrive { spec, ts_ns: now });
        Ok((id, gpu, pid))
    }

    /// Where to answer `{"exit_code": N}` when the task ends.
    pub fn set_reply(&mut self, id: TaskId, reply: tokio::net::unix::OwnedWriteHalf) {
        if let Some(t) = self.tasks.get_mut(&id) {
            t.reply = Some(reply);
        }
    }

    /// The task's root process ended (we reaped it): tell the core and the client.
    pub fn exited(&mut self, pid: u32, status: ExitStatus) {
        let Some(&id) = self.pid_task.get(&pid) else {
            return;
        };
        let now = monotonic_ns();
        self.step(Input::Exit {
            id,
            exit_code: status.code(),
            ts_ns: now,
        });
        if let Some(mut task) = self.tasks.remove(&id) {
            if let Some(reply) = task.reply.take() {
                let line = format!("{}\n", json!({"exit_code": status.code()}));
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let mut reply = reply;
                    let _ = reply.write_all(line.as_bytes()).await;
                });
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
            priority: settings.priority.unwrap_or(8),
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
        if ts_ns.saturating_sub(t.last_active_ns) < 5_000_000 {
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

    /// The JSON `keling status` shows.
    pub fn status_json(&self) -> serde_json::Value {
        let now = monotonic_ns();
        let tasks: Vec<serde_json::Value> = self
            .sched
            .tasks()
            .iter()
            .map(|t| {
                json!({
                    "id": t.spec.id,
                    "pid": t.spec.pid,
                    "name": t.spec.name,
                    "priority": t.spec.priority,
                    "class": t.class,
                    "state": t.state.as_str(),
                    "gpu": t.gpu,
                    "mem_bytes": t.mem_bytes.values().sum::<u64>(),
                    "mem_bytes_per_gpu": t.mem_bytes,
                    "on_gpu_ms": t.on_gpu_ms,
                    "elapsed_ms": t.finished_ns.unwrap_or(now).saturating_sub(t.arrived_ns) / 1_000_000,
                    "wants_gpu": t.wants_gpu,
                    "in_flight": t.in_flight,
                    "cgroup": self.tasks.get(&t.spec.id).and_then(|r| r.cgroup.as_ref()).map(|c| c.dir.clone()),
                })
            })
            .collect();
        // Per stage, for the actions that are confirmed (what `cargo xtask bench` shows).
        let mut stages_by_action = serde_json::Map::new();
        for action in ["freeze", "thaw"] {
            let mut per = serde_json::Map::new();
            for stage in crate::latency::Stage::ALL {
                if let Some(p) = self.latency.percentiles(stage, Some(action)) {
                    per.insert(
                        stage.as_str().to_owned(),
                        serde_json::to_value(p).unwrap_or_default(),
                    );
                }
            }
            stages_by_action.insert(action.to_owned(), per.into());
        }
        // Placement: each GPU's weight (higher is better) and how evenly memory is
        // spread, (max - min) / mean of the bytes used per GPU.
        let weights = self.sched.placement_weights(now);
        let mut used: BTreeMap<u32, f64> = weights.iter().map(|&(g, _)| (g, 0.0)).collect();
        for t in self.sched.tasks() {
            for (g, b) in &t.mem_bytes {
                *used.entry(*g).or_default() += *b as f64;
            }
        }
        let used: Vec<f64> = used.into_values().collect();
        json!({
            "tasks": tasks,
            "latency": self.latency.status_json(),
            "stages_by_action": stages_by_action,
            "placement": {
                "weights": weights,
                "load_balance_error": super::core::load_balance_error(&used),
            },
        })
    }

    /// Thaws every task and continues every process it stopped (the agent is
    /// stopping; the tasks run on).
    pub fn shutdown(&mut self) {
        for &pid in &self.stopped {
            // SAFETY: SIGCONT to a process Keling stopped.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        self.stopped.clear();
        self.save_stopped();
        for t in self.tasks.values() {
            if let Some(cg) = &t.cgroup {
                let _ = cg.set_frozen(false);
                cg.signal(libc::SIGCONT);
            }
        }
    }
}
