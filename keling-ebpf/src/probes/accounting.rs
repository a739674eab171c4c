//! Exact GPU accounting in kernel maps: open files, clients, objects, totals.
//!
//! Everything here runs at syscall exit (or at close/exit), from what the driver
//! returned, and never depends on the ring buffer: the events it emits are detail
//! for the timeline; the maps are the truth. See keling-common's `gpu` module for the
//! model.
use aya_ebpf::{
    EbpfContext,
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use keling_common::{
    ALL_GPUS, CLIENT_CONTRIBUTORS, ClientInfo, EventKind, FD_SLOTS, FILE_CLIENTS, FdSlot, FileInfo,
    GpuEvent, GpuFileEvent, MAX_CLIENTS, MAX_FILES, MAX_OBJECTS, MAX_TOTALS, MAX_TRACKED_PIDS,
    ObjectInfo, ObjectKey, ProcFds, TotalKey, Totals, teardown, undecoded,
};

use crate::{atomic_add, atomic_cas, emit, header};

#[map]
pub static PROC_FDS: HashMap<u32, ProcFds> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);
#[map]
pub static FILES: HashMap<u64, FileInfo> = HashMap::with_max_entries(MAX_FILES, 0);
#[map]
pub static CLIENTS: HashMap<u32, ClientInfo> = HashMap::with_max_entries(MAX_CLIENTS, 0);
#[map]
pub static OBJECTS: HashMap<ObjectKey, ObjectInfo> = HashMap::with_max_entries(MAX_OBJECTS, 0);
#[map]
pub static TOTALS: HashMap<TotalKey, Totals> = HashMap::with_max_entries(MAX_TOTALS, 0);
#[map]
pub static UNDECODED: PerCpuArray<u64> = PerCpuArray::with_max_entries(undecoded::COUNT, 0);
#[map]
pub static UNDECODED_PID: HashMap<u32, u64> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);

/// Zeroed values to insert from (too large for the 512-byte BPF stack).
#[map]
static ZERO_FDS: Array<ProcFds> = Array::with_max_entries(1, 0);
#[map]
static ZERO_CLIENT: Array<ClientInfo> = Array::with_max_entries(1, 0);
/// [0]: client generation counter; [1]: file id counter.
#[map]
static COUNTERS: Array<u64> = Array::with_max_entries(2, 0);

const BPF_NOEXIST: u64 = 1;

/// A fresh, never-zero number from counter `idx`.
#[inline(always)]
fn next_id(idx: u32) -> u64 {
    match COUNTERS.get_ptr_mut(idx) {
        // SAFETY: an 8-byte aligned map value, updated only atomically.
        Some(p) => (unsafe { atomic_add(p, 1) }) + 1,
        None => 1,
    }
}

pub fn new_file_id() -> u64 {
    next_id(1)
}

pub fn count_undecoded(pid: u32, reason: u32) {
    if let Some(c) = UNDECODED.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot.
        unsafe { *c += 1 };
    }
    match UNDECODED_PID.get_ptr_mut(pid) {
        // SAFETY: an aligned map value, updated atomically.
        Some(p) => unsafe { atomic_add(p, 1) },
        None => {
            let _ = UNDECODED_PID.insert(pid, 1u64, 0);
            0
        }
    };
}

/// Adds `delta` to `*field` and raises `*peak` to the result if it is higher, both
/// atomically (concurrent ioctls of one process run on several CPUs).
#[inline(always)]
fn add_with_peak(field: *mut u64, peak: *mut u64, delta: i64) {
    // SAFETY: both point into one aligned map value.
    let new = unsafe { atomic_add(field, delta as u64) }.wrapping_add(delta as u64);
    // Two tries, unrolled (a loop here multiplies the verifier's work in every
    // caller): a failed try means another CPU raised the peak meanwhile, and two
    // failures in a row need three concurrent updates of one process on one GPU.
    // SAFETY: as above.
    let seen = unsafe { core::ptr::read_volatile(peak) };
    if new <= seen {
        return;
    }
    // SAFETY: as above.
    let (now, done) = unsafe { atomic_cas(peak, seen, new) };
    if !done && new > now {
        // SAFETY: as above.
        let _ = unsafe { atomic_cas(peak, now, new) };
    }
}

fn totals_ptr(key: &TotalKey) -> Option<*mut Totals> {
    if let Some(p) = TOTALS.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = TOTALS.insert(key, Totals::default(), BPF_NOEXIST);
    TOTALS.get_ptr_mut(key)
}

/// A change to one `Totals` entry (passed by reference: BPF calls take at most five
/// arguments).
#[derive(Clone, Copy)]
pub struct Delta {
    pub bytes: i64,
    pub host: i64,
    pub allocs: u64,
    pub frees: u64,
}

/// Adds an allocation (`bytes`/`host` >= 0) to one entry, raising its peaks.
#[inline(always)]
fn charge_one(key: TotalKey, d: &Delta) {
    let Some(t) = totals_ptr(&key) else { return };
    // SAFETY: a valid map value pointer; fields updated atomically.
    unsafe {
        add_with_peak(&raw mut (*t).bytes, &raw mut (*t).peak_bytes, d.bytes);
        add_with_peak(
            &raw mut (*t).host_bytes,
            &raw mut (*t).peak_host_bytes,
            d.host,
        );
        atomic_add(&raw mut (*t).allocs, d.allocs);
    }
}

/// Takes a free (`bytes`/`host` <= 0) off one entry: no peak can change, and the
/// entry exists (it was charged), so this path is short; the teardown loops,
/// which the verifier walks once per client and contributor, depend on that.
#[inline(always)]
fn uncharge_one(key: TotalKey, d: &Delta) {
    let Some(t) = TOTALS.get_ptr_mut(key) else {
        return;
    };
    // SAFETY: a valid map value pointer; fields updated atomically.
    unsafe {
        atomic_add(&raw mut (*t).bytes, d.bytes as u64);
        atomic_add(&raw mut (*t).host_bytes, d.host as u64);
        atomic_add(&raw mut (*t).frees, d.frees);
    }
}

/// Applies an allocation to the (pid, gpu), (pid, all GPUs) and (device) totals.
#[inline(never)]
pub fn add_totals(pid: u32, gpu: u32, d: &Delta) {
    charge_one(TotalKey { pid, gpu }, d);
    charge_one(TotalKey { pid, gpu: ALL_GPUS }, d);
    charge_one(TotalKey { pid: 0, gpu }, d);
}

/// Applies a free to the same three totals.
#[inline(never)]
pub fn sub_totals(pid: u32, gpu: u32, d: &Delta) {
    uncharge_one(TotalKey { pid, gpu }, d);
    uncharge_one(TotalKey { pid, gpu: ALL_GPUS }, d);
    uncharge_one(TotalKey { pid: 0, gpu }, d);
}

/// Records a new client on the open file `file_id`.
pub fn new_client(pid: u32, handle: u32, file_id: u64) {
    let Some(zero) = ZERO_CLIENT.get_ptr(0) else {
        return;
    };
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    // SAFETY: a map value pointer, valid for this program run.
    let _ = CLIENTS.insert(handle, unsafe { &*zero }, 0);
    if let Some(c) = CLIENTS.get_ptr_mut(handle) {
        // SAFETY: as above.
        unsafe {
            (*c).file_id = file_id;
            (*c).creator_pid = pid;
            (*c).gen_ = next_id(0) as u32;
        }
    }
    let Some(f) = FILES.get_ptr_mut(file_id) else {
        return;
    };
    for i in 0..FILE_CLIENTS {
        // SAFETY: as above; i is in bounds.
        let slot = unsafe { &mut (*f).clients[i] };
        if *slot == 0 || *slot == handle {
            *slot = handle;
            return;
        }
    }
    count_undecoded(pid, undecoded::TABLE_FULL);
}

/// Adds a memory object's bytes to its client's contributor slot and the totals.
#[inline(always)]
pub fn charge(pid: u32, client: *mut ClientInfo, device: u32, gpu: u32, bytes: u64, host: bool) {
    let mut free = CLIENT_CONTRIBUTORS;
    for i in 0..CLIENT_CONTRIBUTORS {
        // SAFETY: a map value pointer; i is in bounds.
        let c = unsafe { &mut (*client).contributors[i] };
        if c.pid == pid && c.device == device && c.gpu == gpu {
            free = i;
            break;
        }
        if c.pid == 0 && free == CLIENT_CONTRIBUTORS {
            free = i;
        }
    }
    if free == CLIENT_CONTRIBUTORS {
        // The totals still count it; a later client teardown cannot subtract it.
        count_undecoded(pid, undecoded::TABLE_FULL);
    } else if free < CLIENT_CONTRIBUTORS {
        // SAFETY: as above.
        let c = unsafe { &mut (*client).contributors[free] };
        c.pid = pid;
        c.device = device;
        c.gpu = gpu;
        c.objects += 1;
        if host {
            c.host_bytes += bytes;
        } else {
            c.bytes += bytes;
        }
    }
    let (b, h) = if host {
        (0, bytes as i64)
    } else {
        (bytes as i64, 0)
    };
    add_totals(
        pid,
        gpu,
        &Delta {
            bytes: b,
            host: h,
            allocs: 1,
            frees: 0,
        },
    );
}

/// Takes a freed memory object's bytes back from its contributor slot and totals.
pub fn uncharge(client: *mut ClientInfo, obj: &ObjectInfo, host: bool) {
    for i in 0..CLIENT_CONTRIBUTORS {
        // SAFETY: a map value pointer; i is in bounds.
        let c = unsafe { &mut (*client).contributors[i] };
        if c.pid == obj.owner_pid && c.device == obj.device && c.gpu == obj.gpu {
            c.objects = c.objects.saturating_sub(1);
            if host {
                c.host_bytes = c.host_bytes.saturating_sub(obj.bytes);
            } else {
                c.bytes = c.bytes.saturating_sub(obj.bytes);
            }
            if c.objects == 0 {
                // Empty: free the slot for another contributor.
                *c = Default::default();
            }
            break;
        }
    }
    let freed = -(obj.bytes as i64);
    let (bytes, host) = if host { (0, freed) } else { (freed, 0) };
    sub_totals(
        obj.owner_pid,
        obj.gpu,
        &Delta {
            bytes,
            host,
            allocs: 0,
            frees: 1,
        },
    );
}

/// Frees everything a client holds (all of it, or only what hangs under `device`
/// when it is non-zero), as the driver does, and reports each contributor.
#[inline(never)]
pub fn teardown_client(pid: u32, tid: u32, handle: u32, device: u32, reason: u32) {
    let Some(client) = CLIENTS.get_ptr_mut(handle) else {
        return;
    };
    for i in 0..CLIENT_CONTRIBUTORS {
        // SAFETY: a map value pointer; i is in bounds.
        let c = unsafe { &mut (*client).contributors[i] };
        if c.pid == 0 || (device != 0 && c.device != device) {
            continue;
        }
        let d = Delta {
            bytes: -(c.bytes as i64),
            host: -(c.host_bytes as i64),
            allocs: 0,
            frees: c.objects as u64,
        };
        sub_totals(c.pid, c.gpu, &d);
        emit(GpuEvent {
            header: header(EventKind::GpuTeardown, pid, tid),
            client: handle,
            parent: 0,
            handle: c.device,
            class: 0,
            kind: 0,
            gpu: c.gpu,
            bytes: c.bytes,
            host_bytes: c.host_bytes,
            owner_pid: c.pid,
            escape: 0,
            cmd: 0,
            control_cmd: c.objects,
            status: 0,
            fd: -1,
            ret: 0,
            reason,
            via_xfer: 0,
        });
        *c = Default::default();
    }
    if device == 0 {
        let _ = CLIENTS.remove(handle);
    }
}

/// The last reference to an open file went away: the driver frees every client
/// created on it.
#[inline(never)]
pub fn release_file(pid: u32, tid: u32, file_id: u64) {
    let Some(f) = FILES.get_ptr(file_id) else {
        return;
    };
    for i in 0..FILE_CLIENTS {
        // SAFETY: a map value pointer; i is in bounds.
        let client = unsafe { (*f).clients[i] };
        if client == 0 {
            continue;
        }
        // The client may have been freed (and its handle reused on another file).
        // SAFETY: copied out at once.
        let on_this_file = unsafe { CLIENTS.get(client) }.is_some_and(|c| c.file_id == file_id);
        if on_this_file {
            teardown_client(pid, tid, client, 0, teardown::FILE_RELEASED);
        }
    }
    let _ = FILES.remove(file_id);
}

/// Drops one fd reference to `file_id`. At zero the file is released: it is queued
/// for [`release_files`], which the caller reaches with [`run_releases`] as its
/// last act. Returns whether it was released.
pub fn drop_file_ref(pid: u32, tid: u32, file_id: u64) -> bool {
    let Some(f) = FILES.get_ptr_mut(file_id) else {
        return false;
    };
    // SAFETY: a map value pointer.
    let left = unsafe {
        (*f).refs = (*f).refs.saturating_sub(1);
        (*f).refs
    };
    if left != 0 {
        return false;
    }
    let Some(q) = RELEASE_QUEUE.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: this CPU's slot; programs run to completion on one CPU.
    unsafe {
        let n = (*q).len as usize;
        if n < FD_SLOTS {
            (*q).pid = pid;
            (*q).tid = tid;
            (*q).file_ids[n] = file_id;
            (*q).len += 1;
        } else {
            count_undecoded(pid, undecoded::TABLE_FULL);
        }
    }
    true
}

/// Releases queued files in [`release_files`] (a tail call: releasing a file is
/// too much work to verify inside every program that can close one). Call last.
#[inline(always)]
pub fn run_releases<C: EbpfContext>(ctx: &C) {
    // SAFETY: copied out at once.
    let pending = RELEASE_QUEUE.get(0).is_some_and(|q| q.len != 0);
    if pending {
        // SAFETY: a tail call to a program of the same type; on success it does not return.
        unsafe { RELEASE_PROG.tail_call(ctx, 0) };
        // Only reached if the tail call failed: the files stay queued for the next
        // caller on this CPU.
    }
}

/// Queue of files whose last reference went away, per CPU.
#[repr(C)]
pub struct ReleaseQueue {
    pid: u32,
    tid: u32,
    len: u32,
    _reserved: u32,
    file_ids: [u64; FD_SLOTS],
}

#[map]
static RELEASE_QUEUE: PerCpuArray<ReleaseQueue> = PerCpuArray::with_max_entries(1, 0);
/// [0]: `release_files`, set by the agent at load time.
#[map]
static RELEASE_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Releases one queued file, then tail-calls itself for the next. Attached to
/// nothing: only reached through `RELEASE_PROG`.
#[tracepoint(category = "keling", name = "release_files")]
pub fn release_files(ctx: TracePointContext) -> i32 {
    let Some(q) = RELEASE_QUEUE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot.
    let q = unsafe { &mut *q };
    let n = q.len as usize;
    let Some(&file_id) = n.checked_sub(1).and_then(|last| q.file_ids.get(last)) else {
        q.len = 0;
        return 0;
    };
    q.len -= 1;
    let (pid, tid) = (q.pid, q.tid);
    release_file(pid, tid, file_id);
    run_releases(&ctx);
    0
}

pub fn add_file_ref(file_id: u64) {
    if let Some(f) = FILES.get_ptr_mut(file_id) {
        // SAFETY: a map value pointer.
        unsafe { (*f).refs += 1 };
    }
}

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

/// Emits an open/close/dup event.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "always inlined: no BPF call with > 5 arguments"
)]
pub fn file_event(
    kind: EventKind,
    pid: u32,
    tid: u32,
    fd: i32,
    device: u32,
    file_id: u64,
    released: u32,
    arg: u32,
) {
    emit(GpuFileEvent {
        header: header(kind, pid, tid),
        fd,
        device,
        file_id,
        released,
        arg,
    });
}

/// Closes one fd: empties its slot, drops its reference to the file (queueing the
/// release at zero) and reports the close.
#[inline(always)]
pub fn close_slot(pid: u32, tid: u32, slot: &mut FdSlot) {
    let (fd, device, file_id) = (slot.fd, slot.device, slot.file_id);
    *slot = Default::default();
    let released = drop_file_ref(pid, tid, file_id);
    file_event(
        EventKind::GpuClose,
        pid,
        tid,
        fd,
        device,
        file_id,
        released as u32,
        0,
    );
}

/// Closes every slot of `fds` (all, or only the close-on-exec ones).
#[inline(never)]
pub fn close_slots(pid: u32, tid: u32, fds: *mut ProcFds, only_cloexec: bool) {
    for i in 0..FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        let slot = unsafe { &mut (*fds).slots[i] };
        if slot.file_id == 0 || (only_cloexec && slot.cloexec == 0) {
            continue;
        }
        close_slot(pid, tid, slot);
    }
}
