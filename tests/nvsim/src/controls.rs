//! RM_CONTROL answers of the simulated driver: the controls NVIDIA's own
//! userspace (libcuda, libnvidia-ml, nvidia-smi 535.261.03) sends, answered
//! with the data a 535 driver would give for an H200-like Hopper GPU.
//!
//! The facts come from NVIDIA's open-gpu-kernel-modules at tag 535.261.03
//! (paths below are relative to that repository; `ctrl2080gpu.h` stands for
//! `src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080gpu.h` and likewise for
//! the other `ctrl*.h`). Every struct size and offset here was checked by
//! compiling the 535.261.03 headers with gcc on x86_64 (`sizeof`/`offsetof`);
//! the unit tests below pin the sizes again. Where the 535 kernel module does
//! not contain the implementation (the control is routed to the closed GSP
//! firmware), the behaviour is taken from the header documentation or from the
//! 550.90.07 open implementation, as said per control.
//!
//! ## How RM dispatches a control (and what this module leaves to the caller)
//! Order in `_rmapiRmControl` (`src/nvidia/src/kernel/rmapi/control.c`) and
//! `resControl` (`src/nvidia/src/libraries/resserv/src/rs_resource.c`):
//! 1. `cmd == 0` or category and index both 0: NV_OK, nothing done.
//! 2. unknown client: NV_ERR_INVALID_CLIENT.
//! 3. params NULL with paramsSize != 0 (or the reverse), **or paramsSize
//!    different from the size in the method table of the class named by the
//!    command's bits 31:16**: NV_ERR_INVALID_ARGUMENT (0x1F), see
//!    [`PARAMS_SIZE_MISMATCH`]. This happens before the object is looked up.
//!    [`NV_ERR_INVALID_PARAM_STRUCT`] (0x3A) is what `resControlLookup` would
//!    give, but for every command answered here step 3 catches a wrong size
//!    first. Exception: the deprecated 0x101, 0x20800101 and 0x20801802 are
//!    taken over by `RmDeprecatedGetControlHandler`
//!    (`src/nvidia/interface/deprecated/rmapi_deprecated_control.c`) before
//!    any size check; they read `sizeof(V1 params)` whatever paramsSize says.
//! 4. unknown hObject: NV_ERR_INVALID_OBJECT_HANDLE.
//! 5. the command is not in the method table of hObject's class (an NV2080
//!    control sent to a client, an NV0000 control sent to a device, any
//!    control sent to a memory object...): NV_ERR_NOT_SUPPORTED. [`answer`]
//!    does this step from [`Target`].
//!
//! Embedded user pointers: a control never fails the ioctl with an errno for
//! them; the RM status says it. 0x101 answers NV_ERR_INVALID_PARAM_STRUCT when
//! a string cannot be written (`rmapi_deprecated_control.c`); the generic
//! embedded-parameter copy (`src/nvidia/src/kernel/rmapi/param_copy.c`, used by
//! 0x800201, 0x20801201, 0x20801301, 0x20802a01) answers
//! NV_ERR_INVALID_ADDRESS (0x1E, `os_memcpy_to_user` in
//! `kernel-open/nvidia/os-interface.c`); the deprecated list converters
//! (0x20800101, 0x20801802) answer NV_ERR_INVALID_ADDRESS when the list cannot
//! be read and ignore a failed copy-out. So [`answer`] never returns `Err`
//! today; the `Result` is for the caller's errno paths.
//!
//! ## The simulated GPU (`crate::abi::gpu_id` for the identity)
//! GH100 (architecture 0x180, implementation 0, revision 0xA1), PCI
//! 10de:2335 subsystem 10de:18be ("NVIDIA H200": note that 535.261.03's
//! README does not list 0x2335, it first appears in 550.90.07), GPU `i` at PCI
//! 0000:(0x18+i):00.0 with gpuId (0x18+i) << 8 (`gpuGenerate32BitId`,
//! `src/nvidia/src/kernel/gpu/gpu.c`), 8 GPCs with 9, 9, 8, 8, 8, 8, 8, 8
//! TPCs (66 TPCs, 132 SMs, 2 SMs per TPC), SM 9.0, 128 FP32 lanes and 4
//! tensor cores per SM, 50 MiB L2, HBM3 6144 bits wide, PCIe gen5 x16,
//! framebuffer = `Config::mem_per_gpu`, no ECC (all units unsupported), no
//! MIG, no NVLink/C2C/fabric, GSP-RM enabled.
//!
//! ## Controls answered
//! | cmd | name | size | answer | header |
//! |---|---|---|---|---|
//! | 0x101 | NV0000 SYSTEM_GET_BUILD_VERSION | 40 | strings through 3 pointers (a NULL one: only sizeOfStrings) | ctrl0000system.h |
//! | 0x13e | NV0000 SYSTEM_GET_BUILD_VERSION_V2 | 776 | the same strings inline | ctrl0000system.h |
//! | 0x1f0 | NV0000 SYSTEM_GET_FEATURES | 4 | 0 (no UEFI, no EFI init, no SLI) | ctrl0000system.h |
//! | 0x201 | NV0000 GPU_GET_ATTACHED_IDS | 128 | every GPU, then 0xFFFFFFFF | ctrl0000gpu.h |
//! | 0x202 | NV0000 GPU_GET_ID_INFO | 40 | as 0x205; szName is not written (535 never does) | ctrl0000gpu.h |
//! | 0x205 | NV0000 GPU_GET_ID_INFO_V2 | 32 | instance numbers, no NUMA node | ctrl0000gpu.h |
//! | 0x214 | NV0000 GPU_GET_PROBED_IDS | 256 | every GPU, none excluded | ctrl0000gpu.h |
//! | 0x215 | NV0000 GPU_ATTACH_IDS | 132 | validates the ids (0xFFFF: all) | ctrl0000gpu.h |
//! | 0x216 | NV0000 GPU_DETACH_IDS | 128 | validates the first id (0xFFFF: all) | ctrl0000gpu.h |
//! | 0x21b | NV0000 GPU_GET_PCI_INFO | 12 | domain 0, bus, slot 0 | ctrl0000gpu.h |
//! | 0x274 | NV0000 GPU_GET_UUID_INFO | 272 | the GPU with that UUID | ctrl0000gpu.h |
//! | 0x275 | NV0000 GPU_GET_UUID_FROM_GPU_ID | 268 | the UUID, ascii or binary | ctrl0000gpu.h |
//! | 0x279 | NV0000 GPU_QUERY_DRAIN_STATE | 12 | not draining | ctrl0000gpu.h |
//! | 0x27b | NV0000 GPU_GET_MEMOP_ENABLE | 4 | 0 (Linux default: stream memops off) | ctrl0000gpu.h |
//! | 0xa04 | NV0000 SYNC_GPU_BOOST_GROUP_INFO | 2244 | no groups | ctrl0000syncgpuboost.h |
//! | 0xd01 | NV0000 CLIENT_GET_ADDR_SPACE_TYPE | 12 | by [`View::object_class`] of hObject: sysmem 1, vidmem 2, regmem 3, fabric 4 | ctrl0000client.h |
//! | 0xd04 | NV0000 CLIENT_SET_INHERITED_SHARE_POLICY | 12 | accepted (no share policies are modelled) | ctrl0000client.h |
//! | 0x800201 | NV0080 GPU_GET_CLASSLIST | 16 | the class list through a pointer (NULL: the count) | ctrl0080gpu.h |
//! | 0x800280 | NV0080 GPU_GET_NUM_SUBDEVICES | 4 | 1 | ctrl0080gpu.h |
//! | 0x800288 | NV0080 GPU_QUERY_SW_STATE_PERSISTENCE | 4 | DISABLED (1) | ctrl0080gpu.h |
//! | 0x800289 | NV0080 GPU_GET_VIRTUALIZATION_MODE | 4 | NONE | ctrl0080gpu.h |
//! | 0x80028e | NV0080 GPU_GET_VGX_CAPS | 1 | not vGPU | ctrl0080gpu.h |
//! | 0x800292 | NV0080 GPU_GET_CLASSLIST_V2 | 644 | GH100's class list ([`HOPPER_CLASSES`]) | ctrl0080gpu.h |
//! | 0x800294 | NV0080 GPU_GET_BRAND_CAPS | 4 | no Quadro/NVS/Titan brand | ctrl0080gpu.h |
//! | 0x801307 | NV0080 FB_GET_CAPS_V2 | 3 | render to sysmem, blocklinear, 512-byte GOBs, generic kind, cleared allocations | ctrl0080fb.h |
//! | 0x801402 | NV0080 HOST_GET_CAPS_V2 | 3 | GPU-coherent mappings | ctrl0080host.h |
//! | 0x801713 | NV0080 FIFO_GET_CAPS_V2 | 2 | PCI/vidmem pushbuffers, subcontexts | ctrl0080fifo.h |
//! | 0x20800101 | NV2080 GPU_GET_INFO (deprecated) | 16 | as 0x20800102 through a pointer | ctrl2080gpu.h |
//! | 0x20800102 | NV2080 GPU_GET_INFO_V2 | 516 | [`gpu_info`] | ctrl2080gpu.h |
//! | 0x20800110 | NV2080 GPU_GET_NAME_STRING | 132 | "NVIDIA H200", ascii (flags 0) or UTF-16 | ctrl2080gpu.h |
//! | 0x20800111 | NV2080 GPU_GET_SHORT_NAME_STRING | 64 | "GH100" | ctrl2080gpu.h |
//! | 0x20800119 | NV2080 GPU_GET_SIMULATION_INFO | 4 | NONE (silicon) | ctrl2080gpu.h |
//! | 0x2080012f | NV2080 GPU_QUERY_ECC_STATUS | 984 | every unit unsupported and disabled | ctrl2080gpu.h |
//! | 0x20800131 | NV2080 GPU_QUERY_COMPUTE_MODE_RULES | 4 | NONE (default compute mode) | ctrl2080gpu.h |
//! | 0x20800142 | NV2080 GPU_GET_ID | 4 | the gpuId | ctrl2080gpu.h |
//! | 0x2080014a | NV2080 GPU_GET_GID_INFO | 268 | UUID: 16 bytes (flags 2) or "GPU-…" 41 bytes with NUL (flags 0) | ctrl2080gpu.h |
//! | 0x20800170 | NV2080 GPU_GET_ENGINES_V2 | 252 | GR0, COPY0-9, NVDEC0-6, NVJPEG0-6, OFA, SEC2 | ctrl2080gpu.h |
//! | 0x2080018b | NV2080 GPU_GET_ACTIVE_PARTITION_IDS | 40 | NV_ERR_NOT_SUPPORTED (MIG off) | ctrl2080gpu.h |
//! | 0x2080018d | NV2080 GPU_GET_PIDS | 3812 | idType 0: [`View::pids_with_class`]; 1 (vGPU guests): none | ctrl2080gpu.h |
//! | 0x2080018e | NV2080 GPU_GET_PID_INFO | 14408 | index 0: memPrivate = [`View::video_bytes_of`] | ctrl2080gpu.h |
//! | 0x20800195 | NV2080 GPU_GET_COMPUTE_POLICY_CONFIG | 260 | one policy: timeslice DEFAULT | ctrl2080gpu.h |
//! | 0x208001a3 | NV2080 GET_GPU_FABRIC_PROBE_INFO | 40 | state UNSUPPORTED | ctrl2080gpu.h |
//! | 0x208001ab | NV2080 GPU_GET_RESET_STATUS | 1 | no reset required | ctrl2080gpu.h |
//! | 0x208001ae | NV2080 GPU_GET_DRAIN_AND_RESET_STATUS | 1 | no drain recommended | ctrl2080gpu.h |
//! | 0x20800406 | NV2080 TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO | 264 | OSTIME (µs) / platform-counter samples against a PTIMER that is the wall clock in ns | ctrl2080tmr.h |
//! | 0x20801201 | NV2080 GR_GET_INFO | 32 | as 0x20801228 through a pointer | ctrl2080gr.h |
//! | 0x2080121b | NV2080 GR_GET_GLOBAL_SM_ORDER | 6168 | 132 SMs over 66 TPCs | ctrl2080gr.h |
//! | 0x20801227 | NV2080 GR_GET_CAPS_V2 | 48 | populated, no cap bits (535 publishes no GR cap bits) | ctrl0080gr.h |
//! | 0x20801228 | NV2080 GR_GET_INFO_V2 | 448 | [`gr_info`] | ctrl0080gr.h, ctrl2080gr.h |
//! | 0x2080122a | NV2080 GR_GET_GPC_MASK | 24 | 0xFF | ctrl2080gr.h |
//! | 0x2080122b | NV2080 GR_GET_TPC_MASK | 24 | per GPC (0 past the last GPC) | ctrl2080gr.h |
//! | 0x20801230 | NV2080 GR_GET_SM_ISSUE_RATE_MODIFIER | 32 | every type at full speed | ctrl2080gr.h |
//! | 0x20801301 | NV2080 FB_GET_INFO | 16 | as 0x20801303 through a pointer | ctrl2080fb.h |
//! | 0x20801303 | NV2080 FB_GET_INFO_V2 | 436 | [`fb_info`]: sizes in KiB from the config and [`View::free_bytes`] | ctrl2080fb.h |
//! | 0x20801315 | NV2080 FB_GET_GPU_CACHE_INFO | 16 | enabled, write-back, no bypass, full RCM | ctrl2080fb.h |
//! | 0x20801701 | NV2080 MC_GET_ARCH_INFO | 16 | 0x180 / 0 / 0xA1 | ctrl2080mc.h |
//! | 0x20801702 | NV2080 MC_SERVICE_INTERRUPTS | 4 | NV_OK (nothing pending) | ctrl2080mc.h |
//! | 0x20801801 | NV2080 BUS_GET_PCI_INFO | 16 | 0x233510de, 0x18be10de, 0xa1, 0x2335 | ctrl2080bus.h |
//! | 0x20801802 | NV2080 BUS_GET_INFO (deprecated) | 16 | as 0x20801823 through a pointer | ctrl2080bus.h |
//! | 0x20801803 | NV2080 BUS_GET_PCI_BAR_INFO | 200 | BAR0 16 MiB, BAR1 (power of two >= FB), BAR3 32 MiB | ctrl2080bus.h |
//! | 0x20801823 | NV2080 BUS_GET_INFO_V2 | 420 | [`bus_info`]: PCIe gen5 x16 | ctrl2080bus.h |
//! | 0x2080182a | NV2080 BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS | 104 | none supported | ctrl2080bus.h |
//! | 0x2080200a | NV2080 PERF_BOOST | 8 | NV_OK (no clocks are modelled) | ctrl2080perf.h |
//! | 0x20802209 | NV2080 RC_GET_WATCHDOG_INFO | 4 | 0 (no RM watchdog on this GSP GPU) | ctrl2080rc.h |
//! | 0x20802a01 | NV2080 CE_GET_CAPS | 16 | as 0x20802a03 through a pointer | ctrl2080ce.h |
//! | 0x20802a03 | NV2080 CE_GET_CAPS_V2 | 8 | [`ce_caps`] for COPY0-9, NOT_SUPPORTED for other engines | ctrl2080ce.h |
//! | 0x20802a0a | NV2080 CE_GET_ALL_CAPS | 68 | the same for all 10, present = 0x3FF | ctrl2080ce.h |
//! | 0x20803601 | NV2080 GSP_GET_FEATURES | 72 | valid, GSP by default, firmware version = driver version | ctrl2080gsp.h |
//!
//! Everything else gets NV_ERR_NOT_SUPPORTED ([`params_size`] is `None`),
//! among them, deliberately: P2P caps (0x127, 0x12b, 0x13a), NVLink caps and
//! status (0x20803001/2: no links are simulated), BUS_GET_C2C_INFO
//! (0x2080182b), GR_GET_CTX_BUFFER_SIZE (0x20801218) and the other context/channel
//! controls, which need a GPU behind them. Commands with bit 15 set in their
//! low half (0x20808161, 0x20808513, 0x2080a068, ...: `RM_GSS_LEGACY_MASK` in
//! `src/nvidia/interface/deprecated/rmapi_deprecated.h`) are forwarded by the
//! 535 driver to GSP-RM with layouts the open headers do not publish (NVML
//! asks them for power, clocks, temperatures); they stay unanswered, so NVML
//! shows N/A there.

use crate::abi::le::{put_u16, put_u32, put_u64, u32_at, u64_at};
use crate::abi::status::{
    NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT, NV_ERR_NOT_SUPPORTED, NV_ERR_OBJECT_NOT_FOUND,
    NV_OK,
};
use crate::abi::{Version, gpu_id};
use crate::driver::{Config, UserMem};

/// `NV_ERR_INVALID_PARAM_STRUCT` (`src/common/sdk/nvidia/inc/nvstatuscodes.h`).
pub const NV_ERR_INVALID_PARAM_STRUCT: u32 = 0x3A;
/// `NV_ERR_INSUFFICIENT_RESOURCES` (`nvstatuscodes.h`).
pub const NV_ERR_INSUFFICIENT_RESOURCES: u32 = 0x1A;
/// `NV_ERR_INVALID_FLAGS` (`nvstatuscodes.h`).
pub const NV_ERR_INVALID_FLAGS: u32 = 0x29;
/// `NV_ERR_INVALID_OBJECT` (`nvstatuscodes.h`).
pub const NV_ERR_INVALID_OBJECT: u32 = 0x31;
/// `NV_ERR_BUFFER_TOO_SMALL` (`nvstatuscodes.h`).
pub const NV_ERR_BUFFER_TOO_SMALL: u32 = 0x02;

/// What a 535 driver answers for a paramsSize that differs from the method
/// table's size: NV_ERR_INVALID_ARGUMENT, from `_rmapiRmControl`
/// (`src/nvidia/src/kernel/rmapi/control.c`), which compares against
/// `rmapiutilGetControlInfo` before dispatching (see the module doc).
pub const PARAMS_SIZE_MISMATCH: u32 = NV_ERR_INVALID_ARGUMENT;

/// What the control was sent to (NVOS54 hObject), resolved by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Client,
    Device { gpu: u32 },
    Subdevice { gpu: u32 },
    Other { class: u32, gpu: Option<u32> },
}

/// What the driver state knows that some answers need.
pub trait View {
    fn config(&self) -> &Config;
    /// Processes (tgid) that own at least one object of `class` on `gpu`
    /// (GPU_GET_PIDS idType CLASS).
    fn pids_with_class(&self, gpu: u32, class: u32) -> Vec<u32>;
    /// The driver's per-process video memory figure on `gpu` (private +
    /// shared-owned, see docs/nvidia-abi.md) for GPU_GET_PID_INFO
    /// VIDEO_MEMORY_USAGE, by the rule of the simulated branch (which device
    /// objects and classes count: docs/gpu-accounting.md).
    fn video_bytes_of(&self, pid: u32, gpu: u32) -> u64;
    /// Free video bytes of `gpu` (capacity - used).
    fn free_bytes(&self, gpu: u32) -> u64;
    /// The class of object `handle` in the client the control was sent to
    /// (NVOS54 hClient: an implementor that serves several clients wraps
    /// itself with that handle), `None` if there is no such object.
    /// CLIENT_GET_ADDR_SPACE_TYPE (0xd01) needs it; without an implementation
    /// every 0xd01 answers NV_ERR_OBJECT_NOT_FOUND, as the driver does for an
    /// unknown handle.
    fn object_class(&self, handle: u32) -> Option<u32> {
        let _ = handle;
        None
    }
}

// ----- command numbers ------------------------------------------------------

/// Command numbers (`#define NV*_CTRL_CMD_*` in the headers named in the table).
pub mod cmd {
    pub const SYSTEM_GET_BUILD_VERSION: u32 = 0x101;
    pub const SYSTEM_GET_BUILD_VERSION_V2: u32 = 0x13e;
    pub const SYSTEM_GET_FEATURES: u32 = 0x1f0;
    pub const GPU_GET_ATTACHED_IDS: u32 = 0x201;
    pub const GPU_GET_ID_INFO: u32 = 0x202;
    pub const GPU_GET_ID_INFO_V2: u32 = 0x205;
    pub const GPU_GET_PROBED_IDS: u32 = 0x214;
    pub const GPU_ATTACH_IDS: u32 = 0x215;
    pub const GPU_DETACH_IDS: u32 = 0x216;
    /// 550 and later: attach one GPU in the background, then wait for it.
    pub const GPU_ASYNC_ATTACH_ID: u32 = 0x289;
    pub const GPU_WAIT_ATTACH_ID: u32 = 0x290;
    pub const GPU_GET_PCI_INFO: u32 = 0x21b;
    pub const GPU_GET_UUID_INFO: u32 = 0x274;
    pub const GPU_GET_UUID_FROM_GPU_ID: u32 = 0x275;
    pub const GPU_QUERY_DRAIN_STATE: u32 = 0x279;
    pub const GPU_GET_MEMOP_ENABLE: u32 = 0x27b;
    pub const SYNC_GPU_BOOST_GROUP_INFO: u32 = 0xa04;
    pub const CLIENT_GET_ADDR_SPACE_TYPE: u32 = 0xd01;
    pub const CLIENT_SET_INHERITED_SHARE_POLICY: u32 = 0xd04;

    pub const DEV_GPU_GET_CLASSLIST: u32 = 0x0080_0201;
    pub const DEV_GPU_GET_NUM_SUBDEVICES: u32 = 0x0080_0280;
    pub const DEV_GPU_QUERY_SW_STATE_PERSISTENCE: u32 = 0x0080_0288;
    pub const DEV_GPU_GET_VIRTUALIZATION_MODE: u32 = 0x0080_0289;
    pub const DEV_GPU_GET_VGX_CAPS: u32 = 0x0080_028e;
    pub const DEV_GPU_GET_CLASSLIST_V2: u32 = 0x0080_0292;
    pub const DEV_GPU_GET_BRAND_CAPS: u32 = 0x0080_0294;
    pub const DEV_FB_GET_CAPS_V2: u32 = 0x0080_1307;
    pub const DEV_HOST_GET_CAPS_V2: u32 = 0x0080_1402;
    pub const DEV_FIFO_GET_CAPS_V2: u32 = 0x0080_1713;

    pub const GPU_GET_INFO: u32 = 0x2080_0101;
    pub const GPU_GET_INFO_V2: u32 = 0x2080_0102;
    pub const GPU_GET_NAME_STRING: u32 = 0x2080_0110;
    pub const GPU_GET_SHORT_NAME_STRING: u32 = 0x2080_0111;
    pub const GPU_GET_SIMULATION_INFO: u32 = 0x2080_0119;
    pub const GPU_QUERY_ECC_STATUS: u32 = 0x2080_012f;
    pub const GPU_QUERY_COMPUTE_MODE_RULES: u32 = 0x2080_0131;
    pub const GPU_GET_ID: u32 = 0x2080_0142;
    pub const GPU_GET_GID_INFO: u32 = 0x2080_014a;
    pub const GPU_GET_ENGINES_V2: u32 = 0x2080_0170;
    pub const GPU_GET_ACTIVE_PARTITION_IDS: u32 = 0x2080_018b;
    pub const GPU_GET_PIDS: u32 = 0x2080_018d;
    pub const GPU_GET_PID_INFO: u32 = 0x2080_018e;
    pub const GPU_GET_COMPUTE_POLICY_CONFIG: u32 = 0x2080_0195;
    pub const GET_GPU_FABRIC_PROBE_INFO: u32 = 0x2080_01a3;
    pub const GPU_GET_RESET_STATUS: u32 = 0x2080_01ab;
    pub const GPU_GET_DRAIN_AND_RESET_STATUS: u32 = 0x2080_01ae;
    pub const TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO: u32 = 0x2080_0406;
    pub const GR_GET_INFO: u32 = 0x2080_1201;
    pub const GR_GET_GLOBAL_SM_ORDER: u32 = 0x2080_121b;
    pub const GR_GET_CAPS_V2: u32 = 0x2080_1227;
    pub const GR_GET_INFO_V2: u32 = 0x2080_1228;
    pub const GR_GET_GPC_MASK: u32 = 0x2080_122a;
    pub const GR_GET_TPC_MASK: u32 = 0x2080_122b;
    pub const GR_GET_SM_ISSUE_RATE_MODIFIER: u32 = 0x2080_1230;
    pub const FB_GET_INFO: u32 = 0x2080_1301;
    pub const FB_GET_INFO_V2: u32 = 0x2080_1303;
    pub const FB_GET_GPU_CACHE_INFO: u32 = 0x2080_1315;
    pub const MC_GET_ARCH_INFO: u32 = 0x2080_1701;
    pub const MC_SERVICE_INTERRUPTS: u32 = 0x2080_1702;
    pub const BUS_GET_PCI_INFO: u32 = 0x2080_1801;
    pub const BUS_GET_INFO: u32 = 0x2080_1802;
    pub const BUS_GET_PCI_BAR_INFO: u32 = 0x2080_1803;
    pub const BUS_GET_INFO_V2: u32 = 0x2080_1823;
    pub const BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS: u32 = 0x2080_182a;
    pub const PERF_BOOST: u32 = 0x2080_200a;
    pub const RC_GET_WATCHDOG_INFO: u32 = 0x2080_2209;
    pub const CE_GET_CAPS: u32 = 0x2080_2a01;
    pub const CE_GET_CAPS_V2: u32 = 0x2080_2a03;
    pub const CE_GET_ALL_CAPS: u32 = 0x2080_2a0a;
    pub const GSP_GET_FEATURES: u32 = 0x2080_3601;
    pub const GRMGR_GET_GR_FS_INFO: u32 = 0x2080_3801;
    /// A GSS-legacy command (bit 15 set: `RM_GSS_LEGACY_MASK`,
    /// `rmapi_deprecated.h`) that `RmGssLegacyRpcCmd`
    /// (`rmapi_gss_legacy_control.c`) forwards to GSP-RM as is; its 332-byte
    /// layout is in no open header. libcuda 535 sends it at the end of cuInit
    /// and gives up (CUDA_ERROR_NO_DEVICE) when it fails.
    pub const GSS_LEGACY_0X8159: u32 = 0x2080_8159;
}

/// Whether the driver checks paramsSize for `cmd` before dispatching: the
/// deprecated commands that `RmDeprecatedGetControlHandler` takes over
/// (`rmapi_deprecated_control.c`) read `sizeof` their params whatever
/// paramsSize says.
pub fn checks_params_size(cmd: u32) -> bool {
    !matches!(
        cmd,
        cmd::SYSTEM_GET_BUILD_VERSION | cmd::GPU_GET_INFO | cmd::BUS_GET_INFO
    )
}

/// The expected paramsSize of a control this module answers for driver `v`
/// (None: not answered -> NV_ERR_NOT_SUPPORTED, as for a control the branch
/// does not have). Sizes are `sizeof` of the params struct at 535.261.03
/// (x86_64), except those that moved: [`branch_params_size`].
pub fn params_size(cmd: u32, v: Version) -> Option<usize> {
    if let Some(moved) = branch_params_size(cmd, v) {
        return moved;
    }
    params_size_535(cmd)
}

/// The controls whose params size differs between the branches the simulator
/// serves (sizeof at 535.261.03 / 550.163.01 / 555.58.02 / 570.211.01 / 580.142,
/// compiled from each tag's headers; a version between two tags takes the
/// older one's): `Some(None)` for a control the branch does not have.
pub fn branch_params_size(cmd: u32, v: Version) -> Option<Option<usize>> {
    use cmd::*;
    let by = |s: [usize; 5]| Some(Some(moved::by(v, s)));
    match cmd {
        SYSTEM_GET_BUILD_VERSION_V2 => by([776, 776, 776, 1032, 1032]),
        GPU_GET_PROBED_IDS => by([256, 256, 256, 256, 384]),
        // New in 550: one gpuId each.
        GPU_ASYNC_ATTACH_ID | GPU_WAIT_ATTACH_ID => Some(v.at_least(550, 0, 0).then_some(4)),
        DEV_GPU_GET_VIRTUALIZATION_MODE => by([4, 4, 8, 8, 8]),
        DEV_GPU_GET_CLASSLIST_V2 => by([644, 700, 404, 404, 804]),
        GPU_GET_INFO_V2 => by([516, 524, 524, 524, 564]),
        GPU_QUERY_ECC_STATUS => by([984, 1024, 1224, 1464, 1464]),
        GPU_GET_ENGINES_V2 => by([252, 260, 260, 340, 340]),
        GET_GPU_FABRIC_PROBE_INFO => by([40, 48, 48, 48, 56]),
        GR_GET_GLOBAL_SM_ORDER => by([6168, 6168, 6168, 6168, 9240]),
        GR_GET_INFO_V2 => by([448, 472, 472, 488, 488]),
        FB_GET_INFO_V2 => by([436, 444, 444, 460, 1028]),
        BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS => by([104, 104, 104, 112, 112]),
        CE_GET_ALL_CAPS => by([68, 136, 136, 136, 136]),
        _ => None,
    }
}

/// Where the fields after a list or table that grew are, at the five tags
/// (535, 550, 555, 570, 580: offsetof at each, as [`branch_params_size`]);
/// [`moved::by`] takes the one of driver `v`.
pub mod moved {
    use crate::abi::Version;
    /// The number of `v`'s branch in a row of the five tags' numbers
    /// (535, 550, 555, 570, 580).
    pub fn by(v: Version, s: [usize; 5]) -> usize {
        let at = |major| v.at_least(major, 0, 0);
        if at(580) {
            s[4]
        } else if at(570) {
            s[3]
        } else if at(555) {
            s[2]
        } else if at(550) {
            s[1]
        } else {
            s[0]
        }
    }
    /// BUILD_VERSION_V2: the three strings' size (256, then 256/512/256 from
    /// 570: titleBuffer@768) and changelistNumber.
    pub const BUILD_VERSION_TITLE: [usize; 5] = [512, 512, 512, 768, 768];
    pub const BUILD_VERSION_CHANGELIST: [usize; 5] = [768, 768, 768, 1024, 1024];
    /// QUERY_ECC_STATUS: bFatalPoisonError, the last output field.
    pub const ECC_FATAL_POISON: [usize; 5] = [960, 1000, 1200, 1440, 1440];
    /// GR_GET_GLOBAL_SM_ORDER: numSm (numTpc 2 bytes later).
    pub const SM_ORDER_NUM_SM: [usize; 5] = [6144, 6144, 6144, 6144, 9216];
    /// CE_GET_ALL_CAPS: `present` after capsTbl[32 or 64][2].
    pub const CE_PRESENT: [usize; 5] = [64, 128, 128, 128, 128];
    /// The V2 lists' maximum entries: GPU_GET_INFO_V2, GR_GET_INFO_V2, FB_GET_INFO_V2.
    pub const GPU_INFO_MAX: [usize; 5] = [64, 65, 65, 65, 70];
    pub const GR_INFO_MAX: [usize; 5] = [53, 56, 56, 58, 58];
    pub const FB_INFO_MAX: [usize; 5] = [54, 55, 55, 57, 128];
}

/// The 535.261.03 sizes.
fn params_size_535(cmd: u32) -> Option<usize> {
    use cmd::*;
    Some(match cmd {
        SYSTEM_GET_BUILD_VERSION => 40,
        SYSTEM_GET_BUILD_VERSION_V2 => 776,
        SYSTEM_GET_FEATURES => 4,
        GPU_GET_ATTACHED_IDS => 128,
        GPU_GET_ID_INFO => 40,
        GPU_GET_ID_INFO_V2 => 32,
        GPU_GET_PROBED_IDS => 256,
        GPU_ATTACH_IDS => 132,
        GPU_DETACH_IDS => 128,
        GPU_GET_PCI_INFO => 12,
        GPU_GET_UUID_INFO => 272,
        GPU_GET_UUID_FROM_GPU_ID => 268,
        GPU_QUERY_DRAIN_STATE => 12,
        GPU_GET_MEMOP_ENABLE => 4,
        SYNC_GPU_BOOST_GROUP_INFO => 2244,
        CLIENT_GET_ADDR_SPACE_TYPE => 12,
        CLIENT_SET_INHERITED_SHARE_POLICY => 12,

        DEV_GPU_GET_CLASSLIST => 16,
        DEV_GPU_GET_NUM_SUBDEVICES => 4,
        DEV_GPU_QUERY_SW_STATE_PERSISTENCE => 4,
        DEV_GPU_GET_VIRTUALIZATION_MODE => 4,
        DEV_GPU_GET_VGX_CAPS => 1,
        DEV_GPU_GET_CLASSLIST_V2 => 644,
        DEV_GPU_GET_BRAND_CAPS => 4,
        DEV_FB_GET_CAPS_V2 => 3,
        DEV_HOST_GET_CAPS_V2 => 3,
        DEV_FIFO_GET_CAPS_V2 => 2,

        GPU_GET_INFO => 16,
        GPU_GET_INFO_V2 => 516,
        GPU_GET_NAME_STRING => 132,
        GPU_GET_SHORT_NAME_STRING => 64,
        GPU_GET_SIMULATION_INFO => 4,
        GPU_QUERY_ECC_STATUS => 984,
        GPU_QUERY_COMPUTE_MODE_RULES => 4,
        GPU_GET_ID => 4,
        GPU_GET_GID_INFO => 268,
        GPU_GET_ENGINES_V2 => 252,
        GPU_GET_ACTIVE_PARTITION_IDS => 40,
        GPU_GET_PIDS => 3812,
        GPU_GET_PID_INFO => 14408,
        GPU_GET_COMPUTE_POLICY_CONFIG => 260,
        GET_GPU_FABRIC_PROBE_INFO => 40,
        GPU_GET_RESET_STATUS => 1,
        GPU_GET_DRAIN_AND_RESET_STATUS => 1,
        TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO => 264,
        GR_GET_INFO => 32,
        GR_GET_GLOBAL_SM_ORDER => 6168,
        GR_GET_CAPS_V2 => 48,
        GR_GET_INFO_V2 => 448,
        GR_GET_GPC_MASK => 24,
        GR_GET_TPC_MASK => 24,
        GR_GET_SM_ISSUE_RATE_MODIFIER => 32,
        FB_GET_INFO => 16,
        FB_GET_INFO_V2 => 436,
        FB_GET_GPU_CACHE_INFO => 16,
        MC_GET_ARCH_INFO => 16,
        MC_SERVICE_INTERRUPTS => 4,
        BUS_GET_PCI_INFO => 16,
        BUS_GET_INFO => 16,
        BUS_GET_PCI_BAR_INFO => 200,
        BUS_GET_INFO_V2 => 420,
        BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS => 104,
        PERF_BOOST => 8,
        RC_GET_WATCHDOG_INFO => 4,
        CE_GET_CAPS => 16,
        CE_GET_CAPS_V2 => 8,
        CE_GET_ALL_CAPS => 68,
        GSP_GET_FEATURES => 72,
        GRMGR_GET_GR_FS_INFO => 1928,
        GSS_LEGACY_0X8159 => 332,
        _ => return None,
    })
}

// ----- the simulated chip -----------------------------------------------------

/// PCI subsystem id of an H200 SXM (`README.md` at 550.90.07: "NVIDIA H200 |
/// 2335 10DE 18BE").
pub const PCI_SUBSYSTEM: u16 = 0x18be;
/// PCI revision id (GH100 A1).
pub const PCI_REVISION: u32 = 0xa1;
/// `NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_*` of Hopper: PMC_BOOT_0
/// architecture 0x18 << 4, as GA100 is 0x170 (`ctrl2080mc.h`).
pub const ARCH_GH100: u32 = 0x180;
/// Short chip name (GPU_GET_SHORT_NAME_STRING).
pub const SHORT_NAME: &str = "GH100";
/// TPCs of each GPC (66 TPCs, 132 SMs).
pub const TPCS_PER_GPC: [u32; 8] = [9, 9, 8, 8, 8, 8, 8, 8];
/// SMs per TPC.
pub const SMS_PER_TPC: u32 = 2;
/// L2 cache in bytes.
pub const L2_BYTES: u32 = 50 << 20;
/// HBM bus width in bits.
pub const BUS_WIDTH_BITS: u32 = 6144;
/// Copy engines (LCEs) COPY0..COPY9; 0 and 1 are the graphics-paired ones.
pub const NUM_CE: u32 = 10;

/// Total SMs.
pub const fn sm_count() -> u32 {
    let mut n = 0;
    let mut i = 0;
    while i < TPCS_PER_GPC.len() {
        n += TPCS_PER_GPC[i];
        i += 1;
    }
    n * SMS_PER_TPC
}

/// The classes GPU_GET_CLASSLIST(_V2) lists: GH100's class descriptor list
/// `gpuGetClassDescriptorList_GH100` (`src/nvidia/generated/g_gpu_class_list.c`),
/// one entry per descriptor, as `gpuGetClassList`
/// (`src/nvidia/src/kernel/gpu/gpu_resource_desc.c`) reports it, without the
/// descriptors of engines this GPU does not have (GR1-7: MIG is off;
/// NVDEC7, NVJPEG7: GH100 has 7 of each). Note that the list does not hold
/// the generic classes (0x0, 0x41, 0x80, 0x2080, 0x3E, 0x40, 0x79, ...): the
/// class DB is exactly the HAL list (`gpu.c`, `pEngineOrder->pClassDescriptors`).
pub const HOPPER_CLASSES: &[u32] = &[
    0xc365, // ACCESS_COUNTER_NOTIFY_BUFFER
    0xc56f, // AMPERE_CHANNEL_GPFIFO_A
    0xc561, // AMPERE_USERMODE_A
    0x9067, // FERMI_CONTEXT_SHARE_A
    0x902d, // FERMI_TWOD_A
    0x90f1, // FERMI_VASPACE_A
    0x844c, // G84_PERFBUFFER
    0x90e7, // GF100_SUBDEVICE_INFOROM
    0x90e6, // GF100_SUBDEVICE_MASTER
    0x9074, // GF100_TIMED_SEMAPHORE_SW
    0x9096, // GF100_ZBC_CLEAR
    0xc076, // GP100_UVM_SW
    0xcb97, // HOPPER_A
    0xc86f, // HOPPER_CHANNEL_GPFIFO_A
    0xcbc0, // HOPPER_COMPUTE_A (GR0)
    0xc8b5, 0xc8b5, 0xc8b5, 0xc8b5, 0xc8b5, // HOPPER_DMA_COPY_A, CE0-4
    0xc8b5, 0xc8b5, 0xc8b5, 0xc8b5, 0xc8b5, // HOPPER_DMA_COPY_A, CE5-9
    0xcba2, // HOPPER_SEC2_WORK_LAUNCH_A
    0xc661, // HOPPER_USERMODE_A
    0xa06c, // KEPLER_CHANNEL_GROUP_A
    0xa140, // KEPLER_INLINE_TO_MEMORY_B
    0xc369, // MMU_FAULT_BUFFER
    0x0060, // NV0060_SYNC_GPU_BOOST
    0x0070, // NV01_MEMORY_VIRTUAL
    0x007d, // NV04_SOFTWARE_TEST
    0x5080, // NV50_DEFERRED_API_CLASS
    0x50a0, // NV50_MEMORY_VIRTUAL
    0x503b, // NV50_P2P
    0x503c, // NV50_THIRD_PARTY_P2P
    0xa081, // NVA081_VGPU_CONFIG
    0xa084, // NVA084_KERNEL_HOST_VGPU_DEVICE
    0xb8b0, 0xb8b0, 0xb8b0, 0xb8b0, 0xb8b0, 0xb8b0, 0xb8b0, // NVB8B0_VIDEO_DECODER, NVDEC0-6
    0xb8d1, 0xb8d1, 0xb8d1, 0xb8d1, 0xb8d1, 0xb8d1, 0xb8d1, // NVB8D1_VIDEO_NVJPG, NVJPEG0-6
    0xb8fa, // NVB8FA_VIDEO_OFA
    0xcb33, // NV_CONFIDENTIAL_COMPUTE
    0x00de, // RM_USER_SHARED_DATA
    0xc46f, // TURING_CHANNEL_GPFIFO_A
    0xc461, // TURING_USERMODE_A
    0xc36f, // VOLTA_CHANNEL_GPFIFO_A
    0xc361, // VOLTA_USERMODE_A
];

/// `NV2080_ENGINE_TYPE_*` (`src/common/sdk/nvidia/inc/class/cl2080_notification.h`).
mod engine {
    pub const GR0: u32 = 0x01;
    pub const COPY0: u32 = 0x09;
    pub const NVDEC0: u32 = 0x13;
    pub const SEC2: u32 = 0x26;
    pub const NVJPEG0: u32 = 0x2b;
    pub const OFA: u32 = 0x33;
}

/// GPU_GET_ENGINES_V2's list.
fn engines() -> Vec<u32> {
    let mut v = vec![engine::GR0];
    v.extend((0..NUM_CE).map(|i| engine::COPY0 + i));
    v.extend((0..7).map(|i| engine::NVDEC0 + i));
    v.extend((0..7).map(|i| engine::NVJPEG0 + i));
    v.push(engine::OFA);
    v.push(engine::SEC2);
    v
}

// ----- small helpers ------------------------------------------------------------

fn put_bytes(b: &mut [u8], off: usize, data: &[u8]) {
    if let Some(s) = b.get_mut(off..off + data.len()) {
        s.copy_from_slice(data);
    }
}

/// `s` NUL-terminated and zero-padded into `b[off..off + cap]` (truncated
/// to leave room for the NUL).
fn put_cstr(b: &mut [u8], off: usize, cap: usize, s: &str) {
    let Some(field) = b.get_mut(off..off + cap) else {
        return;
    };
    field.fill(0);
    let n = s.len().min(cap.saturating_sub(1));
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// KiB as the u32 the FB info list carries (saturating).
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes >> 10).unwrap_or(u32::MAX)
}

/// The simulated GPU index whose gpuId is `id`.
fn gpu_of_id(cfg: &Config, id: u32) -> Option<u32> {
    (0..cfg.gpus).find(|&i| gpu_id::gpu_id(i) == id)
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", 40 characters.
fn uuid_ascii(i: u32) -> String {
    format!("GPU-{}", gpu_id::uuid_text(i))
}

/// The ascii UUID with its NUL: `NV_UUID_STR_LEN` = 16 * 2 + 9 = 41 bytes
/// (`src/nvidia/inc/kernel/gpu/gpu_uuid.h`).
fn uuid_ascii_nul(i: u32) -> Vec<u8> {
    let mut v = uuid_ascii(i).into_bytes();
    v.push(0);
    v
}

/// Size of the BAR1 aperture: the power of two at or above the framebuffer.
fn bar1_bytes(cfg: &Config) -> u64 {
    cfg.mem_per_gpu
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(1 << 63)
}

// ----- dispatch -------------------------------------------------------------------

/// Answers control `cmd` on `target`; `params` holds exactly
/// `params_size(cmd)` bytes read from the caller and is copied back by the
/// caller when the result is `Ok(NV_OK)`. Embedded user pointers are read and
/// written through `mem`; a pointer that cannot be used gives the RM status
/// the driver gives (module doc), never an errno.
pub fn answer(
    view: &dyn View,
    target: Target,
    cmd: u32,
    params: &mut [u8],
    mem: &dyn UserMem,
) -> Result<u32, i32> {
    let v = Version::of(&view.config().driver_version);
    let Some(size) = params_size(cmd, v) else {
        return Ok(NV_ERR_NOT_SUPPORTED);
    };
    if params.len() < size {
        // The caller checks sizes first; refuse rather than index out of range.
        return Ok(PARAMS_SIZE_MISMATCH);
    }
    let p = &mut params[..size];
    // The command's class (bits 31:16) must be the class of hObject; the
    // method table of any other class misses it (resControlLookup).
    let st = match (cmd >> 16, target) {
        (0x0000, Target::Client) => client_control(view, cmd, p, mem),
        (0x0080, Target::Device { gpu }) if gpu < view.config().gpus => device_control(cmd, p, mem),
        (0x2080, Target::Subdevice { gpu }) if gpu < view.config().gpus => {
            subdevice_control(view, gpu, cmd, p, mem)
        }
        _ => NV_ERR_NOT_SUPPORTED,
    };
    Ok(st)
}

// ----- NV0000: the client -----------------------------------------------------------

/// NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_PARAMS (`ctrl0000system.h`, 40 bytes).
mod build_version {
    pub const SIZE_OF_STRINGS: usize = 0; // NvU32
    pub const P_DRIVER_VERSION: usize = 8; // NvP64
    pub const P_VERSION: usize = 16; // NvP64
    pub const P_TITLE: usize = 24; // NvP64
    pub const CHANGELIST: usize = 32; // NvU32
    pub const OFFICIAL_CHANGELIST: usize = 36; // NvU32
    /// NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS (776 bytes): three
    /// char[256] at 0, 256, 512, changelistNumber@768,
    /// officialChangelistNumber@772.
    pub const V2_STRING: usize = 256;
    pub const V2_CHANGELIST: usize = 768;
    pub const V2_OFFICIAL_CHANGELIST: usize = 772;
}

/// NV_BUILD_BRANCH_VERSION of 535.261.03 (`src/common/inc/nvBldVer.h`, Linux).
pub const BUILD_BRANCH_VERSION: &str = "rel/gpu_drv/r535/r539_41-927";
/// NV_DISPLAY_DRIVER_TITLE of 535.261.03: NV_BUILD_TYPE " " NV_BUILD_BRANCH
/// " " NV_BUILD_NAME " " NV_BUILD_AUTHOR (`nvBldVer.h`, official build, the
/// author left at its default).
pub const BUILD_TITLE: &str = "Official r539_41 rel/gpu_drv/r535/r539_41-927 unknown";
/// NV_BUILD_CHANGELIST_NUM = NV_LAST_OFFICIAL_CHANGELIST_NUM of 535.261.03.
pub const BUILD_CHANGELIST: u32 = 36124219;

fn client_control(view: &dyn View, cmd: u32, p: &mut [u8], mem: &dyn UserMem) -> u32 {
    let cfg = view.config();
    match cmd {
        cmd::SYSTEM_GET_BUILD_VERSION => build_version_v1(cfg, p, mem),
        cmd::SYSTEM_GET_BUILD_VERSION_V2 => {
            use build_version::*;
            let v = Version::of(&cfg.driver_version);
            let (title, changelist) = (
                moved::by(v, moved::BUILD_VERSION_TITLE),
                moved::by(v, moved::BUILD_VERSION_CHANGELIST),
            );
            put_cstr(p, 0, V2_STRING, &cfg.driver_version);
            put_cstr(p, V2_STRING, V2_STRING, BUILD_BRANCH_VERSION);
            put_cstr(p, title, changelist - title, BUILD_TITLE);
            put_u32(p, changelist, BUILD_CHANGELIST);
            put_u32(
                p,
                changelist + (V2_OFFICIAL_CHANGELIST - V2_CHANGELIST),
                BUILD_CHANGELIST,
            );
            NV_OK
        }
        // NV0000_CTRL_SYSTEM_GET_FEATURES_PARAMS {featuresMask} (ctrl0000system.h).
        cmd::SYSTEM_GET_FEATURES => {
            put_u32(p, 0, 0);
            NV_OK
        }
        // NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS {gpuIds[32]} (ctrl0000gpu.h):
        // gpumgrGetAttachedGpuIds (src/nvidia/src/kernel/gpu_mgr/gpu_mgr.c).
        cmd::GPU_GET_ATTACHED_IDS => {
            id_table(cfg, p, 0);
            NV_OK
        }
        // NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS {gpuIds[32]@0;
        // excludedGpuIds[32]@128} (ctrl0000gpu.h): gpumgrGetProbedGpuIds.
        cmd::GPU_GET_PROBED_IDS => {
            id_table(cfg, p, 0);
            for k in 0..32 {
                put_u32(p, 128 + 4 * k, INVALID_ID);
            }
            NV_OK
        }
        // NV0000_CTRL_GPU_ATTACH_IDS_PARAMS {gpuIds[32]@0; failedId@128}
        // (ctrl0000gpu.h): cliresCtrlCmdGpuAttachIds
        // (src/nvidia/src/kernel/rmapi/client_resource.c) only validates.
        cmd::GPU_ATTACH_IDS => {
            if u32_at(p, 0) == ATTACH_ALL_PROBED_IDS {
                return NV_OK;
            }
            for k in 0..32 {
                let id = u32_at(p, 4 * k);
                if id == INVALID_ID {
                    break;
                }
                if gpu_of_id(cfg, id).is_none() {
                    return NV_ERR_INVALID_ARGUMENT;
                }
            }
            NV_OK
        }
        // NV0000_CTRL_GPU_DETACH_IDS_PARAMS {gpuIds[32]} (ctrl0000gpu.h):
        // cliresCtrlCmdGpuDetachIds (client_resource.c) checks the first id
        // against the attached ones (0xFFFF: all) and detaches nothing.
        // NV0000_CTRL_GPU_ASYNC_ATTACH_ID_PARAMS and _WAIT_ATTACH_ID_PARAMS
        // {gpuId} (ctrl0000gpu.h, 550 on): the simulated GPUs are always
        // attached, so both succeed for a probed id (waiting for one that is
        // attached "is a no-op") and refuse any other with
        // NV_ERR_INVALID_ARGUMENT.
        cmd::GPU_ASYNC_ATTACH_ID | cmd::GPU_WAIT_ATTACH_ID => {
            if gpu_of_id(cfg, u32_at(p, 0)).is_some() {
                NV_OK
            } else {
                NV_ERR_INVALID_ARGUMENT
            }
        }
        cmd::GPU_DETACH_IDS => {
            let id = u32_at(p, 0);
            if id == ATTACH_ALL_PROBED_IDS || id == INVALID_ID || gpu_of_id(cfg, id).is_some() {
                NV_OK
            } else {
                NV_ERR_INVALID_ARGUMENT
            }
        }
        cmd::GPU_GET_ID_INFO | cmd::GPU_GET_ID_INFO_V2 => id_info(cfg, cmd, p),
        // NV0000_CTRL_GPU_GET_PCI_INFO_PARAMS {gpuId@0; domain@4; NvU16 bus@8;
        // NvU16 slot@10} (ctrl0000gpu.h).
        cmd::GPU_GET_PCI_INFO => {
            let Some(i) = gpu_of_id(cfg, u32_at(p, 0)) else {
                return NV_ERR_INVALID_ARGUMENT;
            };
            put_u32(p, 4, 0);
            put_u16(p, 8, gpu_id::pci_bus(i) as u16);
            put_u16(p, 10, 0);
            NV_OK
        }
        cmd::GPU_GET_UUID_INFO => uuid_info(cfg, p),
        cmd::GPU_GET_UUID_FROM_GPU_ID => uuid_from_gpu_id(cfg, p),
        // NV0000_CTRL_GPU_QUERY_DRAIN_STATE_PARAMS {gpuId@0; drainState@4;
        // flags@8} (ctrl0000gpu.h): DISABLED = 0.
        cmd::GPU_QUERY_DRAIN_STATE => {
            if gpu_of_id(cfg, u32_at(p, 0)).is_none() {
                return NV_ERR_INVALID_ARGUMENT;
            }
            put_u32(p, 4, 0);
            put_u32(p, 8, 0);
            NV_OK
        }
        // NV0000_CTRL_GPU_GET_MEMOP_ENABLE_PARAMS {enableMask} (ctrl0000gpu.h):
        // set only with PDB_PROP_SYS_ENABLE_STREAM_MEMOPS (client_resource.c).
        cmd::GPU_GET_MEMOP_ENABLE => {
            put_u32(p, 0, 0);
            NV_OK
        }
        // NV0000_SYNC_GPU_BOOST_GROUP_INFO_PARAMS {groupCount@0;
        // pBoostGroups[16] of 140 bytes} (ctrl0000syncgpuboost.h).
        cmd::SYNC_GPU_BOOST_GROUP_INFO => {
            p.fill(0);
            NV_OK
        }
        cmd::CLIENT_GET_ADDR_SPACE_TYPE => addr_space_type(view, p),
        // NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS
        // {RS_SHARE_POLICY sharePolicy} (ctrl0000client.h, rs_access.h).
        cmd::CLIENT_SET_INHERITED_SHARE_POLICY => NV_OK,
        _ => NV_ERR_NOT_SUPPORTED,
    }
}

/// `NV0000_CTRL_GPU_INVALID_ID` (`ctrl0000gpu.h`).
const INVALID_ID: u32 = 0xffff_ffff;
/// `NV0000_CTRL_GPU_ATTACH_ALL_PROBED_IDS` (`ctrl0000gpu.h`).
const ATTACH_ALL_PROBED_IDS: u32 = 0x0000_ffff;

/// 32 gpuIds at `off`: every GPU, then NV0000_CTRL_GPU_INVALID_ID.
fn id_table(cfg: &Config, p: &mut [u8], off: usize) {
    for k in 0..32u32 {
        let v = if k < cfg.gpus {
            gpu_id::gpu_id(k)
        } else {
            INVALID_ID
        };
        put_u32(p, off + 4 * k as usize, v);
    }
}

/// SYSTEM_GET_BUILD_VERSION, as `_ctrl_convert_v2_NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION`
/// (`src/nvidia/interface/deprecated/rmapi_deprecated_control.c`): any NULL
/// pointer: only sizeOfStrings (the longest string with its NUL); a
/// sizeOfStrings below that: NV_ERR_INVALID_PARAM_STRUCT; else each string
/// with its NUL through its pointer (a failed copy: NV_ERR_INVALID_PARAM_STRUCT)
/// and the changelist numbers.
fn build_version_v1(cfg: &Config, p: &mut [u8], mem: &dyn UserMem) -> u32 {
    use build_version::*;
    let strings = [
        (P_DRIVER_VERSION, cfg.driver_version.as_str()),
        (P_VERSION, BUILD_BRANCH_VERSION),
        (P_TITLE, BUILD_TITLE),
    ];
    let max = strings.iter().map(|(_, s)| s.len() + 1).max().unwrap_or(1) as u32;
    if strings.iter().any(|&(off, _)| u64_at(p, off) == 0) {
        put_u32(p, SIZE_OF_STRINGS, max);
        return NV_OK;
    }
    if u32_at(p, SIZE_OF_STRINGS) < max {
        return NV_ERR_INVALID_PARAM_STRUCT;
    }
    for (off, s) in strings {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        if !mem.write(u64_at(p, off), &bytes) {
            return NV_ERR_INVALID_PARAM_STRUCT;
        }
    }
    put_u32(p, CHANGELIST, BUILD_CHANGELIST);
    put_u32(p, OFFICIAL_CHANGELIST, BUILD_CHANGELIST);
    NV_OK
}

/// GPU_GET_ID_INFO (40 bytes: gpuId@0, gpuFlags@4, deviceInstance@8,
/// subDeviceInstance@12, NvP64 szName@16, sliStatus@24, boardId@28,
/// gpuInstance@32, NvS32 numaId@36) and GPU_GET_ID_INFO_V2 (32 bytes: the same
/// without szName: sliStatus@16, boardId@20, gpuInstance@24, numaId@28)
/// (`ctrl0000gpu.h`), as gpumgrGetGpuIdInfoV2 (`gpu_mgr.c`); V1 copies the V2
/// answer and leaves szName alone.
fn id_info(cfg: &Config, cmd: u32, p: &mut [u8]) -> u32 {
    let Some(i) = gpu_of_id(cfg, u32_at(p, 0)) else {
        return NV_ERR_INVALID_ARGUMENT;
    };
    let tail = if cmd == cmd::GPU_GET_ID_INFO { 24 } else { 16 };
    // No ATS, not in an SLI device, not mobile, not the boot GPU, not an SOC;
    // IN_USE (device objects exist) is not known here and stays 0.
    put_u32(p, 4, 0);
    put_u32(p, 8, i); // deviceInstance
    put_u32(p, 12, 0); // subDeviceInstance
    put_u32(p, tail, 0); // sliStatus: NV0000_CTRL_SLI_STATUS_OK
    put_u32(p, tail + 4, gpu_id::gpu_id(i)); // boardId: one board per GPU
    put_u32(p, tail + 8, i); // gpuInstance
    put_u32(p, tail + 12, u32::MAX); // numaId: NV0000_CTRL_NO_NUMA_NODE (-1)
    NV_OK
}

/// GPU_GET_UUID_INFO: NV0000_CTRL_GPU_GET_UUID_INFO_PARAMS {gpuUuid[256]@0;
/// flags@256; gpuId@260; deviceInstance@264; subdeviceInstance@268}
/// (`ctrl0000gpu.h`). flags bits 1:0 FORMAT (0 ascii, 2 binary), bit 2 TYPE
/// (0 SHA-1; the SHA-256 form is not generated: not found).
fn uuid_info(cfg: &Config, p: &mut [u8]) -> u32 {
    let flags = u32_at(p, 256);
    if flags & 0x4 != 0 {
        return NV_ERR_OBJECT_NOT_FOUND;
    }
    let binary = flags & 0x3 == 0x2;
    let found = (0..cfg.gpus).find(|&i| {
        if binary {
            p[..16] == gpu_id::uuid(i)
        } else {
            let want = uuid_ascii(i);
            let got = &p[..256];
            let end = got.iter().position(|&b| b == 0).unwrap_or(got.len());
            got[..end].eq_ignore_ascii_case(want.as_bytes())
        }
    });
    let Some(i) = found else {
        return NV_ERR_OBJECT_NOT_FOUND;
    };
    put_u32(p, 260, gpu_id::gpu_id(i));
    put_u32(p, 264, i);
    put_u32(p, 268, 0);
    NV_OK
}

/// GPU_GET_UUID_FROM_GPU_ID: NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS
/// {gpuId@0; flags@4; gpuUuid[256]@8; uuidStrLen@264} (`ctrl0000gpu.h`).
fn uuid_from_gpu_id(cfg: &Config, p: &mut [u8]) -> u32 {
    let Some(i) = gpu_of_id(cfg, u32_at(p, 0)) else {
        return NV_ERR_OBJECT_NOT_FOUND;
    };
    let flags = u32_at(p, 4);
    if flags & 0x4 != 0 {
        return NV_ERR_NOT_SUPPORTED;
    }
    let data = if flags & 0x3 == 0x2 {
        gpu_id::uuid(i).to_vec()
    } else {
        uuid_ascii_nul(i)
    };
    p[8..264].fill(0);
    put_bytes(p, 8, &data);
    put_u32(p, 264, data.len() as u32);
    NV_OK
}

/// `NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_*` (`ctrl0000client.h`).
pub mod addr_space {
    pub const SYSMEM: u32 = 1;
    pub const VIDMEM: u32 = 2;
    pub const REGMEM: u32 = 3;
    pub const FABRIC: u32 = 4;
}

/// CLIENT_GET_ADDR_SPACE_TYPE: NV0000_CTRL_CLIENT_GET_ADDR_SPACE_TYPE_PARAMS
/// {hObject@0 (in); mapFlags@4 (in); addrSpaceType@8 (out)}
/// (`ctrl0000client.h`), as cliresCtrlCmdClientGetAddrSpaceType
/// (`client_resource.c`): unknown handle NV_ERR_OBJECT_NOT_FOUND
/// (clientGetResourceRef); memory by where it lives (EGM counts as sysmem;
/// virtual memory: NV_ERR_INVALID_ARGUMENT); other GPU resources (usermode,
/// channels, device, subdevice) REGMEM (gpuresGetMapAddrSpace); anything
/// else NV_ERR_INVALID_OBJECT. mapFlags are not modelled.
fn addr_space_type(view: &dyn View, p: &mut [u8]) -> u32 {
    let Some(class) = view.object_class(u32_at(p, 0)) else {
        return NV_ERR_OBJECT_NOT_FOUND;
    };
    let t = match class {
        0x3e | 0x71 | 0x42 => addr_space::SYSMEM,
        0x40 | 0x3f | 0xc2 => addr_space::VIDMEM,
        0xf8 | 0xf3 => addr_space::FABRIC,
        0x70 | 0x50a0 => {
            put_u32(p, 8, 0);
            return NV_ERR_INVALID_ARGUMENT;
        }
        // Clients and events are not GPU resources.
        0x0 | 0x1 | 0x41 | 0x5 | 0x78 | 0x79 | 0x7e => return NV_ERR_INVALID_OBJECT,
        _ => addr_space::REGMEM,
    };
    put_u32(p, 8, t);
    NV_OK
}

// ----- NV0080: the device ------------------------------------------------------------------

fn device_control(cmd: u32, p: &mut [u8], mem: &dyn UserMem) -> u32 {
    match cmd {
        // NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS {numClasses@0 (in/out);
        // NvP64 classList@8} (ctrl0080gpu.h): gpuGetClassList
        // (gpu_resource_desc.c) through the embedded-param copy
        // (src/nvidia/src/kernel/rmapi/embedded_param_copy.c).
        cmd::DEV_GPU_GET_CLASSLIST => {
            let ptr = u64_at(p, 8);
            let n = HOPPER_CLASSES.len() as u32;
            if ptr == 0 {
                put_u32(p, 0, n);
                return NV_OK;
            }
            let room = u32_at(p, 0);
            if room == 0 {
                // A zero-length list with a pointer: rmapiParamsAcquire refuses it.
                return NV_ERR_INVALID_ARGUMENT;
            }
            let Some(mut list) = mem.read(ptr, room as usize * 4) else {
                return NV_ERR_INVALID_ADDRESS;
            };
            for (k, c) in HOPPER_CLASSES.iter().take(room as usize).enumerate() {
                put_u32(&mut list, 4 * k, *c);
            }
            put_u32(p, 0, n);
            if !mem.write(ptr, &list) {
                return NV_ERR_INVALID_ADDRESS;
            }
            if room < n {
                NV_ERR_INVALID_PARAM_STRUCT
            } else {
                NV_OK
            }
        }
        // NV0080_CTRL_GPU_GET_NUM_SUBDEVICES_PARAMS {numSubDevices}
        // (ctrl0080gpu.h): always 1 (src/nvidia/src/kernel/gpu/device_ctrl.c).
        cmd::DEV_GPU_GET_NUM_SUBDEVICES => {
            put_u32(p, 0, 1);
            NV_OK
        }
        // NV0080_CTRL_GPU_QUERY_SW_STATE_PERSISTENCE_PARAMS {swStatePersistence}
        // (ctrl0080gpu.h): NV0080_CTRL_GPU_SW_STATE_PERSISTENCE_DISABLED is 1
        // (ENABLED is 0); no persistence daemon keeps the simulated GPUs up.
        cmd::DEV_GPU_QUERY_SW_STATE_PERSISTENCE => {
            put_u32(p, 0, 1);
            NV_OK
        }
        // NV0080_CTRL_GPU_GET_VGX_CAPS_PARAMS {NvBool isVgx} (ctrl0080gpu.h):
        // always NV_FALSE (deviceCtrlCmdGpuGetVgxCaps, device_ctrl.c).
        cmd::DEV_GPU_GET_VGX_CAPS => {
            p[0] = 0;
            NV_OK
        }
        // NV0080_CTRL_GPU_GET_VIRTUALIZATION_MODE_PARAMS {virtualizationMode}
        // (ctrl0080gpu.h): NONE = 0 (bare metal).
        cmd::DEV_GPU_GET_VIRTUALIZATION_MODE => {
            put_u32(p, 0, 0);
            NV_OK
        }
        // NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS {numClasses@0;
        // classList[160]@4} (ctrl0080gpu.h).
        cmd::DEV_GPU_GET_CLASSLIST_V2 => {
            p.fill(0);
            put_u32(p, 0, HOPPER_CLASSES.len() as u32);
            for (k, c) in HOPPER_CLASSES.iter().enumerate() {
                put_u32(p, 4 + 4 * k, *c);
            }
            NV_OK
        }
        // NV0080_CTRL_GPU_GET_BRAND_CAPS_PARAMS {brands} (ctrl0080gpu.h):
        // QUADRO, NVS and TITAN bits; a data-center part has none.
        cmd::DEV_GPU_GET_BRAND_CAPS => {
            put_u32(p, 0, 0);
            NV_OK
        }
        // NV0080_CTRL_FB_GET_CAPS_V2_PARAMS {capsTbl[3]} (ctrl0080fb.h), as
        // memmgrGetDeviceCaps (src/nvidia/src/kernel/gpu/mem_mgr/mem_mgr_ctrl.c):
        // SUPPORT_RENDER_TO_SYSMEM 0:0x01, BLOCKLINEAR 0:0x02,
        // BLOCKLINEAR_GOBS_512 1:0x01, GENERIC_PAGE_KIND 1:0x80,
        // VIDMEM_ALLOCS_ARE_CLEARED 2:0x02.
        cmd::DEV_FB_GET_CAPS_V2 => {
            p.copy_from_slice(&[0x03, 0x81, 0x02]);
            NV_OK
        }
        // NV0080_CTRL_HOST_GET_CAPS_V2_PARAMS {capsTbl[3]} (ctrl0080host.h), as
        // kbusGetDeviceCaps (src/nvidia/src/kernel/gpu/bus/kern_bus.c) on a
        // coherent x86 chipset: GPU_COHERENT_MAPPING_SUPPORTED 0:0x04 only.
        cmd::DEV_HOST_GET_CAPS_V2 => {
            p.copy_from_slice(&[0x04, 0x00, 0x00]);
            NV_OK
        }
        // NV0080_CTRL_FIFO_GET_CAPS_V2_PARAMS {capsTbl[2]} (ctrl0080fifo.h), as
        // kfifoGetDeviceCaps (src/nvidia/src/kernel/gpu/fifo/kernel_fifo.c):
        // SUPPORT_PCI_PB 0:0x02, SUPPORT_VID_PB 0:0x04,
        // MULTI_VAS_PER_CHANGRP 1:0x20 (subcontexts).
        cmd::DEV_FIFO_GET_CAPS_V2 => {
            p.copy_from_slice(&[0x06, 0x20]);
            NV_OK
        }
        _ => NV_ERR_NOT_SUPPORTED,
    }
}

// ----- NV2080: the subdevice -------------------------------------------------------------

fn subdevice_control(view: &dyn View, gpu: u32, cmd: u32, p: &mut [u8], mem: &dyn UserMem) -> u32 {
    let cfg = view.config();
    let v = Version::of(&cfg.driver_version);
    match cmd {
        // Unpublished layout: success with the buffer zeroed, which is what
        // libcuda was measured to accept (docs/real-nvidia.md). The one answer
        // here not taken from a header.
        cmd::GSS_LEGACY_0X8159 => {
            p.fill(0);
            NV_OK
        }
        cmd::GPU_GET_INFO => deprecated_list(p, mem, 64, gpu_info),
        cmd::GPU_GET_INFO_V2 => list_v2(p, moved::by(v, moved::GPU_INFO_MAX), gpu_info),
        cmd::GPU_GET_NAME_STRING => name_string(p),
        // NV2080_CTRL_GPU_GET_SHORT_NAME_STRING_PARAMS {gpuShortNameString[64]}
        // (ctrl2080gpu.h).
        cmd::GPU_GET_SHORT_NAME_STRING => {
            put_cstr(p, 0, 64, SHORT_NAME);
            NV_OK
        }
        // NV2080_CTRL_GPU_GET_SIMULATION_INFO_PARAMS {type} (ctrl2080gpu.h):
        // NV2080_CTRL_GPU_GET_SIMULATION_INFO_TYPE_NONE = 0 on silicon.
        cmd::GPU_GET_SIMULATION_INFO => {
            put_u32(p, 0, 0);
            NV_OK
        }
        cmd::GPU_QUERY_ECC_STATUS => ecc_status(p, v),
        // NV2080_CTRL_GPU_QUERY_COMPUTE_MODE_RULES_PARAMS {rules}
        // (ctrl2080gpu.h): NV2080_CTRL_GPU_COMPUTE_MODE_RULES_NONE = 0.
        cmd::GPU_QUERY_COMPUTE_MODE_RULES => {
            put_u32(p, 0, 0);
            NV_OK
        }
        // NV2080_CTRL_GPU_GET_ID_PARAMS {gpuId} (ctrl2080gpu.h).
        cmd::GPU_GET_ID => {
            put_u32(p, 0, gpu_id::gpu_id(gpu));
            NV_OK
        }
        cmd::GPU_GET_GID_INFO => gid_info(gpu, p),
        // NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS {engineCount@0;
        // engineList[62]@4} (ctrl2080gpu.h).
        cmd::GPU_GET_ENGINES_V2 => {
            let e = engines();
            p.fill(0);
            put_u32(p, 0, e.len() as u32);
            for (k, v) in e.iter().enumerate() {
                put_u32(p, 4 + 4 * k, *v);
            }
            NV_OK
        }
        // subdeviceCtrlCmdGpuGetActivePartitionIds
        // (src/nvidia/src/kernel/gpu/mig_mgr/kernel_mig_manager.c): MIG mode
        // off gives NV_ERR_NOT_SUPPORTED (partitionCount@36 set to 0 first).
        cmd::GPU_GET_ACTIVE_PARTITION_IDS => NV_ERR_NOT_SUPPORTED,
        cmd::GPU_GET_PIDS => get_pids(view, gpu, p),
        cmd::GPU_GET_PID_INFO => get_pid_info(view, gpu, p),
        // NV2080_CTRL_GPU_GET_COMPUTE_POLICY_CONFIG_PARAMS {numConfigs@0;
        // configList[32]@4 of {type; data}} (ctrl2080gpu.h): one policy,
        // TIMESLICE (0), value NV2080_CTRL_CMD_GPU_COMPUTE_TIMESLICE_DEFAULT (0)
        // (subdevice_ctrl_gpu_kernel.c).
        cmd::GPU_GET_COMPUTE_POLICY_CONFIG => {
            put_u32(p, 0, 1);
            put_u32(p, 4, 0);
            put_u32(p, 8, 0);
            NV_OK
        }
        // NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS {NvU8 state@0;
        // status@4; clusterUuid[16]@8; NvU16 fabricPartitionId@24;
        // NvU64 fabricCaps@32} (ctrl2080gpu.h): no fabric probe object,
        // NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED (0), NV_OK
        // (subdeviceCtrlCmdGetGpuFabricProbeInfo).
        cmd::GET_GPU_FABRIC_PROBE_INFO => {
            p[0] = 0;
            NV_OK
        }
        cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO => time_correlation(p),
        // NV2080_CTRL_GPU_GET_RESET_STATUS_PARAMS {NvBool bResetRequired} and
        // NV2080_CTRL_GPU_GET_DRAIN_AND_RESET_STATUS_PARAMS
        // {NvBool bDrainRecommended} (ctrl2080gpu.h): a healthy GPU, no.
        cmd::GPU_GET_RESET_STATUS | cmd::GPU_GET_DRAIN_AND_RESET_STATUS => {
            p[0] = 0;
            NV_OK
        }
        cmd::GR_GET_INFO => embedded_list(p, mem, 53, gr_info),
        cmd::GR_GET_INFO_V2 => list_v2(p, moved::by(v, moved::GR_INFO_MAX), gr_info),
        cmd::GR_GET_GLOBAL_SM_ORDER => global_sm_order(p, v),
        // NV0080_CTRL_GR_GET_CAPS_V2_PARAMS {capsTbl[23]@0; grRouteInfo@24;
        // NvBool bCapsPopulated@40} (ctrl0080gr.h). The 535 headers publish no
        // GR cap bit, so the table stays empty.
        cmd::GR_GET_CAPS_V2 => {
            p[..23].fill(0);
            p[40] = 1;
            NV_OK
        }
        // NV2080_CTRL_GR_GET_GPC_MASK_PARAMS {grRouteInfo@0 (16); gpcMask@16}
        // (ctrl2080gr.h).
        cmd::GR_GET_GPC_MASK => {
            put_u32(p, 16, (1 << TPCS_PER_GPC.len()) - 1);
            NV_OK
        }
        // NV2080_CTRL_GR_GET_TPC_MASK_PARAMS {grRouteInfo@0; gpcId@16;
        // tpcMask@20} (ctrl2080gr.h): "If the GPC with this ID is not
        // enabled this command will return an tpcMask value of zero."
        cmd::GR_GET_TPC_MASK => {
            let g = u32_at(p, 16) as usize;
            let mask = TPCS_PER_GPC.get(g).map_or(0, |&n| (1u32 << n) - 1);
            put_u32(p, 20, mask);
            NV_OK
        }
        // NV2080_CTRL_GR_GET_SM_ISSUE_RATE_MODIFIER_PARAMS {grRouteInfo@0 (16);
        // NvU8 imla0@16, fmla16@17, dp@18, fmla32@19, ffma@20, imla1@21,
        // imla2@22, imla3@23, imla4@24} (ctrl2080gr.h): every instruction
        // type at FULL_SPEED (0), a data-center part
        // (subdeviceCtrlCmdKGrGetSmIssueRateModifier, kernel_graphics.c).
        cmd::GR_GET_SM_ISSUE_RATE_MODIFIER => {
            p[16..25].fill(0);
            NV_OK
        }
        cmd::FB_GET_INFO => embedded_list(p, mem, 54, |l| fb_info(view, gpu, l)),
        cmd::FB_GET_INFO_V2 => list_v2(p, moved::by(v, moved::FB_INFO_MAX), |l| {
            fb_info(view, gpu, l)
        }),
        // NV2080_CTRL_FB_GET_GPU_CACHE_INFO_PARAMS {powerState; writeMode;
        // bypassMode; rcmState} (ctrl2080fb.h): ENABLED 0, WRITEBACK 1,
        // BYPASS_MODE_DISABLED 0, RCM_STATE_FULL 0.
        cmd::FB_GET_GPU_CACHE_INFO => {
            put_u32(p, 0, 0);
            put_u32(p, 4, 1);
            put_u32(p, 8, 0);
            put_u32(p, 12, 0);
            NV_OK
        }
        // NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS {architecture@0;
        // implementation@4; revision@8; NvU8 subRevision@12} (ctrl2080mc.h), as
        // subdeviceCtrlCmdMcGetArchInfo (src/nvidia/src/kernel/gpu/mc/kernel_mc.c):
        // PMC_BOOT_0 arch, impl, majorRev << 4 | minorRev.
        cmd::MC_GET_ARCH_INFO => {
            put_u32(p, 0, ARCH_GH100);
            put_u32(p, 4, 0);
            put_u32(p, 8, PCI_REVISION);
            p[12] = 0;
            NV_OK
        }
        // NV2080_CTRL_MC_SERVICE_INTERRUPTS_PARAMS {engines} (ctrl2080mc.h).
        cmd::MC_SERVICE_INTERRUPTS => NV_OK,
        // NV2080_CTRL_BUS_GET_PCI_INFO_PARAMS {pciDeviceId@0; pciSubSystemId@4;
        // pciRevisionId@8; pciExtDeviceId@12} (ctrl2080bus.h), as
        // subdeviceCtrlCmdBusGetPciInfo (src/nvidia/src/kernel/gpu/bus/kern_bus_ctrl.c):
        // config dwords 0 (device << 16 | vendor) and 0x2c (subsystem).
        cmd::BUS_GET_PCI_INFO => {
            let vendor = u32::from(gpu_id::PCI_VENDOR);
            let device = u32::from(gpu_id::PCI_DEVICE);
            put_u32(p, 0, device << 16 | vendor);
            put_u32(p, 4, u32::from(PCI_SUBSYSTEM) << 16 | vendor);
            put_u32(p, 8, PCI_REVISION);
            put_u32(p, 12, device);
            NV_OK
        }
        // BUS_GET_INFO (V1) is a deprecated converter; a NULL list or a zero
        // count answers NV_OK (subdeviceCtrlCmdBusGetInfo).
        cmd::BUS_GET_INFO => {
            if u32_at(p, 0) == 0 || u64_at(p, 8) == 0 {
                return NV_OK;
            }
            deprecated_list(p, mem, 52, |l| bus_info(gpu, l))
        }
        cmd::BUS_GET_INFO_V2 => list_v2(p, 52, |l| bus_info(gpu, l)),
        cmd::BUS_GET_PCI_BAR_INFO => pci_bar_info(cfg, gpu, p),
        // NV2080_CTRL_CMD_BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS_PARAMS
        // {atomicOp[13] of {NvBool bSupported@0; attributes@4}} (ctrl2080bus.h):
        // no GPU atomic maps to a PCIe atomic on the simulated link.
        cmd::BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS => {
            p.fill(0);
            NV_OK
        }
        // NV2080_CTRL_PERF_BOOST_PARAMS {flags; duration} (ctrl2080perf.h).
        cmd::PERF_BOOST => NV_OK,
        // NV2080_CTRL_RC_GET_WATCHDOG_INFO_PARAMS {watchdogStatusFlags}
        // (ctrl2080rc.h), as subdeviceCtrlCmdRcGetWatchdogInfo
        // (src/nvidia/src/kernel/gpu/rc/kernel_rc_watchdog_ctrl.c): the
        // watchdog is not initialized, FLAGS_NONE.
        cmd::RC_GET_WATCHDOG_INFO => {
            put_u32(p, 0, 0);
            NV_OK
        }
        cmd::CE_GET_CAPS => ce_caps_v1(p, mem),
        // NV2080_CTRL_CE_GET_CAPS_V2_PARAMS {ceEngineType@0; capsTbl[2]@4}
        // (ctrl2080ce.h): subdeviceCtrlCmdCeGetCapsV2
        // (src/nvidia/src/kernel/gpu/ce/kernel_ce_shared.c).
        cmd::CE_GET_CAPS_V2 => match ce_caps(u32_at(p, 0)) {
            Some(c) => {
                put_bytes(p, 4, &c);
                NV_OK
            }
            None => NV_ERR_NOT_SUPPORTED,
        },
        // NV2080_CTRL_CE_GET_ALL_CAPS_PARAMS {capsTbl[32][2]@0; present@64}
        // (ctrl2080ce.h).
        cmd::CE_GET_ALL_CAPS => {
            p.fill(0);
            for i in 0..NUM_CE {
                if let Some(c) = ce_caps(engine::COPY0 + i) {
                    put_bytes(p, 2 * i as usize, &c);
                }
            }
            put_u32(p, moved::by(v, moved::CE_PRESENT), (1 << NUM_CE) - 1);
            NV_OK
        }
        // NV2080_CTRL_GSP_GET_FEATURES_PARAMS {gspFeatures@0; NvBool bValid@4;
        // NvBool bDefaultGspRmGpu@5; firmwareVersion[64]@6} (ctrl2080gsp.h):
        // GSP-RM offload (bValid), Hopper runs GSP-RM by default, no GSP
        // feature bits (UVM_ENABLED 0:0 false: UVM runs on the CPU).
        cmd::GRMGR_GET_GR_FS_INFO => gr_fs_info(p),
        cmd::GSP_GET_FEATURES => {
            put_u32(p, 0, 0);
            p[4] = 1;
            p[5] = 1;
            put_cstr(p, 6, 64, &cfg.driver_version);
            NV_OK
        }
        _ => NV_ERR_NOT_SUPPORTED,
    }
}

/// The info lists are arrays of `{index; data}` (NVXXXX_CTRL_XXX_INFO, 8
/// bytes each, `src/common/sdk/nvidia/inc/ctrl/ctrlxxxx.h`) answered in place
/// by a function that returns the status.
///
/// The V2 form: `{listSize@0; list[max]@4}`; a size of 0 or above `max`:
/// NV_ERR_INVALID_ARGUMENT (every `*GetInfoV2` implementation).
fn list_v2(p: &mut [u8], max: usize, f: impl Fn(&mut [u8]) -> u32) -> u32 {
    let n = u32_at(p, 0) as usize;
    if n == 0 || n > max {
        return NV_ERR_INVALID_ARGUMENT;
    }
    f(&mut p[4..4 + 8 * n])
}

/// A V1 list behind a pointer (`{listSize@0; NvP64 list@8}`) through the
/// generic embedded-param copy (FB_GET_INFO, GR_GET_INFO): unreadable or
/// unwritable list NV_ERR_INVALID_ADDRESS; NULL or empty list
/// NV_ERR_INVALID_ARGUMENT; more than `max` entries are cut to `max`
/// (deviceCtrlCmdKGrGetInfo) or refused (FB: the V2 bound applies); both
/// answered as the V2 form would.
fn embedded_list(p: &mut [u8], mem: &dyn UserMem, max: usize, f: impl Fn(&mut [u8]) -> u32) -> u32 {
    let n = u32_at(p, 0) as usize;
    let ptr = u64_at(p, 8);
    if n == 0 || ptr == 0 {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let n = n.min(max);
    let Some(mut list) = mem.read(ptr, 8 * n) else {
        return NV_ERR_INVALID_ADDRESS;
    };
    let st = f(&mut list);
    if st == NV_OK && !mem.write(ptr, &list) {
        return NV_ERR_INVALID_ADDRESS;
    }
    st
}

/// A V1 list behind a pointer answered by a deprecated converter
/// (`CONVERT_TO_V2` in `rmapi_deprecated_control.c`): unreadable list
/// NV_ERR_INVALID_ADDRESS; more entries than the V2 array
/// NV_ERR_INSUFFICIENT_RESOURCES; the V2 call's status; a failed copy-out is
/// ignored.
fn deprecated_list(
    p: &mut [u8],
    mem: &dyn UserMem,
    max: usize,
    f: impl Fn(&mut [u8]) -> u32,
) -> u32 {
    let n = u32_at(p, 0) as usize;
    let ptr = u64_at(p, 8);
    if n > max {
        return NV_ERR_INSUFFICIENT_RESOURCES;
    }
    if n == 0 {
        // Nothing copied in; the V2 call refuses an empty list.
        return NV_ERR_INVALID_ARGUMENT;
    }
    let Some(mut list) = mem.read(ptr, 8 * n) else {
        return NV_ERR_INVALID_ADDRESS;
    };
    let st = f(&mut list);
    if st == NV_OK {
        let _ = mem.write(ptr, &list);
    }
    st
}

/// Fills each `{index; data}` of `list` from `value(index)`; an index it does
/// not know (`None`) gets data 0 and the status NV_ERR_INVALID_ARGUMENT. With
/// `stop`, the first unknown index ends the walk (getBusInfos); without, the
/// walk goes on (getGpuInfos, _fbGetFbInfos).
fn fill_list(list: &mut [u8], stop: bool, value: impl Fn(u32) -> Option<u32>) -> u32 {
    let mut st = NV_OK;
    for e in list.chunks_exact_mut(8) {
        let (data, ok) = match value(u32_at(e, 0)) {
            Some(v) => (v, true),
            None => (0, false),
        };
        put_u32(e, 4, data);
        if !ok {
            st = NV_ERR_INVALID_ARGUMENT;
            if stop {
                break;
            }
        }
    }
    st
}

/// GPU_GET_INFO_V2: NV2080_CTRL_GPU_GET_INFO_V2_PARAMS {gpuInfoListSize@0;
/// gpuInfoList[64]@4} (`ctrl2080gpu.h`), values as getGpuInfos
/// (`src/nvidia/src/kernel/gpu/subdevice/subdevice_ctrl_gpu_kernel.c`);
/// an index at or above NV2080_CTRL_GPU_INFO_MAX_LIST_SIZE (64):
/// NV_ERR_INVALID_ARGUMENT (data 0, the walk goes on); the indexes below 64
/// that the kernel does not handle go to GSP-RM and are answered 0 when the
/// header does not say what they are.
pub fn gpu_info(list: &mut [u8]) -> u32 {
    fill_list(list, false, |index| {
        Some(match index {
            0x04 => 0,           // MINOR_REVISION_EXT: NONE
            0x12 | 0x13 => 0,    // NETLIST_REV0/1
            0x1f => 1,           // SYSMEM_ACCESS: YES
            0x22 => 0,           // GEMINI_BOARD: NO
            0x25 => 0,           // SURPRISE_REMOVAL_POSSIBLE: NO
            0x26 => 0xffff_ffff, // IBMNPU_RELAXED_ORDERING: UNSUPPORTED
            0x27 => 0,           // GLOBAL_POISON_FUSE_ENABLED: NO
            0x28 => 0,           // NVSWITCH_PROXY_DETECTED: NO
            0x29 => 0,           // GPU_SR_SUPPORT: NO
            0x2a => 2,           // GPU_SMC_MODE: DISABLED (MIG capable, off)
            0x2b => 0,           // SPLIT_VAS_MGMT_SERVER_CLIENT_RM: NO
            0x2c => 0x900,       // GPU_SM_VERSION: 9.0
            0x2d => 0,           // GPU_FLA_CAPABILITY: NO (no fabric)
            0x2f => 1,           // PER_RUNLIST_CHANNEL_RAM: ENABLED
            0x30 => 0,           // GPU_ATS_CAPABILITY: NO (x86)
            0x31 => 2,           // NVENC_STATS_REPORTING_STATE: NOT_SUPPORTED
            0x33 => 0,           // 4K_PAGE_ISOLATION_REQUIRED: NO
            0x34 => 0,           // DISPLAY_ENABLED: NO
            0x35 => 0,           // MOBILE_CONFIG_ENABLED: NO
            0x36 => 1,           // GPU_PROFILING_CAPABILITY: ENABLED
            0x37 => 1,           // GPU_DEBUGGING_CAPABILITY: ENABLED
            0x3a => 0,           // GPU_LOCAL_EGM_CAPABILITY: NO
            0x3b => 0,           // GPU_SELF_HOSTED_CAPABILITY: NO
            0x3c => 0,           // CMP_SKU: NO
            0x3d => 0,           // DMABUF_CAPABILITY: NO (not simulated)
            0x3f => 0,           // IS_RESETLESS_MIG_SUPPORTED: NO
            // Indexes the public header does not define (libcuda 535 asks
            // for 0x11) are forwarded to GSP-RM, which knows them; their
            // meaning is not public, so 0.
            i if i < 0x40 => 0,
            _ => return None,
        })
    })
}

/// GR_GET_INFO_V2: NV0080_CTRL_GR_GET_INFO_V2_PARAMS {grInfoListSize@0;
/// grInfoList[53]@4; grRouteInfo@432} (`ctrl0080gr.h`, `ctrl2080gr.h`), as
/// _kgraphicsCtrlCmdGrGetInfoV2 (`src/nvidia/src/kernel/gpu/gr/kernel_graphics.c`):
/// an index at or above 53 stops with NV_ERR_INVALID_ARGUMENT; any other
/// answers from the static table (0 where GH100's value is not known here).
/// The route info is not used (MIG off: always GR0).
pub fn gr_info(list: &mut [u8]) -> u32 {
    let tpcs: u32 = TPCS_PER_GPC.iter().sum();
    for e in list.chunks_exact_mut(8) {
        let index = u32_at(e, 0);
        let data = match index {
            0x07 => tpcs,                      // SHADER_PIPE_COUNT (TPCs)
            0x09 => tpcs,  // SHADER_PIPE_SUB_COUNT (TPCs: nv_gpu_ops.c tpcCount)
            0x0c => 0x900, // SM_VERSION 9.0
            0x0d => 64,    // MAX_WARPS_PER_SM
            0x0e => 32,    // MAX_THREADS_PER_WARP
            0x13 => 128,   // MAX_SP_PER_SM
            0x14 => TPCS_PER_GPC.len() as u32, // LITTER_NUM_GPCS
            0x15 => 12,    // LITTER_NUM_FBPS
            0x17 => 9,     // LITTER_NUM_TPC_PER_GPC
            0x1a => 1,     // TIMESLICE_ENABLED
            0x1c => 3,     // LITTER_NUM_PES_PER_GPC
            0x1d => sm_count() * 128, // GPU_CORE_COUNT
            0x1e => 3,     // LITTER_NUM_TPCS_PER_PES
            0x20 => SMS_PER_TPC, // LITTER_NUM_SM_PER_TPC
            0x23 => sm_count() * 4, // TENSOR_CORE_COUNT
            0x24 => 8,     // LITTER_NUM_GRS
            0x25 => 24,    // LITTER_NUM_LTCS
            0x28 => 2,     // LITTER_NUM_LTC_PER_FBP
            0x2a => 9,     // FAMILY_MAX_TPC_PER_GPC
            0x2c => 64,    // MAX_SUBCONTEXT_COUNT
            0x2e => 64,    // MAX_PER_ENGINE_SUBCONTEXT_COUNT
            i if i < 53 => 0,
            _ => return NV_ERR_INVALID_ARGUMENT,
        };
        put_u32(e, 4, data);
    }
    NV_OK
}

/// FB_GET_INFO_V2: NV2080_CTRL_FB_GET_INFO_V2_PARAMS {fbInfoListSize@0;
/// fbInfoList[54]@4} (`ctrl2080fb.h`), as _fbGetFbInfos
/// (`src/nvidia/src/kernel/gpu/mem_sys/kern_mem_sys_ctrl.c`). Sizes are KiB
/// (u32) except L2CACHE_SIZE (bytes) and BUS_WIDTH (bits). No memory is
/// reserved: heap = total = `Config::mem_per_gpu`, free = [`View::free_bytes`],
/// so the figures agree with the simulator's NV_ERR_NO_MEMORY decisions.
pub fn fb_info(view: &dyn View, gpu: u32, list: &mut [u8]) -> u32 {
    let cfg = view.config();
    let total = cfg.mem_per_gpu;
    let free = view.free_bytes(gpu).min(total);
    let bar1 = bar1_bytes(cfg);
    fill_list(list, false, |index| {
        Some(match index {
            0x00 | 0x03 => 0,             // TILE_REGION_COUNT / _FREE_COUNT (obsolete)
            0x01 => 0,                    // COMPRESSION_SIZE
            0x02 => 0,                    // DRAM_PAGE_STRIDE
            0x04 => 24,                   // PARTITION_COUNT (FBPAs)
            0x05 => kib(bar1),            // BAR1_SIZE
            0x06 => 0,                    // BANK_SWIZZLE_ALIGNMENT
            0x07 => kib(total),           // RAM_SIZE
            0x08 => kib(total),           // TOTAL_RAM_SIZE
            0x09 => kib(total),           // HEAP_SIZE
            0x0a => kib(total.min(bar1)), // MAPPABLE_HEAP_SIZE
            0x0b => BUS_WIDTH_BITS,       // BUS_WIDTH
            0x0c => 0,                    // RAM_CFG
            0x0d => 0x14,                 // RAM_TYPE: HBM3 (no HBM3e value in 535)
            0x0e => 1,                    // BANK_COUNT
            0x0f => 0,                    // deprecated, "index reused to return 0"
            0x10 => 0,                    // FB_TAX_SIZE_KB
            0x11 => 0,                    // HEAP_BASE_KB
            0x12 => kib(free),            // LARGEST_FREE_REGION_SIZE_KB
            0x13 => kib(total - free),    // LARGEST_FREE_REGION_BASE_KB
            0x14 => 0x00ff_ffff,          // PARTITION_MASK
            0x15 => 0,                    // VISTA_RESERVED_HEAP_SIZE
            0x16 => kib(free),            // HEAP_FREE
            0x17 => 0,                    // RAM_LOCATION: GPU_DEDICATED
            0x18 => 0,                    // FB_IS_BROKEN
            0x19 => 12,                   // FBP_COUNT
            0x1a => 0xfff,                // FBP_MASK
            0x1b => L2_BYTES,             // L2CACHE_SIZE (bytes)
            0x1c => 0,                    // MEMORYINFO_VENDOR_ID: UNKNOWN
            0x1d => kib(bar1),            // BAR1_AVAIL_SIZE
            0x1e => 0,                    // HEAP_START
            0x1f => kib(bar1),            // BAR1_MAX_CONTIGUOUS_AVAIL_SIZE
            0x20 => kib(total),           // USABLE_RAM_SIZE
            0x21 => 0,                    // TRAINIG_2T
            0x22 => 24,                   // LTC_COUNT
            0x23 => 96,                   // LTS_COUNT
            0x24 => 0,                    // L2CACHE_ONLY_MODE
            0x25 => 0,                    // PSEUDO_CHANNEL_MODE
            0x26 => 0,                    // SMOOTHDISP_RSVD_BAR1_SIZE
            0x27 => 0,                    // HEAP_OFFLINE_SIZE
            0x28 => 0,                    // 1TO1_COMPTAG_ENABLED
            0x29 => 0,                    // SUSPEND_RESUME_RSVD_SIZE
            0x2a => 1,                    // ALLOW_PAGE_RETIREMENT
            0x2b => 0x00ff_ffff,          // LTC_MASK
            0x2c => 0,                    // POISON_FUSE_ENABLED
            0x2d => 0,                    // FBPA_ECC_ENABLED (no ECC simulated)
            0x2e => 0,                    // DYNAMIC_PAGE_OFFLINING_ENABLED
            0x2f => 0,                    // FORCED_BAR1_64KB_MAPPING_ENABLED
            0x30..=0x32 => 0,             // P2P_MAILBOX_* (no mailbox P2P)
            0x33 | 0x34 => 0,             // PROTECTED_MEM_SIZE_*: CC off
            0x35 => 0,                    // ECC_STATUS_SIZE
            _ => return None,
        })
    })
}

/// BUS_GET_INFO_V2: NV2080_CTRL_BUS_GET_INFO_V2_PARAMS {busInfoListSize@0;
/// busInfoList[52]@4} (`ctrl2080bus.h`), as getBusInfos
/// (`src/nvidia/src/kernel/gpu/bus/kern_bus_ctrl.c`): the first unknown
/// index stops with NV_ERR_INVALID_ARGUMENT.
pub fn bus_info(gpu: u32, list: &mut [u8]) -> u32 {
    // PCIE link caps: MAX_SPEED 3:0 = 32000 MBPS (5), MAX_WIDTH 9:4 = 16,
    // ASPM 11:10 none, GEN 15:12 = GEN5 (4), CURR_LEVEL 19:16 = GEN5 (4),
    // GPU_GEN 23:20 = GEN5 (4).
    const LINK_CAPS: u32 = 5 | 16 << 4 | 4 << 12 | 4 << 16 | 4 << 20;
    // Link control status: ASPM 1:0 disabled, LINK_SPEED 19:16 = 32000 (5),
    // LINK_WIDTH 25:20 = x16.
    const LINK_STATUS: u32 = 5 << 16 | 16 << 20;
    // GPU VA space: 57 bits (Hopper's 5-level MMU), in MiB split low/high.
    const VA_MIB: u64 = (1u64 << 57) >> 20;
    fill_list(list, true, |index| {
        Some(match index {
            0x00 => 3,                           // TYPE: PCI_EXPRESS
            0x01 => 0,                           // INTLINE
            0x02 => 0,                           // CAPS: not integrated, no IO flush
            0x03..=0x06 => LINK_CAPS,            // GPU / ROOT / UPSTREAM / DOWNSTREAM link caps
            0x07..=0x0a => LINK_STATUS,          // their control status
            0x0b => 0x5,                         // COHERENT_DMA_FLAGS: CTXDMA | GPUGART
            0x0c => 0x5,                         // NONCOHERENT_DMA_FLAGS: CTXDMA | GPUGART
            0x0d => VA_MIB as u32,               // GPU_GART_SIZE (MiB, low 32 bits)
            0x0e => 0x2,                         // GPU_GART_FLAGS: UNIFIED
            0x0f => gpu_id::pci_bus(gpu),        // BUS_NUMBER
            0x10 => 0,                           // DEVICE_NUMBER
            0x11 | 0x12 => 0,                    // GPU / ROOT link errors
            0x13 => 3,                           // INTERFACE_TYPE: PCI_EXPRESS
            0x14 => 0x3,                         // PCIE_GEN2_INFO: capable, current gen2+
            0x15 => 0,                           // PCIE_GPU_LINK_AER
            0x16 => LINK_CAPS,                   // PCIE_BOARD_LINK_CAPS
            0x17 => LINK_STATUS,                 // PCIE_BOARD_LINK_CTRL_STATUS
            0x18 => 0x1,                         // PCIE_ASLM_STATUS: PCIE present
            0x19..=0x1a => 0,                    // link width/speed switch error counts
            0x1b => 0,                           // PCIE_GPU_CYA_ASPM: not valid
            0x1c..=0x2b => 0,                    // link error counters and their clears
            0x2c => 0,                           // DOMAIN_NUMBER
            0x2d => 4 << 12 | 4 << 16 | 4 << 20, // PCIE_GEN_INFO: gen5
            0x2e => 3,                           // GPU_INTERFACE_TYPE: PCI_EXPRESS
            0x2f | 0x30 => 4 << 12 | 4 << 16,    // UPSTREAM / BOARD gen info
            0x31 => 1,                           // MSI_INFO: enabled
            0x32 => (VA_MIB >> 32) as u32,       // GPU_GART_SIZE_HI
            0x33 => 0,                           // SYSMEM_CONNECTION_TYPE: PCIE
            _ => return None,
        })
    })
}

/// GPU_GET_NAME_STRING: NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS
/// {gpuNameStringFlags@0; union {NvU8 ascii[64]; NvU16 unicode[64]}@4}
/// (`ctrl2080gpu.h`); flags 0 (TYPE_ASCII) the ascii form, anything else the
/// UTF-16 form (as gpuGetNameString_KERNEL,
/// `src/nvidia/src/kernel/gpu/gpu_name_kernel.c`, picks the copy).
fn name_string(p: &mut [u8]) -> u32 {
    p[4..132].fill(0);
    if u32_at(p, 0) == 0 {
        put_cstr(p, 4, 64, gpu_id::NAME);
    } else {
        for (k, u) in gpu_id::NAME.encode_utf16().take(63).enumerate() {
            put_u16(p, 4 + 2 * k, u);
        }
    }
    NV_OK
}

/// GPU_GET_GID_INFO: NV2080_CTRL_GPU_GET_GID_INFO_PARAMS {index@0; flags@4;
/// length@8; data[256]@12} (`ctrl2080gpu.h`), as gpuGetGidInfo
/// (`src/nvidia/src/kernel/gpu/gpu.c`) and the 550.90.07
/// subdeviceCtrlCmdGpuGetGidInfo: TYPE (bit 2) must be SHA1 else
/// NV_ERR_INVALID_FLAGS; FORMAT (bits 1:0) BINARY (2): the 16 bytes, else the
/// "GPU-…" string with its NUL, length 41 (`gpu_uuid.c`).
fn gid_info(gpu: u32, p: &mut [u8]) -> u32 {
    let flags = u32_at(p, 4);
    if flags & 0x4 != 0 {
        return NV_ERR_INVALID_FLAGS;
    }
    let data = if flags & 0x3 == 0x2 {
        gpu_id::uuid(gpu).to_vec()
    } else {
        uuid_ascii_nul(gpu)
    };
    put_u32(p, 8, data.len() as u32);
    put_bytes(p, 12, &data);
    NV_OK
}

/// GPU_QUERY_ECC_STATUS: NV2080_CTRL_GPU_QUERY_ECC_STATUS_PARAMS
/// {units[24] of 40 bytes @0 (NvBool enabled@0, scrubComplete@1,
/// supported@2, NvU64 dbe@8, dbeNonResettable@16, sbe@24,
/// sbeNonResettable@32); NvBool bFatalPoisonError@960;
/// NvU8 uncorrectableError@961; flags@964 (in); grRouteInfo@968}
/// (`ctrl2080gpu.h`). The simulator has no ECC: every unit unsupported.
/// GRMGR_GET_GR_FS_INFO: NV2080_CTRL_GRMGR_GET_GR_FS_INFO_PARAMS {NvU16
/// numQueries@0; queries[96]@8 of 20 bytes {NvU16 queryType@0; status@4;
/// queryData@8 (12)}} (`ctrl2080grmgr.h`, 1928 bytes in every branch from 535
/// to 580). Routed to GSP-RM (no open implementation); answered as the header
/// documents it for a GPU without MIG (the "legacy" case): GPC_COUNT (1)
/// gpcCount@8; CHIPLET_GPC_MAP (2) gpcId@8 -> chipletGpcMap@12 (no floorsweeping
/// here: the same id); TPC_MASK (3) and PPC_MASK (4) gpcId@8 -> mask@12 (3 PPCs
/// per GH100 GPC); CHIPLET_SYSPIPE_MASK (6) "legacy case returns 1 GR"; ROP_MASK
/// (10) gpcId@8 -> ropMask@12 (2 per GPC). A GPC id out of range gives that
/// query NV_ERR_INVALID_ARGUMENT; the partition queries (5 deprecated, 7, 8, 9)
/// NV_ERR_NOT_SUPPORTED; more than 96 queries fail the call. libcuda 555 sends
/// it at cuInit and gives up when it fails.
fn gr_fs_info(p: &mut [u8]) -> u32 {
    const MAX: usize = 96;
    const QUERY: usize = 20;
    let n = crate::abi::le::u16_at(p, 0) as usize;
    if n > MAX {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let gpcs = TPCS_PER_GPC.len() as u32;
    for q in 0..n {
        let o = 8 + QUERY * q;
        let gpc = u32_at(p, o + 8);
        let in_range = gpc < gpcs;
        let (status, out) = match crate::abi::le::u16_at(p, o) {
            1 => (NV_OK, Some((8, gpcs))),
            2 if in_range => (NV_OK, Some((12, gpc))),
            3 if in_range => (NV_OK, Some((12, (1u32 << TPCS_PER_GPC[gpc as usize]) - 1))),
            4 if in_range => (NV_OK, Some((12, 0x7))),
            10 if in_range => (NV_OK, Some((12, 0x3))),
            2 | 3 | 4 | 10 => (NV_ERR_INVALID_ARGUMENT, None),
            6 => (NV_OK, Some((8, 1))),
            _ => (NV_ERR_NOT_SUPPORTED, None),
        };
        put_u32(p, o + 4, status);
        if let Some((at, value)) = out {
            put_u32(p, o + at, value);
        }
    }
    NV_OK
}

fn ecc_status(p: &mut [u8], v: Version) -> u32 {
    p[..moved::by(v, moved::ECC_FATAL_POISON) + 4].fill(0);
    NV_OK
}

/// GPU_GET_PIDS: NV2080_CTRL_GPU_GET_PIDS_PARAMS {idType@0; id@4;
/// pidTblCount@8; pidTbl[950]@12} (`ctrl2080gpu.h`), as
/// subdeviceCtrlCmdGpuGetPids (`subdevice_ctrl_gpu_kernel.c`) and
/// gpuGetProcWithObject (`src/nvidia/src/kernel/gpu/gpu_rmapi.c`): at most 950
/// pids, the rest of the table untouched.
fn get_pids(view: &dyn View, gpu: u32, p: &mut [u8]) -> u32 {
    const MAX: usize = 950;
    let pids = match u32_at(p, 0) {
        0 => view.pids_with_class(gpu, u32_at(p, 4)),
        1 => Vec::new(), // VGPU_GUEST: no vGPU guests
        _ => return NV_ERR_INVALID_ARGUMENT,
    };
    let n = pids.len().min(MAX);
    for (k, pid) in pids.iter().take(n).enumerate() {
        put_u32(p, 12 + 4 * k, *pid);
    }
    put_u32(p, 8, n as u32);
    NV_OK
}

/// GPU_GET_PID_INFO: NV2080_CTRL_GPU_GET_PID_INFO_PARAMS
/// {pidInfoListCount@0; pidInfoList[200]@8 of 72 bytes: pid@0, index@4,
/// result@8, data@16 (VIDEO_MEMORY_USAGE: NvU64 memPrivate@16,
/// memSharedOwned@24, memSharedDuped@32, protectedMemPrivate@40,
/// protectedMemSharedOwned@48, protectedMemSharedDuped@56),
/// smcSubscription@64 {computeInstanceId, gpuInstanceId}}
/// (`ctrl2080gpu.h`), as subdeviceCtrlCmdGpuGetPidInfo and
/// gpuFindClientInfoWithPidIterator (`gpu_rmapi.c`). The view's figure is
/// private + shared-owned together; it is reported as memPrivate.
fn get_pid_info(view: &dyn View, gpu: u32, p: &mut [u8]) -> u32 {
    const MAX: usize = 200;
    const ENTRY: usize = 72;
    let n = u32_at(p, 0) as usize;
    if n == 0 || n > MAX {
        return NV_ERR_INVALID_ARGUMENT;
    }
    for k in 0..n {
        let e = &mut p[8 + ENTRY * k..8 + ENTRY * (k + 1)];
        // PARTITIONID_INVALID: no MIG.
        put_u32(e, 64, u32::MAX);
        put_u32(e, 68, u32::MAX);
        if u32_at(e, 4) != 0 {
            put_u32(e, 8, NV_ERR_INVALID_ARGUMENT);
            continue;
        }
        e[16..64].fill(0);
        let pid = u32_at(e, 0);
        if pid == 0 {
            put_u32(e, 8, NV_ERR_INVALID_ARGUMENT);
            continue;
        }
        put_u64(e, 16, view.video_bytes_of(pid, gpu));
        put_u32(e, 8, NV_OK);
    }
    NV_OK
}

/// GR_GET_GLOBAL_SM_ORDER: NV2080_CTRL_GR_GET_GLOBAL_SM_ORDER_PARAMS
/// {globalSmId[512] of 12 bytes @0 (NvU16 gpcId, localTpcId, localSmId,
/// globalTpcId, virtualGpcId, migratableTpcId); NvU16 numSm@6144;
/// NvU16 numTpc@6146; grRouteInfo@6152} (`ctrl2080gr.h`), as
/// subdeviceCtrlCmdKGrGetGlobalSmOrder (`kernel_graphics.c`). Global TPC ids
/// go round-robin over the GPCs, two SMs each.
fn global_sm_order(p: &mut [u8], v: Version) -> u32 {
    let num_sm = moved::by(v, moved::SM_ORDER_NUM_SM);
    p[..num_sm].fill(0);
    let mut tpc = 0u16;
    let max_local = TPCS_PER_GPC.iter().copied().max().unwrap_or(0);
    for local in 0..max_local {
        for (gpc, &n) in TPCS_PER_GPC.iter().enumerate() {
            if local >= n {
                continue;
            }
            for sm in 0..SMS_PER_TPC {
                let i = (tpc as u32 * SMS_PER_TPC + sm) as usize;
                let o = 12 * i;
                put_u16(p, o, gpc as u16);
                put_u16(p, o + 2, local as u16);
                put_u16(p, o + 4, sm as u16);
                put_u16(p, o + 6, tpc);
                put_u16(p, o + 8, gpc as u16);
                put_u16(p, o + 10, tpc);
            }
            tpc += 1;
        }
    }
    put_u16(p, num_sm, sm_count() as u16);
    put_u16(p, num_sm + 2, tpc);
    NV_OK
}

/// TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO:
/// NV2080_CTRL_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO_PARAMS {NvU8 cpuClkId@0;
/// NvU8 sampleCount@1; samples[16]@8 of {NvU64 cpuTime; NvU64 gpuTime}}
/// (`ctrl2080tmr.h`), as subdeviceCtrlCmdTimerGetGpuCpuTimeCorrelationInfo
/// (`src/nvidia/src/kernel/gpu/subdevice/subdevice_ctrl_timer_kernel.c`):
/// more than 16 samples NV_ERR_INVALID_ARGUMENT; cpuClkId bits 7:4
/// PROCESSOR must be CPU (0; GSP, 1, is forwarded to GSP-RM: not modelled,
/// NV_ERR_NOT_SUPPORTED); bits 3:0 SOURCE OSTIME (1): `sampleCount` pairs of
/// wall-clock µs and GPU time; PLATFORM_API (3): one pair of the performance
/// counter (Linux: CLOCK_MONOTONIC_RAW ns) and GPU time; TSC (2) and others
/// NV_ERR_NOT_SUPPORTED. The simulated PTIMER is the wall clock in ns (RM
/// sets PTIMER from the OS time at boot).
fn time_correlation(p: &mut [u8]) -> u32 {
    let clk = p[0];
    let samples = p[1] as usize;
    if samples > 16 {
        return NV_ERR_INVALID_ARGUMENT;
    }
    if clk >> 4 != 0 {
        return NV_ERR_NOT_SUPPORTED;
    }
    let wall_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    };
    match clk & 0xf {
        1 => {
            for k in 0..samples {
                let ns = wall_ns();
                put_u64(p, 8 + 16 * k, ns / 1000);
                put_u64(p, 8 + 16 * k + 8, ns);
            }
            NV_OK
        }
        3 => {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes one timespec into `ts`, which lives
            // for the call.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
            let cpu = (ts.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(ts.tv_nsec as u64);
            put_u64(p, 8, cpu);
            put_u64(p, 16, wall_ns());
            NV_OK
        }
        _ => NV_ERR_NOT_SUPPORTED,
    }
}

/// BUS_GET_PCI_BAR_INFO: NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS
/// {pciBarCount@0; pciBarInfo[8]@8 of 24 bytes: flags@0, barSize@4 (MiB),
/// NvU64 barSizeBytes@8, NvU64 barOffset@16} (`ctrl2080bus.h`). BAR0 16 MiB,
/// BAR1 (64-bit, prefetchable) the power of two at or above the FB, BAR3 32 MiB;
/// bus addresses are made up per GPU.
fn pci_bar_info(cfg: &Config, gpu: u32, p: &mut [u8]) -> u32 {
    p.fill(0);
    let base = 0x2000_0000_0000u64 + u64::from(gpu) * 0x100_0000_0000;
    let bars = [
        (16u64 << 20, 0xd000_0000u64 + u64::from(gpu) * 0x200_0000),
        (bar1_bytes(cfg), base),
        (32 << 20, base + bar1_bytes(cfg)),
    ];
    put_u32(p, 0, bars.len() as u32);
    for (k, (size, off)) in bars.iter().enumerate() {
        let o = 8 + 24 * k;
        put_u32(p, o + 4, u32::try_from(size >> 20).unwrap_or(u32::MAX));
        put_u64(p, o + 8, *size);
        put_u64(p, o + 16, *off);
    }
    NV_OK
}

/// `NV2080_CTRL_CE_CAPS_*` (`ctrl2080ce.h`) of copy engine `ce_engine_type`
/// (an NV2080_ENGINE_TYPE), `None` if it is not one of COPY0..COPY9.
/// Byte 0: GRCE 0x01, SHARED 0x02, SYSMEM_READ 0x04, SYSMEM_WRITE 0x08,
/// NVLINK_P2P 0x10, SYSMEM 0x20, P2P 0x40, BL_SIZE_GT_64K_SUPPORTED 0x80;
/// byte 1: SUPPORTS_NONPIPELINED_BL 0x01, SUPPORTS_PIPELINED_BL 0x02.
/// COPY0 and COPY1 are the graphics CEs; the others are async, no NVLink.
pub fn ce_caps(ce_engine_type: u32) -> Option<[u8; 2]> {
    let i = ce_engine_type.checked_sub(engine::COPY0)?;
    if i >= NUM_CE {
        return None;
    }
    let common = 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
    let b0 = if i < 2 { common | 0x01 | 0x02 } else { common };
    Some([b0, 0x01 | 0x02])
}

/// CE_GET_CAPS (V1): NV2080_CTRL_CE_GET_CAPS_PARAMS {ceEngineType@0;
/// capsTblSize@4; NvP64 capsTbl@8} (`ctrl2080ce.h`), as
/// subdeviceCtrlCmdCeGetCaps (`src/nvidia/src/kernel/gpu/ce/kernel_ce_ctrl.c`):
/// capsTblSize must be 2 (NV_ERR_INVALID_ARGUMENT), not a CE
/// NV_ERR_NOT_SUPPORTED, the table through the pointer (embedded copy:
/// NV_ERR_INVALID_ADDRESS if it cannot be written).
fn ce_caps_v1(p: &mut [u8], mem: &dyn UserMem) -> u32 {
    if u32_at(p, 4) != 2 {
        return NV_ERR_INVALID_ARGUMENT;
    }
    let Some(c) = ce_caps(u32_at(p, 0)) else {
        return NV_ERR_NOT_SUPPORTED;
    };
    let ptr = u64_at(p, 8);
    if ptr == 0 {
        return NV_ERR_INVALID_ARGUMENT;
    }
    if mem.read(ptr, 2).is_none() || !mem.write(ptr, &c) {
        return NV_ERR_INVALID_ADDRESS;
    }
    NV_OK
}

#[cfg(test)]
mod tests {
    use super::*;
    const V535: Version = Version(535, 261, 3);
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// A fake caller address space: byte-addressed, only the mapped ranges.
    #[derive(Default)]
    struct Mem {
        bytes: RefCell<BTreeMap<u64, u8>>,
    }

    impl Mem {
        fn map(&self, addr: u64, len: usize) {
            let mut b = self.bytes.borrow_mut();
            for a in addr..addr + len as u64 {
                b.insert(a, 0xee);
            }
        }
        fn get(&self, addr: u64, len: usize) -> Vec<u8> {
            self.read(addr, len).expect("mapped")
        }
        fn put(&self, addr: u64, data: &[u8]) {
            assert!(self.write(addr, data));
        }
    }

    impl UserMem for Mem {
        fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
            let b = self.bytes.borrow();
            (addr..addr + len as u64)
                .map(|a| b.get(&a).copied())
                .collect()
        }
        fn write(&self, addr: u64, data: &[u8]) -> bool {
            let mut b = self.bytes.borrow_mut();
            if !(addr..addr + data.len() as u64).all(|a| b.contains_key(&a)) {
                return false;
            }
            for (k, v) in data.iter().enumerate() {
                b.insert(addr + k as u64, *v);
            }
            true
        }
    }

    struct FakeView {
        cfg: Config,
        objects: BTreeMap<u32, u32>,
    }

    impl FakeView {
        fn new() -> Self {
            FakeView {
                cfg: Config {
                    gpus: 2,
                    mem_per_gpu: 141 << 30,
                    driver_version: "535.261.03".into(),
                },
                objects: BTreeMap::from([
                    (0x10, 0xc661),
                    (0x11, 0x40),
                    (0x12, 0x3e),
                    (0x13, 0x50a0),
                ]),
            }
        }
    }

    impl View for FakeView {
        fn config(&self) -> &Config {
            &self.cfg
        }
        fn pids_with_class(&self, gpu: u32, class: u32) -> Vec<u32> {
            if gpu == 1 && class == 0xcbc0 {
                vec![1234, 5678]
            } else {
                vec![]
            }
        }
        fn video_bytes_of(&self, pid: u32, gpu: u32) -> u64 {
            if pid == 1234 && gpu == 1 { 6 << 20 } else { 0 }
        }
        fn free_bytes(&self, gpu: u32) -> u64 {
            self.cfg.mem_per_gpu - u64::from(gpu) * (1 << 30)
        }
        fn object_class(&self, handle: u32) -> Option<u32> {
            self.objects.get(&handle).copied()
        }
    }

    fn run(view: &FakeView, target: Target, cmd: u32, p: &mut [u8], mem: &Mem) -> u32 {
        answer(view, target, cmd, p, mem).expect("no errno")
    }

    fn buf(cmd: u32) -> Vec<u8> {
        vec![0; params_size(cmd, V535).expect("answered")]
    }

    const SUB0: Target = Target::Subdevice { gpu: 0 };
    const SUB1: Target = Target::Subdevice { gpu: 1 };
    const DEV0: Target = Target::Device { gpu: 0 };

    /// The sizes, restated from the gcc `sizeof` run over the 535.261.03
    /// headers, independently of `params_size`'s table.
    #[test]
    fn controls_sizes_match_the_535_headers() {
        let want: &[(u32, usize)] = &[
            (0x101, 40),
            (0x13e, 776),
            (0x1f0, 4),
            (0x201, 128),
            (0x202, 40),
            (0x205, 32),
            (0x214, 256),
            (0x215, 132),
            (0x216, 128),
            (0x20801230, 32),
            (0x2080182a, 104),
            (0x21b, 12),
            (0x274, 272),
            (0x275, 268),
            (0x279, 12),
            (0x27b, 4),
            (0xa04, 2244),
            (0xd01, 12),
            (0xd04, 12),
            (0x800201, 16),
            (0x800280, 4),
            (0x800288, 4),
            (0x800289, 4),
            (0x80028e, 1),
            (0x800292, 644),
            (0x800294, 4),
            (0x208001ab, 1),
            (0x208001ae, 1),
            (0x801307, 3),
            (0x801402, 3),
            (0x801713, 2),
            (0x20800101, 16),
            (0x20800102, 516),
            (0x20800110, 132),
            (0x20800111, 64),
            (0x20800119, 4),
            (0x2080012f, 984),
            (0x20800131, 4),
            (0x20800142, 4),
            (0x2080014a, 268),
            (0x20800170, 252),
            (0x2080018b, 40),
            (0x2080018d, 3812),
            (0x2080018e, 14408),
            (0x20800195, 260),
            (0x208001a3, 40),
            (0x20800406, 264),
            (0x20801201, 32),
            (0x2080121b, 6168),
            (0x20801227, 48),
            (0x20801228, 448),
            (0x2080122a, 24),
            (0x2080122b, 24),
            (0x20801301, 16),
            (0x20801303, 436),
            (0x20801315, 16),
            (0x20801701, 16),
            (0x20801702, 4),
            (0x20801801, 16),
            (0x20801802, 16),
            (0x20801803, 200),
            (0x20801823, 420),
            (0x2080200a, 8),
            (0x20802209, 4),
            (0x20802a01, 16),
            (0x20802a03, 8),
            (0x20802a0a, 68),
            (0x20803601, 72),
        ];
        for &(c, n) in want {
            assert_eq!(params_size(c, V535), Some(n), "cmd {c:#x}");
        }
        // Lists: 4 + 8 * max entries (+ route info for GR).
        assert_eq!(4 + 8 * 64, 516);
        assert_eq!(4 + 8 * 54, 436);
        assert_eq!(4 + 8 * 52, 420);
        assert_eq!(4 + 8 * 53 + 4 + 16, 448);
        assert_eq!(12 * 512 + 2 + 2 + 4 + 16, 6168);
        assert_eq!(8 + 72 * 200, 14408);
        assert_eq!(12 + 4 * 950, 3812);
        assert_eq!(4 + 140 * 16, 2244);
        assert_eq!(40 * 24 + 24, 984);
        assert!(HOPPER_CLASSES.len() <= 160);
    }

    #[test]
    fn params_sizes_follow_each_branchs_headers() {
        // (cmd, sizeof at 535.261.03 / 550.163.01 / 555.58.02 / 570.211.01 / 580.142)
        let rows: &[(u32, [usize; 5])] = &[
            (0x13e, [776, 776, 776, 1032, 1032]),
            (0x214, [256, 256, 256, 256, 384]),
            (0x0080_0289, [4, 4, 8, 8, 8]),
            (0x0080_0292, [644, 700, 404, 404, 804]),
            (0x2080_0102, [516, 524, 524, 524, 564]),
            (0x2080_012f, [984, 1024, 1224, 1464, 1464]),
            (0x2080_0170, [252, 260, 260, 340, 340]),
            (0x2080_01a3, [40, 48, 48, 48, 56]),
            (0x2080_121b, [6168, 6168, 6168, 6168, 9240]),
            (0x2080_1228, [448, 472, 472, 488, 488]),
            (0x2080_1303, [436, 444, 444, 460, 1028]),
            (0x2080_182a, [104, 104, 104, 112, 112]),
            (0x2080_2a0a, [68, 136, 136, 136, 136]),
            (0x2080_3801, [1928, 1928, 1928, 1928, 1928]),
        ];
        let tags = [
            Version(535, 261, 3),
            Version(550, 163, 1),
            Version(555, 58, 2),
            Version(570, 211, 1),
            Version(580, 142, 0),
        ];
        for &(c, sizes) in rows {
            for (v, n) in tags.iter().zip(sizes) {
                assert_eq!(params_size(c, *v), Some(n), "cmd {c:#x} at {v:?}");
            }
        }
        // 0x289 / 0x290 exist from 550 (4 bytes); 535 refuses them.
        for c in [cmd::GPU_ASYNC_ATTACH_ID, cmd::GPU_WAIT_ATTACH_ID] {
            assert_eq!(params_size(c, V535), None);
            assert_eq!(params_size(c, tags[1]), Some(4));
        }
        // The simulated class list fits the smallest branch's (555: 100).
        assert!(HOPPER_CLASSES.len() <= 100);
    }

    #[test]
    fn gr_fs_info_answers_each_query() {
        let mut p = vec![0u8; 1928];
        let queries: &[(u16, u32)] = &[(1, 0), (3, 0), (3, 7), (3, 8), (6, 0), (9, 0)];
        p[0..2].copy_from_slice(&(queries.len() as u16).to_le_bytes());
        for (k, &(q, gpc)) in queries.iter().enumerate() {
            let o = 8 + 20 * k;
            p[o..o + 2].copy_from_slice(&q.to_le_bytes());
            put_u32(&mut p, o + 8, gpc);
        }
        assert_eq!(gr_fs_info(&mut p), NV_OK);
        let at = |k: usize, off: usize| u32_at(&p, 8 + 20 * k + off);
        assert_eq!((at(0, 4), at(0, 8)), (NV_OK, 8), "GPC count");
        assert_eq!((at(1, 4), at(1, 12)), (NV_OK, 0x1ff), "GPC 0: 9 TPCs");
        assert_eq!((at(2, 4), at(2, 12)), (NV_OK, 0xff), "GPC 7: 8 TPCs");
        assert_eq!(at(3, 4), NV_ERR_INVALID_ARGUMENT, "no GPC 8");
        assert_eq!((at(4, 4), at(4, 8)), (NV_OK, 1), "one GR");
        assert_eq!(at(5, 4), NV_ERR_NOT_SUPPORTED, "a partition query");
        p[0..2].copy_from_slice(&97u16.to_le_bytes());
        assert_eq!(gr_fs_info(&mut p), NV_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn controls_unknown_and_misdirected_are_not_supported() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = vec![0u8; 64];
        assert_eq!(params_size(0x2080_3002, V535), None);
        assert_eq!(run(&v, SUB0, 0x2080_3002, &mut p, &m), NV_ERR_NOT_SUPPORTED);
        // An NV2080 control on the client, an NV0000 one on a device, any on a
        // memory object: the class's method table misses it.
        let mut p = buf(cmd::GPU_GET_GID_INFO);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_GID_INFO, &mut p, &m),
            NV_ERR_NOT_SUPPORTED
        );
        let mut p = buf(cmd::GPU_GET_PROBED_IDS);
        assert_eq!(
            run(&v, DEV0, cmd::GPU_GET_PROBED_IDS, &mut p, &m),
            NV_ERR_NOT_SUPPORTED
        );
        let other = Target::Other {
            class: 0x40,
            gpu: Some(0),
        };
        assert_eq!(
            run(&v, other, cmd::GPU_GET_PROBED_IDS, &mut p, &m),
            NV_ERR_NOT_SUPPORTED
        );
        let mut p = buf(cmd::DEV_GPU_GET_NUM_SUBDEVICES);
        assert_eq!(
            run(&v, SUB0, cmd::DEV_GPU_GET_NUM_SUBDEVICES, &mut p, &m),
            NV_ERR_NOT_SUPPORTED
        );
        assert_eq!(PARAMS_SIZE_MISMATCH, 0x1f);
        assert_eq!(NV_ERR_INVALID_PARAM_STRUCT, 0x3a);
    }

    #[test]
    fn controls_build_version_through_pointers() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::SYSTEM_GET_BUILD_VERSION);
        // First call: NULL pointers, only the size.
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYSTEM_GET_BUILD_VERSION,
                &mut p,
                &m
            ),
            NV_OK
        );
        let size = u32_at(&p, 0) as usize;
        assert_eq!(size, BUILD_TITLE.len() + 1);
        // Too small a size.
        for (k, a) in [0x1000u64, 0x2000, 0x3000].iter().enumerate() {
            m.map(*a, size);
            put_u64(&mut p, 8 + 8 * k, *a);
        }
        put_u32(&mut p, 0, 4);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYSTEM_GET_BUILD_VERSION,
                &mut p,
                &m
            ),
            NV_ERR_INVALID_PARAM_STRUCT
        );
        put_u32(&mut p, 0, size as u32);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYSTEM_GET_BUILD_VERSION,
                &mut p,
                &m
            ),
            NV_OK
        );
        assert_eq!(m.get(0x1000, 11), b"535.261.03\0");
        assert_eq!(
            &m.get(0x2000, BUILD_BRANCH_VERSION.len() + 1)[..BUILD_BRANCH_VERSION.len()],
            BUILD_BRANCH_VERSION.as_bytes()
        );
        assert_eq!(u32_at(&p, 32), BUILD_CHANGELIST);
        assert_eq!(u32_at(&p, 36), BUILD_CHANGELIST);
        // An unwritable buffer: INVALID_PARAM_STRUCT, not an errno.
        put_u64(&mut p, 24, 0x9000);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYSTEM_GET_BUILD_VERSION,
                &mut p,
                &m
            ),
            NV_ERR_INVALID_PARAM_STRUCT
        );
        // V2 inline.
        let mut p = buf(cmd::SYSTEM_GET_BUILD_VERSION_V2);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYSTEM_GET_BUILD_VERSION_V2,
                &mut p,
                &m
            ),
            NV_OK
        );
        assert_eq!(&p[..11], b"535.261.03\0");
        assert_eq!(&p[512..520], b"Official");
    }

    #[test]
    fn controls_gpu_ids() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::GPU_GET_PROBED_IDS);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_PROBED_IDS, &mut p, &m),
            NV_OK
        );
        assert_eq!(u32_at(&p, 0), 0x1800);
        assert_eq!(u32_at(&p, 4), 0x1900);
        assert_eq!(u32_at(&p, 8), INVALID_ID);
        assert_eq!(u32_at(&p, 128), INVALID_ID);
        let mut p = buf(cmd::GPU_GET_ATTACHED_IDS);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_ATTACHED_IDS, &mut p, &m),
            NV_OK
        );
        assert_eq!(
            (u32_at(&p, 0), u32_at(&p, 4), u32_at(&p, 8)),
            (0x1800, 0x1900, INVALID_ID)
        );

        let mut p = buf(cmd::GPU_ATTACH_IDS);
        put_u32(&mut p, 0, 0x1900);
        put_u32(&mut p, 4, INVALID_ID);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_ATTACH_IDS, &mut p, &m),
            NV_OK
        );
        put_u32(&mut p, 0, 0x4200);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_ATTACH_IDS, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        put_u32(&mut p, 0, ATTACH_ALL_PROBED_IDS);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_ATTACH_IDS, &mut p, &m),
            NV_OK
        );

        let mut p = buf(cmd::GPU_GET_ID_INFO_V2);
        put_u32(&mut p, 0, 0x1900);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_ID_INFO_V2, &mut p, &m),
            NV_OK
        );
        assert_eq!(u32_at(&p, 8), 1); // deviceInstance
        assert_eq!(u32_at(&p, 24), 1); // gpuInstance
        assert_eq!(u32_at(&p, 28), u32::MAX); // numaId -1
        let mut p = buf(cmd::GPU_GET_ID_INFO);
        put_u32(&mut p, 0, 0x1900);
        put_u64(&mut p, 16, 0xdead_0000);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_ID_INFO, &mut p, &m),
            NV_OK
        );
        assert_eq!(u64_at(&p, 16), 0xdead_0000); // szName untouched
        assert_eq!(u32_at(&p, 32), 1);
        put_u32(&mut p, 0, 7);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_ID_INFO, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );

        let mut p = buf(cmd::GPU_GET_PCI_INFO);
        put_u32(&mut p, 0, 0x1900);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_PCI_INFO, &mut p, &m),
            NV_OK
        );
        assert_eq!((u32_at(&p, 4), p[8], p[9]), (0, 0x19, 0));

        let mut p = buf(cmd::SYNC_GPU_BOOST_GROUP_INFO);
        p.fill(0xff);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::SYNC_GPU_BOOST_GROUP_INFO,
                &mut p,
                &m
            ),
            NV_OK
        );
        assert_eq!(u32_at(&p, 0), 0);
    }

    #[test]
    fn controls_uuids_agree() {
        let v = FakeView::new();
        let m = Mem::default();
        // Binary GID.
        let mut p = buf(cmd::GPU_GET_GID_INFO);
        put_u32(&mut p, 4, 2);
        assert_eq!(run(&v, SUB1, cmd::GPU_GET_GID_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 8), 16);
        assert_eq!(p[12..28], gpu_id::uuid(1));
        // Ascii GID: "GPU-" + 8-4-4-4-12 + NUL = 41.
        let mut p = buf(cmd::GPU_GET_GID_INFO);
        assert_eq!(run(&v, SUB1, cmd::GPU_GET_GID_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 8), 41);
        let text = std::str::from_utf8(&p[12..52]).expect("ascii").to_string();
        assert_eq!(text, format!("GPU-{}", gpu_id::uuid_text(1)));
        assert_eq!(p[52], 0);
        let dashes: Vec<usize> = text.match_indices('-').map(|(i, _)| i).collect();
        assert_eq!(dashes, [3, 12, 17, 22, 27]);
        // SHA-256 type: invalid flags.
        put_u32(&mut p, 4, 4);
        assert_eq!(
            run(&v, SUB1, cmd::GPU_GET_GID_INFO, &mut p, &m),
            NV_ERR_INVALID_FLAGS
        );

        // UUID -> GPU and back.
        let mut p = buf(cmd::GPU_GET_UUID_INFO);
        put_bytes(&mut p, 0, text.as_bytes());
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_UUID_INFO, &mut p, &m),
            NV_OK
        );
        assert_eq!((u32_at(&p, 260), u32_at(&p, 264)), (0x1900, 1));
        let mut p = buf(cmd::GPU_GET_UUID_INFO);
        put_bytes(&mut p, 0, &gpu_id::uuid(0));
        put_u32(&mut p, 256, 2);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_UUID_INFO, &mut p, &m),
            NV_OK
        );
        assert_eq!(u32_at(&p, 260), 0x1800);
        put_bytes(&mut p, 0, &[0; 16]);
        assert_eq!(
            run(&v, Target::Client, cmd::GPU_GET_UUID_INFO, &mut p, &m),
            NV_ERR_OBJECT_NOT_FOUND
        );

        let mut p = buf(cmd::GPU_GET_UUID_FROM_GPU_ID);
        put_u32(&mut p, 0, 0x1800);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::GPU_GET_UUID_FROM_GPU_ID,
                &mut p,
                &m
            ),
            NV_OK
        );
        assert_eq!(u32_at(&p, 264), 41);
        assert_eq!(&p[8..12], b"GPU-");
        put_u32(&mut p, 4, 2);
        assert_eq!(
            run(
                &v,
                Target::Client,
                cmd::GPU_GET_UUID_FROM_GPU_ID,
                &mut p,
                &m
            ),
            NV_OK
        );
        assert_eq!(u32_at(&p, 264), 16);
        assert_eq!(p[8..24], gpu_id::uuid(0));
        assert_eq!(p[24], 0);
    }

    #[test]
    fn controls_addr_space_type() {
        let v = FakeView::new();
        let m = Mem::default();
        let cases = [
            (0x10, NV_OK, addr_space::REGMEM),
            (0x11, NV_OK, addr_space::VIDMEM),
            (0x12, NV_OK, addr_space::SYSMEM),
            (0x13, NV_ERR_INVALID_ARGUMENT, 0),
            (0x99, NV_ERR_OBJECT_NOT_FOUND, 0x5a5a),
        ];
        for (h, st, t) in cases {
            let mut p = buf(cmd::CLIENT_GET_ADDR_SPACE_TYPE);
            put_u32(&mut p, 0, h);
            put_u32(&mut p, 8, 0x5a5a);
            assert_eq!(
                run(
                    &v,
                    Target::Client,
                    cmd::CLIENT_GET_ADDR_SPACE_TYPE,
                    &mut p,
                    &m
                ),
                st,
                "{h:#x}"
            );
            assert_eq!(u32_at(&p, 8), t, "{h:#x}");
        }
    }

    #[test]
    fn controls_device_classlist() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::DEV_GPU_GET_CLASSLIST_V2);
        assert_eq!(
            run(&v, DEV0, cmd::DEV_GPU_GET_CLASSLIST_V2, &mut p, &m),
            NV_OK
        );
        let n = u32_at(&p, 0) as usize;
        let classes: Vec<u32> = (0..n).map(|k| u32_at(&p, 4 + 4 * k)).collect();
        for c in [
            0x90f1, 0xa06c, 0x9067, 0xc86f, 0xcbc0, 0xc8b5, 0xc661, 0x50a0,
        ] {
            assert!(classes.contains(&c), "{c:#x}");
        }
        assert_eq!(
            classes.iter().filter(|&&c| c == 0xc8b5).count(),
            NUM_CE as usize
        );
        // V1: count first, then the list through the pointer.
        let mut p = buf(cmd::DEV_GPU_GET_CLASSLIST);
        assert_eq!(run(&v, DEV0, cmd::DEV_GPU_GET_CLASSLIST, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 0) as usize, n);
        m.map(0x5000, 4 * n);
        put_u64(&mut p, 8, 0x5000);
        assert_eq!(run(&v, DEV0, cmd::DEV_GPU_GET_CLASSLIST, &mut p, &m), NV_OK);
        let got = m.get(0x5000, 4 * n);
        assert_eq!(u32_at(&got, 0), classes[0]);
        assert_eq!(u32_at(&got, 4 * (n - 1)), classes[n - 1]);
        put_u32(&mut p, 0, 3);
        assert_eq!(
            run(&v, DEV0, cmd::DEV_GPU_GET_CLASSLIST, &mut p, &m),
            NV_ERR_INVALID_PARAM_STRUCT
        );
        put_u64(&mut p, 8, 0x9_0000);
        assert_eq!(
            run(&v, DEV0, cmd::DEV_GPU_GET_CLASSLIST, &mut p, &m),
            NV_ERR_INVALID_ADDRESS
        );

        let mut p = buf(cmd::DEV_GPU_GET_NUM_SUBDEVICES);
        assert_eq!(
            run(&v, DEV0, cmd::DEV_GPU_GET_NUM_SUBDEVICES, &mut p, &m),
            NV_OK
        );
        assert_eq!(u32_at(&p, 0), 1);
        let mut p = buf(cmd::DEV_HOST_GET_CAPS_V2);
        assert_eq!(run(&v, DEV0, cmd::DEV_HOST_GET_CAPS_V2, &mut p, &m), NV_OK);
        assert_eq!(p, [0x04, 0, 0]);
        // A device of a GPU that does not exist.
        let mut p = buf(cmd::DEV_GPU_GET_NUM_SUBDEVICES);
        assert_eq!(
            run(
                &v,
                Target::Device { gpu: 5 },
                cmd::DEV_GPU_GET_NUM_SUBDEVICES,
                &mut p,
                &m
            ),
            NV_ERR_NOT_SUPPORTED
        );
    }

    #[test]
    fn controls_arch_name_and_pci() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::MC_GET_ARCH_INFO);
        assert_eq!(run(&v, SUB0, cmd::MC_GET_ARCH_INFO, &mut p, &m), NV_OK);
        assert_eq!(
            (u32_at(&p, 0), u32_at(&p, 4), u32_at(&p, 8)),
            (0x180, 0, 0xa1)
        );

        let mut p = buf(cmd::GPU_GET_NAME_STRING);
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_NAME_STRING, &mut p, &m), NV_OK);
        assert_eq!(&p[4..16], b"NVIDIA H200\0");
        put_u32(&mut p, 0, 1);
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_NAME_STRING, &mut p, &m), NV_OK);
        assert_eq!(&p[4..10], &[b'N', 0, b'V', 0, b'I', 0]);
        assert_eq!(&p[4 + 22..4 + 24], &[0, 0]);

        let mut p = buf(cmd::BUS_GET_PCI_INFO);
        assert_eq!(run(&v, SUB1, cmd::BUS_GET_PCI_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 0), 0x2335_10de);
        assert_eq!(u32_at(&p, 4), 0x18be_10de);
        assert_eq!(u32_at(&p, 12), 0x2335);

        let mut p = buf(cmd::GPU_GET_ID);
        assert_eq!(run(&v, SUB1, cmd::GPU_GET_ID, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 0), 0x1900);
    }

    /// Builds a V2 list request of `indexes`.
    fn list_req(cmd: u32, indexes: &[u32]) -> Vec<u8> {
        let mut p = buf(cmd);
        put_u32(&mut p, 0, indexes.len() as u32);
        for (k, i) in indexes.iter().enumerate() {
            put_u32(&mut p, 4 + 8 * k, *i);
        }
        p
    }

    fn list_data(p: &[u8], k: usize) -> u32 {
        u32_at(p, 8 + 8 * k)
    }

    #[test]
    fn controls_fb_info() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = list_req(cmd::FB_GET_INFO_V2, &[8, 9, 0x16, 0x1b, 0x0b, 0x0d]);
        assert_eq!(run(&v, SUB1, cmd::FB_GET_INFO_V2, &mut p, &m), NV_OK);
        assert_eq!(list_data(&p, 0), 141 << 20); // TOTAL_RAM_SIZE in KiB
        assert_eq!(list_data(&p, 1), 141 << 20);
        assert_eq!(list_data(&p, 2), 140 << 20); // 1 GiB used on GPU 1
        assert_eq!(list_data(&p, 3), 50 << 20);
        assert_eq!(list_data(&p, 4), 6144);
        assert_eq!(list_data(&p, 5), 0x14);
        // Unknown index: data 0, INVALID_ARGUMENT; a bad count.
        let mut p = list_req(cmd::FB_GET_INFO_V2, &[0x36, 8]);
        assert_eq!(
            run(&v, SUB0, cmd::FB_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        assert_eq!(list_data(&p, 1), 141 << 20);
        let mut p = list_req(cmd::FB_GET_INFO_V2, &[]);
        assert_eq!(
            run(&v, SUB0, cmd::FB_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        put_u32(&mut p, 0, 55);
        assert_eq!(
            run(&v, SUB0, cmd::FB_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        // V1 through a pointer.
        m.map(0x7000, 16);
        m.put(0x7000, &[8, 0, 0, 0, 0, 0, 0, 0, 0x1b, 0, 0, 0, 0, 0, 0, 0]);
        let mut p = buf(cmd::FB_GET_INFO);
        put_u32(&mut p, 0, 2);
        put_u64(&mut p, 8, 0x7000);
        assert_eq!(run(&v, SUB0, cmd::FB_GET_INFO, &mut p, &m), NV_OK);
        let l = m.get(0x7000, 16);
        assert_eq!((u32_at(&l, 4), u32_at(&l, 12)), (141 << 20, 50 << 20));
        put_u64(&mut p, 8, 0x9_9000);
        assert_eq!(
            run(&v, SUB0, cmd::FB_GET_INFO, &mut p, &m),
            NV_ERR_INVALID_ADDRESS
        );
    }

    #[test]
    fn controls_gpu_gr_and_bus_info() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = list_req(cmd::GPU_GET_INFO_V2, &[0x2c, 0x1f, 0x2a]);
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_INFO_V2, &mut p, &m), NV_OK);
        assert_eq!(
            (list_data(&p, 0), list_data(&p, 1), list_data(&p, 2)),
            (0x900, 1, 2)
        );
        let mut p = list_req(cmd::GPU_GET_INFO_V2, &[0x11, 0x40, 0x2c]);
        assert_eq!(
            run(&v, SUB0, cmd::GPU_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        assert_eq!(list_data(&p, 2), 0x900);

        let mut p = list_req(cmd::GR_GET_INFO_V2, &[0x0c, 0x14, 0x20, 0x1d, 0x0d]);
        assert_eq!(run(&v, SUB0, cmd::GR_GET_INFO_V2, &mut p, &m), NV_OK);
        let got: Vec<u32> = (0..5).map(|k| list_data(&p, k)).collect();
        assert_eq!(got, [0x900, 8, 2, 132 * 128, 64]);
        let mut p = list_req(cmd::GR_GET_INFO_V2, &[0x35]);
        assert_eq!(
            run(&v, SUB0, cmd::GR_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );

        let mut p = list_req(cmd::BUS_GET_INFO_V2, &[0x0f, 0x00, 0x2c, 0x33]);
        assert_eq!(run(&v, SUB1, cmd::BUS_GET_INFO_V2, &mut p, &m), NV_OK);
        let got: Vec<u32> = (0..4).map(|k| list_data(&p, k)).collect();
        assert_eq!(got, [0x19, 3, 0, 0]);
        // getBusInfos stops at the first unknown index.
        let mut p = list_req(cmd::BUS_GET_INFO_V2, &[0x40, 0x0f]);
        put_u32(&mut p, 16, 0x77);
        assert_eq!(
            run(&v, SUB1, cmd::BUS_GET_INFO_V2, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        assert_eq!(list_data(&p, 1), 0x77);

        // GPU_GET_INFO (deprecated V1) through a pointer; a failed copy-out is
        // ignored, an unreadable list is not.
        m.map(0x8000, 8);
        m.put(0x8000, &[0x2c, 0, 0, 0, 0, 0, 0, 0]);
        let mut p = buf(cmd::GPU_GET_INFO);
        put_u32(&mut p, 0, 1);
        put_u64(&mut p, 8, 0x8000);
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&m.get(0x8000, 8), 4), 0x900);
        put_u64(&mut p, 8, 0xa_0000);
        assert_eq!(
            run(&v, SUB0, cmd::GPU_GET_INFO, &mut p, &m),
            NV_ERR_INVALID_ADDRESS
        );
        // BUS_GET_INFO (V1) with no list: NV_OK.
        let mut p = buf(cmd::BUS_GET_INFO);
        assert_eq!(run(&v, SUB0, cmd::BUS_GET_INFO, &mut p, &m), NV_OK);
    }

    #[test]
    fn controls_sm_order_and_masks() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::GR_GET_GLOBAL_SM_ORDER);
        assert_eq!(
            run(&v, SUB0, cmd::GR_GET_GLOBAL_SM_ORDER, &mut p, &m),
            NV_OK
        );
        let num_sm = crate::abi::le::u16_at(&p, 6144) as usize;
        assert_eq!(num_sm, 132);
        assert_eq!(crate::abi::le::u16_at(&p, 6146), 66);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..num_sm {
            let f = |k: usize| u32::from(crate::abi::le::u16_at(&p, 12 * i + 2 * k));
            let (gpc, local_tpc, local_sm, global_tpc) = (f(0), f(1), f(2), f(3));
            assert!(local_tpc < TPCS_PER_GPC[gpc as usize]);
            assert!(local_sm < SMS_PER_TPC);
            assert_eq!(global_tpc as usize, i / 2);
            assert!(seen.insert((gpc, local_tpc, local_sm)));
        }
        let mut p = buf(cmd::GR_GET_GPC_MASK);
        assert_eq!(run(&v, SUB0, cmd::GR_GET_GPC_MASK, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 16), 0xff);
        let mut total = 0;
        for g in 0..9 {
            let mut p = buf(cmd::GR_GET_TPC_MASK);
            put_u32(&mut p, 16, g);
            assert_eq!(run(&v, SUB0, cmd::GR_GET_TPC_MASK, &mut p, &m), NV_OK);
            total += u32_at(&p, 20).count_ones();
        }
        assert_eq!(total * SMS_PER_TPC, sm_count());
    }

    #[test]
    fn controls_pids() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::GPU_GET_PIDS);
        put_u32(&mut p, 4, 0xcbc0);
        assert_eq!(run(&v, SUB1, cmd::GPU_GET_PIDS, &mut p, &m), NV_OK);
        assert_eq!(
            (u32_at(&p, 8), u32_at(&p, 12), u32_at(&p, 16)),
            (2, 1234, 5678)
        );
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_PIDS, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 8), 0);
        put_u32(&mut p, 0, 7);
        assert_eq!(
            run(&v, SUB0, cmd::GPU_GET_PIDS, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );

        let mut p = buf(cmd::GPU_GET_PID_INFO);
        put_u32(&mut p, 0, 3);
        put_u32(&mut p, 8, 1234); // entry 0: VIDEO_MEMORY_USAGE of 1234
        put_u32(&mut p, 8 + 72 + 4, 5); // entry 1: unknown index
        put_u32(&mut p, 8 + 144, 42); // entry 2: a pid with nothing
        assert_eq!(run(&v, SUB1, cmd::GPU_GET_PID_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 8 + 8), NV_OK);
        assert_eq!(u64_at(&p, 8 + 16), 6 << 20);
        assert_eq!(u32_at(&p, 8 + 64), u32::MAX);
        assert_eq!(u32_at(&p, 8 + 72 + 8), NV_ERR_INVALID_ARGUMENT);
        assert_eq!(u32_at(&p, 8 + 144 + 8), NV_OK);
        assert_eq!(u64_at(&p, 8 + 144 + 16), 0);
        put_u32(&mut p, 0, 0);
        assert_eq!(
            run(&v, SUB1, cmd::GPU_GET_PID_INFO, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
        put_u32(&mut p, 0, 201);
        assert_eq!(
            run(&v, SUB1, cmd::GPU_GET_PID_INFO, &mut p, &m),
            NV_ERR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn controls_engines_and_ce_caps() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::GPU_GET_ENGINES_V2);
        assert_eq!(run(&v, SUB0, cmd::GPU_GET_ENGINES_V2, &mut p, &m), NV_OK);
        let n = u32_at(&p, 0) as usize;
        let list: Vec<u32> = (0..n).map(|k| u32_at(&p, 4 + 4 * k)).collect();
        assert_eq!(list[0], 1);
        for e in &list {
            if (0x09..=0x12).contains(e) {
                let mut c = buf(cmd::CE_GET_CAPS_V2);
                put_u32(&mut c, 0, *e);
                assert_eq!(run(&v, SUB0, cmd::CE_GET_CAPS_V2, &mut c, &m), NV_OK);
                assert_ne!(c[4] & 0x04, 0, "sysmem read on {e:#x}");
            }
        }
        let mut c = buf(cmd::CE_GET_CAPS_V2);
        put_u32(&mut c, 0, 1);
        assert_eq!(
            run(&v, SUB0, cmd::CE_GET_CAPS_V2, &mut c, &m),
            NV_ERR_NOT_SUPPORTED
        );
        let mut c = buf(cmd::CE_GET_ALL_CAPS);
        assert_eq!(run(&v, SUB0, cmd::CE_GET_ALL_CAPS, &mut c, &m), NV_OK);
        assert_eq!(u32_at(&c, 64), 0x3ff);
        assert_eq!(c[0] & 0x01, 0x01); // CE0 is a GRCE
        // V1 through a pointer.
        m.map(0x6000, 2);
        let mut c = buf(cmd::CE_GET_CAPS);
        put_u32(&mut c, 0, 0x0b);
        put_u32(&mut c, 4, 2);
        put_u64(&mut c, 8, 0x6000);
        assert_eq!(run(&v, SUB0, cmd::CE_GET_CAPS, &mut c, &m), NV_OK);
        assert_eq!(m.get(0x6000, 2), ce_caps(0x0b).expect("CE2").to_vec());
        put_u32(&mut c, 4, 3);
        assert_eq!(
            run(&v, SUB0, cmd::CE_GET_CAPS, &mut c, &m),
            NV_ERR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn controls_small_answers() {
        let v = FakeView::new();
        let m = Mem::default();
        let mut p = buf(cmd::GSP_GET_FEATURES);
        assert_eq!(run(&v, SUB0, cmd::GSP_GET_FEATURES, &mut p, &m), NV_OK);
        assert_eq!((p[4], p[5]), (1, 1));
        assert_eq!(&p[6..17], b"535.261.03\0");
        let mut p = buf(cmd::GPU_QUERY_ECC_STATUS);
        p.fill(0xff);
        assert_eq!(run(&v, SUB0, cmd::GPU_QUERY_ECC_STATUS, &mut p, &m), NV_OK);
        assert!((0..24).all(|u| p[40 * u + 2] == 0 && p[40 * u] == 0));
        let mut p = buf(cmd::GPU_GET_ACTIVE_PARTITION_IDS);
        assert_eq!(
            run(&v, SUB0, cmd::GPU_GET_ACTIVE_PARTITION_IDS, &mut p, &m),
            NV_ERR_NOT_SUPPORTED
        );
        let mut p = buf(cmd::GR_GET_CAPS_V2);
        assert_eq!(run(&v, SUB0, cmd::GR_GET_CAPS_V2, &mut p, &m), NV_OK);
        assert_eq!(p[40], 1);
        let mut p = buf(cmd::BUS_GET_PCI_BAR_INFO);
        assert_eq!(run(&v, SUB0, cmd::BUS_GET_PCI_BAR_INFO, &mut p, &m), NV_OK);
        assert_eq!(u32_at(&p, 0), 3);
        assert_eq!(u64_at(&p, 8 + 24 + 8), 256 << 30); // BAR1 for 141 GiB
        let mut p = buf(cmd::GPU_GET_COMPUTE_POLICY_CONFIG);
        assert_eq!(
            run(&v, SUB0, cmd::GPU_GET_COMPUTE_POLICY_CONFIG, &mut p, &m),
            NV_OK
        );
        assert_eq!(u32_at(&p, 0), 1);
        let mut p = buf(cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO);
        p[0] = 1;
        p[1] = 5;
        assert_eq!(
            run(
                &v,
                SUB0,
                cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO,
                &mut p,
                &m
            ),
            NV_OK
        );
        for k in 0..5 {
            let (cpu_us, gpu_ns) = (u64_at(&p, 8 + 16 * k), u64_at(&p, 16 + 16 * k));
            assert!(cpu_us > 1_600_000_000_000_000 && gpu_ns / 1000 >= cpu_us);
        }
        assert_eq!(u64_at(&p, 8 + 16 * 5), 0);
        p[1] = 17;
        assert_eq!(
            run(
                &v,
                SUB0,
                cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO,
                &mut p,
                &m
            ),
            NV_ERR_INVALID_ARGUMENT
        );
        p[1] = 1;
        p[0] = 0x11;
        assert_eq!(
            run(
                &v,
                SUB0,
                cmd::TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO,
                &mut p,
                &m
            ),
            NV_ERR_NOT_SUPPORTED
        );
        let mut p = buf(cmd::GET_GPU_FABRIC_PROBE_INFO);
        p[0] = 3;
        assert_eq!(
            run(&v, SUB0, cmd::GET_GPU_FABRIC_PROBE_INFO, &mut p, &m),
            NV_OK
        );
        assert_eq!(p[0], 0);
    }
}
