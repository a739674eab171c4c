//! The tasks the agent acts on and the processes that belong to them.
//!
//! Keling acts on a task only through what cannot point at another process: the
//! task's cgroup (launched tasks) or the pidfd opened when it was launched or
//! adopted. A task's end comes from its pidfd (it polls readable when the process
//! exits), so a lost exit event cannot leave a task behind whose pid someone else
//! now has. Which task a process belongs to, for attributing events, is a map the
//! trace fills (forks) and that is checked against the truth every second and
//! whenever the kernel reports lost events ([`Members::reconcile`]): the cgroup's
//! `cgroup.procs` for launched tasks, pidfds and start times for adopted ones.
//!
//! Adoption: a process Keling did not launch that opens an NVIDIA device becomes
//! a task when a config rule matches it (or the defaults manage unmatched ones),
//! held by a pidfd opened only if the process existed when the event happened.
//!
//! The map is for attributing events, never for acting: nothing here signals or
//! freezes anything. What identifies a task's processes (the pidfds, a launched
//! task's cgroup) is the [`Host`]'s; this module asks it what they say.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
};

use keling_sched::{TaskId, TaskSpec};

use super::{actuator::Actuator, config::Config, host::Host};
use crate::{
    event::decode::{DeviceFile, ExitStatus},
    os::users::Credentials,
};

/// What the agent keeps about a task beside the core's view.
pub struct TaskRuntime {
    /// Its root process (what identifies it is the host's: [`Host`]).
    pub pid: u32,
    pub actuator: Arc<dyn Actuator>,
    /// Tasks Keling launched: their cgroup's directory.
    pub cgroup: Option<PathBuf>,
    /// Whose task it is.
    pub uid: u32,
    /// This agent's child (it launched it): its exit status is reaped. A task
    /// taken back from an earlier agent's record is not, nor is a Slurm job
    /// step's task the plugin attached: their status comes from the trace.
    pub our_child: bool,
    /// The launch's connection (its forwarded signals come on it).
    pub conn: Option<u64>,
    /// The last `Active` the core was given for it.
    pub last_active_ns: u64,
    /// An adopted task's exit, seen by the trace before its pidfd said so.
    pub exit_seen: Option<ExitStatus>,
    /// When the kernel reported the root process's exit (the trace's timestamp):
    /// what the decisions its end leads to are timed from.
    pub exited_ns: Option<u64>,
    /// A Slurm job step's task (attached by the plugin): in a cgroup of ours,
    /// but not our child.
    pub slurm: Option<crate::control::SlurmRef>,
}

impl TaskRuntime {
    /// A task Keling launched (it has a cgroup), not one it adopted.
    pub fn launched(&self) -> bool {
        self.cgroup.is_some()
    }
}

/// A process known to belong to a task (for attributing events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    task: TaskId,
    /// A child of an adopted task: its start time, checked by reconcile.
    start_ticks: Option<u64>,
}

/// Every task the agent acts on, and which process is whose.
pub struct Members {
    tasks: BTreeMap<TaskId, TaskRuntime>,
    /// Processes of tasks, for attributing events (never for acting on them).
    pid_task: HashMap<u32, Member>,
    /// Processes never adopted: the agent, its fail-safe.
    excluded: HashSet<u32>,
}

impl Default for Members {
    fn default() -> Self {
        Self {
            tasks: BTreeMap::new(),
            pid_task: HashMap::new(),
            excluded: HashSet::from([std::process::id()]),
        }
    }
}

impl Members {
    /// Never adopt `pid` (the agent's fail-safe).
    pub fn exclude(&mut self, pid: u32) {
        self.excluded.insert(pid);
    }

    /// A new task, its root process its first member. `start_ticks`: an adopted
    /// root's start time.
    pub fn insert(&mut self, id: TaskId, task: TaskRuntime, start_ticks: Option<u64>) {
        self.pid_task.insert(
            task.pid,
            Member {
                task: id,
                start_ticks,
            },
        );
        self.tasks.insert(id, task);
    }

    pub fn get(&self, id: TaskId) -> Option<&TaskRuntime> {
        self.tasks.get(&id)
    }

    pub fn tasks(&self) -> impl Iterator<Item = (TaskId, &TaskRuntime)> {
        self.tasks.iter().map(|(&id, t)| (id, t))
    }

    /// Task `id`'s launch client is now on connection `conn` (it attached again).
    pub fn set_conn(&mut self, id: TaskId, conn: u64) {
        if let Some(t) = self.tasks.get_mut(&id) {
            t.conn = Some(conn);
        }
    }

    /// The task ended: it and its processes are forgotten.
    pub fn remove(&mut self, id: TaskId) -> Option<TaskRuntime> {
        self.pid_task.retain(|_, m| m.task != id);
        self.tasks.remove(&id)
    }

    /// The task a process belongs to, as far as the agent knows.
    pub fn task_of(&self, pid: u32) -> Option<TaskId> {
        self.pid_task.get(&pid).map(|m| m.task)
    }

    /// The processes known to belong to task `id`.
    pub fn pids_of(&self, id: TaskId) -> std::collections::BTreeSet<u32> {
        self.pid_task
            .iter()
            .filter(|(_, m)| m.task == id)
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Whether `pid` is a process of some task.
    pub fn is_member(&self, pid: u32) -> bool {
        self.pid_task.contains_key(&pid)
    }

    /// Whether activity of the task at `ts_ns` is news for the core: at most one
    /// `Active` per task per [`crate::defaults::ACTIVE_INTERVAL_NS`].
    pub fn note_active(&mut self, id: TaskId, ts_ns: u64) -> bool {
        let Some(t) = self.tasks.get_mut(&id) else {
            return false;
        };
        if ts_ns.saturating_sub(t.last_active_ns) < u64::from(crate::defaults::ACTIVE_INTERVAL_NS) {
            return false;
        }
        t.last_active_ns = ts_ns;
        true
    }

    /// A process of a task forked (the trace saw it). A launched task's members
    /// come from its cgroup anyway; an adopted one's child is remembered with its
    /// start time (and not at all when it is already gone).
    pub fn forked(&mut self, parent: u32, child: u32, host: &dyn Host) {
        let Some(&m) = self.pid_task.get(&parent) else {
            return;
        };
        let adopted = self.tasks.get(&m.task).is_some_and(|t| !t.launched());
        let start_ticks = if adopted {
            host.start_ticks(child)
        } else {
            None
        };
        if !adopted || start_ticks.is_some() {
            self.pid_task.insert(
                child,
                Member {
                    task: m.task,
                    start_ticks,
                },
            );
        }
    }

    /// The trace saw `pid`'s thread group end at `ts_ns` with `status`. When it
    /// is a task's root, what its end leads to is timed from then. Tasks Keling did
    /// not launch are not its children: their exit code comes from the kernel,
    /// their end from their pidfd; an adopted task whose pidfd says it is gone
    /// already is returned, to be ended now.
    pub fn root_exited(
        &mut self,
        pid: u32,
        ts_ns: u64,
        status: ExitStatus,
        host: &dyn Host,
    ) -> Option<TaskId> {
        let id = self.pid_task.get(&pid)?.task;
        let t = self.tasks.get_mut(&id).filter(|t| t.pid == pid)?;
        t.exited_ns = Some(ts_ns);
        if t.launched() {
            // Its end comes from its pidfd; the status from here unless it is
            // our child (reaped then).
            t.exit_seen = Some(status);
            return None;
        }
        if host.alive(id) {
            // Not quite gone: the pidfd will say so in a moment.
            t.exit_seen = Some(status);
            return None;
        }
        Some(id)
    }

    /// Checks which process belongs to which task against the truth: a launched
    /// task's members are what its cgroup holds (whatever the trace saw or lost); an
    /// adopted task's are its process, while its pidfd says it lives, and the
    /// children the trace saw, while their start time is the one recorded. Run
    /// every second and when the kernel reports lost events.
    pub fn reconcile(&mut self, host: &dyn Host) {
        let mut members: HashMap<u32, Member> = HashMap::new();
        for (&id, t) in &self.tasks {
            if t.launched() {
                for pid in host.members(id) {
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
                if host.alive(id) {
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
            if t.launched() {
                continue; // not in its cgroup any more
            }
            let still = if pid == t.pid {
                host.alive(m.task)
            } else {
                m.start_ticks
                    .is_some_and(|s| host.start_ticks(pid) == Some(s))
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

    /// A process Keling did not launch opened an NVIDIA device: it becomes task
    /// `id` (frozen and thawed with SIGSTOP/SIGCONT) when a config rule matches
    /// it, or when the defaults say to manage unmatched processes. Never the agent
    /// or its fail-safe; never a process that started after the event (the pid's
    /// owner changed). Returns its spec for the core and its owner.
    #[expect(
        clippy::too_many_arguments,
        reason = "the event (pid, device, time), the rules (config, default priority) and the host"
    )]
    pub fn adopt(
        &mut self,
        id: TaskId,
        pid: u32,
        device: DeviceFile,
        ts_ns: u64,
        config: &Config,
        default_priority: u8,
        host: &mut dyn Host,
    ) -> Option<(TaskSpec, u32)> {
        if self.excluded.contains(&pid) {
            return None;
        }
        let facts = host.facts(pid);
        let (settings, managed) = config.settings_for(&facts);
        if !managed {
            return None;
        }
        let adopted = host.adopt(id, pid, ts_ns)?;
        log::info!(
            "adopting pid {pid} ({}) as task {id} (rule {:?})",
            facts.comm,
            settings.rule
        );
        self.insert(
            id,
            TaskRuntime {
                pid,
                actuator: adopted.actuator,
                cgroup: None,
                uid: adopted.uid,
                our_child: false,
                conn: None,
                last_active_ns: 0,
                exit_seen: None,
                exited_ns: None,
                slurm: None,
            },
            Some(adopted.start_ticks),
        );
        let mut priority = settings.priority.unwrap_or(default_priority);
        if settings.owner_chosen {
            // A comm or exe is the owner's to choose: what it gives is capped as
            // a launch's rule priority is, by the owner's `[access]`.
            let owner = Credentials {
                uid: adopted.uid,
                gid: facts.gid.unwrap_or(adopted.uid),
                groups: facts.groups.clone(),
            };
            let floor = config.access_policy.limits(&owner).min_priority;
            if priority < floor {
                log::info!(
                    "pid {pid}: rule {:?} gives priority {priority}, above what uid {} may use: \
                     {floor} (match it by uid or cgroup to give more)",
                    settings.rule,
                    adopted.uid
                );
                priority = floor;
            }
        }
        let spec = TaskSpec {
            id,
            pid,
            name: super::task_name(&facts.comm),
            priority,
            gpu: settings.gpu.or(device.gpu()),
            mem_quota_bytes: settings.mem_quota_bytes,
            max_duration_ms: settings.max_duration_ms,
            grace_ms: settings.grace_ms,
            hard_kill: settings.hard_kill,
            expected_runtime_ms: None,
        };
        Some((spec, adopted.uid))
    }
}
