//! Cross-check against NVML: what the driver's own management library says each
//! process uses, next to what Keling counted from the ioctls.
//!
//! NVML's per-process `usedGpuMemory` is the driver's per-process figure (video
//! memory of the clients the process created, docs/gpu-accounting.md), computed
//! by the rule of the driver's branch: up to 535 the driver counts only the
//! memory under a client's first device object of each GPU, from 545 under all
//! of them. NVML is compared number for number with Keling's *NVML-rule figure*:
//! Keling's *driver figure* (every device object) less, on a branch that counts
//! one device object, what lies under the others ([`outside_first_device`]),
//! plus, up to 545, the size of the process's video NV01_MEMORY_HW_RESOURCES
//! objects, which the driver counts there and nowhere else ([`hw_resources`]).
//! Both are shown, and Keling's per-caller figure (what quotas use) beside them,
//! which may differ by design.
//!
//! NVML (libnvidia-ml.so, loaded at run time by nvml-wrapper) exists only on hosts
//! with the NVIDIA driver; elsewhere this says so once and does nothing. NVML's
//! device index is assumed to be the RM device instance the trace reports (both
//! follow the driver's enumeration); NVML also counts memory the driver allocated
//! for a process's contexts, so small differences are expected and reported, not
//! hidden.
use std::collections::BTreeMap;

use keling_common::{
    ClientInfo, MEM_HANDLES, MemInfo, ObjectInfo, ObjectKey, mem_kind,
    nvidia::{ObjectKind, class},
};
use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};
use serde::Serialize;

use super::stats::GpuProcessStats;

/// Per (pid, GPU), how the driver branch's rule for its per-process figure
/// (what NVML shows) differs from Keling's driver figure.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuleParts {
    /// What the rule leaves out: memory under a client's device objects other
    /// than its first of the GPU (up to 535, [`outside_first_device`]).
    pub outside: BTreeMap<(u32, u32), u64>,
    /// What the rule adds: the size of video NV01_MEMORY_HW_RESOURCES objects
    /// (up to 545, [`hw_resources`]).
    pub hw_resources: BTreeMap<(u32, u32), u64>,
}

pub struct NvmlCheck {
    nvml: Option<Nvml>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct NvmlDiff {
    pub pid: u32,
    pub gpu: u32,
    /// What NVML reports (None: NVML cannot tell, e.g. under MPS or WDDM).
    pub nvml_bytes: Option<u64>,
    /// Keling's figure by the driver branch's rule: what NVML should report.
    pub keling_nvml_rule_bytes: u64,
    /// Keling's driver figure: video memory of the process's clients under
    /// every device object (the NVML-rule figure from 545 on).
    pub keling_driver_bytes: u64,
    /// Keling's per-caller figure (video memory charged to the process).
    pub keling_caller_bytes: u64,
    /// nvml - keling_nvml_rule_bytes.
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

    /// Differences for every process either side knows of on each GPU;
    /// `rule`: per (pid, GPU), what the branch's rule leaves out of Keling's
    /// driver figure and adds to it ([`RuleParts`]; empty from 550).
    pub fn compare(
        &self,
        ours: &BTreeMap<u32, GpuProcessStats>,
        rule: &RuleParts,
    ) -> Vec<NvmlDiff> {
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
        diff(&theirs, ours, rule)
    }
}

/// Per (creator pid, GPU), the video bytes in Keling's driver figure that lie
/// under a device object other than their client's first of that GPU (the
/// lowest handle): what a driver that counts one device object per client and
/// GPU (up to 535, `deviceGetByGpu` in `gpu_rmapi.c`) leaves out of NVML's
/// figure. From the kernel's books: `objects` (OBJECTS), `mems` (MEMS), and
/// `clients` (CLIENTS); objects of an older client under the same handle are
/// skipped, as the driver figure skips them.
pub fn outside_first_device(
    objects: &BTreeMap<ObjectKey, ObjectInfo>,
    mems: &[MemInfo],
    clients: &BTreeMap<u32, ClientInfo>,
) -> BTreeMap<(u32, u32), u64> {
    let live = |key: &ObjectKey, o: &ObjectInfo| is_live(clients, key, o);
    let first = first_devices(objects, clients);
    // (client, device, gpu, bytes) of every charged video memory.
    let mut charged: Vec<(u32, u32, u32, u64)> = Vec::new();
    for (key, o) in objects {
        if o.mem_id == 0 && o.mem_kind == mem_kind::VIDEO && o.bytes > 0 && live(key, o) {
            charged.push((key.client, o.device, o.gpu, o.bytes));
        }
    }
    for m in mems {
        if m.kind != mem_kind::VIDEO || (m.charged as usize) >= MEM_HANDLES {
            continue;
        }
        let h = m.handles[m.charged as usize];
        let key = ObjectKey {
            client: h.client,
            handle: h.handle,
        };
        if objects.get(&key).is_some_and(|o| live(&key, o)) {
            charged.push((h.client, h.device, m.gpu, m.bytes));
        }
    }
    let mut out = BTreeMap::new();
    for (client, device, gpu, bytes) in charged {
        if first.get(&(client, gpu)) == Some(&device) {
            continue;
        }
        let Some(c) = clients.get(&client) else {
            continue;
        };
        if c.creator_pid != 0 {
            *out.entry((c.creator_pid, gpu)).or_insert(0) += bytes;
        }
    }
    out
}

/// The object belongs to its client as it is now (not to an older client that
/// had the same handle).
fn is_live(clients: &BTreeMap<u32, ClientInfo>, key: &ObjectKey, o: &ObjectInfo) -> bool {
    clients
        .get(&key.client)
        .is_some_and(|c| c.gen_ == o.client_gen)
}

/// Per (client, GPU), the handle of the client's first live device object of
/// that GPU (the lowest handle): the one the driver's per-process figure counts under.
fn first_devices(
    objects: &BTreeMap<ObjectKey, ObjectInfo>,
    clients: &BTreeMap<u32, ClientInfo>,
) -> BTreeMap<(u32, u32), u32> {
    let mut first: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    for (key, o) in objects {
        if o.kind == ObjectKind::Device as u32 && is_live(clients, key, o) {
            let f = first.entry((key.client, o.gpu)).or_insert(key.handle);
            *f = (*f).min(key.handle);
        }
    }
    first
}

/// Per (creator pid, GPU), the size of the live video NV01_MEMORY_HW_RESOURCES
/// (0xB1) objects that the driver's per-process figure counts up to 545
/// (`_gpuCollectMemInfo`, `gpu_rmapi.c`): those of the clients the pid created,
/// under the client's first device object of that GPU (lowest handle) when
/// `every_device` is false (535), under any of its devices of the GPU when it
/// is true (545). They take no framebuffer: in no figure of Keling's own. The
/// probes keep an object's size in `bytes` only for video location (0 else).
pub fn hw_resources(
    objects: &BTreeMap<ObjectKey, ObjectInfo>,
    clients: &BTreeMap<u32, ClientInfo>,
    every_device: bool,
) -> BTreeMap<(u32, u32), u64> {
    let live = |key: &ObjectKey, o: &ObjectInfo| is_live(clients, key, o);
    let first = first_devices(objects, clients);
    let mut out = BTreeMap::new();
    for (key, o) in objects {
        if o.class != class::NV01_MEMORY_HW_RESOURCES
            || o.mem_kind != 0
            || o.bytes == 0
            || !live(key, o)
        {
            continue;
        }
        let counted = match first.get(&(key.client, o.gpu)) {
            Some(&f) => every_device || o.device == f,
            None => false,
        };
        let Some(c) = clients.get(&key.client) else {
            continue;
        };
        if counted && c.creator_pid != 0 {
            let n: &mut u64 = out.entry((c.creator_pid, o.gpu)).or_insert(0);
            *n = n.saturating_add(o.bytes);
        }
    }
    out
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
    rule: &RuleParts,
) -> Vec<NvmlDiff> {
    let mut keys: std::collections::BTreeSet<(u32, u32)> = theirs.keys().copied().collect();
    for (&pid, g) in ours {
        for d in &g.gpus {
            if (d.driver_bytes > 0 || d.bytes > 0) && d.gpu < keling_common::NO_GPU {
                keys.insert((pid, d.gpu));
            }
        }
    }
    keys.extend(rule.hw_resources.keys().copied());
    keys.into_iter()
        .map(|(pid, gpu)| {
            let ours = ours
                .get(&pid)
                .and_then(|g| g.gpus.iter().find(|d| d.gpu == gpu));
            let keling_driver_bytes = ours.map_or(0, |d| d.driver_bytes);
            let keling_nvml_rule_bytes = keling_driver_bytes
                .saturating_sub(rule.outside.get(&(pid, gpu)).copied().unwrap_or(0))
                .saturating_add(rule.hw_resources.get(&(pid, gpu)).copied().unwrap_or(0));
            let nvml_bytes = theirs.get(&(pid, gpu)).copied().flatten();
            NvmlDiff {
                pid,
                gpu,
                nvml_bytes,
                keling_nvml_rule_bytes,
                keling_driver_bytes,
                keling_caller_bytes: ours.map_or(0, |d| d.bytes),
                diff_bytes: nvml_bytes.map(|n| n as i64 - keling_nvml_rule_bytes as i64),
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
        let d = diff(&theirs, &ours, &RuleParts::default());
        assert_eq!(
            d,
            vec![
                NvmlDiff {
                    pid: 10,
                    gpu: 0,
                    nvml_bytes: Some(150),
                    keling_nvml_rule_bytes: 150,
                    keling_driver_bytes: 150,
                    keling_caller_bytes: 100,
                    diff_bytes: Some(0)
                },
                NvmlDiff {
                    pid: 11,
                    gpu: 1,
                    nvml_bytes: None,
                    keling_nvml_rule_bytes: 0,
                    keling_driver_bytes: 0,
                    keling_caller_bytes: 0,
                    diff_bytes: None
                },
                NvmlDiff {
                    pid: 12,
                    gpu: 0,
                    nvml_bytes: None,
                    keling_nvml_rule_bytes: 0,
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
        let d = diff(&theirs, &ours, &RuleParts::default());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].diff_bytes, Some(512 - 1024));
        let v = serde_json::to_value(&d[0]).unwrap();
        for field in [
            "pid",
            "gpu",
            "nvml_bytes",
            "keling_nvml_rule_bytes",
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
        assert!(
            check
                .compare(&BTreeMap::new(), &RuleParts::default())
                .is_empty()
        );
    }

    const MIB: u64 = 1 << 20;

    fn client(creator_pid: u32, gen_: u32) -> ClientInfo {
        ClientInfo {
            file_id: 1,
            creator_pid,
            gen_,
            shared_head: 0,
            file_gen: 1,
            contributors: [Default::default(); keling_common::CLIENT_CONTRIBUTORS],
        }
    }

    fn device(gpu: u32, handle: u32) -> ObjectInfo {
        ObjectInfo {
            class: 0x80,
            kind: ObjectKind::Device as u32,
            device: handle,
            gpu,
            client_gen: 1,
            ..Default::default()
        }
    }

    fn memory(gpu: u32, device: u32, kind: u32, bytes: u64) -> ObjectInfo {
        ObjectInfo {
            class: 0x40,
            kind: ObjectKind::VideoMemory as u32,
            device,
            gpu,
            client_gen: 1,
            bytes,
            mem_kind: kind,
            ..Default::default()
        }
    }

    fn key(client: u32, handle: u32) -> ObjectKey {
        ObjectKey { client, handle }
    }

    /// A client of pid 10 with two device objects on GPU 0 (0xd0 first) and one
    /// on GPU 1: what lies under 0xd1, its own or shared and charged to it, is
    /// outside a one-device rule; what lies under the first device of each GPU,
    /// host memory, a stale client's object and another client's are not.
    #[test]
    fn outside_the_first_device_is_what_a_second_device_object_holds() {
        let clients = BTreeMap::from([(1, client(10, 1)), (2, client(20, 1))]);
        let mut objects = BTreeMap::from([
            (key(1, 0xd1), device(0, 0xd1)),
            (key(1, 0xd0), device(0, 0xd0)),
            (key(1, 0xd2), device(1, 0xd2)),
            (key(1, 0xa0), memory(0, 0xd0, mem_kind::VIDEO, 2 * MIB)),
            (key(1, 0xa1), memory(0, 0xd1, mem_kind::VIDEO, 6 * MIB)),
            (key(1, 0xa2), memory(1, 0xd2, mem_kind::VIDEO, 10 * MIB)),
            (key(1, 0xa4), memory(0, 0xd1, mem_kind::HOST, 16 * MIB)),
            (key(2, 0xd5), device(0, 0xd5)),
            (key(2, 0xa5), memory(0, 0xd5, mem_kind::VIDEO, 32 * MIB)),
        ]);
        // Left over from an older client 1 (generation 0).
        let mut stale = memory(0, 0xd1, mem_kind::VIDEO, 64 * MIB);
        stale.client_gen = 0;
        objects.insert(key(1, 0xa6), stale);
        // A shared memory whose charged handle is 0xa3 under 0xd1.
        let mut shared = memory(0, 0xd1, mem_kind::VIDEO, 0);
        shared.mem_id = 7;
        objects.insert(key(1, 0xa3), shared);
        let mut m = MemInfo {
            bytes: 4 * MIB,
            kind: mem_kind::VIDEO,
            gpu: 0,
            export_refs: 0,
            charged_pid: 10,
            charged: 1,
            next_seq: 2,
            handles: [Default::default(); MEM_HANDLES],
        };
        m.handles[0] = keling_common::MemHandle {
            client: 2,
            handle: 0xa7,
            device: 0xd5,
            ..Default::default()
        };
        m.handles[1] = keling_common::MemHandle {
            client: 1,
            handle: 0xa3,
            device: 0xd1,
            ..Default::default()
        };
        let out = outside_first_device(&objects, &[m], &clients);
        assert_eq!(out, BTreeMap::from([((10, 0), 10 * MIB)]));
        // Only export files hold it: in no driver figure, so in no rule's.
        m.charged = keling_common::NO_HANDLE;
        let out = outside_first_device(&objects, &[m], &clients);
        assert_eq!(out, BTreeMap::from([((10, 0), 6 * MIB)]));
    }

    /// The figure compared with NVML is the driver figure less what the
    /// branch's rule leaves out; the driver figure is shown as it is.
    #[test]
    fn nvml_is_compared_with_the_branch_rule_figure() {
        let mut ours = BTreeMap::new();
        ours.insert(
            10,
            proc_on(&[(0, 12 * MIB, 12 * MIB), (1, 10 * MIB, 10 * MIB)]),
        );
        let mut theirs = BTreeMap::new();
        theirs.insert((10, 0), Some(2 * MIB));
        theirs.insert((10, 1), Some(10 * MIB));
        let outside = RuleParts {
            outside: BTreeMap::from([((10, 0), 10 * MIB)]),
            ..Default::default()
        };
        let d = diff(&theirs, &ours, &outside);
        assert_eq!(
            d.iter()
                .map(|d| (
                    d.gpu,
                    d.keling_nvml_rule_bytes,
                    d.keling_driver_bytes,
                    d.diff_bytes
                ))
                .collect::<Vec<_>>(),
            vec![
                (0, 2 * MIB, 12 * MIB, Some(0)),
                (1, 10 * MIB, 10 * MIB, Some(0))
            ]
        );
        // Without the rule's part (545 on), a second device object's memory
        // is NVML's too.
        let d = diff(&theirs, &ours, &RuleParts::default());
        assert_eq!(d[0].diff_bytes, Some(2 * MIB as i64 - 12 * MIB as i64));
    }

    fn hw_res(gpu: u32, device: u32, bytes: u64) -> ObjectInfo {
        ObjectInfo {
            class: class::NV01_MEMORY_HW_RESOURCES,
            kind: ObjectKind::Other as u32,
            device,
            gpu,
            client_gen: 1,
            bytes,
            ..Default::default()
        }
    }

    /// Video HW_RESOURCES sizes are added to the NVML-rule figure by the
    /// branch's device rule (535: under the client's first device object of
    /// the GPU; 545: under any), for the client's creator; a stale client's
    /// object, a host-located one (kept with 0 bytes) and other classes are
    /// not. The driver figure is shown as it is.
    #[test]
    fn hw_resources_are_added_to_the_nvml_rule_figure_by_the_device_rule() {
        let clients = BTreeMap::from([(1, client(10, 1)), (2, client(20, 1))]);
        let mut stale = hw_res(0, 0xd0, 64 * MIB);
        stale.client_gen = 0;
        let objects = BTreeMap::from([
            (key(1, 0xd1), device(0, 0xd1)),
            (key(1, 0xd0), device(0, 0xd0)),
            (key(1, 0xd2), device(1, 0xd2)),
            (key(1, 0xb0), hw_res(0, 0xd0, 3 * MIB)),
            (key(1, 0xb1), hw_res(0, 0xd1, 5 * MIB)),
            (key(1, 0xb2), hw_res(1, 0xd2, 7 * MIB)),
            (key(1, 0xb3), hw_res(0, 0xd0, 0)),
            (key(1, 0xb4), stale),
            (key(1, 0xa0), memory(0, 0xd0, mem_kind::VIDEO, 2 * MIB)),
            (key(2, 0xd5), device(0, 0xd5)),
            (key(2, 0xb5), hw_res(0, 0xd5, 11 * MIB)),
        ]);
        let on_535 = hw_resources(&objects, &clients, false);
        assert_eq!(
            on_535,
            BTreeMap::from([((10, 0), 3 * MIB), ((10, 1), 7 * MIB), ((20, 0), 11 * MIB)])
        );
        let on_545 = hw_resources(&objects, &clients, true);
        assert_eq!(
            on_545,
            BTreeMap::from([((10, 0), 8 * MIB), ((10, 1), 7 * MIB), ((20, 0), 11 * MIB)])
        );
        // Compared with NVML: the driver figure (2 MiB) plus the 535 part.
        let mut ours = BTreeMap::new();
        ours.insert(10, proc_on(&[(0, 2 * MIB, 2 * MIB)]));
        let theirs = BTreeMap::from([((10, 0), Some(5 * MIB))]);
        let rule = RuleParts {
            hw_resources: on_535,
            ..Default::default()
        };
        let d = diff(&theirs, &ours, &rule);
        let at = |pid, gpu| {
            d.iter().find(|d| (d.pid, d.gpu) == (pid, gpu)).map(|d| {
                (
                    d.keling_nvml_rule_bytes,
                    d.keling_driver_bytes,
                    d.diff_bytes,
                )
            })
        };
        assert_eq!(at(10, 0), Some((5 * MIB, 2 * MIB, Some(0))));
        // A process holding only HW_RESOURCES on a GPU is listed too.
        assert_eq!(at(10, 1), Some((7 * MIB, 0, None)));
        assert_eq!(at(20, 0), Some((11 * MIB, 0, None)));
    }
}
