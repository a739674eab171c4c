//! Joins the trace to the scheduler core: turns kernel events into scheduler
//! inputs, carries out the core's actions (freezes, thaws and stops on the
//! actuation thread, [`super::worker`]; signals through each task's
//! [`Actuator`](super::actuator::Actuator)), feeds confirmations back, measures
//! each decision's latency, and writes the logs. The control requests it serves
//! are in `requests` (one method each); what `keling status` shows is rendered
//! from its state, read only, by `status_view`.
//!
//! Beside it, each with one job: [`super::launch`] (launch requests and the held
//! children of launched tasks), [`super::members`] (which process is whose,
//! adoption, reconcile) and [`super::notify`] (what a launch's client hears). The
//! daemon is the only one that feeds the core: they hand it what to feed. All of
//! them reach the machine (clock, cgroups, actuation thread, processes) only
//! through the [`Host`] trait, so the daemon's behaviour is tested against a
//! fake one without root (`daemon/behaviour.rs`).
//!
//! Every input goes to the core through [`Daemon::step`] with its [`Cause`]: the
//! kernel timestamp and receipt time the decisions it leads to are timed from,
//! and the refused allocation an eviction is for.
//!
//! "Active" (what the core's `Active` input means here): a task is active when a
//! process of it made an NVIDIA call (any GPU event of that process) or was switched
//! onto a CPU; at most one `Active` per task per [`crate::defaults::ACTIVE_INTERVAL_NS`]
//! (the kernel already limits them per tracked root process: [`Event::Active`]) reaches
//! the core. It becomes idle after the core's idle timeout without one (a frozen task
//! is neither, by construction).
//!
//! Memory inputs come from video memory only ([`memory_inputs`]).
use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use keling_common::nvidia::{ObjectKind, status};
use keling_sched::{Action, ActionKind, Input, Output, Scheduler, TaskId, TaskState};

use super::sharing::OutsideMemory;
use super::{
    config::Config,
    history::Histories,
    host::{Host, Wake},
    launch::{self, Launches},
    log_writer::Logs,
    members::Members,
    notify::{Clients, Eviction},
    worker::{Confirmation, Job},
};
use crate::{
    control::{ExportFormat, StatusReply},
    event::decode::{DeviceFile, Event, ExitStatus, MemKind},
    latency::{DecisionTimes, LatencyRecorder, Verdict},
    log_format::Record,
};

/// Recent decisions kept for `--export tune`.
const TUNE_SERIES_MAX: usize = 100_000;
/// The least time an actuation is given to show before it is reported unconfirmed
/// (and a freeze escalated). Whether it was late is the latency model's call, on
/// its own timeout.
const CONFIRM_WAIT_FLOOR: Duration = Duration::from_millis(10);
/// Memory is given back to the system (`malloc_trim`) once this many archived
/// tasks were forgotten since the last time, at most every [`TRIM_EVERY_NS`].
const TRIM_AFTER_FORGOTTEN: u64 = 1000;
const TRIM_EVERY_NS: u64 = 10_000_000_000;

/// What one step's decisions are timed from, and whom they are for: passed down
/// from the input that caused them to every action they lead to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The kernel timestamp of what the input reports (its `ts_ns`).
    pub event_ns: u64,
    /// When the agent received it: the read of the kernel event, or when the
    /// input was made.
    pub received_ns: u64,
    /// A refused allocation being handled: whom an eviction it leads to is for.
    pub evicting_for: Option<Eviction>,
}

impl Cause {
    /// What `input`, received at `received_ns`, is the cause of.
    pub fn of(input: &Input, received_ns: u64) -> Self {
        Self {
            event_ns: input.ts_ns(),
            received_ns,
            evicting_for: match *input {
                Input::AllocFailed { id, gpu, bytes, .. } => Some(Eviction {
                    requester: id,
                    gpu,
                    bytes,
                }),
                _ => None,
            },
        }
    }
}

/// Settings of the daemon that are not the core's.
pub struct DaemonSettings {
    /// Priority of tasks that neither the request nor a config rule gives one.
    pub default_priority: u8,
    /// Archived tasks are forgotten this long after they finished, ns.
    pub archive_retention_ns: u64,
    /// At most this many archived tasks are kept: those that finished first are
    /// forgotten first.
    pub archive_max: usize,
}

/// What became of finished tasks since the daemon started (`keling status`).
#[derive(Default)]
struct Finished {
    completed: u64,
    failed: u64,
    forgotten: u64,
    /// Forgotten since memory was last given back, and when that was.
    forgotten_since_trim: u64,
    trimmed_ns: u64,
}

pub struct Daemon {
    sched: Scheduler,
    latency: LatencyRecorder,
    /// The machine: clock, actuation thread, processes.
    host: Box<dyn Host>,
    /// The tasks it acts on and which process is whose.
    members: Members,
    /// Launched tasks held before exec.
    launches: Launches,
    /// Launch connections and their tasks.
    conn_task: HashMap<u64, TaskId>,
    /// The clients of launched tasks.
    clients: Clients,
    next_id: TaskId,
    logs: Logs,
    config: Config,
    settings: DaemonSettings,
    /// When the daemon started (the interval log's start).
    started_ns: u64,
    /// (timestamp, end-to-end latency) of recent decisions, for `--export tune`.
    series: VecDeque<(u64, u64)>,
    last_prune_ns: u64,
    /// Each task's transitions and decisions, for its owner (`keling status TASK`).
    histories: Histories,
    finished: Finished,
    /// GPU memory of processes in no task, told to the core at each tick.
    outside: OutsideMemory,
    /// Per GPU, the video allocations of tasks the driver refused for lack of
    /// memory since the daemon started (memory pressure, for Slurm).
    refused: std::collections::BTreeMap<u32, u64>,
    /// Where launched tasks' records go, for the next agent (`restart`).
    records: Option<std::path::PathBuf>,
}

impl Daemon {
    /// A daemon acting on `host` (the machine: [`super::host::RealHost`]).
    /// Confirmations and wake-ups come back from the host to
    /// [`Daemon::confirmed`] and [`Daemon::woken`].
    pub fn new(
        sched: Scheduler,
        latency: LatencyRecorder,
        logs: Logs,
        config: Config,
        settings: DaemonSettings,
        host: Box<dyn Host>,
    ) -> Self {
        Self {
            sched,
            latency,
            started_ns: host.now_ns(),
            host,
            members: Members::default(),
            launches: Launches::default(),
            conn_task: HashMap::new(),
            clients: Clients::default(),
            next_id: 1,
            logs,
            config,
            settings,
            series: VecDeque::new(),
            last_prune_ns: 0,
            histories: Histories::default(),
            finished: Finished::default(),
            outside: OutsideMemory::default(),
            refused: Default::default(),
            records: None,
        }
    }

    /// Never adopt `pid` (the agent's fail-safe).
    pub fn exclude(&mut self, pid: u32) {
        self.members.exclude(pid);
    }

    /// Feeds one input to the core, logs it, and carries out what comes back;
    /// `cause` is what the decisions are timed from.
    fn step(&mut self, input: &Input, cause: Cause) {
        self.logs.input(input);
        if let Input::AllocFailed { gpu, .. } = *input {
            *self.refused.entry(gpu).or_insert(0) += 1;
        }
        let out = self.sched.step(input);
        self.apply(out, &cause);
    }

    /// [`Daemon::step`] for an input made now (not read from the kernel).
    fn step_now(&mut self, input: &Input) {
        self.step(input, Cause::of(input, self.host.now_ns()));
    }

    fn apply(&mut self, out: Output, cause: &Cause) {
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
            match t.to {
                TaskState::Completed => self.finished.completed += 1,
                TaskState::Failed => self.finished.failed += 1,
                _ => {}
            }
            let was_for_ns = self.histories.transition(t);
            self.clients.tell_transition(t, was_for_ns, &self.sched);
        }
        for a in out.actions {
            self.act(a, cause);
        }
        self.logs.flush();
    }

    /// Carries out one action, timing it from `cause`. Freezes, thaws and stops go
    /// to the actuation thread, which carries them out, confirms them and reports
    /// back.
    fn act(&mut self, action: Action, cause: &Cause) {
        let decided_ns = self.host.now_ns();
        // Enforce is logged with the Kill/Terminate that follows it.
        let (id, kind) = (action.task(), action.kind().unwrap_or(ActionKind::Warn));
        let Some(task) = self.members.get(id) else {
            return;
        };
        let (pid, actuator) = (task.pid, task.actuator.clone());
        let mut times = DecisionTimes {
            action: format!("{kind:?}").to_lowercase(),
            event_ns: cause.event_ns,
            received_ns: cause.received_ns,
            decided_ns,
            actuated_ns: decided_ns,
            confirmed_ns: None,
        };
        match action {
            Action::Freeze { .. } | Action::Thaw { .. } | Action::Stop { .. } => {
                // The model's timeout, but never so short that ordinary jitter
                // escalates a freeze to SIGSTOP (an adaptive timeout follows fast
                // decisions down below a millisecond).
                let timeout =
                    Duration::from_nanos(self.latency.timeout_ns()).max(CONFIRM_WAIT_FLOOR);
                self.host.submit(Job::Actuate {
                    id,
                    kind,
                    actuator,
                    times,
                    timeout,
                });
                return;
            }
            Action::Terminate { .. } | Action::Kill { .. } if self.launches.is_held(id) => {
                self.tell_ending(id, libc::SIGKILL, cause);
                self.launches
                    .cancel(id, "ended by Keling", &mut self.clients, &mut *self.host);
            }
            Action::Terminate { .. } => {
                self.tell_ending(id, libc::SIGTERM, cause);
                actuator.terminate()
            }
            Action::Kill { .. } => {
                self.tell_ending(id, libc::SIGKILL, cause);
                if let Err(e) = actuator.kill() {
                    log::warn!("task {id}: {e:#}");
                }
            }
            Action::Place { gpu, .. } => {
                self.logs.record(&Record::Placement {
                    task: id,
                    pid,
                    gpu,
                    timestamp_ns: decided_ns,
                });
                self.clients.tell_placed(id, pid, gpu, &self.sched);
                // Its `placed` is told once the exec succeeded (notify.rs).
                self.launches
                    .release(id, gpu, &mut self.clients, &mut *self.host);
                self.record_task(id);
            }
            Action::Warn { remaining_ms, .. } => {
                log::warn!("task {id} (pid {pid}) reaches its duration limit in {remaining_ms} ms");
                self.logs.record(&Record::Warning {
                    task: id,
                    pid,
                    remaining_ms,
                    timestamp_ns: decided_ns,
                });
                self.clients.tell_warning(id, remaining_ms, &self.sched);
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
                    record: record.clone(),
                });
                self.clients.tell_enforcement(id, record);
            }
        }
        times.actuated_ns = self.host.now_ns();
        self.record(id, &times);
    }

    /// Tells a launch's client that Keling is ending its task (see
    /// [`Clients::tell_ending`]).
    fn tell_ending(&mut self, id: TaskId, signal: i32, cause: &Cause) {
        self.clients
            .tell_ending(id, signal, &self.sched, cause.evicting_for);
    }

    /// Records one decision's latency, for the task's history too.
    fn record(&mut self, id: TaskId, times: &DecisionTimes) -> Verdict {
        let verdict = self.latency.record(times);
        self.histories.decision(id, times, &verdict);
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
            ExportFormat::Tune => out.extend(
                crate::latency::tune_report(&self.latency_series())
                    .to_string()
                    .into_bytes(),
            ),
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The window of decisions' end-to-end latencies the tune report replays:
    /// `(decided_ns, end_to_end_ns)`, oldest first.
    pub fn latency_series(&self) -> Vec<(u64, u64)> {
        self.series.iter().copied().collect()
    }

    /// A confirmation came back: record its latency and tell the core.
    pub fn confirmed(&mut self, c: Confirmation) {
        if c.late {
            // Its timeout was reported (and recorded) already: only the core
            // needs to know it took effect.
            let late_ms = c
                .times
                .confirmed_ns
                .unwrap_or(0)
                .saturating_sub(c.times.actuated_ns)
                / 1_000_000;
            log::info!(
                "task {}: the {} took effect late, {late_ms} ms after it was made",
                c.id,
                c.times.action
            );
            self.step_now(&Input::Confirmed {
                id: c.id,
                action: c.action,
                ts_ns: c.times.confirmed_ns.unwrap_or_else(|| self.host.now_ns()),
            });
            return;
        }
        let verdict = self.record(c.id, &c.times);
        if verdict.late || !c.confirmed {
            self.logs.record(&Record::LateDecision {
                task: c.id,
                action: c.times.action.clone(),
                end_to_end_ns: verdict.end_to_end_ns,
                timeout_ns: verdict.timeout_ns,
                confirmed: c.confirmed,
            });
        }
        let ts_ns = c.times.confirmed_ns.unwrap_or_else(|| self.host.now_ns());
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
        self.step_now(&input);
    }

    /// Something came back from off the loop.
    pub fn woken(&mut self, wake: Wake) {
        match wake {
            Wake::Exited(id) => self.task_exited(id),
            Wake::Exec(id, outcome) => {
                if let Err(what) = &outcome {
                    log::warn!("task {id}: {what}");
                }
                self.clients.exec_outcome(id, outcome);
                self.clients.settle(id);
            }
        }
    }

    /// A task's pidfd polled readable: its process is gone.
    fn task_exited(&mut self, id: TaskId) {
        let Some(t) = self.members.get(id) else {
            return; // already ended (an adopted task's exit event came first)
        };
        let status = if t.our_child {
            // Our child: reap it for its status.
            self.host.reap(id)
        } else if let Some(s) = t.exit_seen {
            s
        } else if t.launched() {
            // Taken back from an earlier agent: not our child to reap.
            let why = format!(
                "task {id} (pid {}) ended, but it is not this agent's child (taken back after a \
                 restart) and the trace lost its exit event: its exit status is unknown",
                t.pid
            );
            log::warn!("{why}");
            self.clients.exit_unknown(id, why);
            ExitStatus::Exited(-1)
        } else {
            log::warn!(
                "task {id} (pid {}) ended and the trace lost its exit event: exit status unknown",
                t.pid
            );
            ExitStatus::Exited(-1)
        };
        self.end_task(id, status, self.host.now_ns());
    }

    /// The task's root process ended: tell the core and the client, clean up.
    /// `received_ns`: when the agent learnt it.
    fn end_task(&mut self, id: TaskId, status: ExitStatus, received_ns: u64) {
        let ts_ns = self
            .members
            .get(id)
            .and_then(|t| t.exited_ns)
            .unwrap_or_else(|| self.host.now_ns());
        self.launches.ended(id, status, &mut self.clients);
        let input = Input::Exit {
            id,
            exit_code: status.code(),
            ts_ns,
        };
        self.step(&input, Cause::of(&input, received_ns));
        let ending_reason = self.sched.task(id).and_then(|t| t.ending_reason);
        self.clients.exited(id, status.code(), ending_reason);
        self.clients.settle(id);
        if self.members.get(id).is_some_and(|t| t.launched()) {
            self.unrecord(id);
        }
        if let Some(conn) = self.members.remove(id).and_then(|t| t.conn) {
            self.conn_task.remove(&conn);
        }
        // Whatever the task left behind goes with it.
        self.host.forget(id);
    }

    /// Turns one kernel event into scheduler inputs.
    pub fn on_event(&mut self, event: &Event) {
        // Every decision it leads to is timed from its receipt.
        let received_ns = self.host.now_ns();
        let h = *event.header();
        match event {
            Event::GpuOpen(o) if !self.members.is_member(h.pid) => {
                // However it came to have the fd (open, dup, receipt, first use).
                self.maybe_adopt(h.pid, o.device, h.ts_ns, received_ns);
                return;
            }
            Event::Exit(e) if e.group_dead != 0 => {
                self.outside.exited(h.pid);
                let status = ExitStatus::from_wait_status(e.exit_status);
                if let Some(id) = self
                    .members
                    .root_exited(h.pid, h.ts_ns, status, &*self.host)
                {
                    self.end_task(id, status, received_ns);
                }
            }
            Event::Fork(f) if f.tracked != 0 => {
                self.members.forked(h.pid, f.child_pid, &*self.host)
            }
            Event::Switch(s) => {
                if let Some(id) = self.members.task_of(s.next_pid) {
                    self.activity(id, h.ts_ns, received_ns);
                }
            }
            Event::Active(_) => {
                if let Some(id) = self.members.task_of(h.pid) {
                    self.activity(id, h.ts_ns, received_ns);
                }
            }
            _ => {}
        }
        if !event.is_gpu() {
            return;
        }
        let inputs = memory_inputs(
            event,
            |pid| self.members.task_of(pid),
            |id| self.sched.task(id).and_then(|t| t.gpu),
        );
        for input in inputs {
            self.step(&input, Cause::of(&input, received_ns));
        }
        self.outside
            .on_event(event, |pid| self.members.task_of(pid));
        if let Some(id) = self.members.task_of(h.pid) {
            self.activity(id, h.ts_ns, received_ns);
        }
    }

    /// Whether `bytes` more for `pid` would take its task over its memory quota
    /// (the agent then looks at the kernel's full tables first: [`Self::books_unsure`]).
    pub fn would_pass_quota(&self, pid: u32, bytes: u64) -> bool {
        let Some(t) = self.members.task_of(pid).and_then(|id| self.sched.task(id)) else {
            return false;
        };
        let held: u128 = t.mem_bytes.values().map(|&b| u128::from(b)).sum();
        !t.mem_unsure
            && t.spec
                .mem_quota_bytes
                .is_some_and(|q| held + u128::from(bytes) > u128::from(q))
    }

    /// The kernel found a table it needed for `pid`'s GPU memory books full: the
    /// figure of its task may be wrong, and the core is told so (no quota decision
    /// on it). False when `pid` belongs to no task (yet: a child whose fork is
    /// still in the ring buffer), so that the caller asks again.
    pub fn books_unsure(&mut self, pid: u32) -> bool {
        let Some(id) = self.members.task_of(pid) else {
            return false;
        };
        if self.sched.task(id).is_none_or(|t| t.mem_unsure) {
            return true;
        }
        log::warn!(
            "task {id}: a kernel table Keling needed for the GPU memory books of pid {pid} \
             was full; its memory figure may be wrong, and its quota is not enforced"
        );
        let received_ns = self.host.now_ns();
        let input = Input::MemUnsure {
            id,
            ts_ns: received_ns,
        };
        self.step(&input, Cause::of(&input, received_ns));
        true
    }

    /// Checks which process belongs to which task against the truth (see
    /// [`Members::reconcile`]). Run every second and when the kernel reports lost
    /// events.
    pub fn reconcile_members(&mut self) {
        self.members.reconcile(&*self.host);
    }

    /// A process Keling did not launch opened an NVIDIA device: it becomes a task
    /// when the config says so (see [`Members::adopt`]).
    fn maybe_adopt(&mut self, pid: u32, device: DeviceFile, ts_ns: u64, received_ns: u64) {
        let adopted = self.members.adopt(
            self.next_id,
            pid,
            device,
            ts_ns,
            &self.config,
            self.settings.default_priority,
            &mut *self.host,
        );
        let Some((spec, uid)) = adopted else {
            return;
        };
        self.next_id += 1;
        self.histories.owner(spec.id, uid);
        let input = Input::Arrive { spec, ts_ns };
        self.step(&input, Cause::of(&input, received_ns));
    }

    fn activity(&mut self, id: TaskId, ts_ns: u64, received_ns: u64) {
        if self.members.note_active(id, ts_ns) {
            let input = Input::Active { id, ts_ns };
            self.step(&input, Cause::of(&input, received_ns));
        }
    }

    /// Whether the scheduler's clock must run at its full rate: some task lives
    /// (see `Scheduler::has_live_tasks`).
    pub fn needs_clock(&self) -> bool {
        self.sched.has_live_tasks()
    }

    pub fn tick(&mut self) {
        let now = self.host.now_ns();
        self.latency.tick(now);
        for input in self.outside.changes(now) {
            self.step_now(&input);
        }
        self.step_now(&Input::Tick { ts_ns: now });
        let mut forgot = 0;
        if now.saturating_sub(self.last_prune_ns) >= 1_000_000_000 {
            self.last_prune_ns = now;
            let n = self
                .sched
                .prune_archived(now.saturating_sub(self.settings.archive_retention_ns));
            if n > 0 {
                log::debug!("forgot {n} archived task(s) past the retention window");
            }
            forgot += n;
        }
        // The count cap, at every tick: a burst never grows the archive past it
        // by more than one tick's exits.
        if self.sched.archived_len() > self.settings.archive_max {
            let n = self.sched.prune_archived_to(self.settings.archive_max);
            log::debug!(
                "forgot {n} archived task(s) over the cap of {}",
                self.settings.archive_max
            );
            forgot += n;
        }
        if forgot > 0 {
            let sched = &self.sched;
            self.histories.retain(|id| sched.task(id).is_some());
            self.finished.forgotten += forgot as u64;
            self.finished.forgotten_since_trim += forgot as u64;
        }
        if self.finished.forgotten_since_trim >= TRIM_AFTER_FORGOTTEN
            && now.saturating_sub(self.finished.trimmed_ns) >= TRIM_EVERY_NS
        {
            self.finished.forgotten_since_trim = 0;
            self.finished.trimmed_ns = now;
            let started = std::time::Instant::now();
            give_back_memory();
            log::debug!(
                "gave freed memory back to the system in {:?}",
                started.elapsed()
            );
        }
    }

    /// The fail-safe thawed and continued everything while the agent was stalled:
    /// freeze again what the core holds frozen (or is freezing), now that the
    /// agent runs again.
    pub fn refreeze_after_failsafe(&mut self) {
        // The fail-safe consumed the stopped list and continued what was on it.
        self.host.forget_stopped();
        let mut n = 0;
        for t in self.sched.tasks() {
            let holding = t.state == TaskState::Preempted
                || matches!(t.in_flight, Some(ActionKind::Freeze | ActionKind::Stop));
            if let (true, Some(rt)) = (holding, self.members.get(t.spec.id)) {
                self.host.submit(Job::Refreeze {
                    actuator: rt.actuator.clone(),
                });
                n += 1;
            }
        }
        log::warn!(
            "the fail-safe thawed everything while the agent was stalled; froze {n} task(s) again"
        );
    }

    /// The decision-latency recorder (`/metrics`, the interval log).
    pub fn latency(&self) -> &LatencyRecorder {
        &self.latency
    }

    /// The decision-latency recorder, to take an interval for the interval log.
    pub fn latency_mut(&mut self) -> &mut LatencyRecorder {
        &mut self.latency
    }

    /// The task a process belongs to, as far as the agent knows (`/metrics` labels).
    pub fn task_of(&self, pid: u32) -> Option<TaskId> {
        self.members.task_of(pid)
    }

    /// Per GPU, what the Slurm report judges memory pressure by.
    pub fn memory_pressure(&self) -> Vec<super::sharing::MemoryPressure> {
        super::sharing::memory_pressure(&self.sched, &self.refused)
    }

    /// What `keling status` shows (to nobody in particular: `/metrics`).
    pub fn status(&self) -> StatusReply {
        self.view().status_for(None)
    }

    /// The daemon's state as `keling status` reads it.
    fn view(&self) -> StatusView<'_> {
        StatusView {
            sched: &self.sched,
            latency: &self.latency,
            host: &*self.host,
            members: &self.members,
            histories: &self.histories,
            settings: &self.settings,
            finished: &self.finished,
        }
    }

    /// Thaws every task and continues every process it stopped (the agent is
    /// stopping; the tasks run on).
    pub fn shutdown(&mut self) {
        // A freeze still queued for the actuation thread would land after the
        // thaws below (and with the fail-safe gone, stay).
        self.host.stop_actuation();
        for (_, t) in self.members.tasks() {
            if let Err(e) = t.actuator.set_frozen(false) {
                log::warn!("thawing pid {} at stop: {e:#}", t.pid);
            }
        }
        self.host.forget_stopped();
    }
}

/// Gives the memory the allocator keeps free back to the system (glibc keeps
/// what a burst freed otherwise: issue 32 saw 20 -> 244 MB stay).
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
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

pub mod restart;

#[cfg(test)]
mod behaviour;
mod books;
mod requests;
mod slurm_attach;
mod status_view;

use status_view::StatusView;

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
