//! A trace for the Perfetto UI (<https://ui.perfetto.dev>, "Open trace file"), in the
//! Chrome trace-event JSON format, which Perfetto imports natively.
//!
//! Why JSON and not Perfetto's protobuf: the Rust crates that write Perfetto's
//! protobuf either generate code from `.proto` files at build time (prost-build,
//! which needs `protoc`, a system tool) or are not maintained; JSON needs nothing
//! but serde_json and opens in the same UI. It is written as it goes (one event
//! per line), so a long trace never sits in memory.
//!
//! What is in it, per traced process (Perfetto's process track groups):
//! - one track per thread: a complete slice (`ph: "X"`, with `dur`) for each time
//!   it was on a CPU, named after how it left the CPU (`preempted`, `sleep (S)`,
//!   `disk/uninterruptible (D)`, `stopped (T)`, `exit`); args: the CPU and the
//!   kernel's `prev_state`. A slice is written when it ends, so every slice in the
//!   file is closed; one still open when the trace ends is closed at its end.
//! - instant events on the thread that made them (`ph: "i"`): fork, exec, exit,
//!   GPU opens and closes, allocations, frees, object creation, teardowns,
//!   references, exports, moved charges, and failed or undecoded GPU calls, each
//!   with every decoded argument (the same fields as `--format jsonl`).
//! - a counter track per GPU (`ph: "C"`, `gpu<N> memory`): the process's video,
//!   pinned host and EGM bytes after every change. The kernel's exact figures are
//!   in the summary; if the events (some lost) do not add up to them, the counter
//!   gets a last point with the exact figure and an instant says so.
//! - Keling's scheduler decisions about the process when the trace follows the
//!   agent's scheduling log (`--sched-log`): instants on a "keling scheduler"
//!   track, and a slice for each time the task was frozen, named with the reason.
//!
//! Timestamps (`ts`, `dur`) are microseconds of the kernel's CLOCK_MONOTONIC, as
//! the format requires; `args.ts_ns` keeps the exact nanoseconds of each instant.
//! The end of the file has `metadata.keling_summary`, the same object as the jsonl
//! summary line.
use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use keling_common::task_state;
use serde_json::{Value, json};

use super::{
    Sink, Summary,
    decision::{Decision, DecisionKind},
    jsonl::{event_json, summary_json},
    text::{gpu_text, state_letter},
};
use crate::{
    event::decode::{Event, IoctlOutcome, MemKind, comm, cstr},
    gpu::{
        names,
        nvml::NvmlDiff,
        stats::{GpuDeviceStats, GpuProcessStats},
    },
};

/// The pseudo-thread that carries Keling's decisions about a process: far above
/// any real thread id (the kernel's limit is 2^22).
pub const SCHED_TRACK_TID_BASE: u32 = 0x4000_0000;

/// Bytes one process holds on one GPU, per kind.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Held {
    video: u64,
    host: u64,
    egm: u64,
}

impl Held {
    fn get(&mut self, kind: MemKind) -> &mut u64 {
        match kind {
            MemKind::Video => &mut self.video,
            MemKind::Host => &mut self.host,
            MemKind::Egm => &mut self.egm,
        }
    }
}

pub struct PerfettoSink {
    out: Box<dyn Write + Send>,
    /// Written the opening and at least one event (commas go before events).
    started: bool,
    /// Thread -> (switched in at, pid, cpu).
    on_cpu: BTreeMap<u32, (u64, u32, u32)>,
    /// Thread -> the kernel's CPU-time counter at its last switch-out.
    runtime: BTreeMap<u32, u64>,
    /// (pid, gpu) -> bytes held, from the events.
    held: BTreeMap<(u32, Option<u32>), Held>,
    /// (pid, gpu) -> time of the counter's last point.
    counter_ns: BTreeMap<(u32, Option<u32>), u64>,
    /// Names seen in the events: pid -> comm, tid -> (pid, comm).
    process_names: BTreeMap<u32, String>,
    thread_names: BTreeMap<u32, (u32, String)>,
    /// Task frozen since (pid -> (ts, reason)).
    frozen: BTreeMap<u32, (u64, String)>,
    last_ns: u64,
}

fn us(ts_ns: u64) -> f64 {
    ts_ns as f64 / 1000.0
}

/// The slice name for a time on the CPU that ended with `prev_state`.
pub fn left_cpu(prev_state: u64) -> &'static str {
    if prev_state & task_state::PREEMPTED != 0 || prev_state == 0 {
        "preempted"
    } else if prev_state & (task_state::EXIT_DEAD | task_state::EXIT_ZOMBIE) != 0 {
        "exit"
    } else if prev_state & (task_state::STOPPED | task_state::TRACED) != 0 {
        "stopped (T)"
    } else if prev_state & task_state::UNINTERRUPTIBLE != 0 {
        "blocked (D)"
    } else if prev_state & task_state::INTERRUPTIBLE != 0 {
        "sleep (S)"
    } else {
        "off cpu"
    }
}

fn gpu_name(gpu: Option<u32>) -> String {
    format!("{} memory", names::gpu(gpu))
}

impl PerfettoSink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            started: false,
            on_cpu: BTreeMap::new(),
            runtime: BTreeMap::new(),
            held: BTreeMap::new(),
            counter_ns: BTreeMap::new(),
            process_names: BTreeMap::new(),
            thread_names: BTreeMap::new(),
            frozen: BTreeMap::new(),
            last_ns: 0,
        }
    }

    fn write(&mut self, v: &Value) -> io::Result<()> {
        if self.started {
            self.out.write_all(b",\n")?;
        } else {
            self.out
                .write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
            self.started = true;
        }
        serde_json::to_writer(&mut self.out, v)?;
        Ok(())
    }

    fn instant(
        &mut self,
        ts_ns: u64,
        pid: u32,
        tid: u32,
        name: String,
        cat: &str,
        mut args: Value,
    ) -> io::Result<()> {
        if let Some(o) = args.as_object_mut() {
            o.insert("ts_ns".into(), json!(ts_ns));
        }
        self.write(&json!({
            "ph": "i", "s": "t", "name": name, "cat": cat, "ts": us(ts_ns),
            "pid": pid, "tid": tid, "args": args,
        }))
    }

    fn counter(&mut self, ts_ns: u64, pid: u32, gpu: Option<u32>) -> io::Result<()> {
        let h = self.held.get(&(pid, gpu)).copied().unwrap_or_default();
        // Events of different CPUs reach the ring buffer in the order they were
        // reserved, which can be a few microseconds off their timestamps' order;
        // a point is never put before the one it follows, so the counter shows
        // the values in the order they were computed.
        let last = self.counter_ns.entry((pid, gpu)).or_default();
        let ts_ns = ts_ns.max(*last);
        *last = ts_ns;
        let mut args = json!({"video_bytes": h.video, "host_bytes": h.host});
        if h.egm != 0 {
            args["egm_bytes"] = json!(h.egm);
        }
        self.write(&json!({
            "ph": "C", "name": gpu_name(gpu), "cat": "gpu", "ts": us(ts_ns), "pid": pid,
            "args": args,
        }))
    }

    /// Adds (or takes away) bytes held and writes the counter's new value.
    fn charge(
        &mut self,
        ts_ns: u64,
        pid: u32,
        gpu: Option<u32>,
        kind: MemKind,
        add: u64,
        sub: u64,
    ) -> io::Result<()> {
        if pid == 0 || (add == 0 && sub == 0) {
            return Ok(());
        }
        let held = self.held.entry((pid, gpu)).or_default();
        let v = held.get(kind);
        *v = v.saturating_add(add).saturating_sub(sub);
        self.counter(ts_ns, pid, gpu)
    }

    /// Ends `tid`'s slice on the CPU. A switch-out with no switch-in since the
    /// last one (the kernel reported none: see docs/limits.md) still gets its
    /// slice when the kernel's CPU-time counter is known at both: the thread ran
    /// without a break from the unreported switch-in to this switch-out, so the
    /// slice starts that much before it (marked `reconstructed`).
    fn switch_out(
        &mut self,
        ts_ns: u64,
        tid: u32,
        how: &str,
        prev_state: Option<u64>,
        out: Option<(u32, u32, u64)>,
    ) -> io::Result<()> {
        let last = match out {
            Some((_, _, runtime)) if runtime != 0 => self.runtime.insert(tid, runtime),
            _ => None,
        };
        let open = self.on_cpu.remove(&tid);
        let (since, pid, cpu, reconstructed) = match (open, out, last) {
            (Some((since, pid, cpu)), ..) => (since, pid, cpu, false),
            (None, Some((pid, cpu, runtime)), Some(last)) if runtime > last => {
                (ts_ns.saturating_sub(runtime - last), pid, cpu, true)
            }
            _ => return Ok(()),
        };
        let mut args = json!({"cpu": cpu});
        if reconstructed {
            args["reconstructed"] = json!(true);
        }
        if let Some(s) = prev_state {
            args["prev_state"] = json!(state_letter(s));
        }
        self.write(&json!({
            "ph": "X", "name": how, "cat": "cpu", "ts": us(since),
            "dur": us(ts_ns.saturating_sub(since)), "pid": pid, "tid": tid, "args": args,
        }))
    }

    /// The name of an instant for a GPU event worth one (None for plain ioctls).
    fn gpu_instant(event: &Event) -> Option<String> {
        match event {
            Event::GpuIoctl(e) => {
                let failed = e.status != 0 || e.ret < 0;
                let undecoded = matches!(e.outcome, IoctlOutcome::Undecoded(_));
                if !(failed || undecoded) {
                    return None;
                }
                let what = if failed { "FAILED" } else { "undecoded" };
                Some(format!("gpu {what} {}", names::call(e.call)))
            }
            Event::GpuAlloc(e) => Some(format!(
                "gpu alloc {} {} on {}",
                mib(e.bytes),
                names::mem_kind(e.mem_kind),
                names::gpu(e.gpu)
            )),
            Event::GpuFree(e) => Some(format!(
                "gpu free {} {}",
                mib(e.bytes),
                names::object_kind(e.kind)
            )),
            Event::GpuObject(e) => Some(format!("gpu object {}", names::object_kind(e.kind))),
            Event::GpuTeardown(e) => Some(format!(
                "gpu teardown ({})",
                names::teardown_reason(e.reason)
            )),
            other => gpu_text(other).map(|t| t.split(':').next().unwrap_or_default().to_owned()),
        }
    }

    fn decision_event(&mut self, d: &Decision) -> io::Result<()> {
        let tid = SCHED_TRACK_TID_BASE + d.pid;
        self.thread_names
            .entry(tid)
            .or_insert_with(|| (d.pid, "keling scheduler".to_owned()));
        let mut args = json!({"task": d.task});
        match &d.what {
            DecisionKind::Transition {
                reason, exit_code, ..
            } => {
                args["reason"] = json!(reason);
                args["exit_code"] = json!(exit_code);
                if d.thaws()
                    && let Some((since, why)) = self.frozen.remove(&d.pid)
                {
                    self.write(&json!({
                        "ph": "X", "name": format!("frozen by keling ({why})"), "cat": "keling",
                        "ts": us(since), "dur": us(d.ts_ns.saturating_sub(since)),
                        "pid": d.pid, "tid": tid, "args": {"task": d.task, "reason": why},
                    }))?;
                }
                if d.freezes() {
                    self.frozen.insert(d.pid, (d.ts_ns, reason.clone()));
                }
            }
            DecisionKind::Late {
                action,
                end_to_end_ns,
                timeout_ns,
                confirmed,
            } => {
                args["action"] = json!(action);
                args["end_to_end_ns"] = json!(end_to_end_ns);
                args["timeout_ns"] = json!(timeout_ns);
                args["confirmed"] = json!(confirmed);
            }
            DecisionKind::Other { detail, .. } => args["detail"] = json!(detail),
        }
        let name = d.text().trim_start_matches("keling: ").to_owned();
        self.instant(d.ts_ns, d.pid, tid, name, "keling", args)
    }

    fn metadata(&mut self, s: &Summary) -> io::Result<()> {
        for p in s.processes {
            if !p.comm.is_empty() {
                self.process_names.insert(p.pid, p.comm.clone());
            }
            for t in &p.threads {
                let name = if t.comm.is_empty() { &p.comm } else { &t.comm };
                self.thread_names
                    .entry(t.tid)
                    .or_insert_with(|| (p.pid, name.clone()));
            }
        }
        for (pid, name) in std::mem::take(&mut self.process_names) {
            self.write(&json!({
                "ph": "M", "name": "process_name", "pid": pid,
                "args": {"name": format!("{name} {pid}")},
            }))?;
        }
        for (tid, (pid, name)) in std::mem::take(&mut self.thread_names) {
            self.write(&json!({
                "ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                "args": {"name": format!("{name} {tid}")},
            }))?;
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{bytes} B")
    }
}

impl Sink for PerfettoSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        let h = *event.header();
        let ts = h.ts_ns;
        self.last_ns = self.last_ns.max(ts);
        match event {
            Event::Switch(e) => {
                if e.prev_pid != 0 {
                    self.switch_out(
                        ts,
                        e.prev_tid,
                        left_cpu(e.prev_state),
                        Some(e.prev_state),
                        Some((e.prev_pid, h.cpu, e.prev_runtime_ns)),
                    )?;
                }
                if e.next_pid != 0 {
                    // A switch-in without the switch-out before it (lost): the
                    // earlier slice's end is unknown, so it is left out.
                    self.on_cpu.insert(e.next_tid, (ts, e.next_pid, h.cpu));
                }
                return Ok(());
            }
            Event::Fork(e) => {
                if e.tracked == 0 {
                    return Ok(());
                }
                let c = comm(&e.comm);
                self.process_names
                    .entry(e.child_pid)
                    .or_insert_with(|| c.clone());
                self.thread_names.insert(e.child_tid, (e.child_pid, c));
                let name = if e.child_pid == h.pid {
                    format!("thread {}", e.child_tid)
                } else {
                    format!("fork pid {}", e.child_pid)
                };
                return self.instant(ts, h.pid, h.tid, name, "process", event_json(event));
            }
            Event::Exec(e) => {
                if e.tracked == 0 {
                    return Ok(());
                }
                let c = comm(&e.comm);
                self.process_names.insert(h.pid, c.clone());
                self.thread_names.insert(h.tid, (h.pid, c));
                let name = format!("exec {}", cstr(&e.filename));
                return self.instant(ts, h.pid, h.tid, name, "process", event_json(event));
            }
            Event::Exit(e) => {
                if e.tracked == 0 {
                    return Ok(());
                }
                let v = event_json(event);
                let name = format!(
                    "{} {}",
                    v["type"].as_str().unwrap_or("exit"),
                    v["exit_code"]
                );
                return self.instant(ts, h.pid, h.tid, name, "process", v);
            }
            _ => {}
        }
        if let Some(name) = Self::gpu_instant(event) {
            self.instant(ts, h.pid, h.tid, name, "gpu", event_json(event))?;
        }
        match event {
            Event::GpuAlloc(e) => self.charge(ts, h.pid, e.gpu, e.mem_kind, e.bytes, 0),
            Event::GpuFree(e) => match (e.freed_pid, e.mem_kind) {
                (Some(pid), Some(kind)) => self.charge(ts, pid, e.gpu, kind, 0, e.bytes),
                _ => Ok(()),
            },
            Event::GpuTeardown(e) => {
                let (pid, gpu) = (e.owner_pid, e.gpu);
                if pid == 0 || e.bytes + e.host_bytes + e.egm_bytes == 0 {
                    return Ok(());
                }
                let held = self.held.entry((pid, gpu)).or_default();
                held.video = held.video.saturating_sub(e.bytes);
                held.host = held.host.saturating_sub(e.host_bytes);
                held.egm = held.egm.saturating_sub(e.egm_bytes);
                self.counter(ts, pid, gpu)
            }
            Event::GpuCharge(e) => {
                self.charge(ts, e.from_pid, e.gpu, e.mem_kind, 0, e.bytes)?;
                self.charge(ts, e.to_pid, e.gpu, e.mem_kind, e.bytes, 0)
            }
            _ => Ok(()),
        }
    }

    fn drops(&mut self, ts_ns: u64, per_cpu: &[u64]) -> io::Result<()> {
        let total: u64 = per_cpu.iter().sum();
        if total == 0 {
            return Ok(());
        }
        self.write(&json!({
            "ph": "i", "s": "g", "name": format!("keling: {total} events lost in the kernel"),
            "cat": "keling", "ts": us(ts_ns), "pid": 0, "tid": 0,
            "args": {"total": total, "per_cpu": per_cpu},
        }))
    }

    fn gpu_snapshot(
        &mut self,
        _ts_ns: u64,
        _seq: u64,
        _processes: &BTreeMap<u32, GpuProcessStats>,
        _gpus: &[GpuDeviceStats],
    ) -> io::Result<()> {
        Ok(())
    }

    fn nvml_check(&mut self, _ts_ns: u64, _diffs: &[NvmlDiff]) -> io::Result<()> {
        Ok(())
    }

    fn decision(&mut self, d: &Decision) -> io::Result<()> {
        self.last_ns = self.last_ns.max(d.ts_ns);
        self.decision_event(d)
    }

    fn summary(&mut self, s: &Summary) -> io::Result<()> {
        let end = s.ts_ns.max(self.last_ns);
        // Threads still on a CPU, tasks still frozen: closed at the end.
        for tid in self.on_cpu.keys().copied().collect::<Vec<_>>() {
            self.switch_out(end, tid, "running at the end of the trace", None, None)?;
        }
        for (pid, (since, why)) in std::mem::take(&mut self.frozen) {
            self.write(&json!({
                "ph": "X", "name": format!("frozen by keling ({why})"), "cat": "keling",
                "ts": us(since), "dur": us(end.saturating_sub(since)), "pid": pid,
                "tid": SCHED_TRACK_TID_BASE + pid, "args": {"reason": why, "still_frozen": true},
            }))?;
        }
        // The kernel's exact figures against what the events added up to.
        for p in s.processes {
            for g in &p.gpu.gpus {
                let gpu = (g.gpu < keling_common::NO_GPU).then_some(g.gpu);
                let exact = Held {
                    video: g.bytes,
                    host: g.host_bytes,
                    egm: g.egm_bytes,
                };
                let ours = self.held.get(&(p.pid, gpu)).copied().unwrap_or_default();
                if ours != exact {
                    self.held.insert((p.pid, gpu), exact);
                    self.instant(
                        end,
                        p.pid,
                        p.pid,
                        format!("keling: {} corrected to the kernel's figure", gpu_name(gpu)),
                        "keling",
                        json!({"from_events": {"video_bytes": ours.video, "host_bytes": ours.host,
                               "egm_bytes": ours.egm},
                               "exact": {"video_bytes": exact.video, "host_bytes": exact.host,
                               "egm_bytes": exact.egm}}),
                    )?;
                    self.counter(end, p.pid, gpu)?;
                }
            }
        }
        self.metadata(s)?;
        if !self.started {
            self.out
                .write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
            self.started = true;
        }
        self.out
            .write_all(b"\n],\"metadata\":{\"keling_summary\":")?;
        serde_json::to_writer(&mut self.out, &summary_json(s))?;
        self.out.write_all(b"}}\n")
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use keling_common::{EventHeader, EventKind, SwitchEvent};

    use super::*;
    use crate::{
        output::{capture::Capture, test_events as ev},
        process_model::ProcessStats,
    };

    fn switch(ts: u64, prev: (u32, u32), next: (u32, u32), prev_state: u64) -> Event {
        switch_counted(ts, prev, next, prev_state, 0)
    }

    /// A switch whose `prev` had `runtime` ns of CPU by the kernel's counter.
    fn switch_counted(
        ts: u64,
        prev: (u32, u32),
        next: (u32, u32),
        prev_state: u64,
        runtime: u64,
    ) -> Event {
        Event::Switch(SwitchEvent {
            header: EventHeader {
                kind: EventKind::Switch as u32,
                cpu: 1,
                ts_ns: ts,
                pid: prev.0,
                tid: prev.1,
            },
            prev_tid: prev.1,
            prev_pid: prev.0,
            next_tid: next.1,
            next_pid: next.0,
            prev_state,
            prev_runtime_ns: runtime,
        })
    }

    #[test]
    fn a_slice_whose_switch_in_was_never_reported_is_rebuilt_from_the_counter() {
        let events = [
            switch_counted(1_000, (0, 0), (42, 43), 0, 0),
            switch_counted(3_000, (42, 43), (0, 0), task_state::PREEMPTED, 2_000),
            // Switched in at 5 us with no event; out at 8 us, 3 us more CPU.
            switch_counted(8_000, (42, 43), (0, 0), task_state::PREEMPTED, 5_000),
            // No counter: nothing can be said about the start.
            switch_counted(9_000, (42, 43), (0, 0), task_state::PREEMPTED, 0),
        ];
        let procs = [ProcessStats {
            pid: 42,
            ..Default::default()
        }];
        let v = run(&events, &procs);
        let slices: Vec<(f64, f64, bool)> = of(&v, "X")
            .map(|s| {
                (
                    s["ts"].as_f64().unwrap(),
                    s["dur"].as_f64().unwrap(),
                    s["args"]["reconstructed"] == true,
                )
            })
            .collect();
        assert_eq!(slices, [(1.0, 2.0, false), (5.0, 3.0, true)]);
    }

    fn run(events: &[Event], procs: &[ProcessStats]) -> Value {
        let (capture, out) = Capture::new();
        let mut sink = PerfettoSink::new(Box::new(capture));
        for e in events {
            sink.event(e).unwrap();
        }
        sink.summary(&Summary {
            ts_ns: 10_000,
            duration_ns: 1,
            events: events.len() as u64,
            drops: 0,
            decode_errors: 0,
            processes: procs,
            gpus: &[],
            undecoded: &[],
            table_full_at: &[],
            calls: &Default::default(),
            ioctl_backend: "tracepoints",
        })
        .unwrap();
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn of<'a>(v: &'a Value, ph: &'a str) -> impl Iterator<Item = &'a Value> {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(move |e| e["ph"] == ph)
    }

    #[test]
    fn slices_instants_counters_names() {
        let events = [
            switch(1_000, (0, 0), (42, 43), 0),
            ev::alloc(MemKind::Video),
            switch(3_000, (42, 43), (0, 0), task_state::PREEMPTED),
            switch(4_000, (0, 0), (42, 43), 0),
            switch(6_000, (42, 43), (0, 0), task_state::INTERRUPTIBLE),
            ev::free(Some(42)),
            switch(7_000, (0, 0), (42, 43), 0),
        ];
        let procs = [ProcessStats {
            pid: 42,
            comm: "cuda".into(),
            ..Default::default()
        }];
        let v = run(&events, &procs);
        let slices: Vec<(&str, f64, f64)> = of(&v, "X")
            .map(|s| {
                (
                    s["name"].as_str().unwrap(),
                    s["ts"].as_f64().unwrap(),
                    s["dur"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            slices,
            [
                ("preempted", 1.0, 2.0),
                ("sleep (S)", 4.0, 2.0),
                ("running at the end of the trace", 7.0, 3.0)
            ]
        );
        let counters: Vec<u64> = of(&v, "C")
            .map(|c| c["args"]["video_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(counters, [4 << 20, 0]);
        let instants: Vec<&str> = of(&v, "i").map(|i| i["name"].as_str().unwrap()).collect();
        assert_eq!(
            instants,
            [
                "gpu alloc 4.0 MiB video on gpu0",
                "gpu free 4.0 MiB video_memory"
            ]
        );
        let alloc = of(&v, "i").next().unwrap();
        assert_eq!(alloc["args"]["handle"], 0xc1d0_0010u32);
        assert_eq!(alloc["args"]["ts_ns"], 1_000);
        let names: Vec<&str> = of(&v, "M")
            .map(|m| m["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["cuda 42"]);
        assert_eq!(v["metadata"]["keling_summary"]["type"], "summary");
    }

    #[test]
    fn counters_corrected_to_the_exact_figures() {
        let procs = [ProcessStats {
            pid: 42,
            gpu: GpuProcessStats {
                gpus: vec![GpuDeviceStats {
                    gpu: 0,
                    bytes: 8 << 20,
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        }];
        let v = run(&[ev::alloc(MemKind::Video)], &procs);
        let counters: Vec<u64> = of(&v, "C")
            .map(|c| c["args"]["video_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(counters, [4 << 20, 8 << 20]);
        assert!(
            of(&v, "i")
                .any(|i| i["name"] == "keling: gpu0 memory corrected to the kernel's figure")
        );
    }

    #[test]
    fn an_empty_trace_is_still_a_trace() {
        let v = run(&[], &[]);
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn frozen_slices_from_decisions() {
        let mut reader = crate::output::decision::SchedLogReader::default();
        let (capture, out) = Capture::new();
        let mut sink = PerfettoSink::new(Box::new(capture));
        for (ts, t) in [(2_000, "RUNNING→PREEMPTED"), (5_000, "PREEMPTED→RUNNING")] {
            let line = format!(
                r#"{{"event_id":1,"state_transition":"{t}","timestamp_ns":{ts},"task":1,"name":"x","pid":42,"gpu":0,"priority":8,"reason":"round_robin","exit_code":null}}"#
            );
            sink.decision(&reader.line(&line, 0).unwrap()).unwrap();
        }
        sink.summary(&Summary {
            ts_ns: 9_000,
            duration_ns: 1,
            events: 0,
            drops: 0,
            decode_errors: 0,
            processes: &[],
            gpus: &[],
            undecoded: &[],
            table_full_at: &[],
            calls: &Default::default(),
            ioctl_backend: "tracepoints",
        })
        .unwrap();
        let v: Value = serde_json::from_slice(&out.lock().unwrap()).unwrap();
        let frozen: Vec<&Value> = of(&v, "X").collect();
        assert_eq!(frozen.len(), 1);
        assert_eq!(frozen[0]["name"], "frozen by keling (round_robin)");
        assert_eq!(
            (frozen[0]["ts"].as_f64(), frozen[0]["dur"].as_f64()),
            (Some(2.0), Some(3.0))
        );
        assert_eq!(frozen[0]["tid"], SCHED_TRACK_TID_BASE + 42);
    }
}
