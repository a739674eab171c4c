//! The machine the daemon acts on, behind one trait, [`Host`]: the clock, the
//! actuation thread, launched tasks (their cgroup and the child held before
//! exec), adopted processes (their pidfd), and what `/proc` says about a
//! process. [`RealHost`] is the machine; the daemon's behaviour tests drive a
//! fake one (`host::fake`, in tests) with no root, no cgroups and tokio's
//! paused clock.
//!
//! A task's processes are named by the task's id, never by a pid the daemon
//! holds: the host keeps what identifies them (the pidfd opened at launch or
//! adoption, the cgroup), so nothing the daemon does can reach a process that
//! reused a pid. What comes back off the loop (a task's end, an exec's outcome)
//! comes as a [`Wake`]; confirmations of actuations come from the actuation
//! thread as [`Confirmation`]s.
use crate::os::spawn::StartError;
use std::{
    collections::HashMap,
    ffi::OsString,
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use keling_sched::TaskId;
use tokio::sync::mpsc;

use super::{
    actuator::{Actuator, CgroupActuator, SignalActuator, StoppedList},
    boost,
    cgroup::{CgroupRoot, TaskCgroup},
    worker::{Confirmation, Job, Worker},
};
use crate::{
    control::LaunchRequest,
    event::decode::ExitStatus,
    os::{
        monotonic_ns,
        pidfd::Pidfd,
        proc::{self, ProcessFacts},
        spawn::{Attributes, HeldChild, SpawnOptions, parse_env},
        users::Credentials,
    },
};

#[cfg(test)]
pub mod fake;

/// How long the cgroup of a launch that failed may take to empty (on the loop:
/// its one process was killed and reaped already).
const FAILED_LAUNCH_REMOVE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long the cgroup of a task that ended may take to empty after `cgroup.kill`.
const CGROUP_REMOVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment of a task whose client sent none.
const MINIMAL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Things that happen off the loop and come back to it.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// A task's pidfd says its process exited.
    Exited(TaskId),
    /// A launched command's exec succeeded, or which step failed.
    Exec(TaskId, Result<(), StartError>),
}

/// Where a launched task's `CUDA_VISIBLE_DEVICES` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvGpu {
    /// The GPU the launch chose (pinned, or placed at arrival), set at the fork;
    /// `None` leaves the client's value.
    Chosen(Option<u32>),
    /// Late binding: the GPU the core binds it to, written at its release.
    AtPlacement,
}

/// What to start for a launched task.
pub struct Launch<'a> {
    pub request: &'a LaunchRequest,
    /// Its stdin, stdout and stderr, passed by the client.
    pub stdio: &'a [OwnedFd],
    /// Whom it runs as: the client.
    pub creds: &'a Credentials,
    /// The client's process (`SO_PEERCRED`), whose resource limits, OOM score
    /// and umask the task takes; `None` where the kernel could not say (a
    /// client in another pid namespace).
    pub caller_pid: Option<u32>,
    pub env_gpu: EnvGpu,
}

/// A launched task, started and held before exec.
pub struct Started {
    pub pid: u32,
    /// Freezes, thaws and signals its cgroup.
    pub actuator: Arc<dyn Actuator>,
    /// Its cgroup's directory.
    pub cgroup: PathBuf,
}

/// A process taken on as a task.
pub struct Adopted {
    /// Its start time (`/proc/PID/stat`): its identity beside its pid.
    pub start_ticks: u64,
    /// Whose process it is.
    pub uid: u32,
    /// Stops and continues it with signals through its pidfd.
    pub actuator: Arc<dyn Actuator>,
}

/// What the daemon needs from the machine. Every call returns at once; what
/// takes time (an exec, an actuation's effect, a task's end) comes back later as
/// a [`Wake`] or a [`Confirmation`].
pub trait Host {
    /// Now on CLOCK_MONOTONIC (the trace's clock), ns.
    fn now_ns(&self) -> u64;

    /// Hands a freeze, thaw, stop or refreeze to the actuation thread; what it
    /// saw comes back as a [`Confirmation`].
    fn submit(&mut self, job: Job);

    /// Starts launched task `id`: a cgroup of its own, its command forked as its
    /// caller and held before exec, tracked by the probes (`track`), its end
    /// watched ([`Wake::Exited`]). A failed start leaves nothing behind.
    fn start(
        &mut self,
        id: TaskId,
        launch: &Launch<'_>,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started>;

    /// Takes `pid` on as task `id`: a Slurm job step's task, which asked for it
    /// itself and waits for the answer (so `pid` is that process). It is moved
    /// into a cgroup of its own, tracked by the probes (`track`), its end watched
    /// ([`Wake::Exited`]); it is not our child (never reaped here). A failure
    /// leaves it where it was.
    fn attach(
        &mut self,
        id: TaskId,
        pid: u32,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started>;

    /// Lets held task `id` exec, with `gpu` as its `CUDA_VISIBLE_DEVICES` when
    /// given (late binding). The outcome comes back as [`Wake::Exec`]; an error
    /// here means the child is gone (its end comes as [`Wake::Exited`]).
    fn release(&mut self, id: TaskId, gpu: Option<u32>) -> anyhow::Result<()>;

    /// Kills held task `id`, which never ran its command; its end comes back as
    /// [`Wake::Exited`].
    fn cancel(&mut self, id: TaskId);

    /// What `/proc` says of a process (what the config's rules match).
    fn facts(&self, pid: u32) -> ProcessFacts;

    /// Takes `pid` on as task `id` if it is the process that existed at
    /// `seen_ns` (the event's time; a process started since reused the pid), its
    /// end watched ([`Wake::Exited`]). `None`: it is gone or another one.
    fn adopt(&mut self, id: TaskId, pid: u32, seen_ns: u64) -> Option<Adopted>;

    /// Takes back launched task `id` of an earlier agent (its record said so):
    /// root process `pid`, started at `start_ticks`, in `cgroup` (a task cgroup
    /// directly under the instance's root), its end watched ([`Wake::Exited`]).
    /// Not this agent's child: its exit status comes from the trace. An error:
    /// the cgroup is not one of ours, or the process is gone, another one, or
    /// not in it.
    fn readopt(
        &mut self,
        id: TaskId,
        pid: u32,
        start_ticks: u64,
        cgroup: &std::path::Path,
    ) -> anyhow::Result<Started>;

    /// A process's start time (`/proc/PID/stat`), `None` once it is gone.
    fn start_ticks(&self, pid: u32) -> Option<u64>;

    /// Whether task `id`'s root process has not exited (its pidfd).
    fn alive(&self, id: TaskId) -> bool;

    /// The processes in launched task `id`'s cgroup now.
    fn members(&self, id: TaskId) -> Vec<u32>;

    /// Reaps launched task `id`'s root process (our child): its exit status.
    fn reap(&mut self, id: TaskId) -> ExitStatus;

    /// Task `id` ended: what is left of it goes (a launched task's cgroup,
    /// killed and removed off the loop; an adopted one's place on the stopped
    /// list).
    fn forget(&mut self, id: TaskId);

    /// Every process Keling stopped was continued (by the fail-safe, or at the
    /// agent's stop): the list the fail-safe reads is empty again.
    fn forget_stopped(&mut self);

    /// The agent stops: actuations already submitted are carried out and no
    /// more will be, so that nothing lands after the thaw of every task.
    fn stop_actuation(&mut self) {}
}

/// What the real host keeps per task.
struct Process {
    /// Opened at launch (our child) or adoption: the task's identity.
    pidfd: Arc<Pidfd>,
    /// Launched tasks: their cgroup.
    cgroup: Option<TaskCgroup>,
    /// A launched task's child until it is released to exec.
    held: Option<HeldChild>,
}

/// The machine: cgroups under `<cgroup2>/keling`, the actuation thread, pidfds,
/// `/proc`, and tokio tasks that watch for exits and exec outcomes.
pub struct RealHost {
    cgroups: CgroupRoot,
    worker: Worker,
    /// Freezes of launched tasks raise their threads first ([`super::boost`]).
    freeze_boost: bool,
    wakes: mpsc::UnboundedSender<Wake>,
    stopped: StoppedList,
    tasks: HashMap<TaskId, Process>,
}

impl RealHost {
    /// Opens Keling's cgroup subtree and starts the actuation thread (SCHED_FIFO
    /// at `actuator_rt_priority`; 0: the ordinary class). Confirmations come back
    /// on `confirmations`, other wake-ups on `wakes`. With `freeze_boost`, a
    /// launched task's freezes raise its threads first. Needs a tokio runtime.
    pub fn new(
        actuator_rt_priority: u8,
        freeze_boost: bool,
        confirmations: mpsc::UnboundedSender<Confirmation>,
        wakes: mpsc::UnboundedSender<Wake>,
    ) -> anyhow::Result<Self> {
        let worker = Worker::start(actuator_rt_priority, confirmations)?;
        if worker.realtime {
            log::info!(
                "actuation thread in the real-time class (SCHED_FIFO {actuator_rt_priority})"
            );
        }
        let freeze_boost =
            freeze_boost && worker.realtime && u32::from(actuator_rt_priority) > boost::PRIORITY;
        if !freeze_boost {
            log::info!(
                "freezes are not boosted (--no-freeze-boost, or the actuation thread is not \
                 real-time above SCHED_FIFO {}): a busy task's threads enter the freezer in \
                 their turn",
                boost::PRIORITY
            );
        }
        Ok(Self {
            cgroups: CgroupRoot::open()?,
            worker,
            freeze_boost,
            wakes,
            stopped: StoppedList::default(),
            tasks: HashMap::new(),
        })
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

    /// Takes on a task whose process (`pidfd`, `pid`) is in `cgroup`: its end
    /// watched, its freezes done through the cgroup. A launch's child is `held`
    /// until it is released to exec; one attached or taken back is not.
    fn take_in_cgroup(
        &mut self,
        id: TaskId,
        pid: u32,
        pidfd: Pidfd,
        cgroup: TaskCgroup,
        held: Option<HeldChild>,
    ) -> Started {
        let pidfd = Arc::new(pidfd);
        self.watch_exit(id, &pidfd);
        let started = Started {
            pid,
            actuator: Arc::new(CgroupActuator::new(cgroup.clone(), self.freeze_boost)),
            cgroup: cgroup.dir.clone(),
        };
        self.tasks.insert(
            id,
            Process {
                pidfd,
                cgroup: Some(cgroup),
                held,
            },
        );
        started
    }
}

impl Drop for RealHost {
    fn drop(&mut self) {
        self.cgroups.remove_if_empty();
    }
}

impl Host for RealHost {
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn submit(&mut self, job: Job) {
        self.worker.submit(job);
    }

    fn start(
        &mut self,
        id: TaskId,
        launch: &Launch<'_>,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started> {
        // Unique across agents: a test or a restart may run several in turn.
        let cgroup = self
            .cgroups
            .create_task(&format!("task-{}-{id}", std::process::id()))?;
        let (pidfd, child) = match start_held(launch, &cgroup, track) {
            Ok(s) => s,
            Err(e) => {
                // A failed launch leaves no cgroup behind: its held child was
                // killed and reaped; anything else in it goes too.
                if let Err(rm) = cgroup.kill_and_remove(FAILED_LAUNCH_REMOVE_TIMEOUT) {
                    log::warn!("task {id}: the failed launch's cgroup stays: {rm:#}");
                }
                return Err(e);
            }
        };
        let pid = pidfd.pid();
        Ok(self.take_in_cgroup(id, pid, pidfd, cgroup, Some(child)))
    }

    fn attach(
        &mut self,
        id: TaskId,
        pid: u32,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> anyhow::Result<Started> {
        use anyhow::Context;
        let pidfd = Pidfd::open(pid).with_context(|| format!("pid {pid} is gone"))?;
        let before = ProcessFacts::of_pid(pid).cgroup;
        let cgroup = self
            .cgroups
            .create_task(&format!("slurm-{}-{id}", std::process::id()))?;
        let moved = std::fs::write(cgroup.procs_file(), pid.to_string())
            .with_context(|| format!("move pid {pid} into {}", cgroup.dir.display()))
            .and_then(|()| track(pid));
        if let Err(e) = moved {
            // Back where it was (Slurm's own cgroup, if any), then the cgroup goes.
            if let (Some(rel), Ok(mount)) = (before, super::cgroup::cgroup2_mount()) {
                let back = mount.join(rel.trim_start_matches('/')).join("cgroup.procs");
                let _ = std::fs::write(back, pid.to_string());
            }
            if let Err(rm) = cgroup.remove() {
                log::warn!("task {id}: the failed attach's cgroup stays: {rm:#}");
            }
            return Err(e);
        }
        Ok(self.take_in_cgroup(id, pid, pidfd, cgroup, None))
    }

    fn release(&mut self, id: TaskId, gpu: Option<u32>) -> anyhow::Result<()> {
        let Some(child) = self.tasks.get_mut(&id).and_then(|p| p.held.take()) else {
            return Ok(()); // released already
        };
        let pending = child.release_on(gpu)?;
        let wakes = self.wakes.clone();
        tokio::spawn(async move {
            let outcome = pending.outcome().await;
            let _ = wakes.send(Wake::Exec(id, outcome));
        });
        Ok(())
    }

    fn cancel(&mut self, id: TaskId) {
        if let Some(child) = self.tasks.get_mut(&id).and_then(|p| p.held.take()) {
            // Killed unreaped: its pidfd reports the end, which ends the task.
            child.cancel();
        }
    }

    fn facts(&self, pid: u32) -> ProcessFacts {
        ProcessFacts::of_pid(pid)
    }

    fn adopt(&mut self, id: TaskId, pid: u32, seen_ns: u64) -> Option<Adopted> {
        let pidfd = match Pidfd::open_started_by(pid, seen_ns) {
            Ok(p) => p,
            Err(e) => {
                log::debug!(
                    "not adopting pid {pid}: {e} (gone, or not the process that opened the device)"
                );
                return None;
            }
        };
        let (start_ticks, uid) =
            pidfd.read_proc(|pid| Some((proc::start_ticks(pid)?, proc::uid(pid)?)))?;
        let pidfd = Arc::new(pidfd);
        self.watch_exit(id, &pidfd);
        let actuator = Arc::new(SignalActuator {
            pidfd: pidfd.clone(),
            start_ticks,
            stopped: self.stopped.clone(),
        });
        self.tasks.insert(
            id,
            Process {
                pidfd,
                cgroup: None,
                held: None,
            },
        );
        Some(Adopted {
            start_ticks,
            uid,
            actuator,
        })
    }

    fn readopt(
        &mut self,
        id: TaskId,
        pid: u32,
        start_ticks: u64,
        cgroup: &std::path::Path,
    ) -> anyhow::Result<Started> {
        let cg = self.cgroups.existing_task(cgroup)?;
        let pidfd = Pidfd::open(pid).map_err(|e| anyhow::anyhow!("pid {pid}: {e}"))?;
        // Checked after the open: the process held is the one recorded, in its cgroup.
        pidfd
            .read_proc(|p| (proc::start_ticks(p) == Some(start_ticks) && cg.holds(p)).then_some(()))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "pid {pid} is gone, another process, or no longer in {}",
                    cg.dir.display()
                )
            })?;
        Ok(self.take_in_cgroup(id, pid, pidfd, cg, None))
    }

    fn start_ticks(&self, pid: u32) -> Option<u64> {
        proc::start_ticks(pid)
    }

    fn alive(&self, id: TaskId) -> bool {
        self.tasks.get(&id).is_some_and(|p| p.pidfd.is_alive())
    }

    fn members(&self, id: TaskId) -> Vec<u32> {
        self.tasks
            .get(&id)
            .and_then(|p| p.cgroup.as_ref())
            .map(TaskCgroup::pids)
            .unwrap_or_default()
    }

    fn reap(&mut self, id: TaskId) -> ExitStatus {
        let Some(p) = self.tasks.get(&id) else {
            return ExitStatus::Exited(-1);
        };
        match p.pidfd.try_wait() {
            Ok(Some(s)) => ExitStatus::from_wait_status(s),
            _ => match p.pidfd.wait_blocking() {
                Ok(s) => ExitStatus::from_wait_status(s),
                Err(e) => {
                    log::warn!("task {id}: cannot reap pid {}: {e}", p.pidfd.pid());
                    ExitStatus::Exited(-1)
                }
            },
        }
    }

    fn forget(&mut self, id: TaskId) {
        let Some(p) = self.tasks.remove(&id) else {
            return;
        };
        // Ended while held (its pid was killed): reaped by its pidfd, nothing
        // is left to kill (its pid may be someone else's now).
        if let Some(child) = p.held {
            child.reaped();
        }
        match p.cgroup {
            Some(cg) => {
                // Whatever the task left behind goes with it; the wait for the
                // cgroup to empty runs off the loop.
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = cg.kill_and_remove(CGROUP_REMOVE_TIMEOUT) {
                        log::warn!("task {id}: {e:#}");
                    }
                });
            }
            None => self.stopped.forget(p.pidfd.pid()),
        }
    }

    fn forget_stopped(&mut self) {
        self.stopped.clear();
    }

    fn stop_actuation(&mut self) {
        self.worker.stop();
    }
}

/// Forks the task's process as its caller, tracks it, and holds it before exec.
fn start_held(
    launch: &Launch<'_>,
    cgroup: &TaskCgroup,
    track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
) -> anyhow::Result<(Pidfd, HeldChild)> {
    use anyhow::Context;
    let (req, stdio) = (launch.request, launch.stdio);
    // Never the agent's own (root's terminal, or the service's journal
    // stream): the caller's three, or /dev/null for a client that passed none.
    let null;
    let fds = match stdio {
        [stdin, stdout, stderr] => [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
        [] => {
            null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .context("open /dev/null for a launch that passed no stdio")?;
            [null.as_raw_fd(); 3]
        }
        _ => anyhow::bail!(
            "a launch passes the caller's stdin, stdout and stderr (3 file descriptors, \
             SCM_RIGHTS, as `keling launch` does) or none (/dev/null); this one passed {}",
            stdio.len()
        ),
    };
    let fds = Some(fds);
    // As if the caller had started it: its limits, not the agent's raised ones.
    let caller = launch.caller_pid.context(
        "the kernel did not say which process sent the launch (a client in another pid \
         namespace?); a task takes its resource limits from it: run `keling launch` on the host",
    )?;
    let attributes = Attributes::of_process(caller, launch.creds.uid).with_context(|| {
        format!("cannot read the resource limits of the process that asked (pid {caller})")
    })?;
    let argv: Vec<OsString> = req.argv.iter().map(OsString::from).collect();
    let mut env = match &req.env {
        Some(entries) => parse_env(entries),
        None => vec![(OsString::from("PATH"), OsString::from(MINIMAL_PATH))],
    };
    if let EnvGpu::Chosen(Some(g)) = launch.env_gpu {
        env.retain(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
        env.push((
            OsString::from("CUDA_VISIBLE_DEVICES"),
            OsString::from(g.to_string()),
        ));
    }
    let opts = SpawnOptions {
        gpu_at_release: launch.env_gpu == EnvGpu::AtPlacement,
        env,
        clear_env: true,
        stdio: fds,
        cgroup_procs: Some(cgroup.procs_file()),
        cwd: Some(req.cwd.clone()),
        credentials: Some(launch.creds.clone()),
        new_session: true,
        attributes: Some(attributes),
    };
    let held = HeldChild::spawn_with(&argv, &opts)?;
    // Our child, not yet reaped: its pid is certainly its own.
    let pidfd = Pidfd::open(held.pid())?;
    track(held.pid())?;
    Ok((pidfd, held))
}
