//! Cross-check against NVML: what the driver's own management library says each
//! process uses, next to what Keling counted from the ioctls.
//!
//! NVML's per-process `usedGpuMemory` is the driver's per-process figure (video
//! memory of the clients the process created, docs/gpu-accounting.md), so it is
//! compared number for number with Keling's *driver figure*; Keling's per-caller
//! figure (what quotas use) is shown beside it and may differ by design.
//!
//! NVML (libnvidia-ml.so, loaded at run time by nvml-wrapper) exists only on hosts
//! with the NVIDIA driver; elsewhere this says so once and does nothing. NVML's
//! device index is assumed to be the RM device instance the trace reports (both
//! follow the driver's enumeration); NVML also counts memory the driver allocated
//! for a process's contexts, so small differences are expected and reported, not
//! hidden.
use std::collections::BTreeMap;

use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};
use serde::Serialize;

use super::stats::GpuProcessStats;

pub struct NvmlCheck {
    nvml: Option<Nvml>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct NvmlDiff {
    pub pid: u32,
    pub gpu: u32,
    /// What NVML reports (None: NVML cannot tell, e.g. under MPS or WDDM).
    pub nvml_bytes: Option<u64>,
    /// Keling's driver figure: what NVML should report.
    pub keling_driver_bytes: u64,
    /// Keling's per-caller figure (video memory charged to the process).
    pub keling_caller_bytes: u64,
    /// nvml - keling_driver_bytes.
    pub diff_bytes: Option<i64>,
}

impl NvmlCheck {
    pub fn open() -> Self {
        match Nvml::init() {
            Ok(nvml) => {
                log::info!("NVML available: per-process GPU memory is cross-checked against it");
                Self { nvml: Some(nvml) }
            }
            Err(e) => {
                log::info!("NVML unavailable ({e}): per-process GPU memory is not cross-checked");
                Self { nvml: None }
            }
        }
    }

    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// Differences for every process either side knows of on each GPU.
    pub fn compare(&self, ours: &BTreeMap<u32, GpuProcessStats>) -> Vec<NvmlDiff> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let mut theirs: BTreeMap<(u32, u32), Option<u64>> = BTreeMap::new();
        for index in 0..nvml.device_count().unwrap_or(0) {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            for p in device.running_compute_processes().unwrap_or_default() {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                theirs.insert((p.pid, index), bytes);
            }
        }
        diff(&theirs, ours)
    }
}

/// Each GPU's memory capacity as NVML reports it (empty without NVML).
pub fn capacities() -> Vec<keling_sched::GpuInfo> {
    let Ok(nvml) = Nvml::init() else {
        return Vec::new();
    };
    let n = nvml.device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| {
            let mem = nvml.device_by_index(i).ok()?.memory_info().ok()?;
            Some(keling_sched::GpuInfo {
                index: i,
                capacity_bytes: mem.total,
            })
        })
        .collect()
}

/// Pairs NVML's figures with Keling's, per (pid, GPU).
fn diff(
    theirs: &BTreeMap<(u32, u32), Option<u64>>,
    ours: &BTreeMap<u32, GpuProcessStats>,
) -> Vec<NvmlDiff> {
    let mut keys: std::collections::BTreeSet<(u32, u32)> = theirs.keys().copied().collect();
    for (&pid, g) in ours {
        for d in &g.gpus {
            if (d.driver_bytes > 0 || d.bytes > 0) && d.gpu < keling_common::NO_GPU {
                keys.insert((pid, d.gpu));
            }
        }
    }
    keys.into_iter()
        .map(|(pid, gpu)| {
            let ours = ours
                .get(&pid)
                .and_then(|g| g.gpus.iter().find(|d| d.gpu == gpu));
            let keling_driver_bytes = ours.map_or(0, |d| d.driver_bytes);
            let nvml_bytes = theirs.get(&(pid, gpu)).copied().flatten();
            NvmlDiff {
                pid,
                gpu,
                nvml_bytes,
                keling_driver_bytes,
                keling_caller_bytes: ours.map_or(0, |d| d.bytes),
                diff_bytes: nvml_bytes.map(|n| n as i64 - keling_driver_bytes as i64),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stats::GpuDeviceStats;

    fn proc_on(gpus: &[(u32, u64, u64)]) -> GpuProcessStats {
        GpuProcessStats {
            gpus: gpus
                .iter()
                .map(|&(gpu, bytes, driver_bytes)| GpuDeviceStats {
                    gpu,
                    bytes,
                    driver_bytes,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn pairs_nvml_with_the_driver_figure_per_process_and_gpu() {
        let mut ours = BTreeMap::new();
        // pid 10 on GPU 0: charged 100 bytes as a caller, 150 by the driver's rule
        // (its client also holds 50 bytes a forked child allocated through it).
        ours.insert(10, proc_on(&[(0, 100, 150)]));
        // pid 12: allocated through pid 10's client: charged as a caller, in no
        // driver figure, so NVML does not list it.
        ours.insert(12, proc_on(&[(0, 50, 0)]));
        let mut theirs = BTreeMap::new();
        theirs.insert((10, 0), Some(150));
        theirs.insert((11, 1), None);
        let d = diff(&theirs, &ours);
        assert_eq!(
            d,
            vec![
                NvmlDiff {
                    pid: 10,
                    gpu: 0,
                    nvml_bytes: Some(150),
                    keling_driver_bytes: 150,
                    keling_caller_bytes: 100,
                    diff_bytes: Some(0)
                },
                NvmlDiff {
                    pid: 11,
                    gpu: 1,
                    nvml_bytes: None,
                    keling_driver_bytes: 0,
                    keling_caller_bytes: 0,
                    diff_bytes: None
                },
                NvmlDiff {
                    pid: 12,
                    gpu: 0,
                    nvml_bytes: None,
                    keling_driver_bytes: 0,
                    keling_caller_bytes: 50,
                    diff_bytes: None
                },
            ]
        );
    }

    #[test]
    fn a_difference_is_nvml_minus_the_driver_figure() {
        let mut ours = BTreeMap::new();
        ours.insert(10, proc_on(&[(1, 4096, 1024)]));
        let mut theirs = BTreeMap::new();
        theirs.insert((10, 1), Some(512));
        let d = diff(&theirs, &ours);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].diff_bytes, Some(512 - 1024));
        let v = serde_json::to_value(&d[0]).unwrap();
        for field in [
            "pid",
            "gpu",
            "nvml_bytes",
            "keling_driver_bytes",
            "keling_caller_bytes",
            "diff_bytes",
        ] {
            assert!(v.get(field).is_some(), "{field} missing in {v}");
        }
    }

    #[test]
    fn without_nvml_there_is_nothing_to_compare() {
        let check = NvmlCheck { nvml: None };
        assert!(!check.available());
        assert!(check.compare(&BTreeMap::new()).is_empty());
    }
}
