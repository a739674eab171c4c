//! What usually explains a misbehaving process, picked out of a trace's events:
//! failed GPU calls, memory that only grows, long runs of involuntary context
//! switches (and the time spent runnable but waiting for a CPU), time spent
//! stopped, and time frozen by Keling and why. Fed the same events as the sinks;
//! [`Findings::report`] gives one line per finding for the text timeline's end.
use std::collections::BTreeMap;

use keling_common::{nvidia::status, task_state};

use super::decision::{Decision, DecisionKind};
use crate::{
    event::decode::{Event, MemKind},
    gpu::names,
};

/// A run of this many involuntary switches in a row (no voluntary one between) is
/// reported: the thread wanted the CPU and kept losing it.
pub const INVOLUNTARY_RUN: u64 = 20;
/// Memory is "only growing" after this many allocations without a free.
pub const GROWING_ALLOCS: u64 = 3;

#[derive(Default)]
struct Failed {
    count: u64,
    first_ns: u64,
    requested_bytes: u64,
    /// status -> count.
    statuses: BTreeMap<u32, u64>,
    calls: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Growth {
    allocs: u64,
    /// Frees the process asked for (a teardown at exit is not one).
    frees: u64,
    bytes: u64,
    peak: u64,
}

#[derive(Default)]
struct ThreadTimes {
    pid: u32,
    run: u64,
    run_start_ns: u64,
    longest_run: u64,
    longest_run_span_ns: (u64, u64),
    involuntary: u64,
    /// Time runnable off the CPU after being preempted, ns.
    waiting_ns: u64,
    /// Time stopped (`T`: SIGSTOP, a debugger), ns.
    stopped_ns: u64,
    /// The last switch-out: (ts, preempted, stopped).
    out: Option<(u64, bool, bool)>,
}

#[derive(Default)]
struct Frozen {
    times: u64,
    total_ns: u64,
    since: Option<u64>,
    reasons: BTreeMap<String, u64>,
    late: u64,
}

/// Accumulates findings from events and scheduler decisions.
#[derive(Default)]
pub struct Findings {
    failed: BTreeMap<u32, Failed>,
    growth: BTreeMap<(u32, Option<u32>), Growth>,
    threads: BTreeMap<u32, ThreadTimes>,
    frozen: BTreeMap<u32, Frozen>,
    last_ns: u64,
    /// Where the timeline's seconds count from: findings name times the way the
    /// timeline does, not as raw kernel timestamps.
    start_ns: u64,
}

impl Findings {
    /// Findings whose times count seconds from `start_ns`, as the timeline does.
    pub fn new(start_ns: u64) -> Self {
        Findings {
            start_ns,
            ..Findings::default()
        }
    }

    pub fn event(&mut self, event: &Event) {
        let h = event.header();
        self.last_ns = self.last_ns.max(h.ts_ns);
        match event {
            Event::GpuIoctl(e) if e.status != status::OK || e.ret < 0 => {
                let f = self.failed.entry(h.pid).or_default();
                if f.count == 0 {
                    f.first_ns = h.ts_ns;
                }
                f.count += 1;
                f.requested_bytes += e.requested_bytes;
                *f.statuses.entry(e.status).or_default() += 1;
                *f.calls.entry(names::call(e.call)).or_default() += 1;
            }
            Event::GpuAlloc(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
                let g = self.growth.entry((h.pid, e.gpu)).or_default();
                g.allocs += 1;
                g.bytes += e.bytes;
                g.peak = g.peak.max(g.bytes);
            }
            Event::GpuFree(e) if e.mem_kind == Some(MemKind::Video) && e.bytes > 0 => {
                if let Some(pid) = e.freed_pid {
                    let g = self.growth.entry((pid, e.gpu)).or_default();
                    g.frees += 1;
                    g.bytes = g.bytes.saturating_sub(e.bytes);
                }
            }
            Event::GpuCharge(e) if e.mem_kind == MemKind::Video && e.bytes > 0 => {
                let from = self.growth.entry((e.from_pid, e.gpu)).or_default();
                from.frees += 1;
                from.bytes = from.bytes.saturating_sub(e.bytes);
                let to = self.growth.entry((e.to_pid, e.gpu)).or_default();
                to.bytes += e.bytes;
                to.peak = to.peak.max(to.bytes);
            }
            Event::Switch(e) => {
                let ts = h.ts_ns;
                if e.prev_pid != 0 {
                    let t = self.threads.entry(e.prev_tid).or_default();
                    t.pid = e.prev_pid;
                    let preempted = !e.voluntary();
                    let stopped = e.prev_state & (task_state::STOPPED | task_state::TRACED) != 0;
                    if preempted {
                        t.involuntary += 1;
                        if t.run == 0 {
                            t.run_start_ns = ts;
                        }
                        t.run += 1;
                        if t.run > t.longest_run {
                            t.longest_run = t.run;
                            t.longest_run_span_ns = (t.run_start_ns, ts);
                        }
                    } else {
                        t.run = 0;
                    }
                    t.out = Some((ts, preempted, stopped));
                }
                if e.next_pid != 0 {
                    let t = self.threads.entry(e.next_tid).or_default();
                    t.pid = e.next_pid;
                    if let Some((out, preempted, stopped)) = t.out.take() {
                        let off = ts.saturating_sub(out);
                        if preempted {
                            t.waiting_ns += off;
                        } else if stopped {
                            t.stopped_ns += off;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    pub fn decision(&mut self, d: &Decision) {
        self.last_ns = self.last_ns.max(d.ts_ns);
        let f = self.frozen.entry(d.pid).or_default();
        if d.freezes() {
            f.times += 1;
            f.since = Some(d.ts_ns);
            if let DecisionKind::Transition { reason, .. } = &d.what {
                *f.reasons.entry(reason.clone()).or_default() += 1;
            }
        } else if d.thaws()
            && let Some(since) = f.since.take()
        {
            f.total_ns += d.ts_ns.saturating_sub(since);
        }
        if matches!(d.what, DecisionKind::Late { .. }) {
            f.late += 1;
        }
    }

    /// One line per finding, most telling first. `end_ns` closes what is still open.
    pub fn report(&self, end_ns: u64) -> Vec<String> {
        let end_ns = end_ns.max(self.last_ns);
        let mut out = Vec::new();
        for (pid, f) in &self.failed {
            let statuses: Vec<String> = f
                .statuses
                .iter()
                .map(|(&s, n)| format!("{n} x {}", status_name(s)))
                .collect();
            let calls: Vec<String> = f.calls.iter().map(|(c, n)| format!("{n} x {c}")).collect();
            let mut line = format!(
                "pid {pid}: {} failed GPU calls ({}; {}), the first at {}",
                f.count,
                calls.join(", "),
                statuses.join(", "),
                self.at(f.first_ns)
            );
            if f.requested_bytes > 0 {
                line.push_str(&format!(", asking for {} in all", mib(f.requested_bytes)));
            }
            out.push(line);
        }
        for ((pid, gpu), g) in &self.growth {
            if g.allocs >= GROWING_ALLOCS && g.frees == 0 {
                out.push(format!(
                    "pid {pid} {}: video memory only grew: {} allocations, no free, up to {}",
                    names::gpu(*gpu),
                    g.allocs,
                    mib(g.peak)
                ));
            }
        }
        for (tid, t) in &self.threads {
            if t.longest_run >= INVOLUNTARY_RUN {
                let (a, b) = t.longest_run_span_ns;
                out.push(format!(
                    "pid {} thread {tid}: {} involuntary switches in a row ({:.3} s span); {} in all, {:.3} ms runnable but waiting for a CPU",
                    t.pid,
                    t.longest_run,
                    b.saturating_sub(a) as f64 / 1e9,
                    t.involuntary,
                    t.waiting_ns as f64 / 1e6
                ));
            }
            if t.stopped_ns > 0 {
                out.push(format!(
                    "pid {} thread {tid}: stopped (SIGSTOP or a debugger) for {:.3} ms",
                    t.pid,
                    t.stopped_ns as f64 / 1e6
                ));
            }
        }
        for (pid, f) in &self.frozen {
            if f.times == 0 && f.late == 0 {
                continue;
            }
            let total = f.total_ns + f.since.map_or(0, |s| end_ns.saturating_sub(s));
            let reasons: Vec<String> = f
                .reasons
                .iter()
                .map(|(r, n)| format!("{n} x {r}"))
                .collect();
            let mut line = format!(
                "pid {pid}: frozen by Keling {} times, {:.3} ms in all ({})",
                f.times,
                total as f64 / 1e6,
                reasons.join(", ")
            );
            if f.since.is_some() {
                line.push_str("; still frozen at the end");
            }
            if f.late > 0 {
                line.push_str(&format!("; {} decisions late", f.late));
            }
            out.push(line);
        }
        out
    }

    /// A moment as the timeline shows it: seconds from its start.
    fn at(&self, ts_ns: u64) -> String {
        format!("{:.6} s", ts_ns.saturating_sub(self.start_ns) as f64 / 1e9)
    }
}

fn status_name(s: u32) -> String {
    match s {
        status::NO_MEMORY => "NV_ERR_NO_MEMORY".into(),
        status::INVALID_ARGUMENT => "NV_ERR_INVALID_ARGUMENT".into(),
        0 => "ioctl error".into(),
        s => format!("status {s:#x}"),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use keling_common::{EventHeader, EventKind, SwitchEvent};

    use super::*;
    use crate::output::test_events as ev;

    fn switch(ts: u64, prev_state: u64, out: bool) -> Event {
        let (prev, next) = if out { (42, 0) } else { (0, 42) };
        Event::Switch(SwitchEvent {
            header: EventHeader {
                kind: EventKind::Switch as u32,
                cpu: 0,
                ts_ns: ts,
                pid: prev,
                tid: prev,
            },
            prev_tid: if out { 43 } else { 1 },
            prev_pid: prev,
            next_tid: if out { 1 } else { 43 },
            next_pid: next,
            prev_state,
            prev_runtime_ns: 0,
        })
    }

    #[test]
    fn an_escape_that_carries_no_memory_is_no_failure() {
        // SYS_PARAMS, CARD_INFO, REGISTER_FD...: "no memory" means none is
        // carried, not NV_ERR_NO_MEMORY.
        let mut f = Findings::default();
        f.event(&ev::ioctl_no_memory_escape());
        assert!(f.report(0).is_empty(), "{:?}", f.report(0));
    }

    #[test]
    fn each_kind_of_finding() {
        let mut f = Findings::default();
        f.event(&ev::ioctl_no_memory());
        for _ in 0..3 {
            f.event(&ev::alloc(MemKind::Video));
        }
        let mut ts = 10;
        for _ in 0..INVOLUNTARY_RUN {
            f.event(&switch(ts, 0, false));
            f.event(&switch(ts + 5, task_state::PREEMPTED, true));
            ts += 10;
        }
        f.event(&switch(ts, 0, false));
        f.event(&switch(ts + 1, task_state::STOPPED, true));
        f.event(&switch(ts + 1001, 0, false));
        let r = f.report(0);
        assert_eq!(
            r[0],
            "pid 42: 1 failed GPU calls (1 x RM_ALLOC; 1 x NV_ERR_NO_MEMORY), the first at 0.000001 s, asking for 1024.0 MiB in all"
        );
        assert_eq!(
            r[1],
            "pid 42 gpu0: video memory only grew: 3 allocations, no free, up to 12.0 MiB"
        );
        // 20 preemptions, each followed by 5 ns of waiting.
        assert!(
            r[2].starts_with("pid 42 thread 43: 20 involuntary switches in a row"),
            "{r:?}"
        );
        assert!(
            r[2].ends_with("0.000 ms runnable but waiting for a CPU"),
            "{r:?}"
        );
        assert_eq!(
            r[3],
            "pid 42 thread 43: stopped (SIGSTOP or a debugger) for 0.001 ms"
        );
        // A free makes the growth ordinary.
        f.event(&ev::free(Some(42)));
        assert!(!f.report(0).iter().any(|l| l.contains("only grew")));
    }

    #[test]
    fn frozen_time_and_reasons() {
        let mut r = super::super::decision::SchedLogReader::default();
        let mut f = Findings::default();
        for (ts, t) in [
            (1_000_000, "RUNNING→PREEMPTED"),
            (3_000_000, "PREEMPTED→RUNNING"),
        ] {
            let line = format!(
                r#"{{"event_id":1,"state_transition":"{t}","timestamp_ns":{ts},"task":1,"name":"x","pid":5,"gpu":0,"priority":8,"reason":"round_robin","exit_code":null}}"#
            );
            f.decision(&r.line(&line, 0).unwrap());
        }
        assert_eq!(
            f.report(0),
            ["pid 5: frozen by Keling 1 times, 2.000 ms in all (1 x round_robin)"]
        );
    }
}
