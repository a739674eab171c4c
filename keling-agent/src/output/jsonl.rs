//! JSON lines: one object per line, each with `type` and `ts_ns` (kernel
//! CLOCK_MONOTONIC); the last line is the `summary`.
//!
//! An RM control reads `"control_cmd": 0x20800110` (the number) and
//! `"control": "0x20800110 NV2080_CTRL_CMD_GPU_GET_NAME_STRING"` (the number alone
//! when driver 535 has no name for it). The summary counts every call the traced
//! processes made exactly, from the kernel's counters (see
//! `gpu::stats::CallCounts`), each keyed by its name as `gpu::names` gives it:
//! `"escapes": {"RM_CONTROL": {"nr": 42, "calls": n}, "RM_0x99": {...}, ...}`,
//! `"uvm_commands": {"UVM_INITIALIZE": {"nr": 805306369, "calls": n}, ...}`,
//! `"other_ioctls": {"NOT_RM_0x1234": {"cmd": 4660, "calls": n}}` (commands on
//! nvidiactl / nvidiaN that are no RM escape), `"controls": {"0x20800110": {"name":
//! "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "calls": n}, ...}` (`name` null when
//! unknown) and `"calls_uncounted"` (calls the kernel had no room to count by
//! number).
use std::io::{self, Write};

use keling_common::active_cause::ActiveCause;
use serde_json::{Value, json};

use super::{Sink, Summary, text::state_letter};
use crate::{
    event::decode::{
        Call, DeviceFile, Event, ExitStatus, GpuIoctlEvent, IoctlOutcome, OpenHow, RefHow, comm,
        cstr,
    },
    gpu::{
        names,
        nvml::NvmlDiff,
        stats::{CallCounts, GpuDeviceStats, GpuProcessStats},
    },
};

pub struct JsonlSink {
    out: Box<dyn Write + Send>,
    /// The line being written: serde_json writes a token at a time, and each
    /// write to `out` (a `dyn Write`) is a call and a copy of its own.
    buf: Vec<u8>,
    call_names: Memo<Call, String>,
    device_names: Memo<DeviceFile, String>,
    control_labels: Memo<u32, String>,
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
            "prev_runtime_ns": (e.prev_runtime_ns != 0).then_some(e.prev_runtime_ns),
        }),
        Event::Active(e) => json!({
            "type": "active",
            "root_pid": e.root_pid,
            "cause": ActiveCause::from_raw(e.cause).map_or("unknown", ActiveCause::name),
        }),
        Event::GpuOpen(e) => {
            let mut v = json!({
                "type": "gpu_open", "fd": e.fd, "device": names::device(e.device),
                "file_id": e.file_id, "how": names::open_how(e.how),
            });
            if let OpenHow::Dup { src_fd } = e.how {
                v["src_fd"] = json!(src_fd);
            }
            v
        }
        Event::GpuClose(e) => json!({
            "type": "gpu_close", "fd": e.fd, "device": names::device(e.device),
            "file_id": e.file_id, "released": e.released,
        }),
        Event::GpuAlloc(e) => json!({
            "type": "gpu_alloc", "client": e.client, "parent": e.parent, "handle": e.handle,
            "class": e.class, "kind": names::object_kind(e.kind()),
            "mem_kind": names::mem_kind(e.mem_kind), "gpu": e.gpu, "bytes": e.bytes,
            "call": names::escape(e.escape), "via_xfer": e.via_xfer,
        }),
        Event::GpuFree(e) => json!({
            "type": "gpu_free", "client": e.client, "handle": e.handle, "class": e.class,
            "kind": names::object_kind(e.kind), "mem_kind": e.mem_kind.map(names::mem_kind),
            "gpu": e.gpu, "bytes": e.bytes, "freed_pid": e.freed_pid,
            "call": names::escape(e.escape),
        }),
        Event::GpuObject(e) => json!({
            "type": "gpu_object", "client": e.client, "parent": e.parent, "handle": e.handle,
            "class": e.class, "kind": names::object_kind(e.kind), "gpu": e.gpu,
        }),
        Event::GpuTeardown(e) => json!({
            "type": "gpu_teardown", "client": e.client,
            "reason": names::teardown_reason(e.reason), "owner_pid": e.owner_pid,
            "gpu": e.gpu, "device": e.device, "sub": e.sub, "bytes": e.bytes,
            "host_bytes": e.host_bytes, "egm_bytes": e.egm_bytes, "objects": e.objects,
        }),
        Event::GpuIoctl(e) => ioctl_json(e),
        Event::GpuRef(e) => {
            let (src_client, src_handle) = match e.how {
                RefHow::Dup {
                    src_client,
                    src_handle,
                } => (Some(src_client), Some(src_handle)),
                RefHow::Import => (None, None),
            };
            json!({
                "type": "gpu_ref", "client": e.client, "parent": e.parent, "handle": e.handle,
                "how": names::ref_how(e.how), "src_client": src_client, "src_handle": src_handle,
                "gpu": e.gpu, "mem_kind": e.mem_kind.map(names::mem_kind), "bytes": e.bytes,
            })
        }
        Event::GpuExport(e) => json!({
            "type": "gpu_export", "client": e.client, "handle": e.handle, "file_id": e.file_id,
            "position": e.position, "gpu": e.gpu, "bytes": e.bytes,
        }),
        Event::GpuCharge(e) => json!({
            "type": "gpu_charge", "from_pid": e.from_pid, "to_pid": e.to_pid, "gpu": e.gpu,
            "mem_kind": names::mem_kind(e.mem_kind), "client": e.client, "handle": e.handle,
            "bytes": e.bytes,
        }),
    };
    let obj = v.as_object_mut().expect("object");
    obj.insert("ts_ns".into(), json!(h.ts_ns));
    obj.insert("cpu".into(), json!(h.cpu));
    obj.insert("pid".into(), json!(h.pid));
    obj.insert("tid".into(), json!(h.tid));
    v
}

fn ioctl_json(e: &GpuIoctlEvent) -> Value {
    let mut v = json!({
        "type": "gpu_ioctl", "fd": e.fd, "device": names::device(e.device),
        "call": names::call(e.call), "cmd": e.cmd, "status": e.status, "ret": e.ret,
        "via_xfer": e.via_xfer, "outcome": names::outcome(e.outcome),
    });
    if let IoctlOutcome::Undecoded(reason) = e.outcome {
        v["undecoded"] = json!(names::undecoded_reason(reason));
    }
    if e.class != 0 {
        v["class"] = json!(e.class);
    }
    if let Some(gpu) = e.gpu {
        v["gpu"] = json!(gpu);
    }
    if let Some(cmd) = e.control_cmd {
        v["control_cmd"] = json!(cmd);
        v["control"] = json!(names::control_label(cmd));
    }
    if e.requested_bytes != 0 {
        v["requested_bytes"] = json!(e.requested_bytes);
    }
    v
}

fn undecoded_json(per_reason: &[u64]) -> Value {
    let mut v = json!({});
    for (i, n) in per_reason.iter().enumerate() {
        v[names::undecoded_index(i)] = json!(n);
    }
    v
}

/// Which tables were full, by name (every site, 0 where none was).
fn table_full_json(per_site: &[u64]) -> Value {
    let mut v = json!({});
    for (i, name) in keling_common::table_full::NAMES.iter().enumerate() {
        v[*name] = json!(per_site.get(i).copied().unwrap_or(0));
    }
    v
}

/// The summary's call counts: `escapes`, `uvm_commands` and `other_ioctls` by name,
/// `controls` by command (`0x..` keys), `calls_uncounted`.
fn calls_json(c: &CallCounts) -> serde_json::Map<String, Value> {
    let (mut escapes, mut uvm, mut other) = (
        serde_json::Map::new(),
        serde_json::Map::new(),
        serde_json::Map::new(),
    );
    for (&call, &n) in &c.calls {
        let (map, entry) = match call {
            Call::Rm(nr) => (&mut escapes, json!({"nr": nr, "calls": n})),
            Call::Uvm(cmd) => (&mut uvm, json!({"nr": cmd, "calls": n})),
            Call::NotRm(cmd) => (&mut other, json!({"cmd": cmd, "calls": n})),
        };
        map.insert(names::call(call), entry);
    }
    let controls: serde_json::Map<String, Value> = c
        .controls
        .iter()
        .map(|(&cmd, &n)| {
            (
                format!("{cmd:#x}"),
                json!({"name": names::control(cmd), "calls": n}),
            )
        })
        .collect();
    let mut v = serde_json::Map::new();
    v.insert("escapes".into(), Value::Object(escapes));
    v.insert("uvm_commands".into(), Value::Object(uvm));
    v.insert("other_ioctls".into(), Value::Object(other));
    v.insert("controls".into(), Value::Object(controls));
    v.insert("calls_uncounted".into(), json!(c.uncounted));
    v
}

/// The `summary` object (the jsonl trace's last line; also in a Perfetto trace).
pub fn summary_json(s: &Summary) -> Value {
    let mut v = json!({
        "type": "summary",
        "ts_ns": s.ts_ns,
        "duration_ns": s.duration_ns,
        "events": s.events,
        "drops": s.drops,
        "decode_errors": s.decode_errors,
        "undecoded": undecoded_json(s.undecoded),
        "table_full_at": table_full_json(s.table_full_at),
        "gpus": s.gpus,
        "processes": s.processes,
        "ioctl_backend": s.ioctl_backend,
    });
    v.as_object_mut()
        .expect("object")
        .extend(calls_json(s.calls));
    v
}

impl JsonlSink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            buf: Vec::with_capacity(512),
            call_names: Memo(None),
            device_names: Memo(None),
            control_labels: Memo(None),
        }
    }

    /// One JSON line, built in `self.buf` and written with one call.
    fn line(&mut self, line: &impl serde::Serialize) -> io::Result<()> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, line)?;
        self.buf.push(b'\n');
        self.out.write_all(&self.buf)
    }
}

/// The hottest lines (a traced process's every NVIDIA call and context switch)
/// written straight from typed fields, without building a [`Value`] (a map and a
/// string per key) and without serde_json, which escapes every key anew (its
/// `format_escaped_str` was a fifth of a full-rate `keling trace --format jsonl`
/// under `perf record`): the same bytes as [`event_json`], its keys in the same
/// sorted order (a test holds the two together byte for byte). How fast these are
/// written is how many events a second `keling trace` carries before its ring
/// buffer drops.
struct Line<'a> {
    buf: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Line<'a> {
    fn new(buf: &'a mut Vec<u8>) -> Self {
        buf.clear();
        Line { buf, first: true }
    }

    /// `"key":`, after a comma unless it is the first. Keys are this file's
    /// constants: nothing in them needs escaping.
    fn key(&mut self, key: &'static str) -> &mut Self {
        debug_assert!(!key.bytes().any(needs_escape), "{key}");
        self.buf.push(if self.first { b'{' } else { b',' });
        self.first = false;
        self.buf.push(b'"');
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.extend_from_slice(b"\":");
        self
    }

    fn num(&mut self, key: &'static str, v: impl itoa::Integer) -> &mut Self {
        self.key(key)
            .buf
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self
    }

    fn opt_num(&mut self, key: &'static str, v: Option<impl itoa::Integer>) -> &mut Self {
        match v {
            Some(v) => self.num(key, v),
            None => {
                self.key(key).buf.extend_from_slice(b"null");
                self
            }
        }
    }

    fn bool(&mut self, key: &'static str, v: bool) -> &mut Self {
        let text: &[u8] = if v { b"true" } else { b"false" };
        self.key(key).buf.extend_from_slice(text);
        self
    }

    /// A string value: the names Keling gives need no escaping, and are copied
    /// as they are; anything else goes through serde_json's escaping.
    fn str(&mut self, key: &'static str, v: &str) -> &mut Self {
        self.key(key);
        if v.bytes().any(needs_escape) {
            serde_json::to_writer(&mut *self.buf, v).expect("a string into a Vec");
        } else {
            self.buf.push(b'"');
            self.buf.extend_from_slice(v.as_bytes());
            self.buf.push(b'"');
        }
        self
    }

    /// The closing brace and the newline.
    fn end(&mut self) {
        self.buf.extend_from_slice(b"}\n");
    }
}

/// A byte JSON strings must escape.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The last value computed for a key: a traced process's hot loop makes the same
/// call again and again, and each name is a table search and a new `String`.
struct Memo<K, V>(Option<(K, V)>);

impl<K: Copy + PartialEq, V> Memo<K, V> {
    fn get(&mut self, key: K, f: impl FnOnce(K) -> V) -> &V {
        if self.0.as_ref().is_none_or(|(k, _)| *k != key) {
            self.0 = Some((key, f(key)));
        }
        &self.0.as_ref().expect("just set").1
    }
}

impl JsonlSink {
    fn ioctl_line(&mut self, e: &GpuIoctlEvent) -> io::Result<()> {
        let h = &e.header;
        let call = self.call_names.get(e.call, names::call);
        let device = self.device_names.get(e.device, names::device);
        let mut l = Line::new(&mut self.buf);
        l.str("call", call);
        if e.class != 0 {
            l.num("class", e.class);
        }
        l.num("cmd", e.cmd);
        if let Some(cmd) = e.control_cmd {
            let label = self.control_labels.get(cmd, names::control_label);
            l.str("control", label).num("control_cmd", cmd);
        }
        l.num("cpu", h.cpu).str("device", device).num("fd", e.fd);
        if let Some(gpu) = e.gpu {
            l.num("gpu", gpu);
        }
        l.str("outcome", names::outcome(e.outcome))
            .num("pid", h.pid);
        if e.requested_bytes != 0 {
            l.num("requested_bytes", e.requested_bytes);
        }
        l.num("ret", e.ret)
            .num("status", e.status)
            .num("tid", h.tid)
            .num("ts_ns", h.ts_ns)
            .str("type", "gpu_ioctl");
        if let IoctlOutcome::Undecoded(reason) = e.outcome {
            l.str("undecoded", names::undecoded_reason(reason));
        }
        l.bool("via_xfer", e.via_xfer).end();
        self.out.write_all(&self.buf)
    }

    fn switch_line(&mut self, e: &keling_common::SwitchEvent) -> io::Result<()> {
        let h = &e.header;
        let some = |v: u32| (v != 0).then_some(v);
        Line::new(&mut self.buf)
            .num("cpu", h.cpu)
            .opt_num("next_pid", some(e.next_pid))
            .num("next_tid", e.next_tid)
            .num("pid", h.pid)
            .opt_num("prev_pid", some(e.prev_pid))
            .opt_num(
                "prev_runtime_ns",
                (e.prev_runtime_ns != 0).then_some(e.prev_runtime_ns),
            )
            .str("prev_state", state_letter(e.prev_state))
            .num("prev_tid", e.prev_tid)
            .num("tid", h.tid)
            .num("ts_ns", h.ts_ns)
            .str("type", "switch")
            .bool("voluntary", e.voluntary())
            .end();
        self.out.write_all(&self.buf)
    }
}

impl Sink for JsonlSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        match event {
            Event::GpuIoctl(e) => self.ioctl_line(e),
            Event::Switch(e) => self.switch_line(e),
            _ => self.line(&event_json(event)),
        }
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

    fn decision(&mut self, d: &super::decision::Decision) -> io::Result<()> {
        let mut v = json!({"type": "keling_decision", "ts_ns": d.ts_ns, "pid": d.pid,
                           "task": d.task, "text": d.text()});
        if let super::decision::DecisionKind::Transition {
            from, to, reason, ..
        } = &d.what
        {
            v["from"] = json!(from);
            v["to"] = json!(to);
            v["reason"] = json!(reason);
        }
        self.line(&v)
    }

    fn summary(&mut self, s: &Summary) -> io::Result<()> {
        self.line(&summary_json(s))
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

    /// An activity event names its cause as keling-common's `active_cause` set
    /// does, and a cause outside the set as "unknown".
    #[test]
    fn active_events_name_their_cause() {
        for (cause, name) in [
            (1, "switch_in"),
            (2, "ioctl"),
            (0, "unknown"),
            (9, "unknown"),
        ] {
            let e = Event::Active(ActiveEvent {
                header: EventHeader {
                    kind: EventKind::Active as u32,
                    cpu: 0,
                    ts_ns: 1,
                    pid: 7,
                    tid: 8,
                },
                root_pid: 7,
                cause,
            });
            let v = event_json(&e);
            assert_eq!(v["type"], "active");
            assert_eq!(v["cause"], name, "cause {cause}");
        }
    }

    use crate::{
        event::decode::{
            Call, DeviceFile, IoctlOutcome, MemKind, OpenHow, RefHow, UndecodedReason,
        },
        output::test_events as ev,
    };

    /// The event's object without the header fields every event has.
    fn body(e: &Event) -> Value {
        let mut v = event_json(e);
        let obj = v.as_object_mut().unwrap();
        assert_eq!(obj.remove("ts_ns"), Some(json!(1_000)));
        assert_eq!(obj.remove("cpu"), Some(json!(2)));
        assert_eq!(obj.remove("pid"), Some(json!(42)));
        assert_eq!(obj.remove("tid"), Some(json!(43)));
        v
    }

    /// The hand-written lines of the hottest events are byte for byte what the
    /// general path writes, for every optional field present and absent, one
    /// sink writing them all twice over (its remembered names must follow each
    /// change of call, device and control).
    #[test]
    fn typed_lines_equal_the_general_ones() {
        let mut events = vec![
            ev::ioctl_no_memory(),
            ev::ioctl_control(IoctlOutcome::Decoded),
            ev::ioctl_control(IoctlOutcome::Undecoded(UndecodedReason::UnknownEscape)),
            ev::ioctl_uvm(),
            ev::ioctl_no_memory_escape(),
        ];
        // Two more controls on a GPU file (one driver 535 names, one it does not),
        // a command that is no RM escape, and a failed call with negative numbers.
        for (device, call, control_cmd, fd, ret) in [
            (
                DeviceFile::Gpu(3),
                Call::Rm(nvidia::escape::CONTROL),
                Some(0x2080_0110),
                4,
                0,
            ),
            (
                DeviceFile::Gpu(3),
                Call::Rm(nvidia::escape::CONTROL),
                Some(0xdead_beef),
                4,
                0,
            ),
            (DeviceFile::Ctl, Call::NotRm(0x1234), None, -1, -25),
        ] {
            let Event::GpuIoctl(mut e) = ev::ioctl_uvm() else {
                unreachable!()
            };
            (e.device, e.call, e.control_cmd, e.fd, e.ret) = (device, call, control_cmd, fd, ret);
            events.push(Event::GpuIoctl(e));
        }
        for (prev_pid, next_pid, prev_state, runtime) in
            [(7, 0, 0, 0), (0, 8, 1, 123), (7, 8, 0x40, 5)]
        {
            events.push(Event::Switch(SwitchEvent {
                header: ev::hdr(EventKind::Switch),
                prev_tid: 70,
                prev_pid,
                next_tid: 80,
                next_pid,
                prev_state,
                prev_runtime_ns: runtime,
            }));
        }
        let (capture, buf) = crate::output::capture::Capture::new();
        let mut sink = JsonlSink::new(Box::new(capture));
        let twice: Vec<&Event> = events.iter().chain(&events).collect();
        for e in &twice {
            sink.event(e).unwrap();
        }
        let written = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), twice.len());
        for (line, e) in lines.iter().zip(&twice) {
            assert_eq!(*line, event_json(e).to_string(), "{e:?}");
        }
    }

    /// A string value that needs escaping is escaped as serde_json does it.
    #[test]
    fn line_strings_are_escaped_when_they_must_be() {
        let mut buf = Vec::new();
        let odd = "a\"b\\c\nd\u{1}e";
        Line::new(&mut buf)
            .str("k", odd)
            .str("plain", "nvidia0")
            .end();
        let want = format!("{}\n", json!({"k": odd, "plain": "nvidia0"}));
        assert_eq!(String::from_utf8(buf).unwrap(), want);
    }

    #[test]
    fn gpu_file_events() {
        assert_eq!(
            body(&ev::open(OpenHow::Open)),
            json!({"type": "gpu_open", "fd": 5, "device": "nvidiactl", "file_id": 0xf00,
                   "how": "open"})
        );
        assert_eq!(
            body(&ev::open(OpenHow::Dup { src_fd: 3 })),
            json!({"type": "gpu_open", "fd": 5, "device": "nvidiactl", "file_id": 0xf00,
                   "how": "dup", "src_fd": 3})
        );
        assert_eq!(body(&ev::open(OpenHow::Received))["how"], "received");
        assert_eq!(body(&ev::open(OpenHow::FirstUse))["how"], "first_use");
        assert_eq!(
            body(&ev::close()),
            json!({"type": "gpu_close", "fd": 5, "device": "nvidia1", "file_id": 0xf00,
                   "released": true})
        );
    }

    #[test]
    fn gpu_memory_events() {
        assert_eq!(
            body(&ev::alloc(MemKind::Video)),
            json!({"type": "gpu_alloc", "client": 0xc1d0_0001u32, "parent": 0xc1d0_0002u32,
                   "handle": 0xc1d0_0010u32, "class": 0x40, "kind": "video_memory",
                   "mem_kind": "video", "gpu": 0, "bytes": 4 << 20, "call": "RM_ALLOC",
                   "via_xfer": false})
        );
        let host = body(&ev::alloc(MemKind::Host));
        assert_eq!(
            (&host["kind"], &host["mem_kind"]),
            (&json!("host_memory"), &json!("host"))
        );
        let egm = body(&ev::alloc(MemKind::Egm));
        assert_eq!(
            (&egm["kind"], &egm["mem_kind"]),
            (&json!("extended_memory"), &json!("egm"))
        );
        assert_eq!(
            body(&ev::free(Some(41))),
            json!({"type": "gpu_free", "client": 0xc1d0_0001u32, "handle": 0xc1d0_0010u32,
                   "class": 0x40, "kind": "video_memory", "mem_kind": "video", "gpu": 0,
                   "bytes": 4 << 20, "freed_pid": 41, "call": "RM_FREE"})
        );
        let kept = body(&ev::free(None));
        assert_eq!(
            (&kept["freed_pid"], &kept["bytes"]),
            (&Value::Null, &json!(0))
        );
        let dev = body(&ev::free_object());
        assert_eq!(
            (&dev["kind"], &dev["mem_kind"], &dev["gpu"]),
            (&json!("device"), &Value::Null, &Value::Null)
        );
        assert_eq!(
            body(&ev::object()),
            json!({"type": "gpu_object", "client": 0xc1d0_0001u32, "parent": 0xc1d0_0001u32,
                   "handle": 0xc1d0_0002u32, "class": 0x80, "kind": "device", "gpu": 1})
        );
        assert_eq!(
            body(&ev::teardown()),
            json!({"type": "gpu_teardown", "client": 0xc1d0_0001u32,
                   "reason": "subdevice_freed", "owner_pid": 41, "gpu": 0,
                   "device": 0xc1d0_0002u32, "sub": 0xc1d0_0003u32, "bytes": 6 << 20,
                   "host_bytes": 4096, "egm_bytes": 8192, "objects": 3})
        );
    }

    #[test]
    fn gpu_sharing_events() {
        assert_eq!(
            body(&ev::reference(RefHow::Dup {
                src_client: 0xc1d0_0001,
                src_handle: 0xc1d0_0010
            })),
            json!({"type": "gpu_ref", "client": 0xc1d0_0005u32, "parent": 0xc1d0_0006u32,
                   "handle": 0xc1d0_0020u32, "how": "dup", "src_client": 0xc1d0_0001u32,
                   "src_handle": 0xc1d0_0010u32, "gpu": 0, "mem_kind": "video",
                   "bytes": 2 << 20})
        );
        let import = body(&ev::reference(RefHow::Import));
        assert_eq!(
            (&import["how"], &import["src_client"], &import["src_handle"]),
            (&json!("import"), &Value::Null, &Value::Null)
        );
        assert_eq!(
            body(&ev::export()),
            json!({"type": "gpu_export", "client": 0xc1d0_0001u32, "handle": 0xc1d0_0010u32,
                   "file_id": 0xabc, "position": 2, "gpu": 0, "bytes": 2 << 20})
        );
        assert_eq!(
            body(&ev::charge()),
            json!({"type": "gpu_charge", "from_pid": 41, "to_pid": 42, "gpu": 0,
                   "mem_kind": "video", "client": 0xc1d0_0005u32, "handle": 0xc1d0_0020u32,
                   "bytes": 2 << 20})
        );
    }

    #[test]
    fn gpu_ioctl_events() {
        assert_eq!(
            body(&ev::ioctl_no_memory()),
            json!({"type": "gpu_ioctl", "fd": 3, "device": "nvidiactl", "call": "RM_ALLOC",
                   "cmd": 0xC030_462Bu32, "status": 0x51, "ret": 0, "via_xfer": true,
                   "outcome": "decoded", "class": 0x40, "gpu": 0,
                   "requested_bytes": 1u64 << 30})
        );
        assert_eq!(
            body(&ev::ioctl_control(IoctlOutcome::Decoded)),
            json!({"type": "gpu_ioctl", "fd": 3, "device": "nvidiactl", "call": "RM_CONTROL",
                   "cmd": 0xC020_462Au32, "status": 0, "ret": 0, "via_xfer": false,
                   "outcome": "decoded", "control_cmd": 0x3d05,
                   "control": "0x3d05 NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD"})
        );
        let und = body(&ev::ioctl_control(IoctlOutcome::Undecoded(
            UndecodedReason::FinnSerialized,
        )));
        assert_eq!(
            (&und["outcome"], &und["undecoded"]),
            (&json!("undecoded"), &json!("finn_serialized"))
        );
        assert_eq!(
            body(&ev::ioctl_uvm()),
            json!({"type": "gpu_ioctl", "fd": 7, "device": "nvidia-uvm",
                   "call": "UVM_INITIALIZE", "cmd": 0x3000_0001, "status": 0, "ret": 0,
                   "via_xfer": false, "outcome": "decoded"})
        );
        let quiet = body(&ev::ioctl_no_memory_escape());
        assert_eq!(
            (&quiet["call"], &quiet["outcome"]),
            (&json!("SYS_PARAMS"), &json!("no_memory_escape"))
        );
    }

    #[test]
    fn summary_has_the_new_figures() {
        let procs = vec![crate::process_model::ProcessStats {
            pid: 7,
            gpu: GpuProcessStats {
                gpu_egm_bytes: 11,
                gpu_driver_bytes: 22,
                gpus: vec![GpuDeviceStats {
                    gpu: 0,
                    egm_bytes: 11,
                    driver_bytes: 22,
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        }];
        let gpus = vec![GpuDeviceStats {
            gpu: 0,
            egm_bytes: 11,
            driver_bytes: 22,
            ..Default::default()
        }];
        let (capture, out) = crate::output::capture::Capture::new();
        let mut sink = JsonlSink::new(Box::new(capture));
        let calls = CallCounts {
            calls: [
                (Call::Rm(nvidia::escape::CONTROL), 3),
                (Call::Rm(nvidia::escape::ENV_INFO), 1),
                (Call::Uvm(nvidia::uvm::INITIALIZE), 1),
                (Call::Rm(0x99), 2),
                (Call::NotRm(0x1234), 1),
            ]
            .into(),
            controls: [(0x2080_0110, 2), (0x101, 1), (0x2080_ffff, 1)].into(),
            uncounted: 0,
        };
        sink.summary(&Summary {
            ts_ns: 1,
            duration_ns: 2,
            events: 3,
            drops: 0,
            decode_errors: 0,
            processes: &procs,
            gpus: &gpus,
            undecoded: &[0, 1, 2, 3, 4, 5],
            table_full_at: &[0, 3, 0, 0, 0, 0, 0, 0, 0, 1],
            calls: &calls,
            ioctl_backend: "tracepoints",
        })
        .unwrap();
        let v: Value = serde_json::from_slice(&out.lock().unwrap()).unwrap();
        assert_eq!(v["type"], "summary");
        let p = &v["processes"][0];
        assert_eq!(
            (&p["gpu_egm_bytes"], &p["gpu_driver_bytes"]),
            (&json!(11), &json!(22))
        );
        assert_eq!(p["gpus"][0]["egm_bytes"], 11);
        assert_eq!(p["gpus"][0]["driver_bytes"], 22);
        assert_eq!(v["gpus"][0]["driver_bytes"], 22);
        assert_eq!(v["undecoded"]["unknown_object"], 5);
        assert_eq!(
            (
                &v["table_full_at"]["orphans"],
                &v["table_full_at"]["call"],
                &v["table_full_at"]["fd_table"]
            ),
            (&json!(3), &json!(1), &json!(0))
        );
        assert_eq!(v["undecoded"]["finn_serialized"], 0);
        assert_eq!(
            v["escapes"],
            json!({"RM_CONTROL": {"nr": 0x2A, "calls": 3}, "ENV_INFO": {"nr": 0xca, "calls": 1},
                   "RM_0x99": {"nr": 0x99, "calls": 2}})
        );
        assert_eq!(
            v["uvm_commands"],
            json!({"UVM_INITIALIZE": {"nr": 0x3000_0001, "calls": 1}})
        );
        assert_eq!(
            v["other_ioctls"],
            json!({"NOT_RM_0x1234": {"cmd": 0x1234, "calls": 1}})
        );
        assert_eq!(
            v["controls"],
            json!({
                "0x20800110": {"name": "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "calls": 2},
                "0x101": {"name": "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION", "calls": 1},
                "0x2080ffff": {"name": null, "calls": 1},
            })
        );
        assert_eq!(v["calls_uncounted"], 0);
    }
}
