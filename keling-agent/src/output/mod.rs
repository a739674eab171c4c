//! Trace outputs: one [`Sink`] interface, implemented by the text timeline, JSON
//! lines and a Perfetto trace; [`findings`] picks out what usually explains a
//! misbehaving process, [`decision`] reads Keling's scheduler decisions back.
//!
//! A sink receives every decoded event in order, the drop counts, the exact GPU
//! figures on demand, and the end-of-trace summary. It owns its writer and must not
//! read `/proc`, the kernel maps or the clock: the caller passes what it shows.
use std::io::{self, Write};

use crate::{
    event::decode::Event,
    gpu::{
        nvml::NvmlDiff,
        stats::{CallCounts, GpuDeviceStats, GpuProcessStats},
    },
    process_model::ProcessStats,
};

pub mod decision;
pub mod findings;
pub mod jsonl;
pub mod perfetto;
pub mod text;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A live timeline for people, then a per-thread summary table.
    Text,
    /// One JSON object per line; the last is `{"type":"summary",...}`.
    Jsonl,
    /// A trace for the Perfetto UI (Chrome trace-event JSON): thread tracks with
    /// on-CPU slices, GPU memory counters, GPU and scheduler events. Use --output.
    Perfetto,
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
    /// Of those counted `table_full`: which table, per `keling_common::table_full`
    /// site.
    pub table_full_at: &'a [u64],
    /// The calls the traced processes made, by escape, UVM command and control
    /// (exact: counted in the kernel).
    pub calls: &'a CallCounts,
    /// Where NVIDIA ioctls were seen (`--ioctl-backend`'s names).
    pub ioctl_backend: &'a str,
}

/// Where a trace goes.
pub trait Sink {
    /// One event from the kernel, in the order the ring buffer gave it.
    fn event(&mut self, event: &Event) -> io::Result<()>;
    /// Events lost in the kernel so far, per CPU.
    fn drops(&mut self, ts_ns: u64, per_cpu: &[u64]) -> io::Result<()>;
    /// The exact GPU figures at this moment (`kill -USR1` on the trace).
    fn gpu_snapshot(
        &mut self,
        ts_ns: u64,
        seq: u64,
        processes: &std::collections::BTreeMap<u32, GpuProcessStats>,
        gpus: &[GpuDeviceStats],
    ) -> io::Result<()>;
    /// Keling's per-process bytes next to NVML's (nothing when there are none).
    fn nvml_check(&mut self, ts_ns: u64, diffs: &[NvmlDiff]) -> io::Result<()>;
    /// A decision of Keling's scheduler about a traced process (`--sched-log`).
    fn decision(&mut self, _decision: &decision::Decision) -> io::Result<()> {
        Ok(())
    }
    /// The end of the trace.
    fn summary(&mut self, summary: &Summary) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

/// The sink for `format`, writing to `out`. `start_ns` is the time the text
/// timeline counts from; `switches` shows context switches in it.
pub fn open(
    format: Format,
    out: Box<dyn Write + Send>,
    start_ns: u64,
    switches: bool,
) -> Box<dyn Sink + Send> {
    match format {
        Format::Text => Box::new(text::TextSink::new(out, start_ns, switches)),
        Format::Jsonl => Box::new(jsonl::JsonlSink::new(out)),
        Format::Perfetto => Box::new(perfetto::PerfettoSink::new(out)),
    }
}

/// One hand-built event of every GPU kind, shared by the sinks' tests.
#[cfg(test)]
pub(crate) mod test_events {
    use keling_common::{
        EventHeader, EventKind,
        nvidia::{ObjectKind, escape, status},
    };

    use crate::event::decode::*;

    pub fn hdr(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 2,
            ts_ns: 1_000,
            pid: 42,
            tid: 43,
        }
    }

    pub fn open(how: OpenHow) -> Event {
        Event::GpuOpen(GpuOpenEvent {
            header: hdr(EventKind::GpuOpen),
            fd: 5,
            device: DeviceFile::Ctl,
            file_id: 0xf00,
            how,
        })
    }

    pub fn close() -> Event {
        Event::GpuClose(GpuCloseEvent {
            header: hdr(EventKind::GpuClose),
            fd: 5,
            device: DeviceFile::Gpu(1),
            file_id: 0xf00,
            released: true,
        })
    }

    pub fn alloc(mem_kind: MemKind) -> Event {
        Event::GpuAlloc(GpuAllocEvent {
            header: hdr(EventKind::GpuAlloc),
            client: 0xc1d0_0001,
            parent: 0xc1d0_0002,
            handle: 0xc1d0_0010,
            class: 0x40,
            mem_kind,
            gpu: Some(0),
            escape: escape::ALLOC,
            via_xfer: false,
            bytes: 4 << 20,
        })
    }

    pub fn free(freed_pid: Option<u32>) -> Event {
        Event::GpuFree(GpuFreeEvent {
            header: hdr(EventKind::GpuFree),
            client: 0xc1d0_0001,
            handle: 0xc1d0_0010,
            class: 0x40,
            kind: ObjectKind::VideoMemory,
            gpu: Some(0),
            mem_kind: Some(MemKind::Video),
            freed_pid,
            escape: escape::FREE,
            bytes: if freed_pid.is_some() { 4 << 20 } else { 0 },
        })
    }

    pub fn free_object() -> Event {
        Event::GpuFree(GpuFreeEvent {
            header: hdr(EventKind::GpuFree),
            client: 0xc1d0_0001,
            handle: 0xc1d0_0002,
            class: 0x80,
            kind: ObjectKind::Device,
            gpu: None,
            mem_kind: None,
            freed_pid: None,
            escape: escape::FREE,
            bytes: 0,
        })
    }

    pub fn object() -> Event {
        Event::GpuObject(GpuObjectEvent {
            header: hdr(EventKind::GpuObject),
            client: 0xc1d0_0001,
            parent: 0xc1d0_0001,
            handle: 0xc1d0_0002,
            class: 0x80,
            kind: ObjectKind::Device,
            gpu: Some(1),
        })
    }

    pub fn teardown() -> Event {
        Event::GpuTeardown(GpuTeardownEvent {
            header: hdr(EventKind::GpuTeardown),
            client: 0xc1d0_0001,
            reason: TeardownReason::SubdeviceFreed,
            owner_pid: 41,
            gpu: Some(0),
            device: 0xc1d0_0002,
            sub: Some(0xc1d0_0003),
            objects: 3,
            bytes: 6 << 20,
            host_bytes: 4096,
            egm_bytes: 8192,
        })
    }

    pub fn ioctl_no_memory() -> Event {
        Event::GpuIoctl(GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 3,
            device: DeviceFile::Ctl,
            call: Call::Rm(escape::ALLOC),
            cmd: 0xC030_462B,
            control_cmd: None,
            class: 0x40,
            gpu: Some(0),
            status: status::NO_MEMORY,
            outcome: IoctlOutcome::Decoded,
            via_xfer: true,
            ret: 0,
            requested_bytes: 1 << 30,
        })
    }

    pub fn ioctl_control(outcome: IoctlOutcome) -> Event {
        Event::GpuIoctl(GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 3,
            device: DeviceFile::Ctl,
            call: Call::Rm(escape::CONTROL),
            cmd: 0xC020_462A,
            control_cmd: Some(keling_common::nvidia::ctrl::EXPORT_OBJECT_TO_FD),
            class: 0,
            gpu: None,
            status: 0,
            outcome,
            via_xfer: false,
            ret: 0,
            requested_bytes: 0,
        })
    }

    pub fn ioctl_uvm() -> Event {
        Event::GpuIoctl(GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 7,
            device: DeviceFile::Uvm,
            call: Call::Uvm(keling_common::nvidia::uvm::INITIALIZE),
            cmd: keling_common::nvidia::uvm::INITIALIZE,
            control_cmd: None,
            class: 0,
            gpu: None,
            status: 0,
            outcome: IoctlOutcome::Decoded,
            via_xfer: false,
            ret: 0,
            requested_bytes: 0,
        })
    }

    pub fn ioctl_no_memory_escape() -> Event {
        Event::GpuIoctl(GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 3,
            device: DeviceFile::Ctl,
            call: Call::Rm(escape::SYS_PARAMS),
            cmd: 0xC008_46D6,
            control_cmd: None,
            class: 0,
            gpu: None,
            status: 0,
            outcome: IoctlOutcome::NoMemoryEscape,
            via_xfer: false,
            ret: 0,
            requested_bytes: 0,
        })
    }

    pub fn reference(how: RefHow) -> Event {
        Event::GpuRef(GpuRefEvent {
            header: hdr(EventKind::GpuRef),
            client: 0xc1d0_0005,
            parent: 0xc1d0_0006,
            handle: 0xc1d0_0020,
            how,
            gpu: Some(0),
            mem_kind: Some(MemKind::Video),
            bytes: 2 << 20,
        })
    }

    pub fn export() -> Event {
        Event::GpuExport(GpuExportEvent {
            header: hdr(EventKind::GpuExport),
            client: 0xc1d0_0001,
            handle: 0xc1d0_0010,
            file_id: 0xabc,
            position: 2,
            gpu: Some(0),
            bytes: 2 << 20,
        })
    }

    pub fn charge() -> Event {
        Event::GpuCharge(GpuChargeEvent {
            header: hdr(EventKind::GpuCharge),
            from_pid: 41,
            to_pid: 42,
            gpu: Some(0),
            mem_kind: MemKind::Video,
            client: 0xc1d0_0005,
            handle: 0xc1d0_0020,
            bytes: 2 << 20,
        })
    }
}

/// A writer a test can read back after handing it to a sink.
#[cfg(test)]
pub(crate) mod capture {
    use std::{
        io::{self, Write},
        sync::{Arc, Mutex},
    };

    pub struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Capture {
        pub fn new() -> (Self, Arc<Mutex<Vec<u8>>>) {
            let buf = Arc::new(Mutex::new(Vec::new()));
            (Self(buf.clone()), buf)
        }
    }

    impl Write for Capture {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
}
