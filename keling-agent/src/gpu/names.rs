//! Human names for NVIDIA ABI numbers and Keling's own codes, as every output
//! (text, JSON lines, logs) prints them. The RM escapes and classes are named beside
//! their constants in keling-common (`named_consts!`: `escape::NAMES`,
//! `class::NAMES`, one row per constant, so each has exactly one name); Keling's own
//! codes (memory and object kinds, teardown reasons, open and ref hows, outcomes,
//! undecoded reasons) likewise (`code_set!`), and the functions here hand those
//! names on. The UVM commands are named here ([`UVM_COMMANDS`], generated from
//! driver 535's headers: ~150 commands, of which keling-common's `uvm` holds the
//! few Keling decodes; a test checks those are named as NVIDIA names them).
//! The RM control commands, which are many, have their own module
//! ([`super::controls`]).
//! A number without a name is shown as a number (`RM_0x99`, `0x20800999`), never
//! as undecoded: naming is not decoding.
use keling_common::nvidia::{
    ObjectKind,
    branch::{Escape5F, Layout, Version},
    class, escape,
};

use crate::event::decode::{
    Call, DeviceFile, IoctlOutcome, MemKind, OpenHow, RefHow, TeardownReason, UndecodedReason,
};

/// Every nvidia-uvm command of driver 535, sorted: `UVM_IOCTL_BASE(n)` is plain `n`
/// on Linux, `UVM_TEST_IOCTL_BASE(n)` is `200 + n`. Generated, not edited: from a
/// clone of open-gpu-kernel-modules,
///
/// ```sh
/// git -C open-gpu-kernel-modules archive 535.261.03 kernel-open/nvidia-uvm/uvm_{,linux_,test_}ioctl.h \
///   | tar -x -O | python3 -c 'import re,sys
/// t=sys.stdin.read(); c={}
/// for m in re.finditer(r"^#define\s+(UVM_\w+)\s+(UVM_TEST_IOCTL_BASE|UVM_IOCTL_BASE)\((\d+)\)\s*$",t,re.M): c.setdefault(int(m[3])+(200 if m[2]=="UVM_TEST_IOCTL_BASE" else 0),m[1])
/// for m in re.finditer(r"^#define\s+(UVM_\w+)\s+(0x[0-9a-fA-F]+)\s*$",t,re.M): c.setdefault(int(m[2],16),m[1])
/// for v,n in sorted(c.items()): print(f"    ({v:#x}, \"{n}\"),")'
/// ```
#[rustfmt::skip]
pub const UVM_COMMANDS: &[(u32, &str)] = &[
    (0x1, "UVM_RESERVE_VA"),
    (0x2, "UVM_RELEASE_VA"),
    (0x3, "UVM_REGION_COMMIT"),
    (0x4, "UVM_REGION_DECOMMIT"),
    (0x5, "UVM_REGION_SET_STREAM"),
    (0x6, "UVM_SET_STREAM_RUNNING"),
    (0x7, "UVM_SET_STREAM_STOPPED"),
    (0x9, "UVM_RUN_TEST"),
    (0xa, "UVM_ADD_SESSION"),
    (0xb, "UVM_REMOVE_SESSION"),
    (0xc, "UVM_ENABLE_COUNTERS"),
    (0xd, "UVM_MAP_COUNTER"),
    (0xe, "UVM_CREATE_EVENT_QUEUE"),
    (0xf, "UVM_REMOVE_EVENT_QUEUE"),
    (0x10, "UVM_MAP_EVENT_QUEUE"),
    (0x11, "UVM_EVENT_CTRL"),
    (0x12, "UVM_REGISTER_MPS_SERVER"),
    (0x13, "UVM_REGISTER_MPS_CLIENT"),
    (0x14, "UVM_GET_GPU_UUID_TABLE"),
    (0x15, "UVM_REGION_SET_BACKING"),
    (0x16, "UVM_REGION_UNSET_BACKING"),
    (0x17, "UVM_CREATE_RANGE_GROUP"),
    (0x18, "UVM_DESTROY_RANGE_GROUP"),
    (0x19, "UVM_REGISTER_GPU_VASPACE"),
    (0x1a, "UVM_UNREGISTER_GPU_VASPACE"),
    (0x1b, "UVM_REGISTER_CHANNEL"),
    (0x1c, "UVM_UNREGISTER_CHANNEL"),
    (0x1d, "UVM_ENABLE_PEER_ACCESS"),
    (0x1e, "UVM_DISABLE_PEER_ACCESS"),
    (0x1f, "UVM_SET_RANGE_GROUP"),
    (0x21, "UVM_MAP_EXTERNAL_ALLOCATION"),
    (0x22, "UVM_FREE"),
    (0x23, "UVM_MEM_MAP"),
    (0x24, "UVM_DEBUG_ACCESS_MEMORY"),
    (0x25, "UVM_REGISTER_GPU"),
    (0x26, "UVM_UNREGISTER_GPU"),
    (0x27, "UVM_PAGEABLE_MEM_ACCESS"),
    (0x28, "UVM_PREVENT_MIGRATION_RANGE_GROUPS"),
    (0x29, "UVM_ALLOW_MIGRATION_RANGE_GROUPS"),
    (0x2a, "UVM_SET_PREFERRED_LOCATION"),
    (0x2b, "UVM_UNSET_PREFERRED_LOCATION"),
    (0x2c, "UVM_ENABLE_READ_DUPLICATION"),
    (0x2d, "UVM_DISABLE_READ_DUPLICATION"),
    (0x2e, "UVM_SET_ACCESSED_BY"),
    (0x2f, "UVM_UNSET_ACCESSED_BY"),
    (0x33, "UVM_MIGRATE"),
    (0x35, "UVM_MIGRATE_RANGE_GROUP"),
    (0x36, "UVM_ENABLE_SYSTEM_WIDE_ATOMICS"),
    (0x37, "UVM_DISABLE_SYSTEM_WIDE_ATOMICS"),
    (0x38, "UVM_TOOLS_INIT_EVENT_TRACKER"),
    (0x39, "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD"),
    (0x3a, "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS"),
    (0x3b, "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS"),
    (0x3c, "UVM_TOOLS_ENABLE_COUNTERS"),
    (0x3d, "UVM_TOOLS_DISABLE_COUNTERS"),
    (0x3e, "UVM_TOOLS_READ_PROCESS_MEMORY"),
    (0x3f, "UVM_TOOLS_WRITE_PROCESS_MEMORY"),
    (0x40, "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE"),
    (0x41, "UVM_MAP_DYNAMIC_PARALLELISM_REGION"),
    (0x42, "UVM_UNMAP_EXTERNAL"),
    (0x43, "UVM_TOOLS_FLUSH_EVENTS"),
    (0x44, "UVM_ALLOC_SEMAPHORE_POOL"),
    (0x45, "UVM_CLEAN_UP_ZOMBIE_RESOURCES"),
    (0x46, "UVM_PAGEABLE_MEM_ACCESS_ON_GPU"),
    (0x47, "UVM_POPULATE_PAGEABLE"),
    (0x48, "UVM_VALIDATE_VA_RANGE"),
    (0x49, "UVM_CREATE_EXTERNAL_RANGE"),
    (0x4a, "UVM_MAP_EXTERNAL_SPARSE"),
    (0x4b, "UVM_MM_INITIALIZE"),
    // From 565 (76-79) and 580 (80): uvm_ioctl.h at 580.142.
    (0x4c, "UVM_TOOLS_INIT_EVENT_TRACKER_V2"),
    (0x4d, "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2"),
    (0x4e, "UVM_ALLOC_DEVICE_P2P"),
    (0x4f, "UVM_CLEAR_ALL_ACCESS_COUNTERS"),
    (0x50, "UVM_DISCARD"),
    (0xc8, "UVM_TEST_GET_GPU_REF_COUNT"),
    (0xc9, "UVM_TEST_RNG_SANITY"),
    (0xca, "UVM_TEST_RANGE_TREE_DIRECTED"),
    (0xcb, "UVM_TEST_RANGE_TREE_RANDOM"),
    (0xcc, "UVM_TEST_VA_RANGE_INFO"),
    (0xcd, "UVM_TEST_RM_MEM_SANITY"),
    (0xce, "UVM_TEST_GPU_SEMAPHORE_SANITY"),
    (0xcf, "UVM_TEST_PEER_REF_COUNT"),
    (0xd0, "UVM_TEST_VA_RANGE_SPLIT"),
    (0xd1, "UVM_TEST_VA_RANGE_INJECT_SPLIT_ERROR"),
    (0xd2, "UVM_TEST_PAGE_TREE"),
    (0xd3, "UVM_TEST_CHANGE_PTE_MAPPING"),
    (0xd4, "UVM_TEST_TRACKER_SANITY"),
    (0xd5, "UVM_TEST_PUSH_SANITY"),
    (0xd6, "UVM_TEST_CHANNEL_SANITY"),
    (0xd7, "UVM_TEST_CHANNEL_STRESS"),
    (0xd8, "UVM_TEST_CE_SANITY"),
    (0xd9, "UVM_TEST_VA_BLOCK_INFO"),
    (0xda, "UVM_TEST_LOCK_SANITY"),
    (0xdb, "UVM_TEST_PERF_UTILS_SANITY"),
    (0xdc, "UVM_TEST_KVMALLOC"),
    (0xdd, "UVM_TEST_PMM_QUERY"),
    (0xde, "UVM_TEST_PMM_CHECK_LEAK"),
    (0xdf, "UVM_TEST_PERF_EVENTS_SANITY"),
    (0xe0, "UVM_TEST_PERF_MODULE_SANITY"),
    (0xe1, "UVM_TEST_RANGE_ALLOCATOR_SANITY"),
    (0xe2, "UVM_TEST_GET_RM_PTES"),
    (0xe3, "UVM_TEST_FAULT_BUFFER_FLUSH"),
    (0xe4, "UVM_TEST_INJECT_TOOLS_EVENT"),
    (0xe5, "UVM_TEST_INCREMENT_TOOLS_COUNTER"),
    (0xe6, "UVM_TEST_MEM_SANITY"),
    (0xe8, "UVM_TEST_MAKE_CHANNEL_STOPS_IMMEDIATE"),
    (0xe9, "UVM_TEST_VA_BLOCK_INJECT_ERROR"),
    (0xea, "UVM_TEST_PEER_IDENTITY_MAPPINGS"),
    (0xeb, "UVM_TEST_VA_RESIDENCY_INFO"),
    (0xec, "UVM_TEST_PMM_ASYNC_ALLOC"),
    (0xed, "UVM_TEST_SET_PREFETCH_FILTERING"),
    (0xf0, "UVM_TEST_PMM_SANITY"),
    (0xf1, "UVM_TEST_INVALIDATE_TLB"),
    (0xf2, "UVM_TEST_VA_BLOCK"),
    (0xf3, "UVM_TEST_EVICT_CHUNK"),
    (0xf4, "UVM_TEST_FLUSH_DEFERRED_WORK"),
    (0xf5, "UVM_TEST_NV_KTHREAD_Q"),
    (0xf6, "UVM_TEST_SET_PAGE_PREFETCH_POLICY"),
    (0xf7, "UVM_TEST_RANGE_GROUP_TREE"),
    (0xf8, "UVM_TEST_RANGE_GROUP_RANGE_INFO"),
    (0xf9, "UVM_TEST_RANGE_GROUP_RANGE_COUNT"),
    (0xfa, "UVM_TEST_GET_PREFETCH_FAULTS_REENABLE_LAPSE"),
    (0xfb, "UVM_TEST_SET_PREFETCH_FAULTS_REENABLE_LAPSE"),
    (0xfc, "UVM_TEST_GET_KERNEL_VIRTUAL_ADDRESS"),
    (0xfd, "UVM_TEST_PMA_ALLOC_FREE"),
    (0xfe, "UVM_TEST_PMM_ALLOC_FREE_ROOT"),
    (0xff, "UVM_TEST_PMM_INJECT_PMA_EVICT_ERROR"),
    (0x100, "UVM_TEST_RECONFIGURE_ACCESS_COUNTERS"),
    (0x101, "UVM_TEST_RESET_ACCESS_COUNTERS"),
    (0x102, "UVM_TEST_SET_IGNORE_ACCESS_COUNTERS"),
    (0x103, "UVM_TEST_CHECK_CHANNEL_VA_SPACE"),
    (0x104, "UVM_TEST_ENABLE_NVLINK_PEER_ACCESS"),
    (0x105, "UVM_TEST_DISABLE_NVLINK_PEER_ACCESS"),
    (0x106, "UVM_TEST_GET_PAGE_THRASHING_POLICY"),
    (0x107, "UVM_TEST_SET_PAGE_THRASHING_POLICY"),
    (0x108, "UVM_TEST_PMM_SYSMEM"),
    (0x109, "UVM_TEST_PMM_REVERSE_MAP"),
    (0x10a, "UVM_TEST_PMM_INDIRECT_PEERS"),
    (0x10b, "UVM_TEST_VA_SPACE_MM_RETAIN"),
    (0x10d, "UVM_TEST_PMM_CHUNK_WITH_ELEVATED_PAGE"),
    (0x10e, "UVM_TEST_GET_GPU_TIME"),
    (0x10f, "UVM_TEST_ACCESS_COUNTERS_ENABLED_BY_DEFAULT"),
    (0x110, "UVM_TEST_VA_SPACE_INJECT_ERROR"),
    (0x111, "UVM_TEST_PMM_RELEASE_FREE_ROOT_CHUNKS"),
    (0x112, "UVM_TEST_DRAIN_REPLAYABLE_FAULTS"),
    (0x113, "UVM_TEST_PMA_GET_BATCH_SIZE"),
    (0x114, "UVM_TEST_PMM_QUERY_PMA_STATS"),
    (0x115, "UVM_TEST_NUMA_GET_CLOSEST_CPU_NODE_TO_GPU"),
    (0x116, "UVM_TEST_NUMA_CHECK_AFFINITY"),
    (0x117, "UVM_TEST_VA_SPACE_ADD_DUMMY_THREAD_CONTEXTS"),
    (0x118, "UVM_TEST_VA_SPACE_REMOVE_DUMMY_THREAD_CONTEXTS"),
    (0x119, "UVM_TEST_THREAD_CONTEXT_SANITY"),
    (0x11a, "UVM_TEST_THREAD_CONTEXT_PERF"),
    (0x11b, "UVM_TEST_GET_PAGEABLE_MEM_ACCESS_TYPE"),
    (0x11c, "UVM_TEST_TOOLS_FLUSH_REPLAY_EVENTS"),
    (0x11d, "UVM_TEST_REGISTER_UNLOAD_STATE_BUFFER"),
    (0x11e, "UVM_TEST_RB_TREE_DIRECTED"),
    (0x11f, "UVM_TEST_RB_TREE_RANDOM"),
    (0x120, "UVM_TEST_HOST_SANITY"),
    (0x121, "UVM_TEST_VA_SPACE_MM_OR_CURRENT_RETAIN"),
    (0x122, "UVM_TEST_GET_USER_SPACE_END_ADDRESS"),
    (0x123, "UVM_TEST_GET_CPU_CHUNK_ALLOC_SIZES"),
    (0x125, "UVM_TEST_VA_RANGE_INJECT_ADD_GPU_VA_SPACE_ERROR"),
    (0x126, "UVM_TEST_DESTROY_GPU_VA_SPACE_DELAY"),
    (0x127, "UVM_TEST_SEC2_SANITY"),
    (0x128, "UVM_TEST_CGROUP_ACCOUNTING_SUPPORTED"),
    (0x12a, "UVM_TEST_SPLIT_INVALIDATE_DELAY"),
    (0x12b, "UVM_TEST_SEC2_CPU_GPU_ROUNDTRIP"),
    (0x12c, "UVM_TEST_CPU_CHUNK_API"),
    (0x12f, "UVM_TEST_SKIP_MIGRATE_VMA"),
    (0x7ff, "UVM_IS_8_SUPPORTED"),
    (0x30000001, "UVM_INITIALIZE"),
    (0x30000002, "UVM_DEINITIALIZE"),
];

/// The name of `code` in `table`.
pub fn lookup(table: &[(u32, &'static str)], code: u32) -> Option<&'static str> {
    table.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// As the file is named under `/dev` (keling-common's `DeviceFile` prints it).
pub fn device(d: DeviceFile) -> String {
    d.to_string()
}

/// The driver version names are given for (escape 0x5F is another escape from
/// 545 on); the newest until [`set_driver`] is called.
static DRIVER: std::sync::RwLock<Version> = std::sync::RwLock::new(Version::NEWEST);

/// Names escapes as the driver of version `v` does (set once the driver in use is
/// known).
pub fn set_driver(v: Version) {
    *DRIVER.write().unwrap_or_else(|e| e.into_inner()) = v;
}

fn driver() -> Version {
    *DRIVER.read().unwrap_or_else(|e| e.into_inner())
}

/// An RM escape by its number (`RM_0x..` when Keling has no name for it), named
/// as the driver in use names it.
pub fn escape(nr: u32) -> String {
    escape_of(driver(), nr)
}

/// An RM escape by its number, as driver `v` names it.
pub fn escape_of(v: Version, nr: u32) -> String {
    if nr == escape::LOCKLESS_DIAGNOSTIC && Layout::of(v).escape_5f == Escape5F::LocklessDiagnostic
    {
        return "RM_LOCKLESS_DIAGNOSTIC".into();
    }
    escape::name(nr).map_or_else(|| format!("RM_{nr:#x}"), str::to_owned)
}

/// A UVM command by its number (`UVM_0x..` when Keling has no name for it).
pub fn uvm_command(cmd: u32) -> String {
    lookup(UVM_COMMANDS, cmd).map_or_else(|| format!("UVM_{cmd:#x}"), str::to_owned)
}

/// An RM escape, a UVM command, or another ioctl on an RM device file
/// (`NOT_RM_0x..`, by its whole command).
pub fn call(c: Call) -> String {
    match c {
        Call::Rm(nr) => escape(nr),
        Call::Uvm(cmd) => uvm_command(cmd),
        Call::NotRm(cmd) => format!("NOT_RM_{cmd:#x}"),
    }
}

/// The name of RM control command `cmd`, when driver 535 defines it.
pub fn control(cmd: u32) -> Option<&'static str> {
    super::controls::name(cmd)
}

/// An RM control as every output shows it: `0x20800110 NV2080_CTRL_CMD_GPU_GET_NAME_STRING`,
/// or the number alone when it has no name.
pub fn control_label(cmd: u32) -> String {
    match control(cmd) {
        Some(name) => format!("{cmd:#x} {name}"),
        None => format!("{cmd:#x}"),
    }
}

/// The NVIDIA name of RM class `c` (keling-common's `class::NAMES`).
pub fn class(c: u32) -> Option<&'static str> {
    class::name(c)
}

pub fn object_kind(k: ObjectKind) -> &'static str {
    k.name()
}

pub fn mem_kind(k: MemKind) -> &'static str {
    k.name()
}

pub fn undecoded_reason(r: UndecodedReason) -> &'static str {
    r.name()
}

/// The name of the kernel's per-reason counter `index`.
pub fn undecoded_index(index: usize) -> &'static str {
    u32::try_from(index)
        .ok()
        .and_then(UndecodedReason::from_raw)
        .map_or("unknown", UndecodedReason::name)
}

pub fn teardown_reason(r: TeardownReason) -> &'static str {
    r.name()
}

pub fn open_how(h: OpenHow) -> &'static str {
    h.kind().name()
}

pub fn ref_how(h: RefHow) -> &'static str {
    h.kind().name()
}

pub fn outcome(o: IoctlOutcome) -> &'static str {
    o.kind().name()
}

/// `gpuN`, or `gpu?` when not known (text output).
pub fn gpu(g: Option<u32>) -> String {
    g.map_or_else(|| "gpu?".into(), |g| format!("gpu{g}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use keling_common::{nvidia::uvm, undecoded};

    use super::*;

    /// The contract's source, to list every constant of a module (so that a constant
    /// added there without a name here fails this test).
    const NVIDIA_RS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../keling-common/src/nvidia.rs"
    ));

    fn parse_u32(s: &str) -> u32 {
        let s = s.trim().replace('_', "");
        match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => s.parse(),
        }
        .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// `pub const NAME: u32 = V;` and `pub const NAME: [u32; N] = [..];` of `pub mod
    /// module`, as (name, value) (arrays as NAME[i]).
    fn constants(module: &str) -> Vec<(String, u32)> {
        let start = format!("pub mod {module} {{");
        let body: Vec<&str> = NVIDIA_RS
            .lines()
            .skip_while(|l| l.trim_end() != start)
            .skip(1)
            .take_while(|l| *l != "}")
            .collect();
        assert!(!body.is_empty(), "no module {module} in nvidia.rs");
        let mut out = Vec::new();
        for line in body {
            let Some(rest) = line.trim().strip_prefix("pub const ") else {
                continue;
            };
            if rest.starts_with("fn ") {
                continue;
            }
            let Some((name, rest)) = rest.split_once(':') else {
                continue;
            };
            let (ty, value) = rest.split_once('=').expect("a value");
            let value = value.trim().trim_end_matches(';');
            match ty.trim() {
                "u32" => out.push((name.to_owned(), parse_u32(value))),
                t if t.starts_with("[u32;") => {
                    let items = value.trim_start_matches('[').trim_end_matches(']');
                    for (i, v) in items.split(',').enumerate() {
                        out.push((format!("{name}[{i}]"), parse_u32(v)));
                    }
                }
                _ => {} // offsets (usize)
            }
        }
        out
    }

    /// Sorted by code, each code once, each name once.
    fn sorted_and_unique(table: &[(u32, &str)]) {
        for w in table.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?} before {:?}", w[0], w[1]);
        }
        let names: BTreeSet<&str> = table.iter().map(|(_, n)| *n).collect();
        assert_eq!(names.len(), table.len(), "names not unique: {table:?}");
    }

    /// Every `NV_ESC_*` of driver 535 as its headers write it (nv_escape.h,
    /// nv-ioctl-numbers.h, nv-ioctl-numa.h at 535.261.03), with WAIT_OPEN_COMPLETE
    /// (550's nv-ioctl-numbers.h) and ENV_INFO (older drivers' nv.h): a second
    /// reading of the numbers keling-common's `escape` holds.
    const NV_ESC_535: &[(&str, u32)] = &[
        ("NV_ESC_RM_ALLOC_MEMORY", 0x27),
        ("NV_ESC_RM_ALLOC_OBJECT", 0x28),
        ("NV_ESC_RM_FREE", 0x29),
        ("NV_ESC_RM_CONTROL", 0x2A),
        ("NV_ESC_RM_ALLOC", 0x2B),
        ("NV_ESC_RM_CONFIG_GET", 0x32),
        ("NV_ESC_RM_CONFIG_SET", 0x33),
        ("NV_ESC_RM_DUP_OBJECT", 0x34),
        ("NV_ESC_RM_SHARE", 0x35),
        ("NV_ESC_RM_CONFIG_GET_EX", 0x37),
        ("NV_ESC_RM_CONFIG_SET_EX", 0x38),
        ("NV_ESC_RM_I2C_ACCESS", 0x39),
        ("NV_ESC_RM_IDLE_CHANNELS", 0x41),
        ("NV_ESC_RM_VID_HEAP_CONTROL", 0x4A),
        ("NV_ESC_RM_ACCESS_REGISTRY", 0x4D),
        ("NV_ESC_RM_MAP_MEMORY", 0x4E),
        ("NV_ESC_RM_UNMAP_MEMORY", 0x4F),
        ("NV_ESC_RM_GET_EVENT_DATA", 0x52),
        ("NV_ESC_RM_ALLOC_CONTEXT_DMA2", 0x54),
        ("NV_ESC_RM_ADD_VBLANK_CALLBACK", 0x56),
        ("NV_ESC_RM_MAP_MEMORY_DMA", 0x57),
        ("NV_ESC_RM_UNMAP_MEMORY_DMA", 0x58),
        ("NV_ESC_RM_BIND_CONTEXT_DMA", 0x59),
        ("NV_ESC_RM_EXPORT_OBJECT_TO_FD", 0x5C),
        ("NV_ESC_RM_IMPORT_OBJECT_FROM_FD", 0x5D),
        ("NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO", 0x5E),
        ("NV_ESC_RM_NVLOG_CTRL", 0x5F),
        ("NV_ESC_CARD_INFO", 200),
        ("NV_ESC_REGISTER_FD", 200 + 1),
        ("NV_ESC_ENV_INFO", 200 + 2),
        ("NV_ESC_ALLOC_OS_EVENT", 200 + 6),
        ("NV_ESC_FREE_OS_EVENT", 200 + 7),
        ("NV_ESC_STATUS_CODE", 200 + 9),
        ("NV_ESC_CHECK_VERSION_STR", 200 + 10),
        ("NV_ESC_IOCTL_XFER_CMD", 200 + 11),
        ("NV_ESC_ATTACH_GPUS_TO_FD", 200 + 12),
        ("NV_ESC_QUERY_DEVICE_INTR", 200 + 13),
        ("NV_ESC_SYS_PARAMS", 200 + 14),
        ("NV_ESC_NUMA_INFO", 200 + 15),
        ("NV_ESC_SET_NUMA_STATUS", 200 + 16),
        ("NV_ESC_EXPORT_TO_DMABUF_FD", 200 + 17),
        ("NV_ESC_WAIT_OPEN_COMPLETE", 200 + 18),
    ];

    #[test]
    fn every_abi_constant_has_exactly_one_name() {
        // Escapes and classes: one row per constant in keling-common (a constant
        // cannot be added without its name); here the tables are sorted, each name
        // once, and every escape and class is found by its number.
        sorted_and_unique(escape::NAMES);
        sorted_and_unique(class::NAMES);
        for &(nr, name) in escape::NAMES {
            assert_eq!(escape_of(Version::new(535, 261, 3), nr), name);
        }
        for &(c, name) in class::NAMES {
            assert_eq!(class(c), Some(name), "{c:#x}");
        }
        assert_eq!(
            (escape::NAMES.len(), class::NAMES.len()),
            (42, 38),
            "a row gone or added: update NV_ESC_535 or the class checks"
        );
        for c in class::GPFIFO
            .iter()
            .chain(&class::COMPUTE)
            .chain(&class::COPY)
        {
            assert!(class(*c).is_some(), "{c:#x}");
        }
        // UVM: every command Keling decodes is named as uvm_ioctl.h names it (the
        // table names the others too).
        sorted_and_unique(UVM_COMMANDS);
        for (name, value) in constants("uvm") {
            assert_eq!(
                lookup(UVM_COMMANDS, value),
                Some(format!("UVM_{name}").as_str()),
                "{name} = {value:#x}"
            );
        }
        assert!(UVM_COMMANDS.len() > 150, "{}", UVM_COMMANDS.len());
        // Controls: the command numbers of `ctrl`, not its sizes (u32 `*_SIZE`), are
        // in the table of every control under their NVIDIA names.
        let controls: Vec<(String, u32)> = constants("ctrl")
            .into_iter()
            .filter(|(n, _)| !n.ends_with("_SIZE"))
            .collect();
        assert_eq!(controls.len(), 4, "{controls:?}");
        for (name, cmd) in controls {
            assert_eq!(
                control(cmd),
                Some(format!("NV0000_CTRL_CMD_OS_UNIX_{name}").as_str()),
                "{name}"
            );
        }
    }

    #[test]
    fn every_escape_of_driver_535_is_named_and_classified() {
        assert_eq!(NV_ESC_535.len(), escape::NAMES.len());
        for &(header, nr) in NV_ESC_535 {
            let want = header
                .strip_prefix("NV_ESC_")
                .map(|n| n.strip_prefix("IOCTL_").unwrap_or(n))
                .unwrap();
            assert_eq!(escape::name(nr), Some(want), "{header} = {nr:#x}");
        }
        // Each named escape is decoded field by field or known to carry no memory,
        // never both; a number without a name is neither (it stays unknown_escape).
        for nr in 0..=255 {
            let (decoded, no_memory) = (escape::decoded(nr), escape::carries_no_memory(nr));
            if escape::name(nr).is_some() {
                assert!(
                    decoded != no_memory,
                    "{nr:#x}: decoded {decoded}, no memory {no_memory}"
                );
            } else {
                assert!(!decoded && !no_memory, "{nr:#x} has no name");
            }
        }
    }

    /// Every code of Keling's own sets prints the name the outputs, the tests and
    /// the docs use, with its number: written out here, apart from the one
    /// definition in keling-common, so a renamed or renumbered code fails.
    #[test]
    fn every_code_prints_the_name_outputs_and_docs_use() {
        assert_eq!(
            ObjectKind::ALL.map(|k| (k as u32, object_kind(k))),
            [
                (0, "other"),
                (1, "client"),
                (2, "device"),
                (3, "subdevice"),
                (4, "vaspace"),
                (5, "channel_group"),
                (6, "context_share"),
                (7, "channel"),
                (8, "compute"),
                (9, "copy"),
                (10, "video_memory"),
                (11, "host_memory"),
                (12, "virtual_memory"),
                (13, "extended_memory"),
            ]
        );
        assert_eq!(
            MemKind::ALL.map(|k| (k.code(), mem_kind(k))),
            [(1, "video"), (2, "host"), (3, "egm")]
        );
        assert_eq!(
            UndecodedReason::ALL.map(|r| (r.code(), undecoded_reason(r))),
            [
                (0, "finn_serialized"),
                (1, "unknown_layout"),
                (2, "fault"),
                (3, "unknown_escape"),
                (4, "table_full"),
                (5, "unknown_object"),
            ]
        );
        for (i, name) in undecoded::NAMES.iter().enumerate() {
            assert_eq!(undecoded_index(i), *name);
        }
        assert_eq!(
            keling_common::table_full::NAMES,
            [
                "fd_table",
                "orphans",
                "work_queue",
                "file_clients",
                "contributors",
                "mems",
                "mem_handles",
                "exports",
                "batch",
                "call",
            ]
        );
        assert_eq!(
            TeardownReason::ALL.map(|r| (r.code(), teardown_reason(r))),
            [
                (1, "client_freed"),
                (2, "file_released"),
                (3, "device_freed"),
                (4, "subdevice_freed"),
            ]
        );
        let hows = [
            OpenHow::Open,
            OpenHow::Dup { src_fd: 3 },
            OpenHow::Received,
            OpenHow::FirstUse,
        ];
        assert_eq!(
            hows.map(|h| (h.code(), open_how(h))),
            [(1, "open"), (2, "dup"), (3, "received"), (4, "first_use")]
        );
        let refs = [
            RefHow::Dup {
                src_client: 1,
                src_handle: 2,
            },
            RefHow::Import,
        ];
        assert_eq!(
            refs.map(|h| (h.code(), ref_how(h))),
            [(1, "dup"), (2, "import")]
        );
        let outcomes = [
            IoctlOutcome::Decoded,
            IoctlOutcome::NoMemoryEscape,
            IoctlOutcome::Undecoded(UndecodedReason::Fault),
        ];
        assert_eq!(
            outcomes.map(|o| (o.code(), outcome(o))),
            [(0, "decoded"), (1, "no_memory_escape"), (2, "undecoded")]
        );
    }

    /// Every number that names a device file leads back to it; the others name none.
    #[test]
    fn device_files_round_trip() {
        for code in (0..=300).chain([u32::MAX - 1, u32::MAX]) {
            match DeviceFile::from_raw(code) {
                Some(d) => {
                    assert_eq!(d.code(), code);
                    let name = device(d);
                    match d {
                        DeviceFile::Gpu(n) => assert_eq!(name, format!("nvidia{n}")),
                        DeviceFile::Ctl => assert_eq!(name, "nvidiactl"),
                        DeviceFile::Uvm => assert_eq!(name, "nvidia-uvm"),
                    }
                }
                None => assert!(
                    code > keling_common::device_file::MAX_GPU
                        && code != keling_common::device_file::CTL
                        && code != keling_common::device_file::UVM,
                    "{code}"
                ),
            }
        }
        assert_eq!(DeviceFile::from_raw(keling_common::device_file::NONE), None);
    }

    #[test]
    fn names_read_as_the_outputs_show_them() {
        assert_eq!(device(DeviceFile::Ctl), "nvidiactl");
        assert_eq!(device(DeviceFile::Gpu(3)), "nvidia3");
        assert_eq!(device(DeviceFile::Uvm), "nvidia-uvm");
        assert_eq!(call(Call::Rm(escape::ALLOC)), "RM_ALLOC");
        assert_eq!(call(Call::Rm(escape::SYS_PARAMS)), "SYS_PARAMS");
        assert_eq!(call(Call::Rm(0x99)), "RM_0x99");
        assert_eq!(call(Call::Rm(0xca)), "ENV_INFO");
        assert_eq!(call(Call::Rm(0x28)), "RM_ALLOC_OBJECT");
        assert_eq!(call(Call::Uvm(uvm::FREE)), "UVM_FREE");
        assert_eq!(call(Call::Uvm(0x7ff)), "UVM_IS_8_SUPPORTED");
        assert_eq!(call(Call::Uvm(0xc8)), "UVM_TEST_GET_GPU_REF_COUNT");
        assert_eq!(call(Call::Uvm(0x99)), "UVM_0x99");
        // Names that moved between branches.
        let v535 = Version::new(535, 261, 3);
        let v550 = Version::new(550, 163, 1);
        assert_eq!(escape_of(v535, 0x5F), "RM_NVLOG_CTRL");
        assert_eq!(escape_of(v550, 0x5F), "RM_LOCKLESS_DIAGNOSTIC");
        assert_eq!(escape_of(v535, 218), "WAIT_OPEN_COMPLETE");
        assert_eq!(call(Call::Uvm(80)), "UVM_DISCARD");
        assert_eq!(call(Call::Uvm(78)), "UVM_ALLOC_DEVICE_P2P");
        assert_eq!(call(Call::NotRm(0x5401)), "NOT_RM_0x5401");
        assert_eq!(
            control_label(0x2080_0110),
            "0x20800110 NV2080_CTRL_CMD_GPU_GET_NAME_STRING"
        );
        assert_eq!(
            control_label(0x101),
            "0x101 NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION"
        );
        assert_eq!(control_label(0x2080_ffff), "0x2080ffff");
        assert_eq!(class(0x40), Some("NV01_MEMORY_LOCAL_USER"));
        assert_eq!(class(0x1234), None);
        assert_eq!(
            control(0x3d0c),
            Some("NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD")
        );
        assert_eq!(object_kind(ObjectKind::ExtendedMemory), "extended_memory");
        assert_eq!(mem_kind(MemKind::Egm), "egm");
        assert_eq!(
            teardown_reason(TeardownReason::SubdeviceFreed),
            "subdevice_freed"
        );
        assert_eq!(open_how(OpenHow::Dup { src_fd: 3 }), "dup");
        assert_eq!(ref_how(RefHow::Import), "import");
        assert_eq!(
            outcome(IoctlOutcome::Undecoded(UndecodedReason::Fault)),
            "undecoded"
        );
        assert_eq!(undecoded_reason(UndecodedReason::TableFull), "table_full");
        assert_eq!(undecoded_index(99), "unknown");
        assert_eq!(gpu(Some(1)), "gpu1");
        assert_eq!(gpu(None), "gpu?");
    }
}
