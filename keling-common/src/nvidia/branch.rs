//! What moved between NVIDIA driver branches, keyed by the driver's version.
//!
//! Most of what Keling reads is the same from 535 to 595 (the constants in
//! [`super`]); the fields here are the ones that are not. Each is written as the
//! version it changed at, compared with open-gpu-kernel-modules' tags (sizeof /
//! offsetof compiled from each tag's headers on x86_64; docs/nvidia-abi.md,
//! "Driver branches"). [`Layout::of`] gives every one of them for a version; the
//! tests below pin the numbers for 535, 550, 570 and 580 as each tag's headers
//! give them, so a new branch is one more row and a field that moves fails a test.

/// A driver version as layouts are keyed: `550.54.14` is (550, 54, 14) and
/// `580.142` is (580, 142, 0). Ordered as the driver's releases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// Used when no driver is found: the newest layout (nothing to decode anyway).
    pub const NEWEST: Self = Self::new(u32::MAX, 0, 0);

    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Whether this version is `major.minor.patch` or later.
    pub const fn since(self, major: u32, minor: u32, patch: u32) -> bool {
        if self.major != major {
            return self.major > major;
        }
        if self.minor != minor {
            return self.minor > minor;
        }
        self.patch >= patch
    }
}

/// The first versions each change appeared in (the tags it was checked against).
pub mod since {
    use super::Version;
    /// NV_MEMORY_ALLOCATION_PARAMS gains numaNode@120 (120 -> 128 bytes); cl00fd's
    /// params grow 40 -> 80 bytes, allocSize @8 -> @48; escape 0x5F becomes
    /// LOCKLESS_DIAGNOSTIC (was NVLOG_CTRL). All at 545.23.06 (535.288.01 has none).
    pub const V545: Version = Version::new(545, 0, 0);
    /// The driver's per-process figure (GPU_GET_PID_INFO, what NVML and
    /// nvidia-smi show; `gpuFindClientInfoWithPidIterator`, `gpu_rmapi.c`) counts
    /// the memory under every device object of a client on the GPU: 545.23.06
    /// (535.261.03 counts only the client's first device object of the GPU,
    /// `deviceGetByGpu`: the lowest handle).
    pub const PID_INFO_EVERY_DEVICE: Version = V545;
    /// The driver's per-process figure no longer counts the size of a client's
    /// video NV01_MEMORY_HW_RESOURCES (0xB1) objects (`_gpuCollectMemInfo`,
    /// `gpu_rmapi.c`): 550.40.07 (545.29.06 still counts them).
    pub const PID_INFO_NO_HW_RESOURCES: Version = V550;
    /// NVOS47 40 -> 48 bytes, escape 218 WAIT_OPEN_COMPLETE, NVOS32's USE_EGM bit:
    /// 550.40.07, the first 550 tag.
    pub const V550: Version = Version::new(550, 0, 0);
    /// UVM's per-GPU arrays grow from 32 to 256 entries (MAP_EXTERNAL_ALLOCATION
    /// 1200 -> 9264 bytes, ALLOC_SEMAPHORE_POOL 1184 -> 9248): 550.40.53 and every
    /// later tag (550.54.14 on); 550.40.07 still has 32.
    pub const UVM_GPUS_V2: Version = Version::new(550, 40, 53);
    /// UVM commands 76-79 (TOOLS_INIT_EVENT_TRACKER_V2, TOOLS_GET_PROCESSOR_UUID_TABLE_V2,
    /// ALLOC_DEVICE_P2P, CLEAR_ALL_ACCESS_COUNTERS): 565.57.01 (560.35.03 has none).
    pub const UVM_76: Version = Version::new(565, 0, 0);
    /// The dma-buf export struct gains an index (2600 -> 2608 bytes, handles @32 ->
    /// @36): 570.86.15 (565.77 has the old one).
    pub const V570: Version = Version::new(570, 0, 0);
    /// NVOS46 56 -> 64 bytes, UVM command 80 DISCARD: 580.65.06 (575.64.05 has neither).
    pub const V580: Version = Version::new(580, 0, 0);
    /// UVM_FREE becomes `{u64 base; NV_STATUS rmStatus}` (rmStatus @16 -> @8): 590.44.01.
    pub const V590: Version = Version::new(590, 0, 0);
}

/// Escape 0x5F's name in a branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape5F {
    /// `NV_ESC_RM_NVLOG_CTRL`, up to 535.
    NvlogCtrl,
    /// `NV_ESC_RM_LOCKLESS_DIAGNOSTIC`, from 545.
    LocklessDiagnostic,
}

/// Every size and offset that differs between driver branches, for one version.
/// Sizes in bytes (`_bytes`), offsets are byte offsets into the params.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `NV_MEMORY_ALLOCATION_PARAMS` (classes 0x40, 0x3E, 0x50A0); size@64 in every branch.
    pub memory_allocation_params_bytes: u32,
    /// NVOS46 (RM_MAP_MEMORY_DMA) and NVOS47 (RM_UNMAP_MEMORY_DMA).
    pub nvos46_bytes: u32,
    pub nvos47_bytes: u32,
    /// `NV00FD_ALLOCATION_PARAMETERS` (multicast fabric, class 0xFD) and its allocSize.
    pub nv00fd_bytes: u32,
    pub nv00fd_alloc_size: usize,
    /// `nv_ioctl_export_to_dma_buf_fd_t` (escape 217): its size, `handles[128]`
    /// and `status`.
    pub dmabuf_export_bytes: u32,
    pub dmabuf_export_handles: usize,
    pub dmabuf_export_status: usize,
    /// UVM_MAP_EXTERNAL_ALLOCATION: its size, the RM memory it maps (hClient,
    /// hMemory) and its rmStatus.
    pub uvm_map_external_bytes: u32,
    pub uvm_map_external_h_client: usize,
    pub uvm_map_external_h_memory: usize,
    pub uvm_map_external_rm_status: usize,
    /// UVM_ALLOC_SEMAPHORE_POOL: its size and rmStatus.
    pub uvm_semaphore_pool_bytes: u32,
    pub uvm_semaphore_pool_rm_status: usize,
    /// UVM_FREE: its size and rmStatus.
    pub uvm_free_bytes: u32,
    pub uvm_free_rm_status: usize,
    /// Whether escape 218 WAIT_OPEN_COMPLETE exists.
    pub wait_open_complete: bool,
    pub escape_5f: Escape5F,
    /// The highest plain UVM command number (below the test commands from 200).
    pub uvm_last_command: u32,
    /// Whether NVOS32's attr2 has the USE_EGM bit (vid heap allocations of EGM).
    pub nvos32_egm_bit: bool,
}

impl Layout {
    pub const fn of(v: Version) -> Self {
        let v545 = v.since(545, 0, 0);
        let v550 = v.since(550, 0, 0);
        let uvm_v2 = v.since(550, 40, 53);
        let v570 = v.since(570, 0, 0);
        let v580 = v.since(580, 0, 0);
        // The per-GPU attribute arrays of UVM: 32 or 256 entries of 36 bytes.
        let uvm_gpus_bytes: usize = if uvm_v2 { 256 * 36 } else { 32 * 36 };
        // MAP_EXTERNAL_ALLOCATION: base, length, offset (24), the array, then
        // gpuAttributesCount (u64, 8-aligned), rmCtrlFd, hClient, hMemory, rmStatus.
        let map_count = (24 + uvm_gpus_bytes).next_multiple_of(8);
        // ALLOC_SEMAPHORE_POOL: base, length (16), the array, gpuAttributesCount,
        // rmStatus, padding to 8.
        let pool_count = (16 + uvm_gpus_bytes).next_multiple_of(8);
        Self {
            memory_allocation_params_bytes: if v545 { 128 } else { 120 },
            nvos46_bytes: if v580 { 64 } else { 56 },
            nvos47_bytes: if v550 { 48 } else { 40 },
            nv00fd_bytes: if v545 { 80 } else { 40 },
            nv00fd_alloc_size: if v545 { 48 } else { 8 },
            dmabuf_export_bytes: if v570 { 2608 } else { 2600 },
            dmabuf_export_handles: if v570 { 36 } else { 32 },
            dmabuf_export_status: if v570 { 2600 } else { 2592 },
            uvm_map_external_bytes: (map_count + 24) as u32,
            uvm_map_external_h_client: map_count + 12,
            uvm_map_external_h_memory: map_count + 16,
            uvm_map_external_rm_status: map_count + 20,
            uvm_semaphore_pool_bytes: (pool_count + 16) as u32,
            uvm_semaphore_pool_rm_status: pool_count + 8,
            uvm_free_bytes: if v.since(590, 0, 0) { 16 } else { 24 },
            uvm_free_rm_status: if v.since(590, 0, 0) { 8 } else { 16 },
            wait_open_complete: v550,
            escape_5f: if v545 {
                Escape5F::LocklessDiagnostic
            } else {
                Escape5F::NvlogCtrl
            },
            uvm_last_command: if v580 {
                80
            } else if v.since(565, 0, 0) {
                79
            } else {
                75
            },
            nvos32_egm_bit: v550,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvidia::{
        MEMORY_ALLOCATION_PARAMS_SIZE, NV0080_DEVICE_ID, ctrl, nvos00, nvos02, nvos05, nvos21,
        nvos32, nvos33, nvos34, nvos54, nvos55, nvos64, size, uvm, xfer,
    };

    /// One branch's numbers, as its tag's headers give them (sizeof / offsetof
    /// compiled on x86_64 from open-gpu-kernel-modules at that tag; nothing here is
    /// computed). A new branch is one more row.
    struct Pinned {
        tag: Version,
        memory_allocation_params: u32,
        nvos46: u32,
        nvos47: u32,
        nv00fd: (u32, usize),
        /// size, handles, status
        dmabuf_export: (u32, usize, usize),
        /// size, hClient, hMemory, rmStatus
        uvm_map_external: (u32, usize, usize, usize),
        /// size, rmStatus
        uvm_semaphore_pool: (u32, usize),
        uvm_free: (u32, usize),
        wait_open_complete: bool,
        escape_5f: Escape5F,
        uvm_last_command: u32,
    }

    const PINNED: &[Pinned] = &[
        Pinned {
            tag: Version::new(535, 261, 3),
            memory_allocation_params: 120,
            nvos46: 56,
            nvos47: 40,
            nv00fd: (40, 8),
            dmabuf_export: (2600, 32, 2592),
            uvm_map_external: (1200, 1188, 1192, 1196),
            uvm_semaphore_pool: (1184, 1176),
            uvm_free: (24, 16),
            wait_open_complete: false,
            escape_5f: Escape5F::NvlogCtrl,
            uvm_last_command: 75,
        },
        Pinned {
            tag: Version::new(550, 40, 7),
            memory_allocation_params: 128,
            nvos46: 56,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2600, 32, 2592),
            uvm_map_external: (1200, 1188, 1192, 1196),
            uvm_semaphore_pool: (1184, 1176),
            uvm_free: (24, 16),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 75,
        },
        Pinned {
            tag: Version::new(550, 163, 1),
            memory_allocation_params: 128,
            nvos46: 56,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2600, 32, 2592),
            uvm_map_external: (9264, 9252, 9256, 9260),
            uvm_semaphore_pool: (9248, 9240),
            uvm_free: (24, 16),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 75,
        },
        Pinned {
            tag: Version::new(555, 58, 2),
            memory_allocation_params: 128,
            nvos46: 56,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2600, 32, 2592),
            uvm_map_external: (9264, 9252, 9256, 9260),
            uvm_semaphore_pool: (9248, 9240),
            uvm_free: (24, 16),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 75,
        },
        Pinned {
            tag: Version::new(570, 211, 1),
            memory_allocation_params: 128,
            nvos46: 56,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2608, 36, 2600),
            uvm_map_external: (9264, 9252, 9256, 9260),
            uvm_semaphore_pool: (9248, 9240),
            uvm_free: (24, 16),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 79,
        },
        Pinned {
            tag: Version::new(580, 142, 0),
            memory_allocation_params: 128,
            nvos46: 64,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2608, 36, 2600),
            uvm_map_external: (9264, 9252, 9256, 9260),
            uvm_semaphore_pool: (9248, 9240),
            uvm_free: (24, 16),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 80,
        },
        Pinned {
            tag: Version::new(590, 44, 1),
            memory_allocation_params: 128,
            nvos46: 64,
            nvos47: 48,
            nv00fd: (80, 48),
            dmabuf_export: (2608, 36, 2600),
            uvm_map_external: (9264, 9252, 9256, 9260),
            uvm_semaphore_pool: (9248, 9240),
            uvm_free: (16, 8),
            wait_open_complete: true,
            escape_5f: Escape5F::LocklessDiagnostic,
            uvm_last_command: 80,
        },
    ];

    #[test]
    fn every_moved_field_matches_each_tags_headers() {
        for p in PINNED {
            let l = Layout::of(p.tag);
            let t = p.tag;
            assert_eq!(
                l.memory_allocation_params_bytes, p.memory_allocation_params,
                "{t:?}"
            );
            assert_eq!(
                (l.nvos46_bytes, l.nvos47_bytes),
                (p.nvos46, p.nvos47),
                "{t:?}"
            );
            assert_eq!((l.nv00fd_bytes, l.nv00fd_alloc_size), p.nv00fd, "{t:?}");
            assert_eq!(
                (
                    l.dmabuf_export_bytes,
                    l.dmabuf_export_handles,
                    l.dmabuf_export_status
                ),
                p.dmabuf_export,
                "{t:?}"
            );
            assert_eq!(
                (
                    l.uvm_map_external_bytes,
                    l.uvm_map_external_h_client,
                    l.uvm_map_external_h_memory,
                    l.uvm_map_external_rm_status
                ),
                p.uvm_map_external,
                "{t:?}"
            );
            assert_eq!(
                (l.uvm_semaphore_pool_bytes, l.uvm_semaphore_pool_rm_status),
                p.uvm_semaphore_pool,
                "{t:?}"
            );
            assert_eq!(
                (l.uvm_free_bytes, l.uvm_free_rm_status),
                p.uvm_free,
                "{t:?}"
            );
            assert_eq!(l.wait_open_complete, p.wait_open_complete, "{t:?}");
            assert_eq!(l.escape_5f, p.escape_5f, "{t:?}");
            assert_eq!(l.uvm_last_command, p.uvm_last_command, "{t:?}");
        }
    }

    /// What Keling reads that no branch from 535.261.03 to 580.142 moved (the same
    /// numbers in each tag's headers): one constant each, pinned here as numbers.
    #[test]
    fn what_no_branch_moved() {
        // (name, Keling's constant, the headers' number at 535.261.03, 550.163.01,
        // 570.211.01 and 580.142: one column, since they agree).
        let same: &[(&str, usize, usize)] = &[
            ("sizeof NVOS00", size::NVOS00_FREE as usize, 16),
            ("NVOS00.hRoot", nvos00::H_ROOT, 0),
            ("NVOS00.hObjectParent", nvos00::H_OBJECT_PARENT, 4),
            ("NVOS00.hObjectOld", nvos00::H_OBJECT_OLD, 8),
            ("NVOS00.status", nvos00::STATUS, 12),
            ("sizeof NVOS05", size::NVOS05_ALLOC_OBJECT as usize, 20),
            ("NVOS05.status", nvos05::STATUS, 16),
            ("sizeof NVOS21", size::NVOS21_ALLOC as usize, 32),
            ("NVOS21.hRoot", nvos21::H_ROOT, 0),
            ("NVOS21.hObjectParent", nvos21::H_OBJECT_PARENT, 4),
            ("NVOS21.hObjectNew", nvos21::H_OBJECT_NEW, 8),
            ("NVOS21.hClass", nvos21::H_CLASS, 12),
            ("NVOS21.pAllocParms", nvos21::P_ALLOC_PARMS, 16),
            ("NVOS21.status", nvos21::STATUS, 28),
            ("sizeof NVOS64", size::NVOS64_ALLOC as usize, 48),
            ("NVOS64.flags", nvos64::FLAGS, 36),
            ("NVOS64.status", nvos64::STATUS, 40),
            ("sizeof NVOS54", size::NVOS54_CONTROL as usize, 32),
            ("NVOS54.hClient", nvos54::H_CLIENT, 0),
            ("NVOS54.hObject", nvos54::H_OBJECT, 4),
            ("NVOS54.cmd", nvos54::CMD, 8),
            ("NVOS54.flags", nvos54::FLAGS, 12),
            ("NVOS54.params", nvos54::PARAMS, 16),
            ("NVOS54.paramsSize", nvos54::PARAMS_SIZE, 24),
            ("NVOS54.status", nvos54::STATUS, 28),
            (
                "sizeof NVOS02 with fd",
                size::NVOS02_ALLOC_MEMORY as usize,
                56,
            ),
            ("NVOS02.hRoot", nvos02::H_ROOT, 0),
            ("NVOS02.hObjectParent", nvos02::H_OBJECT_PARENT, 4),
            ("NVOS02.hObjectNew", nvos02::H_OBJECT_NEW, 8),
            ("NVOS02.hClass", nvos02::H_CLASS, 12),
            ("NVOS02.limit", nvos02::LIMIT, 32),
            ("NVOS02.status", nvos02::STATUS, 40),
            ("sizeof NVOS32", size::NVOS32_VID_HEAP as usize, 184),
            ("NVOS32.hRoot", nvos32::H_ROOT, 0),
            ("NVOS32.hObjectParent", nvos32::H_OBJECT_PARENT, 4),
            ("NVOS32.function", nvos32::FUNCTION, 8),
            ("NVOS32.status", nvos32::STATUS, 20),
            ("NVOS32.AllocSize.hMemory", nvos32::H_MEMORY, 44),
            ("NVOS32.AllocSize.flags", nvos32::FLAGS, 52),
            ("NVOS32.AllocSize.attr", nvos32::ATTR, 56),
            ("NVOS32.AllocSize.size", nvos32::ALLOC_SIZE, 88),
            ("NVOS32.AllocSize.attr2", nvos32::ATTR2, 144),
            (
                "NVOS32.AllocSizeRange.size",
                nvos32::ALLOC_SIZE_RANGE_SIZE,
                80,
            ),
            (
                "NVOS32.AllocOsDesc.hMemory",
                nvos32::OS_DESCRIPTOR_H_MEMORY,
                40,
            ),
            ("NVOS32.AllocOsDesc.limit", nvos32::OS_DESCRIPTOR_LIMIT, 72),
            (
                "sizeof NVOS33 with fd",
                size::NVOS33_MAP_MEMORY as usize,
                56,
            ),
            ("NVOS33.hClient", nvos33::H_CLIENT, 0),
            ("NVOS33.hMemory", nvos33::H_MEMORY, 8),
            ("NVOS33.status", nvos33::STATUS, 40),
            ("sizeof NVOS34", size::NVOS34_UNMAP_MEMORY as usize, 32),
            ("NVOS34.hClient", nvos34::H_CLIENT, 0),
            ("NVOS34.hMemory", nvos34::H_MEMORY, 8),
            ("NVOS34.status", nvos34::STATUS, 24),
            ("sizeof NVOS55", size::NVOS55_DUP_OBJECT as usize, 28),
            ("NVOS55.hClient", nvos55::H_CLIENT, 0),
            ("NVOS55.hParent", nvos55::H_PARENT, 4),
            ("NVOS55.hObject", nvos55::H_OBJECT, 8),
            ("NVOS55.hClientSrc", nvos55::H_CLIENT_SRC, 12),
            ("NVOS55.hObjectSrc", nvos55::H_OBJECT_SRC, 16),
            ("NVOS55.status", nvos55::STATUS, 24),
            ("sizeof nv_ioctl_xfer_t", size::XFER as usize, 16),
            ("xfer.cmd", xfer::CMD, 0),
            ("xfer.size", xfer::SIZE, 4),
            ("xfer.ptr", xfer::PTR, 8),
            ("NV0080_ALLOC_PARAMETERS.deviceId", NV0080_DEVICE_ID, 0),
            (
                "NV_MEMORY_ALLOCATION_PARAMS.size",
                MEMORY_ALLOCATION_PARAMS_SIZE,
                64,
            ),
            ("sizeof EXPORT_OBJECT_TO_FD", ctrl::EXPORT_SIZE as usize, 24),
            ("EXPORT_OBJECT_TO_FD.hObject", ctrl::EXPORT_H_OBJECT, 12),
            ("EXPORT_OBJECT_TO_FD.fd", ctrl::EXPORT_FD, 16),
            (
                "sizeof IMPORT_OBJECT_FROM_FD",
                ctrl::IMPORT_SIZE as usize,
                20,
            ),
            ("IMPORT_OBJECT_FROM_FD.fd", ctrl::IMPORT_FD, 0),
            ("IMPORT_OBJECT_FROM_FD.hParent", ctrl::IMPORT_H_PARENT, 12),
            ("IMPORT_OBJECT_FROM_FD.hObject", ctrl::IMPORT_H_OBJECT, 16),
            (
                "sizeof EXPORT_OBJECTS_TO_FD",
                ctrl::EXPORT_BATCH_SIZE as usize,
                2128,
            ),
            ("EXPORT_OBJECTS_TO_FD.fd", ctrl::EXPORT_BATCH_FD, 0),
            (
                "EXPORT_OBJECTS_TO_FD.objects",
                ctrl::EXPORT_BATCH_OBJECTS,
                76,
            ),
            (
                "EXPORT_OBJECTS_TO_FD.numObjects",
                ctrl::EXPORT_BATCH_NUM,
                2124,
            ),
            ("EXPORT_OBJECTS_TO_FD.index", ctrl::EXPORT_BATCH_INDEX, 2126),
            (
                "sizeof IMPORT_OBJECTS_FROM_FD",
                ctrl::IMPORT_BATCH_SIZE as usize,
                652,
            ),
            ("IMPORT_OBJECTS_FROM_FD.fd", ctrl::IMPORT_BATCH_FD, 0),
            (
                "IMPORT_OBJECTS_FROM_FD.hParent",
                ctrl::IMPORT_BATCH_H_PARENT,
                4,
            ),
            (
                "IMPORT_OBJECTS_FROM_FD.objects",
                ctrl::IMPORT_BATCH_OBJECTS,
                8,
            ),
            (
                "IMPORT_OBJECTS_FROM_FD.numObjects",
                ctrl::IMPORT_BATCH_NUM,
                648,
            ),
            (
                "IMPORT_OBJECTS_FROM_FD.index",
                ctrl::IMPORT_BATCH_INDEX,
                650,
            ),
            ("UVM_INITIALIZE.rmStatus", uvm::INITIALIZE_RM_STATUS, 8),
            (
                "UVM_CREATE_EXTERNAL_RANGE.rmStatus",
                uvm::CREATE_EXTERNAL_RANGE_RM_STATUS,
                16,
            ),
            ("UVM base", uvm::BASE, 0),
            ("UVM length", uvm::LENGTH, 8),
        ];
        for &(name, keling, headers) in same {
            assert_eq!(keling, headers, "{name}");
        }
        // NV_OS_DESC_MEMORY_ALLOCATION_PARAMS.limit (class 0x71), read by the probes.
        assert_eq!(crate::nvidia::OS_DESC_LIMIT, 24);
    }

    #[test]
    fn versions_order_as_releases() {
        assert!(Version::new(550, 40, 7) < since::UVM_GPUS_V2);
        assert!(Version::new(550, 54, 14) > since::UVM_GPUS_V2);
        assert!(Version::new(545, 23, 6).since(545, 0, 0));
        assert!(!Version::new(535, 288, 1).since(545, 0, 0));
        assert!(Version::new(580, 142, 0) >= since::V580);
        assert_eq!(
            Layout::of(Version::NEWEST),
            Layout::of(Version::new(595, 45, 4))
        );
        // The `since` constants are the boundaries `Layout::of` uses.
        for (v, before) in [
            (since::V545, Version::new(535, 288, 1)),
            (since::V550, Version::new(545, 29, 6)),
            (since::UVM_GPUS_V2, Version::new(550, 40, 7)),
            (since::UVM_76, Version::new(560, 35, 3)),
            (since::V570, Version::new(565, 77, 0)),
            (since::V580, Version::new(575, 64, 5)),
            (since::V590, Version::new(580, 142, 0)),
        ] {
            assert_ne!(Layout::of(v), Layout::of(before), "{v:?}");
        }
    }
}
