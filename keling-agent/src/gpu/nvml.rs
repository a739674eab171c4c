//! Cross-check against NVML: what the driver's own management library says each
//! process uses, next to what Keling counted from the ioctls.
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
    pub keling_bytes: u64,
    /// nvml - keling.
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
            if d.bytes > 0 && d.gpu < keling_common::NO_GPU {
                keys.insert((pid, d.gpu));
            }
        }
    }
    keys.into_iter()
        .map(|(pid, gpu)| {
            let keling_bytes = ours
                .get(&pid)
                .and_then(|g| g.gpus.iter().find(|d| d.gpu == gpu))
                .map_or(0, |d| d.bytes);
            let nvml_bytes = theirs.get(&(pid, gpu)).copied().flatten();
            NvmlDiff {
                pid,
                gpu,
                nvml_bytes,
                keling_bytes,
                diff_bytes: nvml_bytes.map(|n| n as i64 - keling_bytes as i64),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::stats::GpuDeviceStats;

    #[test]
    fn pairs_figures_per_process_and_gpu() {
        let mut ours = BTreeMap::new();
        ours.insert(
            10,
            GpuProcessStats {
                gpus: vec![GpuDeviceStats {
                    gpu: 0,
                    bytes: 100,
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
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
                    keling_bytes: 100,
                    diff_bytes: Some(50)
                },
                NvmlDiff {
                    pid: 11,
                    gpu: 1,
                    nvml_bytes: None,
                    keling_bytes: 0,
                    diff_bytes: None
                },
            ]
        );
    }

    #[test]
    fn without_nvml_there_is_nothing_to_compare() {
        let check = NvmlCheck { nvml: None };
        assert!(!check.available());
        assert!(check.compare(&BTreeMap::new()).is_empty());
    }
}
