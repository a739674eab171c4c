//! GPU tracing: the events, map keys and map values the NVIDIA probes share with the
//! agent.
//!
//! How exact accounting works (the kernel side keeps it; the agent only reads it):
//! - `PROC_FDS[pid]` lists the process's open NVIDIA fds, each naming a `file_id`
//!   (one per open file description, shared through dup and fork). `FILES[file_id]`
//!   counts the fd slots that refer to it in tracked processes: when that reaches
//!   zero the open file is released, and the driver frees every client created on it.
//! - `CLIENTS[hClient]` records the file a client belongs to and, per contributing
//!   (pid, device), the bytes that client holds; freeing the client or releasing its
//!   file subtracts exactly those, with no iteration over objects.
//! - `OBJECTS[(hClient, handle)]` holds each object's class, parent, GPU, owner pid and
//!   size, so a free subtracts exactly what was allocated.
//! - `TOTALS[(pid, gpu)]` holds bytes now and peak, allocation and free counts; `gpu`
//!   [`ALL_GPUS`] is the process total and pid 0 the device total.
//!
//! These maps are updated at syscall exit, from what the driver returned, so they
//! stay exact when the ring buffer drops detail events.
use crate::EventHeader;

/// `gpu` of a process-wide total in `TOTALS`.
pub const ALL_GPUS: u32 = u32::MAX;
/// `gpu` when it is not known.
pub const NO_GPU: u32 = u32::MAX - 1;

/// Which device file an fd refers to (`FdSlot.device`).
pub mod device_file {
    /// `nvidiaN` is N (0..=247).
    pub const CTL: u32 = 255;
    pub const UVM: u32 = 256;
    pub const NONE: u32 = u32::MAX;
}

/// Most NVIDIA fds tracked per process.
pub const FD_SLOTS: usize = 16;
/// Most clients tracked per open file.
pub const FILE_CLIENTS: usize = 8;
/// Most (pid, device, gpu) contributors tracked per client.
pub const CLIENT_CONTRIBUTORS: usize = 16;
/// Open NVIDIA files tracked at once (`FILES`).
pub const MAX_FILES: u32 = 65536;
/// RM clients tracked at once (`CLIENTS`).
pub const MAX_CLIENTS: u32 = 65536;
/// RM objects tracked at once (`OBJECTS`).
pub const MAX_OBJECTS: u32 = 262_144;
/// (pid, GPU) totals kept at once (`TOTALS`).
pub const MAX_TOTALS: u32 = 65536;
/// Syscalls in flight between sys_enter and sys_exit, one per thread, per kind.
pub const MAX_PENDING: u32 = 16384;
/// Length of the device-path prefix in [`crate::ProbeConfig`].
pub const DEV_PREFIX_LEN: usize = 64;

pub const MAP_PROC_FDS: &str = "PROC_FDS";
pub const MAP_FILES: &str = "FILES";
pub const MAP_CLIENTS: &str = "CLIENTS";
pub const MAP_OBJECTS: &str = "OBJECTS";
pub const MAP_TOTALS: &str = "TOTALS";
pub const MAP_UNDECODED: &str = "UNDECODED";
pub const MAP_UNDECODED_PID: &str = "UNDECODED_PID";

/// Why an ioctl (or part of the accounting) could not be decoded with certainty.
/// Index into the per-CPU `UNDECODED` array; `UNDECODED_PID` sums them per process.
pub mod undecoded {
    /// Params were FINN-serialized (NVOS64 flags & 1, NVOS54 flags & 4).
    pub const FINN_SERIALIZED: u32 = 0;
    /// An RM escape with a size that matches no known layout.
    pub const UNKNOWN_LAYOUT: u32 = 1;
    /// A user pointer could not be read (bad pointer, unmapped page).
    pub const FAULT: u32 = 2;
    /// An escape Keling does not decode.
    pub const UNKNOWN_ESCAPE: u32 = 3;
    /// A per-process, per-file or per-client table was full.
    pub const TABLE_FULL: u32 = 4;
    /// A free or teardown named an object or client Keling never saw.
    pub const UNKNOWN_OBJECT: u32 = 5;
    pub const COUNT: u32 = 6;
    pub const NAMES: [&str; COUNT as usize] = [
        "finn_serialized",
        "unknown_layout",
        "fault",
        "unknown_escape",
        "table_full",
        "unknown_object",
    ];
}

/// One open NVIDIA fd of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdSlot {
    /// The fd number.
    pub fd: i32,
    /// A [`device_file`] value.
    pub device: u32,
    /// The open file description; 0 when the slot is free (ids are never 0).
    pub file_id: u64,
    /// 1 when the fd has FD_CLOEXEC (closed by exec).
    pub cloexec: u32,
    pub _reserved: u32,
}

/// Value of `PROC_FDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcFds {
    pub slots: [FdSlot; FD_SLOTS],
}

/// Value of `FILES`: one open file description of an NVIDIA device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileInfo {
    /// fd slots in tracked processes that refer to this file.
    pub refs: u32,
    pub device: u32,
    /// The process that opened it.
    pub opener_pid: u32,
    pub _reserved: u32,
    /// Clients created through this file (0 = free slot).
    pub clients: [u32; FILE_CLIENTS],
}

/// Bytes one process holds under one device of one client, on one GPU (host memory
/// allocated through `nvidiaN` counts on N, whatever device it hangs under).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contributor {
    /// 0 when the slot is free.
    pub pid: u32,
    pub gpu: u32,
    /// Device object handle the memory hangs under.
    pub device: u32,
    /// Memory objects counted here.
    pub objects: u32,
    pub bytes: u64,
    pub host_bytes: u64,
}

/// Value of `CLIENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    pub file_id: u64,
    pub creator_pid: u32,
    /// Generation: objects recorded under an older client with the same handle are
    /// stale and ignored.
    pub gen_: u32,
    pub contributors: [Contributor; CLIENT_CONTRIBUTORS],
}

/// Key of `OBJECTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub client: u32,
    pub handle: u32,
}

/// Value of `OBJECTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectInfo {
    pub class: u32,
    /// An [`crate::nvidia::ObjectKind`] as `u32`.
    pub kind: u32,
    pub parent: u32,
    /// The device object this object is under (itself for a device).
    pub device: u32,
    pub gpu: u32,
    pub owner_pid: u32,
    /// The client's generation when this object was made.
    pub client_gen: u32,
    pub _reserved: u32,
    pub bytes: u64,
}

/// Key of `TOTALS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TotalKey {
    /// 0: the device total across processes.
    pub pid: u32,
    /// [`ALL_GPUS`]: the process total across devices.
    pub gpu: u32,
}

/// Value of `TOTALS`. Updated with atomic adds; `peak_*` with compare-and-swap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub peak_host_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

/// Open, close or dup of an NVIDIA fd ([`crate::EventKind::GpuOpen`] etc.).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFileEvent {
    pub header: EventHeader,
    pub fd: i32,
    pub device: u32,
    pub file_id: u64,
    /// Close: 1 when this was the last reference and the file was released.
    pub released: u32,
    /// Open: 1 when opened with O_CLOEXEC; dup: the source fd.
    pub arg: u32,
}

/// Allocation, free, object creation, client teardown or another decoded ioctl.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub class: u32,
    /// An [`crate::nvidia::ObjectKind`] as `u32`.
    pub kind: u32,
    pub gpu: u32,
    /// Video-memory bytes allocated or freed.
    pub bytes: u64,
    /// Host-memory bytes (teardown only).
    pub host_bytes: u64,
    /// Who allocated what is freed (free, teardown).
    pub owner_pid: u32,
    /// RM escape number, or the UVM command.
    pub escape: u32,
    /// The raw ioctl command.
    pub cmd: u32,
    /// RM_CONTROL's command, or the objects count of a teardown.
    pub control_cmd: u32,
    /// RM status the driver returned (0 = success).
    pub status: u32,
    pub fd: i32,
    /// ioctl(2)'s return value.
    pub ret: i64,
    /// Teardown: [`teardown`] reason. Other ioctls: 1 + an [`undecoded`] reason
    /// when it was not decoded, else 0.
    pub reason: u32,
    /// 1 when the call came through XFER_CMD.
    pub via_xfer: u32,
}

/// Why a client's memory was freed all at once.
pub mod teardown {
    pub const CLIENT_FREED: u32 = 1;
    pub const FILE_RELEASED: u32 = 2;
    pub const DEVICE_FREED: u32 = 3;
}
