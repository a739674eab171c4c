//! Actuators: how a scheduling decision reaches a task's processes, behind one
//! trait. Tasks Keling launched live in their own cgroup and are frozen through
//! `cgroup.freeze` ([`CgroupActuator`]); GPU processes it adopted are stopped and
//! continued with signals through the pidfd opened at adoption
//! ([`SignalActuator`]), listed for the fail-safe first.
//!
//! Each call that changes a task returns once the request is made; whether it took
//! effect is a [`Watch`], which the actuation thread ([`super::worker`]) polls
//! without blocking, woken by the fd it offers (POLLPRI on `cgroup.events`) or by
//! time. Nothing here ever signals a process by a bare pid.
use std::{
    collections::BTreeSet,
    fs,
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use keling_sched::ActionKind;

use super::cgroup::{self, StoppedProcess, TaskCgroup};
use crate::os::{pidfd::Pidfd, proc};

pub trait Actuator: Send + Sync {
    /// Starts freezing (`true`) or thawing the task. A thaw also undoes a freeze
    /// that was escalated to SIGSTOP.
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()>;
    /// SIGSTOP to every process of the task (escalation of a late freeze).
    fn stop(&self) -> anyhow::Result<()>;
    /// SIGTERM to the task.
    fn terminate(&self);
    /// Kills every process of the task.
    fn kill(&self) -> anyhow::Result<()>;
    /// Sends `signal` to the task's processes (forwarded from its owner); returns
    /// how many it reached.
    fn signal(&self, signal: i32) -> usize;
    /// Starts watching for `kind` (freeze, thaw or stop) to take effect.
    fn watch(&self, kind: ActionKind) -> Box<dyn Watch>;
}

/// Whether an actuation has taken effect, asked without blocking.
pub trait Watch: Send {
    /// Whether the effect shows now.
    fn done(&mut self) -> bool;
    /// An fd that polls POLLPRI when [`Watch::done`] may have changed; `None`:
    /// ask again after a short while.
    fn fd(&self) -> Option<RawFd>;
}

/// Blocks until `watch` is done or `timeout` passes (for callers that may block).
pub fn wait(mut watch: Box<dyn Watch>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if watch.done() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match watch.fd() {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLPRI,
                    revents: 0,
                };
                let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
            None => std::thread::sleep(left.min(Duration::from_micros(200))),
        }
    }
}

/// A task Keling launched, in its own cgroup.
pub struct CgroupActuator {
    pub cgroup: TaskCgroup,
    /// Whether a freeze was escalated to SIGSTOP since the last thaw: only then
    /// does a thaw sweep the cgroup with SIGCONT (it costs a read of `cgroup.procs`
    /// and a pidfd per process, on the path every thaw takes).
    escalated: AtomicBool,
}

impl CgroupActuator {
    pub fn new(cgroup: TaskCgroup) -> Self {
        Self {
            cgroup,
            escalated: AtomicBool::new(false),
        }
    }
}

impl Actuator for CgroupActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        let r = self.cgroup.set_frozen(frozen);
        if !frozen && self.escalated.swap(false, Ordering::Relaxed) {
            self.cgroup.signal(libc::SIGCONT);
        }
        r
    }

    fn stop(&self) -> anyhow::Result<()> {
        // Marked first: a thaw racing this stop must continue what it stops.
        self.escalated.store(true, Ordering::Relaxed);
        self.cgroup.signal(libc::SIGSTOP);
        Ok(())
    }

    fn terminate(&self) {
        self.cgroup.signal(libc::SIGTERM);
    }

    fn kill(&self) -> anyhow::Result<()> {
        self.cgroup.kill()
    }

    fn signal(&self, signal: i32) -> usize {
        self.cgroup.signal(signal)
    }

    fn watch(&self, kind: ActionKind) -> Box<dyn Watch> {
        match kind {
            ActionKind::Freeze | ActionKind::Thaw => Box::new(FreezerWatch {
                file: fs::File::open(self.cgroup.events_file()).ok(),
                frozen: kind == ActionKind::Freeze,
            }),
            _ => Box::new(CgroupStopWatch {
                cgroup: self.cgroup.clone(),
            }),
        }
    }
}

/// `frozen 1` (or `frozen 0`) in `cgroup.events`, read through the fd that is
/// polled, as kernfs requires to re-arm the notification.
struct FreezerWatch {
    file: Option<fs::File>,
    frozen: bool,
}

impl Watch for FreezerWatch {
    fn done(&mut self) -> bool {
        match &mut self.file {
            // A cgroup that is gone holds nothing that runs.
            None => true,
            Some(f) => cgroup::read_events(f).is_ok_and(|e| e.frozen == self.frozen),
        }
    }

    fn fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }
}

/// Every process of the cgroup is stopped (or gone).
struct CgroupStopWatch {
    cgroup: TaskCgroup,
}

impl Watch for CgroupStopWatch {
    fn done(&mut self) -> bool {
        self.cgroup.members().iter().all(stopped_or_gone)
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }
}

fn stopped_or_gone(p: &Pidfd) -> bool {
    p.read_proc(|pid| proc::stat(pid).ok().map(|s| matches!(s.state, 'T' | 't')))
        .unwrap_or(true)
}

/// The processes Keling stopped with SIGSTOP, mirrored in a file the fail-safe
/// reads, so that whoever outlives the agent can continue them.
#[derive(Clone, Default)]
pub struct StoppedList(Arc<Mutex<BTreeSet<StoppedProcess>>>);

impl StoppedList {
    fn update(&self, f: impl FnOnce(&mut BTreeSet<StoppedProcess>)) {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut set);
        let list: Vec<StoppedProcess> = set.iter().copied().collect();
        if let Err(e) = cgroup::write_stopped(&list) {
            log::warn!("cannot record stopped processes for the fail-safe: {e:#}");
        }
    }

    /// Takes a process that is gone off the list.
    pub fn forget(&self, pid: u32) {
        let listed = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|p| p.pid == pid);
        if listed {
            self.update(|s| s.retain(|p| p.pid != pid));
        }
    }

    /// Empties the list (its processes were continued: at stop, or by the
    /// fail-safe, which consumed the file).
    pub fn clear(&self) {
        self.update(BTreeSet::clear);
    }
}

/// A GPU process Keling adopted (it did not launch it): SIGSTOP / SIGCONT through
/// the pidfd opened when it was adopted.
pub struct SignalActuator {
    pub pidfd: Arc<Pidfd>,
    /// Its start time: its identity on the stopped list.
    pub start_ticks: u64,
    pub stopped: StoppedList,
}

impl SignalActuator {
    fn entry(&self) -> StoppedProcess {
        StoppedProcess {
            pid: self.pidfd.pid(),
            start_ticks: self.start_ticks,
        }
    }

    fn send(&self, signal: i32) -> anyhow::Result<()> {
        match self.pidfd.signal(signal) {
            // Gone: nothing to do; its end reaches the daemon through the pidfd.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            r => Ok(r?),
        }
    }
}

impl Actuator for SignalActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        if frozen {
            // Listed before the stop, so the fail-safe can always undo it.
            let entry = self.entry();
            self.stopped.update(|s| {
                s.insert(entry);
            });
            self.send(libc::SIGSTOP)
        } else {
            let r = self.send(libc::SIGCONT);
            let entry = self.entry();
            self.stopped.update(|s| {
                s.remove(&entry);
            });
            r
        }
    }

    fn stop(&self) -> anyhow::Result<()> {
        self.set_frozen(true)
    }

    fn terminate(&self) {
        let _ = self.send(libc::SIGTERM);
    }

    fn kill(&self) -> anyhow::Result<()> {
        self.send(libc::SIGKILL)
    }

    fn signal(&self, signal: i32) -> usize {
        usize::from(self.pidfd.signal(signal).is_ok())
    }

    fn watch(&self, kind: ActionKind) -> Box<dyn Watch> {
        Box::new(ProcessWatch {
            pidfd: self.pidfd.clone(),
            stopped: kind != ActionKind::Thaw,
        })
    }
}

/// The process's state in `/proc` (read while its pidfd says it is alive).
struct ProcessWatch {
    pidfd: Arc<Pidfd>,
    stopped: bool,
}

impl Watch for ProcessWatch {
    fn done(&mut self) -> bool {
        match self
            .pidfd
            .read_proc(|pid| proc::stat(pid).ok().map(|s| matches!(s.state, 'T' | 't')))
        {
            Some(stopped) => stopped == self.stopped,
            None => true, // gone: it neither runs nor needs continuing
        }
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }
}
