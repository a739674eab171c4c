//! GPU tracing: the events, map keys and map values the NVIDIA probes share with the
//! agent.
//!
//! How exact accounting works (the kernel side keeps it; the agent only reads it;
//! the rules are in docs/gpu-accounting.md):
//! - An NVIDIA file is known by the file behind an fd, never by a path: the inode's
//!   device number (major 195, or the `nvidia-uvm` major) or, for the simulated
//!   driver, its (filesystem device, inode number) listed in `SIM_FILES` by the
//!   agent. The open file itself (the kernel's `struct file`, whose address is the
//!   `file_id`) is the identity of the clients created through it.
//! - `PROC_FDS[pid]` lists the process's NVIDIA fds that Keling knows (learned at
//!   open, dup, fork, receipt over a unix socket, pidfd_getfd, first ioctl, or from
//!   `/proc` at start), so that closes, exec and exit can be judged. A file is
//!   released when the last reference goes: at each place a reference is dropped
//!   the probes read the kernel's own reference count of the file, so references
//!   Keling does not know (another process's fd, a message in flight) keep the file
//!   open exactly as they keep it open in the kernel.
//! - `CLIENTS[hClient]` records the open file a client belongs to, the memories it
//!   shares with other clients, and, per contributing (pid, device, subdevice, GPU),
//!   the bytes charged to handles of that client; freeing the client or releasing
//!   its file subtracts exactly those, with no iteration over objects.
//! - `OBJECTS[(hClient, handle)]` holds each object's class, parent, device,
//!   subdevice, GPU, creator and, for memory, the memory it refers to in `MEMS`.
//! - `MEMS[mem_id]` is one memory: its bytes and kind, every handle that refers to
//!   it (dups, imports), references held by export files, and which handle (and so
//!   which process) is charged.
//! - `TOTALS[(pid, gpu)]` holds bytes now and peak, allocation and free counts, and
//!   the driver's own per-process figure; `gpu` [`ALL_GPUS`] is the process total and
//!   pid 0 the device total.
//!
//! - `CALL_COUNTS[call_key(kind, number)]` counts the calls the followed processes
//!   made, by RM escape, UVM command and RM_CONTROL command (see [`call_kind`]), at
//!   sys_enter: what was sent, whatever the driver then answered.
//!
//! These maps are updated in the kernel (the accounting at syscall exit, from what
//! the driver returned), so they stay exact when the ring buffer drops detail events.
use crate::EventHeader;

/// `gpu` of a process-wide total in `TOTALS`.
pub const ALL_GPUS: u32 = u32::MAX;
/// `gpu` when it is not known.
pub const NO_GPU: u32 = u32::MAX - 1;

/// Which device file an fd refers to (`FdSlot.device`, events).
pub mod device_file {
    /// `nvidiaN` is N (0..=247).
    pub const MAX_GPU: u32 = 247;
    pub const CTL: u32 = 255;
    pub const UVM: u32 = 256;
    pub const NONE: u32 = u32::MAX;

    /// Which NVIDIA device file, as a type; it prints as the file is named under
    /// `/dev`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum DeviceFile {
        /// `nvidiactl`.
        Ctl,
        /// `nvidiaN`.
        Gpu(u32),
        /// `nvidia-uvm`.
        Uvm,
    }

    impl DeviceFile {
        /// The file of `code`; `None` for a number that names no file ([`NONE`]
        /// among them).
        pub const fn from_raw(code: u32) -> Option<Self> {
            match code {
                CTL => Some(Self::Ctl),
                UVM => Some(Self::Uvm),
                n if n <= MAX_GPU => Some(Self::Gpu(n)),
                _ => None,
            }
        }

        /// The number on the wire.
        pub const fn code(self) -> u32 {
            match self {
                Self::Ctl => CTL,
                Self::Uvm => UVM,
                Self::Gpu(n) => n,
            }
        }

        /// The GPU of an `nvidiaN` file.
        pub const fn gpu(self) -> Option<u32> {
            match self {
                Self::Gpu(n) => Some(n),
                _ => None,
            }
        }
    }

    impl core::fmt::Display for DeviceFile {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            match self {
                Self::Ctl => f.write_str("nvidiactl"),
                Self::Uvm => f.write_str("nvidia-uvm"),
                Self::Gpu(n) => write!(f, "nvidia{n}"),
            }
        }
    }
}

/// NVIDIA fds tracked per process in its own table (`PROC_FDS`). NVIDIA's libcuda
/// 535 holds 3 + 3 per GPU after cuInit and the device queries (nvidiactl, 2
/// nvidia-uvm, 3 of each nvidiaN: 27 with 8 GPUs, measured with
/// `keling-cuda-probe` in `keling-nvsim sandbox`, docs/gpu-accounting.md), and
/// a context opens more. Fds past the table are not lost: their files are watched
/// host-wide by the orphan sweep (`ORPHAN_SLOTS`), so the books stay exact; the
/// table only makes the common case cheap (a slot is judged at the close itself).
pub const FD_SLOTS: usize = 32;
/// Most clients tracked per open file.
pub const FILE_CLIENTS: usize = 8;
/// Most objects an export file holds (positions 0..FILE_EXPORTS).
pub const FILE_EXPORTS: usize = 8;
/// Most (pid, device, subdevice, gpu) contributors tracked per client.
pub const CLIENT_CONTRIBUTORS: usize = 16;
/// Most handles referring to one memory.
pub const MEM_HANDLES: usize = 8;
/// Most objects decoded from one batch export or import control.
pub const BATCH_OBJECTS: usize = 8;
/// Simulated-driver files the agent can list.
pub const MAX_SIM_FILES: u32 = 256;
/// Slots of the orphaned-file sweep's working set (`ORPHANS`): files whose last
/// known fd went while the kernel still counted references Keling does not know
/// of, and files past a process's fd table, re-checked until released. Any number
/// more wait their turn in `ORPHAN_BACKLOG` (up to [`MAX_FILES`]).
pub const ORPHAN_SLOTS: u32 = 64;
/// Open NVIDIA files tracked at once (`FILES`).
pub const MAX_FILES: u32 = 65536;
/// RM clients tracked at once (`CLIENTS`).
pub const MAX_CLIENTS: u32 = 65536;
/// RM objects tracked at once (`OBJECTS`).
pub const MAX_OBJECTS: u32 = 262_144;
/// Memories tracked at once (`MEMS`).
pub const MAX_MEMS: u32 = 262_144;
/// (pid, GPU) totals kept at once (`TOTALS`).
pub const MAX_TOTALS: u32 = 65536;
/// Syscalls in flight between sys_enter and sys_exit, one per thread, per kind.
pub const MAX_PENDING: u32 = 16384;

/// Distinct (kind, number) pairs `CALL_COUNTS` holds; calls of a pair that finds it
/// full are counted in `CALLS_UNCOUNTED` instead.
pub const MAX_CALL_KEYS: u32 = 8192;

pub const MAP_PROC_FDS: &str = "PROC_FDS";
pub const MAP_FILES: &str = "FILES";
pub const MAP_CLIENTS: &str = "CLIENTS";
pub const MAP_OBJECTS: &str = "OBJECTS";
pub const MAP_MEMS: &str = "MEMS";
pub const MAP_TOTALS: &str = "TOTALS";
pub const MAP_UNDECODED: &str = "UNDECODED";
pub const MAP_TABLE_FULL_AT: &str = "TABLE_FULL_AT";
pub const MAP_UNDECODED_PID: &str = "UNDECODED_PID";
pub const MAP_TABLE_FULL_PID: &str = "TABLE_FULL_PID";
/// Processes whose `TABLE_FULL_PID` row was just created, for the agent to pop
/// (a queue: it reads only what changed); `UNSURE_LOST[0]` counts those that
/// found it full (the agent then reads the whole map once).
pub const MAP_UNSURE_NEW: &str = "UNSURE_NEW";
pub const MAP_UNSURE_LOST: &str = "UNSURE_LOST";
pub const MAP_SIM_FILES: &str = "SIM_FILES";
pub const MAP_ORPHAN_SWEEP: &str = "ORPHAN_SWEEP";
pub const MAP_CALL_COUNTS: &str = "CALL_COUNTS";
pub const MAP_CALLS_UNCOUNTED: &str = "CALLS_UNCOUNTED";

/// What a key of `CALL_COUNTS` counts: the kind in the key's high 32 bits, the
/// number in the low 32 ([`call_key`]). Counted at sys_enter for followed processes:
/// each ioctl once as its escape (an XFER_CMD as the escape it carries, as the
/// driver runs it; as XFER_CMD only when its own 16 bytes are unreadable or
/// mis-sized) or UVM command, and each RM_CONTROL once more by its command.
pub mod call_kind {
    /// An RM escape on nvidiactl / nvidiaN, by `nr`.
    pub const RM_ESCAPE: u32 = 1;
    /// A command on nvidia-uvm, by its number (whatever its shape).
    pub const UVM: u32 = 2;
    /// An RM_CONTROL, by its command (`NVOS54.cmd`). An RM_CONTROL whose NVOS54
    /// could not be read (wrong size, bad pointer) has none: it is counted as an
    /// escape and as undecoded only.
    pub const RM_CONTROL: u32 = 3;
    /// An ioctl on nvidiactl / nvidiaN that is no RM escape (`_IOC_TYPE` not 'F'),
    /// by its whole command.
    pub const NOT_RM: u32 = 4;
}

/// The `CALL_COUNTS` key of a call.
pub const fn call_key(kind: u32, number: u32) -> u64 {
    ((kind as u64) << 32) | number as u64
}

/// A `CALL_COUNTS` key's (kind, number).
pub const fn split_call_key(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

code_set! {
    /// Why an ioctl (or part of the accounting) could not be decoded with certainty.
    /// Index into the per-CPU `UNDECODED` array; `UNDECODED_PID` sums them per process.
    pub mod undecoded, enum UndecodedReason {
        /// Params were FINN-serialized (NVOS64 flags & 1, NVOS54 flags & 4).
        FINN_SERIALIZED = 0, FinnSerialized, "finn_serialized";
        /// An RM escape with a size that matches no known layout.
        UNKNOWN_LAYOUT = 1, UnknownLayout, "unknown_layout";
        /// A user pointer could not be read (bad pointer, unmapped page).
        FAULT = 2, Fault, "fault";
        /// An escape Keling does not decode.
        UNKNOWN_ESCAPE = 3, UnknownEscape, "unknown_escape";
        /// A per-process, per-file, per-client or per-memory table was full.
        TABLE_FULL = 4, TableFull, "table_full";
        /// A free or teardown named an object or client Keling never saw.
        UNKNOWN_OBJECT = 5, UnknownObject, "unknown_object";
    }
    indexed_by_code!(UndecodedReason);
}

code_set! {
    /// Which table was full when `undecoded::TABLE_FULL` was counted. Index into the
    /// per-CPU `TABLE_FULL_AT` array (all processes together): the per-process count
    /// says who, this says where.
    pub mod table_full, enum TableFull {
        /// A process's NVIDIA fd table (`FD_SLOTS`).
        FD_TABLE = 0, FdTable, "fd_table";
        /// The orphaned files watched (`MAX_FILES`: the slots and their backlog).
        ORPHANS = 1, Orphans, "orphans";
        /// A CPU's queue of deferred work.
        WORK_QUEUE = 2, WorkQueue, "work_queue";
        /// An open file's clients.
        FILE_CLIENTS = 3, FileClients, "file_clients";
        /// A client's (process, device, GPU) contributors.
        CONTRIBUTORS = 4, Contributors, "contributors";
        /// The map of shared memories.
        MEMS = 5, Mems, "mems";
        /// A shared memory's handles.
        MEM_HANDLES = 6, MemHandles, "mem_handles";
        /// An export file's objects.
        EXPORTS = 7, Exports, "exports";
        /// A batch import/export beyond the objects decoded.
        BATCH = 8, Batch, "batch";
        /// A call's own decoding (object, client or scratch tables, a failed tail call).
        CALL = 9, Call, "call";
    }
    indexed_by_code!(TableFull);
}

code_set! {
    /// What kind of bytes a memory holds.
    pub mod mem_kind, enum MemKind {
        /// Video memory of a GPU: quotas and memory pressure count only this.
        VIDEO = 1, Video, "video";
        /// Pinned host memory.
        HOST = 2, Host, "host";
        /// Extended GPU memory (EGM, Grace Hopper).
        EGM = 3, Egm, "egm";
    }

    use crate::nvidia::ObjectKind;

    impl MemKind {
        /// The object kind that holds memory of this kind.
        pub const fn object_kind(self) -> ObjectKind {
            match self {
                Self::Video => ObjectKind::VideoMemory,
                Self::Host => ObjectKind::HostMemory,
                Self::Egm => ObjectKind::ExtendedMemory,
            }
        }
    }
}

/// One open NVIDIA fd of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdSlot {
    /// The fd number.
    pub fd: i32,
    /// A [`device_file`] value.
    pub device: u32,
    /// The open file (`struct file` address); 0 when the slot is free. The agent
    /// fills slots for fds opened before it started with [`FILE_UNRESOLVED`]: the
    /// probes resolve them from the fd table when they next meet the fd.
    pub file_id: u64,
}

/// `FdSlot.file_id` of a slot whose open file is not known yet.
pub const FILE_UNRESOLVED: u64 = u64::MAX;

/// Value of `PROC_FDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcFds {
    pub slots: [FdSlot; FD_SLOTS],
}

/// Value of `FILES`: one open file of an NVIDIA device that holds clients or exported
/// objects.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileInfo {
    pub device: u32,
    /// The process that first used it.
    pub opener_pid: u32,
    /// Clients created through this file (0 = free slot).
    pub clients: [u32; FILE_CLIENTS],
    /// Memories exported to this file, by position (0 = none).
    pub exports: [u64; FILE_EXPORTS],
    /// Generation, never 0: a later file at the same address (a `struct file` freed
    /// and reused) has another. A client names its file by address and this
    /// generation's low 32 bits (`ClientInfo.file_gen`).
    pub gen_: u64,
}

/// Bytes charged to handles of one client that lie under one device (and
/// subdevice), held by one process, on one GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contributor {
    /// 0 when the slot is free.
    pub pid: u32,
    pub gpu: u32,
    /// Device object handle the memory hangs under.
    pub device: u32,
    /// Subdevice handle the memory hangs under, 0 when directly under the device.
    pub sub: u32,
    /// Memory objects counted here.
    pub objects: u32,
    pub _reserved: u32,
    pub bytes: u64,
    pub host_bytes: u64,
    pub egm_bytes: u64,
}

/// Value of `CLIENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    pub file_id: u64,
    /// The process whose ioctl created the client (the driver's per-process figure
    /// bills memory to it).
    pub creator_pid: u32,
    /// Generation: objects recorded under an older client with the same handle are
    /// stale and ignored.
    pub gen_: u32,
    /// The first of this client's objects whose memory is shared (a list linked
    /// through `ObjectInfo.shared_next`); 0 when none.
    pub shared_head: u32,
    /// The low 32 bits of its file's `FileInfo.gen_` when it was listed on it
    /// (0: not yet): whether the file it was made on is still open, for a client
    /// the file's table had no room for (its release cannot tear it down).
    pub file_gen: u32,
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
    /// The subdevice it is under (itself for a subdevice), 0 when none.
    pub sub: u32,
    pub gpu: u32,
    /// The process whose ioctl created this handle.
    pub owner_pid: u32,
    /// The client's generation when this object was made.
    pub client_gen: u32,
    /// The shared memory in `MEMS`, once the object has been duplicated, imported or
    /// exported; 0 before (its bytes are then `bytes`, charged to `owner_pid`).
    pub mem_id: u64,
    /// Memory: its bytes while it is not shared.
    pub bytes: u64,
    /// Memory: a [`mem_kind`] value; 0 for objects that hold no bytes.
    pub mem_kind: u32,
    /// 1 while the object is on its client's list of shared-memory handles.
    pub in_shared_list: u32,
    /// Neighbours on that list (handles; 0 at the ends).
    pub shared_prev: u32,
    pub shared_next: u32,
}

/// One handle of a memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemHandle {
    /// 0 when the slot is free.
    pub client: u32,
    pub handle: u32,
    pub device: u32,
    pub sub: u32,
    /// The process whose ioctl created the handle.
    pub pid: u32,
    /// Creation order among the memory's handles (the oldest survivor is charged).
    pub seq: u32,
}

/// `MemInfo.charged` when no handle is charged (only export files hold the memory).
pub const NO_HANDLE: u32 = u32::MAX;

/// Value of `MEMS`: one memory and everything that refers to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub bytes: u64,
    /// A [`mem_kind`] value.
    pub kind: u32,
    pub gpu: u32,
    /// References held by export files.
    pub export_refs: u32,
    /// The process charged with the bytes.
    pub charged_pid: u32,
    /// Index into `handles` of the charged handle, or [`NO_HANDLE`].
    pub charged: u32,
    /// The next `seq`.
    pub next_seq: u32,
    pub handles: [MemHandle; MEM_HANDLES],
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
    /// Video memory charged to the process (the per-caller figure).
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub peak_host_bytes: u64,
    pub egm_bytes: u64,
    /// Video memory of the process's own clients' charged handles: the driver's
    /// per-process figure (what NVML's `usedGpuMemory` reports).
    pub driver_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

/// A slot of `ORPHANS`: an open NVIDIA file with clients whose last fd Keling knew
/// of went while the kernel still counted other references (a process outside the
/// trace, an fd Keling never saw, a call in flight in another thread). The sweep
/// releases it once the kernel's count reads 0 or the `struct file` is another
/// file's (its inode changed). Empty when `file` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrphanSlot {
    pub file: u64,
    /// The file's `struct inode` address when it became an orphan.
    pub inode: u64,
}

/// `ORPHAN_SWEEP[0]`: where the sweep of `ORPHANS` stands. The sweep checks slot
/// `checked % ORPHAN_SLOTS` and adds one to `checked`; a slot whose orphan is still
/// held hands it to the back of the backlog and takes the one in front, so a
/// reader that sees `checked` grow by [`OrphanSweep::full_round`] knows every
/// orphan was checked after it looked. `occupied`: orphans watched, in slots and
/// in the backlog (the sweep runs only while some are); `backlog`: those waiting
/// for a slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrphanSweep {
    pub checked: u64,
    pub occupied: u64,
    pub backlog: u64,
}

impl OrphanSweep {
    /// Checks after which every orphan watched now has been checked at least once
    /// more: two rounds of the slots, each taking up to one backlog entry, and one
    /// round more for those taken last.
    pub fn full_round(&self) -> u64 {
        2 * self.occupied.max(u64::from(ORPHAN_SLOTS)) + u64::from(ORPHAN_SLOTS)
    }
}

/// Key of `SIM_FILES`: a simulated-driver file's identity.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SimFileKey {
    /// The filesystem's device number, kernel encoding (`MAJOR << 20 | MINOR`).
    pub dev: u32,
    pub _reserved: u32,
    pub ino: u64,
}

code_set! {
    /// How a process came to have an NVIDIA fd ([`GpuOpenEvent::how`]).
    pub mod open_how, enum OpenHowCode {
        /// An open syscall (any of them, any path).
        OPEN = 1, Open, "open";
        /// dup, dup2, dup3, fcntl(F_DUPFD*) of another fd.
        DUP = 2, Dup, "dup";
        /// Received over a unix socket (SCM_RIGHTS) or taken with pidfd_getfd.
        RECEIVED = 3, Received, "received";
        /// First seen at an ioctl (inherited from before Keling, or another way).
        FIRST_USE = 4, FirstUse, "first_use";
    }
}

/// A process has an NVIDIA fd ([`crate::EventKind::GpuOpen`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuOpenEvent {
    pub header: EventHeader,
    pub fd: i32,
    /// A [`device_file`] value.
    pub device: u32,
    pub file_id: u64,
    /// An [`open_how`] value.
    pub how: u32,
    /// The fd it was duplicated from (`how` DUP), else -1.
    pub src_fd: i32,
}

/// A process closed an NVIDIA fd (close, close_range, dup2 onto it, exec, exit).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuCloseEvent {
    pub header: EventHeader,
    pub fd: i32,
    pub device: u32,
    pub file_id: u64,
    /// 1 when this dropped the file's last reference: the driver released it.
    pub released: u32,
    pub _reserved: u32,
}

/// A memory object the driver allocated ([`crate::EventKind::GpuAlloc`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuAllocEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub class: u32,
    /// A [`mem_kind`] value.
    pub mem_kind: u32,
    pub gpu: u32,
    /// The RM escape that allocated it.
    pub escape: u32,
    /// 1 when the call came through XFER_CMD.
    pub via_xfer: u32,
    pub bytes: u64,
}

/// A handle freed ([`crate::EventKind::GpuFree`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFreeEvent {
    pub header: EventHeader,
    pub client: u32,
    pub handle: u32,
    pub class: u32,
    /// An [`crate::nvidia::ObjectKind`] value.
    pub kind: u32,
    pub gpu: u32,
    /// A [`mem_kind`] value for memory, else 0.
    pub mem_kind: u32,
    /// The process whose charge was freed (0 when nothing was freed).
    pub freed_pid: u32,
    pub escape: u32,
    /// Bytes given back to the driver (0 when other references keep the memory).
    pub bytes: u64,
}

/// A non-memory object created ([`crate::EventKind::GpuObject`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuObjectEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub class: u32,
    /// An [`crate::nvidia::ObjectKind`] value.
    pub kind: u32,
    pub gpu: u32,
}

code_set! {
    /// Why memory was freed all at once ([`GpuTeardownEvent::reason`]).
    pub mod teardown, enum TeardownReason {
        CLIENT_FREED = 1, ClientFreed, "client_freed";
        FILE_RELEASED = 2, FileReleased, "file_released";
        DEVICE_FREED = 3, DeviceFreed, "device_freed";
        SUBDEVICE_FREED = 4, SubdeviceFreed, "subdevice_freed";
    }
}

/// One contributor of a client freed all at once ([`crate::EventKind::GpuTeardown`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTeardownEvent {
    pub header: EventHeader,
    pub client: u32,
    /// A [`teardown`] value.
    pub reason: u32,
    /// The process whose charge was freed.
    pub owner_pid: u32,
    pub gpu: u32,
    /// The device (and subdevice) the memory hung under.
    pub device: u32,
    pub sub: u32,
    pub objects: u32,
    pub _reserved: u32,
    pub bytes: u64,
    pub host_bytes: u64,
    pub egm_bytes: u64,
}

code_set! {
    /// How a new handle to existing memory came to be ([`GpuRefEvent::how`]).
    pub mod ref_how, enum RefHowCode {
        /// RM_DUP_OBJECT.
        DUP = 1, Dup, "dup";
        /// An import control (IMPORT_OBJECT_FROM_FD or its batch form).
        IMPORT = 2, Import, "import";
    }
}

/// A new handle referring to an existing memory ([`crate::EventKind::GpuRef`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuRefEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    /// A [`ref_how`] value.
    pub how: u32,
    /// The handle it was made from (dup), 0 for an import.
    pub src_client: u32,
    pub src_handle: u32,
    pub gpu: u32,
    pub mem_kind: u32,
    /// The memory's bytes (charged elsewhere: a reference adds none).
    pub bytes: u64,
}

/// A memory exported to an export file ([`crate::EventKind::GpuExport`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuExportEvent {
    pub header: EventHeader,
    pub client: u32,
    pub handle: u32,
    pub file_id: u64,
    pub position: u32,
    pub gpu: u32,
    pub bytes: u64,
}

/// A memory's charge moved to another process ([`crate::EventKind::GpuCharge`]):
/// its charged handle went while other handles remain.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuChargeEvent {
    pub header: EventHeader,
    pub from_pid: u32,
    pub to_pid: u32,
    pub gpu: u32,
    pub mem_kind: u32,
    /// The handle now charged.
    pub client: u32,
    pub handle: u32,
    pub bytes: u64,
}

code_set! {
    /// What came of an ioctl that is reported as a plain call ([`GpuIoctlEvent::outcome`]).
    pub mod outcome, enum OutcomeCode {
        /// Decoded; it changed no memory (a control, a map, a failed allocation, ...).
        DECODED = 0, Decoded, "decoded";
        /// An escape every CUDA process sends that carries no memory.
        NO_MEMORY_ESCAPE = 1, NoMemoryEscape, "no_memory_escape";
        /// Not decoded; `undecoded` says why.
        UNDECODED = 2, Undecoded, "undecoded";
    }
}

/// Any other ioctl on an NVIDIA file ([`crate::EventKind::GpuIoctl`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuIoctlEvent {
    pub header: EventHeader,
    pub fd: i32,
    /// The [`device_file`] the call was made on.
    pub device: u32,
    /// RM escape number, or the UVM command.
    pub escape: u32,
    /// The raw ioctl command.
    pub cmd: u32,
    /// RM_CONTROL's command (0 otherwise).
    pub control_cmd: u32,
    /// The RM class of an allocation (0 otherwise).
    pub class: u32,
    /// The GPU of the object the call named, when known (else [`NO_GPU`]).
    pub gpu: u32,
    pub _reserved: u32,
    /// RM status the driver returned (0 = success).
    pub status: u32,
    /// An [`outcome`] value.
    pub outcome: u32,
    /// An [`undecoded`] reason when `outcome` is UNDECODED.
    pub undecoded: u32,
    pub via_xfer: u32,
    /// ioctl(2)'s return value.
    pub ret: i64,
    /// A failed video-memory allocation: the bytes asked for.
    pub requested_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_keys_round_trip() {
        for (kind, number) in [
            (call_kind::RM_ESCAPE, 0xca),
            (call_kind::UVM, 0x3000_0001),
            (call_kind::RM_CONTROL, 0x2080_0110),
            (call_kind::NOT_RM, u32::MAX),
        ] {
            assert_eq!(split_call_key(call_key(kind, number)), (kind, number));
        }
        assert_ne!(
            call_key(call_kind::RM_ESCAPE, 0x2A),
            call_key(call_kind::UVM, 0x2A)
        );
    }
}
