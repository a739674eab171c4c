//! NVIDIA device files: which file is behind an fd, which fds of which process are
//! NVIDIA files, and when an open file is released.
//!
//! A file is an NVIDIA device by its inode, never by a path: the device number
//! (major 195: `nvidiactl` minor 255, `nvidiaN` minor N; the `nvidia-uvm` major,
//! minor 0), or, for the simulated driver, its (filesystem, inode number) listed by
//! the agent in `SIM_FILES`. The open file's `struct file` address is its identity.
//!
//! `PROC_FDS[pid]` lists the NVIDIA fds Keling knows in each process. They are
//! learned at open (any open syscall, any path), dup, fork, receipt over a unix
//! socket, pidfd_getfd, the first ioctl through an fd not seen before, and from
//! `/proc` when the agent starts. They matter for judging releases: a file is
//! released when its last reference goes, and at every place a known fd drops one
//! (close, close_range, dup2/dup3 onto it, exec, exit) the probes read the kernel's
//! own count of the file's references, so references held elsewhere (an unknown fd,
//! a message in flight, another process) keep it open exactly as in the kernel.
//!
//! `FILES[file]` holds what accounting keeps per open NVIDIA file (the clients
//! created through it, the memories an export file holds); this module owns the
//! map, creates its entries for accounting ([`file_info`]) and queues a file's
//! release or orphan check only when it has one. The release itself (tearing down
//! the clients) is accounting's, run later by the work programs (work.rs).
//!
//! Syscall tracepoint records put argument i at byte 16 + 8 * i, and the return
//! value of sys_exit_* at 16; that layout is fixed by the syscall tracing ABI.
use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_probe_read_user},
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use keling_common::{
    FD_SLOTS, FILE_CLIENTS, FILE_EXPORTS, FILE_UNRESOLVED, FdSlot, FileInfo, GpuCloseEvent,
    GpuOpenEvent, MAX_FILES, MAX_TRACKED_PIDS, ProcFds, SimFileKey, device_file, nvidia, open_how,
    table_full,
};

use super::deferred::{self, Work};
use super::orphans;
use crate::{
    atomic_add, btf_load, count_table_site, current_ids, emit, header, is_tracked_pid, kread,
    syscall_arg as arg, syscall_ret as ret, track,
};

/// The NVIDIA fds Keling knows, per process.
#[map]
pub static PROC_FDS: HashMap<u32, ProcFds> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);
/// Open NVIDIA files through which something was created, by `struct file` address.
#[map]
pub static FILES: HashMap<u64, FileInfo> = HashMap::with_max_entries(MAX_FILES, 0);
/// A zeroed fd table to insert from (too large for the 512-byte BPF stack).
#[map]
static ZERO_FDS: Array<ProcFds> = Array::with_max_entries(1, 0);

const BPF_NOEXIST: u64 = 1;

/// [0]: how many times a known fd has left a process's table (each [`closed`],
/// each table dropped at exit), counted after the change. `nvidia::backends::enter` keeps,
/// per CPU, the last (process, fd, file) it found in a table, with this count
/// then; while the count is the same, the table still says so, and the answer
/// stands without the hash lookup and the slot search. (Adding an fd or resolving
/// a slot takes back no answer found before; where an fd left a process unseen,
/// its table is as wrong as the memo.)
#[map]
static FD_TABLE_CHANGES: Array<u64> = Array::with_max_entries(1, 0);

/// The count of [`FD_TABLE_CHANGES`] now.
#[inline(always)]
pub fn fd_table_changes() -> u64 {
    // SAFETY: a map value pointer; other CPUs change it only atomically.
    FD_TABLE_CHANGES
        .get_ptr(0)
        .map_or(0, |n| unsafe { core::ptr::read_volatile(n) })
}

/// A known fd left a table: answers taken from the tables before are void.
#[inline(always)]
fn fd_table_changed() {
    if let Some(n) = FD_TABLE_CHANGES.get_ptr_mut(0) {
        // SAFETY: a map value pointer; every CPU changes it only atomically.
        unsafe { atomic_add(n, 1) };
    }
}

/// Simulated-driver files: (filesystem device, inode) -> device code. Filled by the
/// agent at load time from the files under `--dev-dir`.
#[map]
pub static SIM_FILES: HashMap<SimFileKey, u32> =
    HashMap::with_max_entries(keling_common::MAX_SIM_FILES, 0);

/// A dup or recvmsg in flight (sys_enter -> sys_exit), per thread.
#[derive(Clone, Copy)]
struct PendingFd {
    /// fcntl: the source fd of F_DUPFD*. recvmsg: the user `msghdr` address.
    arg: u64,
    kind: u32,
    _reserved: u32,
}

const PENDING_DUPFD: u32 = 1;
const PENDING_RECVMSG: u32 = 2;

#[map]
static PENDING_FD: HashMap<u32, PendingFd> =
    HashMap::with_max_entries(keling_common::MAX_PENDING, 0);

const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;
const CLOSE_RANGE_CLOEXEC: u64 = 1 << 2;
const SOL_SOCKET: u32 = 1;
const SCM_RIGHTS: u32 = 1;
/// fds read from one SCM_RIGHTS message.
const RECV_FDS: usize = 8;
/// `file_ref_t` values from here up mean released (6.13+).
const FILE_REF_RELEASED: u64 = 0xC000_0000_0000_0000;

/// The fd table of `pid`, created empty if needed.
pub fn proc_fds(pid: u32, create: bool) -> Option<*mut ProcFds> {
    if let Some(p) = PROC_FDS.get_ptr_mut(pid) {
        return Some(p);
    }
    if !create {
        return None;
    }
    let zero = ZERO_FDS.get_ptr(0)?;
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    // SAFETY: a map value pointer, valid for this program run.
    let inserted = PROC_FDS.insert(pid, unsafe { &*zero }, 0);
    inserted.ok()?;
    PROC_FDS.get_ptr_mut(pid)
}

/// Whether `pid`'s fd table (its first `FD_SLOTS` NVIDIA fds) holds `file_id`.
#[inline(always)]
pub fn in_fd_table(pid: u32, file_id: u64) -> bool {
    let Some(fds) = PROC_FDS.get_ptr(pid) else {
        return false;
    };
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        if unsafe { (*fds).slots[i].file_id } == file_id {
            return true;
        }
    }
    false
}

/// The `FILES` entry of `file_id`, created if needed.
pub fn file_info(file_id: u64, device: u32, pid: u32) -> Option<*mut FileInfo> {
    if let Some(f) = FILES.get_ptr_mut(file_id) {
        return Some(f);
    }
    let info = FileInfo {
        device,
        opener_pid: pid,
        clients: [0; FILE_CLIENTS],
        exports: [0; FILE_EXPORTS],
        gen_: super::accounting::next_file_gen(),
    };
    let _ = FILES.insert(file_id, info, BPF_NOEXIST);
    FILES.get_ptr_mut(file_id)
}

/// Queues the release of `file_id` (only files through which something was created
/// matter).
pub fn queue_release(pid: u32, tid: u32, file_id: u64) {
    if FILES.get_ptr(file_id).is_none() {
        return;
    }
    deferred::push(pid, tid, Work::ReleaseFile { file_id });
}

/// Queues the check of `file_id`, whose fd `pid` dropped while the kernel still
/// counts other references (only files through which something was created matter).
pub fn queue_orphan(pid: u32, tid: u32, file_id: u64) {
    if FILES.get_ptr(file_id).is_none() {
        return;
    }
    deferred::push(pid, tid, Work::Orphan { file_id });
}

/// The open file behind `fd` of the current task (its `struct file` address).
#[inline(never)]
pub fn file_of_fd(fd: i32) -> u64 {
    // SAFETY: no preconditions.
    file_in_table(unsafe { bpf_get_current_task_btf() } as u64, fd)
}

/// The open file behind `fd` of `task`, a pointer from `bpf_get_current_task_btf`
/// (the verifier rejects any other).
#[inline(always)]
pub fn file_in_table(task: u64, fd: i32) -> u64 {
    if fd < 0 {
        return 0;
    }
    // The task, its files and their fd table are objects the verifier knows by
    // their BTF types, and the offsets are constants to it (read-only data): plain
    // loads, fault-guarded by the JIT, instead of a helper call each.
    // SAFETY: a BTF-typed task (the verifier checks); each load is at a field of
    // its type (the loader's offsets come from this kernel's BTF).
    unsafe {
        let files = btf_load::<u64>(task, config!(task_files_off));
        if files == 0 {
            return 0;
        }
        let fdt = btf_load::<u64>(files, config!(files_fdt_off));
        if fdt == 0 {
            return 0;
        }
        let max = btf_load::<u32>(fdt, config!(fdt_max_fds_off));
        let array = btf_load::<u64>(fdt, config!(fdt_fd_off));
        if fd as u32 >= max {
            return 0;
        }
        // `struct file **`: not a typed object to the verifier, so a checked read.
        kread::<u64>(array, fd as u32 * 8).unwrap_or(0)
    }
}

/// Which NVIDIA device `file` is (a `device_file` code), or `NONE`.
#[inline(never)]
pub fn device_of_file(file: u64) -> u32 {
    if file == 0 {
        return device_file::NONE;
    }
    let Some(inode) = kread::<u64>(file, config!(file_inode_off)) else {
        return device_file::NONE;
    };
    let rdev = kread::<u32>(inode, config!(inode_rdev_off)).unwrap_or(0);
    let (major, minor) = (rdev >> 20, rdev & 0xf_ffff);
    if major == nvidia::NV_MAJOR {
        if minor == nvidia::NV_CTL_MINOR {
            return device_file::CTL;
        }
        if minor <= device_file::MAX_GPU {
            return minor;
        }
        return device_file::NONE;
    }
    let uvm = config!(uvm_major);
    if uvm != 0 && major == uvm {
        return if minor == 0 {
            device_file::UVM
        } else {
            device_file::NONE
        };
    }
    if major != 0 || config!(sim_files) == 0 {
        return device_file::NONE;
    }
    let Some(sb) = kread::<u64>(inode, config!(inode_sb_off)) else {
        return device_file::NONE;
    };
    let key = SimFileKey {
        dev: kread::<u32>(sb, config!(sb_dev_off)).unwrap_or(0),
        _reserved: 0,
        ino: kread::<u64>(inode, config!(inode_ino_off)).unwrap_or(0),
    };
    // SAFETY: copied out at once.
    unsafe { SIM_FILES.get(key) }
        .copied()
        .unwrap_or(device_file::NONE)
}

/// How many references the kernel counts on `file` (0 once released).
#[inline(always)]
pub fn file_refs(file: u64) -> u64 {
    let Some(v) = kread::<u64>(file, config!(file_ref_off)) else {
        return u64::MAX;
    };
    if config!(file_ref_biased) != 0 {
        // file_ref_t: the count - 1; released values are from FILE_REF_RELEASED up.
        if v >= FILE_REF_RELEASED { 0 } else { v + 1 }
    } else {
        v
    }
}

/// Whether fds of this process are followed: tracked processes, and in system-wide
/// mode every process (it becomes tracked when it has an NVIDIA device).
#[inline(always)]
pub fn follows(pid: u32) -> bool {
    config!(system_wide) != 0 || is_tracked_pid(pid)
}

/// Whether new fds of this process are learned: the processes `follows` says, and any
/// other process that already has an NVIDIA fd in its table (in `keling trace`, one
/// that got a traced process's file, e.g. over a unix socket, and used it), so that
/// its dups, closes, exec and exit are seen when it holds a traced file's last
/// reference.
#[inline(always)]
pub fn watches(pid: u32) -> bool {
    follows(pid) || PROC_FDS.get_ptr(pid).is_some()
}

/// The slot of `fd` in a process's table.
#[inline(always)]
pub fn find_slot(fds: *mut ProcFds, fd: i32) -> Option<usize> {
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            return Some(i);
        }
    }
    None
}

/// The file of a slot, resolving one the agent listed at start from the fd table.
#[inline(always)]
fn slot_file(slot: &mut FdSlot) -> u64 {
    if slot.file_id == FILE_UNRESOLVED {
        slot.file_id = file_of_fd(slot.fd);
        if slot.file_id == 0 {
            slot.file_id = FILE_UNRESOLVED;
        }
    }
    slot.file_id
}

/// Records that `fd` of the current process is the NVIDIA `file` (`device`), and
/// reports it. Tracks the process in system-wide mode.
#[inline(never)]
pub fn add_fd(fd: i32, device: u32, file: u64, how: u32, src_fd: i32) {
    let (pid, tid) = current_ids();
    if config!(system_wide) != 0 {
        track(pid, tid);
    }
    let Some(fds) = proc_fds(pid, true) else {
        return;
    };
    let mut free = FD_SLOTS;
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id != 0 && s.fd == fd {
            free = i;
            break;
        }
        if s.file_id == 0 && free == FD_SLOTS {
            free = i;
        }
    }
    if free >= FD_SLOTS {
        // The process has more NVIDIA fds than its table holds. The file is
        // watched host-wide from now on by the orphan sweep (which holds any
        // number, orphans.rs), so its release, at a close, exec, exit or in
        // another process, is found from the kernel's own count of its
        // references: the books stay exact. Its calls are still decoded:
        // accounting is by file. The count says where (`table_full_at`), once
        // per file; it is no loss, so it is not held against the process.
        // Only a file something was created through is watched (it has a `FILES`
        // entry: `accounting::attach_client` watches it from its first client,
        // see there): an fd with nothing on it has nothing to release, and
        // registering every such open let one process fill the host-wide
        // `FILES` table with nvidiactl opens (mode 0666) and leave other
        // processes' clients unaccounted.
        let watched = orphans::is_orphan(file);
        if !watched && FILES.get_ptr(file).is_some() {
            count_table_site(table_full::FD_TABLE);
            queue_orphan(pid, tid, file);
        }
        if how == open_how::FIRST_USE {
            // Every call on such an fd comes here: report it once, at its open.
            return;
        }
    } else {
        // SAFETY: as above.
        unsafe {
            (*fds).slots[free] = FdSlot {
                fd,
                device,
                file_id: file,
            }
        };
    }
    emit(GpuOpenEvent {
        header: header(keling_common::EventKind::GpuOpen, pid, tid),
        fd,
        device,
        file_id: file,
        how,
        src_fd,
    });
}

/// If `fd` is an NVIDIA file, records it.
#[inline(always)]
fn learn_fd(fd: i32, how: u32, src_fd: i32) {
    let file = file_of_fd(fd);
    let device = device_of_file(file);
    if device != device_file::NONE {
        add_fd(fd, device, file, how, src_fd);
    }
}

/// Reports the close of `slot` and, when `released`, queues its file's release.
#[inline(always)]
fn closed(pid: u32, tid: u32, slot: &FdSlot, released: bool) {
    fd_table_changed();
    if released {
        queue_release(pid, tid, slot.file_id);
    } else {
        queue_orphan(pid, tid, slot.file_id);
    }
    emit(GpuCloseEvent {
        header: header(keling_common::EventKind::GpuClose, pid, tid),
        fd: slot.fd,
        device: slot.device,
        file_id: slot.file_id,
        released: released as u32,
        _reserved: 0,
    });
}

// --- Opens -------------------------------------------------------------------

#[inline(always)]
fn exit_open(ctx: &TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let fd = ret(ctx);
    if fd >= 0 && follows(pid) {
        let file = file_of_fd(fd as i32);
        let device = device_of_file(file);
        if device != device_file::NONE {
            if FILES.get_ptr(file).is_some() {
                // A new open file where Keling still has one: that one was released
                // where Keling did not see it (see orphans.rs), and its memory reused.
                if deferred::is_empty() {
                    queue_release(0, 0, file);
                } else {
                    queue_release(pid, tid, file);
                }
            }
            add_fd(fd as i32, device, file, open_how::OPEN, -1);
        }
    }
    deferred::run(ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_openat")]
pub fn sys_exit_openat(ctx: TracePointContext) -> i32 {
    exit_open(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_exit_open")]
pub fn sys_exit_open(ctx: TracePointContext) -> i32 {
    exit_open(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_exit_openat2")]
pub fn sys_exit_openat2(ctx: TracePointContext) -> i32 {
    exit_open(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_exit_pidfd_getfd")]
pub fn sys_exit_pidfd_getfd(ctx: TracePointContext) -> i32 {
    let (pid, _) = current_ids();
    let fd = ret(&ctx);
    if fd >= 0 && watches(pid) {
        learn_fd(fd as i32, open_how::RECEIVED, -1);
    }
    0
}

// --- Dups --------------------------------------------------------------------

#[tracepoint(category = "syscalls", name = "sys_exit_dup")]
pub fn sys_exit_dup(ctx: TracePointContext) -> i32 {
    let (pid, _) = current_ids();
    let fd = ret(&ctx);
    if fd >= 0 && watches(pid) {
        learn_fd(fd as i32, open_how::DUP, -1);
    }
    0
}

/// dup2/dup3 returned `newfd`: whatever NVIDIA file was there before was closed
/// (its reference is already dropped, its release deferred to the return to user
/// space, so its count still reads), and `newfd` may now be an NVIDIA file.
#[inline(always)]
fn exit_dup2(ctx: &TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let fd = ret(ctx);
    if fd < 0 || !watches(pid) {
        return 0;
    }
    let fd = fd as i32;
    let now = file_of_fd(fd);
    if let Some(fds) = proc_fds(pid, false)
        && let Some(i) = find_slot(fds, fd)
    {
        // SAFETY: a map value pointer; i is in bounds.
        let slot = unsafe { &mut (*fds).slots[i] };
        let old = slot_file(slot);
        if old != now {
            let released = old != FILE_UNRESOLVED && file_refs(old) == 0;
            let gone = *slot;
            *slot = FdSlot::default();
            closed(pid, tid, &gone, released);
        }
    }
    let device = device_of_file(now);
    if device != device_file::NONE {
        add_fd(fd, device, now, open_how::DUP, -1);
    }
    deferred::run(ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_dup2")]
pub fn sys_exit_dup2(ctx: TracePointContext) -> i32 {
    exit_dup2(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_exit_dup3")]
pub fn sys_exit_dup3(ctx: TracePointContext) -> i32 {
    exit_dup2(&ctx)
}

#[tracepoint(category = "syscalls", name = "sys_enter_fcntl")]
pub fn sys_enter_fcntl(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let cmd = arg(&ctx, 1);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && watches(pid) {
        let p = PendingFd {
            arg: arg(&ctx, 0),
            kind: PENDING_DUPFD,
            _reserved: 0,
        };
        let _ = PENDING_FD.insert(tid, p, 0);
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_fcntl")]
pub fn sys_exit_fcntl(ctx: TracePointContext) -> i32 {
    let (_, tid) = current_ids();
    // SAFETY: copied out at once.
    let Some(p) = (unsafe { PENDING_FD.get(tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_FD.remove(tid);
    let fd = ret(&ctx);
    if p.kind == PENDING_DUPFD && fd >= 0 {
        learn_fd(fd as i32, open_how::DUP, p.arg as i32);
    }
    0
}

// --- fds received over a unix socket ----------------------------------------

#[tracepoint(category = "syscalls", name = "sys_enter_recvmsg")]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    if is_tracked_pid(pid) || PROC_FDS.get_ptr(pid).is_some() {
        let p = PendingFd {
            arg: arg(&ctx, 1),
            kind: PENDING_RECVMSG,
            _reserved: 0,
        };
        let _ = PENDING_FD.insert(tid, p, 0);
    }
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_recvmsg")]
pub fn sys_exit_recvmsg(ctx: TracePointContext) -> i32 {
    let (_, tid) = current_ids();
    // SAFETY: copied out at once.
    let Some(p) = (unsafe { PENDING_FD.get(tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_FD.remove(tid);
    if p.kind != PENDING_RECVMSG || ret(&ctx) < 0 {
        return 0;
    }
    let _ = received_fds(p.arg);
    0
}

#[inline(always)]
fn user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Learns the NVIDIA fds among those an SCM_RIGHTS message carried (the first
/// control message; `struct user_msghdr`: msg_control@32, msg_controllen@40;
/// `struct cmsghdr`: len@0, level@8, type@12, data@16).
#[inline(never)]
fn received_fds(msghdr: u64) -> Option<()> {
    let control = user::<u64>(msghdr + 32)?;
    let controllen = user::<u64>(msghdr + 40)?;
    if control == 0 || controllen < 16 {
        return None;
    }
    let len = user::<u64>(control)?;
    let level = user::<u32>(control + 8)?;
    let ty = user::<u32>(control + 12)?;
    if level != SOL_SOCKET || ty != SCM_RIGHTS || len < 16 {
        return None;
    }
    let n = ((len - 16) / 4) as usize;
    for i in 0..RECV_FDS {
        if i >= n {
            break;
        }
        if let Some(fd) = user::<i32>(control + 16 + 4 * i as u64) {
            learn_fd(fd, open_how::RECEIVED, -1);
        }
    }
    Some(())
}

// --- Closes --------------------------------------------------------------------

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
    // close() removes the fd even when it reports an error, so act at entry, while
    // the reference is still counted: ours is the last one if the count is 1.
    // SAFETY: a map value pointer; i is in bounds.
    let slot = unsafe { &mut (*fds).slots[i] };
    let file = slot_file(slot);
    let released = file != FILE_UNRESOLVED && file == file_of_fd(fd) && file_refs(file) <= 1;
    let gone = *slot;
    *slot = FdSlot::default();
    closed(pid, tid, &gone, released);
    deferred::run(&ctx);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_close_range")]
pub fn sys_enter_close_range(ctx: TracePointContext) -> i32 {
    let (pid, tid) = current_ids();
    let (first, last, flags) = (arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 2));
    if flags & CLOSE_RANGE_CLOEXEC != 0 {
        // Only marks them close-on-exec: exec will tell.
        return 0;
    }
    if proc_fds(pid, false).is_none() {
        return 0;
    }
    // One slot per tail call (all 16 in one program are too much for the
    // verifier), at the front of the queue: before the kernel closes anything.
    let first = first.min(u32::MAX as u64) as u32;
    let last = last.min(u32::MAX as u64) as u32;
    deferred::push_front(pid, tid, Work::close_range(pid, first, last));
    deferred::run(&ctx);
    0
}

/// `FdSlot.fd` of a slot being closed by a close_range still in progress: it
/// still counts among the references the call drops.
const CLOSING: i32 = -2;

/// Counters kept in memory rather than registers: the verifier does not follow
/// values in map memory, so loops that count do not multiply its states.
#[map]
static SCRATCH_COUNTS: aya_ebpf::maps::PerCpuArray<[u64; 2]> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// Adds one to a counter in memory. Volatile: kept in a register, the count would
/// again be a value the verifier follows.
#[inline(always)]
fn bump(counters: *mut [u64; 2], i: usize) {
    // SAFETY: a per-CPU map value; i < 2.
    unsafe {
        let p = &raw mut (*counters)[i & 1];
        core::ptr::write_volatile(p, core::ptr::read_volatile(p) + 1);
    }
}

/// One step of a close_range of `first..=last`: judges the first slot at or after
/// `from` whose fd is in range, at its file's last slot in the range (the drops
/// release it when they are all the references the kernel counts), and marks it
/// closing. Returns the slot after it, or `u32::MAX` when no slot is left, having
/// cleared the marked ones.
#[inline(never)]
pub fn close_range_step(pid: u32, tid: u32, first: u32, last: u32, from: u32) -> u32 {
    let (Some(fds), Some(counters)) = (proc_fds(pid, false), SCRATCH_COUNTS.get_ptr_mut(0)) else {
        return u32::MAX;
    };
    let in_range =
        |s: &FdSlot| s.file_id != 0 && s.fd >= 0 && (s.fd as u32) >= first && (s.fd as u32) <= last;
    let mut at = FD_SLOTS;
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        if i as u32 >= from && in_range(unsafe { &(*fds).slots[i] }) {
            at = i;
            break;
        }
    }
    if at >= FD_SLOTS {
        for i in 0..FD_SLOTS {
            // SAFETY: as above.
            let slot = unsafe { &mut (*fds).slots[i] };
            if slot.fd == CLOSING {
                *slot = FdSlot::default();
            }
        }
        return u32::MAX;
    }
    // SAFETY: as above; `at` is in bounds.
    let slot = unsafe { &mut (*fds).slots[at] };
    let file = slot_file(slot);
    // [0]: this call's drops of the file; [1]: its slots still to come.
    // SAFETY: this CPU's counters.
    unsafe { *counters = [1, 0] };
    for j in 0..FD_SLOTS {
        // SAFETY: as above.
        let other = unsafe { &(*fds).slots[j] };
        if j != at && other.file_id == file && (other.fd == CLOSING || in_range(other)) {
            bump(counters, 0);
            if other.fd != CLOSING && j > at {
                bump(counters, 1);
            }
        }
    }
    // SAFETY: as above.
    let [drops, later] = unsafe { core::ptr::read_volatile(counters) };
    let released = later == 0 && file != FILE_UNRESOLVED && file_refs(file) <= drops;
    let gone = *slot;
    slot.fd = CLOSING;
    closed(pid, tid, &gone, released);
    at as u32 + 1
}

/// exec: the close-on-exec fds are gone already (their release, if it was the last
/// reference, is deferred to the return to user space, so the count still reads 0).
#[inline(always)]
pub fn on_exec(pid: u32, tid: u32) {
    let Some(fds) = proc_fds(pid, false) else {
        return;
    };
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let slot = unsafe { &mut (*fds).slots[i] };
        if slot.file_id == 0 {
            continue;
        }
        let now = file_of_fd(slot.fd);
        let file = slot.file_id;
        if file == FILE_UNRESOLVED {
            // Never resolved: whatever is at its number now is its file, or it is gone.
            if now == 0 {
                *slot = FdSlot::default();
            } else {
                slot.file_id = now;
            }
            continue;
        }
        if now == file {
            continue;
        }
        let released = file_refs(file) == 0;
        let gone = *slot;
        *slot = FdSlot::default();
        closed(pid, tid, &gone, released);
    }
}

/// The process is gone: its fd table goes after this probe. Each file is released
/// when this process's fds are all the references the kernel counts.
#[inline(always)]
pub fn on_exit(pid: u32, tid: u32) {
    if let Some(fds) = proc_fds(pid, false) {
        exit_slots(pid, tid, fds);
        let _ = PROC_FDS.remove(pid);
        fd_table_changed();
    }
}

#[inline(never)]
fn exit_slots(pid: u32, tid: u32, fds: *mut ProcFds) {
    let Some(counters) = SCRATCH_COUNTS.get_ptr_mut(0) else {
        return;
    };
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let slot = unsafe { &mut (*fds).slots[i] };
        if slot.file_id == 0 {
            continue;
        }
        let file = slot_file(slot);
        // How many of this process's fds refer to the file, and how many of them
        // come later (the last judges).
        // SAFETY: this CPU's counters.
        unsafe { *counters = [0, 0] };
        for j in 0..FD_SLOTS {
            // SAFETY: as above.
            if unsafe { (*fds).slots[j].file_id } == file {
                bump(counters, 0);
                if j > i {
                    bump(counters, 1);
                }
            }
        }
        // SAFETY: as above.
        let [mine, later] = unsafe { core::ptr::read_volatile(counters) };
        let released = later == 0 && file != FILE_UNRESOLVED && file_refs(file) <= mine;
        let gone = *slot;
        closed(pid, tid, &gone, released);
    }
}

/// fork: the child gets a copy of the parent's NVIDIA fds (each a new reference,
/// which the kernel counts).
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
    let _ = PROC_FDS.insert(child, unsafe { &*fds }, 0);
}
