//! Exact GPU accounting in kernel maps: open files, clients, objects, memories,
//! totals. The rules are docs/gpu-accounting.md; the maps are described in
//! keling-common's `gpu` module.
//!
//! Everything here runs at syscall exit (or at close/exec/exit), from what the
//! driver returned, and never depends on the ring buffer: the events it emits are
//! detail for the timeline; the maps are the truth.
//!
//! Where a memory's bytes live: in the contributor (of its charged handle's client,
//! under that handle's device and subdevice) of the process charged with them, or,
//! when only export files still hold it, in no contributor (the process stays
//! charged until the last export reference goes). So a client teardown subtracts
//! its contributors en bloc, after moving out the memories it shares with others.
//!
//! This module owns `CLIENTS`, `OBJECTS`, `MEMS` and `TOTALS`. The open files'
//! entries (`FILES`) belong to files.rs; a file's release and a client's teardown
//! are queued as deferred work (deferred.rs) and done a step at a time by the work
//! programs (work.rs), which call [`release_file`], [`teardown_shared`] and
//! [`teardown_contributors`] here.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use keling_common::{
    ALL_GPUS, CLIENT_CONTRIBUTORS, ClientInfo, Contributor, EventKind, FILE_CLIENTS, FILE_EXPORTS,
    GpuChargeEvent, GpuFreeEvent, GpuTeardownEvent, MAX_CLIENTS, MAX_MEMS, MAX_OBJECTS, MAX_TOTALS,
    MEM_HANDLES, MemHandle, MemInfo, NO_HANDLE, ObjectInfo, ObjectKey, TotalKey, Totals, mem_kind,
    table_full, teardown,
};

use super::deferred::{self, Scope, Teardown, Work};
use super::files::{FILES, file_info};
use crate::{atomic_add, atomic_cas, count_table_full, emit, header};

#[map]
pub static CLIENTS: HashMap<u32, ClientInfo> = HashMap::with_max_entries(MAX_CLIENTS, 0);
#[map]
pub static OBJECTS: HashMap<ObjectKey, ObjectInfo> = HashMap::with_max_entries(MAX_OBJECTS, 0);
#[map]
pub static MEMS: HashMap<u64, MemInfo> = HashMap::with_max_entries(MAX_MEMS, 0);
#[map]
pub static TOTALS: HashMap<TotalKey, Totals> = HashMap::with_max_entries(MAX_TOTALS, 0);

/// Zeroed values to insert from (too large for the 512-byte BPF stack).
#[map]
static ZERO_CLIENT: Array<ClientInfo> = Array::with_max_entries(1, 0);
#[map]
static ZERO_MEM: Array<MemInfo> = Array::with_max_entries(1, 0);
/// [0]: client generation counter; [1]: memory id counter; [2]: file generation
/// counter.
#[map]
static COUNTERS: Array<u64> = Array::with_max_entries(3, 0);

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

/// A fresh, never-zero generation for a new `FILES` entry.
#[inline(always)]
pub fn next_file_gen() -> u64 {
    next_id(2)
}

// --- Totals ------------------------------------------------------------------------

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
    if delta <= 0 || new <= seen {
        return;
    }
    // SAFETY: as above.
    let (now, done) = unsafe { atomic_cas(peak, seen, new) };
    if !done && new > now {
        // SAFETY: as above.
        let _ = unsafe { atomic_cas(peak, now, new) };
    }
}

#[inline(always)]
fn totals_ptr(key: &TotalKey) -> Option<*mut Totals> {
    if let Some(p) = TOTALS.get_ptr_mut(key) {
        return Some(p);
    }
    let _ = TOTALS.insert(key, Totals::default(), BPF_NOEXIST);
    TOTALS.get_ptr_mut(key)
}

/// A change to one `Totals` entry (passed by reference: BPF calls take at most five
/// arguments).
#[derive(Clone, Copy, Default)]
pub struct Delta {
    pub bytes: i64,
    pub host: i64,
    pub egm: i64,
    pub driver: i64,
    pub allocs: u64,
    pub frees: u64,
}

impl Delta {
    /// `bytes` of memory of `kind`, positive or negative.
    #[inline(always)]
    fn of(kind: u32, bytes: i64) -> Self {
        let mut d = Delta::default();
        match kind {
            mem_kind::VIDEO => d.bytes = bytes,
            mem_kind::HOST => d.host = bytes,
            _ => d.egm = bytes,
        }
        d
    }
}

#[inline(always)]
fn apply_one(key: TotalKey, d: &Delta) {
    let Some(t) = totals_ptr(&key) else { return };
    // SAFETY: a valid map value pointer; fields updated atomically.
    unsafe {
        add_with_peak(&raw mut (*t).bytes, &raw mut (*t).peak_bytes, d.bytes);
        add_with_peak(
            &raw mut (*t).host_bytes,
            &raw mut (*t).peak_host_bytes,
            d.host,
        );
        atomic_add(&raw mut (*t).egm_bytes, d.egm as u64);
        atomic_add(&raw mut (*t).driver_bytes, d.driver as u64);
        atomic_add(&raw mut (*t).allocs, d.allocs);
        atomic_add(&raw mut (*t).frees, d.frees);
    }
}

/// Takes `d` (frees: no peak can change) off one entry that exists (it was
/// charged), so this path is short; the teardown loops depend on that.
#[inline(always)]
fn remove_one(key: TotalKey, d: &Delta) {
    let Some(t) = TOTALS.get_ptr_mut(key) else {
        return;
    };
    // SAFETY: a valid map value pointer; fields updated atomically.
    unsafe {
        atomic_add(&raw mut (*t).bytes, d.bytes as u64);
        atomic_add(&raw mut (*t).host_bytes, d.host as u64);
        atomic_add(&raw mut (*t).egm_bytes, d.egm as u64);
        atomic_add(&raw mut (*t).driver_bytes, d.driver as u64);
        atomic_add(&raw mut (*t).frees, d.frees);
    }
}

/// Applies a change to the (pid, gpu), (pid, all GPUs) and (device) totals.
#[inline(never)]
pub fn add_totals(pid: u32, gpu: u32, d: &Delta) {
    apply_one(TotalKey { pid, gpu }, d);
    apply_one(TotalKey { pid, gpu: ALL_GPUS }, d);
    apply_one(TotalKey { pid: 0, gpu }, d);
}

/// Applies a free (all fields <= 0) to the same three totals.
#[inline(never)]
pub fn sub_totals(pid: u32, gpu: u32, d: &Delta) {
    remove_one(TotalKey { pid, gpu }, d);
    remove_one(TotalKey { pid, gpu: ALL_GPUS }, d);
    remove_one(TotalKey { pid: 0, gpu }, d);
}

/// The driver's own figure for the creator of a client: video bytes only.
#[inline(always)]
fn driver_figure(creator: u32, gpu: u32, kind: u32, bytes: i64) {
    if kind == mem_kind::VIDEO && creator != 0 {
        let d = Delta {
            driver: bytes,
            ..Default::default()
        };
        if bytes >= 0 {
            add_totals(creator, gpu, &d);
        } else {
            sub_totals(creator, gpu, &d);
        }
    }
}

// --- Files and clients ----------------------------------------------------------

/// Records a new client created through the open file `file_id` (0: not known yet).
pub fn new_client(pid: u32, handle: u32, file_id: u64, device: u32) {
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
    if file_id != 0 {
        attach_client(handle, file_id, device, pid);
    }
}

/// Lists client `handle` on the open file `file_id`: its release frees it. A slot
/// whose client was freed since (or whose handle now names a client of another
/// file) is taken again: a file that lives long makes and frees many clients.
#[inline(never)]
pub fn attach_client(handle: u32, file_id: u64, device: u32, pid: u32) {
    let new_file = FILES.get_ptr(file_id).is_none();
    let Some(f) = file_info(file_id, device, pid) else {
        return;
    };
    // A file first used through an fd past the process's fd table (files.rs
    // registers no such file at its open) is watched by the orphan sweep from
    // its first client: its release is found from the kernel's own count.
    if new_file && !super::files::in_fd_table(pid, file_id) {
        crate::count_table_site(table_full::FD_TABLE);
        let (_, tid) = crate::current_ids();
        super::files::queue_orphan(pid, tid, file_id);
    }
    // Which file it is on, listed or not: the agent's sound lower bound of a
    // task's memory (for a figure a full table made unsure) counts a client's
    // objects only while this file lives.
    if let Some(c) = CLIENTS.get_ptr_mut(handle) {
        // SAFETY: map value pointers, valid for this program run.
        unsafe { (*c).file_gen = (*f).gen_ as u32 };
    }
    let mut free = FILE_CLIENTS;
    for i in 0..FILE_CLIENTS {
        // SAFETY: a map value pointer; i is in bounds.
        let c = unsafe { (*f).clients[i] };
        if c == handle {
            return;
        }
        if free == FILE_CLIENTS
            && (c == 0
                // SAFETY: copied out at once.
                || !unsafe { CLIENTS.get(c) }.is_some_and(|x| x.file_id == file_id))
        {
            free = i;
        }
    }
    if free == FILE_CLIENTS {
        count_table_full(pid, table_full::FILE_CLIENTS);
        return;
    }
    // SAFETY: as above; free is in bounds.
    unsafe { (*f).clients[free] = handle };
}

/// Puts object `key` (whose memory is now shared) on its client's list of
/// shared-memory handles, if it is not there already.
#[inline(never)]
pub fn link_shared(key: &ObjectKey) {
    let (Some(obj), Some(c)) = (OBJECTS.get_ptr_mut(key), CLIENTS.get_ptr_mut(key.client)) else {
        return;
    };
    // SAFETY: map value pointers, valid for this program run.
    unsafe {
        if (*obj).in_shared_list != 0 {
            return;
        }
        let head = (*c).shared_head;
        (*obj).shared_prev = 0;
        (*obj).shared_next = head;
        (*obj).in_shared_list = 1;
        if head != 0
            && let Some(first) = OBJECTS.get_ptr_mut(ObjectKey {
                client: key.client,
                handle: head,
            })
        {
            (*first).shared_prev = key.handle;
        }
        (*c).shared_head = key.handle;
    }
}

/// Takes object `key` off its client's list of shared-memory handles.
#[inline(never)]
fn unlink_shared(key: &ObjectKey) {
    let Some(obj) = OBJECTS.get_ptr_mut(key) else {
        return;
    };
    // SAFETY: map value pointers, valid for this program run.
    unsafe {
        if (*obj).in_shared_list == 0 {
            return;
        }
        let (prev, next) = ((*obj).shared_prev, (*obj).shared_next);
        (*obj).in_shared_list = 0;
        if prev != 0 {
            if let Some(p) = OBJECTS.get_ptr_mut(ObjectKey {
                client: key.client,
                handle: prev,
            }) {
                (*p).shared_next = next;
            }
        } else if let Some(c) = CLIENTS.get_ptr_mut(key.client) {
            (*c).shared_head = next;
        }
        if next != 0
            && let Some(n) = OBJECTS.get_ptr_mut(ObjectKey {
                client: key.client,
                handle: next,
            })
        {
            (*n).shared_prev = prev;
        }
    }
}

/// Some bytes of one kind on one GPU (passed by reference: BPF calls take at most
/// five arguments).
#[derive(Clone, Copy)]
pub struct Amount {
    pub gpu: u32,
    pub kind: u32,
    pub bytes: u64,
}

/// Adds (or takes back, `sign` -1) one memory object's bytes in a client's
/// contributor slot. Returns false when the table was full.
#[inline(never)]
fn contribute(client: *mut ClientInfo, h: &MemHandle, a: &Amount, sign: i32) -> bool {
    let (gpu, kind, bytes) = (a.gpu, a.kind, a.bytes);
    let mut slot = CLIENT_CONTRIBUTORS;
    for i in 0..CLIENT_CONTRIBUTORS {
        // SAFETY: a map value pointer; i is in bounds.
        let c = unsafe { &(*client).contributors[i] };
        if c.pid == h.pid && c.device == h.device && c.sub == h.sub && c.gpu == gpu {
            slot = i;
            break;
        }
        if c.pid == 0 && slot == CLIENT_CONTRIBUTORS && sign > 0 {
            slot = i;
        }
    }
    if slot >= CLIENT_CONTRIBUTORS {
        return false;
    }
    // SAFETY: as above.
    let c = unsafe { &mut (*client).contributors[slot] };
    let field = match kind {
        mem_kind::VIDEO => &mut c.bytes,
        mem_kind::HOST => &mut c.host_bytes,
        _ => &mut c.egm_bytes,
    };
    if sign > 0 {
        c.pid = h.pid;
        c.device = h.device;
        c.sub = h.sub;
        c.gpu = gpu;
        c.objects += 1;
        *field += bytes;
    } else {
        *field = field.saturating_sub(bytes);
        c.objects = c.objects.saturating_sub(1);
        if c.objects == 0 {
            *c = Contributor::default();
        }
    }
    true
}

// --- Memories ---------------------------------------------------------------------

/// Charges a new memory object of `bytes` (`kind`) on `gpu`, handle `h` in
/// `client`, to `h.pid`. Its bytes live in its `ObjectInfo` until it is shared.
#[inline(never)]
pub fn charge_new(client: *mut ClientInfo, h: &MemHandle, gpu: u32, kind: u32, bytes: u64) {
    if !contribute(client, h, &Amount { gpu, kind, bytes }, 1) {
        // The totals still count it; a client teardown cannot subtract it.
        count_table_full(h.pid, table_full::CONTRIBUTORS);
    }
    let mut d = Delta::of(kind, bytes as i64);
    d.allocs = 1;
    add_totals(h.pid, gpu, &d);
    // SAFETY: a map value pointer.
    driver_figure(unsafe { (*client).creator_pid }, gpu, kind, bytes as i64);
}

/// The shared memory of object `key`, created from it on first use (a dup,
/// import or export is about to add a reference). 0 when it cannot be.
#[inline(never)]
pub fn share(key: &ObjectKey) -> u64 {
    let Some(obj) = OBJECTS.get_ptr_mut(key) else {
        return 0;
    };
    // SAFETY: a map value pointer, valid for this program run.
    let obj = unsafe { &mut *obj };
    if obj.mem_id != 0 {
        return obj.mem_id;
    }
    let mem_id = next_id(1);
    let Some(zero) = ZERO_MEM.get_ptr(0) else {
        return 0;
    };
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    // SAFETY: a map value pointer, valid for this program run.
    if MEMS.insert(mem_id, unsafe { &*zero }, 0).is_err() {
        count_table_full(obj.owner_pid, table_full::MEMS);
        return 0;
    }
    let Some(m) = MEMS.get_ptr_mut(mem_id) else {
        return 0;
    };
    // SAFETY: as above.
    unsafe {
        (*m).bytes = obj.bytes;
        (*m).kind = obj.mem_kind;
        (*m).gpu = obj.gpu;
        (*m).charged_pid = obj.owner_pid;
        (*m).charged = 0;
        (*m).next_seq = 1;
        (*m).handles[0] = MemHandle {
            client: key.client,
            handle: key.handle,
            device: obj.device,
            sub: obj.sub,
            pid: obj.owner_pid,
            seq: 0,
        };
    }
    obj.mem_id = mem_id;
    link_shared(key);
    mem_id
}

/// A per-CPU place to build an `ObjectInfo` before inserting it (56 bytes the
/// deepest call chains cannot spare on the stack).
#[map]
static SCRATCH_OBJECT: PerCpuArray<ObjectInfo> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's object scratch, zeroed.
#[inline(always)]
pub fn scratch_object() -> Option<&'static mut ObjectInfo> {
    let o = SCRATCH_OBJECT.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; the program runs to completion on this CPU.
    let o = unsafe { &mut *o };
    *o = ObjectInfo::default();
    Some(o)
}

/// Adds handle `h` to memory `mem_id` (a dup or an import). Returns false when the
/// memory is unknown or its handle table is full.
#[inline(never)]
pub fn add_handle(mem_id: u64, h: &MemHandle) -> bool {
    let Some(m) = MEMS.get_ptr_mut(mem_id) else {
        return false;
    };
    for i in 0..MEM_HANDLES {
        // SAFETY: a map value pointer; i is in bounds.
        let slot = unsafe { &mut (*m).handles[i] };
        if slot.client == 0 {
            *slot = *h;
            // SAFETY: as above.
            unsafe {
                slot.seq = (*m).next_seq;
                (*m).next_seq += 1;
            }
            return true;
        }
    }
    count_table_full(h.pid, table_full::MEM_HANDLES);
    false
}

/// A memory that only export files held (no handle charged) is charged to its
/// oldest handle again: the one just added. (Inlined: calls nest at most 8 deep.)
#[inline(always)]
pub fn claim_charge(pid: u32, tid: u32, mem_id: u64) {
    let Some(m) = MEMS.get_ptr_mut(mem_id) else {
        return;
    };
    // SAFETY: a map value pointer.
    if unsafe { (*m).charged } == NO_HANDLE {
        recharge(pid, tid, mem_id, m, &Exclude::default());
    }
}

/// Handles going away together, which must not inherit a charge: those of
/// clients on the open file `file` (being released), and those of `client` in the
/// scope `device`/`sub` (a teardown under way). Zeroes exclude nothing.
#[derive(Clone, Copy, Default)]
pub struct Exclude {
    pub file: u64,
    pub client: u32,
    pub device: u32,
    pub sub: u32,
    pub _reserved: u32,
}

/// The memory's oldest handle not excluded by `x`, or `NO_HANDLE`.
#[inline(never)]
fn oldest_handle(m: *mut MemInfo, x: &Exclude) -> u32 {
    let (mut best, mut best_seq) = (NO_HANDLE, u32::MAX);
    for i in 0..MEM_HANDLES {
        // SAFETY: a map value pointer; i is in bounds.
        let h = unsafe { (*m).handles[i] };
        if h.client == 0 || h.seq >= best_seq {
            continue;
        }
        if x.client != 0 && h.client == x.client && in_scope(h.device, h.sub, x.device, x.sub) {
            continue;
        }
        // SAFETY: copied out at once.
        if x.file != 0 && unsafe { CLIENTS.get(h.client) }.is_some_and(|c| c.file_id == x.file) {
            continue;
        }
        best = i as u32;
        best_seq = h.seq;
    }
    best
}

/// The memory `m` lost its charged handle (already removed, and its bytes already
/// taken out of that handle's contributor by the caller): the charge moves to the
/// oldest surviving handle, or waits in the export files, or the memory is freed.
/// Returns the bytes freed (0 when it lives on).
#[inline(never)]
fn recharge(pid: u32, tid: u32, mem_id: u64, m: *mut MemInfo, excluded: &Exclude) -> u64 {
    // SAFETY: a map value pointer.
    let (bytes, kind, gpu, from) = unsafe { ((*m).bytes, (*m).kind, (*m).gpu, (*m).charged_pid) };
    let next = oldest_handle(m, excluded);
    if next != NO_HANDLE && (next as usize) < MEM_HANDLES {
        // SAFETY: as above; next is in bounds.
        let h = unsafe { (*m).handles[next as usize] };
        if let Some(client) = CLIENTS.get_ptr_mut(h.client) {
            contribute(client, &h, &Amount { gpu, kind, bytes }, 1);
            // SAFETY: a map value pointer.
            driver_figure(unsafe { (*client).creator_pid }, gpu, kind, bytes as i64);
        }
        if h.pid != from {
            move_totals(from, h.pid, gpu, kind, bytes);
        }
        // SAFETY: as above.
        unsafe {
            (*m).charged = next;
            (*m).charged_pid = h.pid;
        }
        emit_charge(pid, tid, from, &h, m);
        return 0;
    }
    // SAFETY: as above.
    unsafe { (*m).charged = NO_HANDLE };
    // SAFETY: as above.
    if unsafe { (*m).export_refs } > 0 {
        return 0;
    }
    free_bytes(from, gpu, kind, bytes);
    let _ = MEMS.remove(mem_id);
    bytes
}

/// A charge moves from one process to another: neither a free nor an allocation.
#[inline(never)]
fn move_totals(from: u32, to: u32, gpu: u32, kind: u32, bytes: u64) {
    sub_totals(from, gpu, &Delta::of(kind, -(bytes as i64)));
    add_totals(to, gpu, &Delta::of(kind, bytes as i64));
}

/// Reports a charge that moved from `from` to `h`'s process.
#[inline(never)]
fn emit_charge(pid: u32, tid: u32, from: u32, h: &MemHandle, m: *mut MemInfo) {
    // SAFETY: a map value pointer.
    let (gpu, kind, bytes) = unsafe { ((*m).gpu, (*m).kind, (*m).bytes) };
    emit(GpuChargeEvent {
        header: header(EventKind::GpuCharge, pid, tid),
        from_pid: from,
        to_pid: h.pid,
        gpu,
        mem_kind: kind,
        client: h.client,
        handle: h.handle,
        bytes,
    });
}

/// RM_FREE of memory object `key`: the handle goes; its memory is freed with its
/// last reference, else its charge may move. Reports the free. (Inlined: the
/// verifier allows 8 nested calls.)
#[inline(always)]
pub fn free_mem_handle(pid: u32, tid: u32, key: &ObjectKey, escape: u32) {
    let Some(obj) = OBJECTS.get_ptr(key) else {
        return;
    };
    // SAFETY: a map value pointer, valid for this program run.
    let obj = unsafe { &*obj };
    let (freed, freed_pid) = if obj.mem_id == 0 {
        (free_private(key, obj), obj.owner_pid)
    } else {
        free_shared(pid, tid, key, obj)
    };
    let freed_pid = if freed > 0 { freed_pid } else { 0 };
    emit_mem_free(
        pid,
        tid,
        key,
        obj,
        &Freed {
            pid: freed_pid,
            escape,
            bytes: freed,
        },
    );
    let _ = OBJECTS.remove(key);
}

/// A memory that was never shared: this handle is its only reference.
#[inline(never)]
fn free_private(key: &ObjectKey, obj: &ObjectInfo) -> u64 {
    if let Some(client) = CLIENTS.get_ptr_mut(key.client) {
        let h = MemHandle {
            client: key.client,
            handle: key.handle,
            device: obj.device,
            sub: obj.sub,
            pid: obj.owner_pid,
            seq: 0,
        };
        let a = Amount {
            gpu: obj.gpu,
            kind: obj.mem_kind,
            bytes: obj.bytes,
        };
        contribute(client, &h, &a, -1);
        // SAFETY: a map value pointer.
        driver_figure(
            unsafe { (*client).creator_pid },
            a.gpu,
            a.kind,
            -(a.bytes as i64),
        );
    }
    free_bytes(obj.owner_pid, obj.gpu, obj.mem_kind, obj.bytes);
    obj.bytes
}

/// `bytes` of `kind` charged to `pid` on `gpu` go back to the driver.
#[inline(never)]
fn free_bytes(pid: u32, gpu: u32, kind: u32, bytes: u64) {
    let mut d = Delta::of(kind, -(bytes as i64));
    d.frees = 1;
    sub_totals(pid, gpu, &d);
}

/// One handle of a shared memory goes: (bytes freed, process charged with them).
#[inline(never)]
fn free_shared(pid: u32, tid: u32, key: &ObjectKey, obj: &ObjectInfo) -> (u64, u32) {
    let Some(m) = MEMS.get_ptr_mut(obj.mem_id) else {
        return (0, 0);
    };
    let mut index = NO_HANDLE;
    for i in 0..MEM_HANDLES {
        // SAFETY: a map value pointer; i is in bounds.
        let h = unsafe { &mut (*m).handles[i] };
        if h.client == key.client && h.handle == key.handle {
            index = i as u32;
            *h = MemHandle::default();
        }
    }
    unlink_shared(key);
    // SAFETY: as above.
    let (charged, charged_pid) = unsafe { ((*m).charged, (*m).charged_pid) };
    if index == NO_HANDLE || index != charged {
        return (0, 0);
    }
    if let Some(client) = CLIENTS.get_ptr_mut(key.client) {
        let h = MemHandle {
            client: key.client,
            handle: key.handle,
            device: obj.device,
            sub: obj.sub,
            pid: charged_pid,
            seq: 0,
        };
        move_out(client, &h, m);
    }
    (
        recharge(pid, tid, obj.mem_id, m, &Exclude::default()),
        charged_pid,
    )
}

/// What a free gave back (to keep call arguments within five).
struct Freed {
    pid: u32,
    escape: u32,
    bytes: u64,
}

#[inline(never)]
fn emit_mem_free(pid: u32, tid: u32, key: &ObjectKey, obj: &ObjectInfo, f: &Freed) {
    emit(GpuFreeEvent {
        header: header(EventKind::GpuFree, pid, tid),
        client: key.client,
        handle: key.handle,
        class: obj.class,
        kind: obj.kind,
        gpu: obj.gpu,
        mem_kind: obj.mem_kind,
        freed_pid: f.pid,
        escape: f.escape,
        bytes: f.bytes,
    });
}

/// An export slot that holds an object without bytes (nothing to account, but an
/// import of it makes a handle).
pub const NO_BYTES_EXPORT: u64 = u64::MAX;

/// Sets export file `file_id`'s `position` to `mem_id` (a memory, which gains a
/// reference; [`NO_BYTES_EXPORT`]; or 0 to empty it). What was there loses its
/// reference.
#[inline(never)]
pub fn export_memory(pid: u32, file_id: u64, position: u32, mem_id: u64) -> bool {
    let Some(f) = file_info(file_id, keling_common::device_file::CTL, pid) else {
        return false;
    };
    if position as usize >= FILE_EXPORTS {
        count_table_full(pid, table_full::EXPORTS);
        return false;
    }
    // SAFETY: a map value pointer; position is in bounds.
    let slot = unsafe { &mut (*f).exports[position as usize] };
    if *slot == mem_id {
        return true;
    }
    let old = *slot;
    *slot = mem_id;
    drop_export(pid, old);
    if let Some(m) = MEMS.get_ptr_mut(mem_id) {
        // SAFETY: a map value pointer.
        unsafe { (*m).export_refs += 1 };
    }
    true
}

/// The memory an export file holds at `position` (0: none).
#[inline(always)]
pub fn exported(file_id: u64, position: u32) -> u64 {
    if position as usize >= FILE_EXPORTS {
        return 0;
    }
    // SAFETY: copied out at once.
    unsafe { FILES.get(file_id) }.map_or(0, |f| f.exports[position as usize])
}

/// One export reference to `mem_id` goes; the memory is freed if it was its last.
#[inline(never)]
fn drop_export(_pid: u32, mem_id: u64) {
    if mem_id == 0 || mem_id == NO_BYTES_EXPORT {
        return;
    }
    let Some(m) = MEMS.get_ptr_mut(mem_id) else {
        return;
    };
    // SAFETY: a map value pointer.
    unsafe {
        (*m).export_refs = (*m).export_refs.saturating_sub(1);
        if (*m).export_refs == 0 && (*m).charged == NO_HANDLE {
            let mut d = Delta::of((*m).kind, -((*m).bytes as i64));
            d.frees = 1;
            sub_totals((*m).charged_pid, (*m).gpu, &d);
            let _ = MEMS.remove(mem_id);
        }
    }
}

// --- Teardown -----------------------------------------------------------------------

/// Whether a handle (or contributor) under `device`/`sub` is in a teardown's scope:
/// `sub` non-zero: that subdevice; else `device` non-zero: that device; else all.
#[inline(always)]
fn in_scope(h_device: u32, h_sub: u32, device: u32, sub: u32) -> bool {
    if sub != 0 {
        h_sub == sub
    } else {
        device == 0 || h_device == device
    }
}

/// One handle to a shared memory of a client whose handles go in a teardown, the
/// one at `t.next_handle` on the client's list (its head when that is 0): if it is
/// in the teardown's scope it goes; if it was the charged handle, its memory's
/// bytes move out of this client (to the oldest survivor, or to its export files)
/// before the contributors are subtracted en bloc, or, with no reference left,
/// they stay in the contributor and go with it. Returns the next handle on the
/// list, or `None` at its end. (One handle per program run: more is too much for
/// the verifier.)
#[inline(never)]
pub fn teardown_shared(pid: u32, tid: u32, t: &Teardown) -> Option<u32> {
    let client = CLIENTS.get_ptr(t.client)?;
    let handle = if t.next_handle == 0 {
        // SAFETY: a map value pointer.
        unsafe { (*client).shared_head }
    } else {
        t.next_handle
    };
    if handle == 0 {
        return None;
    }
    let key = ObjectKey {
        client: t.client,
        handle,
    };
    let obj = OBJECTS.get_ptr(key)?;
    // SAFETY: a map value pointer, valid for this program run.
    let (next, device, sub, mem_id) =
        unsafe { ((*obj).shared_next, (*obj).device, (*obj).sub, (*obj).mem_id) };
    if !in_scope(device, sub, t.scope.device, t.scope.sub) {
        return Some(next);
    }
    unlink_shared(&key);
    let Some(m) = MEMS.get_ptr_mut(mem_id) else {
        return Some(next);
    };
    let lost_charge = remove_handle(m, &key);
    if lost_charge.client != 0 {
        settle_lost_charge(pid, tid, t, mem_id, &lost_charge);
    }
    Some(next)
}

/// A teardown removed the charged handle `lost` of memory `mem_id`: its bytes move
/// out of `t`'s client to a survivor (or wait in export files), or, with no
/// reference left, stay in the contributor and go with it.
#[inline(never)]
fn settle_lost_charge(pid: u32, tid: u32, t: &Teardown, mem_id: u64, lost: &MemHandle) {
    let (Some(m), Some(client)) = (MEMS.get_ptr_mut(mem_id), CLIENTS.get_ptr_mut(t.client)) else {
        return;
    };
    let x = Exclude {
        file: t.releasing_file,
        client: t.client,
        device: t.scope.device,
        sub: t.scope.sub,
        _reserved: 0,
    };
    // SAFETY: a map value pointer.
    let survives = oldest_handle(m, &x) != NO_HANDLE || unsafe { (*m).export_refs } > 0;
    if survives {
        move_out(client, lost, m);
        recharge(pid, tid, mem_id, m, &x);
    } else {
        // Freed with this client: its bytes go with the contributors.
        let _ = MEMS.remove(mem_id);
    }
}

/// Removes handle `key` from memory `m`. Returns it if it was the charged one
/// (with its `pid` set to the charged process; client 0 if it was not).
#[inline(never)]
fn remove_handle(m: *mut MemInfo, key: &ObjectKey) -> MemHandle {
    // SAFETY: a map value pointer.
    let (charged, charged_pid) = unsafe { ((*m).charged, (*m).charged_pid) };
    let mut lost = MemHandle::default();
    for j in 0..MEM_HANDLES {
        // SAFETY: as above; j is in bounds.
        let h = unsafe { &mut (*m).handles[j] };
        if h.client == key.client && h.handle == key.handle {
            if j as u32 == charged {
                lost = *h;
                lost.pid = charged_pid;
                // SAFETY: as above.
                unsafe { (*m).charged = NO_HANDLE };
            }
            *h = MemHandle::default();
        }
    }
    lost
}

/// Takes a shared memory's bytes out of the contributor of its (gone) charged
/// handle `h` in `client`, and out of that client's creator's driver figure.
#[inline(never)]
fn move_out(client: *mut ClientInfo, h: &MemHandle, m: *mut MemInfo) {
    // SAFETY: map value pointers.
    let a = unsafe {
        Amount {
            gpu: (*m).gpu,
            kind: (*m).kind,
            bytes: (*m).bytes,
        }
    };
    contribute(client, h, &a, -1);
    // SAFETY: as above.
    driver_figure(
        unsafe { (*client).creator_pid },
        a.gpu,
        a.kind,
        -(a.bytes as i64),
    );
}

/// Frees what the contributors in `t`'s scope hold, from slot `t.next_contributor`
/// on ([`CONTRIBUTORS_PER_RUN`] of them), as the driver does, and reports each; the
/// client itself goes when the whole of it does. Returns whether slots are left.
#[inline(never)]
pub fn teardown_contributors(pid: u32, tid: u32, t: &Teardown) -> bool {
    let Some(client) = CLIENTS.get_ptr_mut(t.client) else {
        return false;
    };
    // SAFETY: a map value pointer.
    let creator = unsafe { (*client).creator_pid };
    let first = t.next_contributor as usize;
    for k in 0..CONTRIBUTORS_PER_RUN {
        if first + k >= CLIENT_CONTRIBUTORS {
            break;
        }
        // Masked as well, out of the compiler's sight: the verifier does not follow
        // the bound through the sum (nor through the pointer stepping the compiler
        // would turn it into).
        let i = core::hint::black_box(first + k) & (CLIENT_CONTRIBUTORS - 1);
        // SAFETY: as above; i is in bounds.
        let c = unsafe { &mut (*client).contributors[i] };
        if c.pid == 0 || !in_scope(c.device, c.sub, t.scope.device, t.scope.sub) {
            continue;
        }
        let d = Delta {
            bytes: -(c.bytes as i64),
            host: -(c.host_bytes as i64),
            egm: -(c.egm_bytes as i64),
            driver: 0,
            allocs: 0,
            frees: c.objects as u64,
        };
        sub_totals(c.pid, c.gpu, &d);
        driver_figure(creator, c.gpu, mem_kind::VIDEO, -(c.bytes as i64));
        emit_teardown(pid, tid, t, c);
        *c = Contributor::default();
    }
    if first + CONTRIBUTORS_PER_RUN < CLIENT_CONTRIBUTORS {
        return true;
    }
    if t.scope.device == 0 && t.scope.sub == 0 {
        let _ = CLIENTS.remove(t.client);
    }
    false
}

/// Contributor slots one run of [`teardown_contributors`] handles (all 16 are too
/// much for the verifier in one program).
pub const CONTRIBUTORS_PER_RUN: usize = 4;

#[inline(never)]
fn emit_teardown(pid: u32, tid: u32, t: &Teardown, c: &Contributor) {
    emit(GpuTeardownEvent {
        header: header(EventKind::GpuTeardown, pid, tid),
        client: t.client,
        reason: t.reason,
        owner_pid: c.pid,
        gpu: c.gpu,
        device: c.device,
        sub: c.sub,
        objects: c.objects,
        _reserved: 0,
        bytes: c.bytes,
        host_bytes: c.host_bytes,
        egm_bytes: c.egm_bytes,
    });
}

/// Queues the teardown of a client (all of it, or a device or subdevice).
pub fn queue_teardown(pid: u32, tid: u32, client: u32, scope: &Scope, reason: u32) {
    deferred::push(pid, tid, Work::teardown(client, *scope, reason, 0));
}

/// The last reference to an open file went away: the driver frees every client
/// created on it, and the references its exported objects held.
#[inline(never)]
pub fn release_file(pid: u32, tid: u32, file_id: u64) {
    let Some(f) = FILES.get_ptr(file_id) else {
        return;
    };
    for i in 0..FILE_EXPORTS {
        // SAFETY: a map value pointer; i is in bounds.
        let mem_id = unsafe { (*f).exports[i] };
        drop_export(pid, mem_id);
    }
    for i in 0..FILE_CLIENTS {
        // SAFETY: as above.
        let client = unsafe { (*f).clients[i] };
        if client == 0 {
            continue;
        }
        // The client may have been freed (and its handle reused on another file).
        // SAFETY: copied out at once.
        let on_this_file = unsafe { CLIENTS.get(client) }.is_some_and(|c| c.file_id == file_id);
        if on_this_file {
            let scope = Scope::default();
            let w = Work::teardown(client, scope, teardown::FILE_RELEASED, file_id);
            deferred::push(pid, tid, w);
        }
    }
    let _ = FILES.remove(file_id);
}
