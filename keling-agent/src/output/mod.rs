//! Trace outputs: one [`Sink`] interface, implemented by the text timeline and JSON
//! lines today (Perfetto and metrics tomorrow).
//!
//! A sink receives every decoded event in order, the drop counts, the exact GPU
//! figures on demand, and the end-of-trace summary. It owns its writer and must not
//! read `/proc`, the kernel maps or the clock: the caller passes what it shows.
use std::io::{self, Write};

use crate::{
    event::{decode::Event, model::ProcessStats},
    gpu::{
        nvml::NvmlDiff,
        stats::{GpuDeviceStats, GpuProcessStats},
    },
};

pub mod jsonl;
pub mod text;

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
    }
}
