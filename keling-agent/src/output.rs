//! Trace output: a readable text timeline or JSON lines.
//!
//! jsonl: one object per line, each with `type` and `ts_ns` (kernel CLOCK_MONOTONIC);
//! the last line is the `summary`.
use std::io::{self, Write};

use serde_json::{Value, json};

use keling_common::EventKind;

use crate::{
    decode::{Event, ExitStatus, comm, cstr},
    gpu_names as names,
    model::{GpuDeviceStats, ProcessStats},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A live timeline for people, then a per-thread summary table.
    Text,
    /// One JSON object per line; the last is `{"type":"summary",...}`.
    Jsonl,
}

/// The end-of-trace figures.
pub struct Summary<'a> {
    pub ts_ns: u64,
    pub duration_ns: u64,
    pub events: u64,
    pub drops: u64,
    pub decode_errors: u64,
    pub processes: &'a [ProcessStats],
    /// Per-GPU totals across the traced processes.
    pub gpus: &'a [GpuDeviceStats],
    /// Undecoded calls per reason.
    pub undecoded: &'a [u64],
}

pub struct Output {
    format: Format,
    out: Box<dyn Write + Send>,
    /// Timestamp the text timeline counts from.
    start_ns: u64,
    /// Show context switches in the text timeline (they are always in jsonl).
    text_switches: bool,
}

/// sched_switch's one-letter state, as `ps` and the tracepoint print it.
fn state_letter(prev_state: u64) -> &'static str {
    use keling_common::task_state::*;
    const LETTERS: &[(u64, &str)] = &[
        (INTERRUPTIBLE, "S"),
        (UNINTERRUPTIBLE, "D"),
        (STOPPED, "T"),
        (TRACED, "t"),
        (EXIT_DEAD, "X"),
        (EXIT_ZOMBIE, "Z"),
        (PARKED, "P"),
        (IDLE, "I"),
    ];
    if prev_state & PREEMPTED != 0 {
        return "R+";
    }
    LETTERS
        .iter()
        .find(|(bit, _)| prev_state & bit != 0)
        .map_or("R", |(_, l)| l)
}

fn opt_pid(pid: u32) -> Value {
    if pid == 0 { Value::Null } else { json!(pid) }
}

/// The JSON object for one event.
pub fn event_json(event: &Event) -> Value {
    let h = event.header();
    let mut v = match event {
        Event::Fork(e) => json!({
            "type": "fork",
            "child_pid": e.child_pid,
            "child_tid": e.child_tid,
            "thread": e.child_pid == h.pid,
            "comm": comm(&e.comm),
        }),
        Event::Exec(e) => json!({
            "type": "exec",
            "old_tid": e.old_tid,
            "comm": comm(&e.comm),
            "filename": cstr(&e.filename),
        }),
        Event::Exit(e) => {
            let status = ExitStatus::from_wait_status(e.exit_status);
            json!({
                "type": if e.group_dead != 0 { "exit" } else { "thread_exit" },
                "comm": comm(&e.comm),
                "exit_code": status.code(),
                "signal": status.signal(),
            })
        }
        Event::Switch(e) => json!({
            "type": "switch",
            "prev_tid": e.prev_tid,
            "prev_pid": opt_pid(e.prev_pid),
            "prev_state": state_letter(e.prev_state),
            "voluntary": e.voluntary(),
            "next_tid": e.next_tid,
            "next_pid": opt_pid(e.next_pid),
        }),
        Event::GpuFile(e) => {
            let ty = match EventKind::from_u32(h.kind) {
                Some(EventKind::GpuOpen) => "gpu_open",
                Some(EventKind::GpuDup) => "gpu_dup",
                _ => "gpu_close",
            };
            let mut v = json!({
                "type": ty, "fd": e.fd, "device": names::device(e.device), "file_id": e.file_id,
            });
            match ty {
                "gpu_open" => v["cloexec"] = json!(e.arg != 0),
                "gpu_dup" => v["src_fd"] = json!(e.arg as i32),
                _ => v["released"] = json!(e.released != 0),
            }
            v
        }
        Event::Gpu(e) => gpu_json(h.kind, e),
    };
    let obj = v.as_object_mut().expect("object");
    obj.insert("ts_ns".into(), json!(h.ts_ns));
    obj.insert("cpu".into(), json!(h.cpu));
    obj.insert("pid".into(), json!(h.pid));
    obj.insert("tid".into(), json!(h.tid));
    v
}

fn gpu_json(kind: u32, e: &keling_common::GpuEvent) -> Value {
    match EventKind::from_u32(kind) {
        Some(EventKind::GpuAlloc) => json!({
            "type": "gpu_alloc", "client": e.client, "parent": e.parent, "handle": e.handle,
            "class": e.class, "kind": names::kind(e.kind), "gpu": names::gpu(e.gpu),
            "bytes": e.bytes, "call": names::call(0, e.escape), "via_xfer": e.via_xfer != 0,
        }),
        Some(EventKind::GpuFree) => json!({
            "type": "gpu_free", "client": e.client, "handle": e.handle, "class": e.class,
            "kind": names::kind(e.kind), "gpu": names::gpu(e.gpu), "bytes": e.bytes,
            "owner_pid": e.owner_pid, "call": names::call(0, e.escape),
        }),
        Some(EventKind::GpuObject) => json!({
            "type": "gpu_object", "client": e.client, "parent": e.parent, "handle": e.handle,
            "class": e.class, "kind": names::kind(e.kind), "gpu": names::gpu(e.gpu),
        }),
        Some(EventKind::GpuTeardown) => json!({
            "type": "gpu_teardown", "client": e.client, "reason": names::teardown_reason(e.reason),
            "owner_pid": e.owner_pid, "gpu": names::gpu(e.gpu), "device": e.handle,
            "bytes": e.bytes, "host_bytes": e.host_bytes, "objects": e.control_cmd,
        }),
        _ => {
            let device = if e.escape >= 0x3000_0000 || e.cmd == e.escape {
                keling_common::device_file::UVM
            } else {
                0
            };
            let mut v = json!({
                "type": "gpu_ioctl", "fd": e.fd, "call": names::call(device, e.escape),
                "cmd": e.cmd, "status": e.status, "ret": e.ret, "via_xfer": e.via_xfer != 0,
            });
            if e.bytes != 0 {
                v["bytes"] = json!(e.bytes);
            }
            if e.escape == keling_common::nvidia::escape::CONTROL && device == 0 {
                v["control_cmd"] = json!(e.control_cmd);
                v["client"] = json!(e.client);
                v["object"] = json!(e.handle);
            }
            if e.reason != 0 {
                v["undecoded"] = json!(names::undecoded_reason(e.reason - 1));
            }
            v
        }
    }
}

/// One line of text timeline for a GPU event.
fn gpu_text(kind: u32, e: &keling_common::GpuEvent) -> String {
    let gpu = names::gpu(e.gpu).map_or("gpu?".to_string(), |g| format!("gpu{g}"));
    match EventKind::from_u32(kind) {
        Some(EventKind::GpuAlloc) => format!(
            "gpu alloc {} bytes {} on {gpu}: handle {:#x} class {:#x} ({})",
            e.bytes,
            names::kind(e.kind),
            e.handle,
            e.class,
            names::call(0, e.escape)
        ),
        Some(EventKind::GpuFree) => format!(
            "gpu free {} bytes {} on {gpu}: handle {:#x} (allocated by {})",
            e.bytes,
            names::kind(e.kind),
            e.handle,
            e.owner_pid
        ),
        Some(EventKind::GpuObject) => format!(
            "gpu object {} {:#x} class {:#x} under {:#x} on {gpu}",
            names::kind(e.kind),
            e.handle,
            e.class,
            e.parent
        ),
        Some(EventKind::GpuTeardown) => format!(
            "gpu teardown of client {:#x} ({}): {} bytes video, {} host, {} objects of pid {} on {gpu}",
            e.client,
            names::teardown_reason(e.reason),
            e.bytes,
            e.host_bytes,
            e.control_cmd,
            e.owner_pid
        ),
        _ => {
            let device = if e.escape >= 0x3000_0000 || e.cmd == e.escape {
                keling_common::device_file::UVM
            } else {
                0
            };
            let mut t = format!(
                "gpu ioctl {} status {:#x} ret {}",
                names::call(device, e.escape),
                e.status,
                e.ret
            );
            if e.reason != 0 {
                t.push_str(&format!(
                    " (undecoded: {})",
                    names::undecoded_reason(e.reason - 1)
                ));
            }
            t
        }
    }
}

fn undecoded_json(per_reason: &[u64]) -> Value {
    let mut v = json!({});
    for (i, n) in per_reason.iter().enumerate() {
        v[names::undecoded_reason(i as u32)] = json!(n);
    }
    v
}

impl Output {
    pub fn new(
        format: Format,
        out: Box<dyn Write + Send>,
        start_ns: u64,
        text_switches: bool,
    ) -> Self {
        Self {
            format,
            out,
            start_ns,
            text_switches,
        }
    }

    fn line(&mut self, v: &Value) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, v)?;
        self.out.write_all(b"\n")
    }

    pub fn event(&mut self, event: &Event) -> io::Result<()> {
        if self.format == Format::Jsonl {
            return self.line(&event_json(event));
        }
        let h = event.header();
        let text = match event {
            Event::Fork(e) if e.child_pid == h.pid => format!("thread {}", e.child_tid),
            Event::Fork(e) => format!("fork -> pid {}", e.child_pid),
            Event::Exec(e) => format!("exec {} ({})", cstr(&e.filename), comm(&e.comm)),
            Event::Exit(e) => {
                let status = ExitStatus::from_wait_status(e.exit_status);
                let what = if e.group_dead != 0 {
                    "exit"
                } else {
                    "thread exit"
                };
                match status {
                    ExitStatus::Exited(c) => format!("{what} code {c}"),
                    ExitStatus::Signaled {
                        signal,
                        core_dumped,
                    } => format!(
                        "{what} killed by signal {signal}{}",
                        if core_dumped { " (core dumped)" } else { "" }
                    ),
                }
            }
            Event::Switch(e) => {
                if !self.text_switches {
                    return Ok(());
                }
                format!(
                    "switch {} [{}] -> {}",
                    e.prev_tid,
                    state_letter(e.prev_state),
                    e.next_tid
                )
            }
            Event::GpuFile(e) => {
                let what = match EventKind::from_u32(h.kind) {
                    Some(EventKind::GpuOpen) => "open",
                    Some(EventKind::GpuDup) => "dup",
                    _ if e.released != 0 => "close (file released)",
                    _ => "close",
                };
                format!("gpu {what} fd {} {}", e.fd, names::device(e.device))
            }
            Event::Gpu(e) => gpu_text(h.kind, e),
        };
        let secs = h.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let comm = match event {
            Event::Fork(e) => comm(&e.comm),
            Event::Exec(e) => comm(&e.comm),
            Event::Exit(e) => comm(&e.comm),
            Event::Switch(_) | Event::GpuFile(_) | Event::Gpu(_) => String::new(),
        };
        writeln!(
            self.out,
            "{secs:>11.6} cpu{:<2} {:>7}/{:<7} {comm:<16} {text}",
            h.cpu, h.pid, h.tid
        )
    }

    /// Events lost in the kernel so far (only written when there are any, and at the end).
    pub fn drops(&mut self, ts_ns: u64, per_cpu: &[u64]) -> io::Result<()> {
        let total: u64 = per_cpu.iter().sum();
        match self.format {
            Format::Jsonl => self.line(&json!({
                "type": "drops", "ts_ns": ts_ns, "total": total, "per_cpu": per_cpu,
            })),
            Format::Text if total > 0 => writeln!(
                self.out,
                "keling: {total} events lost in the kernel (ring buffer full); per CPU {per_cpu:?}"
            ),
            Format::Text => Ok(()),
        }
    }

    pub fn summary(&mut self, s: &Summary) -> io::Result<()> {
        if self.format == Format::Jsonl {
            return self.line(&json!({
                "type": "summary",
                "ts_ns": s.ts_ns,
                "duration_ns": s.duration_ns,
                "events": s.events,
                "drops": s.drops,
                "decode_errors": s.decode_errors,
                "undecoded": undecoded_json(s.undecoded),
                "gpus": s.gpus,
                "processes": s.processes,
            }));
        }
        let out = &mut self.out;
        writeln!(out)?;
        writeln!(
            out,
            "{:>7} {:>7} {:<16} {:>12} {:>9} {:>9} {:>9} {:>6}",
            "PID", "TID", "COMM", "ON-CPU ms", "SWITCHES", "VOLUNT", "INVOL", "EXIT"
        )?;
        for p in s.processes {
            for t in &p.threads {
                let exit = match (t.tid == p.pid, p.exit_code, t.exit_code) {
                    (true, Some(c), _) | (false, _, Some(c)) => c.to_string(),
                    _ => "-".into(),
                };
                writeln!(
                    out,
                    "{:>7} {:>7} {:<16} {:>12.3} {:>9} {:>9} {:>9} {:>6}",
                    p.pid,
                    t.tid,
                    if t.comm.is_empty() { &p.comm } else { &t.comm },
                    t.on_cpu_ns as f64 / 1e6,
                    t.switches,
                    t.voluntary_switches,
                    t.involuntary_switches,
                    exit
                )?;
            }
        }
        let gpu_procs: Vec<&ProcessStats> = s
            .processes
            .iter()
            .filter(|p| p.gpu.gpu_allocs > 0 || p.gpu.undecoded > 0)
            .collect();
        if !gpu_procs.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{:>7} {:<16} {:>14} {:>14} {:>12} {:>8} {:>8} {:>9}",
                "PID", "COMM", "GPU MEM", "GPU PEAK", "HOST PINNED", "ALLOCS", "FREES", "UNDECODED"
            )?;
            for p in gpu_procs {
                let g = &p.gpu;
                writeln!(
                    out,
                    "{:>7} {:<16} {:>14} {:>14} {:>12} {:>8} {:>8} {:>9}{}",
                    p.pid,
                    p.comm,
                    g.gpu_mem_bytes,
                    g.gpu_mem_peak_bytes,
                    g.gpu_host_bytes,
                    g.gpu_allocs,
                    g.gpu_frees,
                    g.undecoded,
                    if g.gpu_mem_held_after_exit {
                        "  (exited; still held through an open file another process keeps)"
                    } else {
                        ""
                    }
                )?;
            }
        }
        writeln!(
            out,
            "{} processes, {} events in {:.3} s, {} lost in the kernel, {} undecodable",
            s.processes.len(),
            s.events,
            s.duration_ns as f64 / 1e9,
            s.drops,
            s.decode_errors
        )
    }

    /// The GPU accounting right now (on SIGUSR1): jsonl only.
    pub fn gpu_snapshot(
        &mut self,
        ts_ns: u64,
        seq: u64,
        processes: &std::collections::BTreeMap<u32, crate::model::GpuProcessStats>,
        gpus: &[GpuDeviceStats],
    ) -> io::Result<()> {
        if self.format != Format::Jsonl {
            return Ok(());
        }
        let procs: Vec<Value> = processes
            .iter()
            .map(|(pid, g)| {
                let mut v = serde_json::to_value(g).expect("serialisable");
                v["pid"] = json!(pid);
                v
            })
            .collect();
        self.line(&json!({
            "type": "gpu_snapshot", "ts_ns": ts_ns, "seq": seq, "gpus": gpus, "processes": procs,
        }))?;
        self.out.flush()
    }

    /// Keling's per-process bytes next to NVML's (nothing when NVML is absent or
    /// neither side sees a process).
    pub fn nvml_check(&mut self, ts_ns: u64, diffs: &[crate::nvml::NvmlDiff]) -> io::Result<()> {
        if diffs.is_empty() {
            return Ok(());
        }
        match self.format {
            Format::Jsonl => {
                self.line(&json!({"type": "nvml_check", "ts_ns": ts_ns, "processes": diffs}))
            }
            Format::Text => {
                for d in diffs {
                    writeln!(
                        self.out,
                        "nvml check: pid {} gpu{}: NVML {} bytes, Keling {} bytes, difference {}",
                        d.pid,
                        d.gpu,
                        d.nvml_bytes.map_or("n/a".into(), |b| b.to_string()),
                        d.keling_bytes,
                        d.diff_bytes.map_or("n/a".into(), |b| b.to_string())
                    )?;
                }
                Ok(())
            }
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use keling_common::*;

    use super::*;

    #[test]
    fn jsonl_event_has_type_and_ts() {
        let e = Event::Exit(ExitEvent {
            header: EventHeader {
                kind: EventKind::Exit as u32,
                cpu: 1,
                ts_ns: 5,
                pid: 9,
                tid: 9,
            },
            exit_status: 3 << 8,
            group_dead: 1,
            tracked: 1,
            _reserved: 0,
            comm: [b'x'; COMM_LEN],
        });
        let v = event_json(&e);
        assert_eq!(v["type"], "exit");
        assert_eq!(v["ts_ns"], 5);
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["signal"], Value::Null);
        assert_eq!(v["pid"], 9);
    }

    #[test]
    fn state_letters() {
        assert_eq!(state_letter(0), "R");
        assert_eq!(state_letter(keling_common::task_state::PREEMPTED), "R+");
        assert_eq!(state_letter(1), "S");
        assert_eq!(state_letter(0x20), "Z");
    }
}
