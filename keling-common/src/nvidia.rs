//! The NVIDIA driver's ioctl ABI, as far as Keling decodes it.
//!
//! Facts from shared/NVIDIA-RM-ABI.md (open-gpu-kernel-modules 595.45.04, checked on
//! x86_64). Offsets are byte offsets inside the parameter structs the process passes
//! to ioctl(2); the probes read the fields they need one by one from user memory, so
//! no struct is defined here and every offset has a name and a test.

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

/// RM escape numbers (`nr` of the command).
pub mod escape {
    pub const ALLOC_MEMORY: u32 = 0x27;
    pub const FREE: u32 = 0x29;
    pub const CONTROL: u32 = 0x2A;
    pub const ALLOC: u32 = 0x2B;
    pub const DUP_OBJECT: u32 = 0x34;
    pub const SHARE: u32 = 0x35;
    pub const VID_HEAP_CONTROL: u32 = 0x4A;
    pub const MAP_MEMORY: u32 = 0x4E;
    pub const UNMAP_MEMORY: u32 = 0x4F;
    pub const ALLOC_CONTEXT_DMA2: u32 = 0x54;
    pub const MAP_MEMORY_DMA: u32 = 0x57;
    pub const UNMAP_MEMORY_DMA: u32 = 0x58;
    pub const CARD_INFO: u32 = 200;
    pub const REGISTER_FD: u32 = 201;
    pub const CHECK_VERSION_STR: u32 = 210;
    pub const XFER_CMD: u32 = 211;
    pub const ATTACH_GPUS_TO_FD: u32 = 212;
}

/// Parameter sizes that the driver requires exactly.
pub mod size {
    pub const NVOS00_FREE: u32 = 16;
    pub const NVOS54_CONTROL: u32 = 32;
    pub const NVOS21_ALLOC: u32 = 32;
    pub const NVOS64_ALLOC: u32 = 48;
    /// NVOS02 (48) + `int fd` + padding.
    pub const NVOS02_ALLOC_MEMORY: u32 = 56;
    pub const NVOS32_VID_HEAP: u32 = 184;
    pub const NVOS33_MAP_MEMORY: u32 = 56;
    pub const NVOS34_UNMAP_MEMORY: u32 = 32;
    pub const XFER: u32 = 16;
}

/// NVOS00 (RM_FREE).
pub mod nvos00 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_OLD: usize = 8;
    pub const STATUS: usize = 12;
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
    pub const STATUS: usize = 28;
    /// `flags & 4`: params are FINN-serialized.
    pub const FLAGS_FINN_SERIALIZED: u32 = 4;
}

/// NVOS02 (RM_ALLOC_MEMORY, on nvidiaN).
pub mod nvos02 {
    pub const H_ROOT: usize = 0;
    pub const H_OBJECT_PARENT: usize = 4;
    pub const H_OBJECT_NEW: usize = 8;
    pub const H_CLASS: usize = 12;
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
    pub const ALLOC_SIZE: usize = 88;
    pub const FUNCTION_ALLOC_SIZE: u32 = 2;
    pub const FUNCTION_FREE: u32 = 3;
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
/// `NV_MEMORY_ALLOCATION_PARAMS.size` (u64, in/out: read at syscall exit).
pub const MEMORY_ALLOCATION_PARAMS_SIZE: usize = 64;

/// RM status codes Keling names.
pub mod status {
    pub const OK: u32 = 0;
    pub const NO_MEMORY: u32 = 0x51;
    pub const INVALID_ARGUMENT: u32 = 0x1F;
}

/// RM classes (`g_allclasses.h`).
pub mod class {
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
    pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
    pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
    pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xC2;
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50A0;
    pub const NV_MEMORY_FABRIC: u32 = 0xF8;
    pub const FERMI_VASPACE_A: u32 = 0x90F1;
    pub const KEPLER_CHANNEL_GROUP_A: u32 = 0xA06C;
    pub const FERMI_CONTEXT_SHARE_A: u32 = 0x9067;
    pub const GPFIFO: [u32; 6] = [0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC96F, 0xCA6F];
    pub const COMPUTE: [u32; 7] = [0xC5C0, 0xC6C0, 0xC7C0, 0xC9C0, 0xCBC0, 0xCDC0, 0xCEC0];
    pub const COPY: [u32; 2] = [0xC7B5, 0xC8B5];
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
    /// Virtual address ranges: no bytes.
    VirtualMemory = 12,
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
            class::NV01_MEMORY_LOCAL_USER | class::NV01_MEMORY_LOCAL_PHYSICAL => Self::VideoMemory,
            class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => Self::HostMemory,
            class::NV01_MEMORY_VIRTUAL | class::NV50_MEMORY_VIRTUAL => Self::VirtualMemory,
            0xC36F | 0xC46F | 0xC56F | 0xC86F | 0xC96F | 0xCA6F => Self::Channel,
            0xC5C0 | 0xC6C0 | 0xC7C0 | 0xC9C0 | 0xCBC0 | 0xCDC0 | 0xCEC0 => Self::Compute,
            0xC7B5 | 0xC8B5 => Self::Copy,
            _ => Self::Other,
        }
    }

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
            _ => Self::Other,
        }
    }

    /// Classes whose allocation parameters are `NV_MEMORY_ALLOCATION_PARAMS`.
    pub const fn has_memory_params(class: u32) -> bool {
        matches!(
            class,
            class::NV01_MEMORY_LOCAL_USER | class::NV01_MEMORY_SYSTEM | class::NV50_MEMORY_VIRTUAL
        )
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
    /// `{u64 flags; u32 rmStatus}`.
    pub const INITIALIZE_RM_STATUS: usize = 8;
    /// `{u64 base; u64 length; u32 rmStatus}` (uvm_ioctl.h; shared/NVIDIA-RM-ABI.md
    /// says `{u64 base; u32 rmStatus}`, which is wrong).
    pub const FREE_RM_STATUS: usize = 16;
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

    #[test]
    fn classes_map_to_kinds() {
        assert_eq!(ObjectKind::of_class(0x41), ObjectKind::Client);
        assert_eq!(ObjectKind::of_class(0x40), ObjectKind::VideoMemory);
        assert_eq!(ObjectKind::of_class(0xC2), ObjectKind::VideoMemory);
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
        for k in 0..14 {
            assert_eq!(ObjectKind::from_u32(k) as u32, if k < 13 { k } else { 0 });
        }
    }
}
