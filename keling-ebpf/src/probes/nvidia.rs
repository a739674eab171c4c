//! NVIDIA driver ioctls: decoded at entry (inputs) and exit (what the driver
//! returned), following XFER_CMD, and turned into exact accounting.
//!
//! Two backends see the calls, chosen by the agent at start; everything after
//! "this is an NVIDIA call on this file" ([`enter`], [`exit`]) is the same code:
//! - the syscall tracepoints (`sys_enter_ioctl`, `sys_exit_ioctl`), which work
//!   everywhere, the simulated driver included. Only ioctls whose command has the
//!   shape of an RM escape or a UVM command are looked at further, and only on
//!   files that are NVIDIA devices by their inode (files.rs): any other ioctl on
//!   the host costs one comparison at entry and one array load at exit, on top of
//!   the syscall tracepoints' own cost, which every ioctl pays once they are
//!   attached.
//! - the driver entry (`keling_driver_ioctl_entry` and `_return`: a kprobe and a
//!   kretprobe on the NVIDIA modules' `unlocked_ioctl` file operations), where the
//!   kernel allows kprobes and the modules are loaded: only NVIDIA calls reach
//!   them, so every other ioctl on the host pays nothing at all. The kernel hands
//!   them the open file; the fd comes from the syscall's saved registers.
//!
//! The kernel tail-calls only between programs of one type, so the handler
//! programs exist in both types (the `_kprobe` ones), each in its own program
//! array ([`IoctlCalls`]).
//!
//! Every call of a followed process is also counted at entry in `CALL_COUNTS`,
//! by RM escape, UVM command and RM_CONTROL command (keling-common's `call_kind`):
//! what the process sent, exact whatever the ring buffer drops.
use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_probe_read_user},
    macros::{kprobe, kretprobe, map, tracepoint, uretprobe},
    maps::{Array, HashMap, ProgramArray},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use keling_common::{
    BATCH_OBJECTS, ClientInfo, EventKind, GpuAllocEvent, GpuExportEvent, GpuFreeEvent,
    GpuIoctlEvent, GpuObjectEvent, GpuRefEvent, MAX_CALL_KEYS, MemHandle, NO_GPU, ObjectInfo,
    ObjectKey, active_cause, call_key, call_kind, device_file, mem_kind,
    nvidia::{
        self, MEMORY_ALLOCATION_PARAMS_SIZE, NV0080_DEVICE_ID, OS_DESC_LIMIT, ObjectKind, class,
        ctrl, escape, nvos00, nvos02, nvos05, nvos21, nvos32, nvos33, nvos34, nvos54, nvos55,
        nvos64, size, uvm, xfer,
    },
    open_how, outcome, ref_how, table_full, tail_call, teardown, undecoded,
};

use super::{
    accounting::{
        CLIENTS, NO_BYTES_EXPORT, OBJECTS, add_handle, charge_new, claim_charge, export_memory,
        exported, free_mem_handle, link_shared, new_client, queue_teardown, scratch_object, share,
    },
    deferred::{self, Scope, TailCalls},
    files::{
        FILES, add_fd, device_of_file, fd_table_changes, file_in_table, file_of_fd, find_slot,
        follows, proc_fds,
    },
};
use crate::{
    atomic_add, count_table_full, count_undecoded, current_ids, emit, emit_quiet, header, kread,
    syscall_arg, syscall_ret, table_full_at, task_ids,
};

/// What the entry learned, for the exit.
#[derive(Clone, Copy)]
struct PendingIoctl {
    /// User address of the escape's params (after following XFER).
    params: u64,
    /// `pAllocParms` (RM_ALLOC), or RM_CONTROL's params pointer; else 0.
    sub_params: u64,
    /// The open file the call was made on.
    file_id: u64,
    /// Export / import controls: the export file the params name.
    aux_file: u64,
    cmd: u32,
    /// RM escape nr, or the UVM command.
    escape: u32,
    /// Params size (from the command, or XFER's size).
    size: u32,
    device: u32,
    fd: i32,
    client: u32,
    parent: u32,
    /// Handle (in; RM may choose it and write it back) or object freed.
    handle: u32,
    class: u32,
    /// GPU from the params (device alloc) or the fd (nvidiaN).
    gpu: u32,
    /// RM_CONTROL command, or VID_HEAP function.
    sub: u32,
    /// RM_CONTROL's params size; RM_DUP_OBJECT's source client.
    aux: u32,
    /// RM_DUP_OBJECT's source handle.
    aux2: u32,
    via_xfer: u32,
    /// 0, or 1 + an undecoded reason found at entry.
    undecoded: u32,
    /// The caller.
    pid: u32,
    tid: u32,
    /// Filled at exit: ioctl's return value; the new object's memory kind and bytes.
    ret: i64,
    mem_kind: u32,
    /// 1 once RM_CONTROL's command (`sub`) was read at entry.
    has_control: u32,
    bytes: u64,
}

#[map]
static PENDING_IOCTL: HashMap<u32, PendingIoctl> =
    HashMap::with_max_entries(keling_common::MAX_PENDING, 0);

/// [0]: entries in `PENDING_IOCTL` now, at least (added to before an insert,
/// taken from after a remove that found one; an insert over a stale entry counts
/// twice, which only costs speed). While it is 0, `sys_exit_ioctl` returns before
/// any helper call or hash lookup: the exit of every ioctl that is not an NVIDIA
/// call in flight costs one array load (the verifier inlines array lookups).
#[map]
static IN_FLIGHT: Array<u64> = Array::with_max_entries(1, 0);

/// The pending entry of `tid` is gone: one fewer in flight.
#[inline(always)]
fn pending_removed(tid: u32) {
    if PENDING_IOCTL.remove(tid).is_ok()
        && let Some(n) = IN_FLIGHT.get_ptr_mut(0)
    {
        // SAFETY: a map value pointer; every CPU changes it only atomically.
        unsafe { atomic_add(n, u64::MAX) };
    }
}

/// nvidiaN open file -> the nvidiactl open file it was registered with
/// (REGISTER_FD): calls through the former act on clients of the latter. LRU: an
/// nvidiaN file's release is not followed, so old entries make room.
#[map]
static REGISTERED: aya_ebpf::maps::LruHashMap<u64, u64> =
    aya_ebpf::maps::LruHashMap::with_max_entries(keling_common::MAX_FILES, 0);

/// Calls of followed processes by `call_key(kind, number)`: what they sent, counted
/// at entry. Updated with atomic adds (one process's threads call on several
/// CPUs at once). `keling trace` only: the agent (`active::limited`) counts none.
#[map]
static CALL_COUNTS: HashMap<u64, u64> = HashMap::with_max_entries(MAX_CALL_KEYS, 0);

/// [0]: calls not in `CALL_COUNTS` because it was full when their key was new.
#[map]
static CALLS_UNCOUNTED: Array<u64> = Array::with_max_entries(1, 0);

const BPF_NOEXIST: u64 = 1;

/// Where the entry builds a [`PendingIoctl`] (it does not fit the stack with the
/// rest), per CPU.
#[map]
static SCRATCH_IOCTL: aya_ebpf::maps::PerCpuArray<PendingIoctl> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// A table answer [`enter`] found: `pid`'s `fd` is `file`, NVIDIA device
/// `device`, while `FD_TABLE_CHANGES` was `changes`.
#[derive(Clone, Copy)]
#[repr(C)]
struct FdMemo {
    file: u64,
    changes: u64,
    pid: u32,
    fd: i32,
    device: u32,
    _reserved: u32,
}

/// Per CPU: the last [`FdMemo`]. A process's calls come back to the same CPU on
/// the same few fds again and again.
#[map]
static FD_MEMO: aya_ebpf::maps::PerCpuArray<FdMemo> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn user<T>(addr: u64) -> Result<T, u32> {
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|_| undecoded::FAULT)
}

#[inline(always)]
fn user_u32(base: u64, off: usize) -> Result<u32, u32> {
    user::<u32>(base + off as u64)
}

#[inline(always)]
fn user_u64(base: u64, off: usize) -> Result<u64, u32> {
    user::<u64>(base + off as u64)
}

/// The first `N` 32-bit words of a parameter struct, in one read: a helper call
/// costs far more than the bytes, and the fields every call needs sit together at
/// the start. Indexed by byte offset (`w[off / 4]`, via [`word`] and [`dword`]).
#[inline(always)]
fn user_words<const N: usize>(base: u64) -> Result<[u32; N], u32> {
    user::<[u32; N]>(base)
}

#[inline(always)]
fn word<const N: usize>(w: &[u32; N], off: usize) -> u32 {
    w[off / 4]
}

/// A little-endian u64 at byte offset `off` of `w` (8-aligned in every struct).
#[inline(always)]
fn dword<const N: usize>(w: &[u32; N], off: usize) -> u64 {
    w[off / 4] as u64 | (w[off / 4 + 1] as u64) << 32
}

/// The command has the shape of an RM escape ('F') or a UVM command (a plain
/// number up to UVM_IS_8_SUPPORTED, or INITIALIZE / DEINITIALIZE): worth looking at
/// the file.
#[inline(always)]
fn nvidia_shaped(cmd: u32) -> bool {
    nvidia::rm_type(cmd) == nvidia::RM_IOCTL_TYPE
        || (cmd != 0 && cmd <= uvm::IS_8_SUPPORTED)
        || cmd == uvm::INITIALIZE
        || cmd == uvm::DEINITIALIZE
}

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> i32 {
    // sys_enter_ioctl(fd, cmd, arg).
    let cmd = syscall_arg(&ctx, 1) as u32;
    if !nvidia_shaped(cmd) {
        return 0;
    }
    let (fd, arg) = (syscall_arg(&ctx, 0) as i32, syscall_arg(&ctx, 2));
    // One helper call for the task, then loads for its fd table and its ids.
    // SAFETY: no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as u64;
    let file = file_in_table(task, fd);
    if file != 0 {
        // SAFETY: the current task, BTF-typed.
        enter(unsafe { task_ids(task) }, fd, file, cmd, arg);
    }
    0
}

/// The driver-entry backend's entry: `unlocked_ioctl(struct file *, unsigned int
/// cmd, unsigned long arg)` of nvidia.ko or nvidia-uvm.ko. Every call here is an
/// NVIDIA call.
#[kprobe]
pub fn keling_driver_ioctl_entry(ctx: ProbeContext) -> u32 {
    let (Some(file), Some(cmd), Some(arg)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2))
    else {
        return 0;
    };
    let cmd = cmd as u32;
    // The same calls as the tracepoints look at.
    if nvidia_shaped(cmd)
        && let Some(fd) = ioctl_syscall_fd()
    {
        enter(current_ids(), fd, file, cmd, arg);
    }
    0
}

/// The fd of the ioctl(2) that led into the driver, from the user registers the
/// kernel saved at syscall entry; `None` for any other way into the driver (a
/// 32-bit process's compat ioctl, whose params have another layout, or none
/// known: the tracepoint backend does not see those either).
#[inline(always)]
fn ioctl_syscall_fd() -> Option<i32> {
    if config!(regs_arg0_off) == config!(regs_syscall_nr_off) {
        return None; // no registers' layout for this kernel
    }
    // SAFETY: these helpers have no preconditions; the registers are read with
    // checked kernel reads.
    let regs = unsafe {
        aya_ebpf::helpers::bpf_task_pt_regs(aya_ebpf::helpers::bpf_get_current_task_btf())
    } as u64;
    // x86-64's pt_regs has `di` just before `orig_ax`: then one read.
    let (fd, nr) = if config!(regs_syscall_nr_off) == config!(regs_arg0_off) + 8 {
        let pair = kread::<[u64; 2]>(regs, config!(regs_arg0_off))?;
        (pair[0], pair[1])
    } else {
        (
            kread::<u64>(regs, config!(regs_arg0_off))?,
            kread::<u64>(regs, config!(regs_syscall_nr_off))?,
        )
    };
    (nr == u64::from(config!(ioctl_syscall_nr))).then_some(fd as i32)
}

/// An NVIDIA-shaped call of the current thread (`(pid, tid)`) on `fd`, whose
/// open file is `file`: looked at if the file is an NVIDIA device the agent
/// follows, decoded, and left pending for [`exit`].
#[inline(always)]
fn enter((pid, tid): (u32, u32), fd: i32, file: u64, cmd: u32, arg: u64) {
    // The device from the process's table when it names this very file: this
    // CPU's last answer while no known fd has left any table since.
    let mut device = device_file::NONE;
    let mut known = false;
    let changes = fd_table_changes();
    let memo = FD_MEMO.get_ptr_mut(0);
    // SAFETY: this CPU's slot; programs that decode calls do not nest on a CPU.
    if let Some(m) = memo.map(|m| unsafe { &*m })
        && m.file == file
        && m.pid == pid
        && m.fd == fd
        && m.changes == changes
    {
        device = m.device;
        known = true;
    } else if let Some(fds) = proc_fds(pid, false)
        && let Some(i) = find_slot(fds, fd)
    {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id == file {
            device = s.device;
            known = true;
            if let Some(m) = memo {
                // SAFETY: as above.
                unsafe {
                    *m = FdMemo {
                        file,
                        changes,
                        pid,
                        fd,
                        device,
                        _reserved: 0,
                    }
                };
            }
        }
    }
    if !known {
        device = device_of_file(file);
    }
    if device == device_file::NONE {
        return;
    }
    let followed = follows(pid);
    if !followed && FILES.get_ptr(file).is_none() {
        // `keling trace`: an untracked process, on a file no traced client lives on.
        return;
    }
    if !known {
        // Followed, or (`keling trace`) a process outside the trace using a traced
        // client's file: its table then says when it lets the file go.
        add_fd(fd, device, file, open_how::FIRST_USE, -1);
    }
    let Some(p) = SCRATCH_IOCTL.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot; the program runs to completion on this CPU.
    let p = unsafe { &mut *p };
    *p = PendingIoctl {
        params: arg,
        sub_params: 0,
        file_id: file,
        aux_file: 0,
        cmd,
        escape: 0,
        size: 0,
        device,
        fd,
        client: 0,
        parent: 0,
        handle: 0,
        class: 0,
        gpu: if device <= device_file::MAX_GPU {
            device
        } else {
            NO_GPU
        },
        sub: 0,
        aux: 0,
        aux2: 0,
        via_xfer: 0,
        undecoded: 0,
        pid,
        tid,
        ret: 0,
        mem_kind: 0,
        has_control: 0,
        bytes: 0,
    };
    if let Err(reason) = decode_enter(p) {
        p.undecoded = 1 + reason;
    }
    if super::active::limited() {
        // The long-running agent asks nothing of a plain call's result (only
        // memory, and activity): its activity is reported now and it leaves no
        // pending entry, so its exit costs one array read. Calls with a handler,
        // REGISTER_FD (its exit records the pairing) and undecoded ones (their
        // count) take the full path.
        if p.undecoded == 0
            && handler(p) == 0
            && (p.device == device_file::UVM || p.escape != escape::REGISTER_FD)
        {
            super::active::report(pid, tid, active_cause::IOCTL);
            return;
        }
    } else if followed {
        // Exact call counts are `keling trace`'s summary; the long-running agent
        // reads none, and is spared two hash updates a call.
        count_calls(p);
    }
    // Counted first: an exit never finds an entry the count does not include.
    let Some(n) = IN_FLIGHT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value pointer; every CPU changes it only atomically.
    unsafe { atomic_add(n, 1) };
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    if PENDING_IOCTL.insert(tid, &*p, 0).is_err() {
        // SAFETY: as above.
        unsafe { atomic_add(n, u64::MAX) };
    }
}

/// Reads the inputs of the call described by `p.cmd`/`p.params`.
#[inline(never)]
fn decode_enter(p: &mut PendingIoctl) -> Result<(), u32> {
    if p.device == device_file::UVM {
        p.escape = p.cmd;
        return Ok(());
    }
    if nvidia::rm_type(p.cmd) != nvidia::RM_IOCTL_TYPE {
        return Err(undecoded::UNKNOWN_ESCAPE);
    }
    p.escape = nvidia::rm_nr(p.cmd);
    p.size = nvidia::rm_size(p.cmd);
    if p.escape == escape::XFER_CMD {
        if p.size != size::XFER {
            return Err(undecoded::UNKNOWN_LAYOUT);
        }
        let w = user_words::<4>(p.params)?;
        p.escape = word(&w, xfer::CMD) & 0xff;
        p.size = word(&w, xfer::SIZE);
        p.params = dword(&w, xfer::PTR);
        p.via_xfer = 1;
    }
    let base = p.params;
    match p.escape {
        escape::ALLOC => {
            let flags_off = match p.size {
                size::NVOS21_ALLOC => None,
                size::NVOS64_ALLOC => Some(nvos64::FLAGS),
                nvos64::SIZE_PRE_535 => Some(nvos64::FLAGS_PRE_535),
                _ => return Err(undecoded::UNKNOWN_LAYOUT),
            };
            if let Some(off) = flags_off
                && user_u32(base, off)? & nvos64::FLAGS_FINN_SERIALIZED != 0
            {
                return Err(undecoded::FINN_SERIALIZED);
            }
            let w = user_words::<6>(base)?;
            p.client = word(&w, nvos21::H_ROOT);
            p.parent = word(&w, nvos21::H_OBJECT_PARENT);
            p.class = word(&w, nvos21::H_CLASS);
            p.sub_params = dword(&w, nvos21::P_ALLOC_PARMS);
            if p.class == class::NV01_DEVICE_0 {
                p.gpu = device_gpu(p.sub_params)?;
            }
        }
        escape::ALLOC_OBJECT => {
            // NVOS21's first 16 bytes, no params: `sub_params` stays 0.
            if p.size != size::NVOS05_ALLOC_OBJECT {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos21::H_ROOT);
            p.parent = word(&w, nvos21::H_OBJECT_PARENT);
            p.class = word(&w, nvos21::H_CLASS);
            if p.class == class::NV01_DEVICE_0 {
                p.gpu = device_gpu(0)?;
            }
        }
        escape::FREE => {
            if p.size != size::NVOS00_FREE {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos00::H_ROOT);
            p.parent = word(&w, nvos00::H_OBJECT_PARENT);
            p.handle = word(&w, nvos00::H_OBJECT_OLD);
        }
        escape::ALLOC_MEMORY => {
            if p.size != size::NVOS02_ALLOC_MEMORY {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos02::H_ROOT);
            p.parent = word(&w, nvos02::H_OBJECT_PARENT);
            p.class = word(&w, nvos02::H_CLASS);
        }
        escape::VID_HEAP_CONTROL => {
            if p.size != size::NVOS32_VID_HEAP {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos32::H_ROOT);
            p.parent = word(&w, nvos32::H_OBJECT_PARENT);
            p.sub = word(&w, nvos32::FUNCTION);
            p.handle = user_u32(base, nvos32::H_MEMORY)?;
        }
        escape::CONTROL => {
            if p.size != size::NVOS54_CONTROL {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos54::H_CLIENT);
            p.handle = word(&w, nvos54::H_OBJECT);
            p.sub = word(&w, nvos54::CMD);
            p.has_control = 1;
            if word(&w, nvos54::FLAGS) & nvos54::FLAGS_FINN_SERIALIZED != 0 {
                return Err(undecoded::FINN_SERIALIZED);
            }
            decode_control_enter(p)?;
        }
        escape::DUP_OBJECT => {
            if p.size != size::NVOS55_DUP_OBJECT {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<5>(base)?;
            p.client = word(&w, nvos55::H_CLIENT);
            p.parent = word(&w, nvos55::H_PARENT);
            p.aux = word(&w, nvos55::H_CLIENT_SRC);
            p.aux2 = word(&w, nvos55::H_OBJECT_SRC);
        }
        escape::MAP_MEMORY | escape::UNMAP_MEMORY => {
            let want = if p.escape == escape::MAP_MEMORY {
                size::NVOS33_MAP_MEMORY
            } else {
                size::NVOS34_UNMAP_MEMORY
            };
            if p.size != want {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos33::H_CLIENT);
            p.handle = word(&w, nvos33::H_MEMORY);
        }
        escape::REGISTER_FD => {
            // `{int ctl_fd}`: this nvidiaN file acts for the clients of that
            // nvidiactl file (RM_ALLOC_MEMORY comes through nvidiaN).
            let ctl_fd = user_u32(base, 0)? as i32;
            p.aux_file = file_of_fd(ctl_fd);
        }
        e if escape::carries_no_memory(e) => {}
        _ => return Err(undecoded::UNKNOWN_ESCAPE),
    }
    Ok(())
}

/// The GPU of a device object from its `NV0080_ALLOC_PARAMETERS` (`params`, 0 when
/// none: the driver then takes device instance `class - NV01_DEVICE_0`, that is 0,
/// `deviceConstruct_IMPL`).
#[inline(always)]
fn device_gpu(params: u64) -> Result<u32, u32> {
    if params == 0 {
        return Ok(0);
    }
    user_u32(params, NV0080_DEVICE_ID)
}

/// Counts the call `p` describes in `CALL_COUNTS` (see the module doc).
#[inline(never)]
fn count_calls(p: &PendingIoctl) {
    if p.device == device_file::UVM {
        count_call(call_key(call_kind::UVM, p.cmd));
        return;
    }
    if nvidia::rm_type(p.cmd) != nvidia::RM_IOCTL_TYPE {
        count_call(call_key(call_kind::NOT_RM, p.cmd));
        return;
    }
    // After XFER_CMD, the escape it carries (`escape` is the command's own nr when
    // the XFER struct could not be read).
    let nr = if p.via_xfer != 0 {
        p.escape
    } else {
        nvidia::rm_nr(p.cmd)
    };
    count_call(call_key(call_kind::RM_ESCAPE, nr));
    if p.has_control != 0 {
        count_call(call_key(call_kind::RM_CONTROL, p.sub));
    }
}

/// Adds one call to `CALL_COUNTS[key]`, exactly: a new key is inserted only if
/// absent (two CPUs meeting a new key at once land on the same entry), then added
/// to atomically.
#[inline(never)]
fn count_call(key: u64) {
    if let Some(n) = CALL_COUNTS.get_ptr_mut(key) {
        // SAFETY: an aligned map value, updated atomically.
        unsafe { atomic_add(n, 1) };
        return;
    }
    let _ = CALL_COUNTS.insert(key, 0u64, BPF_NOEXIST);
    let n = match CALL_COUNTS.get_ptr_mut(key) {
        Some(n) => n,
        None => match CALLS_UNCOUNTED.get_ptr_mut(0) {
            Some(n) => n,
            None => return,
        },
    };
    // SAFETY: as above.
    unsafe { atomic_add(n, 1) };
}

/// RM_CONTROL: the controls that share memory name an export file by fd in the
/// caller's table; resolve it now, while the fd means what the caller meant.
#[inline(always)]
fn decode_control_enter(p: &mut PendingIoctl) -> Result<(), u32> {
    let (want, fd_off) = match p.sub {
        ctrl::EXPORT_OBJECT_TO_FD => (ctrl::EXPORT_SIZE, ctrl::EXPORT_FD),
        ctrl::IMPORT_OBJECT_FROM_FD => (ctrl::IMPORT_SIZE, ctrl::IMPORT_FD),
        ctrl::EXPORT_OBJECTS_TO_FD => (ctrl::EXPORT_BATCH_SIZE, ctrl::EXPORT_BATCH_FD),
        ctrl::IMPORT_OBJECTS_FROM_FD => (ctrl::IMPORT_BATCH_SIZE, ctrl::IMPORT_BATCH_FD),
        _ => return Ok(()),
    };
    p.sub_params = user_u64(p.params, nvos54::PARAMS)?;
    p.aux = user_u32(p.params, nvos54::PARAMS_SIZE)?;
    if p.aux != want {
        return Err(undecoded::UNKNOWN_LAYOUT);
    }
    let fd = user_u32(p.sub_params, fd_off)? as i32;
    p.aux_file = file_of_fd(fd);
    if device_of_file(p.aux_file) != device_file::CTL {
        // Not an nvidiactl open file: the driver refuses it; nothing to account.
        p.aux_file = 0;
    }
    Ok(())
}

/// What a call that changed no memory is reported as.
#[derive(Clone, Copy)]
struct Report {
    status: u32,
    outcome: u32,
    /// A failed video allocation: the bytes asked for.
    requested: u64,
}

impl Report {
    fn status(status: u32) -> Self {
        Report {
            status,
            outcome: outcome::DECODED,
            requested: 0,
        }
    }
}

/// Handlers of the calls that change memory, each its own program reached by tail
/// call from `sys_exit_ioctl` (together they are too much for the verifier).
pub const IOCTL_ALLOC: u32 = tail_call::ioctl::ALLOC;
pub const IOCTL_FREE: u32 = tail_call::ioctl::FREE;
pub const IOCTL_CONTROL: u32 = tail_call::ioctl::CONTROL;
pub const IOCTL_DUP: u32 = tail_call::ioctl::DUP;
pub const IOCTL_BATCH_EXPORT: u32 = tail_call::ioctl::BATCH_EXPORT;
pub const IOCTL_BATCH_IMPORT: u32 = tail_call::ioctl::BATCH_IMPORT;

/// The handler programs, by the numbers above; set by the agent at load time.
#[map]
static IOCTL_PROG: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);
/// The same, as kprobe programs (the driver-entry backend).
#[map]
static IOCTL_PROG_KPROBE: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);

/// A program type and its array of handler programs (see [`TailCalls`]).
pub trait IoctlCalls: TailCalls {
    fn ioctl_prog() -> &'static ProgramArray;
}

impl IoctlCalls for TracePointContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG
    }
}

impl IoctlCalls for ProbeContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG_KPROBE
    }
}

impl IoctlCalls for RetProbeContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG_KPROBE
    }
}

/// Which handler a successful call needs (0: none, it is a plain call).
#[inline(always)]
fn handler(p: &PendingIoctl) -> u32 {
    if p.device == device_file::UVM {
        return 0;
    }
    match p.escape {
        escape::ALLOC | escape::ALLOC_OBJECT | escape::ALLOC_MEMORY => IOCTL_ALLOC,
        escape::VID_HEAP_CONTROL if p.sub == nvos32::FUNCTION_FREE => IOCTL_FREE,
        escape::VID_HEAP_CONTROL => IOCTL_ALLOC,
        escape::FREE => IOCTL_FREE,
        escape::CONTROL if p.sub_params != 0 && p.sub == ctrl::EXPORT_OBJECTS_TO_FD => {
            IOCTL_BATCH_EXPORT
        }
        escape::CONTROL if p.sub_params != 0 && p.sub == ctrl::IMPORT_OBJECTS_FROM_FD => {
            IOCTL_BATCH_IMPORT
        }
        escape::CONTROL if p.sub_params != 0 => IOCTL_CONTROL,
        escape::DUP_OBJECT => IOCTL_DUP,
        _ => 0,
    }
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> i32 {
    // No NVIDIA call in flight anywhere: nothing to look up.
    let idle = match IN_FLIGHT.get_ptr(0) {
        // SAFETY: a map value pointer; a plain load of a counter others add to.
        Some(n) => (unsafe { core::ptr::read_volatile(n) }) == 0,
        None => true,
    };
    if !idle {
        exit(&ctx, syscall_ret(&ctx));
    }
    0
}

/// The driver-entry backend's exit: the driver's `unlocked_ioctl` returned `ret`
/// (what the ioctl(2) returns).
#[kretprobe]
pub fn keling_driver_ioctl_return(ctx: RetProbeContext) -> u32 {
    let ret: i64 = ctx.ret();
    exit(&ctx, ret);
    0
}

/// The driver-entry backend's exit path where kprobes cannot attach (this
/// project's CI machines): the same [`exit`] in a program of the same type, run
/// by a uretprobe on a function the test workload calls right after each ioctl
/// returns, with its return value (keling-agent's `KELING_TEST_IOCTL_RETURN`).
/// Attached by nothing else.
#[uretprobe]
pub fn keling_test_ioctl_return(ctx: RetProbeContext) -> u32 {
    let ret: i64 = ctx.ret();
    exit(&ctx, ret);
    0
}

/// The call the current thread left pending at [`enter`] returned `ret`: reported,
/// or handed to its handler program.
#[inline(always)]
fn exit<C: IoctlCalls>(ctx: &C, ret: i64) {
    let (_, tid) = current_ids();
    // Worked on in place: a copy would take a third of the 512-byte stack.
    let Some(p) = PENDING_IOCTL.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a map value pointer, valid for this program run; only this thread's
    // syscall uses this entry.
    let p = unsafe { &mut *p };
    p.ret = ret;
    if p.undecoded == 0 && p.ret == 0 {
        let h = handler(p);
        if h != 0 {
            // SAFETY: a tail call to a program of the same type.
            unsafe { C::ioctl_prog().tail_call(ctx, h) };
            // Only reached if the tail call failed.
            p.undecoded = 1 + undecoded::TABLE_FULL;
        }
    }
    let result = if p.undecoded != 0 || p.ret != 0 {
        Ok(Some(Report::status(0)))
    } else {
        plain_exit(p)
    };
    finish(ctx, p, result);
}

/// Reports the outcome of a call and lets go of its pending entry; runs any work
/// it queued.
#[inline(always)]
fn finish<C: IoctlCalls>(ctx: &C, p: &mut PendingIoctl, result: Result<Option<Report>, u32>) {
    let tid = p.tid;
    match result {
        // Fully reported; a teardown it queued is done now.
        Ok(None) => {
            pending_removed(tid);
            deferred::run(ctx);
        }
        Ok(Some(report)) => {
            let reason = p.undecoded;
            let mut report = report;
            if reason != 0 {
                count_undecoded(p.pid, call_reason(reason - 1));
                report.outcome = outcome::UNDECODED;
            }
            report_ioctl(p, &report, reason);
            pending_removed(tid);
        }
        Err(r) => {
            count_undecoded(p.pid, call_reason(r));
            let report = Report {
                status: 0,
                outcome: outcome::UNDECODED,
                requested: 0,
            };
            report_ioctl(p, &report, 1 + r);
            pending_removed(tid);
            deferred::run(ctx);
        }
    }
}

/// What [`count_undecoded`] counts for a call undecoded for `reason`: a full table
/// met in the call's own decoding is counted as `table_full::CALL`.
#[inline(always)]
fn call_reason(reason: u32) -> u32 {
    if reason == undecoded::TABLE_FULL {
        table_full_at(table_full::CALL)
    } else {
        reason
    }
}

/// The pending entry of the current thread, for a handler program.
#[inline(always)]
fn pending() -> Option<&'static mut PendingIoctl> {
    let (_, tid) = current_ids();
    let p = PENDING_IOCTL.get_ptr_mut(tid)?;
    // SAFETY: a map value pointer, valid for this program run.
    Some(unsafe { &mut *p })
}

tail_called!(
    /// RM_ALLOC, ALLOC_OBJECT, ALLOC_MEMORY and VID_HEAP_CONTROL allocations.
    keling_ioctl_alloc,
    keling_ioctl_alloc_kprobe,
    ioctl_alloc
);

fn ioctl_alloc<C: IoctlCalls>(ctx: &C) {
    handle(ctx, |p| match p.escape {
        escape::ALLOC | escape::ALLOC_OBJECT => exit_alloc(p),
        escape::ALLOC_MEMORY => exit_alloc_memory(p),
        _ => exit_vid_heap(p),
    });
}

/// A handler program's work: `exit` on the current thread's pending call, then
/// its report.
#[inline(always)]
fn handle<C: IoctlCalls>(
    ctx: &C,
    exit: impl FnOnce(&mut PendingIoctl) -> Result<Option<Report>, u32>,
) {
    if let Some(p) = pending() {
        let r = exit(p);
        finish(ctx, p, r);
    }
}

tail_called!(
    /// RM_FREE and VID_HEAP_CONTROL FREE.
    keling_ioctl_free,
    keling_ioctl_free_kprobe,
    ioctl_free
);

fn ioctl_free<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_free);
}

tail_called!(
    /// RM_CONTROL commands that change memory.
    keling_ioctl_control,
    keling_ioctl_control_kprobe,
    ioctl_control
);

fn ioctl_control<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_control);
}

tail_called!(
    /// Batch exports: one object per run, then itself again.
    keling_ioctl_batch_export,
    keling_ioctl_batch_export_kprobe,
    batch_export
);

fn batch_export<C: IoctlCalls>(ctx: &C) {
    batch(ctx, IOCTL_BATCH_EXPORT);
}

tail_called!(
    /// Batch imports: one object per run, then itself again.
    keling_ioctl_batch_import,
    keling_ioctl_batch_import_kprobe,
    batch_import
);

fn batch_import<C: IoctlCalls>(ctx: &C) {
    batch(ctx, IOCTL_BATCH_IMPORT);
}

#[inline(always)]
fn batch<C: IoctlCalls>(ctx: &C, me: u32) {
    let Some(p) = pending() else {
        return;
    };
    if p.aux2 == 0 {
        match user_u32(p.params, nvos54::STATUS) {
            Ok(0) => {}
            Ok(status) => return finish(ctx, p, Ok(Some(Report::status(status)))),
            Err(e) => return finish(ctx, p, Err(e)),
        }
    }
    let step = if me == IOCTL_BATCH_EXPORT {
        batch_export_step(p)
    } else {
        batch_import_step(p)
    };
    match step {
        Ok(true) => {
            // SAFETY: a tail call to a program of the same type.
            unsafe { C::ioctl_prog().tail_call(ctx, me) };
            finish(ctx, p, Err(undecoded::TABLE_FULL));
        }
        Ok(false) => finish(ctx, p, Ok(None)),
        Err(e) => finish(ctx, p, Err(e)),
    }
}

tail_called!(
    /// RM_DUP_OBJECT.
    keling_ioctl_dup,
    keling_ioctl_dup_kprobe,
    ioctl_dup
);

fn ioctl_dup<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_dup);
}

/// RM_FREE, or VID_HEAP_CONTROL FREE, that returned.
#[inline(never)]
fn exit_free(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = if p.escape == escape::FREE {
        user_u32(p.params, nvos00::STATUS)?
    } else {
        user_u32(p.params, nvos32::STATUS)?
    };
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    free_object(p)?;
    Ok(None)
}

/// RM_DUP_OBJECT that returned.
#[inline(never)]
fn exit_dup(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = user_u32(p.params, nvos55::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    p.handle = user_u32(p.params, nvos55::H_OBJECT)?;
    let src = ObjectKey {
        client: p.aux,
        handle: p.aux2,
    };
    new_ref(p, &src, 0, ref_how::DUP)?;
    Ok(None)
}

/// Reports a call that changed no memory.
#[inline(never)]
fn report_ioctl(p: &PendingIoctl, report: &Report, reason: u32) {
    emit_quiet_or_not(GpuIoctlEvent {
        header: header(EventKind::GpuIoctl, p.pid, p.tid),
        fd: p.fd,
        device: p.device,
        escape: p.escape,
        cmd: p.cmd,
        control_cmd: if p.escape == escape::CONTROL && p.device != device_file::UVM {
            p.sub
        } else {
            0
        },
        class: p.class,
        gpu: p.gpu,
        _reserved: 0,
        status: report.status,
        outcome: report.outcome,
        undecoded: reason.saturating_sub(1),
        via_xfer: p.via_xfer,
        ret: p.ret,
        requested_bytes: report.requested,
    });
}

/// A failed allocation may matter to a decision at once (memory pressure); plain
/// calls are detail. The long-running agent asks for memory and activity only:
/// every other call is an activity signal to it (active.rs), with no ring-buffer
/// reservation; what it counts of them (undecoded calls, call counts) the kernel
/// counts in maps.
#[inline(always)]
fn emit_quiet_or_not(e: GpuIoctlEvent) {
    if e.requested_bytes != 0 {
        emit(e);
    } else if super::active::limited() {
        super::active::report(e.header.pid, e.header.tid, active_cause::IOCTL);
    } else {
        emit_quiet(e);
    }
}

/// A successful call that changes no memory: its status.
#[inline(always)]
fn plain_exit(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    if p.device == device_file::UVM {
        // Where rmStatus is: fixed, or moved between driver branches (the offsets
        // the agent set for the driver in use).
        let status = match p.escape {
            uvm::INITIALIZE => user_u32(base, uvm::INITIALIZE_RM_STATUS)?,
            uvm::CREATE_EXTERNAL_RANGE => user_u32(base, uvm::CREATE_EXTERNAL_RANGE_RM_STATUS)?,
            uvm::FREE => user_u32(base, config!(uvm_free_status_off) as usize)?,
            uvm::MAP_EXTERNAL_ALLOCATION => {
                user_u32(base, config!(uvm_map_external_status_off) as usize)?
            }
            uvm::ALLOC_SEMAPHORE_POOL => {
                user_u32(base, config!(uvm_semaphore_pool_status_off) as usize)?
            }
            _ => 0,
        };
        return Ok(Some(Report::status(status)));
    }
    match p.escape {
        escape::CONTROL => Ok(Some(Report::status(user_u32(base, nvos54::STATUS)?))),
        escape::REGISTER_FD => {
            if p.aux_file != 0 && device_of_file(p.aux_file) == device_file::CTL {
                let _ = REGISTERED.insert(p.file_id, p.aux_file, 0);
            }
            Ok(Some(Report {
                status: 0,
                outcome: outcome::NO_MEMORY_ESCAPE,
                requested: 0,
            }))
        }
        escape::MAP_MEMORY => Ok(Some(Report::status(user_u32(base, nvos33::STATUS)?))),
        // Its layout moved at 570: the status offset is the driver's.
        escape::EXPORT_TO_DMABUF_FD => Ok(Some(Report {
            status: user_u32(base, config!(dmabuf_export_status_off) as usize)?,
            outcome: outcome::NO_MEMORY_ESCAPE,
            requested: 0,
        })),
        escape::UNMAP_MEMORY => Ok(Some(Report::status(user_u32(base, nvos34::STATUS)?))),
        _ => Ok(Some(Report {
            status: 0,
            outcome: outcome::NO_MEMORY_ESCAPE,
            requested: 0,
        })),
    }
}

#[inline(never)]
fn exit_alloc(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let off = match p.size {
        size::NVOS64_ALLOC => nvos64::STATUS,
        nvos64::SIZE_PRE_535 => nvos64::STATUS_PRE_535,
        size::NVOS05_ALLOC_OBJECT => nvos05::STATUS,
        _ => config!(nvos21_status_off) as usize,
    };
    let status = user_u32(base, off)?;
    let kind = ObjectKind::of_class(p.class);
    if status != 0 {
        // The size asked for: what a memory-pressure decision needs (video only).
        let mut r = Report::status(status);
        if kind == ObjectKind::VideoMemory && p.sub_params != 0 {
            r.requested = user_u64(p.sub_params, MEMORY_ALLOCATION_PARAMS_SIZE)?;
        }
        return Ok(Some(r));
    }
    p.handle = user_u32(base, nvos21::H_OBJECT_NEW)?;
    let bytes = match p.class {
        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            user_u64(p.sub_params, OS_DESC_LIMIT)?.saturating_add(1)
        }
        c if ObjectKind::has_memory_params(c) => {
            user_u64(p.sub_params, MEMORY_ALLOCATION_PARAMS_SIZE)?
        }
        _ => 0,
    };
    {
        p.mem_kind = kind.mem_kind().unwrap_or(0);
        p.bytes = bytes;
        record_object(p, kind)?
    };
    Ok(None)
}

#[inline(never)]
fn exit_alloc_memory(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let status = user_u32(base, nvos02::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    p.handle = user_u32(base, nvos02::H_OBJECT_NEW)?;
    match p.class {
        class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            let bytes = user_u64(base, nvos02::LIMIT)?.saturating_add(1);
            {
                p.mem_kind = mem_kind::HOST;
                p.bytes = bytes;
                record_object(p, ObjectKind::HostMemory)?
            };
        }
        class::NV01_MEMORY_LOCAL_USER | class::NV01_MEMORY_LOCAL_PRIVILEGED => {
            // The driver allocates nothing and writes the whole heap into `limit`.
            {
                p.mem_kind = 0;
                p.bytes = 0;
                record_object(p, ObjectKind::VirtualMemory)?
            };
        }
        _ => return Err(undecoded::UNKNOWN_LAYOUT),
    }
    Ok(None)
}

#[inline(never)]
fn exit_vid_heap(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let status = user_u32(base, nvos32::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    let (kind, bytes) = match p.sub {
        nvos32::FUNCTION_ALLOC_SIZE | nvos32::FUNCTION_ALLOC_SIZE_RANGE => {
            let range = p.sub == nvos32::FUNCTION_ALLOC_SIZE_RANGE;
            p.handle = user_u32(base, nvos32::H_MEMORY)?;
            let flags = user_u32(base, nvos32::FLAGS)?;
            let attr = user_u32(base, nvos32::ATTR)?;
            let egm = !range && config!(driver_major) >= nvos32::EGM_SINCE_MAJOR;
            let attr2 = if egm {
                user_u32(base, nvos32::ATTR2)?
            } else {
                0
            };
            let size_off = if range {
                nvos32::ALLOC_SIZE_RANGE_SIZE
            } else {
                nvos32::ALLOC_SIZE
            };
            match nvos32::classify(flags, attr, attr2, egm) {
                None => {
                    p.class = class::NV50_MEMORY_VIRTUAL;
                    (0, 0)
                }
                Some(kind) => {
                    p.class = match kind {
                        mem_kind::VIDEO => class::NV01_MEMORY_LOCAL_USER,
                        mem_kind::HOST => class::NV01_MEMORY_SYSTEM,
                        _ => class::NV_MEMORY_EXTENDED_USER,
                    };
                    (kind, user_u64(base, size_off)?)
                }
            }
        }
        nvos32::FUNCTION_ALLOC_OS_DESCRIPTOR => {
            p.handle = user_u32(base, nvos32::OS_DESCRIPTOR_H_MEMORY)?;
            p.class = class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR;
            let limit = user_u64(base, nvos32::OS_DESCRIPTOR_LIMIT)?;
            (mem_kind::HOST, limit.saturating_add(1))
        }
        _ => return Ok(Some(Report::status(status))),
    };
    let object_kind = ObjectKind::of_class(p.class);
    {
        p.mem_kind = kind;
        p.bytes = bytes;
        record_object(p, object_kind)?
    };
    Ok(None)
}

#[inline(never)]
fn exit_control(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = user_u32(p.params, nvos54::STATUS)?;
    if status != 0 || p.sub_params == 0 {
        return Ok(Some(Report::status(status)));
    }
    let params = p.sub_params;
    match p.sub {
        ctrl::EXPORT_OBJECT_TO_FD => {
            let handle = user_u32(params, ctrl::EXPORT_H_OBJECT)?;
            export_one(p, handle, 0)?;
        }
        ctrl::IMPORT_OBJECT_FROM_FD => {
            p.parent = user_u32(params, ctrl::IMPORT_H_PARENT)?;
            p.handle = user_u32(params, ctrl::IMPORT_H_OBJECT)?;
            import_one(p, 0)?;
        }
        _ => return Ok(Some(Report::status(status))),
    }
    Ok(None)
}

/// Where a batch control is: (its size, index, and the next object, `p.aux2`);
/// `None` when it is done. Counts objects beyond what Keling decodes.
#[inline(always)]
fn batch_next(
    p: &PendingIoctl,
    num_off: usize,
    index_off: usize,
) -> Result<Option<(u32, u32)>, u32> {
    let n = user::<u16>(p.sub_params + num_off as u64)? as u32;
    let index = user::<u16>(p.sub_params + index_off as u64)? as u32;
    let i = p.aux2;
    if i == 0 && n as usize > BATCH_OBJECTS {
        count_table_full(p.pid, table_full::BATCH);
    }
    if i >= n || i as usize >= BATCH_OBJECTS {
        return Ok(None);
    }
    Ok(Some((index, i)))
}

/// One object of a batch export. `Ok(true)`: more to do.
#[inline(never)]
fn batch_export_step(p: &mut PendingIoctl) -> Result<bool, u32> {
    let Some((index, i)) = batch_next(p, ctrl::EXPORT_BATCH_NUM, ctrl::EXPORT_BATCH_INDEX)? else {
        return Ok(false);
    };
    let at = (i as usize & (BATCH_OBJECTS - 1)) * 4;
    let handle = user_u32(p.sub_params, ctrl::EXPORT_BATCH_OBJECTS + at)?;
    export_one(p, handle, index + i)?;
    p.aux2 = i + 1;
    Ok(true)
}

/// One object of a batch import. `Ok(true)`: more to do.
#[inline(never)]
fn batch_import_step(p: &mut PendingIoctl) -> Result<bool, u32> {
    let Some((index, i)) = batch_next(p, ctrl::IMPORT_BATCH_NUM, ctrl::IMPORT_BATCH_INDEX)? else {
        return Ok(false);
    };
    let at = (i as usize & (BATCH_OBJECTS - 1)) * 4;
    p.parent = user_u32(p.sub_params, ctrl::IMPORT_BATCH_H_PARENT)?;
    p.handle = user_u32(p.sub_params, ctrl::IMPORT_BATCH_OBJECTS + at)?;
    import_one(p, index + i)?;
    p.aux2 = i + 1;
    Ok(true)
}

/// The client named by a call, checked against the open file the call came
/// through: a process can act only on clients created on an open file it has.
/// A client first seen now (created before Keling started) is adopted on it.
#[inline(always)]
fn client_on(p: &PendingIoctl) -> Result<*mut ClientInfo, u32> {
    let pid = p.pid;
    if CLIENTS.get_ptr(p.client).is_none() {
        // Its file: this one if it is an nvidiactl file, else the nvidiactl file
        // this nvidiaN file was registered with, else not known yet (0).
        let file = if p.device == device_file::CTL {
            p.file_id
        } else {
            // SAFETY: copied out at once.
            unsafe { REGISTERED.get(p.file_id) }.copied().unwrap_or(0)
        };
        new_client(pid, p.client, file, p.device);
    }
    let c = CLIENTS.get_ptr_mut(p.client).ok_or(undecoded::TABLE_FULL)?;
    // SAFETY: a map value pointer.
    let file = unsafe { (*c).file_id };
    if file == p.file_id {
        return Ok(c);
    }
    if file == 0 {
        // A client from before Keling, first met through an nvidiaN file: the
        // first nvidiactl file it is used through is its own.
        if p.device == device_file::CTL {
            // SAFETY: as above.
            unsafe { (*c).file_id = p.file_id };
            super::accounting::attach_client(p.client, p.file_id, p.device, pid);
        }
        return Ok(c);
    }
    // SAFETY: copied out at once.
    if unsafe { REGISTERED.get(p.file_id) }.copied() == Some(file) {
        return Ok(c);
    }
    // Through an nvidiaN file registered before Keling was watching: the caller
    // must have the client's own file open.
    if p.device <= device_file::MAX_GPU && has_file(pid, file) {
        let _ = REGISTERED.insert(p.file_id, file, 0);
        return Ok(c);
    }
    Err(undecoded::UNKNOWN_OBJECT)
}

/// Whether `pid` has an fd of the open file `file` (as far as Keling knows).
#[inline(never)]
fn has_file(pid: u32, file: u64) -> bool {
    let Some(fds) = proc_fds(pid, false) else {
        return false;
    };
    for i in 0..keling_common::FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        if unsafe { (*fds).slots[i].file_id } == file {
            return true;
        }
    }
    false
}

/// A live object of a client (its generation matches).
#[inline(always)]
fn object(key: &ObjectKey) -> Option<ObjectInfo> {
    // SAFETY: copied out at once.
    let obj = unsafe { OBJECTS.get(key) }.copied()?;
    // SAFETY: as above.
    let gen_ = unsafe { CLIENTS.get(key.client) }?.gen_;
    (obj.client_gen == gen_).then_some(obj)
}

/// A live object of a client, in place.
#[inline(always)]
fn object_ref(key: &ObjectKey) -> Option<&'static ObjectInfo> {
    let obj = OBJECTS.get_ptr(key)?;
    // SAFETY: copied out at once.
    let gen_ = unsafe { CLIENTS.get(key.client) }?.gen_;
    // SAFETY: a map value pointer, valid for this program run.
    let obj = unsafe { &*obj };
    (obj.client_gen == gen_).then_some(obj)
}

/// Where a new object under `parent` hangs: (device, subdevice, gpu).
#[inline(always)]
fn placement(p: &PendingIoctl, kind: ObjectKind) -> (u32, u32, u32) {
    let mut gpu = p.gpu;
    let (mut device, mut sub) = (0, 0);
    if p.parent != p.client
        && let Some(parent) = object(&ObjectKey {
            client: p.client,
            handle: p.parent,
        })
    {
        device = parent.device;
        sub = parent.sub;
        if gpu == NO_GPU {
            gpu = parent.gpu;
        }
    }
    match kind {
        ObjectKind::Device => (p.handle, 0, gpu),
        ObjectKind::Subdevice => (device, p.handle, gpu),
        _ => (device, sub, gpu),
    }
}

/// A new object (or client) the driver created.
#[inline(never)]
fn record_object(p: &mut PendingIoctl, kind: ObjectKind) -> Result<(), u32> {
    let (pid, tid, mem, bytes) = (p.pid, p.tid, p.mem_kind, p.bytes);
    if kind == ObjectKind::Client {
        new_client(pid, p.handle, p.file_id, p.device);
        p.client = p.handle;
        emit_object(pid, tid, p, kind);
        return Ok(());
    }
    let client = client_on(p)?;
    let (device, sub, gpu) = placement(p, kind);
    p.gpu = gpu;
    let info = scratch_object().ok_or(undecoded::TABLE_FULL)?;
    info.class = p.class;
    info.kind = kind as u32;
    info.parent = p.parent;
    info.device = device;
    info.sub = sub;
    info.gpu = gpu;
    info.owner_pid = pid;
    // SAFETY: a map value pointer.
    info.client_gen = unsafe { (*client).gen_ };
    info.bytes = bytes;
    info.mem_kind = mem;
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    // By reference: a copy would put the whole record on the 512-byte stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if OBJECTS.insert(key, &*info, 0).is_err() {
        return Err(undecoded::TABLE_FULL);
    }
    if mem == 0 {
        emit_object(pid, tid, p, kind);
        return Ok(());
    }
    let h = MemHandle {
        client: p.client,
        handle: p.handle,
        device,
        sub,
        pid,
        seq: 0,
    };
    charge_new(client, &h, gpu, mem, bytes);
    emit_alloc(p);
    Ok(())
}

/// Reports the allocation `p` describes (its own frame: the caller's is deep).
#[inline(never)]
fn emit_alloc(p: &PendingIoctl) {
    emit(GpuAllocEvent {
        header: header(EventKind::GpuAlloc, p.pid, p.tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        class: p.class,
        mem_kind: p.mem_kind,
        gpu: p.gpu,
        escape: p.escape,
        via_xfer: p.via_xfer,
        bytes: p.bytes,
    });
}

#[inline(never)]
fn emit_object(pid: u32, tid: u32, p: &PendingIoctl, kind: ObjectKind) {
    emit_quiet(GpuObjectEvent {
        header: header(EventKind::GpuObject, pid, tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        class: p.class,
        kind: kind as u32,
        gpu: p.gpu,
    });
}

/// A new handle `p.client`/`p.handle` under `p.parent` referring to `src` (a dup)
/// or to the memory `mem_id` (an import).
#[inline(never)]
fn new_ref(p: &mut PendingIoctl, src: &ObjectKey, mut mem_id: u64, how: u32) -> Result<(), u32> {
    let pid = p.pid;
    let client = client_on(p)?;
    let info = scratch_object().ok_or(undecoded::TABLE_FULL)?;
    info.parent = p.parent;
    info.gpu = NO_GPU;
    info.owner_pid = pid;
    // SAFETY: a map value pointer.
    info.client_gen = unsafe { (*client).gen_ };
    if mem_id == 0 {
        let source = object_ref(src).ok_or(undecoded::UNKNOWN_OBJECT)?;
        info.class = source.class;
        info.kind = source.kind;
        info.gpu = source.gpu;
        info.bytes = source.bytes;
        info.mem_kind = source.mem_kind;
        if source.mem_kind != 0 {
            mem_id = share(src);
            if mem_id == 0 {
                return Err(undecoded::TABLE_FULL);
            }
        }
    } else {
        let m = super::accounting::MEMS
            .get_ptr(mem_id)
            .ok_or(undecoded::UNKNOWN_OBJECT)?;
        // SAFETY: a map value pointer, read field by field (a copy is 128 bytes of stack).
        unsafe {
            info.mem_kind = (*m).kind;
            info.bytes = (*m).bytes;
            info.gpu = (*m).gpu;
        }
        info.class = match info.mem_kind {
            mem_kind::VIDEO => class::NV01_MEMORY_LOCAL_USER,
            mem_kind::HOST => class::NV01_MEMORY_SYSTEM,
            _ => class::NV_MEMORY_EXTENDED_USER,
        };
        info.kind = ObjectKind::of_class(info.class) as u32;
    }
    let kind = ObjectKind::from_u32(info.kind);
    p.gpu = info.gpu;
    let (device, sub, gpu) = placement(p, kind);
    info.device = device;
    info.sub = sub;
    if info.gpu == NO_GPU {
        info.gpu = gpu;
    }
    if mem_id != 0 {
        let h = MemHandle {
            client: p.client,
            handle: p.handle,
            device,
            sub,
            pid,
            seq: 0,
        };
        if !add_handle(mem_id, &h) {
            return Err(undecoded::TABLE_FULL);
        }
        // A memory only export files held takes its new handle as the charged one.
        claim_charge(pid, p.tid, mem_id);
        info.mem_id = mem_id;
    }
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    // By reference: a copy would put the whole record on the 512-byte stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if OBJECTS.insert(key, &*info, 0).is_err() {
        return Err(undecoded::TABLE_FULL);
    }
    if mem_id != 0 {
        link_shared(&key);
    }
    p.gpu = info.gpu;
    p.mem_kind = info.mem_kind;
    p.bytes = info.bytes;
    emit_ref(p, src, how);
    Ok(())
}

#[inline(never)]
fn emit_ref(p: &PendingIoctl, src: &ObjectKey, how: u32) {
    emit(GpuRefEvent {
        header: header(EventKind::GpuRef, p.pid, p.tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        how,
        src_client: src.client,
        src_handle: src.handle,
        gpu: p.gpu,
        mem_kind: p.mem_kind,
        bytes: p.bytes,
    });
}

/// Exports `handle` of the call's client to position `position` of its export file.
#[inline(never)]
fn export_one(p: &PendingIoctl, handle: u32, position: u32) -> Result<(), u32> {
    let pid = p.pid;
    if p.aux_file == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    client_on(p)?;
    if handle == 0 {
        // An empty entry: the position is emptied.
        export_memory(pid, p.aux_file, position, 0);
        return Ok(());
    }
    let key = ObjectKey {
        client: p.client,
        handle,
    };
    let (mem, gpu, obj_bytes) = {
        let obj = object_ref(&key).ok_or(undecoded::UNKNOWN_OBJECT)?;
        (obj.mem_kind, obj.gpu, obj.bytes)
    };
    let mem_id = if mem != 0 {
        share(&key)
    } else {
        NO_BYTES_EXPORT
    };
    if mem_id == 0 || !export_memory(pid, p.aux_file, position, mem_id) {
        return Err(undecoded::TABLE_FULL);
    }
    let bytes = if mem != 0 { obj_bytes } else { 0 };
    emit_export(p, handle, position, gpu, bytes);
    Ok(())
}

#[inline(never)]
fn emit_export(p: &PendingIoctl, handle: u32, position: u32, gpu: u32, bytes: u64) {
    emit(GpuExportEvent {
        header: header(EventKind::GpuExport, p.pid, p.tid),
        client: p.client,
        handle,
        file_id: p.aux_file,
        position,
        gpu,
        bytes,
    });
}

/// Imports the object at `position` of the call's export file as `p.handle`.
#[inline(never)]
fn import_one(p: &mut PendingIoctl, position: u32) -> Result<(), u32> {
    if p.aux_file == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    if p.handle == 0 {
        return Ok(()); // nothing was imported
    }
    let mem_id = exported(p.aux_file, position);
    if mem_id == NO_BYTES_EXPORT {
        // An object without bytes (fabric, multicast): a plain new object.
        p.class = 0;
        p.mem_kind = 0;
        p.bytes = 0;
        return record_object(p, ObjectKind::VirtualMemory);
    }
    if mem_id == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    new_ref(p, &ObjectKey::default(), mem_id, ref_how::IMPORT)
}

/// RM_FREE (or VID_HEAP FREE) that the driver accepted.
#[inline(never)]
fn free_object(p: &mut PendingIoctl) -> Result<(), u32> {
    let (pid, tid) = (p.pid, p.tid);
    if p.handle == p.client {
        // SAFETY: copied out at once.
        let file = unsafe { CLIENTS.get(p.client) }
            .map(|c| c.file_id)
            .ok_or(undecoded::UNKNOWN_OBJECT)?;
        if file != p.file_id {
            return Err(undecoded::UNKNOWN_OBJECT);
        }
        queue_teardown(
            pid,
            tid,
            p.client,
            &Scope::default(),
            teardown::CLIENT_FREED,
        );
        emit_free(pid, tid, p, ObjectKind::Client);
        return Ok(());
    }
    client_on(p)?;
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    let (mem, kind) = {
        let obj = object_ref(&key).ok_or(undecoded::UNKNOWN_OBJECT)?;
        p.class = obj.class;
        p.gpu = obj.gpu;
        p.parent = obj.parent;
        (obj.mem_kind, obj.kind)
    };
    if mem != 0 {
        free_mem_handle(pid, tid, &key, p.escape);
        return Ok(());
    }
    let _ = OBJECTS.remove(key);
    let kind = ObjectKind::from_u32(kind);
    match kind {
        // The driver frees everything under the device (subdevice) with it.
        ObjectKind::Device => queue_teardown(
            pid,
            tid,
            p.client,
            &Scope {
                device: p.handle,
                sub: 0,
            },
            teardown::DEVICE_FREED,
        ),
        ObjectKind::Subdevice => queue_teardown(
            pid,
            tid,
            p.client,
            &Scope {
                device: 0,
                sub: p.handle,
            },
            teardown::SUBDEVICE_FREED,
        ),
        _ => {}
    }
    emit_free(pid, tid, p, kind);
    Ok(())
}

#[inline(never)]
fn emit_free(pid: u32, tid: u32, p: &PendingIoctl, kind: ObjectKind) {
    emit(GpuFreeEvent {
        header: header(EventKind::GpuFree, pid, tid),
        client: p.client,
        handle: p.handle,
        class: p.class,
        kind: kind as u32,
        gpu: p.gpu,
        mem_kind: 0,
        freed_pid: 0,
        escape: p.escape,
        bytes: 0,
    });
}
