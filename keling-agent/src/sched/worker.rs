//! The actuation thread: carries out freezes, thaws and stops, and watches for
//! them to take effect, off the event loop and, when it may, in the real-time
//! class (SCHED_FIFO).
//!
//! Why a thread of its own at real-time priority: a thaw wakes every thread of the
//! task, and the writer of `cgroup.freeze` competes with them inside the write.
//! Measured here (16 busy threads, 2 vCPUs, a bare write of `0`): 37 ms p50 from an
//! ordinary thread, 0.23 ms from a SCHED_FIFO one. The event loop hands a job over
//! a channel and an eventfd; the thread writes, stamps `actuated_ns`, and then
//! waits for all watches in flight at once in one `poll` (POLLPRI on each
//! `cgroup.events`; a short period for process states), stamping `confirmed_ns`
//! the moment each shows. Results go back to the loop as [`Confirmation`]s, whose
//! timestamps were taken here: the loop's own delay in reading them is not part of
//! the decision's latency, since the task was already frozen or running.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Context;
use keling_common::lines::SlowActuation;
use keling_sched::{ActionKind, TaskId};
use tokio::sync::mpsc::UnboundedSender;

use super::actuator::{Actuator, Boosted, Watch};
use crate::{
    latency::DecisionTimes,
    os::{monotonic_ns, thread_cpu_ns},
};

/// How often watches without an fd (process states) are asked again.
const STATE_POLL: Duration = Duration::from_micros(500);
/// After its timeout, an actuation is still watched this long: when it takes
/// effect late, the core hears it (a stop or freeze that lands late is what ends
/// an escalation; nothing else would).
const LATE_WATCH: Duration = Duration::from_secs(60);

/// A confirmation (or its absence) coming back from the actuation thread.
pub struct Confirmation {
    pub id: TaskId,
    pub action: ActionKind,
    pub times: DecisionTimes,
    pub confirmed: bool,
    /// The effect showed after the timeout, which was already reported (so this
    /// decision's latency is already recorded).
    pub late: bool,
}

/// Work for the actuation thread.
pub enum Job {
    /// Freeze, thaw or stop a task, then watch for it within `timeout`.
    Actuate {
        id: TaskId,
        kind: ActionKind,
        actuator: Arc<dyn Actuator>,
        times: DecisionTimes,
        timeout: Duration,
    },
    /// Freeze again, without feedback: the fail-safe thawed everything while the
    /// agent was stalled, and the core still holds the task frozen.
    Refreeze { actuator: Arc<dyn Actuator> },
}

/// The handle the daemon keeps; dropping it stops the thread.
pub struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    /// The thread's id, and the CPU it is kept on: the one the event loop last
    /// handed a job over from (-1: none yet). See [`Worker::submit`].
    tid: libc::pid_t,
    cpu: AtomicI32,
    /// Whether the thread runs in the real-time class.
    pub realtime: bool,
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Worker {
    /// Starts the thread, in SCHED_FIFO at `rt_priority` (0: the ordinary class).
    /// A refusal of the real-time class is logged and the thread runs anyway.
    pub fn start(
        rt_priority: u8,
        confirmations: UnboundedSender<Confirmation>,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(eventfd().context("eventfd for the actuation thread")?);
        let (rt_tx, rt_rx) = mpsc::channel();
        let thread_wake = wake.clone();
        let thread = std::thread::Builder::new()
            .name("keling-actuate".into())
            .spawn(move || {
                // While this thread is still in the fair class: what a thread
                // the freeze boost raised gets back as its slice.
                super::boost::learn_base_slice();
                let realtime = rt_priority > 0
                    && match crate::os::set_thread_realtime(rt_priority) {
                        Ok(()) => true,
                        Err(e) => {
                            log::warn!(
                                "actuation thread: SCHED_FIFO {rt_priority} refused ({e}); \
                                 running in the ordinary class (thaws will be slower under load)"
                            );
                            false
                        }
                    };
                // SAFETY: gettid has no preconditions.
                let _ = rt_tx.send((realtime, unsafe { libc::gettid() }));
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(&rx, thread_wake.as_raw_fd(), &confirmations);
                }));
                if ran.is_err() {
                    // Without this thread every freeze and thaw is dropped
                    // while the loop's heartbeats go on: end the agent, so
                    // that the fail-safe thaws and continues every task.
                    log::error!(
                        "the actuation thread panicked: stopping the agent; the fail-safe \
                         thaws and continues every task"
                    );
                    std::process::abort();
                }
            })
            .context("start the actuation thread")?;
        let (realtime, tid) = rt_rx.recv().unwrap_or((false, 0));
        Ok(Self {
            jobs: Some(tx),
            wake,
            thread: Some(thread),
            realtime,
            tid,
            cpu: AtomicI32::new(-1),
        })
    }

    /// Hands a job to the thread (never blocks).
    ///
    /// The thread is first moved to the CPU this runs on, when it is not there
    /// already: it then wakes here, ahead of the caller (a higher real-time
    /// priority), instead of on the CPU it last ran on. On an idle host that CPU
    /// is asleep, and in a VM waking it takes a hypervisor round trip: on an
    /// idle host the hand-over was the larger part of 25 of 68 actuations over
    /// 2 ms, 2 of 10 with the move (`KELING_BENCH_ONLY=decision cargo xtask
    /// bench`, 1100 cycles; thaw p99 5.71 -> 1.92 ms). Moving a sleeping
    /// thread costs one syscall, and only when the caller changed CPU; the CPU is
    /// the caller's own, so it is in the agent's cpuset. Where the move is
    /// refused the thread stays where it was.
    pub fn submit(&self, job: Job) {
        if let Some(tx) = &self.jobs
            && tx.send(job).is_ok()
        {
            self.follow_caller_cpu();
            self.kick();
        }
    }

    fn follow_caller_cpu(&self) {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu < 0 || self.tid <= 0 || self.cpu.load(Ordering::Relaxed) == cpu {
            return;
        }
        if cpu as usize >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return;
        }
        // SAFETY: a zeroed cpu_set_t is an empty set; the CPU is within it
        // (checked above).
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            set
        };
        // SAFETY: our own thread's id; a valid set of its size.
        let r = unsafe {
            libc::sched_setaffinity(self.tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if r == 0 {
            self.cpu.store(cpu, Ordering::Relaxed);
        }
    }

    fn kick(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

impl Worker {
    /// Carries out the jobs already submitted, then ends the thread (jobs
    /// submitted after are dropped). At the agent's stop this comes before
    /// the thaw of every task: a freeze still queued would land after it.
    pub fn stop(&mut self) {
        drop(self.jobs.take());
        self.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One actuation being watched.
struct InFlight {
    id: TaskId,
    kind: ActionKind,
    watch: Box<dyn Watch>,
    times: DecisionTimes,
    deadline: Instant,
    /// Its timeout passed and was reported; now watched until [`LATE_WATCH`].
    timed_out: bool,
    /// A freeze that raised the task's threads: put back when it shows, at its
    /// timeout, or when this is dropped (the thread ends).
    boosted: Option<Arc<dyn Actuator>>,
}

impl InFlight {
    fn unboost(&mut self) {
        if let Some(a) = self.boosted.take() {
            a.unboost();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.unboost();
    }
}

fn run(jobs: &mpsc::Receiver<Job>, wake: RawFd, out: &UnboundedSender<Confirmation>) {
    let mut in_flight: Vec<InFlight> = Vec::new();
    loop {
        loop {
            match jobs.try_recv() {
                Ok(job) => {
                    if let Some(f) = carry_out(job) {
                        in_flight.push(f);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let now = Instant::now();
        in_flight.retain_mut(|f| {
            let confirmed = f.watch.done();
            if !confirmed && now < f.deadline {
                return true;
            }
            if !confirmed && f.timed_out {
                return false; // given up
            }
            let mut times = f.times.clone();
            if confirmed {
                times.confirmed_ns = Some(monotonic_ns());
            }
            // Frozen, or late: either way its threads go back as they were now,
            // before the core hears of it (its times are taken already).
            f.unboost();
            let _ = out.send(Confirmation {
                id: f.id,
                action: f.kind,
                times,
                confirmed,
                late: f.timed_out,
            });
            if confirmed {
                return false;
            }
            f.timed_out = true;
            f.deadline = now + LATE_WATCH;
            true
        });
        let mut fds = vec![libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut timeout: Option<Duration> = None;
        for f in &in_flight {
            let left = f.deadline.saturating_duration_since(now);
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
            // Late ones are looked at less often.
            let period = if f.timed_out {
                STATE_POLL * 20
            } else {
                STATE_POLL
            };
            match f.watch.fd() {
                Some(fd) => fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLPRI,
                    revents: 0,
                }),
                None => timeout = Some(timeout.map_or(period, |t| t.min(period))),
            }
        }
        let ms = timeout.map_or(-1, |t| {
            // Round up: poll's resolution is a millisecond, and waking early only
            // costs another lap.
            t.as_micros().div_ceil(1000).clamp(0, i32::MAX as u128) as i32
        });
        // SAFETY: a valid array of pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if fds[0].revents & libc::POLLIN != 0 {
            let mut n = 0u64;
            // SAFETY: reading 8 bytes from our eventfd into a valid u64.
            unsafe { libc::read(wake, (&raw mut n).cast(), 8) };
        }
    }
}

/// An actuation slower than this from its decision is logged with where its
/// time went.
const SLOW_ACTUATION_NS: u64 = 2_000_000;

/// (voluntary, involuntary) context switches of this thread so far.
fn switches() -> (u64, u64) {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    (u.ru_nvcsw as u64, u.ru_nivcsw as u64)
}

fn carry_out(job: Job) -> Option<InFlight> {
    match job {
        Job::Actuate {
            id,
            kind,
            actuator,
            mut times,
            timeout,
        } => {
            let (picked_ns, before, cpu_before) = (monotonic_ns(), switches(), thread_cpu_ns());
            let mut boost = Boosted::default();
            let started = match kind {
                ActionKind::Freeze => actuator.freeze_boosted().map(|b| boost = b),
                ActionKind::Thaw => actuator.set_frozen(false),
                _ => actuator.stop(),
            };
            if let Err(e) = started {
                log::warn!("task {id}: {e:#}");
            }
            times.actuated_ns = monotonic_ns();
            let took_ns = times.actuated_ns.saturating_sub(times.decided_ns);
            if took_ns > SLOW_ACTUATION_NS {
                // Where the time went, for `cargo xtask bench` and for whoever
                // reads the log: the hand-over to this thread, the freeze boost,
                // or the write (blocked in the kernel: voluntary switches;
                // preempted: involuntary ones; neither, and little of it on the
                // CPU: the vCPU was not running, see `thread_cpu_ns`).
                let after = switches();
                let slow = SlowActuation {
                    kind: &format!("{kind:?}"),
                    task: id,
                    took_ms: took_ns as f64 / 1e6,
                    handoff_ms: picked_ns.saturating_sub(times.decided_ns) as f64 / 1e6,
                    boost_ms: boost.took_ns as f64 / 1e6,
                    threads: boost.threads as u64,
                    write_ms: times
                        .actuated_ns
                        .saturating_sub(picked_ns)
                        .saturating_sub(boost.took_ns) as f64
                        / 1e6,
                    voluntary: after.0.saturating_sub(before.0),
                    involuntary: after.1.saturating_sub(before.1),
                    on_cpu_ms: thread_cpu_ns().saturating_sub(cpu_before) as f64 / 1e6,
                };
                log::info!("{}{slow}", SlowActuation::PREFIX);
            }
            Some(InFlight {
                id,
                kind,
                watch: actuator.watch(kind),
                times,
                deadline: Instant::now() + timeout,
                timed_out: false,
                boosted: (boost.threads > 0).then(|| actuator.clone()),
            })
        }
        Job::Refreeze { actuator } => {
            if let Err(e) = actuator.set_frozen(true) {
                log::warn!("re-freezing a task after the fail-safe thawed it: {e:#}");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An actuator whose effect shows on the `after`-th look.
    struct Fake {
        looks: Arc<Mutex<u32>>,
        after: u32,
    }

    struct FakeWatch {
        looks: Arc<Mutex<u32>>,
        after: u32,
    }

    impl Watch for FakeWatch {
        fn done(&mut self) -> bool {
            let mut l = self.looks.lock().unwrap();
            *l += 1;
            *l >= self.after
        }
        fn fd(&self) -> Option<RawFd> {
            None
        }
    }

    impl Actuator for Fake {
        fn set_frozen(&self, _: bool) -> anyhow::Result<()> {
            Ok(())
        }
        fn stop(&self) -> anyhow::Result<()> {
            Ok(())
        }
        fn terminate(&self) {}
        fn kill(&self) -> anyhow::Result<()> {
            Ok(())
        }
        fn signal(&self, _: i32) -> usize {
            0
        }
        fn watch(&self, _: ActionKind) -> Box<dyn Watch> {
            Box::new(FakeWatch {
                looks: self.looks.clone(),
                after: self.after,
            })
        }
    }

    fn times() -> DecisionTimes {
        DecisionTimes {
            action: "freeze".into(),
            event_ns: 1,
            received_ns: 2,
            decided_ns: 3,
            actuated_ns: 3,
            confirmed_ns: None,
        }
    }

    #[test]
    fn confirms_what_shows_and_times_out_what_does_not() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let worker = Worker::start(0, tx).unwrap();
        let job = |id, after, timeout_ms| Job::Actuate {
            id,
            kind: ActionKind::Freeze,
            actuator: Arc::new(Fake {
                looks: Arc::new(Mutex::new(0)),
                after,
            }),
            times: times(),
            timeout: Duration::from_millis(timeout_ms),
        };
        worker.submit(job(1, 3, 2000));
        worker.submit(job(2, u32::MAX, 20));
        // Shows on the 40th look: after its 5 ms timeout (a look every 0.5 ms).
        worker.submit(job(3, 40, 5));
        let mut got = Vec::new();
        while got.len() < 4 {
            let c = rx.blocking_recv().unwrap();
            got.push((c.id, c.confirmed, c.late, c.times.confirmed_ns.is_some()));
            assert!(c.times.actuated_ns > 3, "stamped by the thread");
        }
        got.sort();
        assert_eq!(
            got,
            vec![
                (1, true, false, true),
                (2, false, false, false),
                (3, false, false, false),
                (3, true, true, true)
            ]
        );
        drop(worker); // joins
    }

    #[test]
    fn the_thread_is_moved_to_the_cpu_that_hands_it_a_job() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let worker = Worker::start(0, tx).unwrap();
        worker.submit(Job::Actuate {
            id: 1,
            kind: ActionKind::Freeze,
            actuator: Arc::new(Fake {
                looks: Arc::new(Mutex::new(0)),
                after: 1,
            }),
            times: times(),
            timeout: Duration::from_secs(2),
        });
        assert!(rx.blocking_recv().unwrap().confirmed);
        // The kernel's word on where it may run: only the CPU this ran on then.
        let cpu = worker.cpu.load(Ordering::Relaxed);
        assert!(cpu >= 0);
        let status =
            std::fs::read_to_string(format!("/proc/self/task/{}/status", worker.tid)).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim();
        assert_eq!(allowed, cpu.to_string());
        drop(worker);
    }
}
