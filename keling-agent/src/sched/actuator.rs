//! Actuators: how a scheduling decision reaches a task's processes, behind one
//! trait. Tasks Keling launched live in their own cgroup and are frozen through
//! `cgroup.freeze` ([`CgroupActuator`]); GPU processes it adopted are stopped and
//! continued with signals ([`SignalActuator`]), listed for the fail-safe first.
//!
//! Each call that changes a task returns once the request is made; the `wait_*`
//! calls block until the effect shows (or the timeout passes) and run on a
//! blocking thread, never on the event loop.
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::cgroup::{self, TaskCgroup};
use crate::os::proc;

pub trait Actuator: Send + Sync {
    /// Starts freezing (`true`) or thawing the task. A thaw also undoes a freeze
    /// that was escalated to SIGSTOP.
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()>;
    /// Blocks until the task is seen frozen (or thawed), at most `timeout`.
    fn wait_frozen(&self, frozen: bool, timeout: Duration) -> bool;
    /// SIGSTOP to every process of the task (escalation of a late freeze).
    fn stop(&self) -> anyhow::Result<()>;
    /// Blocks until every process of the task is stopped (or gone).
    fn wait_stopped(&self, timeout: Duration) -> bool;
    /// SIGTERM to the task.
    fn terminate(&self);
    /// Kills every process of the task.
    fn kill(&self) -> anyhow::Result<()>;
}

/// Polls `done` until it holds or `timeout` passes.
fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A task Keling launched, in its own cgroup.
pub struct CgroupActuator {
    pub cgroup: TaskCgroup,
}

impl Actuator for CgroupActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        let r = self.cgroup.set_frozen(frozen);
        if !frozen {
            // A freeze escalated to SIGSTOP is undone too.
            self.cgroup.signal(libc::SIGCONT);
        }
        r
    }

    fn wait_frozen(&self, frozen: bool, timeout: Duration) -> bool {
        self.cgroup.wait_frozen(frozen, timeout).unwrap_or(false)
    }

    fn stop(&self) -> anyhow::Result<()> {
        self.cgroup.signal(libc::SIGSTOP);
        Ok(())
    }

    fn wait_stopped(&self, timeout: Duration) -> bool {
        let pids = self.cgroup.pids();
        poll_until(timeout, || pids.iter().all(|&p| proc::stopped_or_gone(p)))
    }

    fn terminate(&self) {
        self.cgroup.signal(libc::SIGTERM);
    }

    fn kill(&self) -> anyhow::Result<()> {
        self.cgroup.kill()
    }
}

/// The processes Keling stopped with SIGSTOP, mirrored in a file the fail-safe
/// reads, so that whoever outlives the agent can continue them.
#[derive(Clone, Default)]
pub struct StoppedList(Arc<Mutex<BTreeSet<u32>>>);

impl StoppedList {
    fn update(&self, f: impl FnOnce(&mut BTreeSet<u32>)) {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut set);
        let pids: Vec<u32> = set.iter().copied().collect();
        if let Err(e) = cgroup::write_stopped(&pids) {
            log::warn!("cannot record stopped processes for the fail-safe: {e:#}");
        }
    }

    /// Continues every process on the list and empties it (the agent is stopping).
    pub fn continue_all(&self) {
        self.update(|set| {
            for &pid in set.iter() {
                // SAFETY: SIGCONT to a process Keling stopped.
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            }
            set.clear();
        });
    }
}

/// A GPU process Keling adopted (it did not launch it): SIGSTOP / SIGCONT.
pub struct SignalActuator {
    pub pid: u32,
    pub stopped: StoppedList,
}

impl SignalActuator {
    fn signal(&self, sig: i32) {
        // SAFETY: a signal to the task's own process, by pid.
        unsafe { libc::kill(self.pid as i32, sig) };
    }
}

impl Actuator for SignalActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        if frozen {
            // Listed before the stop, so the fail-safe can always undo it.
            self.stopped.update(|s| {
                s.insert(self.pid);
            });
            self.signal(libc::SIGSTOP);
        } else {
            self.signal(libc::SIGCONT);
            self.stopped.update(|s| {
                s.remove(&self.pid);
            });
        }
        Ok(())
    }

    fn wait_frozen(&self, frozen: bool, timeout: Duration) -> bool {
        if frozen {
            self.wait_stopped(timeout)
        } else {
            poll_until(timeout, || {
                proc::stat(self.pid).map_or(true, |s| !matches!(s.state, 'T' | 't'))
            })
        }
    }

    fn stop(&self) -> anyhow::Result<()> {
        self.set_frozen(true)
    }

    fn wait_stopped(&self, timeout: Duration) -> bool {
        poll_until(timeout, || proc::stopped_or_gone(self.pid))
    }

    fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    fn kill(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL);
        Ok(())
    }
}
