//! The NVIDIA driver's ioctl ABI, as far as Keling decodes it.
//!
//! The facts, and where each comes from upstream, are in docs/nvidia-abi.md
//! (open-gpu-kernel-modules 535.261.03 to 595.45.04, checked on x86_64). Offsets are byte offsets inside the parameter structs the process passes
//! to ioctl(2); the probes read the fields they need one by one from user memory, so
//! no struct is defined here and every offset has a name and a test.

pub mod branch;

/// Char major of `/dev/nvidiactl` and `/dev/nvidiaN`.
pub const NV_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NV_CTL_MINOR: u32 = 255;

/// `_IOWR('F', nr, size)`: the RM escapes' command encoding.
pub const fn rm_ioctl_cmd(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | (0x46 << 8) | nr
}
/// The kernel only looks at these bits of an RM command.
pub const fn rm_nr(cmd: u32) -> u32 {
    cmd & 0xff
}
pub const fn rm_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3fff
}
pub const fn rm_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}
/// The `_IOC_TYPE` of RM escapes ('F').
pub const RM_IOCTL_TYPE: u32 = 0x46;

named_consts! {
    /// RM escape numbers (`nr` of the command): every `NV_ESC_*` of driver 535
    /// (open-gpu-kernel-modules 535.261.03: `src/nvidia/arch/nvalloc/unix/include/nv_escape.h`
    /// for the `RM_*` ones, `kernel-open/common/inc/nv-ioctl-numbers.h` and
    /// `nv-ioctl-numa.h` for those from 200 on), plus WAIT_OPEN_COMPLETE (550 on) and
    /// ENV_INFO (older drivers). Numbers the 535 driver does not handle
    /// (`escape.c`'s `RmIoctl` and `nv.c`'s `nvidia_ioctl` refuse them) are named too,
    /// since programs still send them.
    pub mod escape {
        ALLOC_MEMORY = 0x27, "RM_ALLOC_MEMORY";
        /// NVOS05 (20 bytes): an object of a class that takes no parameters.
        ALLOC_OBJECT = 0x28, "RM_ALLOC_OBJECT";
        FREE = 0x29, "RM_FREE";
        CONTROL = 0x2A, "RM_CONTROL";
        ALLOC = 0x2B, "RM_ALLOC";
        /// Not built into 535 (`RMCFG_API_NV_ESC_RM_CONFIG_*` 0 in `rmconfig.h`).
        CONFIG_GET = 0x32, "RM_CONFIG_GET";
        CONFIG_SET = 0x33, "RM_CONFIG_SET";
        DUP_OBJECT = 0x34, "RM_DUP_OBJECT";
        SHARE = 0x35, "RM_SHARE";
        CONFIG_GET_EX = 0x37, "RM_CONFIG_GET_EX";
        CONFIG_SET_EX = 0x38, "RM_CONFIG_SET_EX";
        I2C_ACCESS = 0x39, "RM_I2C_ACCESS";
        IDLE_CHANNELS = 0x41, "RM_IDLE_CHANNELS";
        VID_HEAP_CONTROL = 0x4A, "RM_VID_HEAP_CONTROL";
        ACCESS_REGISTRY = 0x4D, "RM_ACCESS_REGISTRY";
        MAP_MEMORY = 0x4E, "RM_MAP_MEMORY";
        UNMAP_MEMORY = 0x4F, "RM_UNMAP_MEMORY";
        GET_EVENT_DATA = 0x52, "RM_GET_EVENT_DATA";
        ALLOC_CONTEXT_DMA2 = 0x54, "RM_ALLOC_CONTEXT_DMA2";
        ADD_VBLANK_CALLBACK = 0x56, "RM_ADD_VBLANK_CALLBACK";
        MAP_MEMORY_DMA = 0x57, "RM_MAP_MEMORY_DMA";
        UNMAP_MEMORY_DMA = 0x58, "RM_UNMAP_MEMORY_DMA";
        BIND_CONTEXT_DMA = 0x59, "RM_BIND_CONTEXT_DMA";
        /// The escape forms of export/import (the driver uses the NV0000 controls;
        /// 535's `RmIoctl` refuses these).
        EXPORT_OBJECT_TO_FD = 0x5C, "RM_EXPORT_OBJECT_TO_FD";
        IMPORT_OBJECT_FROM_FD = 0x5D, "RM_IMPORT_OBJECT_FROM_FD";
        UPDATE_DEVICE_MAPPING_INFO = 0x5E, "RM_UPDATE_DEVICE_MAPPING_INFO";
        /// NVLOG_CTRL up to 535; LOCKLESS_DIAGNOSTIC from 545 (same number, another
        /// escape: [`super::branch::Escape5F`]). Neither touches memory.
        NVLOG_CTRL = 0x5F, "RM_NVLOG_CTRL";
        CARD_INFO = 200, "CARD_INFO";
        REGISTER_FD = 201, "REGISTER_FD";
        /// `NV_IOCTL_BASE + 2` in older drivers' `nv.h` (4 bytes); the API is still
        /// listed in 535's `rmconfig.h` but no 535 header defines the number and the
        /// driver refuses it (libcuda 535 sends it at cuInit and carries on).
        ENV_INFO = 202, "ENV_INFO";
        ALLOC_OS_EVENT = 206, "ALLOC_OS_EVENT";
        FREE_OS_EVENT = 207, "FREE_OS_EVENT";
        STATUS_CODE = 209, "STATUS_CODE";
        CHECK_VERSION_STR = 210, "CHECK_VERSION_STR";
        XFER_CMD = 211, "XFER_CMD";
        ATTACH_GPUS_TO_FD = 212, "ATTACH_GPUS_TO_FD";
        QUERY_DEVICE_INTR = 213, "QUERY_DEVICE_INTR";
        SYS_PARAMS = 214, "SYS_PARAMS";
        NUMA_INFO = 215, "NUMA_INFO";
        SET_NUMA_STATUS = 216, "SET_NUMA_STATUS";
        /// A dma-buf of memory handles: the driver dups them into its own internal
        /// client, so the memory may outlive the caller's handles, billed to no process
        /// (as the driver's per-process figure does).
        EXPORT_TO_DMABUF_FD = 217, "EXPORT_TO_DMABUF_FD";
        /// Driver 550 and later.
        WAIT_OPEN_COMPLETE = 218, "WAIT_OPEN_COMPLETE";
    }

    /// LOCKLESS_DIAGNOSTIC from 545: the number of NVLOG_CTRL, another escape
    /// ([`super::branch::Escape5F`]); named by branch by the agent, so not a row.
    pub const LOCKLESS_DIAGNOSTIC: u32 = NVLOG_CTRL;

    /// Escapes that neither allocate nor free memory, whatever their parameters:
    /// decoded as such (nvproxy's compute allowlist for those CUDA sends; for the
    /// rest the driver's own handlers). Every escape Keling names is either here or
    /// decoded field by field (ALLOC, ALLOC_OBJECT, ALLOC_MEMORY, FREE, CONTROL,
    /// DUP_OBJECT, VID_HEAP_CONTROL, MAP/UNMAP_MEMORY, REGISTER_FD, XFER_CMD).
    pub const fn carries_no_memory(nr: u32) -> bool {
        matches!(
            nr,
            CARD_INFO
                | REGISTER_FD
                | ENV_INFO
                | CHECK_VERSION_STR
                | ATTACH_GPUS_TO_FD
                | ALLOC_OS_EVENT
                | FREE_OS_EVENT
                | STATUS_CODE
                | QUERY_DEVICE_INTR
                | SYS_PARAMS
                | NUMA_INFO
                | SET_NUMA_STATUS
                | EXPORT_TO_DMABUF_FD
                | WAIT_OPEN_COMPLETE
                | UPDATE_DEVICE_MAPPING_INFO
                | SHARE
                | ALLOC_CONTEXT_DMA2
                | MAP_MEMORY_DMA
                | UNMAP_MEMORY_DMA
                | BIND_CONTEXT_DMA
                | CONFIG_GET
                | CONFIG_SET
                | CONFIG_GET_EX
                | CONFIG_SET_EX
                | I2C_ACCESS
                | IDLE_CHANNELS
                | ACCESS_REGISTRY
                | GET_EVENT_DATA
                | ADD_VBLANK_CALLBACK
                | EXPORT_OBJECT_TO_FD
                | IMPORT_OBJECT_FROM_FD
                | NVLOG_CTRL
        )
    }

    /// Escapes decoded field by field because they may allocate, free, share or
    /// name memory (XFER_CMD: the escape it carries is). Every named escape is in
    /// exactly one of this and [`carries_no_memory`] (a test checks).
    pub const fn decoded(nr: u32) -> bool {
        matches!(
            nr,
            ALLOC
                | ALLOC_OBJECT
                | ALLOC_MEMORY
                | FREE
                | CONTROL
                | DUP_OBJECT
                | VID_HEAP_CONTROL
                | MAP_MEMORY
                | UNMAP_MEMORY
                | XFER_CMD
        )
    }
}

/// Parameter sizes that the driver requires exactly.
pub mod size {
    pub const NVOS00_FREE: u32 = 16;
    pub const NVOS54_CONTROL: u32 = 32;
    pub const NVOS21_ALLOC: u32 = 32;
    pub const NVOS05_ALLOC_OBJECT: u32 = 20;
    pub const NVOS64_ALLOC: u32 = 48;
    /// NVOS02 (48) + `int fd` + padding.
    pub const NVOS02_ALLOC_MEMORY: u32 = 56;
    pub const NVOS32_VID_HEAP: u32 = 184;
    pub const NVOS33_MAP_MEMORY: u32 = 56;
    pub const NVOS34_UNMAP_MEMORY: u32 = 32;
    pub const NVOS55_DUP_OBJECT: u32 = 28;
    pub const XFER: u32 = 16;
}

/// NVOS55 (RM_DUP_OBJECT): a new handle referring to an existing object.
pub mod nvos55 {
    pub const H_CLIENT: usize = 0;
    pub const H_PARENT: usize = 4;
    /// In/out: 0 in means the driver picks it.
    pub const H_OBJECT: usize = 8;
    pub const H_CLIENT_SRC: usize = 12;
    pub const H_OBJECT_SRC: usize = 16;
    pub const STATUS: usize = 24;
}

/// NVOS00 (RM_FREE).
pub mod nvos00 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_OLD: usize = 8;
    pub const STATUS: usize = 12;
}

/// NVOS05 (RM_ALLOC_OBJECT): hRoot, hObjectParent, hObjectNew and hClass as in
/// NVOS21, then status; no parameters (`RmDeprecatedAllocObject` allocates with
/// NULL params, which every memory class refuses: `RS_REQUIRED` in
/// `resource_list.h`).
pub mod nvos05 {
    pub const STATUS: usize = 16;
}

/// NVOS21 / NVOS64 (RM_ALLOC). The first 24 bytes are shared.
pub mod nvos21 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
    pub const P_ALLOC_PARMS: usize = 16;
    /// Driver 535 and later.
    pub const STATUS: usize = 28;
    /// Before 535 (no `paramsSize`; same total size).
    pub const STATUS_PRE_535: usize = 24;
}
pub mod nvos64 {
    pub const STATUS: usize = 40;
    pub const FLAGS: usize = 36;
    /// Drivers 525-530: 40 bytes, no paramsSize.
    pub const SIZE_PRE_535: u32 = 40;
    pub const STATUS_PRE_535: usize = 36;
    pub const FLAGS_PRE_535: usize = 32;
    /// `flags & 1`: params are FINN-serialized (not decoded).
    pub const FLAGS_FINN_SERIALIZED: u32 = 1;
}
/// First driver version with NVOS21.paramsSize (status moved from @24 to @28).
pub const NVOS21_PARAMS_SIZE_SINCE_MAJOR: u32 = 535;

/// NVOS54 (RM_CONTROL).
pub mod nvos54 {
    pub const H_CLIENT: usize = 0;
    pub const H_OBJECT: usize = 4;
    pub const CMD: usize = 8;
    pub const FLAGS: usize = 12;
    /// Pointer to the control's own params, and their size.
    pub const PARAMS: usize = 16;
    pub const PARAMS_SIZE: usize = 24;
    pub const STATUS: usize = 28;
    /// `flags & 4`: params are FINN-serialized.
    pub const FLAGS_FINN_SERIALIZED: u32 = 4;
}

/// The RM controls that share memory between clients and processes (CUDA IPC, NCCL),
/// sent on the client object (`rmobjexportimport.c`).
pub mod ctrl {
    /// NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD (24 bytes): type@0, hDevice@4,
    /// hParent@8, hObject@12, fd@16, flags@20. The object goes to position 0.
    pub const EXPORT_OBJECT_TO_FD: u32 = 0x3d05;
    pub const EXPORT_SIZE: u32 = 24;
    pub const EXPORT_H_OBJECT: usize = 12;
    pub const EXPORT_FD: usize = 16;
    /// NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD (20 bytes): fd@0, type@4,
    /// hDevice@8, hParent@12, hObject@16 (in/out).
    pub const IMPORT_OBJECT_FROM_FD: u32 = 0x3d06;
    pub const IMPORT_SIZE: u32 = 20;
    pub const IMPORT_FD: usize = 0;
    pub const IMPORT_H_PARENT: usize = 12;
    pub const IMPORT_H_OBJECT: usize = 16;
    /// NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD (2128 bytes): fd@0, hDevice@4,
    /// maxObjects u16@8, metadata[64]@10, objects[512] u32@76, numObjects u16@2124,
    /// index u16@2126. Object i goes to position index + i.
    pub const EXPORT_OBJECTS_TO_FD: u32 = 0x3d0b;
    pub const EXPORT_BATCH_SIZE: u32 = 2128;
    pub const EXPORT_BATCH_FD: usize = 0;
    pub const EXPORT_BATCH_OBJECTS: usize = 76;
    pub const EXPORT_BATCH_NUM: usize = 2124;
    pub const EXPORT_BATCH_INDEX: usize = 2126;
    /// NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD (652 bytes): fd@0, hParent@4,
    /// objects[128] u32@8 (in/out), objectTypes[128] u8@520, numObjects u16@648,
    /// index u16@650.
    pub const IMPORT_OBJECTS_FROM_FD: u32 = 0x3d0c;
    pub const IMPORT_BATCH_SIZE: u32 = 652;
    pub const IMPORT_BATCH_FD: usize = 0;
    pub const IMPORT_BATCH_H_PARENT: usize = 4;
    pub const IMPORT_BATCH_OBJECTS: usize = 8;
    pub const IMPORT_BATCH_NUM: usize = 648;
    pub const IMPORT_BATCH_INDEX: usize = 650;
}

/// NVOS02 (RM_ALLOC_MEMORY, on nvidiaN).
pub mod nvos02 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
    /// Size - 1. For class 0x40 the driver allocates nothing and writes the whole
    /// heap size - 1 here (`rmapi_deprecated_allocmemory.c:305-356`).
    pub const LIMIT: usize = 32;
    pub const STATUS: usize = 40;
}

/// NVOS32 (RM_VID_HEAP_CONTROL).
pub mod nvos32 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const FUNCTION: usize = 8;
    pub const STATUS: usize = 20;
    /// Both union arms (AllocSize and Free) start with owner@40, hMemory@44.
    pub const H_MEMORY: usize = 44;
    /// AllocSize (and AllocSizeRange): flags@52, attr@56, size@88 in/out, attr2@144.
    pub const FLAGS: usize = 52;
    pub const ATTR: usize = 56;
    pub const ALLOC_SIZE: usize = 88;
    pub const ATTR2: usize = 144;
    /// AllocSizeRange: size@80.
    pub const ALLOC_SIZE_RANGE_SIZE: usize = 80;
    /// AllocOsDescriptor: hMemory@40, limit@72.
    pub const OS_DESCRIPTOR_H_MEMORY: usize = 40;
    pub const OS_DESCRIPTOR_LIMIT: usize = 72;
    pub const FUNCTION_ALLOC_SIZE: u32 = 2;
    pub const FUNCTION_FREE: u32 = 3;
    pub const FUNCTION_ALLOC_SIZE_RANGE: u32 = 14;
    pub const FUNCTION_ALLOC_OS_DESCRIPTOR: u32 = 27;
    /// `flags & VIRTUAL`: a virtual range (class 0x50A0), no bytes.
    pub const FLAGS_VIRTUAL: u32 = 0x8_0000;
    /// `attr2 & USE_EGM` (driver 550 and later): EGM (class 0x42).
    pub const ATTR2_USE_EGM: u32 = 1 << 24;
    /// `attr` bits 26:25 == 0: video memory (class 0x40); else host (0x3E).
    pub const ATTR_LOCATION_SHIFT: u32 = 25;
    pub const ATTR_LOCATION_MASK: u32 = 3;
    /// First driver with the EGM bit.
    pub const EGM_SINCE_MAJOR: u32 = 550;

    /// The memory kind the driver picks for an ALLOC_SIZE(_RANGE) from its inputs
    /// (`rmapi_deprecated_vidheapctrl.c:136-145`): None for a virtual range.
    pub const fn classify(flags: u32, attr: u32, attr2: u32, egm_bit: bool) -> Option<u32> {
        if flags & FLAGS_VIRTUAL != 0 {
            None
        } else if egm_bit && attr2 & ATTR2_USE_EGM != 0 {
            Some(crate::mem_kind::EGM)
        } else if (attr >> ATTR_LOCATION_SHIFT) & ATTR_LOCATION_MASK == 0 {
            Some(crate::mem_kind::VIDEO)
        } else {
            Some(crate::mem_kind::HOST)
        }
    }
}

/// NVOS33 (RM_MAP_MEMORY) and NVOS34 (RM_UNMAP_MEMORY).
pub mod nvos33 {
    pub const H_CLIENT: usize = 0;
    pub const H_MEMORY: usize = 8;
    pub const STATUS: usize = 40;
}
pub mod nvos34 {
    pub const H_CLIENT: usize = 0;
    pub const H_MEMORY: usize = 8;
    /// NVOS34: hClient, hDevice, hMemory, pad, pLinearAddress@16, status@24, flags@28.
    pub const STATUS: usize = 24;
}

/// XFER_CMD: `{u32 cmd; u32 size; u64 ptr}`.
pub mod xfer {
    pub const CMD: usize = 0;
    pub const SIZE: usize = 4;
    pub const PTR: usize = 8;
}

/// `NV0080_ALLOC_PARAMETERS.deviceId`: which GPU a device object is.
pub const NV0080_DEVICE_ID: usize = 0;
/// `NV_MEMORY_ALLOCATION_PARAMS.size` (u64, in/out: read at syscall exit). The
/// struct's own size moved (120 -> 128 at 545: [`branch::Layout`]); this did not.
pub const MEMORY_ALLOCATION_PARAMS_SIZE: usize = 64;
/// `NV_OS_DESC_MEMORY_ALLOCATION_PARAMS.limit` (class 0x71, 40 bytes): size - 1.
pub const OS_DESC_LIMIT: usize = 24;

/// RM status codes Keling names.
pub mod status {
    pub const OK: u32 = 0;
    pub const NO_MEMORY: u32 = 0x51;
    pub const INVALID_ARGUMENT: u32 = 0x1F;
}

/// `NV_MEMORY_HW_RESOURCES_ALLOCATION_PARAMS` (`nvos.h`, 120 bytes in every
/// branch from 535 to 580): attr@12 (location bits as NVOS32's,
/// [`nvos32::ATTR_LOCATION_SHIFT`]; 0 is video memory), size@72.
pub mod hw_resources {
    pub const ATTR: usize = 12;
    pub const SIZE: usize = 72;
}

named_consts! {
    /// RM classes (`g_allclasses.h`), each with its NVIDIA name.
    pub mod class {
        NV01_ROOT = 0x0, "NV01_ROOT";
        NV01_ROOT_NON_PRIV = 0x1, "NV01_ROOT_NON_PRIV";
        NV01_MEMORY_SYSTEM = 0x3E, "NV01_MEMORY_SYSTEM";
        /// RM_ALLOC_MEMORY writes limit 0xFFFFFFFF, allocates nothing.
        NV01_MEMORY_LOCAL_PRIVILEGED = 0x3F, "NV01_MEMORY_LOCAL_PRIVILEGED";
        NV01_MEMORY_LOCAL_USER = 0x40, "NV01_MEMORY_LOCAL_USER";
        NV01_ROOT_CLIENT = 0x41, "NV01_ROOT_CLIENT";
        /// EGM.
        NV_MEMORY_EXTENDED_USER = 0x42, "NV_MEMORY_EXTENDED_USER";
        NV01_MEMORY_VIRTUAL = 0x70, "NV01_MEMORY_VIRTUAL";
        NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71, "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR";
        NV01_DEVICE_0 = 0x80, "NV01_DEVICE_0";
        /// Takes no framebuffer of its own; its size is in the driver's per-process
        /// figure up to 545 only ([`super::hw_resources`]).
        NV01_MEMORY_HW_RESOURCES = 0xB1, "NV01_MEMORY_HW_RESOURCES";
        NV01_MEMORY_LOCAL_PHYSICAL = 0xC2, "NV01_MEMORY_LOCAL_PHYSICAL";
        /// NV_MEMORY_EXPORT: listed among the 0-byte classes in the ABI facts.
        CLASS_0XE0 = 0xE0, "NV_MEMORY_EXPORT";
        NV_MEMORY_FABRIC = 0xF8, "NV_MEMORY_FABRIC";
        /// Address ranges and handles whose memory is attached by controls: no
        /// bytes (this and the three below).
        NV_MEMORY_FABRIC_IMPORT_V2 = 0xF9, "NV_MEMORY_FABRIC_IMPORT_V2";
        NV_MEMORY_FABRIC_IMPORTED_REF = 0xFB, "NV_MEMORY_FABRIC_IMPORTED_REF";
        NV_MEMORY_MULTICAST_FABRIC = 0xFD, "NV_MEMORY_MULTICAST_FABRIC";
        NV_MEMORY_MAPPER = 0xFE, "NV_MEMORY_MAPPER";
        NV20_SUBDEVICE_0 = 0x2080, "NV20_SUBDEVICE_0";
        NV50_MEMORY_VIRTUAL = 0x50A0, "NV50_MEMORY_VIRTUAL";
        FERMI_CONTEXT_SHARE_A = 0x9067, "FERMI_CONTEXT_SHARE_A";
        FERMI_VASPACE_A = 0x90F1, "FERMI_VASPACE_A";
        KEPLER_CHANNEL_GROUP_A = 0xA06C, "KEPLER_CHANNEL_GROUP_A";
        VOLTA_CHANNEL_GPFIFO_A = 0xC36F, "VOLTA_CHANNEL_GPFIFO_A";
        TURING_CHANNEL_GPFIFO_A = 0xC46F, "TURING_CHANNEL_GPFIFO_A";
        AMPERE_CHANNEL_GPFIFO_A = 0xC56F, "AMPERE_CHANNEL_GPFIFO_A";
        TURING_COMPUTE_A = 0xC5C0, "TURING_COMPUTE_A";
        AMPERE_COMPUTE_A = 0xC6C0, "AMPERE_COMPUTE_A";
        AMPERE_DMA_COPY_B = 0xC7B5, "AMPERE_DMA_COPY_B";
        AMPERE_COMPUTE_B = 0xC7C0, "AMPERE_COMPUTE_B";
        HOPPER_CHANNEL_GPFIFO_A = 0xC86F, "HOPPER_CHANNEL_GPFIFO_A";
        HOPPER_DMA_COPY_A = 0xC8B5, "HOPPER_DMA_COPY_A";
        BLACKWELL_CHANNEL_GPFIFO_A = 0xC96F, "BLACKWELL_CHANNEL_GPFIFO_A";
        ADA_COMPUTE_A = 0xC9C0, "ADA_COMPUTE_A";
        BLACKWELL_CHANNEL_GPFIFO_B = 0xCA6F, "BLACKWELL_CHANNEL_GPFIFO_B";
        HOPPER_COMPUTE_A = 0xCBC0, "HOPPER_COMPUTE_A";
        BLACKWELL_COMPUTE_A = 0xCDC0, "BLACKWELL_COMPUTE_A";
        BLACKWELL_COMPUTE_B = 0xCEC0, "BLACKWELL_COMPUTE_B";
    }

    /// Channel (GPFIFO) classes, Volta to Blackwell.
    pub const GPFIFO: [u32; 6] = [
        VOLTA_CHANNEL_GPFIFO_A,
        TURING_CHANNEL_GPFIFO_A,
        AMPERE_CHANNEL_GPFIFO_A,
        HOPPER_CHANNEL_GPFIFO_A,
        BLACKWELL_CHANNEL_GPFIFO_A,
        BLACKWELL_CHANNEL_GPFIFO_B,
    ];
    /// Compute classes, Turing to Blackwell.
    pub const COMPUTE: [u32; 7] = [
        TURING_COMPUTE_A,
        AMPERE_COMPUTE_A,
        AMPERE_COMPUTE_B,
        ADA_COMPUTE_A,
        HOPPER_COMPUTE_A,
        BLACKWELL_COMPUTE_A,
        BLACKWELL_COMPUTE_B,
    ];
    /// Copy engine classes.
    pub const COPY: [u32; 2] = [AMPERE_DMA_COPY_B, HOPPER_DMA_COPY_A];
}

/// What an RM object is, as Keling reports it. `#[repr(u32)]` for the events.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Other = 0,
    Client = 1,
    Device = 2,
    Subdevice = 3,
    VaSpace = 4,
    ChannelGroup = 5,
    ContextShare = 6,
    Channel = 7,
    Compute = 8,
    Copy = 9,
    /// Video memory: counted in the GPU totals.
    VideoMemory = 10,
    /// Pinned host memory: counted apart.
    HostMemory = 11,
    /// Memory objects that hold no bytes: virtual ranges, views of physical memory,
    /// fabric and multicast handles, `RM_ALLOC_MEMORY` of video memory.
    VirtualMemory = 12,
    /// Extended GPU memory (EGM): its own kind, neither video nor host.
    ExtendedMemory = 13,
}

impl ObjectKind {
    pub const fn of_class(class: u32) -> Self {
        match class {
            class::NV01_ROOT | class::NV01_ROOT_NON_PRIV | class::NV01_ROOT_CLIENT => Self::Client,
            class::NV01_DEVICE_0 => Self::Device,
            class::NV20_SUBDEVICE_0 => Self::Subdevice,
            class::FERMI_VASPACE_A => Self::VaSpace,
            class::KEPLER_CHANNEL_GROUP_A => Self::ChannelGroup,
            class::FERMI_CONTEXT_SHARE_A => Self::ContextShare,
            class::NV01_MEMORY_LOCAL_USER => Self::VideoMemory,
            class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => Self::HostMemory,
            class::NV_MEMORY_EXTENDED_USER => Self::ExtendedMemory,
            class::NV01_MEMORY_VIRTUAL
            | class::NV50_MEMORY_VIRTUAL
            | class::NV01_MEMORY_LOCAL_PHYSICAL
            | class::NV01_MEMORY_LOCAL_PRIVILEGED
            | class::NV_MEMORY_FABRIC
            | class::NV_MEMORY_MULTICAST_FABRIC
            | class::NV_MEMORY_FABRIC_IMPORT_V2
            | class::NV_MEMORY_FABRIC_IMPORTED_REF
            | class::CLASS_0XE0 => Self::VirtualMemory,
            0xC36F | 0xC46F | 0xC56F | 0xC86F | 0xC96F | 0xCA6F => Self::Channel,
            0xC5C0 | 0xC6C0 | 0xC7C0 | 0xC9C0 | 0xCBC0 | 0xCDC0 | 0xCEC0 => Self::Compute,
            0xC7B5 | 0xC8B5 => Self::Copy,
            _ => Self::Other,
        }
    }

    /// Every kind, in code order.
    pub const ALL: [Self; 14] = [
        Self::Other,
        Self::Client,
        Self::Device,
        Self::Subdevice,
        Self::VaSpace,
        Self::ChannelGroup,
        Self::ContextShare,
        Self::Channel,
        Self::Compute,
        Self::Copy,
        Self::VideoMemory,
        Self::HostMemory,
        Self::VirtualMemory,
        Self::ExtendedMemory,
    ];

    /// The number on the wire.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The name every output prints.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Other => "other",
            Self::Client => "client",
            Self::Device => "device",
            Self::Subdevice => "subdevice",
            Self::VaSpace => "vaspace",
            Self::ChannelGroup => "channel_group",
            Self::ContextShare => "context_share",
            Self::Channel => "channel",
            Self::Compute => "compute",
            Self::Copy => "copy",
            Self::VideoMemory => "video_memory",
            Self::HostMemory => "host_memory",
            Self::VirtualMemory => "virtual_memory",
            Self::ExtendedMemory => "extended_memory",
        }
    }

    /// The kind named `name` (as [`Self::name`] prints it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind of `code`; `None` for a number that is no kind (the agent's
    /// decoder refuses it; the probes read kinds with [`Self::from_u32`]).
    pub const fn from_raw(code: u32) -> Option<Self> {
        let k = Self::from_u32(code);
        if k as u32 == code { Some(k) } else { None }
    }

    /// The kind of `v`, [`Self::Other`] for a number that is no kind.
    pub const fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Client,
            2 => Self::Device,
            3 => Self::Subdevice,
            4 => Self::VaSpace,
            5 => Self::ChannelGroup,
            6 => Self::ContextShare,
            7 => Self::Channel,
            8 => Self::Compute,
            9 => Self::Copy,
            10 => Self::VideoMemory,
            11 => Self::HostMemory,
            12 => Self::VirtualMemory,
            13 => Self::ExtendedMemory,
            _ => Self::Other,
        }
    }

    /// Classes whose allocation parameters are `NV_MEMORY_ALLOCATION_PARAMS` with a
    /// size worth reading (class 0x50A0 has them too, but holds no bytes).
    pub const fn has_memory_params(class: u32) -> bool {
        matches!(
            class,
            class::NV01_MEMORY_LOCAL_USER
                | class::NV01_MEMORY_SYSTEM
                | class::NV_MEMORY_EXTENDED_USER
        )
    }

    /// The [`crate::mem_kind`] of memory of this object kind (None: no bytes).
    pub const fn mem_kind(self) -> Option<u32> {
        match self {
            Self::VideoMemory => Some(crate::mem_kind::VIDEO),
            Self::HostMemory => Some(crate::mem_kind::HOST),
            Self::ExtendedMemory => Some(crate::mem_kind::EGM),
            _ => None,
        }
    }
}

/// nvidia-uvm commands: plain numbers, not `_IOC`-encoded.
pub mod uvm {
    pub const INITIALIZE: u32 = 0x3000_0001;
    pub const DEINITIALIZE: u32 = 0x3000_0002;
    pub const CREATE_RANGE_GROUP: u32 = 23;
    pub const REGISTER_GPU_VASPACE: u32 = 25;
    pub const REGISTER_CHANNEL: u32 = 27;
    pub const MAP_EXTERNAL_ALLOCATION: u32 = 33;
    pub const FREE: u32 = 34;
    pub const REGISTER_GPU: u32 = 37;
    pub const PAGEABLE_MEM_ACCESS: u32 = 39;
    pub const MIGRATE: u32 = 51;
    pub const UNMAP_EXTERNAL: u32 = 66;
    pub const ALLOC_SEMAPHORE_POOL: u32 = 68;
    pub const CREATE_EXTERNAL_RANGE: u32 = 73;
    pub const MM_INITIALIZE: u32 = 75;
    /// 565 and later.
    pub const TOOLS_INIT_EVENT_TRACKER_V2: u32 = 76;
    pub const TOOLS_GET_PROCESSOR_UUID_TABLE_V2: u32 = 77;
    pub const ALLOC_DEVICE_P2P: u32 = 78;
    pub const CLEAR_ALL_ACCESS_COUNTERS: u32 = 79;
    /// 580 and later.
    pub const DISCARD: u32 = 80;
    /// `UVM_IOCTL_BASE(2047)`: the highest plain command number (they count down
    /// from it for temporary commands; uvm_ioctl.h).
    pub const IS_8_SUPPORTED: u32 = 2047;
    /// `{u64 flags; u32 rmStatus}`.
    pub const INITIALIZE_RM_STATUS: usize = 8;
    /// `{u64 base; u64 length; u32 rmStatus}` up to 580, `{u64 base; u32 rmStatus}`
    /// from 590 ([`super::branch::Layout::uvm_free_rm_status`]).
    pub const FREE_RM_STATUS: usize = 16;
    /// CREATE_EXTERNAL_RANGE: `{u64 base; u64 length; u32 rmStatus}` in every branch.
    pub const CREATE_EXTERNAL_RANGE_RM_STATUS: usize = 16;
    /// CREATE_EXTERNAL_RANGE and MAP_EXTERNAL_ALLOCATION: base@0, length@8.
    pub const BASE: usize = 0;
    pub const LENGTH: usize = 8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_encoding_matches_the_abi_table() {
        assert_eq!(rm_ioctl_cmd(escape::ALLOC_MEMORY, 56), 0xC038_4627);
        assert_eq!(rm_ioctl_cmd(escape::FREE, 16), 0xC010_4629);
        assert_eq!(rm_ioctl_cmd(escape::CONTROL, 32), 0xC020_462A);
        assert_eq!(rm_ioctl_cmd(escape::ALLOC, 32), 0xC020_462B);
        assert_eq!(rm_ioctl_cmd(escape::ALLOC, 48), 0xC030_462B);
        assert_eq!(rm_ioctl_cmd(escape::DUP_OBJECT, 28), 0xC01C_4634);
        assert_eq!(rm_ioctl_cmd(escape::SHARE, 24), 0xC018_4635);
        assert_eq!(rm_ioctl_cmd(escape::VID_HEAP_CONTROL, 184), 0xC0B8_464A);
        assert_eq!(rm_ioctl_cmd(escape::MAP_MEMORY, 56), 0xC038_464E);
        assert_eq!(rm_ioctl_cmd(escape::UNMAP_MEMORY, 32), 0xC020_464F);
        assert_eq!(rm_ioctl_cmd(escape::ALLOC_CONTEXT_DMA2, 56), 0xC038_4654);
        assert_eq!(rm_ioctl_cmd(escape::MAP_MEMORY_DMA, 64), 0xC040_4657);
        assert_eq!(rm_ioctl_cmd(escape::UNMAP_MEMORY_DMA, 48), 0xC030_4658);
        assert_eq!(rm_ioctl_cmd(escape::REGISTER_FD, 4), 0xC004_46C9);
        let c = 0xC030_462B;
        assert_eq!(
            (rm_nr(c), rm_size(c), rm_type(c)),
            (0x2B, 48, RM_IOCTL_TYPE)
        );
    }

    /// The NVIDIA numbering sets: each row's name leads back to its number, no two
    /// rows share a name, and numbers outside the set have none.
    #[test]
    fn abi_names_are_unique_and_found_by_number() {
        for names in [escape::NAMES, class::NAMES] {
            for (i, &(code, name)) in names.iter().enumerate() {
                assert!(!name.is_empty(), "{code:#x}");
                for &(other, other_name) in &names[i + 1..] {
                    assert!(code < other, "{code:#x} before {other:#x}");
                    assert_ne!(name, other_name, "{code:#x} and {other:#x}");
                }
            }
        }
        assert_eq!(escape::name(escape::ALLOC), Some("RM_ALLOC"));
        assert_eq!(escape::name(escape::XFER_CMD), Some("XFER_CMD"));
        // 0x5F is one row (named by branch in the agent).
        assert_eq!(escape::LOCKLESS_DIAGNOSTIC, escape::NVLOG_CTRL);
        assert_eq!(escape::name(0x5F), Some("RM_NVLOG_CTRL"));
        assert_eq!(escape::name(0x99), None);
        assert_eq!(class::name(class::CLASS_0XE0), Some("NV_MEMORY_EXPORT"));
        assert_eq!(class::name(class::COMPUTE[6]), Some("BLACKWELL_COMPUTE_B"));
        assert_eq!(class::name(0x1234), None);
        for c in class::GPFIFO
            .iter()
            .chain(&class::COMPUTE)
            .chain(&class::COPY)
        {
            assert!(class::name(*c).is_some(), "{c:#x}");
        }
    }

    #[test]
    fn classes_map_to_kinds() {
        assert_eq!(ObjectKind::of_class(0x41), ObjectKind::Client);
        assert_eq!(ObjectKind::of_class(0x40), ObjectKind::VideoMemory);
        assert_eq!(ObjectKind::of_class(0xC2), ObjectKind::VirtualMemory);
        assert_eq!(ObjectKind::of_class(0xF8), ObjectKind::VirtualMemory);
        assert_eq!(ObjectKind::of_class(0x42), ObjectKind::ExtendedMemory);
        assert_eq!(ObjectKind::of_class(0x71), ObjectKind::HostMemory);
        assert_eq!(ObjectKind::of_class(0x50A0), ObjectKind::VirtualMemory);
        assert_eq!(ObjectKind::of_class(0xC86F), ObjectKind::Channel);
        assert_eq!(ObjectKind::of_class(0xCBC0), ObjectKind::Compute);
        assert_eq!(ObjectKind::of_class(0xC8B5), ObjectKind::Copy);
        assert_eq!(ObjectKind::of_class(0x1234), ObjectKind::Other);
        for c in class::GPFIFO {
            assert_eq!(ObjectKind::of_class(c), ObjectKind::Channel);
        }
        for c in class::COMPUTE {
            assert_eq!(ObjectKind::of_class(c), ObjectKind::Compute);
        }
        for c in class::COPY {
            assert_eq!(ObjectKind::of_class(c), ObjectKind::Copy);
        }
        for k in 0..15 {
            assert_eq!(ObjectKind::from_u32(k) as u32, if k < 14 { k } else { 0 });
        }
        use crate::mem_kind;
        assert_eq!(nvos32::classify(nvos32::FLAGS_VIRTUAL, 0, 0, true), None);
        assert_eq!(
            nvos32::classify(0, 0, nvos32::ATTR2_USE_EGM, true),
            Some(mem_kind::EGM)
        );
        assert_eq!(
            nvos32::classify(0, 0, nvos32::ATTR2_USE_EGM, false),
            Some(mem_kind::VIDEO)
        );
        assert_eq!(nvos32::classify(0, 1 << 25, 0, true), Some(mem_kind::HOST));
        assert_eq!(nvos32::classify(0, 2 << 25, 0, true), Some(mem_kind::HOST));
        assert_eq!(nvos32::classify(0, 1 << 24, 0, true), Some(mem_kind::VIDEO));
    }
}
