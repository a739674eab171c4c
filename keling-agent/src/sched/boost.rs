//! Freeze boost: just before a task's `cgroup.freeze` is written, each thread of
//! its cgroup is raised to SCHED_FIFO 1 (with SCHED_FLAG_RESET_ON_FORK), and as
//! soon as the freeze shows (or times out, or fails, or a thaw comes first) each
//! is put back as it was.
//!
//! Why: a thread enters the cgroup freezer only when it next runs. On a host busy
//! on every CPU, each runnable thread of a busy task waits for its turn in the
//! fair class (its slice ends at a tick: 4 ms at HZ=250), so the freeze of a
//! 16-thread task on 2 CPUs took 5.7 ms p50 to show, the kernel alone. A thread
//! raised to the real-time class preempts the CPU's fair task at once, runs, and
//! enters the freezer: measured here, 0.24 ms p50 / 0.9 ms p99 boost included
//! (busy host, n 1100). Being real-time while frozen costs nothing (a frozen
//! thread does not run); what must never be is a *thawed* thread left real-time,
//! so every path puts them back: the confirmation, the timeout, a failed write, a
//! thaw, the actuator's drop, and, for an agent that dies or stalls in between, a
//! record the fail-safe and the next agent read ([`undo_recorded`]).
//!
//! The thread that raises them must itself be real-time above them (the
//! actuation thread, SCHED_FIFO 50 by default); otherwise nothing is raised.
//!
//! Only threads in the fair classes (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE) are
//! raised; one already real-time (priority >= 1) or SCHED_DEADLINE, or in a class
//! this does not know (sched_ext), is left alone. A refusal (EPERM: e.g. a kernel
//! with RT_GROUP_SCHED and a cpu cgroup with no real-time runtime) means no boost
//! for that task, said once; the freeze goes on as it would have.
use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
};

use crate::os::sched_attr::{
    self, SCHED_BATCH, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK, SCHED_IDLE, SCHED_OTHER, SchedAttr,
};

/// The real-time priority threads are raised to: the lowest, below Keling's own
/// threads (the actuation thread, the event loop, the fail-safe).
pub const PRIORITY: u32 = 1;

/// Where the agent records, per task cgroup, the threads it has raised and how
/// they were (one file per cgroup, named as it; empty while nothing is raised).
pub fn record_dir() -> PathBuf {
    crate::instance::current().boost_dir()
}

/// The fair classes' base time slice (`sysctl_sched_base_slice`), in ns; 0
/// while unknown. The kernel reports a fair thread's slice whether the thread
/// chose it or not, and a slice given back marks it as the thread's own choice:
/// so a slice equal to the base is given back as "none".
static BASE_SLICE_NS: AtomicU64 = AtomicU64::new(0);

/// Learns the base slice from the calling thread, if it is in a fair class (a
/// thread that never chose a slice has the base one). Call it before the thread
/// goes real-time.
pub fn learn_base_slice() {
    if let Ok(a) = sched_attr::get(0)
        && fair(a.policy)
        && a.runtime > 0
    {
        BASE_SLICE_NS.store(a.runtime, Ordering::Relaxed);
    }
}

fn base_slice_ns() -> u64 {
    if BASE_SLICE_NS.load(Ordering::Relaxed) == 0 {
        learn_base_slice();
    }
    BASE_SLICE_NS.load(Ordering::Relaxed)
}

fn fair(policy: u32) -> bool {
    matches!(policy, SCHED_OTHER | SCHED_BATCH | SCHED_IDLE)
}

/// Whether a thread with these attributes is raised.
fn boostable(a: &SchedAttr) -> bool {
    fair(a.policy)
}

/// What a raised thread is set to.
fn boost_attr() -> SchedAttr {
    SchedAttr {
        priority: PRIORITY,
        flags: SCHED_FLAG_RESET_ON_FORK,
        ..SchedAttr::new(SCHED_FIFO)
    }
}

/// Whether a thread looks as a raised one does now.
fn is_boosted(a: &SchedAttr) -> bool {
    a.policy == SCHED_FIFO && a.priority == PRIORITY && a.flags & SCHED_FLAG_RESET_ON_FORK != 0
}

/// What puts a thread back as `saved` was: its class, nice and reset-on-fork
/// flag, and its slice if it had chosen one (one that differs from the base
/// slice `base_ns`). With the base unknown (0), the slice is given back as it
/// was, as the thread's own choice.
fn restore_attr(saved: &SchedAttr, base_ns: u64) -> SchedAttr {
    SchedAttr {
        flags: saved.flags & SCHED_FLAG_RESET_ON_FORK,
        nice: saved.nice,
        runtime: if saved.runtime == base_ns {
            0
        } else {
            saved.runtime
        },
        ..SchedAttr::new(saved.policy)
    }
}

/// The thread ids in the text of `cgroup.threads`.
fn tids(text: &[u8]) -> impl Iterator<Item = u32> + '_ {
    text.split(|&b| b == b'\n').filter_map(|line| {
        if line.is_empty() || !line.iter().all(u8::is_ascii_digit) {
            return None;
        }
        line.iter().try_fold(0u32, |n, &d| {
            n.checked_mul(10)?.checked_add(u32::from(d - b'0'))
        })
    })
}

/// One line per raised thread: `TID POLICY NICE FLAGS SLICE`, as it was.
fn write_record(out: &mut Vec<u8>, saved: &[Saved]) {
    out.clear();
    for s in saved {
        let a = &s.attr;
        // Writing to a Vec cannot fail.
        let _ = writeln!(
            out,
            "{} {} {} {} {}",
            s.tid, a.policy, a.nice, a.flags, a.runtime
        );
    }
}

fn parse_record(text: &str) -> Vec<Saved> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let tid = w.next()?.parse().ok()?;
            let policy = w.next()?.parse().ok()?;
            let attr = SchedAttr {
                nice: w.next()?.parse().ok()?,
                flags: w.next()?.parse().ok()?,
                runtime: w.next()?.parse().ok()?,
                ..SchedAttr::new(policy)
            };
            Some(Saved { tid, attr })
        })
        .collect()
}

/// A thread raised, and how it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Saved {
    tid: u32,
    attr: SchedAttr,
}

static REFUSED_SAID: AtomicBool = AtomicBool::new(false);
static NO_RECORD_SAID: AtomicBool = AtomicBool::new(false);
static FIRST_SAID: AtomicBool = AtomicBool::new(false);

fn once(flag: &AtomicBool) -> bool {
    !flag.swap(true, Ordering::Relaxed)
}

static OUTRANKED_SAID: AtomicBool = AtomicBool::new(false);

/// Whether the calling thread is real-time above [`PRIORITY`]: it must be, or the
/// threads it raises (busy ones on every CPU) keep it off the CPU until the
/// kernel's real-time throttling steps in (up to 0.95 s of each second), before it
/// has even written `cgroup.freeze`.
fn caller_outranks() -> bool {
    let ok = sched_attr::get(0).is_ok_and(|a| {
        matches!(a.policy, SCHED_FIFO | sched_attr::SCHED_RR) && a.priority > PRIORITY
    });
    if !ok && once(&OUTRANKED_SAID) {
        log::warn!(
            "freeze boost off: the actuation thread is not in the real-time class above \
             SCHED_FIFO {PRIORITY} (see --actuator-priority), and the threads it raised would \
             keep it off the CPU"
        );
    }
    ok
}

/// One task's boost: its `cgroup.threads` (opened once), the buffers it reads
/// and records through (kept from one freeze to the next, so a boost allocates
/// nothing once they are grown), and the threads raised now.
#[derive(Debug)]
pub struct Booster {
    threads_path: PathBuf,
    threads: Option<fs::File>,
    record: PathBuf,
    /// The record, opened once: a boost rewrites it with one `pwrite` (and
    /// shortens it only when it shrank), a restore empties it.
    record_file: Option<fs::File>,
    record_len: u64,
    buf: Vec<u8>,
    text: Vec<u8>,
    saved: Vec<Saved>,
    /// A raise was refused (and none succeeded): this task is not boosted again.
    refused: bool,
}

impl Booster {
    /// For the task cgroup at `cgroup_dir`, recording its raised threads at
    /// `record` (see [`record_path`]).
    pub fn new(cgroup_dir: &Path, record: PathBuf) -> Self {
        Self {
            threads_path: cgroup_dir.join("cgroup.threads"),
            threads: None,
            record,
            record_file: None,
            record_len: 0,
            buf: Vec::new(),
            text: Vec::new(),
            saved: Vec::new(),
            refused: false,
        }
    }

    /// Reads `cgroup.threads` into `buf`: one `pread` when it fits (a short
    /// read of a seq_file is its end).
    fn read_threads(&mut self) -> io::Result<usize> {
        if self.threads.is_none() {
            self.threads = Some(fs::File::open(&self.threads_path)?);
        }
        let Some(file) = &self.threads else {
            unreachable!("opened above")
        };
        if self.buf.is_empty() {
            self.buf.resize(4096, 0);
        }
        let mut n = 0;
        loop {
            let space = self.buf.len() - n;
            let got = file.read_at(&mut self.buf[n..], n as u64)?;
            n += got;
            if got < space {
                return Ok(n);
            }
            let grown = self.buf.len() * 2;
            self.buf.resize(grown, 0);
        }
    }

    /// Raises every thread of the cgroup that is in a fair class to SCHED_FIFO
    /// [`PRIORITY`], recording first how each was. Returns how many it raised.
    /// Nothing is raised while a raise is still in place (a freeze in flight), or
    /// when the record cannot be written (an agent that died would leave them
    /// real-time with nobody knowing).
    pub fn boost(&mut self) -> usize {
        if self.refused || !self.saved.is_empty() || !caller_outranks() {
            return 0;
        }
        let n = match self.read_threads() {
            Ok(n) => n,
            Err(e) => {
                log::debug!("freeze boost: read {}: {e}", self.threads_path.display());
                return 0;
            }
        };
        for tid in tids(&self.buf[..n]) {
            // A thread gone since the read is no matter.
            if let Ok(attr) = sched_attr::get(tid)
                && boostable(&attr)
            {
                self.saved.push(Saved { tid, attr });
            }
        }
        if self.saved.is_empty() {
            return 0;
        }
        write_record(&mut self.text, &self.saved);
        if let Err(e) = self.put_record() {
            if once(&NO_RECORD_SAID) {
                log::warn!(
                    "freeze boost off: cannot record the threads it would raise in {} ({e}); \
                     freezes go on without it",
                    self.record.display()
                );
            }
            self.saved.clear();
            return 0;
        }
        let raise = boost_attr();
        let mut refusal = None;
        self.saved.retain(|s| match sched_attr::set(s.tid, &raise) {
            Ok(()) => true,
            Err(e) => {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    refusal.get_or_insert(e);
                }
                false
            }
        });
        let raised = self.saved.len();
        if let Some(e) = refusal
            && raised == 0
        {
            self.refused = true;
            if once(&REFUSED_SAID) {
                log::warn!(
                    "freeze boost refused for {} ({e}): its threads stay in their class \
                     during freezes (a kernel with RT_GROUP_SCHED gives a cpu cgroup no \
                     real-time time unless its cpu.rt_runtime_us says so)",
                    self.threads_path
                        .parent()
                        .unwrap_or(&self.threads_path)
                        .display()
                );
            }
        }
        if raised == 0 {
            self.clear_record();
        } else if once(&FIRST_SAID) {
            log::info!(
                "freeze boost: {raised} thread(s) of {} raised to SCHED_FIFO {PRIORITY} until \
                 their freeze shows",
                self.threads_path
                    .parent()
                    .unwrap_or(&self.threads_path)
                    .display()
            );
        }
        raised
    }

    /// Puts every raised thread back as it was (one that is no longer as it was
    /// raised, changed by its own code meanwhile or gone, is left as it is), and
    /// drops the record. Returns how many it put back.
    pub fn restore(&mut self) -> usize {
        if self.saved.is_empty() {
            return 0;
        }
        let n = restore_all(&self.saved, base_slice_ns());
        self.saved.clear();
        self.clear_record();
        n
    }

    /// Writes `text` as the record (its file opened, and its directory made, the
    /// first time).
    fn put_record(&mut self) -> io::Result<()> {
        if self.record_file.is_none() {
            let open = || {
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&self.record)
            };
            let file = match open() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if let Some(dir) = self.record.parent() {
                        fs::create_dir_all(dir)?;
                    }
                    open()
                }
                r => r,
            }?;
            // Whatever an earlier run left in it is not this one's.
            file.set_len(0)?;
            self.record_file = Some(file);
            self.record_len = 0;
        }
        let Some(file) = &self.record_file else {
            unreachable!("opened above")
        };
        file.write_all_at(&self.text, 0)?;
        let len = self.text.len() as u64;
        if len < self.record_len {
            file.set_len(len)?;
        }
        self.record_len = len;
        Ok(())
    }

    /// Empties the record: nothing is raised.
    fn clear_record(&mut self) {
        if let Some(file) = &self.record_file
            && self.record_len > 0
            && file.set_len(0).is_ok()
        {
            self.record_len = 0;
        }
    }
}

impl Drop for Booster {
    fn drop(&mut self) {
        self.restore();
        if self.record_file.take().is_some() {
            let _ = fs::remove_file(&self.record);
        }
    }
}

fn restore_all(saved: &[Saved], base_ns: u64) -> usize {
    saved
        .iter()
        .filter(|s| {
            if !sched_attr::get(s.tid).is_ok_and(|a| is_boosted(&a)) {
                return false;
            }
            match sched_attr::set(s.tid, &restore_attr(&s.attr, base_ns)) {
                Ok(()) => true,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => false,
                Err(e) => {
                    log::warn!(
                        "freeze boost: thread {} stays SCHED_FIFO {PRIORITY}: putting it back \
                         failed ({e})",
                        s.tid
                    );
                    false
                }
            }
        })
        .count()
}

/// The record of the task cgroup at `cgroup_dir`, under `dir` ([`record_dir`]).
pub fn record_path(dir: &Path, cgroup_dir: &Path) -> PathBuf {
    dir.join(cgroup_dir.file_name().unwrap_or(cgroup_dir.as_os_str()))
}

/// For whoever outlives or follows an agent (the fail-safe, `keling thaw --all`,
/// the next agent's start): puts back every thread listed in the record at
/// `record` that still looks raised and for which `belongs(tid)` holds (it is
/// still in the task's cgroup), before its cgroup is thawed. The record is left
/// where it is (a stalled agent still owns it). Returns how many it put back.
pub fn undo_recorded(record: &Path, belongs: impl Fn(u32) -> bool) -> usize {
    let Ok(text) = fs::read_to_string(record) else {
        return 0;
    };
    let saved: Vec<Saved> = parse_record(&text)
        .into_iter()
        .filter(|s| belongs(s.tid))
        .collect();
    restore_all(&saved, base_slice_ns())
}

/// Removes every record under `dir` (the agent's start: what they listed was
/// put back by [`undo_recorded`] first).
pub fn remove_records(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// How many threads the record at `path` lists (tests).
#[cfg(test)]
pub(crate) fn recorded(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::sched_attr::{SCHED_DEADLINE, SCHED_RR};

    fn attr(policy: u32, nice: i32, flags: u64, runtime: u64) -> SchedAttr {
        SchedAttr {
            nice,
            flags,
            runtime,
            ..SchedAttr::new(policy)
        }
    }

    #[test]
    fn only_fair_threads_are_raised() {
        assert!(boostable(&attr(SCHED_OTHER, 5, 0, 0)));
        assert!(boostable(&attr(SCHED_BATCH, 0, 0, 0)));
        assert!(boostable(&attr(SCHED_IDLE, 0, 0, 0)));
        for p in [SCHED_FIFO, SCHED_RR, SCHED_DEADLINE, 7] {
            assert!(!boostable(&attr(p, 0, 0, 0)), "policy {p}");
        }
        let b = boost_attr();
        assert_eq!((b.policy, b.priority, b.flags), (SCHED_FIFO, 1, 1));
        assert!(is_boosted(&b));
        // A thread of the task's own at FIFO 1 without reset-on-fork is not ours.
        assert!(!is_boosted(&SchedAttr {
            priority: 1,
            ..SchedAttr::new(SCHED_FIFO)
        }));
        assert!(!is_boosted(&SchedAttr {
            priority: 2,
            flags: 1,
            ..SchedAttr::new(SCHED_FIFO)
        }));
    }

    #[test]
    fn a_thread_goes_back_to_its_class_nice_flag_and_own_slice() {
        let base = 1_400_000;
        // The base slice is given back as none (the kernel would otherwise mark it
        // as the thread's own choice).
        let r = restore_attr(&attr(SCHED_OTHER, 5, 0, base), base);
        assert_eq!(
            (r.policy, r.nice, r.flags, r.priority, r.runtime),
            (SCHED_OTHER, 5, 0, 0, 0)
        );
        assert_eq!(r.size, 56);
        // A slice of its own is kept, and so is reset-on-fork.
        let r = restore_attr(&attr(SCHED_BATCH, -3, 1, 5_000_000), base);
        assert_eq!(
            (r.policy, r.nice, r.flags, r.runtime),
            (SCHED_BATCH, -3, 1, 5_000_000)
        );
        // Utilization-clamp flags (reported, never asked for here) are dropped.
        assert_eq!(restore_attr(&attr(SCHED_IDLE, 0, 0x61, 0), base).flags, 1);
        // Base unknown: the slice given back as it was.
        assert_eq!(
            restore_attr(&attr(SCHED_OTHER, 0, 0, 1_400_000), 0).runtime,
            1_400_000
        );
    }

    #[test]
    fn reads_thread_ids_without_allocating_and_skips_junk() {
        let got: Vec<u32> = tids(b"12\n345\n\nx7\n4294967296\n9").collect();
        assert_eq!(got, vec![12, 345, 9]);
        assert_eq!(tids(b"").count(), 0);
    }

    #[test]
    fn the_record_says_how_each_thread_was() {
        let saved = vec![
            Saved {
                tid: 41,
                attr: attr(SCHED_OTHER, 5, 0, 1_400_000),
            },
            Saved {
                tid: 42,
                attr: attr(SCHED_IDLE, -2, 1, 3_000_000),
            },
        ];
        let mut text = Vec::new();
        write_record(&mut text, &saved);
        assert_eq!(
            String::from_utf8_lossy(&text),
            "41 0 5 0 1400000\n42 5 -2 1 3000000\n"
        );
        assert_eq!(
            parse_record(&String::from_utf8_lossy(&text)),
            saved,
            "read back as written"
        );
        assert_eq!(parse_record("41 0\nnot a line\n"), vec![]);
    }

    #[test]
    fn a_boost_of_a_cgroup_it_cannot_read_raises_nothing_and_records_nothing() {
        let dir = std::env::temp_dir().join(format!("keling-boost-{}", std::process::id()));
        let record = dir.join("records").join("task-x");
        let mut b = Booster::new(&dir.join("no-such-cgroup"), record.clone());
        assert_eq!(b.boost(), 0);
        assert_eq!(b.restore(), 0);
        assert!(!record.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    /// A plain file standing in for `cgroup.threads`, listing a thread of this
    /// process in SCHED_OTHER: as root (from a real-time thread, as the actuation
    /// thread) it is raised, recorded, and put back exactly (and the record goes);
    /// otherwise (not real-time) nothing is raised or recorded.
    #[test]
    fn a_thread_is_raised_and_put_back_exactly() {
        learn_base_slice();
        let dir = std::env::temp_dir().join(format!("keling-boost-r-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            let before = sched_attr::get(0).unwrap();
            tid_tx.send((tid, before)).unwrap();
            let _ = done_rx.recv();
        });
        let (tid, before) = tid_rx.recv().unwrap();
        if before.policy != SCHED_OTHER {
            done_tx.send(()).unwrap();
            t.join().unwrap();
            return; // the test runner is not in the fair class: nothing to check
        }
        fs::write(dir.join("cgroup.threads"), format!("{tid}\n")).unwrap();
        let record = dir.join("records").join("task-1");
        let mut b = Booster::new(&dir, record.clone());
        // This test's own thread (it ends with the test).
        let realtime = crate::os::set_thread_realtime(50).is_ok();
        let raised = b.boost();
        if !realtime {
            assert_eq!(raised, 0, "a caller that is not real-time raises nothing");
            assert_eq!(recorded(&record), 0, "nothing raised, nothing recorded");
            assert_eq!(sched_attr::get(tid).unwrap(), before);
        } else {
            assert_eq!(raised, 1);
            assert!(is_boosted(&sched_attr::get(tid).unwrap()));
            let text = fs::read_to_string(&record).unwrap();
            assert!(
                text.starts_with(&format!("{tid} 0 {} ", before.nice)),
                "{text}"
            );
            // A second freeze while this one is in flight raises nothing more.
            assert_eq!(b.boost(), 0);
            // The fail-safe's way back, from the record alone.
            assert_eq!(undo_recorded(&record, |_| false), 0, "not in the cgroup");
            assert_eq!(undo_recorded(&record, |t| t == tid), 1);
            let after = sched_attr::get(tid).unwrap();
            assert_eq!((after.policy, after.nice, after.flags), (0, before.nice, 0));
            // The agent's own restore then finds nothing raised.
            assert_eq!(b.restore(), 0);
            assert_eq!(recorded(&record), 0);
            assert_eq!(b.boost(), 1);
            assert_eq!(recorded(&record), 1);
            assert_eq!(b.restore(), 1);
            assert_eq!(recorded(&record), 0);
            let after = sched_attr::get(tid).unwrap();
            assert_eq!(
                (after.policy, after.nice, after.flags, after.runtime),
                (before.policy, before.nice, before.flags, before.runtime)
            );
        }
        drop(b);
        assert!(!record.exists(), "removed with its task");
        done_tx.send(()).unwrap();
        t.join().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
