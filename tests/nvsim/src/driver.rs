//! The simulated NVIDIA driver as a pure state machine: no FUSE, no syscalls.
//!
//! [`Driver::ioctl_fds`] takes what the FUSE layer hands it (the command, the
//! caller's `arg` pointer, the bytes the kernel copied in, how many bytes the
//! kernel will copy out), a [`UserMem`] that reads and writes the caller's
//! memory for pointers inside the params, and an [`FdResolver`] that says which
//! open file a descriptor number named inside the params (the `fd` of the
//! export/import controls) is in the calling process. It returns the bytes to
//! copy out or an errno. [`Driver::named_fd`] tells the FUSE layer beforehand
//! which descriptor an ioctl names, so that it can resolve it.
//!
//! ## Memories, handles, references and charges
//! The accounting follows `docs/gpu-accounting.md` (the rules) on top of
//! `docs/nvidia-abi.md` (the driver facts):
//! * A *memory* is created by a successful allocation of a memory class
//!   (RM_ALLOC, RM_ALLOC_MEMORY, VID_HEAP ALLOC_SIZE / ALLOC_SIZE_RANGE /
//!   ALLOC_OS_DESCRIPTOR). It has a GPU, a kind (video, host, EGM, or none for
//!   the classes that never hold bytes) and a byte count, possibly 0.
//! * It is referenced by *handles* (the one it was created with, RM_DUP_OBJECT
//!   dups, imports) and by *export references* (a slot of an export file's
//!   object table, held until that open file is released or the slot is
//!   overwritten). It is freed when the last reference goes.
//! * Its bytes are charged to one process at a time: first the creator; when
//!   the charged handle goes and handles remain, the creator of the oldest
//!   surviving handle (global creation order). With only export references
//!   left the charge stays; a handle made later (an import) is then the oldest
//!   handle and takes the charge. So at every moment the charged handle is the
//!   oldest live handle, if there is one.
//! * The driver figure of a memory (video only) goes to the process that
//!   created the client holding the charged handle; nobody while only export
//!   references keep it.
//! * A teardown (client, device, subdevice, file release) removes all its
//!   handles and export references first, then settles each memory touched;
//!   peaks are updated once per ioctl or release, on the final state.
//!
//! Status codes and their sources are in [`crate::abi::status`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::abi::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use crate::abi::{self, class, esc, size, status::*, unix_ctrl as ux};
use crate::controls;

/// The caller's memory, for pointers inside ioctl params.
pub trait UserMem {
    /// `len` bytes at `addr`, or `None` if any of them cannot be read.
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>>;
    /// Writes all of `data` at `addr`; false if it could not.
    fn write(&self, addr: u64, data: &[u8]) -> bool;
}

/// The caller's descriptor table, for descriptor numbers inside ioctl params.
pub trait FdResolver {
    /// The open file (FUSE fh) of this simulator that descriptor `fd` of the
    /// calling process refers to; `None` if it is not open or not ours.
    fn fh_of(&self, fd: i32) -> Option<u64>;
}

/// A resolver that knows no descriptor.
pub struct NoFds;

impl FdResolver for NoFds {
    fn fh_of(&self, _fd: i32) -> Option<u64> {
        None
    }
}

impl FdResolver for HashMap<i32, u64> {
    fn fh_of(&self, fd: i32) -> Option<u64> {
        self.get(&fd).copied()
    }
}

impl FdResolver for BTreeMap<i32, u64> {
    fn fh_of(&self, fd: i32) -> Option<u64> {
        self.get(&fd).copied()
    }
}

/// Which device file an open file description (FUSE fh) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// `nvidiactl`.
    Ctl,
    /// `nvidiaN`.
    Gpu(u32),
    /// `nvidia-uvm`.
    Uvm,
}

/// Static configuration of the simulated machine.
#[derive(Clone, Debug)]
pub struct Config {
    pub gpus: u32,
    pub mem_per_gpu: u64,
    pub driver_version: String,
}

/// An errno (positive) returned by the ioctl itself.
pub type Errno = i32;

/// Handles the driver picks: `0xc1d00000 + counter`, unique across clients
/// and objects.
pub const HANDLE_BASE: u32 = 0xc1d0_0000;

/// What a memory's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemKind {
    /// Video memory (framebuffer): `bytes`, `used_bytes`, the driver figure.
    Video,
    /// Pinned host memory: `host_bytes`.
    Host,
    /// Extended GPU memory (GH200): `egm_bytes`.
    Egm,
    /// Classes that never hold bytes (address ranges, fabric handles).
    None,
}

type MemId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjKind {
    Device {
        gpu: u32,
    },
    Subdevice,
    /// NV01_MEMORY_HW_RESOURCES: no framebuffer of its own (no memory, no
    /// figure but GPU_GET_PID_INFO's up to 545); `video_bytes` is its size
    /// when it was asked for in video memory, else 0.
    HwResources {
        video_bytes: u64,
    },
    /// A handle of memory `mem`; `seq` is its place in the global creation
    /// order of handles.
    Memory {
        mem: MemId,
        seq: u64,
    },
    Other,
}

#[derive(Debug)]
struct Object {
    class: u32,
    /// The parent handle; the client's handle for top-level objects.
    parent: u32,
    children: BTreeSet<u32>,
    kind: ObjKind,
}

#[derive(Debug)]
struct Client {
    fh: u64,
    creator_pid: u32,
    /// Top-level objects (parent == client).
    children: BTreeSet<u32>,
    objects: HashMap<u32, Object>,
}

/// One handle of a memory.
#[derive(Clone, Copy, Debug)]
struct HandleRef {
    client: u32,
    /// tgid of the process whose ioctl created the handle.
    pid: u32,
}

#[derive(Debug)]
struct Memory {
    class: u32,
    gpu: u32,
    kind: MemKind,
    bytes: u64,
    /// The process charged with the bytes (per-caller figure).
    charged_pid: u32,
    /// `seq` of the charged handle while it exists.
    charged: Option<u64>,
    /// Live handles by creation order.
    handles: BTreeMap<u64, HandleRef>,
    /// Slots of export files that hold this memory.
    export_refs: u32,
    /// Whose driver figure holds the bytes.
    driver_pid: Option<u32>,
}

/// The object table of an export file (an nvidiactl open file named by an
/// export control).
#[derive(Debug)]
struct ExportFile {
    /// GPU of the device given when the table was made (None: hDevice 0).
    gpu: Option<u32>,
    slots: Vec<Option<MemId>>,
}

#[derive(Default, Debug, Clone, Copy)]
struct GpuUse {
    used: u64,
    host: u64,
    egm: u64,
}

/// Per (pid, GPU) ground truth; see [`ProcGpuState`] for the meaning.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcGpu {
    pub bytes: u64,
    pub peak_bytes: u64,
    pub host_bytes: u64,
    pub egm_bytes: u64,
    pub driver_video_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
}

#[derive(Default, Debug)]
struct UvmFile {
    initialized: bool,
    /// base -> (length, mapped)
    ranges: BTreeMap<u64, (u64, bool)>,
}

/// The simulated driver.
#[derive(Debug)]
pub struct Driver {
    cfg: Config,
    major: u32,
    /// The full version, which keys the layouts that moved between branches.
    version: abi::Version,
    clients: BTreeMap<u32, Client>,
    next_handle: u32,
    next_range_group: u64,
    gpus: Vec<GpuUse>,
    procs: BTreeMap<u32, BTreeMap<u32, ProcGpu>>,
    uvm: HashMap<u64, UvmFile>,
    /// Kind of every open device file (from open or its first ioctl).
    files: HashMap<u64, FileKind>,
    memories: BTreeMap<MemId, Memory>,
    next_mem: MemId,
    next_seq: u64,
    exports: HashMap<u64, ExportFile>,
    ioctl_total: u64,
    ioctl_failed: u64,
    received: BTreeMap<u32, Received>,
    /// A pid as a caller's pid namespace sees it ([`crate::pidns::ns_pid`]).
    ns_pid: fn(u32, u32) -> Option<u32>,
}

/// `nvsim-state.json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub driver_version: String,
    pub gpus: Vec<GpuState>,
    /// Per process (tgid) and GPU, sorted by pid and GPU. A (pid, GPU) entry
    /// appears the first time one of its figures becomes non-zero and stays
    /// listed after the process exits.
    pub processes: Vec<ProcessState>,
    /// Live RM clients, by handle.
    pub clients: Vec<ClientState>,
    pub ioctls: IoctlCounts,
    /// Every call received, by process (tgid) and kind: an independent
    /// count to compare a tracer's with. Sorted by pid.
    pub received: Vec<Received>,
    /// Extra (not in the brief's schema): UVM external ranges currently known.
    pub uvm_ranges: u64,
    /// Extra: every live memory (0-byte ones included), in creation order.
    pub memories: Vec<MemoryState>,
}

/// One GPU. Every memory is counted once, however many handles and export
/// references it has.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    pub index: u32,
    pub capacity_bytes: u64,
    /// Video bytes of the live memories on this GPU (what NV_ERR_NO_MEMORY
    /// is decided on).
    pub used_bytes: u64,
    /// Host bytes of the live memories attributed to this GPU (RM_ALLOC_MEMORY
    /// on nvidiaN: that GPU; otherwise the GPU of the device ancestor).
    pub host_bytes: u64,
    /// EGM bytes of the live memories on this GPU.
    pub egm_bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    pub pid: u32,
    pub gpus: Vec<ProcGpuState>,
}

/// One (process, GPU).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProcGpuState {
    pub gpu: u32,
    /// Per-caller figure, video: bytes of the live video memories charged to
    /// this process (the creator of the memory's charged handle; see the
    /// module doc for how a charge moves).
    pub bytes: u64,
    /// The maximum `bytes` ever had at the end of an ioctl or release; a
    /// charge moving in can raise it.
    pub peak_bytes: u64,
    /// Per-caller figure, host memory.
    pub host_bytes: u64,
    /// Per-caller figure, EGM.
    pub egm_bytes: u64,
    /// Driver figure (what NVML's `usedGpuMemory` reports): video bytes of the
    /// live memories whose charged handle lies in a client this process
    /// created. Dups/imports of others' memory and memory kept only by an
    /// export file are not in it.
    pub driver_video_bytes: u64,
    /// What this branch's GPU_GET_PID_INFO (so NVML and nvidia-smi) reports:
    /// the driver figure by the branch's rule
    /// ([`Driver::pid_info_video_bytes`]).
    #[serde(default)]
    pub pid_info_video_bytes: u64,
    /// Memories holding bytes (video, host or EGM, more than 0) this process
    /// created; 0-byte memories, dups, imports and exports are not counted,
    /// nor is a charge moving in.
    pub allocs: u64,
    /// Memories holding bytes that were freed (last reference gone) while
    /// charged to this process; a teardown counts one per memory freed.
    pub frees: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClientState {
    pub handle: u32,
    /// FUSE file handle of the open file the client was created through.
    pub fh: u64,
    pub creator_pid: u32,
    /// Objects in the client, the client itself excluded.
    pub objects: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IoctlCounts {
    /// Every ioctl on a device file.
    pub total: u64,
    /// Those that returned an errno or wrote a non-zero RM/UVM status.
    pub failed: u64,
}

/// Calls received, by kind. Keys are hexadecimal numbers: `rm_escapes` by
/// escape nr (an XFER_CMD counts as the escape it carries, as a tracer that
/// follows it sees it), `uvm` by command, `controls` by RM_CONTROL command
/// (directly or through XFER_CMD). Every call is counted, failed ones too.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    pub pid: u32,
    pub rm_escapes: BTreeMap<String, u64>,
    pub uvm: BTreeMap<String, u64>,
    pub controls: BTreeMap<String, u64>,
}

/// One live memory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct MemoryState {
    /// Creation number (0, 1, ...).
    pub id: u64,
    pub gpu: u32,
    /// The class it was created as (VID_HEAP: the class chosen).
    pub class: u32,
    pub kind: MemKind,
    pub bytes: u64,
    /// The process charged (per-caller figure).
    pub charged_pid: u32,
    /// The process whose driver figure holds it (video only), if any.
    pub driver_pid: Option<u32>,
    /// Live handles (the original, dups, imports).
    pub handles: u64,
    /// Export-file slots holding it.
    pub export_refs: u64,
}

/// What an allocation is about to create, computed before anything is
/// committed so that a fault on write-back leaves the state untouched.
enum NewObj {
    Plain(ObjKind),
    Memory { gpu: u32, kind: MemKind, bytes: u64 },
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

fn is_client_class(c: u32) -> bool {
    matches!(
        c,
        class::NV01_ROOT | class::NV01_ROOT_NON_PRIV | class::NV01_ROOT_CLIENT
    )
}

/// The classes RM_ALLOC accepts as memory.
fn is_memory_class(c: u32) -> bool {
    matches!(
        c,
        class::NV01_MEMORY_LOCAL_USER
            | class::NV01_MEMORY_SYSTEM
            | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
            | class::NV_MEMORY_EXTENDED_USER
            | class::NV01_MEMORY_LOCAL_PHYSICAL
            | class::NV_MEMORY_FABRIC
            | class::NV_MEMORY_MULTICAST_FABRIC
            | class::NV_MEMORY_FABRIC_IMPORT_V2
            | class::NV_MEMORY_FABRIC_IMPORTED_REF
            | class::NV_MEMORY_EXPORT
            | class::NV50_MEMORY_VIRTUAL
            | class::NV01_MEMORY_VIRTUAL
    )
}

/// `objectTypes` of IMPORT_OBJECTS_FROM_FD for a memory of class `c`.
/// docs/nvidia-abi.md lists the values; which class maps to which is our reading
/// (EGM and local physical are GPU-side memory; the others have no type).
fn import_type(c: u32) -> u8 {
    match c {
        class::NV01_MEMORY_LOCAL_USER
        | class::NV01_MEMORY_LOCAL_PRIVILEGED
        | class::NV01_MEMORY_LOCAL_PHYSICAL
        | class::NV_MEMORY_EXTENDED_USER => ux::IMPORT_TYPE_VIDMEM,
        class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            ux::IMPORT_TYPE_SYSMEM
        }
        class::NV_MEMORY_FABRIC => ux::IMPORT_TYPE_FABRIC,
        class::NV_MEMORY_MULTICAST_FABRIC => ux::IMPORT_TYPE_FABRIC_MC,
        _ => ux::IMPORT_TYPE_NONE,
    }
}

/// Result of one escape: the RM status it wrote (None: it has no status field).
type EscResult = Result<Option<u32>, Errno>;

/// An RM status (Err) or a value.
type St<T> = Result<T, u32>;

impl Driver {
    pub fn new(cfg: Config) -> Self {
        let major = abi::version_major(&cfg.driver_version).unwrap_or(u32::MAX);
        let version = abi::Version::of(&cfg.driver_version);
        let gpus = vec![GpuUse::default(); cfg.gpus as usize];
        Driver {
            cfg,
            major,
            version,
            clients: BTreeMap::new(),
            next_handle: 0,
            next_range_group: 1,
            gpus,
            procs: BTreeMap::new(),
            uvm: HashMap::new(),
            files: HashMap::new(),
            memories: BTreeMap::new(),
            next_mem: 0,
            next_seq: 0,
            exports: HashMap::new(),
            ioctl_total: 0,
            ioctl_failed: 0,
            received: BTreeMap::new(),
            ns_pid: crate::pidns::ns_pid,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn received_by(&mut self, pid: u32) -> &mut Received {
        self.received.entry(pid).or_insert_with(|| Received {
            pid,
            ..Received::default()
        })
    }

    /// True for drivers before 535 (legacy NVOS21 / 40-byte NVOS64).
    pub fn legacy_layouts(&self) -> bool {
        self.major < abi::PARAMS_SIZE_SINCE
    }

    /// An open of a device file (FUSE OPEN): remembers what `fh` is, so that
    /// an export control can check that the file it names is nvidiactl.
    pub fn open(&mut self, fh: u64, file: FileKind) {
        self.files.insert(fh, file);
    }

    /// One ioctl on an open file, with no descriptor resolvable (the
    /// export/import controls then answer NV_ERR_INVALID_PARAMETER).
    #[allow(clippy::too_many_arguments)]
    pub fn ioctl(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &dyn UserMem,
    ) -> Result<Vec<u8>, Errno> {
        self.ioctl_fds(fh, file, pid, cmd, arg, in_data, out_size, mem, &NoFds)
    }

    /// One ioctl on an open file.
    ///
    /// `in_data` is what the kernel copied in (`_IOC_SIZE` bytes when the
    /// command has the write direction bit, else empty); `out_size` is how many
    /// bytes it will copy back. For RM escapes whose direction bits do not make
    /// the kernel copy the params, they are read from / written to `arg` through
    /// `mem`, as the real driver ignores the direction bits. `fds` resolves
    /// the descriptor numbers named inside the params (see [`Self::named_fd`]).
    #[allow(clippy::too_many_arguments)]
    pub fn ioctl_fds(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &dyn UserMem,
        fds: &dyn FdResolver,
    ) -> Result<Vec<u8>, Errno> {
        self.ioctl_total += 1;
        self.files.entry(fh).or_insert(file);
        let r = match file {
            FileKind::Uvm => {
                *self
                    .received_by(pid)
                    .uvm
                    .entry(format!("{cmd:#x}"))
                    .or_default() += 1;
                self.uvm_ioctl(fh, cmd, arg, mem).map(|st| (st, Vec::new()))
            }
            FileKind::Ctl | FileKind::Gpu(_) => {
                self.rm_ioctl(fh, file, pid, cmd, arg, in_data, out_size, mem, fds)
            }
        };
        self.update_peaks();
        match r {
            Ok((st, out)) => {
                if st.is_some_and(|s| s != NV_OK) {
                    self.ioctl_failed += 1;
                }
                Ok(out)
            }
            Err(e) => {
                self.ioctl_failed += 1;
                Err(e)
            }
        }
    }

    /// The descriptor number an ioctl names inside its params, which the
    /// caller of [`Self::ioctl_fds`] must resolve: the `fd` of the
    /// EXPORT/IMPORT_OBJECT(S)_TO/FROM_FD controls (directly or through
    /// XFER_CMD). Reads nothing it cannot; changes nothing.
    pub fn named_fd(
        &self,
        file: FileKind,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        mem: &dyn UserMem,
    ) -> Option<i32> {
        if file != FileKind::Ctl {
            return None;
        }
        let size = abi::ioc_size(cmd);
        let mut nr = abi::ioc_nr(cmd);
        let mut p = if in_data.len() == size {
            in_data.to_vec()
        } else {
            mem.read(arg, size)?
        };
        if nr == esc::IOCTL_XFER_CMD && p.len() == size::XFER {
            let inner = u32_at(&p, abi::xfer::CMD);
            let len = u32_at(&p, abi::xfer::SIZE) as usize;
            if inner > 0xff || len > abi::xfer::MAX_SIZE {
                return None;
            }
            nr = inner as u8;
            p = mem.read(u64_at(&p, abi::xfer::PTR), len)?;
        }
        if nr != esc::RM_CONTROL || p.len() != size::NVOS54 {
            return None;
        }
        let (want, off) = match u32_at(&p, abi::nvos54::CMD) {
            ux::EXPORT_OBJECT_TO_FD => (size::EXPORT_OBJECT_TO_FD, ux::EXP1_FD),
            ux::EXPORT_OBJECTS_TO_FD => (size::EXPORT_OBJECTS_TO_FD, ux::EXPN_FD),
            ux::IMPORT_OBJECT_FROM_FD => (size::IMPORT_OBJECT_FROM_FD, ux::IMP1_FD),
            ux::IMPORT_OBJECTS_FROM_FD => (size::IMPORT_OBJECTS_FROM_FD, ux::IMPN_FD),
            _ => return None,
        };
        if u32_at(&p, abi::nvos54::PARAMS_SIZE) as usize != want {
            return None;
        }
        let b = mem.read(u64_at(&p, abi::nvos54::PARAMS) + off as u64, 4)?;
        let fd = u32_at(&b, 0) as i32;
        (fd >= 0).then_some(fd)
    }

    #[allow(clippy::too_many_arguments)]
    fn rm_ioctl(
        &mut self,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &dyn UserMem,
        fds: &dyn FdResolver,
    ) -> Result<(Option<u32>, Vec<u8>), Errno> {
        let size = abi::ioc_size(cmd);
        let nr = abi::ioc_nr(cmd);
        let mut params = if in_data.len() == size {
            in_data.to_vec()
        } else {
            mem.read(arg, size).ok_or(libc::EFAULT)?
        };
        let call = Call {
            fh,
            file,
            pid,
            mem,
            fds,
        };
        let st = self.escape(&call, nr, &mut params, false)?;
        if out_size == size {
            Ok((st, params))
        } else {
            if size > 0 && !mem.write(arg, &params) {
                return Err(libc::EFAULT);
            }
            Ok((st, Vec::new()))
        }
    }

    /// Dispatches one RM escape on its params (`p.len()` is the size from the
    /// command, or the XFER size).
    fn escape(&mut self, call: &Call, nr: u8, p: &mut [u8], in_xfer: bool) -> EscResult {
        let (fh, file, pid, mem) = (call.fh, call.file, call.pid, call.mem);
        let ctl = file == FileKind::Ctl;
        if nr != esc::IOCTL_XFER_CMD || in_xfer {
            *self
                .received_by(pid)
                .rm_escapes
                .entry(format!("{nr:#x}"))
                .or_default() += 1;
        }
        if nr == esc::RM_CONTROL && p.len() == size::NVOS54 {
            let cmd = u32_at(p, abi::nvos54::CMD);
            log::debug!(
                "pid {pid} RM_CONTROL {cmd:#x} size {}",
                u32_at(p, abi::nvos54::PARAMS_SIZE)
            );
            *self
                .received_by(pid)
                .controls
                .entry(format!("{cmd:#x}"))
                .or_default() += 1;
        } else {
            log::debug!("pid {pid} escape {nr:#x} size {} on {file:?}", p.len());
        }
        let need = |ok: bool| if ok { Ok(()) } else { Err(libc::EINVAL) };
        match nr {
            esc::IOCTL_XFER_CMD => {
                need(!in_xfer && p.len() == size::XFER)?;
                let inner_cmd = u32_at(p, abi::xfer::CMD);
                let inner_size = u32_at(p, abi::xfer::SIZE) as usize;
                let ptr = u64_at(p, abi::xfer::PTR);
                need(inner_size <= abi::xfer::MAX_SIZE)?;
                let mut inner = mem.read(ptr, inner_size).ok_or(libc::EFAULT)?;
                need(inner_cmd <= 0xff && inner_cmd as u8 != esc::IOCTL_XFER_CMD)?;
                let st = self.escape(call, inner_cmd as u8, &mut inner, true)?;
                if !mem.write(ptr, &inner) {
                    return Err(libc::EFAULT);
                }
                Ok(st)
            }
            esc::CARD_INFO => {
                need(ctl)?;
                self.card_info(p);
                Ok(None)
            }
            esc::CHECK_VERSION_STR => {
                need(p.len() == size::RM_API_VERSION)?;
                put_u32(
                    p,
                    abi::rm_api_version::REPLY,
                    abi::rm_api_version::REPLY_RECOGNIZED,
                );
                Ok(None)
            }
            esc::REGISTER_FD => {
                need(!ctl && p.len() == 4)?;
                Ok(None)
            }
            esc::ATTACH_GPUS_TO_FD => {
                need(ctl)?;
                Ok(None)
            }
            esc::ALLOC_OS_EVENT | esc::FREE_OS_EVENT => {
                need(p.len() == size::OS_EVENT)?;
                put_u32(p, abi::os_event::STATUS, NV_OK);
                Ok(Some(NV_OK))
            }
            esc::SYS_PARAMS => {
                // memblock_size is an input; nothing is written.
                need(p.len() == size::SYS_PARAMS)?;
                Ok(None)
            }
            esc::NUMA_INFO => {
                // Any size: no NUMA memory, every field 0.
                p.fill(0);
                Ok(None)
            }
            esc::WAIT_OPEN_COMPLETE => {
                need(
                    self.major >= abi::wait_open_complete::SINCE
                        && p.len() == size::WAIT_OPEN_COMPLETE,
                )?;
                put_u32(p, abi::wait_open_complete::RC, 0);
                put_u32(p, abi::wait_open_complete::ADAPTER_STATUS, NV_OK);
                Ok(None)
            }
            esc::STATUS_CODE | esc::QUERY_DEVICE_INTR | esc::SET_NUMA_STATUS => Ok(None),
            // The dma-buf export: its size moved at 570. The simulator exports
            // nothing (no dma-buf support, as a driver without it):
            // NV_ERR_NOT_SUPPORTED in `status`.
            esc::EXPORT_TO_DMABUF_FD => {
                let (len, status) = abi::branch::dmabuf_export(self.version);
                need(ctl && p.len() == len)?;
                put_u32(p, status, NV_ERR_NOT_SUPPORTED);
                Ok(Some(NV_ERR_NOT_SUPPORTED))
            }
            esc::RM_ALLOC_MEMORY => {
                let FileKind::Gpu(gpu) = file else {
                    return Err(libc::EINVAL);
                };
                need(p.len() == size::NVOS02_WITH_FD)?;
                let st = match self.rm_alloc_memory(gpu, pid, p) {
                    Ok(()) => NV_OK,
                    Err(st) => st,
                };
                put_u32(p, abi::nvos02::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_FREE => {
                need(ctl && p.len() == size::NVOS00)?;
                let st = self.rm_free(fh, p);
                put_u32(p, abi::nvos00::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_ALLOC => {
                // escape.c: on nvidiaN only the event classes may be allocated;
                // they name a client of the nvidiactl file the process uses.
                let h_class = u32_at(p, abi::nvos21::H_CLASS);
                if ctl {
                    self.rm_alloc(fh, pid, p, mem)
                } else {
                    need(class::EVENTS.contains(&h_class))?;
                    let h_root = u32_at(p, abi::nvos21::H_ROOT);
                    match self.clients.get(&h_root).map(|c| (c.fh, c.creator_pid)) {
                        Some((client_fh, creator)) if creator == pid => {
                            self.rm_alloc(client_fh, pid, p, mem)
                        }
                        _ => self.rm_alloc(fh, pid, p, mem),
                    }
                }
            }
            esc::RM_CONTROL => {
                need(ctl && p.len() == size::NVOS54)?;
                let st = self.rm_control(call, p)?;
                log::debug!("  -> {st:#x}");
                put_u32(p, abi::nvos54::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_VID_HEAP_CONTROL => {
                need(ctl && p.len() == size::NVOS32)?;
                let st = self.vid_heap(fh, pid, p).err().unwrap_or(NV_OK);
                put_u32(p, abi::nvos32::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_MAP_MEMORY => {
                need(ctl && p.len() == size::NVOS33_WITH_FD)?;
                let (h_client, h_memory) = (
                    u32_at(p, abi::nvos33::H_CLIENT),
                    u32_at(p, abi::nvos33::H_MEMORY),
                );
                // Memory, or the usermode (doorbell) page libcuda maps at start;
                // the mapping itself is the mmap of the fd that follows.
                let usermode = self.owned_client(fh, h_client).is_ok_and(|c| {
                    c.objects
                        .get(&h_memory)
                        .is_some_and(|o| class::USERMODE.contains(&o.class))
                });
                let st = if usermode {
                    NV_OK
                } else {
                    self.check_memory(fh, h_client, h_memory)
                };
                put_u32(p, abi::nvos33::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_UNMAP_MEMORY => {
                need(ctl && p.len() == size::NVOS34)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos34::H_CLIENT),
                    u32_at(p, abi::nvos34::H_MEMORY),
                );
                put_u32(p, abi::nvos34::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_MAP_MEMORY_DMA => {
                let (len, status) = abi::branch::nvos46(self.version);
                need(ctl && p.len() == len)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos46::H_CLIENT),
                    u32_at(p, abi::nvos46::H_MEMORY),
                );
                put_u32(p, status, st);
                Ok(Some(st))
            }
            esc::RM_UNMAP_MEMORY_DMA => {
                let (len, status) = abi::branch::nvos47(self.version);
                need(ctl && p.len() == len)?;
                let st = self.check_memory(
                    fh,
                    u32_at(p, abi::nvos47::H_CLIENT),
                    u32_at(p, abi::nvos47::H_MEMORY),
                );
                put_u32(p, status, st);
                Ok(Some(st))
            }
            esc::RM_ALLOC_CONTEXT_DMA2 => {
                need(ctl && p.len() == size::NVOS39)?;
                put_u32(p, abi::nvos39::STATUS, NV_OK);
                Ok(Some(NV_OK))
            }
            esc::RM_UPDATE_DEVICE_MAPPING_INFO => {
                // CUDA sends it at start; it allocates nothing.
                need(ctl && p.len() == size::NVOS56)?;
                put_u32(p, abi::nvos56::STATUS, NV_OK);
                Ok(Some(NV_OK))
            }
            esc::RM_DUP_OBJECT => {
                need(ctl && p.len() == size::NVOS55)?;
                let st = self.rm_dup(fh, pid, p).err().unwrap_or(NV_OK);
                put_u32(p, abi::nvos55::STATUS, st);
                Ok(Some(st))
            }
            esc::RM_SHARE => {
                need(ctl && p.len() == size::NVOS57)?;
                put_u32(p, abi::nvos57::STATUS, NV_ERR_NOT_SUPPORTED);
                Ok(Some(NV_ERR_NOT_SUPPORTED))
            }
            _ => Err(libc::EINVAL),
        }
    }

    fn card_info(&self, p: &mut [u8]) {
        use abi::card_info as ci;
        p.fill(0);
        let n = p.len() / size::CARD_INFO_ENTRY;
        for i in 0..n.min(self.cfg.gpus as usize) {
            let e = &mut p[i * size::CARD_INFO_ENTRY..(i + 1) * size::CARD_INFO_ENTRY];
            put_u32(e, ci::VALID, 1);
            e[ci::PCI_BUS] = 0x18 + i as u8;
            put_u16(e, ci::PCI_VENDOR_ID, 0x10de);
            put_u16(e, ci::PCI_DEVICE_ID, 0x2335);
            put_u32(e, ci::GPU_ID, (0x18 + i as u32) << 8);
            put_u64(e, ci::FB_SIZE, self.cfg.mem_per_gpu);
            put_u32(e, ci::MINOR_NUMBER, i as u32);
        }
    }

    // ----- handles and tree helpers -------------------------------------

    fn pick_handle(&mut self, client: Option<u32>) -> u32 {
        loop {
            let h = HANDLE_BASE.wrapping_add(self.next_handle);
            self.next_handle = self.next_handle.wrapping_add(1);
            if h == 0 || self.clients.contains_key(&h) {
                continue;
            }
            if let Some(c) = client.and_then(|c| self.clients.get(&c))
                && c.objects.contains_key(&h)
            {
                continue;
            }
            return h;
        }
    }

    /// The client `h` if it exists and was created through `fh`.
    fn owned_client(&self, fh: u64, h: u32) -> St<&Client> {
        match self.clients.get(&h) {
            Some(c) if c.fh == fh => Ok(c),
            _ => Err(NV_ERR_INVALID_CLIENT),
        }
    }

    /// GPU of the nearest device at or above `h` in client `c`.
    fn device_gpu(c: &Client, mut h: u32) -> Option<u32> {
        for _ in 0..64 {
            let o = c.objects.get(&h)?;
            if let ObjKind::Device { gpu } = o.kind {
                return Some(gpu);
            }
            h = o.parent;
        }
        None
    }

    /// The device object `h` is under (itself for a device).
    fn device_of(c: &Client, mut h: u32) -> Option<u32> {
        for _ in 0..64 {
            let o = c.objects.get(&h)?;
            if let ObjKind::Device { .. } = o.kind {
                return Some(h);
            }
            h = o.parent;
        }
        None
    }

    /// The video memory GPU_GET_PID_INFO reports for `pid` on `gpu`, by this
    /// branch's rule (`gpuFindClientInfoWithPidIterator` and
    /// `_gpuCollectMemInfo`, `gpu_rmapi.c`): for every client `pid` created,
    /// the memories whose charged handle lies in that client (the driver
    /// figure, `driver_video_bytes`), under the client's first device object
    /// of `gpu` (lowest handle) up to 535 and under any of its devices of
    /// `gpu` from 545; up to 545 also the size of its video
    /// NV01_MEMORY_HW_RESOURCES objects under those devices, which take no
    /// framebuffer and are in no other figure. From 545 without HW_RESOURCES
    /// this is `driver_video_bytes`.
    pub fn pid_info_video_bytes(&self, pid: u32, gpu: u32) -> u64 {
        let every_device = abi::branch::pid_info_every_device(self.version);
        let hw_resources = abi::branch::pid_info_counts_hw_resources(self.version);
        let mut sum = 0u64;
        for c in self.clients.values().filter(|c| c.creator_pid == pid) {
            let Some(first) = c
                .objects
                .iter()
                .filter(|(_, o)| o.kind == ObjKind::Device { gpu })
                .map(|(h, _)| *h)
                .min()
            else {
                continue;
            };
            for (&h, o) in &c.objects {
                let bytes = match o.kind {
                    ObjKind::Memory { mem, seq } => match self.memories.get(&mem) {
                        Some(m)
                            if m.kind == MemKind::Video
                                && m.gpu == gpu
                                && m.charged == Some(seq) =>
                        {
                            m.bytes
                        }
                        _ => continue,
                    },
                    ObjKind::HwResources { video_bytes } if hw_resources => video_bytes,
                    _ => continue,
                };
                let counted = match Self::device_of(c, h) {
                    Some(d) if every_device => Self::device_gpu(c, d) == Some(gpu),
                    Some(d) => d == first,
                    None => false,
                };
                if counted {
                    sum = sum.saturating_add(bytes);
                }
            }
        }
        sum
    }

    /// Checks that `h` may be a new handle in client `c` (0: the driver picks).
    fn check_new_handle(c: &Client, client: u32, h: u32) -> St<()> {
        if h != 0 && (h == client || c.objects.contains_key(&h)) {
            Err(NV_ERR_INSERT_DUPLICATE_NAME)
        } else {
            Ok(())
        }
    }

    fn insert_object(&mut self, client: u32, parent: u32, handle: u32, class: u32, kind: ObjKind) {
        let c = self.clients.get_mut(&client).expect("client checked");
        if parent == client {
            c.children.insert(handle);
        } else {
            c.objects
                .get_mut(&parent)
                .expect("parent checked")
                .children
                .insert(handle);
        }
        c.objects.insert(
            handle,
            Object {
                class,
                parent,
                children: BTreeSet::new(),
                kind,
            },
        );
    }

    /// Commits a new object: a plain one, or a memory with its first handle.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        client: u32,
        parent: u32,
        h_new: u32,
        class: u32,
        pid: u32,
        new: NewObj,
    ) -> u32 {
        let handle = if h_new == 0 {
            self.pick_handle(Some(client))
        } else {
            h_new
        };
        match new {
            NewObj::Plain(kind) => self.insert_object(client, parent, handle, class, kind),
            NewObj::Memory { gpu, kind, bytes } => {
                self.create_memory(client, parent, handle, class, pid, gpu, kind, bytes)
            }
        }
        handle
    }

    // ----- the accounting core -------------------------------------------

    fn pg(&mut self, pid: u32, gpu: u32) -> &mut ProcGpu {
        self.procs.entry(pid).or_default().entry(gpu).or_default()
    }

    /// Adds or removes `bytes` of `kind` to/from `pid`'s per-caller figure.
    fn charge(&mut self, pid: u32, gpu: u32, kind: MemKind, bytes: u64, add: bool) {
        if bytes == 0 || kind == MemKind::None {
            return;
        }
        let pg = self.pg(pid, gpu);
        let f = match kind {
            MemKind::Video => &mut pg.bytes,
            MemKind::Host => &mut pg.host_bytes,
            MemKind::Egm => &mut pg.egm_bytes,
            MemKind::None => return,
        };
        if add {
            *f += bytes;
        } else {
            *f -= bytes;
        }
    }

    /// Whether a new memory of `bytes` of `kind` fits on `gpu`: video memory
    /// within the GPU's capacity; system and EGM memory while the GPU's total of
    /// that kind stays a u64 (a request for more is refused with
    /// NV_ERR_NO_MEMORY, as the driver refuses what no memory can back).
    fn fits(&self, gpu: u32, kind: MemKind, bytes: u64) -> bool {
        let g = &self.gpus[gpu as usize];
        match kind {
            MemKind::Video => g
                .used
                .checked_add(bytes)
                .is_some_and(|total| total <= self.cfg.mem_per_gpu),
            MemKind::Host => g.host.checked_add(bytes).is_some(),
            MemKind::Egm => g.egm.checked_add(bytes).is_some(),
            MemKind::None => true,
        }
    }

    fn gpu_total(&mut self, gpu: u32, kind: MemKind, bytes: u64, add: bool) {
        let g = &mut self.gpus[gpu as usize];
        let f = match kind {
            MemKind::Video => &mut g.used,
            MemKind::Host => &mut g.host,
            MemKind::Egm => &mut g.egm,
            MemKind::None => return,
        };
        if add {
            *f += bytes;
        } else {
            *f -= bytes;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create_memory(
        &mut self,
        client: u32,
        parent: u32,
        handle: u32,
        class: u32,
        pid: u32,
        gpu: u32,
        kind: MemKind,
        bytes: u64,
    ) {
        let id = self.next_mem;
        self.next_mem += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let bytes = if kind == MemKind::None { 0 } else { bytes };
        self.memories.insert(
            id,
            Memory {
                class,
                gpu,
                kind,
                bytes,
                charged_pid: pid,
                charged: Some(seq),
                handles: BTreeMap::from([(seq, HandleRef { client, pid })]),
                export_refs: 0,
                driver_pid: None,
            },
        );
        self.insert_object(
            client,
            parent,
            handle,
            class,
            ObjKind::Memory { mem: id, seq },
        );
        self.gpu_total(gpu, kind, bytes, true);
        self.charge(pid, gpu, kind, bytes, true);
        if bytes > 0 {
            self.pg(pid, gpu).allocs += 1;
        }
        self.refresh_driver(id);
    }

    /// A new handle of memory `id` (a dup or an import).
    fn add_memory_handle(&mut self, id: MemId, client: u32, parent: u32, handle: u32, pid: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let m = self.memories.get_mut(&id).expect("memory exists");
        m.handles.insert(seq, HandleRef { client, pid });
        let class = m.class;
        let uncharged = m.charged.is_none();
        self.insert_object(
            client,
            parent,
            handle,
            class,
            ObjKind::Memory { mem: id, seq },
        );
        if uncharged {
            self.move_charge(id, seq);
        }
        self.refresh_driver(id);
    }

    /// Makes handle `seq` the charged one and moves the bytes to its creator.
    fn move_charge(&mut self, id: MemId, seq: u64) {
        let m = &self.memories[&id];
        let to = m.handles[&seq].pid;
        let (from, gpu, kind, bytes) = (m.charged_pid, m.gpu, m.kind, m.bytes);
        if to != from {
            self.charge(from, gpu, kind, bytes, false);
            self.charge(to, gpu, kind, bytes, true);
        }
        let m = self.memories.get_mut(&id).expect("memory exists");
        m.charged = Some(seq);
        m.charged_pid = to;
    }

    /// Moves the driver figure of memory `id` to where it belongs now.
    fn refresh_driver(&mut self, id: MemId) {
        let m = &self.memories[&id];
        let new = if m.kind == MemKind::Video && m.bytes > 0 {
            m.charged
                .and_then(|s| m.handles.get(&s))
                .and_then(|h| self.clients.get(&h.client))
                .map(|c| c.creator_pid)
        } else {
            None
        };
        let (old, gpu, bytes) = (m.driver_pid, m.gpu, m.bytes);
        if new == old {
            return;
        }
        if let Some(p) = old {
            self.pg(p, gpu).driver_video_bytes -= bytes;
        }
        if let Some(p) = new {
            self.pg(p, gpu).driver_video_bytes += bytes;
        }
        self.memories
            .get_mut(&id)
            .expect("memory exists")
            .driver_pid = new;
    }

    /// After handles or export references of memory `id` went: frees it if
    /// nothing refers to it any more, else moves the charge to the oldest
    /// surviving handle if the charged one went.
    fn settle(&mut self, id: MemId) {
        let Some(m) = self.memories.get(&id) else {
            return;
        };
        if m.handles.is_empty() && m.export_refs == 0 {
            let m = self.memories.remove(&id).expect("memory exists");
            if let Some(p) = m.driver_pid {
                self.pg(p, m.gpu).driver_video_bytes -= m.bytes;
            }
            self.gpu_total(m.gpu, m.kind, m.bytes, false);
            self.charge(m.charged_pid, m.gpu, m.kind, m.bytes, false);
            if m.bytes > 0 {
                self.pg(m.charged_pid, m.gpu).frees += 1;
            }
            return;
        }
        let charged_alive = m.charged.is_some_and(|s| m.handles.contains_key(&s));
        if !charged_alive {
            match m.handles.keys().next().copied() {
                Some(seq) => self.move_charge(id, seq),
                None => {
                    self.memories.get_mut(&id).expect("memory exists").charged = None;
                }
            }
        }
        self.refresh_driver(id);
    }

    fn settle_all(&mut self, touched: BTreeSet<MemId>) {
        for id in touched {
            self.settle(id);
        }
    }

    /// Peaks see the state at the end of each ioctl or release only.
    fn update_peaks(&mut self) {
        for gpus in self.procs.values_mut() {
            for pg in gpus.values_mut() {
                pg.peak_bytes = pg.peak_bytes.max(pg.bytes);
            }
        }
    }

    /// Removes `h` and everything under it from `client`, without settling
    /// the memories that lost a handle (they are added to `touched`).
    fn remove_subtree(&mut self, client: u32, h: u32, touched: &mut BTreeSet<MemId>) {
        let mut order = Vec::new();
        let mut stack = vec![h];
        {
            let c = &self.clients[&client];
            while let Some(x) = stack.pop() {
                if let Some(o) = c.objects.get(&x) {
                    order.push(x);
                    stack.extend(o.children.iter().copied());
                }
            }
        }
        let c = self.clients.get_mut(&client).expect("client exists");
        if let Some(parent) = c.objects.get(&h).map(|o| o.parent) {
            if parent == client {
                c.children.remove(&h);
            } else if let Some(po) = c.objects.get_mut(&parent) {
                po.children.remove(&h);
            }
        }
        let mut gone = Vec::new();
        for x in order.into_iter().rev() {
            if let Some(o) = c.objects.remove(&x)
                && let ObjKind::Memory { mem, seq } = o.kind
            {
                gone.push((mem, seq));
            }
        }
        for (mem, seq) in gone {
            if let Some(m) = self.memories.get_mut(&mem) {
                m.handles.remove(&seq);
            }
            touched.insert(mem);
        }
    }

    /// Frees `h` and everything under it (children first), then settles.
    fn free_subtree(&mut self, client: u32, h: u32) {
        let mut touched = BTreeSet::new();
        self.remove_subtree(client, h, &mut touched);
        self.settle_all(touched);
    }

    fn remove_client(&mut self, client: u32, touched: &mut BTreeSet<MemId>) {
        let tops: Vec<u32> = self.clients[&client].children.iter().copied().collect();
        for t in tops {
            self.remove_subtree(client, t, touched);
        }
        self.clients.remove(&client);
    }

    fn free_client(&mut self, client: u32) {
        let mut touched = BTreeSet::new();
        self.remove_client(client, &mut touched);
        self.settle_all(touched);
    }

    /// The last close of an open file: tears down every client created
    /// through it and the references its export table holds (one teardown),
    /// and forgets its UVM state.
    pub fn release(&mut self, fh: u64) {
        let mut touched = BTreeSet::new();
        let mine: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, c)| c.fh == fh)
            .map(|(h, _)| *h)
            .collect();
        for h in mine {
            self.remove_client(h, &mut touched);
        }
        if let Some(e) = self.exports.remove(&fh) {
            for id in e.slots.into_iter().flatten() {
                if let Some(m) = self.memories.get_mut(&id) {
                    m.export_refs -= 1;
                }
                touched.insert(id);
            }
        }
        self.settle_all(touched);
        self.uvm.remove(&fh);
        self.files.remove(&fh);
        self.update_peaks();
    }

    // ----- RM_ALLOC --------------------------------------------------------

    fn rm_alloc(&mut self, fh: u64, pid: u32, p: &mut [u8], mem: &dyn UserMem) -> EscResult {
        use abi::{nvos21, nvos64};
        let legacy = self.legacy_layouts();
        // (status offset, paramsSize if the layout has it, FINN flag)
        let (status_off, params_size, finn) = match (p.len(), legacy) {
            (size::NVOS21, false) => (nvos21::STATUS, Some(u32_at(p, nvos21::PARAMS_SIZE)), false),
            (size::NVOS21, true) => (nvos21::LEGACY_STATUS, None, false),
            (size::NVOS64, false) => (
                nvos64::STATUS,
                Some(u32_at(p, nvos64::PARAMS_SIZE)),
                u32_at(p, nvos64::FLAGS) & nvos64::FLAGS_FINN_SERIALIZED != 0,
            ),
            (size::NVOS64_LEGACY, true) => (
                nvos64::LEGACY_STATUS,
                None,
                u32_at(p, nvos64::LEGACY_FLAGS) & nvos64::FLAGS_FINN_SERIALIZED != 0,
            ),
            _ => return Err(libc::EINVAL),
        };
        let _ = params_size; // accepted as given; see the crate docs
        let req = AllocReq {
            h_root: u32_at(p, nvos21::H_ROOT),
            h_parent: u32_at(p, nvos21::H_OBJECT_PARENT),
            h_new: u32_at(p, nvos21::H_OBJECT_NEW),
            h_class: u32_at(p, nvos21::H_CLASS),
            p_params: u64_at(p, nvos21::P_ALLOC_PARMS),
            finn,
        };
        let st = match self.alloc_object(fh, pid, &req, mem)? {
            Ok(handle) => {
                put_u32(p, nvos21::H_OBJECT_NEW, handle);
                NV_OK
            }
            Err(st) => st,
        };
        log::debug!("  class {:#x} -> {st:#x}", req.h_class);
        put_u32(p, status_off, st);
        Ok(Some(st))
    }

    /// Allocates one object. Outer Err: errno (EFAULT); inner Err: RM status.
    fn alloc_object(
        &mut self,
        fh: u64,
        pid: u32,
        r: &AllocReq,
        mem: &dyn UserMem,
    ) -> Result<St<u32>, Errno> {
        let (h_root, h_parent, h_new, h_class, p_params) =
            (r.h_root, r.h_parent, r.h_new, r.h_class, r.p_params);
        if is_client_class(h_class) {
            let handle = if h_new == 0 {
                self.pick_handle(None)
            } else if self.clients.contains_key(&h_new) {
                return Ok(Err(NV_ERR_INSERT_DUPLICATE_NAME));
            } else {
                h_new
            };
            self.clients.insert(
                handle,
                Client {
                    fh,
                    creator_pid: pid,
                    children: BTreeSet::new(),
                    objects: HashMap::new(),
                },
            );
            return Ok(Ok(handle));
        }
        let c = match self.owned_client(fh, h_root) {
            Ok(c) => c,
            Err(st) => return Ok(Err(st)),
        };
        let known = matches!(
            h_class,
            class::NV01_DEVICE_0
                | class::NV20_SUBDEVICE_0
                | class::FERMI_VASPACE_A
                | class::KEPLER_CHANNEL_GROUP_A
                | class::FERMI_CONTEXT_SHARE_A
        ) || is_memory_class(h_class)
            || class::EVENTS.contains(&h_class)
            || class::USERMODE.contains(&h_class)
            || h_class == class::NV2081_BINAPI
            || h_class == class::NV01_MEMORY_HW_RESOURCES
            || class::CHANNELS.contains(&h_class)
            || class::COMPUTE.contains(&h_class)
            || class::COPY.contains(&h_class);
        if !known {
            return Ok(Err(NV_ERR_INVALID_CLASS));
        }
        let parent_is_client = h_parent == h_root;
        let parent_kind = if parent_is_client {
            None
        } else {
            match c.objects.get(&h_parent) {
                Some(o) => Some(o.kind),
                None => return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT)),
            }
        };
        if let Err(st) = Self::check_new_handle(c, h_root, h_new) {
            return Ok(Err(st));
        }
        let dev_gpu = if parent_is_client {
            None
        } else {
            Self::device_gpu(c, h_parent)
        };
        let new = match h_class {
            class::NV01_DEVICE_0 => {
                if !parent_is_client {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                if p_params == 0 {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                let b = mem.read(p_params, size::NV0080_ALLOC).ok_or(libc::EFAULT)?;
                let gpu = u32_at(&b, abi::nv0080::DEVICE_ID);
                if gpu >= self.cfg.gpus {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                NewObj::Plain(ObjKind::Device { gpu })
            }
            class::NV20_SUBDEVICE_0 => {
                if !matches!(parent_kind, Some(ObjKind::Device { .. })) {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                if p_params != 0 {
                    mem.read(p_params, size::NV2080_ALLOC).ok_or(libc::EFAULT)?;
                }
                NewObj::Plain(ObjKind::Subdevice)
            }
            c if is_memory_class(c) => {
                let Some(gpu) = dev_gpu else {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                };
                match self.memory_params(c, gpu, parent_kind, p_params, r.finn, mem)? {
                    Ok((kind, bytes)) => NewObj::Memory { gpu, kind, bytes },
                    Err(st) => return Ok(Err(st)),
                }
            }
            class::NV01_MEMORY_HW_RESOURCES => {
                if dev_gpu.is_none() {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                if p_params == 0 {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                }
                let b = mem
                    .read(p_params, abi::hw_resources::SIZE_OF)
                    .ok_or(libc::EFAULT)?;
                let location = (u32_at(&b, abi::hw_resources::ATTR)
                    >> abi::nvos32::ATTR_LOCATION_SHIFT)
                    & abi::nvos32::ATTR_LOCATION_MASK;
                let size = u64_at(&b, abi::hw_resources::SIZE);
                NewObj::Plain(ObjKind::HwResources {
                    video_bytes: if location == 0 { size } else { 0 },
                })
            }
            c if class::EVENTS.contains(&c) => NewObj::Plain(ObjKind::Other),
            class::NV2081_BINAPI => {
                if parent_kind != Some(ObjKind::Subdevice) {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                NewObj::Plain(ObjKind::Other)
            }
            c if class::USERMODE.contains(&c) => {
                // Allocated under the subdevice (the doorbell/usermode page).
                if parent_kind != Some(ObjKind::Subdevice) {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                NewObj::Plain(ObjKind::Other)
            }
            _ => {
                if dev_gpu.is_none() {
                    return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
                }
                NewObj::Plain(ObjKind::Other)
            }
        };
        Ok(Ok(self.commit(h_root, h_parent, h_new, h_class, pid, new)))
    }

    /// The kind and bytes of a memory class allocated by RM_ALLOC, from its
    /// params (written back where the driver writes them, before anything is
    /// committed).
    fn memory_params(
        &self,
        cls: u32,
        gpu: u32,
        parent_kind: Option<ObjKind>,
        p_params: u64,
        finn: bool,
        mem: &dyn UserMem,
    ) -> Result<St<(MemKind, u64)>, Errno> {
        let needs_params = matches!(
            cls,
            class::NV01_MEMORY_LOCAL_USER
                | class::NV01_MEMORY_SYSTEM
                | class::NV_MEMORY_EXTENDED_USER
                | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
                | class::NV01_MEMORY_LOCAL_PHYSICAL
                | class::NV_MEMORY_FABRIC
                | class::NV_MEMORY_MULTICAST_FABRIC
        );
        if cls == class::NV_MEMORY_FABRIC && parent_kind != Some(ObjKind::Subdevice) {
            return Ok(Err(NV_ERR_INVALID_OBJECT_PARENT));
        }
        if needs_params && p_params == 0 {
            return Ok(Err(NV_ERR_INVALID_ARGUMENT));
        }
        if needs_params && finn {
            return Ok(Err(NV_ERR_NOT_SUPPORTED));
        }
        Ok(Ok(match cls {
            class::NV01_MEMORY_LOCAL_USER
            | class::NV01_MEMORY_SYSTEM
            | class::NV_MEMORY_EXTENDED_USER => {
                let b = mem
                    .read(
                        p_params,
                        abi::branch::memory_allocation_params(self.version),
                    )
                    .ok_or(libc::EFAULT)?;
                let (kind, gran) = match cls {
                    class::NV01_MEMORY_LOCAL_USER => (MemKind::Video, abi::VIDMEM_ROUND),
                    class::NV01_MEMORY_SYSTEM => (MemKind::Host, abi::HOSTMEM_ROUND),
                    _ => (MemKind::Egm, abi::VIDMEM_ROUND),
                };
                let req = u64_at(&b, abi::mem_alloc::SIZE);
                let Some(bytes) = round_up(req, gran).filter(|&b| b > 0) else {
                    return Ok(Err(NV_ERR_INVALID_ARGUMENT));
                };
                if !self.fits(gpu, kind, bytes) {
                    return Ok(Err(NV_ERR_NO_MEMORY));
                }
                if !mem.write(p_params + abi::mem_alloc::SIZE as u64, &bytes.to_le_bytes()) {
                    return Err(libc::EFAULT);
                }
                (kind, bytes)
            }
            class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
                let b = mem
                    .read(p_params, size::OS_DESCRIPTOR_PARAMS)
                    .ok_or(libc::EFAULT)?;
                let limit = u64_at(&b, abi::os_descriptor::LIMIT);
                let Some(bytes) = limit.checked_add(1) else {
                    return Ok(Err(NV_ERR_INVALID_LIMIT));
                };
                if !self.fits(gpu, MemKind::Host, bytes) {
                    return Ok(Err(NV_ERR_NO_MEMORY));
                }
                (MemKind::Host, bytes)
            }
            class::NV01_MEMORY_LOCAL_PHYSICAL => {
                // Privileged; "does not allocate any framebuffer memory":
                // memSize is set to the whole heap.
                mem.read(p_params, size::PHYS_MEM_PARAMS)
                    .ok_or(libc::EFAULT)?;
                let at = p_params + abi::phys_mem::MEM_SIZE as u64;
                if !mem.write(at, &self.cfg.mem_per_gpu.to_le_bytes()) {
                    return Err(libc::EFAULT);
                }
                (MemKind::None, 0)
            }
            class::NV_MEMORY_FABRIC => {
                // A fabric address range; the physical memory is map.hVidMem.
                mem.read(p_params, size::FABRIC_PARAMS)
                    .ok_or(libc::EFAULT)?;
                (MemKind::None, 0)
            }
            class::NV_MEMORY_MULTICAST_FABRIC => {
                let (len, _) = abi::branch::nv00fd(self.version);
                mem.read(p_params, len).ok_or(libc::EFAULT)?;
                (MemKind::None, 0)
            }
            // 0xF9, 0xFB, 0xE0, 0x50A0, 0x70: address ranges or handles;
            // their params are not read.
            _ => (MemKind::None, 0),
        }))
    }

    // ----- RM_ALLOC_MEMORY (nvidiaN) --------------------------------------

    fn rm_alloc_memory(&mut self, gpu: u32, pid: u32, p: &mut [u8]) -> St<()> {
        use abi::nvos02;
        let h_root = u32_at(p, nvos02::H_ROOT);
        let h_parent = u32_at(p, nvos02::H_OBJECT_PARENT);
        let h_new = u32_at(p, nvos02::H_OBJECT_NEW);
        let h_class = u32_at(p, nvos02::H_CLASS);
        // The real driver validates the client against the nvidiactl file
        // registered with REGISTER_FD; any existing client is accepted here.
        let c = self.clients.get(&h_root).ok_or(NV_ERR_INVALID_CLIENT)?;
        let (kind, bytes, limit_out) = match h_class {
            class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
                let limit = u64_at(p, nvos02::LIMIT);
                let bytes = limit.checked_add(1).ok_or(NV_ERR_INVALID_LIMIT)?;
                (MemKind::Host, bytes, None)
            }
            // `_rmAllocMemoryLocalUser`: a 0-byte object, limit = heap - 1.
            class::NV01_MEMORY_LOCAL_USER => (
                MemKind::Video,
                0,
                Some(self.cfg.mem_per_gpu.saturating_sub(1)),
            ),
            class::NV01_MEMORY_LOCAL_PRIVILEGED => (MemKind::Video, 0, Some(0xFFFF_FFFF)),
            _ => return Err(NV_ERR_INVALID_CLASS),
        };
        if h_parent != h_root && !c.objects.contains_key(&h_parent) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        Self::check_new_handle(c, h_root, h_new)?;
        if gpu >= self.cfg.gpus {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        if !self.fits(gpu, kind, bytes) {
            return Err(NV_ERR_NO_MEMORY);
        }
        let handle = self.commit(
            h_root,
            h_parent,
            h_new,
            h_class,
            pid,
            NewObj::Memory { gpu, kind, bytes },
        );
        put_u32(p, nvos02::H_OBJECT_NEW, handle);
        if let Some(l) = limit_out {
            put_u64(p, nvos02::LIMIT, l);
        }
        Ok(())
    }

    // ----- RM_FREE, map/unmap ----------------------------------------------

    fn rm_free(&mut self, fh: u64, p: &[u8]) -> u32 {
        use abi::nvos00;
        let h_root = u32_at(p, nvos00::H_ROOT);
        let h_old = u32_at(p, nvos00::H_OBJECT_OLD);
        let c = match self.owned_client(fh, h_root) {
            Ok(c) => c,
            Err(st) => return st,
        };
        if h_old == h_root {
            self.free_client(h_root);
            NV_OK
        } else if c.objects.contains_key(&h_old) {
            self.free_subtree(h_root, h_old);
            NV_OK
        } else {
            NV_ERR_OBJECT_NOT_FOUND
        }
    }

    fn check_memory(&self, fh: u64, h_client: u32, h_memory: u32) -> u32 {
        match self.owned_client(fh, h_client) {
            Err(st) => st,
            Ok(c) => match c.objects.get(&h_memory).map(|o| o.kind) {
                Some(ObjKind::Memory { .. }) => NV_OK,
                _ => NV_ERR_INVALID_OBJECT_HANDLE,
            },
        }
    }

    // ----- RM_DUP_OBJECT ---------------------------------------------------

    /// NVOS55: a new handle `hObject` in `hClient` under `hParent` for
    /// object `hObjectSrc` of `hClientSrc`. The source client must have been
    /// created by the calling process (NV_ERR_INVALID_CLIENT otherwise); it
    /// may live on another open file of that process. A memory dup is a new
    /// reference to the same memory. Devices, subdevices and other objects
    /// are duplicated as plain objects of the same class (a device keeps its
    /// GPU), with nothing under them.
    fn rm_dup(&mut self, fh: u64, pid: u32, p: &mut [u8]) -> St<()> {
        use abi::nvos55;
        let h_client = u32_at(p, nvos55::H_CLIENT);
        let h_parent = u32_at(p, nvos55::H_PARENT);
        let h_object = u32_at(p, nvos55::H_OBJECT);
        let h_client_src = u32_at(p, nvos55::H_CLIENT_SRC);
        let h_object_src = u32_at(p, nvos55::H_OBJECT_SRC);
        let dst = self.owned_client(fh, h_client)?;
        let src = self
            .clients
            .get(&h_client_src)
            .filter(|c| c.creator_pid == pid)
            .ok_or(NV_ERR_INVALID_CLIENT)?;
        if h_object_src == h_client_src {
            return Err(NV_ERR_NOT_SUPPORTED);
        }
        let so = src
            .objects
            .get(&h_object_src)
            .ok_or(NV_ERR_OBJECT_NOT_FOUND)?;
        let (src_class, src_kind) = (so.class, so.kind);
        Self::check_new_handle(dst, h_client, h_object)?;
        let parent_kind = if h_parent == h_client {
            None
        } else {
            Some(
                dst.objects
                    .get(&h_parent)
                    .ok_or(NV_ERR_INVALID_OBJECT_PARENT)?
                    .kind,
            )
        };
        let dev_gpu = parent_kind.and_then(|_| Self::device_gpu(dst, h_parent));
        let handle = match src_kind {
            ObjKind::Memory { mem, .. } => {
                if dev_gpu != Some(self.memories[&mem].gpu) {
                    return Err(NV_ERR_INVALID_OBJECT_PARENT);
                }
                let handle = if h_object == 0 {
                    self.pick_handle(Some(h_client))
                } else {
                    h_object
                };
                self.add_memory_handle(mem, h_client, h_parent, handle, pid);
                handle
            }
            kind => {
                let ok = match kind {
                    ObjKind::Device { .. } => parent_kind.is_none(),
                    ObjKind::Subdevice => matches!(parent_kind, Some(ObjKind::Device { .. })),
                    _ => dev_gpu.is_some(),
                };
                if !ok {
                    return Err(NV_ERR_INVALID_OBJECT_PARENT);
                }
                self.commit(
                    h_client,
                    h_parent,
                    h_object,
                    src_class,
                    pid,
                    NewObj::Plain(kind),
                )
            }
        };
        put_u32(p, nvos55::H_OBJECT, handle);
        Ok(())
    }

    /// Checks that memory `id` may get a new handle `h` in `client` under
    /// `parent`: the parent exists and has a device on the memory's GPU.
    fn check_import(&self, client: u32, parent: u32, h: u32, id: MemId) -> St<()> {
        let c = &self.clients[&client];
        if parent == client || !c.objects.contains_key(&parent) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        if Self::device_gpu(c, parent) != Some(self.memories[&id].gpu) {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        }
        Self::check_new_handle(c, client, h)
    }

    // ----- RM_CONTROL ------------------------------------------------------

    /// RM_CONTROL: the export/import controls on the client object; any other
    /// command answers status 0 on a valid client/object and does nothing.
    fn rm_control(&mut self, call: &Call, p: &[u8]) -> Result<u32, Errno> {
        use abi::nvos54;
        let h_client = u32_at(p, nvos54::H_CLIENT);
        let h_object = u32_at(p, nvos54::H_OBJECT);
        let cmd = u32_at(p, nvos54::CMD);
        let c = match self.owned_client(call.fh, h_client) {
            Ok(c) => c,
            Err(st) => return Ok(st),
        };
        let want = match cmd {
            ux::EXPORT_OBJECT_TO_FD => size::EXPORT_OBJECT_TO_FD,
            ux::EXPORT_OBJECTS_TO_FD => size::EXPORT_OBJECTS_TO_FD,
            ux::IMPORT_OBJECT_FROM_FD => size::IMPORT_OBJECT_FROM_FD,
            ux::IMPORT_OBJECTS_FROM_FD => size::IMPORT_OBJECTS_FROM_FD,
            _ => return self.answer_control(call, h_client, cmd, p),
        };
        if h_object != h_client {
            // Class 0x0000 controls: not in the command table of other classes.
            return Ok(if c.objects.contains_key(&h_object) {
                NV_ERR_NOT_SUPPORTED
            } else {
                NV_ERR_INVALID_OBJECT_HANDLE
            });
        }
        if u32_at(p, nvos54::FLAGS) & nvos54::FLAGS_FINN_SERIALIZED != 0 {
            return Ok(NV_ERR_NOT_SUPPORTED);
        }
        let ptr = u64_at(p, nvos54::PARAMS);
        if ptr == 0 || u32_at(p, nvos54::PARAMS_SIZE) as usize != want {
            return Ok(NV_ERR_INVALID_ARGUMENT);
        }
        let mut b = call.mem.read(ptr, want).ok_or(libc::EFAULT)?;
        let r = match cmd {
            ux::EXPORT_OBJECT_TO_FD => self.export_one(call, h_client, &b),
            ux::EXPORT_OBJECTS_TO_FD => self.export_many(call, h_client, &b),
            ux::IMPORT_OBJECT_FROM_FD => self.import_one(call, h_client, &mut b),
            _ => self.import_many(call, h_client, &mut b),
        };
        if r.is_ok() && !call.mem.write(ptr, &b) {
            // The real driver copies out after committing; so do we.
            return Err(libc::EFAULT);
        }
        Ok(r.err().unwrap_or(NV_OK))
    }

    /// A control of [`crate::controls`], in the driver's order (see that
    /// module's doc): a known command with the wrong paramsSize (or params
    /// NULL with a size) is refused before the object is looked up; an
    /// unknown object is NV_ERR_INVALID_OBJECT_HANDLE; a command the module
    /// does not answer, or one outside the target's class, is
    /// NV_ERR_NOT_SUPPORTED. The params are copied back only on success.
    fn answer_control(
        &mut self,
        call: &Call,
        h_client: u32,
        cmd: u32,
        p: &[u8],
    ) -> Result<u32, Errno> {
        use abi::nvos54;
        let h_object = u32_at(p, nvos54::H_OBJECT);
        let ptr = u64_at(p, nvos54::PARAMS);
        let given = u32_at(p, nvos54::PARAMS_SIZE) as usize;
        if cmd & 0xffff == 0 {
            // Category and index 0: the driver's "null command", NV_OK.
            return Ok(NV_OK);
        }
        let want = controls::params_size(cmd, self.version);
        if let Some(want) = want
            && controls::checks_params_size(cmd)
            && (given != want || (ptr == 0) != (want == 0))
        {
            return Ok(controls::PARAMS_SIZE_MISMATCH);
        }
        let Some(c) = self.clients.get(&h_client) else {
            return Ok(NV_ERR_INVALID_CLIENT);
        };
        let target = if h_object == h_client {
            controls::Target::Client
        } else {
            match c.objects.get(&h_object) {
                None => return Ok(NV_ERR_INVALID_OBJECT_HANDLE),
                Some(o) => match o.kind {
                    ObjKind::Device { gpu } => controls::Target::Device { gpu },
                    ObjKind::Subdevice => controls::Target::Subdevice {
                        gpu: Self::device_gpu(c, h_object).unwrap_or(0),
                    },
                    _ => controls::Target::Other {
                        class: o.class,
                        gpu: Self::device_gpu(c, h_object),
                    },
                },
            }
        };
        let Some(want) = want else {
            return Ok(NV_ERR_NOT_SUPPORTED);
        };
        if u32_at(p, nvos54::FLAGS) & nvos54::FLAGS_FINN_SERIALIZED != 0 {
            return Ok(NV_ERR_NOT_SUPPORTED);
        }
        if ptr == 0 && want > 0 {
            return Ok(NV_ERR_INVALID_ARGUMENT);
        }
        let mut b = if want == 0 {
            Vec::new()
        } else {
            call.mem.read(ptr, want).ok_or(libc::EFAULT)?
        };
        let view = ClientView {
            driver: self,
            client: h_client,
            caller: call.pid,
        };
        let st = controls::answer(&view, target, cmd, &mut b, call.mem)?;
        if st == NV_OK && want > 0 && !call.mem.write(ptr, &b) {
            return Err(libc::EFAULT);
        }
        Ok(st)
    }

    /// The nvidiactl open file that `fd` (in the caller) refers to.
    fn export_file(&self, call: &Call, fd: i32) -> St<u64> {
        if fd < 0 {
            return Err(NV_ERR_INVALID_PARAMETER);
        }
        match call.fds.fh_of(fd) {
            Some(fh) if self.files.get(&fh) == Some(&FileKind::Ctl) => Ok(fh),
            _ => Err(NV_ERR_INVALID_PARAMETER),
        }
    }

    /// The GPU of export device `h_device` (0: none) in `client`.
    fn export_gpu(&self, client: u32, h_device: u32) -> St<Option<u32>> {
        if h_device == 0 {
            return Ok(None);
        }
        match self.clients[&client].objects.get(&h_device).map(|o| o.kind) {
            None => Err(NV_ERR_OBJECT_NOT_FOUND),
            Some(ObjKind::Device { gpu }) => Ok(Some(gpu)),
            Some(_) => Err(NV_ERR_INVALID_PARAMETER),
        }
    }

    /// The memory handle `h` of `client` names. Exporting another object is
    /// not modelled (NV_ERR_NOT_SUPPORTED).
    fn exported_memory(&self, client: u32, h: u32) -> St<MemId> {
        match self.clients[&client].objects.get(&h).map(|o| o.kind) {
            None => Err(NV_ERR_OBJECT_NOT_FOUND),
            Some(ObjKind::Memory { mem, .. }) => Ok(mem),
            Some(_) => Err(NV_ERR_NOT_SUPPORTED),
        }
    }

    /// 0x3d05: a one-slot export table holding a reference to `hObject`.
    fn export_one(&mut self, call: &Call, client: u32, b: &[u8]) -> St<()> {
        if u32_at(b, ux::EXP1_FLAGS) & ux::FLAGS_EMPTY_FD != 0
            || u32_at(b, ux::EXP1_TYPE) != ux::OBJECT_TYPE_RM
            || u32_at(b, ux::EXP1_FD) as i32 == -1
        {
            return Err(NV_ERR_INVALID_PARAMETER);
        }
        let id = self.exported_memory(client, u32_at(b, ux::EXP1_H_OBJECT))?;
        let fh = self.export_file(call, u32_at(b, ux::EXP1_FD) as i32)?;
        if self.exports.contains_key(&fh) {
            return Err(NV_ERR_STATE_IN_USE);
        }
        let gpu = self.export_gpu(client, u32_at(b, ux::EXP1_H_DEVICE))?;
        self.exports.insert(
            fh,
            ExportFile {
                gpu,
                slots: vec![Some(id)],
            },
        );
        self.memories
            .get_mut(&id)
            .expect("memory exists")
            .export_refs += 1;
        Ok(())
    }

    /// 0x3d0b: objects[i] into slots index+i (0 clears a slot); the table is
    /// made on the first call with maxObjects slots.
    fn export_many(&mut self, call: &Call, client: u32, b: &[u8]) -> St<()> {
        let fh = self.export_file(call, u32_at(b, ux::EXPN_FD) as i32)?;
        let num = u16_at(b, ux::EXPN_NUM_OBJECTS) as usize;
        let index = u16_at(b, ux::EXPN_INDEX) as usize;
        let (gpu, max) = match self.exports.get(&fh) {
            Some(e) => (e.gpu, e.slots.len()),
            None => {
                let max = u16_at(b, ux::EXPN_MAX_OBJECTS) as usize;
                if max == 0 {
                    return Err(NV_ERR_INVALID_PARAMETER);
                }
                (self.export_gpu(client, u32_at(b, ux::EXPN_H_DEVICE))?, max)
            }
        };
        if num > ux::EXPN_MAX {
            return Err(NV_ERR_INVALID_PARAMETER);
        }
        if index + num > max {
            return Err(NV_ERR_OUT_OF_RANGE);
        }
        let mut new = Vec::with_capacity(num);
        for i in 0..num {
            let h = u32_at(b, ux::EXPN_OBJECTS + 4 * i);
            if h == 0 {
                new.push(None);
                continue;
            }
            let id = self.exported_memory(client, h)?;
            if gpu != Some(self.memories[&id].gpu) {
                return Err(NV_ERR_INVALID_PARAMETER);
            }
            new.push(Some(id));
        }
        let e = self.exports.entry(fh).or_insert_with(|| ExportFile {
            gpu,
            slots: vec![None; max],
        });
        let old: Vec<Option<MemId>> = e.slots[index..index + num].to_vec();
        e.slots[index..index + num].copy_from_slice(&new);
        for id in new.iter().flatten() {
            self.memories
                .get_mut(id)
                .expect("memory exists")
                .export_refs += 1;
        }
        let mut touched = BTreeSet::new();
        for id in old.into_iter().flatten() {
            self.memories
                .get_mut(&id)
                .expect("memory exists")
                .export_refs -= 1;
            touched.insert(id);
        }
        self.settle_all(touched);
        Ok(())
    }

    /// The export table of the nvidiactl file `fd` names.
    fn import_table(&self, call: &Call, fd: i32) -> St<&ExportFile> {
        let fh = self.export_file(call, fd)?;
        self.exports.get(&fh).ok_or(NV_ERR_INVALID_PARAMETER)
    }

    /// 0x3d06: a new handle (hObject, 0: the driver picks) under hParent for
    /// the object of a one-slot export table.
    fn import_one(&mut self, call: &Call, client: u32, b: &mut [u8]) -> St<()> {
        let fd = u32_at(b, ux::IMP1_FD) as i32;
        if u32_at(b, ux::IMP1_TYPE) != ux::OBJECT_TYPE_RM || fd == -1 {
            return Err(NV_ERR_INVALID_PARAMETER);
        }
        let e = self.import_table(call, fd)?;
        let id = match e.slots.as_slice() {
            [Some(id)] => *id,
            _ => return Err(NV_ERR_INVALID_PARAMETER),
        };
        let parent = u32_at(b, ux::IMP1_H_PARENT);
        let h = u32_at(b, ux::IMP1_H_OBJECT);
        self.check_import(client, parent, h, id)?;
        let h = if h == 0 {
            self.pick_handle(Some(client))
        } else {
            h
        };
        self.add_memory_handle(id, client, parent, h, call.pid);
        put_u32(b, ux::IMP1_H_OBJECT, h);
        Ok(())
    }

    /// 0x3d0c: for each slot index+i holding an object, a new handle
    /// objects[i] (0: the driver picks) under hParent; objectTypes[i] says
    /// what it is (0 for an empty slot). All or nothing.
    fn import_many(&mut self, call: &Call, client: u32, b: &mut [u8]) -> St<()> {
        let e = self.import_table(call, u32_at(b, ux::IMPN_FD) as i32)?;
        let num = u16_at(b, ux::IMPN_NUM_OBJECTS) as usize;
        let index = u16_at(b, ux::IMPN_INDEX) as usize;
        if num > ux::IMPN_MAX {
            return Err(NV_ERR_INVALID_PARAMETER);
        }
        if index + num > e.slots.len() {
            return Err(NV_ERR_OUT_OF_RANGE);
        }
        let slots: Vec<Option<MemId>> = e.slots[index..index + num].to_vec();
        let parent = u32_at(b, ux::IMPN_H_PARENT);
        let mut chosen = BTreeSet::new();
        for (i, slot) in slots.iter().enumerate() {
            let Some(id) = slot else { continue };
            let h = u32_at(b, ux::IMPN_OBJECTS + 4 * i);
            self.check_import(client, parent, h, *id)?;
            if h != 0 && !chosen.insert(h) {
                return Err(NV_ERR_INSERT_DUPLICATE_NAME);
            }
        }
        for (i, slot) in slots.into_iter().enumerate() {
            let Some(id) = slot else {
                b[ux::IMPN_OBJECT_TYPES + i] = ux::IMPORT_TYPE_NONE;
                continue;
            };
            let mut h = u32_at(b, ux::IMPN_OBJECTS + 4 * i);
            while h == 0 || (u32_at(b, ux::IMPN_OBJECTS + 4 * i) == 0 && chosen.contains(&h)) {
                h = self.pick_handle(Some(client));
            }
            self.add_memory_handle(id, client, parent, h, call.pid);
            put_u32(b, ux::IMPN_OBJECTS + 4 * i, h);
            b[ux::IMPN_OBJECT_TYPES + i] = import_type(self.memories[&id].class);
        }
        Ok(())
    }

    // ----- RM_VID_HEAP_CONTROL ----------------------------------------------

    fn vid_heap(&mut self, fh: u64, pid: u32, p: &mut [u8]) -> St<()> {
        use abi::nvos32;
        let h_root = u32_at(p, nvos32::H_ROOT);
        let h_parent = u32_at(p, nvos32::H_OBJECT_PARENT);
        let function = u32_at(p, nvos32::FUNCTION);
        let c = self.owned_client(fh, h_root)?;
        let (h_mem_off, (cls, kind, bytes)) = match function {
            nvos32::FUNCTION_ALLOC_SIZE | nvos32::FUNCTION_ALLOC_SIZE_RANGE => {
                let range = function == nvos32::FUNCTION_ALLOC_SIZE_RANGE;
                let size_off = if range {
                    nvos32::RANGE_SIZE
                } else {
                    nvos32::SIZE
                };
                let flags = u32_at(p, nvos32::ALLOC_FLAGS);
                let attr = u32_at(p, nvos32::ATTR);
                let attr2 = u32_at(p, nvos32::ATTR2);
                // rmapi_deprecated_vidheapctrl.c:136-145
                let (cls, kind) = if flags & nvos32::FLAGS_VIRTUAL != 0 {
                    (class::NV50_MEMORY_VIRTUAL, MemKind::None)
                } else if !range
                    && self.major >= nvos32::EGM_SINCE
                    && attr2 & nvos32::ATTR2_USE_EGM != 0
                {
                    (class::NV_MEMORY_EXTENDED_USER, MemKind::Egm)
                } else if (attr >> nvos32::ATTR_LOCATION_SHIFT) & nvos32::ATTR_LOCATION_MASK == 0 {
                    (class::NV01_MEMORY_LOCAL_USER, MemKind::Video)
                } else {
                    (class::NV01_MEMORY_SYSTEM, MemKind::Host)
                };
                let gran = if kind == MemKind::Host {
                    abi::HOSTMEM_ROUND
                } else {
                    abi::VIDMEM_ROUND
                };
                let rounded = round_up(u64_at(p, size_off), gran)
                    .filter(|&b| b > 0)
                    .ok_or(NV_ERR_INVALID_ARGUMENT)?;
                (nvos32::H_MEMORY, (cls, kind, (rounded, size_off)))
            }
            nvos32::FUNCTION_ALLOC_OS_DESCRIPTOR => {
                let limit = u64_at(p, nvos32::OS_DESC_LIMIT);
                let bytes = limit.checked_add(1).ok_or(NV_ERR_INVALID_LIMIT)?;
                (
                    nvos32::OS_DESC_H_MEMORY,
                    (
                        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
                        MemKind::Host,
                        (bytes, 0),
                    ),
                )
            }
            nvos32::FUNCTION_FREE => {
                let h_memory = u32_at(p, nvos32::H_MEMORY);
                if h_memory == h_root || !c.objects.contains_key(&h_memory) {
                    return Err(NV_ERR_OBJECT_NOT_FOUND);
                }
                self.free_subtree(h_root, h_memory);
                return Ok(());
            }
            _ => return Err(NV_ERR_NOT_SUPPORTED),
        };
        let (bytes, size_off) = bytes;
        let gpu = Self::device_gpu(c, h_parent).ok_or(NV_ERR_INVALID_OBJECT_PARENT)?;
        let h_memory = u32_at(p, h_mem_off);
        Self::check_new_handle(c, h_root, h_memory)?;
        if !self.fits(gpu, kind, bytes) {
            return Err(NV_ERR_NO_MEMORY);
        }
        let handle = self.commit(
            h_root,
            h_parent,
            h_memory,
            cls,
            pid,
            NewObj::Memory { gpu, kind, bytes },
        );
        put_u32(p, h_mem_off, handle);
        if size_off != 0 {
            put_u64(p, size_off, bytes);
        }
        if function != nvos32::FUNCTION_ALLOC_OS_DESCRIPTOR {
            put_u64(p, nvos32::TOTAL, self.cfg.mem_per_gpu);
            put_u64(
                p,
                nvos32::FREE,
                self.cfg.mem_per_gpu - self.gpus[gpu as usize].used,
            );
        }
        Ok(())
    }
    // ----- nvidia-uvm -----------------------------------------------------

    fn uvm_ioctl(&mut self, fh: u64, cmd: u32, arg: u64, mem: &dyn UserMem) -> EscResult {
        use abi::uvm::*;
        // (params size to read, rmStatus offset) for the commands whose
        // layout is known.
        let layout: Option<(usize, usize)> = match cmd {
            INITIALIZE => Some((INITIALIZE_SIZE, INITIALIZE_RM_STATUS)),
            DEINITIALIZE => return Ok(None),
            CREATE_RANGE_GROUP => Some((CREATE_RANGE_GROUP_SIZE, CREATE_RANGE_GROUP_RM_STATUS)),
            DESTROY_RANGE_GROUP => Some((DESTROY_RANGE_GROUP_SIZE, DESTROY_RANGE_GROUP_RM_STATUS)),
            REGISTER_GPU_VASPACE => {
                Some((REGISTER_GPU_VASPACE_SIZE, REGISTER_GPU_VASPACE_RM_STATUS))
            }
            UNREGISTER_GPU_VASPACE | UNREGISTER_GPU => {
                Some((UUID_STATUS_SIZE, UUID_STATUS_RM_STATUS))
            }
            REGISTER_CHANNEL => Some((REGISTER_CHANNEL_SIZE, REGISTER_CHANNEL_RM_STATUS)),
            UNREGISTER_CHANNEL => Some((UNREGISTER_CHANNEL_SIZE, UNREGISTER_CHANNEL_RM_STATUS)),
            CREATE_EXTERNAL_RANGE | VALIDATE_VA_RANGE => {
                Some((BASE_LENGTH_STATUS_SIZE, BASE_LENGTH_STATUS_RM_STATUS))
            }
            // The layouts that moved between branches.
            FREE => Some(abi::branch::uvm_free(self.version)),
            MAP_EXTERNAL_ALLOCATION => Some(abi::branch::uvm_map_external(self.version)),
            ALLOC_SEMAPHORE_POOL => Some(abi::branch::uvm_semaphore_pool(self.version)),
            REGISTER_GPU => Some((REGISTER_GPU_SIZE, REGISTER_GPU_RM_STATUS)),
            PAGEABLE_MEM_ACCESS => Some((PAGEABLE_MEM_ACCESS_SIZE, PAGEABLE_MEM_ACCESS_RM_STATUS)),
            UNMAP_EXTERNAL => Some((UNMAP_EXTERNAL_SIZE, UNMAP_EXTERNAL_RM_STATUS)),
            MM_INITIALIZE => Some((MM_INITIALIZE_SIZE, MM_INITIALIZE_RM_STATUS)),
            1..=MAX_PLAIN => return Ok(None),
            _ => return Err(libc::EINVAL),
        };
        let read_len = layout.map(|(s, _)| s).unwrap_or(16);
        let b = mem.read(arg, read_len).ok_or(libc::EFAULT)?;
        let base = u64_at(&b, BASE);
        let length = u64_at(&b, LENGTH);
        let file = self.uvm.entry(fh).or_default();
        let mut extra: Option<(usize, Vec<u8>)> = None;
        let st = match cmd {
            INITIALIZE => {
                file.initialized = true;
                NV_OK
            }
            CREATE_RANGE_GROUP => {
                let id = self.next_range_group;
                self.next_range_group += 1;
                extra = Some((CREATE_RANGE_GROUP_ID, id.to_le_bytes().to_vec()));
                NV_OK
            }
            CREATE_EXTERNAL_RANGE => {
                let end = base.saturating_add(length);
                let overlaps = file
                    .ranges
                    .range(..end)
                    .next_back()
                    .is_some_and(|(b, (l, _))| b.saturating_add(*l) > base);
                if length == 0 || overlaps {
                    // Overlaps: NV_ERR_UVM_ADDRESS_IN_USE, as uvm does.
                    if length == 0 {
                        NV_ERR_INVALID_ARGUMENT
                    } else {
                        NV_ERR_UVM_ADDRESS_IN_USE
                    }
                } else {
                    file.ranges.insert(base, (length, false));
                    NV_OK
                }
            }
            // Into a range CREATE_EXTERNAL_RANGE made (uvm_api_map_external_allocation
            // finds no range otherwise: NV_ERR_INVALID_ADDRESS).
            MAP_EXTERNAL_ALLOCATION => match file.ranges.get_mut(&base) {
                Some(r) => {
                    r.1 = true;
                    NV_OK
                }
                None => NV_ERR_INVALID_ADDRESS,
            },
            UNMAP_EXTERNAL => {
                if let Some(r) = file.ranges.get_mut(&base) {
                    r.1 = false;
                }
                NV_OK
            }
            FREE => {
                if file.ranges.remove(&base).is_some() {
                    NV_OK
                } else {
                    NV_ERR_INVALID_ADDRESS
                }
            }
            _ => NV_OK,
        };
        let Some((_, status_off)) = layout else {
            return Ok(Some(st));
        };
        if let Some((off, bytes)) = extra
            && !mem.write(arg + off as u64, &bytes)
        {
            return Err(libc::EFAULT);
        }
        if !mem.write(arg + status_off as u64, &st.to_le_bytes()) {
            return Err(libc::EFAULT);
        }
        Ok(Some(st))
    }

    // ----- ground truth ----------------------------------------------------

    /// The ground truth, as serialized into `nvsim-state.json`.
    pub fn state(&self) -> State {
        State {
            driver_version: self.cfg.driver_version.clone(),
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| GpuState {
                    index: i as u32,
                    capacity_bytes: self.cfg.mem_per_gpu,
                    used_bytes: g.used,
                    host_bytes: g.host,
                    egm_bytes: g.egm,
                })
                .collect(),
            processes: self
                .procs
                .iter()
                .map(|(pid, gpus)| ProcessState {
                    pid: *pid,
                    gpus: gpus
                        .iter()
                        .map(|(gpu, pg)| ProcGpuState {
                            gpu: *gpu,
                            bytes: pg.bytes,
                            peak_bytes: pg.peak_bytes,
                            host_bytes: pg.host_bytes,
                            egm_bytes: pg.egm_bytes,
                            driver_video_bytes: pg.driver_video_bytes,
                            pid_info_video_bytes: self.pid_info_video_bytes(*pid, *gpu),
                            allocs: pg.allocs,
                            frees: pg.frees,
                        })
                        .collect(),
                })
                .collect(),
            clients: self
                .clients
                .iter()
                .map(|(h, c)| ClientState {
                    handle: *h,
                    fh: c.fh,
                    creator_pid: c.creator_pid,
                    objects: c.objects.len() as u64,
                })
                .collect(),
            ioctls: IoctlCounts {
                total: self.ioctl_total,
                failed: self.ioctl_failed,
            },
            received: self.received.values().cloned().collect(),
            uvm_ranges: self.uvm.values().map(|u| u.ranges.len() as u64).sum(),
            memories: self
                .memories
                .iter()
                .map(|(id, m)| MemoryState {
                    id: *id,
                    gpu: m.gpu,
                    class: m.class,
                    kind: m.kind,
                    bytes: m.bytes,
                    charged_pid: m.charged_pid,
                    driver_pid: m.driver_pid,
                    handles: m.handles.len() as u64,
                    export_refs: m.export_refs as u64,
                })
                .collect(),
        }
    }

    /// `nvsim-state.json` text.
    pub fn state_json(&self) -> String {
        let mut s = serde_json::to_string(&self.state()).expect("state serializes");
        s.push('\n');
        s
    }

    /// Ground truth for one (pid, GPU), if that process has an entry there.
    pub fn proc_gpu(&self, pid: u32, gpu: u32) -> Option<ProcGpu> {
        self.procs.get(&pid)?.get(&gpu).copied()
    }

    /// Video bytes in use on `gpu`.
    pub fn gpu_used(&self, gpu: u32) -> u64 {
        self.gpus[gpu as usize].used
    }

    /// Host bytes attributed to `gpu`.
    pub fn gpu_host(&self, gpu: u32) -> u64 {
        self.gpus[gpu as usize].host
    }

    /// EGM bytes on `gpu`.
    pub fn gpu_egm(&self, gpu: u32) -> u64 {
        self.gpus[gpu as usize].egm
    }

    /// Number of live memories (0-byte ones included).
    pub fn memory_count(&self) -> usize {
        self.memories.len()
    }

    /// Whether client `h` exists.
    pub fn has_client(&self, h: u32) -> bool {
        self.clients.contains_key(&h)
    }

    /// Number of objects (not counting the client) in client `h`.
    pub fn client_objects(&self, h: u32) -> Option<usize> {
        self.clients.get(&h).map(|c| c.objects.len())
    }

    /// Class of object `obj` in client `client`.
    pub fn object_class(&self, client: u32, obj: u32) -> Option<u32> {
        self.clients
            .get(&client)?
            .objects
            .get(&obj)
            .map(|o| o.class)
    }
}

/// The caller of one ioctl.
struct Call<'a> {
    fh: u64,
    file: FileKind,
    pid: u32,
    mem: &'a dyn UserMem,
    fds: &'a dyn FdResolver,
}

/// The fields of an RM_ALLOC request.
struct AllocReq {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_params: u64,
    finn: bool,
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;

/// What the answers of [`crate::controls`] need to know of the driver state,
/// seen from the client a control was sent to.
struct ClientView<'d> {
    driver: &'d Driver,
    client: u32,
    /// The process that sent the control (its pid in the initial namespace).
    caller: u32,
}

impl controls::View for ClientView<'_> {
    fn config(&self) -> &Config {
        &self.driver.cfg
    }

    /// Creators of the clients that hold an object of `class` under a device
    /// of `gpu` (GPU_GET_PIDS by class: the driver walks every client and
    /// lists the process of each that owns such an object), as the caller's
    /// pid namespace sees them; those it cannot see are left out
    /// (`_gpuConvertPid`, every branch).
    fn pids_with_class(&self, gpu: u32, class: u32) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .driver
            .clients
            .values()
            .filter(|c| {
                c.objects
                    .iter()
                    .any(|(h, o)| o.class == class && Driver::device_gpu(c, *h) == Some(gpu))
            })
            .filter_map(|c| (self.driver.ns_pid)(c.creator_pid, self.caller))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// `pid` is matched with the clients' creators in the initial namespace
    /// up to 560, in the caller's from 565 (`_gpuMatchClientPid`): a caller in
    /// a container asking for a pid GPU_GET_PIDS gave it gets 0 before 565.
    fn video_bytes_of(&self, pid: u32, gpu: u32) -> u64 {
        let d = self.driver;
        if !abi::branch::pid_info_in_callers_namespace(d.version) {
            return d.pid_info_video_bytes(pid, gpu);
        }
        let mut creators: Vec<u32> = d
            .clients
            .values()
            .map(|c| c.creator_pid)
            .filter(|&p| (d.ns_pid)(p, self.caller) == Some(pid))
            .collect();
        creators.sort_unstable();
        creators.dedup();
        creators
            .into_iter()
            .map(|p| d.pid_info_video_bytes(p, gpu))
            .sum()
    }

    fn free_bytes(&self, gpu: u32) -> u64 {
        self.driver
            .cfg
            .mem_per_gpu
            .saturating_sub(self.driver.gpu_used(gpu))
    }

    fn object_class(&self, handle: u32) -> Option<u32> {
        let c = self.driver.clients.get(&self.client)?;
        if handle == self.client {
            return Some(class::NV01_ROOT_CLIENT);
        }
        c.objects.get(&handle).map(|o| o.class)
    }
}
