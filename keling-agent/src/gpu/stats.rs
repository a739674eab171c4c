//! Exact GPU figures, read from the kernel's accounting maps and shaped per process
//! and per device for the outputs and the scheduler, and the calls the traced
//! processes made ([`CallCounts`]). Pure data: the `bpf` module fills
//! [`GpuAccounting`] and reads the call counts; nothing here reads the kernel.
use std::collections::BTreeMap;

use keling_common::{Totals, call_kind, split_call_key};
use serde::Serialize;

use crate::event::decode::Call;

/// Exact GPU figures read from the kernel's maps.
#[derive(Clone, Debug, Default)]
pub struct GpuAccounting {
    /// (pid, gpu) -> totals; gpu `ALL_GPUS` is the process total, pid 0 the device.
    pub totals: BTreeMap<(u32, u32), Totals>,
    /// Undecoded or faulted calls per process.
    pub undecoded_per_pid: BTreeMap<u32, u64>,
    /// Undecoded calls per reason (see `keling_common::undecoded`).
    pub undecoded_per_reason: Vec<u64>,
    /// Of the `table_full` ones: which table (see `keling_common::table_full`).
    pub table_full_at: Vec<u64>,
    /// Per process: how often a table its books needed was full (`TABLE_FULL_PID`):
    /// its figure may be wrong.
    pub table_full_per_pid: BTreeMap<u32, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// How often a table Keling needed for this process's books was full: when
    /// not 0, its figures may be wrong (memory released unseen stays charged, or
    /// memory never seen is missing), and no quota decision is taken on them.
    #[serde(skip_serializing_if = "is_zero")]
    pub table_full: u64,
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
    for (&pid, &n) in &acc.table_full_per_pid {
        procs.entry(pid).or_default().table_full = n;
    }
    (procs, devices)
}

/// The calls the followed processes made on NVIDIA files, by RM escape, UVM command
/// and RM_CONTROL command. Exact: the kernel counts each call at sys_enter in its
/// `CALL_COUNTS` map (keling-common's `call_kind`), whatever the ring buffer drops
/// and whatever the driver answers; no event is needed.
///
/// Each ioctl counts once in `calls`; an XFER_CMD as the escape it carries (as
/// XFER_CMD only when its own 16 bytes could not be read). Every RM_CONTROL whose
/// command could be read is in `controls` too, so the `controls` sum to the
/// RM_CONTROL calls less those whose NVOS54 was unreadable (which are undecoded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Calls by escape, UVM command, or (for other ioctls on RM files) command.
    pub calls: BTreeMap<Call, u64>,
    /// RM_CONTROL calls by command.
    pub controls: BTreeMap<u32, u64>,
    /// Calls the kernel could not count by number: its table of numbers was full.
    pub uncounted: u64,
}

impl CallCounts {
    /// From the kernel's `CALL_COUNTS` entries (key, calls) and `CALLS_UNCOUNTED`.
    pub fn from_kernel(entries: impl IntoIterator<Item = (u64, u64)>, uncounted: u64) -> Self {
        let mut c = CallCounts {
            uncounted,
            ..Default::default()
        };
        for (key, n) in entries {
            let (kind, number) = split_call_key(key);
            if kind == call_kind::RM_CONTROL {
                *c.controls.entry(number).or_default() += n;
            } else if let Some(call) = Call::of_counted(kind, number) {
                *c.calls.entry(call).or_default() += n;
            } else {
                // A kind this agent does not know (a newer kernel side): not lost.
                c.uncounted += n;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use keling_common::{call_key, nvidia::escape};

    use super::*;

    /// A process whose books met a full table carries the count (and says so in
    /// JSON); one whose did not has no such field.
    #[test]
    fn full_tables_are_shown_per_process_only_when_met() {
        let mut acc = GpuAccounting::default();
        let t = Totals {
            bytes: 4096,
            ..Totals::default()
        };
        acc.totals.insert((7, keling_common::ALL_GPUS), t);
        acc.totals.insert((8, keling_common::ALL_GPUS), t);
        acc.table_full_per_pid.insert(7, 2);
        let (procs, _) = gpu_stats(&acc);
        assert_eq!(procs[&7].table_full, 2);
        assert_eq!(procs[&8].table_full, 0);
        let json = |pid| serde_json::to_value(&procs[&pid]).unwrap();
        assert_eq!(json(7)["table_full"], 2);
        assert!(json(8).get("table_full").is_none());
    }

    #[test]
    fn call_counts_split_by_kind() {
        let c = CallCounts::from_kernel(
            [
                (call_key(call_kind::RM_ESCAPE, escape::CONTROL), 3),
                (call_key(call_kind::RM_ESCAPE, escape::ENV_INFO), 1),
                (call_key(call_kind::UVM, 0x3000_0001), 1),
                (call_key(call_kind::NOT_RM, 0x1234), 2),
                (call_key(call_kind::RM_CONTROL, 0x2080_0110), 2),
                (call_key(call_kind::RM_CONTROL, 0x101), 1),
                (call_key(99, 7), 5),
            ],
            4,
        );
        assert_eq!(
            c.calls.into_iter().collect::<Vec<_>>(),
            [
                (Call::Rm(escape::CONTROL), 3),
                (Call::Rm(escape::ENV_INFO), 1),
                (Call::Uvm(0x3000_0001), 1),
                (Call::NotRm(0x1234), 2),
            ]
        );
        assert_eq!(
            c.controls.into_iter().collect::<Vec<_>>(),
            [(0x101, 1), (0x2080_0110, 2)]
        );
        assert_eq!(c.uncounted, 9);
    }
}
