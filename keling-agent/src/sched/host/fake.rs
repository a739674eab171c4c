//! A host for the daemon's behaviour tests: no root, no cgroups, no processes.
//! It records what the daemon asks of it ([`Call`]s, submitted [`Actuation`]s)
//! and lets the test play the machine: confirm or leave unconfirmed what the
//! actuation thread would watch ([`FakeHost::confirm`], [`FakeHost::timed_out`]),
//! end tasks ([`FakeHost::exit`]). Its clock is tokio's, so a test under paused
//! time (`#[tokio::test(start_paused = true)]`) moves it with
//! `tokio::time::advance` and nothing else.
//!
//! Clones share one machine: the test keeps one and gives the daemon another.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use keling_sched::{ActionKind, TaskId};

use super::{Adopted, EnvGpu, Host, Launch, Started};
use crate::{
    event::decode::ExitStatus,
    latency::DecisionTimes,
    os::proc::ProcessFacts,
    sched::{
        actuator::{Actuator, Watch},
        worker::{Confirmation, Job},
    },
};

/// Where the fake clock starts: not 0, as no real clock is.
const CLOCK_START_NS: u64 = 1_000_000_000;
/// The first pid the fake host gives a launched task.
const FIRST_PID: u32 = 1000;

/// Something the daemon did to a task through the host, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// A launch was started (held before exec).
    Start {
        id: TaskId,
        pid: u32,
        env_gpu: EnvGpu,
    },
    /// A held task was let go to exec (`gpu`: written in at its release).
    Release {
        id: TaskId,
        gpu: Option<u32>,
    },
    /// A held task was killed before it ran.
    Cancel(TaskId),
    /// A process was taken on as a task.
    Adopt {
        id: TaskId,
        pid: u32,
    },
    /// An earlier agent's launched task was taken back.
    Readopt {
        id: TaskId,
        pid: u32,
    },
    /// Straight on its actuator, not through the actuation thread.
    SetFrozen {
        id: TaskId,
        frozen: bool,
    },
    Terminate(TaskId),
    Kill(TaskId),
    Signal {
        id: TaskId,
        signal: i32,
    },
    /// Frozen again after the fail-safe (a job without feedback).
    Refreeze(TaskId),
    /// The task ended and was cleaned up.
    Forget(TaskId),
    /// The stopped list was emptied.
    ForgetStopped,
}

/// An actuation job the daemon submitted, as the actuation thread would hold it.
#[derive(Clone, Debug)]
pub struct Actuation {
    pub id: TaskId,
    pub kind: ActionKind,
    pub times: DecisionTimes,
    pub timeout: Duration,
    /// When it was submitted (the fake clock).
    pub submitted_ns: u64,
    /// Its timeout was reported.
    timed_out: bool,
    /// Its effect was reported.
    confirmed: bool,
}

/// A process the test put on the machine, for adoption.
#[derive(Clone, Debug)]
pub struct Process {
    pub facts: ProcessFacts,
    pub uid: u32,
    pub start_ticks: u64,
    /// When it started (the fake clock).
    pub started_ns: u64,
}

#[derive(Clone, Debug, Default)]
struct Task {
    pid: u32,
    launched: bool,
    /// An earlier agent's launched task, taken back: not our child.
    readopted: bool,
    held: bool,
    /// Its end, once the test ended it.
    exit: Option<ExitStatus>,
    /// Launched tasks: the processes in its cgroup besides the root.
    children: Vec<u32>,
}

struct Machine {
    base: tokio::time::Instant,
    next_pid: u32,
    tasks: BTreeMap<TaskId, Task>,
    processes: BTreeMap<u32, Process>,
    actuations: Vec<Actuation>,
    calls: Vec<Call>,
    /// Launches fail with this error (a command that cannot start).
    failing_start: Option<String>,
}

/// The fake machine. See the module doc.
#[derive(Clone)]
pub struct FakeHost(Arc<Mutex<Machine>>);

impl Default for FakeHost {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Machine {
            base: tokio::time::Instant::now(),
            next_pid: FIRST_PID,
            tasks: BTreeMap::new(),
            processes: BTreeMap::new(),
            actuations: Vec::new(),
            calls: Vec::new(),
            failing_start: None,
        })))
    }
}

impl FakeHost {
    fn machine(&self) -> MutexGuard<'_, Machine> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything done to tasks so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.machine().calls.clone()
    }

    /// Every actuation submitted so far, in order.
    pub fn actuations(&self) -> Vec<Actuation> {
        self.machine().actuations.clone()
    }

    /// The actuations of `kind` submitted for `id`.
    pub fn submitted(&self, id: TaskId, kind: ActionKind) -> Vec<Actuation> {
        self.machine()
            .actuations
            .iter()
            .filter(|a| a.id == id && a.kind == kind)
            .cloned()
            .collect()
    }

    /// The pid the host gave task `id`.
    pub fn pid(&self, id: TaskId) -> u32 {
        self.machine().tasks[&id].pid
    }

    /// The next launches fail to start with `error`.
    pub fn fail_starts(&self, error: &str) {
        self.machine().failing_start = Some(error.to_owned());
    }

    /// The actuation thread saw the last `kind` submitted for `id` take effect,
    /// now: its confirmation (late when its timeout was reported already).
    pub fn confirm(&self, id: TaskId, kind: ActionKind) -> Confirmation {
        let now = self.now_ns();
        let mut m = self.machine();
        let a = m
            .actuations
            .iter_mut()
            .rev()
            .find(|a| a.id == id && a.kind == kind && !a.confirmed)
            .unwrap_or_else(|| panic!("no {kind:?} of task {id} to confirm"));
        a.confirmed = true;
        let mut times = a.times.clone();
        times.actuated_ns = a.submitted_ns;
        times.confirmed_ns = Some(now);
        Confirmation {
            id,
            action: kind,
            times,
            confirmed: true,
            late: a.timed_out,
        }
    }

    /// What the actuation thread reports now: every actuation whose timeout has
    /// passed unconfirmed (once each).
    pub fn timed_out(&self) -> Vec<Confirmation> {
        let now = self.now_ns();
        let mut m = self.machine();
        m.actuations
            .iter_mut()
            .filter(|a| !a.confirmed && !a.timed_out)
            .filter(|a| a.submitted_ns + a.timeout.as_nanos() as u64 <= now)
            .map(|a| {
                a.timed_out = true;
                let mut times = a.times.clone();
                times.actuated_ns = a.submitted_ns;
                Confirmation {
                    id: a.id,
                    action: a.kind,
                    times,
                    confirmed: false,
                    late: false,
                }
            })
            .collect()
    }

    /// Task `id`'s root process ends with `code`: what its pidfd would say (the
    /// wake to give the daemon).
    pub fn exit(&self, id: TaskId, code: i32) -> super::Wake {
        let mut m = self.machine();
        let t = m
            .tasks
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no task {id}"));
        t.exit = Some(ExitStatus::Exited(code));
        super::Wake::Exited(id)
    }

    /// A process that is no task of the daemon's, for it to adopt.
    pub fn add_process(&self, pid: u32, process: Process) {
        self.machine().processes.insert(pid, process);
    }

    /// A process in launched task `id`'s cgroup besides its root.
    pub fn add_child(&self, id: TaskId, pid: u32) {
        self.machine()
            .tasks
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no task {id}"))
            .children
            .push(pid);
    }

    fn actuator(&self, id: TaskId) -> Arc<dyn Actuator> {
        Arc::new(FakeActuator {
            id,
            host: self.clone(),
        })
    }

    fn call(&self, call: Call) {
        self.machine().calls.push(call);
    }
}

impl Host for FakeHost {
    fn now_ns(&self) -> u64 {
        let base = self.machine().base;
        CLOCK_START_NS + (tokio::time::Instant::now() - base).as_nanos() as u64
    }

    fn submit(&mut self, job: Job) {
        let now = self.now_ns();
        match job {
            Job::Actuate {
                id,
                kind,
                times,
                timeout,
                ..
            } => self.machine().actuations.push(Actuation {
                id,
                kind,
                times,
                timeout,
                submitted_ns: now,
                timed_out: false,
                confirmed: false,
            }),
            Job::Refreeze { actuator } => {
                // As the actuation thread does: a freeze without feedback. Only
                // the actuator knows its task; the call it records is renamed.
                let _ = actuator.set_frozen(true);
                let mut m = self.machine();
                if let Some(Call::SetFrozen { id, frozen: true }) = m.calls.last().cloned() {
                    *m.calls.last_mut().expect("just read") = Call::Refreeze(id);
                }
            }
        }
    }

    fn start(
        &mut self,
        id: TaskId,
        launch: &Launch<'_>,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started> {
        if let Some(e) = self.machine().failing_start.clone() {
            anyhow::bail!("{e}");
        }
        let pid = {
            let mut m = self.machine();
            let pid = m.next_pid;
            m.next_pid += 1;
            m.tasks.insert(
                id,
                Task {
                    pid,
                    launched: true,
                    held: true,
                    ..Task::default()
                },
            );
            pid
        };
        track(pid)?;
        self.call(Call::Start {
            id,
            pid,
            env_gpu: launch.env_gpu,
        });
        Ok(Started {
            pid,
            actuator: self.actuator(id),
            cgroup: format!("/fake/keling/task-{id}").into(),
        })
    }

    fn release(&mut self, id: TaskId, gpu: Option<u32>) -> anyhow::Result<()> {
        if let Some(t) = self.machine().tasks.get_mut(&id) {
            assert!(t.held, "task {id} released twice");
            t.held = false;
        }
        self.call(Call::Release { id, gpu });
        Ok(())
    }

    fn cancel(&mut self, id: TaskId) {
        if let Some(t) = self.machine().tasks.get_mut(&id) {
            t.held = false;
        }
        self.call(Call::Cancel(id));
    }

    fn facts(&self, pid: u32) -> ProcessFacts {
        self.machine()
            .processes
            .get(&pid)
            .map(|p| p.facts.clone())
            .unwrap_or_default()
    }

    fn attach(
        &mut self,
        _id: TaskId,
        pid: u32,
        _track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started> {
        anyhow::bail!("the fake host attaches nothing (pid {pid})")
    }

    fn adopt(&mut self, id: TaskId, pid: u32, seen_ns: u64) -> Option<Adopted> {
        let p = self.machine().processes.get(&pid).cloned()?;
        if p.started_ns > seen_ns {
            return None; // another process that has the pid now
        }
        self.machine().tasks.insert(
            id,
            Task {
                pid,
                ..Task::default()
            },
        );
        self.call(Call::Adopt { id, pid });
        Some(Adopted {
            start_ticks: p.start_ticks,
            uid: p.uid,
            actuator: self.actuator(id),
        })
    }

    fn readopt(
        &mut self,
        id: TaskId,
        pid: u32,
        start_ticks: u64,
        cgroup: &std::path::Path,
    ) -> anyhow::Result<Started> {
        let p = self.machine().processes.get(&pid).cloned();
        match p {
            Some(p) if p.start_ticks == start_ticks => {}
            _ => anyhow::bail!("pid {pid} is gone or another process"),
        }
        self.machine().tasks.insert(
            id,
            Task {
                pid,
                launched: true,
                readopted: true,
                ..Task::default()
            },
        );
        self.call(Call::Readopt { id, pid });
        Ok(Started {
            pid,
            actuator: self.actuator(id),
            cgroup: cgroup.to_owned(),
        })
    }

    fn start_ticks(&self, pid: u32) -> Option<u64> {
        self.machine().processes.get(&pid).map(|p| p.start_ticks)
    }

    fn alive(&self, id: TaskId) -> bool {
        self.machine()
            .tasks
            .get(&id)
            .is_some_and(|t| t.exit.is_none())
    }

    fn members(&self, id: TaskId) -> Vec<u32> {
        let m = self.machine();
        match m.tasks.get(&id) {
            Some(t) if t.launched && t.exit.is_none() => {
                let mut pids = vec![t.pid];
                pids.extend(&t.children);
                pids
            }
            Some(t) if t.launched => t.children.clone(),
            _ => Vec::new(),
        }
    }

    fn reap(&mut self, id: TaskId) -> ExitStatus {
        let m = self.machine();
        let t = &m.tasks[&id];
        assert!(
            t.launched && !t.readopted,
            "reaped task {id}, which is not our child"
        );
        t.exit
            .unwrap_or_else(|| panic!("reaped task {id}, which has not ended"))
    }

    fn forget(&mut self, id: TaskId) {
        self.machine().tasks.remove(&id);
        self.call(Call::Forget(id));
    }

    fn forget_stopped(&mut self) {
        self.call(Call::ForgetStopped);
    }
}

/// Records what is done to its task straight on it.
struct FakeActuator {
    id: TaskId,
    host: FakeHost,
}

impl Actuator for FakeActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        self.host.call(Call::SetFrozen {
            id: self.id,
            frozen,
        });
        Ok(())
    }

    fn stop(&self) -> anyhow::Result<()> {
        // Only the actuation thread stops, and the fake host runs no jobs.
        unreachable!("a stop goes through the actuation thread")
    }

    fn terminate(&self) {
        self.host.call(Call::Terminate(self.id));
    }

    fn kill(&self) -> anyhow::Result<()> {
        self.host.call(Call::Kill(self.id));
        Ok(())
    }

    fn signal(&self, signal: i32) -> usize {
        self.host.call(Call::Signal {
            id: self.id,
            signal,
        });
        1
    }

    fn watch(&self, _: ActionKind) -> Box<dyn Watch> {
        unreachable!("the fake host watches nothing: the test confirms")
    }
}
