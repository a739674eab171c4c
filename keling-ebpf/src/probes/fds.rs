//! NVIDIA device fds: which fds of which process refer to which open file.
//!
//! Recognised at `openat` by path (`<dev-dir>/nvidiactl`, `nvidiaN`, `nvidia-uvm`),
//! then followed through dup/dup2/dup3/fcntl(F_DUPFD*), close, close_range,
//! FD_CLOEXEC, fork (see process.rs), exec (close-on-exec) and exit.
//!
//! Syscall tracepoint records put argument i at byte 16 + 8 * i, and the return
//! value of sys_exit_* at 16; that layout is fixed by the syscall tracing ABI.
use aya_ebpf::{
    helpers::bpf_probe_read_user_str_bytes,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use keling_common::{
    DEV_PREFIX_LEN, EventKind, FD_SLOTS, FdSlot, FileInfo, ProcFds, TrackedProcess, device_file,
};

use super::accounting::{
    FILES, add_file_ref, close_slot, close_slots, file_event, new_file_id, proc_fds, run_releases,
};
use crate::{TRACKED_PIDS, TRACKED_TIDS, current_ids, is_tracked_pid};

const O_CLOEXEC: u64 = 0o2_000_000;
const F_DUPFD: u64 = 0;
const F_SETFD: u64 = 2;
const F_DUPFD_CLOEXEC: u64 = 1030;
const FD_CLOEXEC: u64 = 1;
const CLOSE_RANGE_CLOEXEC: u64 = 1 << 2;

/// An open or dup in flight (sys_enter -> sys_exit), per thread.
#[derive(Clone, Copy)]
struct PendingFd {
    /// For open: the device file. For dup: the source slot's.
    device: u32,
    cloexec: u32,
    /// 0 for an open; the duplicated file for a dup.
    file_id: u64,
    src_fd: i32,
    _reserved: u32,
}

#[map]
static PENDING_FD: HashMap<u32, PendingFd> =
    HashMap::with_max_entries(keling_common::MAX_PENDING, 0);

#[inline(always)]
fn arg(ctx: &TracePointContext, i: usize) -> u64 {
    // SAFETY: syscall tracepoint records hold 6 u64 arguments from byte 16.
    unsafe { ctx.read_at::<u64>(16 + 8 * i) }.unwrap_or(0)
}

#[inline(always)]
fn ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: sys_exit_* records hold the return value at byte 16.
    unsafe { ctx.read_at::<i64>(16) }.unwrap_or(-1)
}

/// Finds the slot of `fd` in a process's table.
#[inline(always)]
fn find_slot(fds: *mut ProcFds, fd: i32) -> Option<usize> {
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            return Some(i);
        }
    }
    None
}

/// Which NVIDIA device `path` names, if any.
#[inline(always)]
fn match_device(path: &[u8; DEV_PREFIX_LEN + 16]) -> Option<u32> {
    let n = config!(dev_prefix_len) as usize;
    if n == 0 || n >= DEV_PREFIX_LEN {
        return None;
    }
    for (i, &b) in path.iter().enumerate().take(DEV_PREFIX_LEN) {
        if i >= n {
            break;
        }
        if b != config!(dev_prefix[i]) {
            return None;
        }
    }
    let tail = |k: usize| path.get(n + k).copied().unwrap_or(0xff);
    match (tail(0), tail(1), tail(2), tail(3), tail(4)) {
        (b'c', b't', b'l', 0, _) => Some(device_file::CTL),
        (b'-', b'u', b'v', b'm', 0) => Some(device_file::UVM),
        (d0 @ b'0'..=b'9', rest, r2, r3, _) => {
            let mut v = (d0 - b'0') as u32;
            let digits = [rest, r2, r3];
            for d in digits {
                match d {
                    0 => return (v <= 247).then_some(v),
                    b'0'..=b'9' => v = v * 10 + (d - b'0') as u32,
                    _ => return None,
                }
            }
            None
        }
        _ => None,
    }
}

/// Whether fds of this process are followed: tracked processes, and in system-wide
/// mode every process (it becomes tracked when it opens an NVIDIA device).
#[inline(always)]
fn follows(pid: u32) -> bool {
    is_tracked_pid(pid) || config!(system_wide) != 0
}

#[tracepoint(category = "syscalls", name = "sys_enter_openat")]
pub fn sys_enter_openat(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    if !follows(pid) {
        return 0;
    }
    let mut path = [0u8; DEV_PREFIX_LEN + 16];
    let filename = arg(&ctx, 1) as *const u8;
    // SAFETY: the helper bounds the copy and fails on a bad pointer.
    if unsafe { bpf_probe_read_user_str_bytes(filename, &mut path) }.is_err() {
        return 0;
    }
    let Some(device) = match_device(&path) else {
        return 0;
    };
    let cloexec = (arg(&ctx, 2) & O_CLOEXEC != 0) as u32;
    let p = PendingFd {
        device,
        cloexec,
        file_id: 0,
        src_fd: -1,
        _reserved: 0,
    };
    let _ = PENDING_FD.insert(tid, p, 0);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_openat")]
pub fn sys_exit_openat(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    // SAFETY: copied out at once.
    let Some(p) = (unsafe { PENDING_FD.get(tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_FD.remove(tid);
    let fd = ret(&ctx);
    if fd < 0 {
        return 0;
    }
    if !is_tracked_pid(pid) {
        // System-wide mode: a process that opens an NVIDIA device is tracked from now.
        let _ = TRACKED_PIDS.insert(
            pid,
            TrackedProcess {
                root_pid: pid,
                flags: 0,
            },
            0,
        );
        let _ = TRACKED_TIDS.insert(tid, pid, 0);
    }
    let file_id = new_file_id();
    let info = FileInfo {
        refs: 0,
        device: p.device,
        opener_pid: pid,
        _reserved: 0,
        clients: [0; 8],
    };
    if FILES.insert(file_id, info, 0).is_err() {
        return 0;
    }
    let slot = FdSlot {
        fd: fd as i32,
        device: p.device,
        file_id,
        cloexec: p.cloexec,
        _reserved: 0,
    };
    add_slot(pid, tid, &slot);
    file_event(
        EventKind::GpuOpen,
        pid,
        tid,
        fd as i32,
        p.device,
        file_id,
        0,
        p.cloexec,
    );
    0
}

/// Puts `new` (fd -> file) in the process's table and counts the reference.
fn add_slot(pid: u32, tid: u32, new: &FdSlot) {
    let fd = new.fd;
    let Some(fds) = proc_fds(pid, true) else {
        return;
    };
    let mut free = FD_SLOTS;
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &mut (*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            // dup2/dup3 onto an NVIDIA fd closed it first.
            close_slot(pid, tid, s);
            free = i;
            break;
        }
        if s.file_id == 0 && free == FD_SLOTS {
            free = i;
        }
    }
    if free >= FD_SLOTS {
        super::accounting::count_undecoded(pid, keling_common::undecoded::TABLE_FULL);
        return;
    }
    // SAFETY: as above.
    unsafe { (*fds).slots[free] = *new };
    add_file_ref(new.file_id);
}

#[tracepoint(category = "syscalls", name = "sys_enter_close")]
pub fn sys_enter_close(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let Some(fds) = proc_fds(pid, false) else {
        return 0;
    };
    let fd = arg(&ctx, 0) as i32;
    let Some(i) = find_slot(fds, fd) else {
        return 0;
    };
    // close() removes the fd even when it reports an error, so act at entry.
    // SAFETY: a map value pointer; i is in bounds.
    let slot = unsafe { &mut (*fds).slots[i] };
    close_slot(pid, tid, slot);
    run_releases(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_close_range")]
pub fn sys_enter_close_range(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let Some(fds) = proc_fds(pid, false) else {
        return 0;
    };
    let (first, last, flags) = (arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 2));
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &mut (*fds).slots[i] };
        let fd = s.fd as u64;
        if s.file_id == 0 || fd < first || fd > last {
            continue;
        }
        if flags & CLOSE_RANGE_CLOEXEC != 0 {
            s.cloexec = 1;
            continue;
        }
        close_slot(pid, tid, s);
    }
    run_releases(&ctx);
    0
}

/// Records a dup of `src` in flight, if `src` is an NVIDIA fd.
#[inline(always)]
fn enter_dup(src: i32, cloexec: bool) {
    let (pid, tid) = current_ids();
    let Some(fds) = proc_fds(pid, false) else {
        return;
    };
    let Some(i) = find_slot(fds, src) else { return };
    // SAFETY: a map value pointer; i is in bounds.
    let s = unsafe { (*fds).slots[i] };
    let p = PendingFd {
        device: s.device,
        cloexec: cloexec as u32,
        file_id: s.file_id,
        src_fd: src,
        _reserved: 0,
    };
    let _ = PENDING_FD.insert(tid, p, 0);
}

#[inline(always)]
fn exit_dup(ctx: &TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    // SAFETY: copied out at once.
    let Some(p) = (unsafe { PENDING_FD.get(tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_FD.remove(tid);
    let fd = ret(ctx);
    if fd < 0 || p.file_id == 0 || fd as i32 == p.src_fd {
        return 0;
    }
    let slot = FdSlot {
        fd: fd as i32,
        device: p.device,
        file_id: p.file_id,
        cloexec: p.cloexec,
        _reserved: 0,
    };
    add_slot(pid, tid, &slot);
    file_event(
        EventKind::GpuDup,
        pid,
        tid,
        fd as i32,
        p.device,
        p.file_id,
        0,
        p.src_fd as u32,
    );
    run_releases(ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup")]
pub fn sys_enter_dup(ctx: TracePointContext) -> i32 {
    enter_dup(arg(&ctx, 0) as i32, false);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_dup")]
pub fn sys_exit_dup(ctx: TracePointContext) -> i32 {
    exit_dup(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup2")]
pub fn sys_enter_dup2(ctx: TracePointContext) -> i32 {
    enter_dup(arg(&ctx, 0) as i32, false);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_dup2")]
pub fn sys_exit_dup2(ctx: TracePointContext) -> i32 {
    exit_dup(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_enter_dup3")]
pub fn sys_enter_dup3(ctx: TracePointContext) -> i32 {
    enter_dup(arg(&ctx, 0) as i32, arg(&ctx, 2) & O_CLOEXEC != 0);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_dup3")]
pub fn sys_exit_dup3(ctx: TracePointContext) -> i32 {
    exit_dup(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_enter_fcntl")]
pub fn sys_enter_fcntl(ctx: TracePointContext) -> i32 {
    let (fd, cmd, val) = (arg(&ctx, 0) as i32, arg(&ctx, 1), arg(&ctx, 2));
    match cmd {
        F_DUPFD | F_DUPFD_CLOEXEC => enter_dup(fd, cmd == F_DUPFD_CLOEXEC),
        F_SETFD => {
            let (pid, _) = current_ids();
            if let Some(fds) = proc_fds(pid, false)
                && let Some(i) = find_slot(fds, fd)
            {
                // SAFETY: a map value pointer; i is in bounds.
                unsafe { (*fds).slots[i].cloexec = (val & FD_CLOEXEC != 0) as u32 };
            }
        }
        _ => {}
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_fcntl")]
pub fn sys_exit_fcntl(ctx: TracePointContext) -> i32 {
    exit_dup(&ctx)
}

/// fork: the child gets a copy of the parent's NVIDIA fds (each a new reference).
#[inline(always)]
pub fn on_fork(parent: u32, child: u32) {
    let Some(fds) = proc_fds(parent, false) else {
        return;
    };
    // The child starts with a copy of the parent's table, inserted straight from
    // the parent's map value (too large for the BPF stack).
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    // SAFETY: a map value pointer, valid for this program run.
    let copied = super::accounting::PROC_FDS.insert(child, unsafe { &*fds }, 0);
    if copied.is_err() {
        return;
    }
    for i in 0..FD_SLOTS {
        // SAFETY: as above; i is in bounds.
        let file_id = unsafe { (*fds).slots[i].file_id };
        if file_id != 0 {
            add_file_ref(file_id);
        }
    }
}

/// exec: close-on-exec fds are closed.
#[inline(always)]
pub fn on_exec(pid: u32, tid: u32) {
    if let Some(fds) = proc_fds(pid, false) {
        close_slots(pid, tid, fds, true);
    }
}

/// The process is gone: all its fds are closed.
#[inline(always)]
pub fn on_exit(pid: u32, tid: u32) {
    if let Some(fds) = proc_fds(pid, false) {
        close_slots(pid, tid, fds, false);
        let _ = super::accounting::PROC_FDS.remove(pid);
    }
}
