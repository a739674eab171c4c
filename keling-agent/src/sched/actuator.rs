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
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use keling_sched::ActionKind;

use super::{
    boost::{self, Booster},
    cgroup::{self, StoppedProcess, TaskCgroup},
};
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
    /// Starts freezing the task as `set_frozen(true)` does, first raising its
    /// threads so that they enter the freezer at once ([`super::boost`]), when this
    /// actuator does that. What it raised stays raised until [`Actuator::unboost`]
    /// or a thaw; on an error, nothing stays raised.
    fn freeze_boosted(&self) -> anyhow::Result<Boosted> {
        self.set_frozen(true).map(|()| Boosted::default())
    }
    /// Puts back whatever [`Actuator::freeze_boosted`] raised (nothing if nothing
    /// is raised).
    fn unboost(&self) {}
}

/// What [`Actuator::freeze_boosted`] raised before its write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Boosted {
    /// Threads raised to the real-time class.
    pub threads: usize,
    /// How long raising them took, ns.
    pub took_ns: u64,
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
    /// The freeze boost (`keling run --no-freeze-boost`: none). Held across a
    /// boost and its write, and across a thaw's restore and its write, so a thaw
    /// from another thread can never leave a raised thread running.
    boost: Option<Mutex<Booster>>,
}

impl CgroupActuator {
    /// With `boost`, freezes raise the task's threads first ([`super::boost`]),
    /// recorded under `boost::record_dir()`.
    pub fn new(cgroup: TaskCgroup, boost: bool) -> Self {
        Self::with_boost_records(cgroup, boost.then(boost::record_dir))
    }

    /// Freezes boosted, their records under `records`, when it is `Some`.
    pub fn with_boost_records(cgroup: TaskCgroup, records: Option<PathBuf>) -> Self {
        let boost = records.map(|dir| {
            let record = boost::record_path(&dir, &cgroup.dir);
            Mutex::new(Booster::new(&cgroup.dir, record))
        });
        Self {
            cgroup,
            escalated: AtomicBool::new(false),
            boost,
        }
    }

    fn booster(&self) -> Option<std::sync::MutexGuard<'_, Booster>> {
        self.boost
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Actuator for CgroupActuator {
    fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        // Put back before the thaw's write: no thread runs raised.
        let mut booster = if frozen { None } else { self.booster() };
        if let Some(b) = &mut booster {
            b.restore();
        }
        let r = self.cgroup.set_frozen(frozen);
        drop(booster);
        if !frozen && self.escalated.swap(false, Ordering::Relaxed) {
            self.cgroup.signal(libc::SIGCONT);
        }
        r
    }

    fn freeze_boosted(&self) -> anyhow::Result<Boosted> {
        let Some(mut booster) = self.booster() else {
            return self.set_frozen(true).map(|()| Boosted::default());
        };
        let t0 = crate::os::monotonic_ns();
        let threads = booster.boost();
        let took_ns = crate::os::monotonic_ns().saturating_sub(t0);
        let r = self.cgroup.set_frozen(true);
        if r.is_err() {
            booster.restore();
        }
        r.map(|()| Boosted { threads, took_ns })
    }

    fn unboost(&self) {
        if let Some(mut b) = self.booster() {
            b.restore();
        }
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
            ActionKind::Freeze | ActionKind::Thaw => Box::new(FreezerWatch::new(
                self.cgroup.events_file(),
                kind == ActionKind::Freeze,
            )),
            _ => Box::new(CgroupStopWatch {
                cgroup: self.cgroup.clone(),
            }),
        }
    }
}

/// `frozen 1` (or `frozen 0`) in `cgroup.events`, read through the fd that is
/// polled, as kernfs requires to re-arm the notification. A cgroup that is gone
/// (removed since, or before the watch began) holds nothing that runs: done. A
/// file that could not be opened for another reason (out of fds) is read by
/// its path at each look instead, never taken as an answer.
struct FreezerWatch {
    path: PathBuf,
    file: Option<fs::File>,
    frozen: bool,
    gone: bool,
}

impl FreezerWatch {
    fn new(path: PathBuf, frozen: bool) -> Self {
        let (file, gone) = match fs::File::open(&path) {
            Ok(f) => (Some(f), false),
            Err(e) => (None, cgroup_gone(&e)),
        };
        FreezerWatch {
            path,
            file,
            frozen,
            gone,
        }
    }
}

/// Whether a failed open or read of a cgroup file says the cgroup is gone:
/// its directory removed (`ENOENT`), or removed while the file was open
/// (kernfs answers `ENODEV`, and its poll reports an error at once, every
/// time: a watch that kept polling it would spin).
fn cgroup_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

impl Watch for FreezerWatch {
    fn done(&mut self) -> bool {
        if self.gone {
            return true;
        }
        let read = match &mut self.file {
            Some(f) => cgroup::read_events(f),
            None => fs::read_to_string(&self.path).map(|t| cgroup::parse_events(&t)),
        };
        match read {
            Ok(e) => e.frozen == self.frozen,
            Err(e) => {
                self.gone = cgroup_gone(&e);
                if self.gone {
                    // Nothing left to poll.
                    self.file = None;
                }
                self.gone
            }
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
    p.read_proc(proc::threads_stopped).unwrap_or(true)
}

/// The processes Keling stopped with SIGSTOP, mirrored in a file the fail-safe
/// reads, so that whoever outlives the agent can continue them.
#[derive(Clone, Default)]
pub struct StoppedList(Arc<Mutex<BTreeSet<StoppedProcess>>>);

impl StoppedList {
    /// Changes the list and writes it for the fail-safe; an error (logged
    /// too) when the file could not be written.
    fn update(&self, f: impl FnOnce(&mut BTreeSet<StoppedProcess>)) -> anyhow::Result<()> {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut set);
        let list: Vec<StoppedProcess> = set.iter().copied().collect();
        cgroup::write_stopped(&list).inspect_err(|e| {
            log::warn!("cannot record stopped processes for the fail-safe: {e:#}");
        })
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
            let _ = self.update(|s| s.retain(|p| p.pid != pid));
        }
    }

    /// Empties the list (its processes were continued: at stop, or by the
    /// fail-safe, which consumed the file).
    pub fn clear(&self) {
        let _ = self.update(BTreeSet::clear);
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
            // Listed before the stop, so the fail-safe can always undo it: a
            // process it could not be told of is not stopped (the freeze fails,
            // and says why).
            let entry = self.entry();
            self.stopped
                .update(|s| {
                    s.insert(entry);
                })
                .context("not stopped: the fail-safe could not be told of it")?;
            self.send(libc::SIGSTOP)
        } else {
            let r = self.send(libc::SIGCONT);
            let entry = self.entry();
            // Left on the file, it is continued again by the fail-safe (which
            // checks it is the same process): harmless.
            let _ = self.stopped.update(|s| {
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

/// The process's state in `/proc`, every thread's (read while its pidfd says
/// it is alive).
struct ProcessWatch {
    pidfd: Arc<Pidfd>,
    stopped: bool,
}

impl Watch for ProcessWatch {
    fn done(&mut self) -> bool {
        match self.pidfd.read_proc(proc::threads_stopped) {
            Some(stopped) => stopped == self.stopped,
            None => true, // gone: it neither runs nor needs continuing
        }
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::Path,
        process::{Child, Command},
    };

    use super::*;
    use crate::{
        os::sched_attr::{self, SCHED_BATCH, SCHED_FIFO, SCHED_IDLE, SCHED_OTHER, SchedAttr},
        sched::cgroup::{CgroupRoot, cgroup2_mount},
    };

    /// Processes and cgroups made by the test, undone on drop, failure or not.
    struct Setup {
        children: Vec<Child>,
        /// Cgroups, removed last in, first out.
        dirs: Vec<PathBuf>,
        /// A plain directory, removed with what is in it.
        temp: Option<PathBuf>,
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            if let Some(t) = &self.temp {
                let _ = fs::remove_dir_all(t);
            }
            for d in &self.dirs {
                let _ = fs::write(d.join("cgroup.freeze"), "0");
            }
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            for d in self.dirs.iter().rev() {
                for _ in 0..100 {
                    if fs::remove_dir(d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// As root, where cgroup v2 is mounted: the mount, and a fresh cgroup
    /// `keling-unit-NAME-PID` under it, removed with the returned [`Setup`]
    /// (whatever else it is given). `None` (after saying why) where the test
    /// cannot run; `also` is what else it needs root for.
    fn cgroup_of_a_test(name: &str, also: &str) -> Option<(PathBuf, PathBuf, Setup)> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: not root (needs a cgroup and {also})");
            return None;
        }
        let Ok(mount) = cgroup2_mount() else {
            eprintln!("skipping: no cgroup v2 hierarchy");
            return None;
        };
        let dir = mount.join(format!("keling-unit-{name}-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let setup = Setup {
            children: Vec::new(),
            dirs: vec![dir.clone()],
            temp: None,
        };
        Some((mount, dir, setup))
    }

    /// Every thread of the cgroup with its attributes, by thread id.
    fn snapshot(cg: &TaskCgroup) -> Vec<(u32, SchedAttr)> {
        let mut v: Vec<(u32, SchedAttr)> = fs::read_to_string(cg.dir.join("cgroup.threads"))
            .unwrap()
            .lines()
            .filter_map(|l| l.parse().ok())
            .map(|tid| (tid, sched_attr::get(tid).unwrap()))
            .collect();
        v.sort_by_key(|(tid, _)| *tid);
        v
    }

    fn spawn(setup: &mut Setup, args: &[&str], attr: SchedAttr) -> u32 {
        let child = Command::new(args[0]).args(&args[1..]).spawn().unwrap();
        let pid = child.id();
        setup.children.push(child);
        sched_attr::set(pid, &attr).unwrap();
        pid
    }

    fn frozen(a: &CgroupActuator, kind: ActionKind) -> bool {
        wait(a.watch(kind), Duration::from_secs(5))
    }

    /// As root, on a real cgroup: every freeze raises exactly the task's fair
    /// threads, and after it (confirmed and put back, thawed before it showed, or
    /// undone from the record as the fail-safe does) every thread is exactly as it
    /// was: class, nice, reset-on-fork, slice; a real-time thread is never
    /// touched. Where the kernel refuses the real-time class (a v1 cpu cgroup with
    /// no real-time runtime), the freeze goes on unboosted.
    #[test]
    fn a_boosted_freeze_puts_every_thread_back_as_it_was() {
        let Some((mount, base, mut setup)) = cgroup_of_a_test("boost", "the real-time class")
        else {
            return;
        };
        let root = CgroupRoot {
            mount,
            dir: base.clone(),
        };
        let cg = root.create_task("t").unwrap();
        setup.dirs.push(cg.dir.clone());
        let busy = ["sh", "-c", "while :; do :; done"];
        let sleep = ["sleep", "60"];
        let pids = [
            spawn(
                &mut setup,
                &busy,
                SchedAttr {
                    nice: 5,
                    ..SchedAttr::new(SCHED_OTHER)
                },
            ),
            spawn(
                &mut setup,
                &busy,
                SchedAttr {
                    runtime: 3_000_000, // a slice of its own
                    ..SchedAttr::new(SCHED_BATCH)
                },
            ),
            spawn(&mut setup, &sleep, SchedAttr::new(SCHED_IDLE)),
            spawn(
                &mut setup,
                &sleep,
                SchedAttr {
                    flags: sched_attr::SCHED_FLAG_RESET_ON_FORK,
                    nice: -2,
                    ..SchedAttr::new(SCHED_OTHER)
                },
            ),
            // Real-time already: left alone.
            spawn(
                &mut setup,
                &sleep,
                SchedAttr {
                    priority: 3,
                    ..SchedAttr::new(SCHED_FIFO)
                },
            ),
        ];
        for pid in pids {
            fs::write(cg.procs_file(), pid.to_string()).unwrap();
        }
        // As the actuation thread: learns the base slice while fair, then goes
        // above the threads it raises (the children are started, and would not
        // inherit it anyway).
        boost::learn_base_slice();
        crate::os::set_thread_realtime(50).unwrap();
        let before = snapshot(&cg);
        assert_eq!(before.len(), 5);
        let records =
            std::env::temp_dir().join(format!("keling-unit-boost-records-{}", std::process::id()));
        setup.temp = Some(records.clone());
        let record = boost::record_path(&records, &cg.dir);
        let act = CgroupActuator::with_boost_records(cg.clone(), Some(records.clone()));
        for _ in 0..10 {
            let b = act.freeze_boosted().unwrap();
            assert_eq!(b.threads, 4, "the fair threads, not the FIFO one");
            assert_eq!(boost::recorded(&record), 4);
            assert!(frozen(&act, ActionKind::Freeze));
            let during = snapshot(&cg);
            let raised = during
                .iter()
                .filter(|(_, a)| a.policy == SCHED_FIFO && a.priority == boost::PRIORITY)
                .count();
            assert_eq!(raised, 4, "{during:?}");
            act.unboost();
            assert_eq!(snapshot(&cg), before);
            assert_eq!(boost::recorded(&record), 0);
            act.set_frozen(false).unwrap();
            assert!(frozen(&act, ActionKind::Thaw));
        }
        // A thaw before the freeze showed: put back first.
        assert_eq!(act.freeze_boosted().unwrap().threads, 4);
        act.set_frozen(false).unwrap();
        assert_eq!(snapshot(&cg), before);
        assert!(frozen(&act, ActionKind::Thaw));
        // The agent gone mid-freeze: the record alone puts them back.
        assert_eq!(act.freeze_boosted().unwrap().threads, 4);
        assert!(frozen(&act, ActionKind::Freeze));
        assert_eq!(boost::undo_recorded(&record, |_| true), 4);
        assert_eq!(snapshot(&cg), before);
        act.unboost(); // finds nothing raised
        assert_eq!(snapshot(&cg), before);
        act.set_frozen(false).unwrap();
        assert!(frozen(&act, ActionKind::Thaw));
        // Through the actuation thread: when the core hears the freeze, every
        // thread is back already.
        let act: Arc<dyn Actuator> = Arc::new(act);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let worker = super::super::worker::Worker::start(50, tx).unwrap();
        for (kind, timeout_ms) in [(ActionKind::Freeze, 2000), (ActionKind::Thaw, 2000)] {
            let now = crate::os::monotonic_ns();
            worker.submit(super::super::worker::Job::Actuate {
                id: 1,
                kind,
                actuator: act.clone(),
                times: crate::latency::DecisionTimes {
                    action: format!("{kind:?}"),
                    event_ns: now,
                    received_ns: now,
                    decided_ns: now,
                    actuated_ns: now,
                    confirmed_ns: None,
                },
                timeout: Duration::from_millis(timeout_ms),
            });
            let c = rx.blocking_recv().unwrap();
            assert!(c.confirmed, "{kind:?}");
            assert_eq!(snapshot(&cg), before, "{kind:?}");
        }
        drop(worker);
        drop(act);
        refused_where_the_kernel_says_no(&mut setup, &cg, &pids, &records, &before);
    }

    /// A v1 cpu cgroup with no real-time runtime (RT_GROUP_SCHED) makes the raise
    /// fail with EPERM: no boost, the freeze as usual.
    fn refused_where_the_kernel_says_no(
        setup: &mut Setup,
        cg: &TaskCgroup,
        pids: &[u32],
        records: &Path,
        before: &[(u32, SchedAttr)],
    ) {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        if !v1.join("cpu.rt_runtime_us").exists() {
            eprintln!("no v1 cpu hierarchy with RT_GROUP_SCHED here: the refusal is not tested");
            return;
        }
        let group = v1.join(format!("keling-unit-boost-{}", std::process::id()));
        fs::create_dir(&group).unwrap();
        setup.dirs.push(group.clone());
        // Its real-time runtime is 0; the FIFO sleeper cannot go there (it stays).
        for &pid in &pids[..4] {
            fs::write(group.join("cgroup.procs"), pid.to_string()).unwrap();
        }
        let act = CgroupActuator::with_boost_records(cg.clone(), Some(records.to_path_buf()));
        assert_eq!(act.freeze_boosted().unwrap().threads, 0);
        assert!(frozen(&act, ActionKind::Freeze));
        assert_eq!(snapshot(cg), before);
        act.set_frozen(false).unwrap();
        assert!(frozen(&act, ActionKind::Thaw));
        assert_eq!(act.freeze_boosted().unwrap().threads, 0, "not tried again");
        act.set_frozen(false).unwrap();
        for &pid in &pids[..4] {
            let _ = fs::write(v1.join("cgroup.procs"), pid.to_string());
        }
    }

    /// As root, on a real cgroup: a freeze watch on a cgroup removed while it
    /// watches is done, with nothing left to poll (kernfs fails the read with
    /// ENODEV and reports an error on every poll: a watch that took that for
    /// "not yet" spun the actuation thread until its deadline); one on a
    /// cgroup already gone is done at once; one on a live, unfrozen cgroup is not.
    #[test]
    fn a_freeze_watch_on_a_cgroup_removed_meanwhile_is_done_and_polls_nothing() {
        let Some((_, dir, _setup)) = cgroup_of_a_test("watch", "nothing else") else {
            return;
        };
        let mut watch = FreezerWatch::new(dir.join("cgroup.events"), true);
        assert!(!watch.done(), "an empty cgroup that was never frozen");
        assert!(watch.fd().is_some());
        fs::remove_dir(&dir).unwrap();
        assert!(watch.done(), "removed: nothing in it runs");
        assert_eq!(watch.fd(), None, "nothing left to poll");
        let mut gone = FreezerWatch::new(dir.join("cgroup.events"), false);
        assert!(gone.done());
        assert_eq!(gone.fd(), None);
    }

    /// A process whose main thread has exited (`pthread_exit`: its leader
    /// shows `Z`) while another thread works is seen stopped by SIGSTOP and
    /// running again after SIGCONT: every thread counts, not the leader's
    /// state (which never showed `T`, so its freeze was never confirmed and
    /// it stayed stopped, holding its place).
    #[test]
    fn a_process_whose_main_thread_exited_is_seen_stopped_and_continued() {
        let script = "import ctypes, threading, time\n\
                      threading.Thread(target=time.sleep, args=(60,)).start()\n\
                      ctypes.CDLL(None).pthread_exit(None)\n";
        let Ok(child) = Command::new("python3").args(["-c", script]).spawn() else {
            eprintln!("skipping: no python3 to make a process whose main thread exits");
            return;
        };
        let setup = Setup {
            children: vec![child],
            dirs: Vec::new(),
            temp: None,
        };
        let pid = setup.children[0].id();
        let leader_gone = || {
            proc::stat(pid).is_ok_and(|s| s.state == 'Z') && proc::threads_stopped(pid).is_some()
        };
        let start = Instant::now();
        while !leader_gone() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the main thread never exited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let act = SignalActuator {
            pidfd: Arc::new(Pidfd::open(pid).unwrap()),
            start_ticks: proc::start_ticks(pid).unwrap(),
            stopped: StoppedList::default(),
        };
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        assert!(wait(act.watch(ActionKind::Freeze), Duration::from_secs(5)));
        assert_eq!(proc::threads_stopped(pid), Some(true));
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        assert!(wait(act.watch(ActionKind::Thaw), Duration::from_secs(5)));
        assert_eq!(proc::threads_stopped(pid), Some(false));
        drop(setup);
    }
}
