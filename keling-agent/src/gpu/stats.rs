//! Exact GPU figures, read from the kernel's accounting maps and shaped per process
//! and per device for the outputs and the scheduler. Pure data: the `bpf` module
//! fills [`GpuAccounting`]; nothing here reads the kernel.
use std::collections::BTreeMap;

use keling_common::Totals;
use serde::Serialize;

/// Exact GPU figures read from the kernel's maps.
#[derive(Clone, Debug, Default)]
pub struct GpuAccounting {
    /// (pid, gpu) -> totals; gpu `ALL_GPUS` is the process total, pid 0 the device.
    pub totals: BTreeMap<(u32, u32), Totals>,
    /// Undecoded or faulted calls per process.
    pub undecoded_per_pid: BTreeMap<u32, u64>,
    /// Undecoded calls per reason (see `keling_common::undecoded`).
    pub undecoded_per_reason: Vec<u64>,
}

/// One process's GPU memory, from the kernel's accounting maps.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct GpuProcessStats {
    /// Video memory charged to this process that the driver still holds (the
    /// per-caller figure).
    pub gpu_mem_bytes: u64,
    /// The most `gpu_mem_bytes` ever was.
    pub gpu_mem_peak_bytes: u64,
    /// Pinned host memory, likewise.
    pub gpu_host_bytes: u64,
    pub gpu_host_peak_bytes: u64,
    /// Extended GPU memory (EGM) charged to this process, likewise.
    pub gpu_egm_bytes: u64,
    /// The driver's own figure: video memory of this process's own clients (what
    /// NVML's `usedGpuMemory` reports). See docs/gpu-accounting.md.
    pub gpu_driver_bytes: u64,
    pub gpu_allocs: u64,
    pub gpu_frees: u64,
    /// Calls that could not be decoded with certainty.
    pub undecoded: u64,
    /// The process has exited but the driver still holds memory it allocated,
    /// through an open file another process keeps (a forked child, a dup).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gpu_mem_held_after_exit: bool,
    /// Per GPU.
    pub gpus: Vec<GpuDeviceStats>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct GpuDeviceStats {
    pub gpu: u32,
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub peak_host_bytes: u64,
    pub egm_bytes: u64,
    /// The driver's per-process figure on this GPU (for the device entry, pid 0:
    /// the sum over processes).
    pub driver_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

impl GpuDeviceStats {
    fn new(gpu: u32, t: &Totals) -> Self {
        Self {
            gpu,
            bytes: t.bytes,
            peak_bytes: t.peak_bytes,
            host_bytes: t.host_bytes,
            peak_host_bytes: t.peak_host_bytes,
            egm_bytes: t.egm_bytes,
            driver_bytes: t.driver_bytes,
            allocs: t.allocs,
            frees: t.frees,
        }
    }
}

/// Per-process GPU figures (pid 0 excluded) and per-device totals.
pub fn gpu_stats(acc: &GpuAccounting) -> (BTreeMap<u32, GpuProcessStats>, Vec<GpuDeviceStats>) {
    let mut procs: BTreeMap<u32, GpuProcessStats> = BTreeMap::new();
    let mut devices = Vec::new();
    for (&(pid, gpu), t) in &acc.totals {
        if pid == 0 {
            if gpu < keling_common::NO_GPU {
                devices.push(GpuDeviceStats::new(gpu, t));
            }
            continue;
        }
        let p = procs.entry(pid).or_default();
        if gpu == keling_common::ALL_GPUS {
            p.gpu_mem_bytes = t.bytes;
            p.gpu_mem_peak_bytes = t.peak_bytes;
            p.gpu_host_bytes = t.host_bytes;
            p.gpu_host_peak_bytes = t.peak_host_bytes;
            p.gpu_egm_bytes = t.egm_bytes;
            p.gpu_driver_bytes = t.driver_bytes;
            p.gpu_allocs = t.allocs;
            p.gpu_frees = t.frees;
        } else {
            p.gpus.push(GpuDeviceStats::new(gpu, t));
        }
    }
    for (&pid, &n) in &acc.undecoded_per_pid {
        procs.entry(pid).or_default().undecoded = n;
    }
    (procs, devices)
}
