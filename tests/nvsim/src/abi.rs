//! NVIDIA driver ABI facts used by the simulator and the workload generator.
//!
//! Every number here is one of the facts in `docs/nvidia-abi.md` (read from
//! open-gpu-kernel-modules) unless its comment names another source.
//! Offsets are byte offsets into the parameter structs (x86_64, natural alignment).
//! The unit tests in `driver.rs` do NOT use these constants to build requests:
//! they spell the offsets out literally, so a wrong constant here is caught.

/// `_IOC` type byte of every RM escape: `'F'`.
pub const NV_IOCTL_MAGIC: u32 = 0x46;

/// `_IOWR('F', nr, size)`: the full command of an RM escape.
pub const fn iowr(nr: u8, size: usize) -> u32 {
    (3 << 30) | ((size as u32 & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | nr as u32
}

/// `_IOC_NR(cmd)`: all the kernel (`nvidia_ioctl`) looks at besides the size.
pub const fn ioc_nr(cmd: u32) -> u8 {
    (cmd & 0xff) as u8
}

/// `_IOC_SIZE(cmd)`.
pub const fn ioc_size(cmd: u32) -> usize {
    ((cmd >> 16) & 0x3fff) as usize
}

/// `_IOC_DIR(cmd)`: bit 0 = write (user to kernel), bit 1 = read (kernel to user).
pub const fn ioc_dir(cmd: u32) -> u32 {
    cmd >> 30
}

/// RM escape numbers (`_IOC_NR`), from docs/nvidia-abi.md's table and
/// `kernel-open/common/inc/nv-ioctl-numbers.h` (NV_IOCTL_BASE = 200).
pub mod esc {
    pub const RM_ALLOC_MEMORY: u8 = 0x27;
    pub const RM_FREE: u8 = 0x29;
    pub const RM_CONTROL: u8 = 0x2A;
    pub const RM_ALLOC: u8 = 0x2B;
    pub const RM_DUP_OBJECT: u8 = 0x34;
    pub const RM_SHARE: u8 = 0x35;
    pub const RM_VID_HEAP_CONTROL: u8 = 0x4A;
    pub const RM_MAP_MEMORY: u8 = 0x4E;
    pub const RM_UNMAP_MEMORY: u8 = 0x4F;
    pub const RM_ALLOC_CONTEXT_DMA2: u8 = 0x54;
    pub const RM_UPDATE_DEVICE_MAPPING_INFO: u8 = 0x5E;
    pub const RM_MAP_MEMORY_DMA: u8 = 0x57;
    pub const RM_UNMAP_MEMORY_DMA: u8 = 0x58;
    pub const CARD_INFO: u8 = 200;
    pub const REGISTER_FD: u8 = 201;
    pub const ALLOC_OS_EVENT: u8 = 206;
    pub const FREE_OS_EVENT: u8 = 207;
    pub const STATUS_CODE: u8 = 209;
    pub const CHECK_VERSION_STR: u8 = 210;
    pub const IOCTL_XFER_CMD: u8 = 211;
    pub const ATTACH_GPUS_TO_FD: u8 = 212;
    pub const QUERY_DEVICE_INTR: u8 = 213;
    pub const SYS_PARAMS: u8 = 214;
    pub const NUMA_INFO: u8 = 215;
    pub const SET_NUMA_STATUS: u8 = 216;
    pub const EXPORT_TO_DMABUF_FD: u8 = 217;
    pub const WAIT_OPEN_COMPLETE: u8 = 218;
}

/// Parameter struct sizes (bytes) that `RmValidateIoctl` insists on.
pub mod size {
    pub const NVOS00: usize = 16;
    pub const NVOS21: usize = 32;
    pub const NVOS64: usize = 48;
    /// NVOS64 before driver 535 (no `paramsSize`).
    pub const NVOS64_LEGACY: usize = 40;
    pub const NVOS54: usize = 32;
    pub const NVOS02_WITH_FD: usize = 56;
    pub const NVOS32: usize = 184;
    pub const NVOS33_WITH_FD: usize = 56;
    pub const NVOS34: usize = 32;
    pub const NVOS39: usize = 56;
    pub const NVOS46: usize = 64;
    pub const NVOS47: usize = 48;
    pub const NVOS55: usize = 28;
    pub const NVOS57: usize = 24;
    pub const XFER: usize = 16;
    pub const CARD_INFO_ENTRY: usize = 72;
    /// `nv_ioctl_rm_api_version_t`: cmd u32, reply u32, `versionString[64]`.
    pub const RM_API_VERSION: usize = 72;
    pub const NV0080_ALLOC: usize = 56;
    pub const NV2080_ALLOC: usize = 4;
    pub const MEMORY_ALLOCATION_PARAMS: usize = 128;
    /// Class 0x71 (`NV01_MEMORY_SYSTEM_OS_DESCRIPTOR`) alloc params.
    pub const OS_DESCRIPTOR_PARAMS: usize = 40;
    pub const TSG_ALLOC: usize = 20;
    pub const CHANNEL_ALLOC: usize = 368;
    /// NVOS56 (RM_UPDATE_DEVICE_MAPPING_INFO).
    pub const NVOS56: usize = 40;
    /// `nv_ioctl_alloc_os_event_t` / `nv_ioctl_free_os_event_t`.
    pub const OS_EVENT: usize = 16;
    /// `nv_ioctl_sys_params_t`.
    pub const SYS_PARAMS: usize = 8;
    /// `nv_ioctl_wait_open_complete_t` (drivers 550 and later).
    pub const WAIT_OPEN_COMPLETE: usize = 8;
    /// Class 0xC2 (`NV01_MEMORY_LOCAL_PHYSICAL`) alloc params.
    pub const PHYS_MEM_PARAMS: usize = 24;
    /// Class 0xF8 (`NV_MEMORY_FABRIC`) alloc params.
    pub const FABRIC_PARAMS: usize = 48;
    /// Class 0xFD alloc params before driver 550.
    pub const MULTICAST_PARAMS_LEGACY: usize = 40;
    /// Class 0xFD alloc params from driver 550 on.
    pub const MULTICAST_PARAMS: usize = 80;
    /// RM_CONTROL 0x3d05 EXPORT_OBJECT_TO_FD params.
    pub const EXPORT_OBJECT_TO_FD: usize = 24;
    /// RM_CONTROL 0x3d0b EXPORT_OBJECTS_TO_FD params.
    pub const EXPORT_OBJECTS_TO_FD: usize = 2128;
    /// RM_CONTROL 0x3d06 IMPORT_OBJECT_FROM_FD params.
    pub const IMPORT_OBJECT_FROM_FD: usize = 20;
    /// RM_CONTROL 0x3d0c IMPORT_OBJECTS_FROM_FD params.
    pub const IMPORT_OBJECTS_FROM_FD: usize = 652;
}

/// NVOS00 (RM_FREE).
pub mod nvos00 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_OLD: usize = 8;
    pub const STATUS: usize = 12;
}

/// NVOS21 / NVOS64 (RM_ALLOC) common prefix.
pub mod nvos21 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
    pub const P_ALLOC_PARMS: usize = 16;
    /// NVOS21 from 535 on.
    pub const PARAMS_SIZE: usize = 24;
    pub const STATUS: usize = 28;
    /// NVOS21 before 535: no paramsSize, status moved down.
    pub const LEGACY_STATUS: usize = 24;
}

/// NVOS64 (RM_ALLOC, 48 bytes from 535 on; 40 bytes before).
pub mod nvos64 {
    pub const P_RIGHTS_REQUESTED: usize = 24;
    pub const PARAMS_SIZE: usize = 32;
    pub const FLAGS: usize = 36;
    pub const STATUS: usize = 40;
    /// 40-byte layout (525-530): pRightsRequested@24, flags@32, status@36.
    /// The headers we read give only the total; this layout is the 535 one minus
    /// `paramsSize` (documented interpretation, see the crate docs).
    pub const LEGACY_FLAGS: usize = 32;
    pub const LEGACY_STATUS: usize = 36;
    pub const FLAGS_FINN_SERIALIZED: u32 = 1;
}

/// NVOS54 (RM_CONTROL).
pub mod nvos54 {
    pub const H_CLIENT: usize = 0;
    pub const H_OBJECT: usize = 4;
    pub const CMD: usize = 8;
    pub const FLAGS: usize = 12;
    pub const PARAMS: usize = 16;
    pub const PARAMS_SIZE: usize = 24;
    pub const STATUS: usize = 28;
    /// `flags & 4`: FINN-serialized params.
    pub const FLAGS_FINN_SERIALIZED: u32 = 4;
}

/// NVOS02 + fd (RM_ALLOC_MEMORY).
pub mod nvos02 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
    pub const FLAGS: usize = 16;
    pub const P_MEMORY: usize = 24;
    pub const LIMIT: usize = 32;
    pub const STATUS: usize = 40;
    pub const FD: usize = 48;
}

/// NVOS32 (RM_VID_HEAP_CONTROL).
pub mod nvos32 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const FUNCTION: usize = 8;
    pub const H_VASPACE: usize = 12;
    pub const STATUS: usize = 20;
    pub const TOTAL: usize = 24;
    pub const FREE: usize = 32;
    pub const OWNER: usize = 40;
    pub const H_MEMORY: usize = 44;
    pub const TYPE: usize = 48;
    pub const ALLOC_FLAGS: usize = 52;
    pub const ATTR: usize = 56;
    pub const SIZE: usize = 88;
    pub const OFFSET: usize = 104;
    pub const LIMIT: usize = 112;
    pub const ADDRESS: usize = 120;
    pub const ATTR2: usize = 144;
    pub const FUNCTION_ALLOC_SIZE: u32 = 2;
    pub const FUNCTION_FREE: u32 = 3;
    pub const FUNCTION_ALLOC_SIZE_RANGE: u32 = 14;
    pub const FUNCTION_ALLOC_OS_DESCRIPTOR: u32 = 27;
    /// ALLOC_SIZE_RANGE: size@80 (in/out); the other fields as ALLOC_SIZE.
    pub const RANGE_SIZE: usize = 80;
    /// ALLOC_OS_DESCRIPTOR: hMemory@40 (in/out), limit@72 (bytes = limit + 1).
    pub const OS_DESC_H_MEMORY: usize = 40;
    pub const OS_DESC_LIMIT: usize = 72;
    /// `flags & 0x80000`: NVOS32_ALLOC_FLAGS_VIRTUAL, the class is 0x50A0.
    pub const FLAGS_VIRTUAL: u32 = 0x80000;
    /// `attr` bits 26:25: the location; 0 = VIDMEM.
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    pub const ATTR_LOCATION_MASK: u32 = 3;
    /// `attr2` bit 24: USE_EGM (drivers 550 and later), the class is 0x42.
    pub const ATTR2_USE_EGM: u32 = 1 << 24;
    /// First driver major whose ALLOC_SIZE looks at USE_EGM.
    pub const EGM_SINCE: u32 = 550;
}

/// NVOS56 (RM_UPDATE_DEVICE_MAPPING_INFO, 40 bytes).
pub mod nvos56 {
    pub const H_CLIENT: usize = 0;
    pub const H_DEVICE: usize = 4;
    pub const H_MEMORY: usize = 8;
    pub const P_OLD_CPU_ADDRESS: usize = 16;
    pub const P_NEW_CPU_ADDRESS: usize = 24;
    pub const STATUS: usize = 32;
}

/// ALLOC_OS_EVENT / FREE_OS_EVENT (16 bytes).
pub mod os_event {
    pub const H_CLIENT: usize = 0;
    pub const H_DEVICE: usize = 4;
    pub const FD: usize = 8;
    pub const STATUS: usize = 12;
}

/// WAIT_OPEN_COMPLETE (8 bytes, drivers 550 and later).
pub mod wait_open_complete {
    pub const RC: usize = 0;
    pub const ADAPTER_STATUS: usize = 4;
    pub const SINCE: u32 = 550;
}

/// Class 0xC2 params (24 bytes): memSize@0 is written with the whole heap.
pub mod phys_mem {
    pub const MEM_SIZE: usize = 0;
    pub const FORMAT: usize = 8;
    pub const PAGE_SIZE: usize = 16;
}

/// Class 0xF8 params (48 bytes).
pub mod fabric {
    pub const ALIGNMENT: usize = 0;
    pub const ALLOC_SIZE: usize = 8;
    pub const PAGE_SIZE: usize = 16;
    pub const ALLOC_FLAGS: usize = 24;
    pub const MAP_OFFSET: usize = 32;
    pub const MAP_H_VIDMEM: usize = 40;
    pub const MAP_FLAGS: usize = 44;
}

/// Class 0xFD params: allocSize@8 in the 40-byte struct before 545, @48 in
/// the 80-byte one from 545 on (545.23.06's headers; [`branch::nv00fd`]).
pub mod multicast {
    pub const ALLOC_SIZE_LEGACY: usize = 8;
    pub const ALLOC_SIZE: usize = 48;
    pub const SINCE: u32 = 545;
}

/// RM_CONTROL commands on the client (class 0x0000, `ctrl0000unix.h`) that
/// share objects through an nvidiactl open file (the "export file"), and
/// their params.
pub mod unix_ctrl {
    pub const EXPORT_OBJECT_TO_FD: u32 = 0x3d05;
    pub const IMPORT_OBJECT_FROM_FD: u32 = 0x3d06;
    pub const EXPORT_OBJECTS_TO_FD: u32 = 0x3d0b;
    pub const IMPORT_OBJECTS_FROM_FD: u32 = 0x3d0c;
    /// `NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM`.
    pub const OBJECT_TYPE_RM: u32 = 1;
    /// EXPORT_OBJECT_TO_FD `flags` bit 0 (EMPTY_FD): refused by the kernel.
    pub const FLAGS_EMPTY_FD: u32 = 1;
    /// EXPORT_OBJECT_TO_FD (24 bytes).
    pub const EXP1_TYPE: usize = 0;
    pub const EXP1_H_DEVICE: usize = 4;
    pub const EXP1_H_PARENT: usize = 8;
    pub const EXP1_H_OBJECT: usize = 12;
    pub const EXP1_FD: usize = 16;
    pub const EXP1_FLAGS: usize = 20;
    /// EXPORT_OBJECTS_TO_FD (2128 bytes).
    pub const EXPN_FD: usize = 0;
    pub const EXPN_H_DEVICE: usize = 4;
    pub const EXPN_MAX_OBJECTS: usize = 8;
    pub const EXPN_METADATA: usize = 10;
    pub const EXPN_OBJECTS: usize = 76;
    pub const EXPN_NUM_OBJECTS: usize = 2124;
    pub const EXPN_INDEX: usize = 2126;
    pub const EXPN_MAX: usize = 512;
    /// IMPORT_OBJECT_FROM_FD (20 bytes).
    pub const IMP1_FD: usize = 0;
    pub const IMP1_TYPE: usize = 4;
    pub const IMP1_H_DEVICE: usize = 8;
    pub const IMP1_H_PARENT: usize = 12;
    pub const IMP1_H_OBJECT: usize = 16;
    /// IMPORT_OBJECTS_FROM_FD (652 bytes).
    pub const IMPN_FD: usize = 0;
    pub const IMPN_H_PARENT: usize = 4;
    pub const IMPN_OBJECTS: usize = 8;
    pub const IMPN_OBJECT_TYPES: usize = 520;
    pub const IMPN_NUM_OBJECTS: usize = 648;
    pub const IMPN_INDEX: usize = 650;
    pub const IMPN_MAX: usize = 128;
    /// objectTypes values.
    pub const IMPORT_TYPE_NONE: u8 = 0;
    pub const IMPORT_TYPE_VIDMEM: u8 = 1;
    pub const IMPORT_TYPE_SYSMEM: u8 = 2;
    pub const IMPORT_TYPE_FABRIC: u8 = 3;
    pub const IMPORT_TYPE_FABRIC_MC: u8 = 4;
}

/// NVOS33 + fd (RM_MAP_MEMORY).
pub mod nvos33 {
    pub const H_CLIENT: usize = 0;
    pub const H_DEVICE: usize = 4;
    pub const H_MEMORY: usize = 8;
    pub const OFFSET: usize = 16;
    pub const LENGTH: usize = 24;
    pub const P_LINEAR_ADDRESS: usize = 32;
    pub const STATUS: usize = 40;
    pub const FLAGS: usize = 44;
    pub const FD: usize = 48;
}

/// NVOS34 (RM_UNMAP_MEMORY). From `nvos.h`
/// (hClient, hDevice, hMemory, NvP64 pLinearAddress, status, flags).
pub mod nvos34 {
    pub const H_CLIENT: usize = 0;
    pub const H_DEVICE: usize = 4;
    pub const H_MEMORY: usize = 8;
    pub const P_LINEAR_ADDRESS: usize = 16;
    pub const STATUS: usize = 24;
    pub const FLAGS: usize = 28;
}

/// NVOS46 (RM_MAP_MEMORY_DMA).
pub mod nvos46 {
    pub const H_CLIENT: usize = 0;
    pub const H_DEVICE: usize = 4;
    pub const H_DMA: usize = 8;
    pub const H_MEMORY: usize = 12;
    pub const STATUS: usize = 56;
}

/// NVOS47 (RM_UNMAP_MEMORY_DMA). From `nvos.h`
/// (hClient, hDevice, hDma, hMemory, flags, u64 dmaOffset, u64 size, status).
pub mod nvos47 {
    pub const H_CLIENT: usize = 0;
    pub const H_MEMORY: usize = 12;
    pub const STATUS: usize = 40;
}

/// NVOS39 (RM_ALLOC_CONTEXT_DMA2). From `nvos.h`
/// (hObjectParent, hSubDevice, hObjectNew, hClass, flags, selector, hMemory,
/// u64 offset, u64 limit, status).
pub mod nvos39 {
    pub const STATUS: usize = 48;
}

/// NVOS55 (RM_DUP_OBJECT, 28 bytes).
pub mod nvos55 {
    pub const H_CLIENT: usize = 0;
    pub const H_PARENT: usize = 4;
    pub const H_OBJECT: usize = 8;
    pub const H_CLIENT_SRC: usize = 12;
    pub const H_OBJECT_SRC: usize = 16;
    pub const FLAGS: usize = 20;
    pub const STATUS: usize = 24;
}

/// NVOS57 (RM_SHARE): status is the last field (@20 of 24).
pub mod nvos57 {
    pub const STATUS: usize = 20;
}

/// `nv_ioctl_xfer_t`.
pub mod xfer {
    pub const CMD: usize = 0;
    pub const SIZE: usize = 4;
    pub const PTR: usize = 8;
    /// `NV_ABSOLUTE_MAX_IOCTL_SIZE` in `nv.c`: larger XFER sizes get -EINVAL.
    pub const MAX_SIZE: usize = 16384;
}

/// `nv_ioctl_card_info_t` (72 bytes per entry), from `nv-ioctl.h`.
pub mod card_info {
    pub const VALID: usize = 0;
    pub const PCI_DOMAIN: usize = 4;
    pub const PCI_BUS: usize = 8;
    pub const PCI_SLOT: usize = 9;
    pub const PCI_VENDOR_ID: usize = 12;
    pub const PCI_DEVICE_ID: usize = 14;
    pub const GPU_ID: usize = 16;
    pub const FB_SIZE: usize = 48;
    pub const MINOR_NUMBER: usize = 56;
}

/// `nv_ioctl_rm_api_version_t`: reply@4, 1 = NV_RM_API_VERSION_REPLY_RECOGNIZED.
pub mod rm_api_version {
    pub const REPLY: usize = 4;
    pub const REPLY_RECOGNIZED: u32 = 1;
}

/// `NV0080_ALLOC_PARAMETERS`.
pub mod nv0080 {
    pub const DEVICE_ID: usize = 0;
    pub const H_CLIENT_SHARE: usize = 4;
}

/// `NV_MEMORY_ALLOCATION_PARAMS` (128 bytes).
pub mod mem_alloc {
    pub const OWNER: usize = 0;
    pub const TYPE: usize = 4;
    pub const FLAGS: usize = 8;
    pub const SIZE: usize = 64;
    pub const ALIGNMENT: usize = 72;
    pub const OFFSET: usize = 80;
    pub const LIMIT: usize = 88;
    pub const ADDRESS: usize = 96;
    pub const H_VASPACE: usize = 108;
}

/// `NV_MEMORY_HW_RESOURCES_ALLOCATION_PARAMS` (`nvos.h`, 120 bytes in every
/// branch from 535 to 580): attr@12 (location bits 26:25 as NVOS32), size@72.
pub mod hw_resources {
    pub const SIZE_OF: usize = 120;
    pub const ATTR: usize = 12;
    pub const SIZE: usize = 72;
}

/// Class 0x71 alloc params (40 bytes).
pub mod os_descriptor {
    pub const DESCRIPTOR: usize = 16;
    pub const LIMIT: usize = 24;
}

/// TSG (0xA06C) alloc params (20 bytes).
pub mod tsg_alloc {
    pub const H_VASPACE: usize = 8;
    pub const ENGINE_TYPE: usize = 12;
}

/// GPFIFO channel alloc params (368 bytes).
pub mod channel_alloc {
    pub const GP_FIFO_OFFSET: usize = 8;
    pub const GP_FIFO_ENTRIES: usize = 16;
    pub const H_CONTEXT_SHARE: usize = 24;
    pub const H_VASPACE: usize = 28;
    pub const ENGINE_TYPE: usize = 128;
}

/// RM classes (`g_allclasses.h`).
pub mod class {
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
    /// `NV01_MEMORY_LOCAL_PRIVILEGED` (name from `g_allclasses.h`):
    /// RM_ALLOC_MEMORY writes limit 0xFFFFFFFF and allocates nothing.
    pub const NV01_MEMORY_LOCAL_PRIVILEGED: u32 = 0x3F;
    pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
    /// EGM (extended GPU memory, GH200).
    pub const NV_MEMORY_EXTENDED_USER: u32 = 0x42;
    pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
    pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xC2;
    /// Compression and other HW resources for a surface (`cl00b1.h`): takes no
    /// framebuffer of its own, but up to 545 the driver's per-process figure
    /// counts its size (`gpu_rmapi.c`).
    pub const NV01_MEMORY_HW_RESOURCES: u32 = 0xB1;
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50A0;
    pub const NV_MEMORY_FABRIC: u32 = 0xF8;
    /// The other 0-byte memory classes of the ABI table (names from
    /// `g_allclasses.h`): their memory is attached by controls, if any.
    pub const NV_MEMORY_FABRIC_IMPORT_V2: u32 = 0xF9;
    pub const NV_MEMORY_FABRIC_IMPORTED_REF: u32 = 0xFB;
    pub const NV_MEMORY_MULTICAST_FABRIC: u32 = 0xFD;
    pub const NV_MEMORY_EXPORT: u32 = 0xE0;
    pub const FERMI_VASPACE_A: u32 = 0x90F1;
    pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xA06C;
    pub const FERMI_CONTEXT_SHARE_A: u32 = 0x9067;
    pub const CHANNELS: [u32; 6] = [0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC96F, 0xCA6F];
    pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xC86F;
    pub const COMPUTE: [u32; 7] = [0xC5C0, 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0, 0xCDC0, 0xCEC0];
    pub const HOPPER_COMPUTE_A: u32 = 0xCBC0;
    pub const COPY: [u32; 2] = [0xC7B5, 0xC8B5];
    pub const HOPPER_DMA_COPY_A: u32 = 0xC8B5;
    /// Event classes, the only ones escape.c lets RM_ALLOC create through an
    /// `nvidiaN` file: NV01_EVENT 0x5, NV01_EVENT_KERNEL_CALLBACK 0x78,
    /// NV01_EVENT_OS_EVENT 0x79, NV01_EVENT_KERNEL_CALLBACK_EX 0x7E.
    pub const EVENTS: [u32; 4] = [0x5, 0x78, 0x79, 0x7E];
    /// The usermode (doorbell) classes: VOLTA 0xC361, TURING 0xC461, AMPERE
    /// 0xC561, HOPPER 0xC661 (`g_allclasses.h`).
    pub const USERMODE: [u32; 4] = [0xC361, 0xC461, 0xC561, 0xC661];
    /// NV2081_BINAPI (`class/cl2081.h`, params `{reserved}`): a handle under a
    /// subdevice for binary controls, allocated by libcuda 550 and 555 at
    /// cuInit (libcuda 535 does not).
    pub const NV2081_BINAPI: u32 = 0x2081;
}

/// `NV_STATUS` codes, from `src/common/sdk/nvidia/inc/nvstatuscodes.h`.
pub mod status {
    pub const NV_OK: u32 = 0x00;
    pub const NV_ERR_INSERT_DUPLICATE_NAME: u32 = 0x19;
    pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1E;
    pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1F;
    pub const NV_ERR_INVALID_CLASS: u32 = 0x22;
    pub const NV_ERR_INVALID_CLIENT: u32 = 0x23;
    pub const NV_ERR_INVALID_FUNCTION: u32 = 0x2A;
    pub const NV_ERR_INVALID_LIMIT: u32 = 0x2E;
    pub const NV_ERR_INVALID_OBJECT_HANDLE: u32 = 0x33;
    pub const NV_ERR_INVALID_OBJECT_PARENT: u32 = 0x36;
    /// From `nvstatuscodes.h`: what the export/import
    /// controls answer for a bad fd or params.
    pub const NV_ERR_INVALID_PARAMETER: u32 = 0x3B;
    pub const NV_ERR_NO_MEMORY: u32 = 0x51;
    pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
    pub const NV_ERR_OBJECT_NOT_FOUND: u32 = 0x57;
    /// index + numObjects past the export file's size.
    pub const NV_ERR_OUT_OF_RANGE: u32 = 0x5B;
    /// the export file already holds objects.
    pub const NV_ERR_STATE_IN_USE: u32 = 0x63;
    pub const NV_ERR_UVM_ADDRESS_IN_USE: u32 = 0x68;
}

/// nvidia-uvm commands (plain numbers, `_IOC_DIR` = NONE) and the byte
/// offsets of their parameters. INITIALIZE/DEINITIALIZE and the base/length
/// offsets are from docs/nvidia-abi.md; the `rmStatus` offsets of the others are
/// from `kernel-open/nvidia-uvm/uvm_ioctl.h` (see the crate docs).
pub mod uvm {
    pub const INITIALIZE: u32 = 0x3000_0001;
    pub const DEINITIALIZE: u32 = 0x3000_0002;
    pub const CREATE_RANGE_GROUP: u32 = 23;
    pub const DESTROY_RANGE_GROUP: u32 = 24;
    pub const REGISTER_GPU_VASPACE: u32 = 25;
    pub const UNREGISTER_GPU_VASPACE: u32 = 26;
    pub const REGISTER_CHANNEL: u32 = 27;
    pub const UNREGISTER_CHANNEL: u32 = 28;
    pub const MAP_EXTERNAL_ALLOCATION: u32 = 33;
    pub const FREE: u32 = 34;
    pub const REGISTER_GPU: u32 = 37;
    pub const UNREGISTER_GPU: u32 = 38;
    pub const PAGEABLE_MEM_ACCESS: u32 = 39;
    pub const MIGRATE: u32 = 51;
    pub const UNMAP_EXTERNAL: u32 = 66;
    pub const ALLOC_SEMAPHORE_POOL: u32 = 68;
    pub const VALIDATE_VA_RANGE: u32 = 72;
    pub const CREATE_EXTERNAL_RANGE: u32 = 73;
    pub const MM_INITIALIZE: u32 = 75;
    /// Highest ordinary UVM ioctl number we accept without modelling it.
    pub const MAX_PLAIN: u32 = 79;

    /// `{u64 flags; NV_STATUS rmStatus}`.
    pub const INITIALIZE_SIZE: usize = 16;
    pub const INITIALIZE_RM_STATUS: usize = 8;
    /// `{u64 rangeGroupId (out); NV_STATUS rmStatus}`.
    pub const CREATE_RANGE_GROUP_SIZE: usize = 16;
    pub const CREATE_RANGE_GROUP_ID: usize = 0;
    pub const CREATE_RANGE_GROUP_RM_STATUS: usize = 8;
    /// `{u64 rangeGroupId; NV_STATUS rmStatus}`.
    pub const DESTROY_RANGE_GROUP_SIZE: usize = 16;
    pub const DESTROY_RANGE_GROUP_RM_STATUS: usize = 8;
    /// `{uuid[16]; s32 rmCtrlFd; u32 hClient; u32 hVaSpace; rmStatus}`.
    pub const REGISTER_GPU_VASPACE_SIZE: usize = 32;
    pub const REGISTER_GPU_VASPACE_RM_STATUS: usize = 28;
    /// `{uuid[16]; rmStatus}` (UNREGISTER_GPU_VASPACE, UNREGISTER_GPU).
    pub const UUID_STATUS_SIZE: usize = 20;
    pub const UUID_STATUS_RM_STATUS: usize = 16;
    /// `{uuid[16]; s32 rmCtrlFd; u32 hClient; u32 hChannel; u64 base; u64 length; rmStatus}`.
    pub const REGISTER_CHANNEL_SIZE: usize = 56;
    pub const REGISTER_CHANNEL_RM_STATUS: usize = 48;
    /// `{uuid[16]; u32 hClient; u32 hChannel; rmStatus}`.
    pub const UNREGISTER_CHANNEL_SIZE: usize = 28;
    pub const UNREGISTER_CHANNEL_RM_STATUS: usize = 24;
    /// MAP_EXTERNAL_ALLOCATION: base@0, length@8; its size and rmStatus move
    /// with the driver version (per-GPU array): [`super::branch::uvm_map_external`].
    pub const BASE: usize = 0;
    pub const LENGTH: usize = 8;
    /// `{u64 base; u64 length; NV_STATUS rmStatus}` (FREE, CREATE_EXTERNAL_RANGE,
    /// VALIDATE_VA_RANGE).
    pub const BASE_LENGTH_STATUS_SIZE: usize = 24;
    pub const BASE_LENGTH_STATUS_RM_STATUS: usize = 16;
    /// `{uuid[16]; bool numaEnabled; s32 numaNodeId; s32 rmCtrlFd; u32 hClient;
    /// u32 hSmcPartRef; rmStatus}`.
    pub const REGISTER_GPU_SIZE: usize = 40;
    pub const REGISTER_GPU_RM_STATUS: usize = 36;
    /// `{bool pageableMemAccess; NV_STATUS rmStatus}`.
    pub const PAGEABLE_MEM_ACCESS_SIZE: usize = 8;
    pub const PAGEABLE_MEM_ACCESS_RM_STATUS: usize = 4;
    /// `{u64 base; u64 length; uuid[16]; rmStatus}`.
    pub const UNMAP_EXTERNAL_SIZE: usize = 36;
    pub const UNMAP_EXTERNAL_RM_STATUS: usize = 32;
    /// `{s32 uvmFd; NV_STATUS rmStatus}`.
    pub const MM_INITIALIZE_SIZE: usize = 8;
    pub const MM_INITIALIZE_RM_STATUS: usize = 4;
}

/// Video memory granularity of the simulated driver.
pub const VIDMEM_ROUND: u64 = 2 << 20;
/// Host memory granularity of the simulated driver.
pub const HOSTMEM_ROUND: u64 = 4 << 10;

/// Driver versions before this have the legacy NVOS21 / 40-byte NVOS64 layouts.
pub const PARAMS_SIZE_SINCE: u32 = 535;

/// Major number of a driver version string such as `"580.159"`.
pub fn version_major(version: &str) -> Option<u32> {
    version.split('.').next()?.trim().parse().ok()
}

/// A driver version as the simulator keys its layouts: `550.54.14` is
/// (550, 54, 14), `580.142` is (580, 142, 0); unparsable parts count as 0 and an
/// unparsable major as the newest driver. Ordered as releases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    pub fn of(version: &str) -> Self {
        let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next().flatten().unwrap_or(u32::MAX);
        let minor = parts.next().flatten().unwrap_or(0);
        let patch = parts.next().flatten().unwrap_or(0);
        Version(major, minor, patch)
    }
    pub fn at_least(self, major: u32, minor: u32, patch: u32) -> bool {
        self >= Version(major, minor, patch)
    }
}

/// What moved between the branches the simulator serves, as each tag's headers
/// have it (open-gpu-kernel-modules 535.261.03, 550.163.01, 555.58.02,
/// 570.211.01, 580.142; sizeof/offsetof compiled on x86_64). A version between
/// two tags takes the older tag's numbers. A second reading of the facts in
/// keling-common's `nvidia::branch`, written apart on purpose.
pub mod branch {
    use super::Version;
    /// NV_MEMORY_ALLOCATION_PARAMS: 120 bytes, 128 from 545 (numaNode@120).
    pub fn memory_allocation_params(v: Version) -> usize {
        if v.at_least(545, 0, 0) { 128 } else { 120 }
    }
    /// NVOS46 (RM_MAP_MEMORY_DMA): (size, status): 56 / @48, 64 / @56 from
    /// 580 (a u64 before dmaOffset).
    pub fn nvos46(v: Version) -> (usize, usize) {
        if v.at_least(580, 0, 0) {
            (64, 56)
        } else {
            (56, 48)
        }
    }
    /// NVOS47 (RM_UNMAP_MEMORY_DMA): (size, status): 40 / @32, 48 / @40 from 550.
    pub fn nvos47(v: Version) -> (usize, usize) {
        if v.at_least(550, 0, 0) {
            (48, 40)
        } else {
            (40, 32)
        }
    }
    /// UVM's per-GPU arrays: 32 entries, 256 from 550.40.53 (550.40.07 has 32).
    fn uvm_gpus(v: Version) -> usize {
        if v.at_least(550, 40, 53) { 256 } else { 32 }
    }
    /// UVM_MAP_EXTERNAL_ALLOCATION_PARAMS: (size, rmStatus). base, length,
    /// offset, perGpuAttributes[N] of 36 bytes, gpuAttributesCount (u64),
    /// rmCtrlFd, hClient, hMemory, rmStatus: 1200 / @1196 and 9264 / @9260.
    pub fn uvm_map_external(v: Version) -> (usize, usize) {
        match uvm_gpus(v) {
            32 => (1200, 1196),
            _ => (9264, 9260),
        }
    }
    /// UVM_ALLOC_SEMAPHORE_POOL_PARAMS: (size, rmStatus): 1184 / @1176 and 9248 / @9240.
    pub fn uvm_semaphore_pool(v: Version) -> (usize, usize) {
        match uvm_gpus(v) {
            32 => (1184, 1176),
            _ => (9248, 9240),
        }
    }
    /// UVM_FREE_PARAMS: (size, rmStatus): {base; length; rmStatus} up to 580,
    /// {base; rmStatus} from 590.
    pub fn uvm_free(v: Version) -> (usize, usize) {
        if v.at_least(590, 0, 0) {
            (16, 8)
        } else {
            (24, 16)
        }
    }
    /// nv_ioctl_export_to_dma_buf_fd_t: (size, status): 2600 / @2592, 2608 /
    /// @2600 from 570 (an index field before the handles).
    pub fn dmabuf_export(v: Version) -> (usize, usize) {
        if v.at_least(570, 0, 0) {
            (2608, 2600)
        } else {
            (2600, 2592)
        }
    }
    /// NV00FD_ALLOCATION_PARAMETERS: (size, allocSize): 40 / @8, 80 / @48 from 545.
    pub fn nv00fd(v: Version) -> (usize, usize) {
        if v.at_least(545, 0, 0) {
            (80, 48)
        } else {
            (40, 8)
        }
    }
    /// GPU_GET_PID_INFO's video memory (`gpuFindClientInfoWithPidIterator`,
    /// `gpu_rmapi.c`; first tag of open-gpu-kernel-modules that has each rule,
    /// the older tag before it does not): which device objects of a client
    /// count on a GPU. 535: `deviceGetByGpu`, the client's first device of
    /// that GPU (lowest handle); from 545.23.06 every device of the client on
    /// that GPU.
    pub fn pid_info_every_device(v: Version) -> bool {
        v.at_least(545, 0, 0)
    }
    /// Whether `_gpuCollectMemInfo` counts NV01_MEMORY_HW_RESOURCES (0xB1):
    /// up to 545.29.06; not from 550.40.07.
    pub fn pid_info_counts_hw_resources(v: Version) -> bool {
        !v.at_least(550, 0, 0)
    }
    /// Whether GPU_GET_PID_INFO matches the asked pid against a client's pid
    /// as the caller's pid namespace sees it (`_gpuMatchClientPid`, from
    /// 565.57.01); before, against the pid in the initial namespace.
    pub fn pid_info_in_callers_namespace(v: Version) -> bool {
        v.at_least(565, 0, 0)
    }
    /// UVM commands 76-79 from 565, 80 (DISCARD) from 580.
    pub fn uvm_last_command(v: Version) -> u32 {
        if v.at_least(580, 0, 0) {
            80
        } else if v.at_least(565, 0, 0) {
            79
        } else {
            75
        }
    }
}

/// Little-endian field access on a parameter buffer. Out-of-range reads give 0
/// and out-of-range writes are dropped; callers size their buffers first.
pub mod le {
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        b.get(off..off + 2)
            .map(|s| u16::from_le_bytes(s.try_into().expect("2 bytes")))
            .unwrap_or(0)
    }
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        b.get(off..off + 4)
            .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
            .unwrap_or(0)
    }
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        b.get(off..off + 8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
            .unwrap_or(0)
    }
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        if let Some(s) = b.get_mut(off..off + 4) {
            s.copy_from_slice(&v.to_le_bytes());
        }
    }
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        if let Some(s) = b.get_mut(off..off + 8) {
            s.copy_from_slice(&v.to_le_bytes());
        }
    }
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        if let Some(s) = b.get_mut(off..off + 2) {
            s.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The simulated GPUs' identity, shared by CARD_INFO, the controls that report
/// it (GPU_GET_GID_INFO, GPU_GET_NAME_STRING, BUS_GET_PCI_INFO) and the
/// sandbox's `/proc/driver/nvidia/gpus/*/information`.
pub mod gpu_id {
    /// Marketing name the controls and `/proc` report.
    pub const NAME: &str = "NVIDIA H200";
    /// PCI vendor (NVIDIA).
    pub const PCI_VENDOR: u16 = 0x10de;
    /// PCI device id of an H200 SXM.
    pub const PCI_DEVICE: u16 = 0x2335;

    /// PCI bus of simulated GPU `i` (domain 0, device 0, function 0).
    pub const fn pci_bus(i: u32) -> u32 {
        0x18 + i
    }

    /// The RM gpuId of GPU `i` (CARD_INFO, PROBED/ATTACHED_IDS): the driver
    /// derives it from the PCI location, bus << 8.
    pub const fn gpu_id(i: u32) -> u32 {
        pci_bus(i) << 8
    }

    /// A stable 16-byte UUID for GPU `i`.
    pub fn uuid(i: u32) -> [u8; 16] {
        let mut u = *b"Keling-nvsim\0\0\0\0";
        u[12..].copy_from_slice(&i.to_be_bytes());
        u
    }

    /// The UUID as NVIDIA prints it after "GPU-": 8-4-4-4-12 hex digits.
    pub fn uuid_text(i: u32) -> String {
        let h: String = uuid(i).iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}
