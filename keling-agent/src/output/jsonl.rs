//! JSON lines: one object per line, each with `type` and `ts_ns` (kernel
//! CLOCK_MONOTONIC); the last line is the `summary`.
use std::io::{self, Write};

use keling_common::EventKind;
use serde_json::{Value, json};

use super::{Sink, Summary, text::state_letter};
use crate::{
    event::decode::{Event, ExitStatus, comm, cstr},
    gpu::{
        names,
        nvml::NvmlDiff,
        stats::{GpuDeviceStats, GpuProcessStats},
    },
};

pub struct JsonlSink {
    out: Box<dyn Write + Send>,
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

fn undecoded_json(per_reason: &[u64]) -> Value {
    let mut v = json!({});
    for (i, n) in per_reason.iter().enumerate() {
        v[names::undecoded_reason(i as u32)] = json!(n);
    }
    v
}

impl JsonlSink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self { out }
    }

    fn line(&mut self, v: &Value) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, v)?;
        self.out.write_all(b"\n")
    }
}

impl Sink for JsonlSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.line(&event_json(event))
    }

    fn drops(&mut self, ts_ns: u64, per_cpu: &[u64]) -> io::Result<()> {
        let total: u64 = per_cpu.iter().sum();
        self.line(&json!({
            "type": "drops", "ts_ns": ts_ns, "total": total, "per_cpu": per_cpu,
        }))
    }

    fn gpu_snapshot(
        &mut self,
        ts_ns: u64,
        seq: u64,
        processes: &std::collections::BTreeMap<u32, GpuProcessStats>,
        gpus: &[GpuDeviceStats],
    ) -> io::Result<()> {
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

    fn nvml_check(&mut self, ts_ns: u64, diffs: &[NvmlDiff]) -> io::Result<()> {
        if diffs.is_empty() {
            return Ok(());
        }
        self.line(&json!({"type": "nvml_check", "ts_ns": ts_ns, "processes": diffs}))
    }

    fn summary(&mut self, s: &Summary) -> io::Result<()> {
        self.line(&json!({
            "type": "summary",
            "ts_ns": s.ts_ns,
            "duration_ns": s.duration_ns,
            "events": s.events,
            "drops": s.drops,
            "decode_errors": s.decode_errors,
            "undecoded": undecoded_json(s.undecoded),
            "gpus": s.gpus,
            "processes": s.processes,
        }))
    }

    fn flush(&mut self) -> io::Result<()> {
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
}
