//! NVIDIA driver ioctls: decoded at sys_enter (inputs) and sys_exit (what the driver
//! returned), following XFER_CMD, and turned into exact accounting.
//!
//! Only ioctls on fds in `PROC_FDS` are looked at: any other ioctl costs one hash
//! lookup (the process has no NVIDIA fd) or a scan of at most 16 slots.
use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use keling_common::{
    ClientInfo, EventKind, FD_SLOTS, GpuEvent, NO_GPU, ObjectInfo, ObjectKey, device_file,
    nvidia::{
        self, MEMORY_ALLOCATION_PARAMS_SIZE, NV0080_DEVICE_ID, ObjectKind, class, escape, nvos00,
        nvos02, nvos21, nvos32, nvos33, nvos34, nvos54, nvos64, size, uvm, xfer,
    },
    teardown, undecoded,
};

use super::accounting::{
    CLIENTS, OBJECTS, charge, count_undecoded, new_client, proc_fds, teardown_client, uncharge,
};
use crate::{current_ids, emit, emit_quiet, header};

/// What sys_enter learned, for sys_exit.
#[derive(Clone, Copy)]
struct PendingIoctl {
    /// User address of the escape's params (after following XFER).
    params: u64,
    /// `pAllocParms` (RM_ALLOC), else 0.
    alloc_params: u64,
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
    via_xfer: u32,
    /// 0, or 1 + an undecoded reason found at entry.
    undecoded: u32,
    _reserved: u32,
    /// Filled at exit: ioctl's return value and the object's size.
    ret: i64,
    bytes: u64,
}

#[map]
static PENDING_IOCTL: HashMap<u32, PendingIoctl> =
    HashMap::with_max_entries(keling_common::MAX_PENDING, 0);

#[inline(always)]
fn user<T>(addr: u64) -> Result<T, u32> {
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|_| undecoded::FAULT)
}

#[inline(always)]
fn user_u32(base: u64, off: usize) -> Result<u32, u32> {
    user::<u32>(base + off as u64)
}

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    // The fast path for every other ioctl on the host: one lookup.
    let Some(fds) = proc_fds(pid, false) else {
        return 0;
    };
    // SAFETY: syscall tracepoint records hold u64 arguments from byte 16.
    let (fd, cmd, arg) = unsafe {
        (
            ctx.read_at::<u64>(16).unwrap_or(u64::MAX) as i32,
            ctx.read_at::<u64>(24).unwrap_or(0) as u32,
            ctx.read_at::<u64>(32).unwrap_or(0),
        )
    };
    let mut device = device_file::NONE;
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            device = s.device;
            break;
        }
    }
    if device == device_file::NONE {
        return 0;
    }
    let mut p = PendingIoctl {
        params: arg,
        alloc_params: 0,
        cmd,
        escape: 0,
        size: 0,
        device,
        fd,
        client: 0,
        parent: 0,
        handle: 0,
        class: 0,
        gpu: if device < device_file::CTL {
            device
        } else {
            NO_GPU
        },
        sub: 0,
        via_xfer: 0,
        undecoded: 0,
        _reserved: 0,
        ret: 0,
        bytes: 0,
    };
    if let Err(reason) = decode_enter(&mut p) {
        p.undecoded = 1 + reason;
    }
    let _ = PENDING_IOCTL.insert(tid, p, 0);
    0
}

/// Reads the inputs of the call described by `p.cmd`/`p.params`.
#[inline(always)]
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
        p.escape = user_u32(p.params, xfer::CMD)? & 0xff;
        p.size = user_u32(p.params, xfer::SIZE)?;
        p.params = user::<u64>(p.params + xfer::PTR as u64)?;
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
            p.client = user_u32(base, nvos21::H_ROOT)?;
            p.parent = user_u32(base, nvos21::H_OBJECT_PARENT)?;
            p.class = user_u32(base, nvos21::H_CLASS)?;
            p.alloc_params = user::<u64>(base + nvos21::P_ALLOC_PARMS as u64)?;
            if p.class == class::NV01_DEVICE_0 {
                p.gpu = user_u32(p.alloc_params, NV0080_DEVICE_ID)?;
            }
        }
        escape::FREE => {
            if p.size != size::NVOS00_FREE {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            p.client = user_u32(base, nvos00::H_ROOT)?;
            p.parent = user_u32(base, nvos00::H_OBJECT_PARENT)?;
            p.handle = user_u32(base, nvos00::H_OBJECT_OLD)?;
        }
        escape::ALLOC_MEMORY => {
            if p.size != size::NVOS02_ALLOC_MEMORY {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            p.client = user_u32(base, nvos02::H_ROOT)?;
            p.parent = user_u32(base, nvos02::H_OBJECT_PARENT)?;
            p.class = user_u32(base, nvos02::H_CLASS)?;
        }
        escape::VID_HEAP_CONTROL => {
            if p.size != size::NVOS32_VID_HEAP {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            p.client = user_u32(base, nvos32::H_ROOT)?;
            p.parent = user_u32(base, nvos32::H_OBJECT_PARENT)?;
            p.sub = user_u32(base, nvos32::FUNCTION)?;
            p.handle = user_u32(base, nvos32::H_MEMORY)?;
            p.class = class::NV01_MEMORY_LOCAL_USER;
        }
        escape::CONTROL => {
            if p.size != size::NVOS54_CONTROL {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            p.client = user_u32(base, nvos54::H_CLIENT)?;
            p.handle = user_u32(base, nvos54::H_OBJECT)?;
            p.sub = user_u32(base, nvos54::CMD)?;
            if user_u32(base, nvos54::FLAGS)? & nvos54::FLAGS_FINN_SERIALIZED != 0 {
                return Err(undecoded::FINN_SERIALIZED);
            }
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
            p.client = user_u32(base, nvos33::H_CLIENT)?;
            p.handle = user_u32(base, nvos33::H_MEMORY)?;
        }
        escape::DUP_OBJECT
        | escape::SHARE
        | escape::ALLOC_CONTEXT_DMA2
        | escape::MAP_MEMORY_DMA
        | escape::UNMAP_MEMORY_DMA
        | escape::CARD_INFO
        | escape::REGISTER_FD
        | escape::CHECK_VERSION_STR
        | escape::ATTACH_GPUS_TO_FD => {}
        _ => return Err(undecoded::UNKNOWN_ESCAPE),
    }
    Ok(())
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    // SAFETY: copied out at once.
    let Some(mut p) = (unsafe { PENDING_IOCTL.get(tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_IOCTL.remove(tid);
    // SAFETY: sys_exit_* records hold the return value at byte 16.
    let ret = unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1);
    p.ret = ret;
    let mut status = 0;
    let mut reason = p.undecoded;
    if reason == 0 && ret == 0 {
        match decode_exit(pid, tid, &mut p) {
            Ok(Some(s)) => status = s,
            // Fully reported by decode_exit.
            Ok(None) => return 0,
            Err(r) => reason = 1 + r,
        }
    }
    if reason != 0 {
        count_undecoded(pid, reason - 1);
    }
    ioctl_event(
        pid,
        tid,
        &p,
        status,
        ret,
        reason,
        EventKind::GpuIoctl,
        p.bytes,
    );
    0
}

/// Emits one GPU event describing `p`.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "always inlined: no BPF call with > 5 arguments"
)]
fn ioctl_event(
    pid: u32,
    tid: u32,
    p: &PendingIoctl,
    status: u32,
    ret: i64,
    reason: u32,
    kind: EventKind,
    bytes: u64,
) {
    let event = GpuEvent {
        header: header(kind, pid, tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        class: p.class,
        kind: ObjectKind::of_class(p.class) as u32,
        gpu: p.gpu,
        bytes,
        host_bytes: 0,
        owner_pid: pid,
        escape: p.escape,
        cmd: p.cmd,
        control_cmd: p.sub,
        status,
        fd: p.fd,
        ret,
        reason,
        via_xfer: p.via_xfer,
    };
    // Plain ioctls and object creations are detail; memory changes may matter to
    // a decision at once.
    match kind {
        EventKind::GpuIoctl | EventKind::GpuObject => emit_quiet(event),
        _ => emit(event),
    }
}

/// Applies a successful call. `Ok(Some(status))`: report as a plain ioctl;
/// `Ok(None)`: already reported.
#[inline(always)]
fn decode_exit(pid: u32, tid: u32, p: &mut PendingIoctl) -> Result<Option<u32>, u32> {
    let base = p.params;
    if p.device == device_file::UVM {
        let status = match p.escape {
            uvm::INITIALIZE => user_u32(base, uvm::INITIALIZE_RM_STATUS)?,
            uvm::FREE => user_u32(base, uvm::FREE_RM_STATUS)?,
            _ => 0,
        };
        return Ok(Some(status));
    }
    match p.escape {
        escape::ALLOC => {
            let off = match p.size {
                size::NVOS64_ALLOC => nvos64::STATUS,
                nvos64::SIZE_PRE_535 => nvos64::STATUS_PRE_535,
                _ => config!(nvos21_status_off) as usize,
            };
            let status = user_u32(base, off)?;
            if status != 0 {
                // The size asked for: what a memory-pressure decision needs.
                if ObjectKind::has_memory_params(p.class) {
                    p.bytes = user::<u64>(p.alloc_params + MEMORY_ALLOCATION_PARAMS_SIZE as u64)?;
                }
                return Ok(Some(status));
            }
            p.handle = user_u32(base, nvos21::H_OBJECT_NEW)?;
            let kind = ObjectKind::of_class(p.class);
            let bytes = match p.class {
                class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => user::<u64>(p.alloc_params + 24)? + 1,
                c if ObjectKind::has_memory_params(c) => {
                    user::<u64>(p.alloc_params + MEMORY_ALLOCATION_PARAMS_SIZE as u64)?
                }
                class::NV01_MEMORY_LOCAL_PHYSICAL | class::NV_MEMORY_FABRIC => {
                    return Err(undecoded::UNKNOWN_LAYOUT);
                }
                _ => 0,
            };
            p.bytes = bytes;
            record_object(pid, tid, p, kind)?;
            Ok(None)
        }
        escape::ALLOC_MEMORY => {
            let status = user_u32(base, nvos02::STATUS)?;
            if status != 0 {
                return Ok(Some(status));
            }
            p.handle = user_u32(base, nvos02::H_OBJECT_NEW)?;
            let bytes = user::<u64>(base + nvos02::LIMIT as u64)? + 1;
            let kind = match ObjectKind::of_class(p.class) {
                ObjectKind::VideoMemory => ObjectKind::VideoMemory,
                _ => ObjectKind::HostMemory,
            };
            p.bytes = bytes;
            record_object(pid, tid, p, kind)?;
            Ok(None)
        }
        escape::VID_HEAP_CONTROL => {
            let status = user_u32(base, nvos32::STATUS)?;
            if status != 0 {
                return Ok(Some(status));
            }
            match p.sub {
                nvos32::FUNCTION_ALLOC_SIZE => {
                    p.handle = user_u32(base, nvos32::H_MEMORY)?;
                    let bytes = user::<u64>(base + nvos32::ALLOC_SIZE as u64)?;
                    p.bytes = bytes;
                    record_object(pid, tid, p, ObjectKind::VideoMemory)?;
                    Ok(None)
                }
                nvos32::FUNCTION_FREE => {
                    free_object(pid, tid, p)?;
                    Ok(None)
                }
                _ => Ok(Some(status)),
            }
        }
        escape::FREE => {
            let status = user_u32(base, nvos00::STATUS)?;
            if status != 0 {
                return Ok(Some(status));
            }
            free_object(pid, tid, p)?;
            Ok(None)
        }
        escape::CONTROL => Ok(Some(user_u32(base, nvos54::STATUS)?)),
        escape::MAP_MEMORY => Ok(Some(user_u32(base, nvos33::STATUS)?)),
        escape::UNMAP_MEMORY => Ok(Some(user_u32(base, nvos34::STATUS)?)),
        _ => Ok(Some(0)),
    }
}

/// The open file behind `fd` of `pid` (0 if it is not an NVIDIA fd).
fn fd_file_id(pid: u32, fd: i32) -> u64 {
    let Some(fds) = proc_fds(pid, false) else {
        return 0;
    };
    let mut file_id = 0;
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            file_id = s.file_id;
        }
    }
    file_id
}

/// A new object (or client) the driver created.
#[inline(never)]
fn record_object(pid: u32, tid: u32, p: &mut PendingIoctl, kind: ObjectKind) -> Result<(), u32> {
    let (bytes, ret) = (p.bytes, p.ret);
    if kind == ObjectKind::Client {
        new_client(pid, p.handle, fd_file_id(pid, p.fd));
        p.client = p.handle;
        ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuObject, 0);
        return Ok(());
    }
    if CLIENTS.get_ptr(p.client).is_none() {
        // A client created before Keling was watching (an fd adopted at start-up):
        // known from now on, so what is allocated under it from now on is exact.
        new_client(pid, p.client, fd_file_id(pid, p.fd));
    }
    let Some(client) = CLIENTS.get_ptr_mut(p.client) else {
        return Err(undecoded::UNKNOWN_OBJECT);
    };
    // SAFETY: a map value pointer.
    let client_gen = unsafe { (*client).gen_ };
    // Which device (and GPU) the object is under.
    let mut device = 0;
    if kind == ObjectKind::Device {
        device = p.handle;
    } else if p.parent != p.client {
        let key = ObjectKey {
            client: p.client,
            handle: p.parent,
        };
        // SAFETY: copied out at once.
        if let Some(parent) = unsafe { OBJECTS.get(key) } {
            device = parent.device;
            if p.gpu == NO_GPU {
                p.gpu = parent.gpu;
            }
        }
    }
    let info = ObjectInfo {
        class: p.class,
        kind: kind as u32,
        parent: p.parent,
        device,
        gpu: p.gpu,
        owner_pid: pid,
        client_gen,
        _reserved: 0,
        bytes,
    };
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    if OBJECTS.insert(key, info, 0).is_err() {
        return Err(undecoded::TABLE_FULL);
    }
    match kind {
        ObjectKind::VideoMemory | ObjectKind::HostMemory => {
            charge(
                pid,
                client,
                device,
                p.gpu,
                bytes,
                kind == ObjectKind::HostMemory,
            );
            ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuAlloc, bytes);
        }
        _ => ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuObject, 0),
    }
    Ok(())
}

/// RM_FREE (or VID_HEAP FREE) that the driver accepted.
#[inline(never)]
fn free_object(pid: u32, tid: u32, p: &mut PendingIoctl) -> Result<(), u32> {
    let ret = p.ret;
    if p.handle == p.client {
        if CLIENTS.get_ptr(p.client).is_none() {
            return Err(undecoded::UNKNOWN_OBJECT);
        }
        teardown_client(pid, tid, p.client, 0, teardown::CLIENT_FREED);
        ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuFree, 0);
        return Ok(());
    }
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    // SAFETY: copied out at once.
    let Some(obj) = (unsafe { OBJECTS.get(key) }).copied() else {
        return Err(undecoded::UNKNOWN_OBJECT);
    };
    let _ = OBJECTS.remove(key);
    let client: *mut ClientInfo = match CLIENTS.get_ptr_mut(p.client) {
        // SAFETY: a map value pointer.
        Some(c) if unsafe { (*c).gen_ } == obj.client_gen => c,
        _ => return Err(undecoded::UNKNOWN_OBJECT),
    };
    p.class = obj.class;
    p.gpu = obj.gpu;
    p.parent = obj.parent;
    match ObjectKind::from_u32(obj.kind) {
        kind @ (ObjectKind::VideoMemory | ObjectKind::HostMemory) => {
            uncharge(client, &obj, kind == ObjectKind::HostMemory);
            emit(GpuEvent {
                header: header(EventKind::GpuFree, pid, tid),
                client: p.client,
                parent: obj.parent,
                handle: p.handle,
                class: obj.class,
                kind: obj.kind,
                gpu: obj.gpu,
                bytes: obj.bytes,
                host_bytes: 0,
                owner_pid: obj.owner_pid,
                escape: p.escape,
                cmd: p.cmd,
                control_cmd: 0,
                status: 0,
                fd: p.fd,
                ret,
                reason: 0,
                via_xfer: p.via_xfer,
            });
        }
        ObjectKind::Device => {
            // The driver frees everything under the device with it.
            teardown_client(pid, tid, p.client, p.handle, teardown::DEVICE_FREED);
            ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuFree, 0);
        }
        _ => ioctl_event(pid, tid, p, 0, ret, 0, EventKind::GpuFree, 0),
    }
    Ok(())
}
