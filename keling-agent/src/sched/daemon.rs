//! Joins the trace to the scheduler core: turns kernel events into scheduler
//! inputs, carries out the core's actions through the [`Actuator`]s (freezes, thaws
//! and stops on the actuation thread, [`super::worker`]), feeds confirmations
//! back, measures each decision's latency, answers control requests, and writes
//! the logs.
//!
//! "Active" (what the core's `Active` input means here): a task is active when a
//! process of it made an NVIDIA call (any GPU event of that process) or was switched
//! onto a CPU; at most one `Active` per task per [`crate::defaults::ACTIVE_INTERVAL_NS`]
//! (the kernel already limits them per tracked root process: [`Event::Active`]) reaches
//! the core. It becomes idle after the core's idle timeout without one (a frozen task
//! is neither, by construction).
//!
//! Memory inputs come from video memory only ([`memory_inputs`]).
//!
//! # Membership and identity
//!
//! Keling acts on a task only through what cannot point at another process: the
//! task's cgroup (launched tasks) or the pidfd opened when it was launched or
//! adopted. A task's end comes from its pidfd (it polls readable when the process
//! exits), so a lost exit event cannot leave a task behind whose pid someone else
//! now has. Which task a process belongs to, for attributing events, is a map the
//! trace fills (forks) and that is checked against the truth every second and
//! whenever the kernel reports lost events ([`Daemon::reconcile_members`]): the
//! cgroup's `cgroup.procs` for launched tasks, pidfds and start times for adopted
//! ones.
//!
//! # Launches
//!
//! A launch is checked against the access rules (who may use which priority, how
//! much memory), then started as its caller, held until the probes track it, and
//! released without waiting for its exec: a command whose start blocks (a working
//! directory on a hung mount, a slow exec) blocks only itself. It arrives in the
//! core at once (its GPU calls are attributed from the first); the client hears
//! `accepted` once the exec succeeded, or the step that failed, and then its exit
//! code.
//!
//! The held child execs when the core places it (`Place`), with
//! `CUDA_VISIBLE_DEVICES` of that GPU written in at its release. At arrival
//! (the default binding) that is the same step as its arrival. Under late
//! binding an unpinned task the core cannot run yet stays held, unbound, in the
//! core's host-level queue: it runs nothing, holds nothing and is never frozen;
//! its client hears `queued` (position, why) and later `placed`. A queued task
//! that is signalled, or that Keling ends, is killed before it ran anything.
use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    ffi::OsString,
    os::fd::{AsRawFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use keling_common::nvidia::{ObjectKind, status};
use keling_sched::{
    Action, ActionKind, Binding, Input, Output, Scheduler, TaskId, TaskSpec, TaskState,
};
use tokio::sync::mpsc;

use super::{
    actuator::{Actuator, CgroupActuator, SignalActuator, StoppedList},
    cgroup::{CgroupRoot, TaskCgroup},
    config::Config,
    history::{self, Histories},
    log::{Logs, Record},
    worker::{Confirmation, Job, Worker},
};
use crate::{
    control::{
        Accepted, ExportFormat, FORWARDED_SIGNALS, LaunchRequest, Notice, PlacementStatus, Reply,
        Request, SignalRequest, StatusReply, TaskHistory, TaskRef, TaskStatus,
        server::{Incoming, Peer, Replier},
    },
    event::decode::{DeviceFile, Event, ExitStatus, MemKind},
    latency::{DecisionTimes, LatencyRecorder, Stage, Verdict},
    os::{
        monotonic_ns,
        pidfd::Pidfd,
        proc::{self, ProcessFacts},
        spawn::{HeldChild, SpawnOptions, parse_env},
    },
};

/// Recent decisions kept for `--export tune`.
const TUNE_SERIES_MAX: usize = 100_000;
/// How long the cgroup of a task that ended may take to empty after `cgroup.kill`.
const CGROUP_REMOVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The least time an actuation is given to show before it is reported unconfirmed
/// (and a freeze escalated). Whether it was late is the latency model's call, on
/// its own timeout.
const CONFIRM_WAIT_FLOOR: Duration = Duration::from_millis(10);
/// The environment of a task whose client sent none.
const MINIMAL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What the agent keeps about a task beside the core's view.
struct TaskRuntime {
    pid: u32,
    /// A launched task not yet released to exec: queued (late binding), or
    /// between its fork and its `Place`.
    held: Option<Held>,
    /// Held since launch (our child) or adoption: the task's identity.
    pidfd: Arc<Pidfd>,
    actuator: Arc<dyn Actuator>,
    /// Tasks Keling launched: their cgroup.
    cgroup: Option<TaskCgroup>,
    /// Whose task it is.
    uid: u32,
    /// The launch's connection (its forwarded signals come on it).
    conn: Option<u64>,
    last_active_ns: u64,
    /// An adopted task's exit, seen by the trace before its pidfd said so.
    exit_seen: Option<ExitStatus>,
    /// When the kernel reported the root process's exit (the trace's timestamp):
    /// what the decisions its end leads to are timed from.
    exited_ns: Option<u64>,
}

/// A launched task's child, held before exec until the core places it.
struct Held {
    child: HeldChild,
    env_gpu: EnvGpu,
}

/// Where a launched task's `CUDA_VISIBLE_DEVICES` comes from.
#[derive(Clone, Copy, Debug)]
enum EnvGpu {
    /// The GPU the launch chose (pinned, or placed at arrival), set at the fork;
    /// `None` leaves the client's value.
    Chosen(Option<u32>),
    /// Late binding: the GPU the core binds it to, written at its release.
    AtPlacement,
}

/// A process known to belong to a task (for attributing events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    task: TaskId,
    /// A child of an adopted task: its start time, checked by reconcile.
    start_ticks: Option<u64>,
}

/// The client of a launch: what it has been told, and what it is owed.
struct Client {
    reply: Replier,
    accepted: Accepted,
    /// The exec's outcome, once known.
    exec: Option<Result<(), String>>,
    /// The task's exit code, once it ended.
    exit_code: Option<i32>,
    told_accepted: bool,
    /// Whether it asked for freeze and resume notices.
    notify_preempt: bool,
    /// The signals it was told Keling sent to end its task.
    told_ending: Vec<i32>,
}

/// Things that happen off the loop and come back to it.
pub enum Wake {
    /// A task's pidfd says its process exited.
    Exited(TaskId),
    /// A launched command's exec succeeded, or which step failed.
    Exec(TaskId, Result<(), String>),
}

/// Settings of the daemon that are not the core's.
pub struct DaemonSettings {
    /// Priority of tasks that neither the request nor a config rule gives one.
    pub default_priority: u8,
    /// SCHED_FIFO priority of the actuation thread (0: ordinary class).
    pub actuator_rt_priority: u8,
    /// Archived tasks are forgotten this long after they finished, ns.
    pub archive_retention_ns: u64,
}

pub struct Daemon {
    sched: Scheduler,
    latency: LatencyRecorder,
    cgroups: CgroupRoot,
    tasks: BTreeMap<TaskId, TaskRuntime>,
    /// Processes of tasks, for attributing events (never for acting on them).
    pid_task: HashMap<u32, Member>,
    /// Launch connections and their tasks.
    conn_task: HashMap<u64, TaskId>,
    clients: HashMap<TaskId, Client>,
    next_id: TaskId,
    logs: Logs,
    worker: Worker,
    wakes: mpsc::UnboundedSender<Wake>,
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
    /// Processes never adopted: the agent, its fail-safe.
    excluded: HashSet<u32>,
    last_prune_ns: u64,
    /// Each task's transitions and decisions, for its owner (`keling status TASK`).
    histories: Histories,
    /// The refused allocation being handled (requester, GPU, bytes): whom an
    /// eviction it leads to is for.
    evicting_for: Option<(TaskId, u32, u64)>,
}

impl Daemon {
    /// A daemon with its actuation thread started. Confirmations come back on
    /// `confirmations`, other wake-ups on `wakes`. Needs a tokio runtime.
    pub fn new(
        sched: Scheduler,
        latency: LatencyRecorder,
        logs: Logs,
        config: Config,
        settings: DaemonSettings,
        confirmations: mpsc::UnboundedSender<Confirmation>,
        wakes: mpsc::UnboundedSender<Wake>,
    ) -> anyhow::Result<Self> {
        let worker = Worker::start(settings.actuator_rt_priority, confirmations)?;
        if worker.realtime {
            log::info!(
                "actuation thread in the real-time class (SCHED_FIFO {})",
                settings.actuator_rt_priority
            );
        }
        Ok(Self {
            sched,
            latency,
            cgroups: CgroupRoot::open()?,
            tasks: BTreeMap::new(),
            pid_task: HashMap::new(),
            conn_task: HashMap::new(),
            clients: HashMap::new(),
            next_id: 1,
            logs,
            worker,
            wakes,
            cause: (0, 0),
            received_ns: None,
            config,
            settings,
            stopped: StoppedList::default(),
            started_ns: monotonic_ns(),
            series: VecDeque::new(),
            excluded: HashSet::from([std::process::id()]),
            last_prune_ns: 0,
            histories: Histories::default(),
            evicting_for: None,
        })
    }

    /// Never adopt `pid` (the agent's fail-safe).
    pub fn exclude(&mut self, pid: u32) {
        self.excluded.insert(pid);
    }

    /// Feeds one input to the core, logs it, and carries out what comes back.
    pub fn step(&mut self, input: Input) {
        // The decisions this input leads to are timed from it: its kernel timestamp
        // and when the agent received it.
        self.cause = (input.ts_ns(), self.received_ns.unwrap_or_else(monotonic_ns));
        self.logs.input(&input);
        let out = self.sched.step(&input);
        self.evicting_for = match input {
            Input::AllocFailed { id, gpu, bytes, .. } => Some((id, gpu, bytes)),
            _ => None,
        };
        self.apply(out);
        self.evicting_for = None;
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
            self.tell_transition(t);
        }
        for a in out.actions {
            self.act(a);
        }
        self.logs.flush();
    }

    /// Carries out one action, timing it. Freezes, thaws and stops go to the
    /// actuation thread, which carries them out, confirms them and reports back.
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
                // The model's timeout, but never so short that ordinary jitter
                // escalates a freeze to SIGSTOP (an adaptive timeout follows fast
                // decisions down below a millisecond).
                let timeout =
                    Duration::from_nanos(self.latency.timeout_ns()).max(CONFIRM_WAIT_FLOOR);
                self.worker.submit(Job::Actuate {
                    id,
                    kind,
                    actuator,
                    times,
                    timeout,
                });
                return;
            }
            Action::Terminate { .. } | Action::Kill { .. } if self.is_held(id) => {
                self.tell_ending(id, libc::SIGKILL);
                self.cancel_held(id, "ended by Keling");
            }
            Action::Terminate { .. } => {
                self.tell_ending(id, libc::SIGTERM);
                actuator.terminate()
            }
            Action::Kill { .. } => {
                self.tell_ending(id, libc::SIGKILL);
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
                if let (Some(c), Some(t)) = (self.clients.get(&id), self.sched.task(id)) {
                    c.reply.notify(Notice::Placed {
                        task: id,
                        pid,
                        gpu,
                        priority: t.spec.priority,
                    });
                }
                // After the notice: the client hears where before the task's output.
                self.release(id, gpu);
            }
            Action::Warn { remaining_ms, .. } => {
                log::warn!("task {id} (pid {pid}) reaches its duration limit in {remaining_ms} ms");
                self.logs.record(&Record::Warning {
                    task: id,
                    pid,
                    remaining_ms,
                    timestamp_ns: decided_ns,
                });
                if let (Some(c), Some(t)) = (self.clients.get(&id), self.sched.task(id)) {
                    let config = self.sched.config();
                    c.reply.notify(Notice::Warning {
                        task: id,
                        remaining_ms,
                        allowed_ms: t
                            .spec
                            .max_duration_ms
                            .unwrap_or(config.default_max_duration_ms),
                        hard_kill: t.spec.hard_kill.unwrap_or(config.default_hard_kill),
                    });
                }
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
                if let Some(c) = self.clients.get(&id) {
                    c.reply.notify(Notice::Enforcement { task: id, record });
                }
            }
        }
        times.actuated_ns = monotonic_ns();
        self.record(id, &times);
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
            self.step(Input::Confirmed {
                id: c.id,
                action: c.action,
                ts_ns: c.times.confirmed_ns.unwrap_or_else(monotonic_ns),
            });
            return;
        }
        let verdict = self.record(c.id, &c.times);
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

    /// Answers one control request. `track` makes the probes follow a process.
    pub fn handle(&mut self, incoming: Incoming, track: &mut dyn FnMut(u32) -> anyhow::Result<()>) {
        let Incoming {
            request,
            fds,
            reply,
            peer,
            conn,
        } = incoming;
        match request {
            Request::Status(_) => reply.send(Reply::Status(Box::new(
                self.status_for(Some(peer.creds.uid)),
            ))),
            Request::History(id) => reply.send(match self.history(id, peer.creds.uid) {
                Some(h) => Reply::History(Box::new(h)),
                None => Reply::Error(format!(
                    "no task {id} (finished tasks are kept for {} s)",
                    self.settings.archive_retention_ns / 1_000_000_000
                )),
            }),
            Request::Export(format) => reply.send(match self.export(format) {
                Ok(text) => Reply::Export(text),
                Err(e) => Reply::Error(format!("{e:#}")),
            }),
            Request::Launch(req) => {
                if let Err(e) = self.launch(&req, &fds, &peer, conn, &reply, track) {
                    log::info!("launch by uid {} refused: {e}", peer.creds.uid);
                    reply.send(Reply::Error(e));
                }
            }
            Request::Signal(s) => reply.send(self.signal_request(&s, &peer)),
            Request::Forward(signal) => self.forward(conn, signal),
        }
    }

    /// `{"signal": ...}`: the task's owner or root may signal it.
    fn signal_request(&mut self, s: &SignalRequest, peer: &Peer) -> Reply {
        let Some(t) = self.tasks.get(&s.task) else {
            return Reply::Error(format!("no running task {}", s.task));
        };
        if !self.config.access_policy.may_act_on(&peer.creds, t.uid) {
            return Reply::Error(format!(
                "task {} belongs to uid {}: only its owner or root may signal it",
                s.task, t.uid
            ));
        }
        if !(1..=64).contains(&s.signal) {
            return Reply::Error(format!("{} is not a signal", s.signal));
        }
        if t.held.is_some() {
            return Reply::Signalled(self.signal_held(s.task, s.signal));
        }
        Reply::Signalled(t.actuator.signal(s.signal))
    }

    /// A signal for a task still held before exec: one whose default action
    /// ends a process ends it (it never runs); the others have nothing to act
    /// on. The number of processes signalled.
    fn signal_held(&mut self, id: TaskId, signal: i32) -> usize {
        const HARMLESS: [i32; 8] = [
            libc::SIGCHLD,
            libc::SIGCONT,
            libc::SIGSTOP,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGURG,
            libc::SIGWINCH,
        ];
        if HARMLESS.contains(&signal) {
            return 0;
        }
        self.cancel_held(id, &format!("sent signal {signal}"));
        1
    }

    /// A signal forwarded by a launch's client to its own task.
    fn forward(&mut self, conn: u64, signal: i32) {
        if !FORWARDED_SIGNALS.contains(&signal) {
            log::warn!("connection {conn}: signal {signal} is not one that is forwarded");
            return;
        }
        if let Some(&id) = self.conn_task.get(&conn)
            && self.is_held(id)
        {
            self.signal_held(id, signal);
            return;
        }
        if let Some(t) = self.conn_task.get(&conn).and_then(|id| self.tasks.get(id)) {
            let n = t.actuator.signal(signal);
            log::debug!(
                "forwarded signal {signal} to {n} process(es) of pid {}",
                t.pid
            );
        }
    }

    /// Starts a launched task: checked against the access rules, in its own
    /// cgroup, as its caller, held until tracked, then released.
    fn launch(
        &mut self,
        req: &LaunchRequest,
        stdio: &[OwnedFd],
        peer: &Peer,
        conn: u64,
        reply: &Replier,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> Result<(), String> {
        let creds = peer.creds.clone();
        // The config's rules fill in what the request leaves out.
        let argv0 = req.argv.first().map(String::as_str).unwrap_or_default();
        if argv0.is_empty() {
            return Err("no command given".into());
        }
        let facts = ProcessFacts {
            comm: argv0
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .chars()
                .take(15)
                .collect(),
            uid: Some(creds.uid),
            cgroup: None,
            exe: argv0.starts_with('/').then(|| argv0.to_owned()),
        };
        let (rule, _) = self.config.settings_for(&facts);
        let (priority, mem_quota_bytes) = self.config.access_policy.launch_terms(
            &creds,
            req.priority,
            rule.priority,
            self.settings.default_priority,
            req.mem_quota_bytes.or(rule.mem_quota_bytes),
        )?;
        let late = self.sched.config().binding == Binding::Late;
        let gpu = match req.gpu.or(rule.gpu) {
            Some(g) => Some(g),
            // Late binding: the core binds it when a GPU can run it.
            None if late => None,
            None => {
                let weights = self.sched.placement_weights(monotonic_ns());
                weights
                    .iter()
                    .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
                    .map(|&(g, _)| g)
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        // Unique across agents: a test or a restart may run several in turn.
        let cgroup = self
            .cgroups
            .create_task(&format!("task-{}-{id}", std::process::id()))
            .map_err(|e| format!("{e:#}"))?;
        let env_gpu = if late && gpu.is_none() {
            EnvGpu::AtPlacement
        } else {
            EnvGpu::Chosen(gpu)
        };
        let started = self.start_held(req, stdio, &creds, env_gpu, &cgroup, track);
        let (pidfd, child) = match started {
            Ok(s) => s,
            Err(e) => {
                // A failed launch leaves no cgroup behind (nothing entered it).
                let _ = cgroup.remove();
                return Err(format!("{e:#}"));
            }
        };
        let pid = pidfd.pid();
        let pidfd = Arc::new(pidfd);
        self.watch_exit(id, &pidfd);
        self.tasks.insert(
            id,
            TaskRuntime {
                pid,
                held: Some(Held { child, env_gpu }),
                pidfd,
                actuator: Arc::new(CgroupActuator::new(cgroup.clone())),
                cgroup: Some(cgroup),
                uid: creds.uid,
                conn: Some(conn),
                last_active_ns: 0,
                exit_seen: None,
                exited_ns: None,
            },
        );
        self.pid_task.insert(
            pid,
            Member {
                task: id,
                start_ticks: None,
            },
        );
        self.conn_task.insert(conn, id);
        self.clients.insert(
            id,
            Client {
                reply: reply.clone(),
                accepted: Accepted { task: id, gpu, pid },
                exec: None,
                exit_code: None,
                told_accepted: false,
                notify_preempt: req.notify_preempt,
                told_ending: Vec::new(),
            },
        );
        self.histories.owner(id, creds.uid);
        log::info!(
            "task {id}: pid {pid} {:?} for uid {} {}",
            req.argv,
            creds.uid,
            match (gpu, late) {
                (Some(g), _) => format!("on GPU {g}"),
                (None, true) => "unbound (late binding)".into(),
                (None, false) =>
                    "on GPU 0 (no GPU list known: CUDA_VISIBLE_DEVICES left as given)".into(),
            }
        );
        let name = argv0.rsplit('/').next().unwrap_or_default().to_owned();
        let spec = TaskSpec {
            id,
            pid,
            name,
            priority,
            gpu,
            mem_quota_bytes,
            max_duration_ms: req.max_duration_ms.or(rule.max_duration_ms),
            grace_ms: req.grace_ms.or(rule.grace_ms),
            hard_kill: req.hard_kill.or(rule.hard_kill),
            expected_runtime_ms: req.expected_runtime_ms,
        };
        self.step(Input::Arrive {
            spec,
            ts_ns: monotonic_ns(),
        });
        if let Some(q) = self.sched.queued(id) {
            log::info!(
                "task {id}: queued unbound at position {} ({})",
                q.position,
                q.reason.as_str()
            );
            if let Some(c) = self.clients.get(&id) {
                c.reply.notify(Notice::Queued {
                    task: id,
                    pid,
                    position: q.position,
                    ahead: q.ahead,
                    reason: q.reason,
                });
            }
        }
        Ok(())
    }

    /// Lets a held task exec on `gpu` (where the core placed it); the client
    /// hears the exec's outcome.
    fn release(&mut self, id: TaskId, gpu: u32) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        let Some(Held { child, env_gpu }) = t.held.take() else {
            return; // released already (a pinned task placed again)
        };
        let at = match env_gpu {
            EnvGpu::Chosen(_) => None, // in its environment since the fork
            EnvGpu::AtPlacement => Some(gpu),
        };
        if let (Some(c), Some(g)) = (self.clients.get_mut(&id), at) {
            c.accepted.gpu = Some(g);
        }
        match child.release_on(at) {
            Ok(pending) => {
                let wakes = self.wakes.clone();
                tokio::spawn(async move {
                    let outcome = pending.outcome().await;
                    let _ = wakes.send(Wake::Exec(id, outcome));
                });
            }
            Err(e) => {
                // The child was reaped; its pidfd reports the end.
                log::warn!("task {id}: {e:#}");
                if let Some(c) = self.clients.get_mut(&id) {
                    c.exec = Some(Err(format!("{e:#}")));
                }
            }
        }
    }

    fn is_held(&self, id: TaskId) -> bool {
        self.tasks.get(&id).is_some_and(|t| t.held.is_some())
    }

    /// Ends a task that is still held (it never ran its command) and says so to
    /// its client.
    fn cancel_held(&mut self, id: TaskId, why: &str) {
        let Some(held) = self.tasks.get_mut(&id).and_then(|t| t.held.take()) else {
            return;
        };
        log::info!("task {id}: {why} while queued; its command never ran");
        // Killed unreaped: its pidfd reports the end, which ends the task.
        held.child.cancel();
        if let Some(c) = self.clients.get_mut(&id) {
            c.exec = Some(Err(format!(
                "task {id} was {why} while queued: its command never ran"
            )));
        }
    }

    /// Forks the task's process as its caller, tracks it, and lets it go on to exec.
    fn start_held(
        &self,
        req: &LaunchRequest,
        stdio: &[OwnedFd],
        creds: &crate::os::users::Credentials,
        env_gpu: EnvGpu,
        cgroup: &TaskCgroup,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<(Pidfd, HeldChild)> {
        let fds: Option<[i32; 3]> = (stdio.len() == 3).then(|| {
            [
                stdio[0].as_raw_fd(),
                stdio[1].as_raw_fd(),
                stdio[2].as_raw_fd(),
            ]
        });
        let argv: Vec<OsString> = req.argv.iter().map(OsString::from).collect();
        let mut env = match &req.env {
            Some(entries) => parse_env(entries),
            None => vec![(OsString::from("PATH"), OsString::from(MINIMAL_PATH))],
        };
        if let EnvGpu::Chosen(Some(g)) = env_gpu {
            env.retain(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
            env.push((
                OsString::from("CUDA_VISIBLE_DEVICES"),
                OsString::from(g.to_string()),
            ));
        }
        let opts = SpawnOptions {
            gpu_at_release: matches!(env_gpu, EnvGpu::AtPlacement),
            env,
            clear_env: true,
            stdio: fds,
            cgroup_procs: Some(cgroup.procs_file()),
            cwd: Some(req.cwd.clone()),
            credentials: Some(creds.clone()),
            new_session: true,
        };
        let held = HeldChild::spawn_with(&argv, &opts)?;
        // Our child, not yet reaped: its pid is certainly its own.
        let pidfd = Pidfd::open(held.pid())?;
        track(held.pid())?;
        Ok((pidfd, held))
    }

    /// Reports the task's end when its pidfd polls readable.
    fn watch_exit(&self, id: TaskId, pidfd: &Pidfd) {
        let fd = match pidfd.try_clone_fd() {
            Ok(fd) => fd,
            Err(e) => {
                log::warn!("task {id}: cannot watch its pidfd ({e}); its end comes from the trace");
                return;
            }
        };
        let wakes = self.wakes.clone();
        tokio::spawn(async move {
            match crate::os::async_fd(fd) {
                Ok(afd) => {
                    let _ = afd.readable().await;
                }
                Err(e) => log::warn!("task {id}: cannot watch its pidfd: {e}"),
            }
            let _ = wakes.send(Wake::Exited(id));
        });
    }

    /// Something came back from off the loop.
    pub fn woken(&mut self, wake: Wake) {
        match wake {
            Wake::Exited(id) => self.task_exited(id),
            Wake::Exec(id, outcome) => {
                if let Err(what) = &outcome {
                    log::warn!("task {id}: {what}");
                }
                if let Some(c) = self.clients.get_mut(&id) {
                    c.exec = Some(outcome);
                }
                self.settle_client(id);
            }
        }
    }

    /// Tells a launch's client what it is owed, in order: accepted (or why its
    /// command could not start), then the exit code.
    fn settle_client(&mut self, id: TaskId) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        match &c.exec {
            None => return, // the exec's outcome first
            Some(Err(what)) => {
                c.reply.send(Reply::Error(what.clone()));
                self.clients.remove(&id);
                return;
            }
            Some(Ok(())) if !c.told_accepted => {
                c.told_accepted = true;
                c.reply.send(Reply::Accepted(c.accepted.clone()));
            }
            Some(Ok(())) => {}
        }
        if let Some(code) = c.exit_code {
            c.reply.send(Reply::ExitCode(code));
            self.clients.remove(&id);
        }
    }

    /// A task's pidfd polled readable: its process is gone.
    fn task_exited(&mut self, id: TaskId) {
        let Some(t) = self.tasks.get(&id) else {
            return; // already ended (an adopted task's exit event came first)
        };
        let status = if t.cgroup.is_some() {
            // Our child: reap it for its status.
            match t.pidfd.try_wait() {
                Ok(Some(s)) => ExitStatus::from_wait_status(s),
                _ => match t.pidfd.wait_blocking() {
                    Ok(s) => ExitStatus::from_wait_status(s),
                    Err(e) => {
                        log::warn!("task {id}: cannot reap pid {}: {e}", t.pid);
                        ExitStatus::Exited(-1)
                    }
                },
            }
        } else if let Some(s) = t.exit_seen {
            s
        } else {
            log::warn!(
                "task {id} (pid {}) ended and the trace lost its exit event: exit status unknown",
                t.pid
            );
            ExitStatus::Exited(-1)
        };
        self.end_task(id, status);
    }

    /// The task's root process ended: tell the core and the client, clean up.
    fn end_task(&mut self, id: TaskId, status: ExitStatus) {
        let ts_ns = self
            .tasks
            .get(&id)
            .and_then(|t| t.exited_ns)
            .unwrap_or_else(monotonic_ns);
        // Ended while held by something other than Keling (its pid was killed):
        // it never ran, and no exec outcome will come.
        if let Some(held) = self.tasks.get_mut(&id).and_then(|t| t.held.take()) {
            held.child.reaped();
            if let Some(c) = self.clients.get_mut(&id) {
                c.exec = Some(Err(format!(
                    "task {id} ended while queued ({status:?}): its command never ran"
                )));
            }
        }
        self.step(Input::Exit {
            id,
            exit_code: status.code(),
            ts_ns,
        });
        if let Some(c) = self.clients.get_mut(&id) {
            c.exit_code = Some(status.code());
            // Why it ended, when Keling ended it: before the exit code it explains.
            if let Some(reason) = self.sched.task(id).and_then(|t| t.ending_reason) {
                c.reply.notify(Notice::Ended {
                    task: id,
                    reason,
                    exit_code: status.code(),
                });
            }
        }
        self.settle_client(id);
        if let Some(task) = self.tasks.remove(&id) {
            if let Some(conn) = task.conn {
                self.conn_task.remove(&conn);
            }
            match task.cgroup {
                Some(cg) => {
                    // Whatever the task left behind goes with it; the wait for the
                    // cgroup to empty runs off the loop.
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = cg.kill_and_remove(CGROUP_REMOVE_TIMEOUT) {
                            log::warn!("task {id}: {e:#}");
                        }
                    });
                }
                None => self.stopped.forget(task.pid),
            }
        }
        self.pid_task.retain(|_, m| m.task != id);
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
                // The kernel's timestamp of a task's end, for timing what follows.
                if let Some(t) = self
                    .pid_task
                    .get(&h.pid)
                    .and_then(|m| self.tasks.get_mut(&m.task))
                    .filter(|t| t.pid == h.pid)
                {
                    t.exited_ns = Some(h.ts_ns);
                }
                // Tasks Keling did not launch are not its children: their exit code
                // comes from the kernel; their end, from their pidfd.
                let adopted = self.pid_task.get(&h.pid).map(|m| m.task).filter(|id| {
                    self.tasks
                        .get(id)
                        .is_some_and(|t| t.pid == h.pid && t.cgroup.is_none())
                });
                if let Some(id) = adopted {
                    let status = ExitStatus::from_wait_status(e.exit_status);
                    let t = self.tasks.get_mut(&id).expect("checked above");
                    if t.pidfd.is_alive() {
                        // Not quite gone: the pidfd will say so in a moment.
                        t.exit_seen = Some(status);
                    } else {
                        self.end_task(id, status);
                    }
                }
            }
            Event::Fork(f) if f.tracked != 0 => {
                if let Some(&m) = self.pid_task.get(&h.pid) {
                    let adopted = self.tasks.get(&m.task).is_some_and(|t| t.cgroup.is_none());
                    // A launched task's members come from its cgroup; an adopted
                    // one's child is remembered with its start time.
                    let start_ticks = if adopted {
                        proc::start_ticks(f.child_pid)
                    } else {
                        None
                    };
                    if !adopted || start_ticks.is_some() {
                        self.pid_task.insert(
                            f.child_pid,
                            Member {
                                task: m.task,
                                start_ticks,
                            },
                        );
                    }
                }
            }
            Event::Switch(s) => {
                if let Some(&m) = self.pid_task.get(&s.next_pid) {
                    self.activity(m.task, h.ts_ns);
                }
            }
            Event::Active(_) => {
                if let Some(&m) = self.pid_task.get(&h.pid) {
                    self.activity(m.task, h.ts_ns);
                }
            }
            _ => {}
        }
        if !event.is_gpu() {
            return;
        }
        let inputs = memory_inputs(
            event,
            |pid| self.pid_task.get(&pid).map(|m| m.task),
            |id| self.sched.task(id).and_then(|t| t.gpu),
        );
        for input in inputs {
            self.step(input);
        }
        if let Some(&m) = self.pid_task.get(&h.pid) {
            self.activity(m.task, h.ts_ns);
        }
    }

    /// Checks which process belongs to which task against the truth: a launched
    /// task's members are what its cgroup holds (whatever the trace saw or lost); an
    /// adopted task's are its process, while its pidfd says it lives, and the
    /// children the trace saw, while their start time is the one recorded. Run
    /// every second and when the kernel reports lost events.
    pub fn reconcile_members(&mut self) {
        let mut members: HashMap<u32, Member> = HashMap::new();
        for (&id, t) in &self.tasks {
            if let Some(cg) = &t.cgroup {
                for pid in cg.pids() {
                    members.insert(
                        pid,
                        Member {
                            task: id,
                            start_ticks: None,
                        },
                    );
                }
                // The root process may have left its cgroup's list already
                // (exiting): it stays ours until its pidfd says it is gone.
                if t.pidfd.is_alive() {
                    members.entry(t.pid).or_insert(Member {
                        task: id,
                        start_ticks: None,
                    });
                }
            }
        }
        for (&pid, &m) in &self.pid_task {
            if members.contains_key(&pid) {
                continue;
            }
            let Some(t) = self.tasks.get(&m.task) else {
                continue;
            };
            if t.cgroup.is_some() {
                continue; // not in its cgroup any more
            }
            let still = if pid == t.pid {
                t.pidfd.is_alive()
            } else {
                m.start_ticks
                    .is_some_and(|s| proc::start_ticks(pid) == Some(s))
            };
            if still {
                members.insert(pid, m);
            }
        }
        let (before, after) = (self.pid_task.len(), members.len());
        let dropped = self
            .pid_task
            .iter()
            .filter(|(pid, m)| members.get(pid) != Some(m))
            .count();
        if dropped > 0 {
            log::debug!("membership: {dropped} stale of {before} processes dropped, {after} now");
        }
        self.pid_task = members;
    }

    /// A process Keling did not launch opened an NVIDIA device: it becomes a task
    /// (frozen and thawed with SIGSTOP/SIGCONT) when a config rule matches it, or
    /// when the defaults say to manage unmatched processes. Never the agent or its
    /// fail-safe; never a process that started after the event (the pid's owner
    /// changed).
    fn maybe_adopt(&mut self, pid: u32, device: DeviceFile, ts_ns: u64) {
        if self.excluded.contains(&pid) {
            return;
        }
        let facts = ProcessFacts::of_pid(pid);
        let (settings, managed) = self.config.settings_for(&facts);
        if !managed {
            return;
        }
        let pidfd = match Pidfd::open_started_by(pid, ts_ns) {
            Ok(p) => p,
            Err(e) => {
                log::debug!(
                    "not adopting pid {pid}: {e} (gone, or not the process that opened the device)"
                );
                return;
            }
        };
        let Some((start_ticks, uid)) =
            pidfd.read_proc(|pid| Some((proc::start_ticks(pid)?, proc::uid(pid)?)))
        else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let gpu = settings.gpu.or(device.gpu());
        log::info!(
            "adopting pid {pid} ({}) as task {id} (rule {:?})",
            facts.comm,
            settings.rule
        );
        let pidfd = Arc::new(pidfd);
        self.watch_exit(id, &pidfd);
        self.tasks.insert(
            id,
            TaskRuntime {
                pid,
                held: None,
                pidfd: pidfd.clone(),
                actuator: Arc::new(SignalActuator {
                    pidfd,
                    start_ticks,
                    stopped: self.stopped.clone(),
                }),
                cgroup: None,
                uid,
                conn: None,
                last_active_ns: 0,
                exit_seen: None,
                exited_ns: None,
            },
        );
        self.histories.owner(id, uid);
        self.pid_task.insert(
            pid,
            Member {
                task: id,
                start_ticks: Some(start_ticks),
            },
        );
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
        if ts_ns.saturating_sub(t.last_active_ns) < u64::from(crate::defaults::ACTIVE_INTERVAL_NS) {
            return;
        }
        t.last_active_ns = ts_ns;
        self.step(Input::Active { id, ts_ns });
    }

    pub fn tick(&mut self) {
        let now = monotonic_ns();
        self.latency.tick(now);
        self.step(Input::Tick { ts_ns: now });
        if now.saturating_sub(self.last_prune_ns) >= 1_000_000_000 {
            self.last_prune_ns = now;
            let n = self
                .sched
                .prune_archived(now.saturating_sub(self.settings.archive_retention_ns));
            if n > 0 {
                log::debug!("forgot {n} archived task(s) past the retention window");
                let sched = &self.sched;
                self.histories.retain(|id| sched.task(id).is_some());
            }
        }
    }

    /// The fail-safe thawed and continued everything while the agent was stalled:
    /// freeze again what the core holds frozen (or is freezing), now that the
    /// agent runs again.
    pub fn refreeze_after_failsafe(&mut self) {
        // The fail-safe consumed the stopped list and continued what was on it.
        self.stopped.clear();
        let mut n = 0;
        for t in self.sched.tasks() {
            let holding = t.state == TaskState::Preempted
                || matches!(t.in_flight, Some(ActionKind::Freeze | ActionKind::Stop));
            if let (true, Some(rt)) = (holding, self.tasks.get(&t.spec.id)) {
                self.worker.submit(Job::Refreeze {
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
        self.pid_task.get(&pid).map(|m| m.task)
    }

    /// What `keling status` shows.
    pub fn status(&self) -> StatusReply {
        self.status_for(None)
    }

    /// What `keling status` shows to `caller` (its tasks marked as its own).
    pub fn status_for(&self, caller: Option<u32>) -> StatusReply {
        let now = monotonic_ns();
        let views = self.sched.tasks();
        let tasks = views
            .iter()
            .map(|t| self.task_status(&views, t, caller, now))
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
            caller_uid: caller,
            tasks,
            latency: self.latency.status(),
            stages_by_action,
            placement: PlacementStatus {
                weights,
                load_balance_error: keling_sched::load_balance_error(&used),
            },
        }
    }

    /// One task as `keling status` shows it to `caller`.
    fn task_status(
        &self,
        views: &[keling_sched::TaskView],
        t: &keling_sched::TaskView,
        caller: Option<u32>,
        now: u64,
    ) -> TaskStatus {
        let rt = self.tasks.get(&t.spec.id);
        let history = self.histories.get(t.spec.id);
        let uid = rt.map(|r| r.uid).or(history.and_then(|h| h.uid));
        let end = t.finished_ns.unwrap_or(now);
        TaskStatus {
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
            elapsed_ms: end.saturating_sub(t.arrived_ns) / 1_000_000,
            wants_gpu: t.wants_gpu,
            in_flight: t.in_flight,
            cgroup: rt
                .and_then(|r| r.cgroup.as_ref())
                .map(|c| c.dir.to_string_lossy().into_owned()),
            uid,
            mine: caller.is_some() && uid == caller,
            state_for_ms: now.saturating_sub(history.map_or(t.arrived_ns, |h| h.state_since_ns))
                / 1_000_000,
            waiting: history::waiting(views, t, history, now),
            queued: self.sched.queued(t.spec.id),
            ending_reason: t.ending_reason,
            exit_code: t.exit_code,
        }
    }

    /// `keling status TASK`: the task now, its transitions and its decisions.
    pub fn history(&self, id: TaskId, caller: u32) -> Option<TaskHistory> {
        let view = self.sched.task(id)?;
        let views = self.sched.tasks();
        let task = self.task_status(&views, &view, Some(caller), monotonic_ns());
        let h = self.histories.get(id);
        Some(TaskHistory {
            task,
            arrived_ns: view.arrived_ns,
            transitions: h.map_or_else(Vec::new, |h| h.transitions.iter().cloned().collect()),
            decisions: h.map_or_else(Vec::new, |h| h.decisions.iter().cloned().collect()),
            transitions_dropped: h.map_or(0, |h| h.transitions_dropped),
            decisions_dropped: h.map_or(0, |h| h.decisions_dropped),
        })
    }

    /// Records a transition in the task's history and, when its client asked,
    /// tells it the task was frozen (and for whom) or resumed (and after how long).
    fn tell_transition(&mut self, t: &keling_sched::Transition) {
        let was_for_ns = self.histories.transition(t);
        let Some(c) = self.clients.get(&t.task).filter(|c| c.notify_preempt) else {
            return;
        };
        match (t.from, t.to) {
            (_, TaskState::Preempted) => {
                let views = self.sched.tasks();
                let yielded_to = views
                    .iter()
                    .find(|v| v.spec.id == t.task)
                    .map(|me| history::slot_holders(&views, me))
                    .unwrap_or_default();
                c.reply.notify(Notice::Frozen {
                    task: t.task,
                    reason: t.reason,
                    yielded_to,
                });
            }
            (TaskState::Preempted, TaskState::Running) => c.reply.notify(Notice::Resumed {
                task: t.task,
                frozen_ms: was_for_ns / 1_000_000,
            }),
            _ => {}
        }
    }

    /// Tells a launch's client that Keling is ending its task, why, and with
    /// which signal (once per signal).
    fn tell_ending(&mut self, id: TaskId, signal: i32) {
        let Some(view) = self.sched.task(id) else {
            return;
        };
        let Some(reason) = view.ending_reason else {
            return;
        };
        let evicted_for = self
            .evicting_for
            .filter(|_| reason == keling_sched::Reason::EvictedForMemory);
        let requester = evicted_for.and_then(|(rid, _, _)| self.sched.task(rid));
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if c.told_ending.contains(&signal) {
            return;
        }
        c.told_ending.push(signal);
        let held: u64 = view.mem_bytes.values().sum();
        let (bytes, gpu, quota_bytes) = match reason {
            keling_sched::Reason::EvictedForMemory => {
                (evicted_for.map(|e| e.2), evicted_for.map(|e| e.1), None)
            }
            keling_sched::Reason::OverQuota => (Some(held), None, view.spec.mem_quota_bytes),
            _ => (None, None, None),
        };
        c.reply.notify(Notice::Ending {
            task: id,
            reason,
            signal,
            evicted_for: requester.map(|r| TaskRef {
                task: r.spec.id,
                name: r.spec.name.clone(),
                priority: r.spec.priority,
            }),
            bytes,
            gpu,
            quota_bytes,
        });
    }

    /// Thaws every task and continues every process it stopped (the agent is
    /// stopping; the tasks run on).
    pub fn shutdown(&mut self) {
        for t in self.tasks.values() {
            if let Err(e) = t.actuator.set_frozen(false) {
                log::warn!("thawing pid {} at stop: {e:#}", t.pid);
            }
        }
        self.stopped.clear();
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
