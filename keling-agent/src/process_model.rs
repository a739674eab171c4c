//! The agent's picture of the traced processes and their threads, built only from
//! decoded events (plus what /proc says about processes that existed before the
//! trace began), each process joined with its GPU figures ([`crate::gpu::stats`]).
//! No I/O here: feed it events, read it back.
//!
//! A module of its own, not part of `event`: it reads `event`'s decoded events and
//! `gpu`'s figures, and `gpu` names `event`'s decoded codes, so inside `event` it
//! would make the two import each other.
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::{
    event::decode::{Event, ExitStatus, comm, cstr},
    gpu::stats::GpuProcessStats,
};

#[derive(Clone, Debug, Default, Serialize)]
pub struct ThreadStats {
    pub tid: u32,
    pub comm: String,
    /// Times the thread left the CPU.
    pub switches: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Time on the CPU while traced, in ns: the kernel's own CPU-time counter of the
    /// thread (carried by each switch-out), so a switch the kernel did not report
    /// costs nothing. A thread already running when tracing started counts from
    /// its first switch-in, until its first switch-out; from the counter after.
    pub on_cpu_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip)]
    on_cpu_since_ns: Option<u64>,
    /// The kernel's CPU-time counter at the thread's last switch-out.
    #[serde(skip)]
    runtime_ns: Option<u64>,
    /// Created while traced (its counter started at 0 under the trace).
    #[serde(skip)]
    born_traced: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessStats {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Exit code (128 + signal when killed, as a shell reports it); absent while alive.
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub switches: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub on_cpu_ns: u64,
    pub threads: Vec<ThreadStats>,
    /// GPU figures, exact from the kernel's maps.
    #[serde(flatten)]
    pub gpu: GpuProcessStats,
}

#[derive(Default)]
struct Process {
    ppid: u32,
    comm: String,
    filename: Option<String>,
    exit: Option<ExitStatus>,
    /// Every thread the process ever had, in order of appearance.
    tids: BTreeSet<u32>,
}

/// Processes and threads seen in a trace.
#[derive(Default)]
pub struct Model {
    processes: BTreeMap<u32, Process>,
    threads: BTreeMap<u32, ThreadStats>,
    /// Thread id -> process, for every thread seen.
    owner: BTreeMap<u32, u32>,
    pub events: u64,
    /// Switch-outs of a traced thread with no switch-in reported since its last
    /// one: the kernel never reported the switch onto the CPU (see docs/limits.md:
    /// switches away from some tasks reach no tracepoint here) or it was lost.
    pub unreported_switch_ins: u64,
}

impl Model {
    /// Registers a process that exists already (the traced command, or `--pid`).
    pub fn add_process(&mut self, pid: u32, ppid: u32, comm: String, tids: &[u32]) {
        let p = self.processes.entry(pid).or_default();
        p.ppid = ppid;
        p.comm = comm.clone();
        for &tid in tids {
            self.add_thread(pid, tid, &comm);
        }
    }

    /// Whether the trace has seen process `pid` (registered, forked or exec'd).
    pub fn has_process(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    fn add_thread(&mut self, pid: u32, tid: u32, comm: &str) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.tids.insert(tid);
        }
        self.owner.insert(tid, pid);
        self.threads.entry(tid).or_insert_with(|| ThreadStats {
            tid,
            comm: comm.to_owned(),
            ..Default::default()
        });
    }

    pub fn apply(&mut self, event: &Event) {
        self.events += 1;
        match event {
            Event::Fork(e) if e.tracked != 0 => {
                let parent = e.header.pid;
                let comm = comm(&e.comm);
                if e.child_pid != parent {
                    let p = self.processes.entry(e.child_pid).or_default();
                    p.ppid = parent;
                    p.comm = comm.clone();
                }
                self.add_thread(e.child_pid, e.child_tid, &comm);
                if let Some(t) = self.threads.get_mut(&e.child_tid) {
                    t.born_traced = true;
                }
            }
            Event::Exec(e) if e.tracked != 0 => {
                let (pid, tid) = (e.header.pid, e.header.tid);
                let comm = comm(&e.comm);
                if e.old_tid != tid {
                    // A non-leader thread exec'd: it continues as the leader.
                    self.threads.remove(&e.old_tid);
                    if let Some(p) = self.processes.get_mut(&pid) {
                        p.tids.remove(&e.old_tid);
                    }
                }
                let p = self.processes.entry(pid).or_default();
                p.comm = comm.clone();
                p.filename = Some(cstr(&e.filename));
                self.add_thread(pid, tid, &comm);
                // Every thread of an exec'd process is its leader now.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.comm = comm;
                    if e.old_tid != tid {
                        // The leader's tid names another task now, with its own
                        // CPU-time counter.
                        t.runtime_ns = None;
                        t.born_traced = false;
                    }
                }
            }
            Event::Exit(e) if e.tracked != 0 => {
                let status = ExitStatus::from_wait_status(e.exit_status);
                let (pid, tid) = (e.header.pid, e.header.tid);
                self.add_thread(pid, tid, &comm(&e.comm));
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.exit_code = Some(status.code());
                }
                if e.group_dead != 0 {
                    self.processes.entry(pid).or_default().exit = Some(status);
                }
            }
            Event::Switch(e) => {
                let ts = e.header.ts_ns;
                if e.prev_pid != 0
                    && let Some(t) = self.threads.get_mut(&e.prev_tid)
                {
                    t.switches += 1;
                    if e.voluntary() {
                        t.voluntary_switches += 1;
                    } else {
                        t.involuntary_switches += 1;
                    }
                    let segment = t
                        .on_cpu_since_ns
                        .take()
                        .map(|since| ts.saturating_sub(since));
                    let runtime = e.prev_runtime_ns;
                    let counted = t.runtime_ns.is_some() || t.born_traced;
                    if segment.is_none() && counted {
                        self.unreported_switch_ins += 1;
                    }
                    t.on_cpu_ns += match (runtime, t.runtime_ns) {
                        // The probe could not read the counter: the timestamps.
                        (0, _) => segment.unwrap_or(0),
                        (now, Some(last)) => now.saturating_sub(last),
                        (now, None) if t.born_traced => now,
                        // Already running when the trace began: from its switch-in.
                        (_, None) => segment.unwrap_or(0),
                    };
                    if runtime != 0 {
                        t.runtime_ns = Some(runtime);
                    }
                }
                if e.next_pid != 0 {
                    if !self.threads.contains_key(&e.next_tid) {
                        self.add_thread(e.next_pid, e.next_tid, "");
                    }
                    if let Some(t) = self.threads.get_mut(&e.next_tid) {
                        t.on_cpu_since_ns = Some(ts);
                    }
                }
            }
            // System-wide events about untracked processes: counted, not modelled.
            _ => {}
        }
    }

    /// Per-process figures, each with its threads and its GPU figures. A process
    /// that holds GPU memory but whose fork the trace lost still gets an entry.
    pub fn summary(&self, mut gpu: BTreeMap<u32, GpuProcessStats>) -> Vec<ProcessStats> {
        let mut out: Vec<ProcessStats> = self
            .processes
            .iter()
            .map(|(&pid, p)| {
                let threads: Vec<ThreadStats> = p
                    .tids
                    .iter()
                    .filter_map(|t| self.threads.get(t).cloned())
                    .collect();
                let sum = |f: fn(&ThreadStats) -> u64| threads.iter().map(f).sum();
                ProcessStats {
                    pid,
                    ppid: p.ppid,
                    comm: p.comm.clone(),
                    filename: p.filename.clone(),
                    exit_code: p.exit.map(ExitStatus::code),
                    signal: p.exit.and_then(ExitStatus::signal),
                    switches: sum(|t| t.switches),
                    voluntary_switches: sum(|t| t.voluntary_switches),
                    involuntary_switches: sum(|t| t.involuntary_switches),
                    on_cpu_ns: sum(|t| t.on_cpu_ns),
                    threads,
                    gpu: {
                        let mut g = gpu.remove(&pid).unwrap_or_default();
                        g.gpu_mem_held_after_exit = p.exit.is_some() && g.gpu_mem_bytes > 0;
                        g
                    },
                }
            })
            .collect();
        out.extend(gpu.into_iter().map(|(pid, gpu)| ProcessStats {
            pid,
            gpu,
            ..Default::default()
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use keling_common::*;

    use super::*;

    fn hdr(kind: EventKind, ts_ns: u64, pid: u32, tid: u32) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 0,
            ts_ns,
            pid,
            tid,
        }
    }

    fn comm16(s: &str) -> [u8; COMM_LEN] {
        let mut c = [0; COMM_LEN];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    fn fork(ts: u64, parent: u32, child_pid: u32, child_tid: u32) -> Event {
        Event::Fork(ForkEvent {
            header: hdr(EventKind::Fork, ts, parent, parent),
            child_pid,
            child_tid,
            tracked: 1,
            _reserved: 0,
            comm: comm16("sh"),
        })
    }

    /// A switch from `prev` to `next` ((pid, tid), pid 0 when untracked);
    /// `runtime` is the kernel's CPU-time counter of `prev`.
    fn switch(ts: u64, prev: (u32, u32), next: (u32, u32), prev_state: u64, runtime: u64) -> Event {
        Event::Switch(SwitchEvent {
            header: hdr(EventKind::Switch, ts, prev.0, prev.1),
            prev_tid: prev.1,
            prev_pid: prev.0,
            next_tid: next.1,
            next_pid: next.0,
            prev_state,
            prev_runtime_ns: runtime,
        })
    }

    fn exit(ts: u64, pid: u32, tid: u32, status: u32, group_dead: bool) -> Event {
        Event::Exit(ExitEvent {
            header: hdr(EventKind::Exit, ts, pid, tid),
            exit_status: status,
            group_dead: group_dead as u32,
            tracked: 1,
            _reserved: 0,
            comm: comm16("sh"),
        })
    }

    #[test]
    fn builds_tree_with_exit_codes_and_cpu_time() {
        let mut m = Model::default();
        m.add_process(100, 1, "keling".into(), &[100]);
        m.apply(&fork(10, 100, 101, 101)); // a child process
        m.apply(&fork(11, 100, 100, 102)); // a thread of 100
        // 101 runs 5 ns, sleeps (voluntary); then is preempted after 3 more ns.
        m.apply(&switch(20, (0, 999), (101, 101), 0, 0));
        m.apply(&switch(
            25,
            (101, 101),
            (0, 998),
            task_state::INTERRUPTIBLE,
            5,
        ));
        m.apply(&switch(30, (0, 998), (101, 101), 0, 0));
        m.apply(&switch(33, (101, 101), (0, 997), task_state::PREEMPTED, 8));
        m.apply(&exit(40, 101, 101, 7 << 8, true));
        m.apply(&exit(41, 100, 102, 0, false));
        m.apply(&exit(42, 100, 100, 9, true));
        let s = m.summary(BTreeMap::new());
        assert_eq!(s.len(), 2);
        let parent = &s[0];
        assert_eq!(
            (parent.pid, parent.exit_code, parent.signal),
            (100, Some(137), Some(9))
        );
        assert_eq!(parent.threads.len(), 2);
        let child = &s[1];
        assert_eq!(
            (child.pid, child.ppid, child.exit_code),
            (101, 100, Some(7))
        );
        assert_eq!(child.switches, 2);
        assert_eq!(child.voluntary_switches, 1);
        assert_eq!(child.involuntary_switches, 1);
        assert_eq!(child.on_cpu_ns, 8);
        assert_eq!(m.events, 9);
    }

    fn on_cpu(m: &Model, tid: u32) -> u64 {
        m.threads[&tid].on_cpu_ns
    }

    #[test]
    fn a_switch_in_the_kernel_never_reported_costs_no_cpu_time() {
        let mut m = Model::default();
        m.add_process(100, 1, "keling".into(), &[100]);
        m.apply(&fork(10, 100, 100, 102));
        m.apply(&switch(20, (0, 999), (100, 102), 0, 0));
        m.apply(&switch(25, (100, 102), (0, 998), task_state::PREEMPTED, 5));
        // Back on the CPU at 33 after a task whose switches reach no tracepoint:
        // no switch-in; the kernel's counter says it ran 7 ns more.
        m.apply(&switch(40, (100, 102), (0, 998), task_state::PREEMPTED, 12));
        assert_eq!(on_cpu(&m, 102), 12);
        assert_eq!(m.unreported_switch_ins, 1);
        // A lost switch-out is covered the same way: the next one has the counter.
        m.apply(&switch(50, (0, 998), (100, 102), 0, 0));
        m.apply(&switch(60, (0, 998), (100, 102), 0, 0));
        m.apply(&switch(
            62,
            (100, 102),
            (0, 998),
            task_state::INTERRUPTIBLE,
            24,
        ));
        assert_eq!(on_cpu(&m, 102), 24);
        assert_eq!(m.unreported_switch_ins, 1);
    }

    #[test]
    fn a_thread_running_before_the_trace_counts_from_its_first_switch_in() {
        let mut m = Model::default();
        // Attached to: 1000 ns of CPU before the trace began.
        m.add_process(100, 1, "sh".into(), &[100, 101]);
        // 100 was on the CPU when the trace began: its first switch-out has no start.
        m.apply(&switch(
            10,
            (100, 100),
            (0, 998),
            task_state::PREEMPTED,
            1000,
        ));
        assert_eq!(on_cpu(&m, 100), 0);
        m.apply(&switch(20, (0, 998), (100, 100), 0, 0));
        m.apply(&switch(
            25,
            (100, 100),
            (0, 998),
            task_state::PREEMPTED,
            1005,
        ));
        m.apply(&switch(
            40,
            (100, 100),
            (0, 998),
            task_state::PREEMPTED,
            1012,
        ));
        assert_eq!(on_cpu(&m, 100), 12);
        // 101's first switch-out follows a switch-in: that segment, then the counter.
        m.apply(&switch(50, (0, 998), (100, 101), 0, 0));
        m.apply(&switch(
            54,
            (100, 101),
            (0, 998),
            task_state::PREEMPTED,
            7000,
        ));
        m.apply(&switch(
            70,
            (100, 101),
            (0, 998),
            task_state::PREEMPTED,
            7006,
        ));
        assert_eq!(on_cpu(&m, 101), 10);
        // Only the one after a known counter counts as unreported.
        assert_eq!(m.unreported_switch_ins, 2);
    }

    #[test]
    fn without_the_counter_on_cpu_time_comes_from_the_switch_timestamps() {
        let mut m = Model::default();
        m.add_process(100, 1, "sh".into(), &[100]);
        m.apply(&fork(10, 100, 100, 102));
        m.apply(&switch(20, (0, 999), (100, 102), 0, 0));
        m.apply(&switch(25, (100, 102), (0, 998), task_state::PREEMPTED, 0));
        m.apply(&switch(30, (0, 999), (100, 102), 0, 0));
        m.apply(&switch(33, (100, 102), (0, 998), task_state::PREEMPTED, 0));
        assert_eq!(on_cpu(&m, 102), 8);
    }

    #[test]
    fn untracked_events_are_counted_not_modelled() {
        let mut m = Model::default();
        let Event::Fork(mut f) = fork(1, 5, 6, 6) else {
            unreachable!()
        };
        f.tracked = 0;
        m.apply(&Event::Fork(f));
        assert_eq!(m.summary(BTreeMap::new()).len(), 0);
        assert_eq!(m.events, 1);
    }
}
