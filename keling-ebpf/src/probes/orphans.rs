//! Files released where Keling does not look.
//!
//! A file's release is judged where a known fd drops a reference (close, exec,
//! exit, dup2): released when the kernel counts no other reference. When it does,
//! the other references may be fds Keling knows (another process of the trace: its
//! own close judges later), or ones it cannot see: a process outside the trace that
//! got the fd over a socket and never used it, a child forked before `--pid`
//! attached, a call in flight in another thread of the same process (it holds a
//! reference until it returns). So such a file, if clients live on it, becomes an
//! orphan: it goes into `ORPHANS`; the newest is checked at every context switch
//! for its first 5 ms, and while any slot is in use every CPU checks a quarter of
//! the slots at most once a millisecond, from `sched_switch`: a file whose count
//! reads 0, or whose `struct file` now belongs to another inode (freed and reused:
//! files are `SLAB_TYPESAFE_BY_RCU`, so the memory stays a `struct file`), is
//! released. Its release is reported with pid 0: no process Keling watches did it.
//!
//! Any number of orphans is watched: the slots are the sweep's working set, and
//! the rest wait in `ORPHAN_BACKLOG`, a host-wide queue as large as `FILES`. A
//! slot whose orphan is still held passes it to the back of the backlog and takes
//! the one in front, so every orphan comes round in turn; a slot that empties
//! takes the next. `ORPHAN_SET` holds every watched file once, whichever it is in.
//! The files of a process that has more NVIDIA fds than its table holds are
//! watched here from their first fd past the table (files.rs), so their release
//! at close, exec, exit or in another process is found from the kernel's own
//! count, however many there are. Only a full backlog (65536 files) is a full
//! table here, and it is counted.
//!
//! The orphan check and the sweep are deferred work (`keling_orphan`,
//! `keling_sweep` in work.rs); this module holds what they do.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, Queue},
};
use keling_common::{FD_SLOTS, MAX_FILES, ORPHAN_SLOTS, OrphanSlot, OrphanSweep, table_full};

use super::deferred::{self, Work};
use super::files::{FILES, PROC_FDS, file_refs, queue_release};
use crate::{atomic_add, atomic_cas, count_table_full, kread};

#[map]
static ORPHANS: Array<OrphanSlot> = Array::with_max_entries(ORPHAN_SLOTS, 0);
#[map]
static ORPHAN_SWEEP: Array<OrphanSweep> = Array::with_max_entries(1, 0);
/// When this CPU last queued a sweep (ns).
#[map]
static ORPHAN_LAST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// The newest orphan: [its slot + 1 (0: none), until when (ns) it is looked at
/// at every context switch]. See [`NEWEST_WATCH_NS`].
#[map]
static ORPHAN_NEWEST: Array<[u64; 2]> = Array::with_max_entries(1, 0);

/// Every file watched as an orphan, in a slot or in the backlog (the value is
/// unused): a file is watched once however often it is queued.
#[map]
static ORPHAN_SET: HashMap<u64, u32> = HashMap::with_max_entries(MAX_FILES, 0);
/// Orphans waiting for a slot (see the module's doc).
#[map]
static ORPHAN_BACKLOG: Queue<OrphanSlot> = Queue::with_max_entries(MAX_FILES, 0);

const BPF_NOEXIST: u64 = 1;

/// Whether `file` is watched as an orphan.
#[inline(always)]
pub fn is_orphan(file: u64) -> bool {
    ORPHAN_SET.get_ptr(file).is_some()
}

/// A slot's `file` while its claimer writes the rest (no file is at this address).
const CLAIMING: u64 = u64::MAX;

/// How long a new orphan is looked at at every context switch on every CPU (the
/// round-robin sweep comes at most once a millisecond per CPU, and a full round
/// takes several). Its other reference is most often an instant's: a release
/// the kernel had done was seen 0.8 to 11.6 ms late before, and the process's
/// allocations in between were counted on top of the memory it had let go, so
/// its peak overshot the driver's (gpu_trace's random workloads, now and then).
const NEWEST_WATCH_NS: u64 = 5_000_000;

/// A CPU sweeps at most this often.
const SWEEP_EVERY_NS: u64 = 1_000_000;
/// Slots checked per sweep, round robin: a quarter of them, so every orphan is
/// looked at within four sweeps (about 2 ms on 2 CPUs, less with more; it was
/// 4 slots, 16 sweeps). An empty slot costs one load.
const SWEEP_SLOTS: u32 = 16;

/// From `sched_switch`: whether a sweep is due on this CPU (some slot is in use,
/// and a new orphan is watched or this CPU has not swept for a while). Cheap when
/// there are no orphans: one load.
#[inline(always)]
pub fn sweep_due() -> bool {
    let Some(s) = ORPHAN_SWEEP.get_ptr(0) else {
        return false;
    };
    // SAFETY: a map value pointer; a racy read of a counter is fine here.
    if unsafe { core::ptr::read_volatile(&(*s).occupied) } == 0 || !deferred::is_empty() {
        return false;
    }
    let Some(last) = ORPHAN_LAST.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    if newest(now).is_some() {
        return true;
    }
    // SAFETY: this CPU's slot.
    unsafe {
        if now.wrapping_sub(*last) < SWEEP_EVERY_NS {
            return false;
        }
        *last = now;
    }
    true
}

/// The newest orphan's slot, while it is still watched at every switch.
#[inline(always)]
fn newest(now: u64) -> Option<u32> {
    let n = ORPHAN_NEWEST.get_ptr(0)?;
    // SAFETY: a map value pointer; a racy read is fine (a stale one costs a look).
    let [slot, until] = unsafe { core::ptr::read_volatile(n) };
    (slot != 0 && now < until).then(|| (slot - 1) as u32)
}

/// The `struct inode` behind `file`.
#[inline(always)]
fn inode_of(file: u64) -> u64 {
    kread::<u64>(file, config!(file_inode_off)).unwrap_or(0)
}

/// Queues a sweep of the orphans, as no process (pid 0): call only when
/// [`sweep_due`].
#[inline(always)]
pub fn queue_sweep() {
    deferred::push(0, 0, Work::Sweep);
}

/// `file`, whose fd `pid` just dropped while other references remain, becomes an
/// orphan unless `pid` still has another fd of it.
#[inline(always)]
pub fn add_orphan(pid: u32, file: u64) {
    if FILES.get_ptr(file).is_none() {
        return;
    }
    if let Some(fds) = PROC_FDS.get_ptr(pid) {
        for i in 0..FD_SLOTS {
            // SAFETY: a map value pointer; i is in bounds.
            if unsafe { (*fds).slots[i].file_id } == file {
                return;
            }
        }
    }
    if ORPHAN_SET.insert(file, 0, BPF_NOEXIST).is_err() {
        // Watched already, or the set is full (then it is counted).
        if !is_orphan(file) {
            count_table_full(pid, table_full::ORPHANS);
        }
        return;
    }
    let inode = inode_of(file);
    // Claim the first empty slot. Another CPU may claim it between the read and
    // the compare-and-swap (another process closing an fd at the same moment):
    // then the next empty one is tried. The slot is held as CLAIMING while its
    // inode is written, so that a sweep never compares a file with the inode of
    // the slot's previous orphan.
    let mut claimed = ORPHAN_SLOTS;
    for i in 0..ORPHAN_SLOTS {
        let Some(slot) = ORPHANS.get_ptr_mut(i) else {
            return;
        };
        // SAFETY: a map value pointer; the slot is claimed atomically, and only
        // its claimer changes it while it is CLAIMING.
        unsafe {
            if core::ptr::read_volatile(&(*slot).file) != 0
                || !atomic_cas(&mut (*slot).file, 0, CLAIMING).1
            {
                continue;
            }
            (*slot).inode = inode;
            atomic_cas(&mut (*slot).file, CLAIMING, file);
        }
        claimed = i;
        break;
    }
    let Some(sweep) = ORPHAN_SWEEP.get_ptr_mut(0) else {
        return;
    };
    if claimed == ORPHAN_SLOTS {
        // Every slot is in use: it waits its turn in the backlog.
        if ORPHAN_BACKLOG.push(OrphanSlot { file, inode }, 0).is_err() {
            let _ = ORPHAN_SET.remove(file);
            count_table_full(pid, table_full::ORPHANS);
            return;
        }
        // SAFETY: a map value pointer, changed only atomically.
        unsafe {
            atomic_add(&mut (*sweep).backlog, 1);
            atomic_add(&mut (*sweep).occupied, 1);
        }
        return;
    }
    // SAFETY: a map value pointer, changed only atomically.
    unsafe { atomic_add(&mut (*sweep).occupied, 1) };
    if let Some(n) = ORPHAN_NEWEST.get_ptr_mut(0) {
        // SAFETY: no preconditions; a map value pointer (the last writer wins:
        // an older new orphan is left to the round-robin).
        unsafe {
            let now = aya_ebpf::helpers::bpf_ktime_get_ns();
            *n = [u64::from(claimed) + 1, now + NEWEST_WATCH_NS];
        }
    }
}

/// Checks the newest orphan while it is watched, then the next few slots.
#[inline(always)]
pub fn sweep() {
    // SAFETY: no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    if let Some(i) = newest(now) {
        check(i);
    }
    for _ in 0..SWEEP_SLOTS {
        let Some(sweep) = ORPHAN_SWEEP.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: a map value pointer.
        let n = unsafe { atomic_add(&mut (*sweep).checked, 1) };
        check(n as u32 % ORPHAN_SLOTS);
    }
}

/// Releases the orphan in slot `i` if its file is gone or released; a slot still
/// held passes its orphan to the backlog for the next in line, an empty one takes
/// the next.
#[inline(never)]
fn check(i: u32) {
    let (Some(sweep), Some(slot)) = (ORPHAN_SWEEP.get_ptr_mut(0), ORPHANS.get_ptr_mut(i)) else {
        return;
    };
    // SAFETY: a map value pointer.
    let (file, inode) = unsafe { (core::ptr::read_volatile(&(*slot).file), (*slot).inode) };
    if file == CLAIMING {
        return;
    }
    if file == 0 {
        take_next(sweep, slot, 0);
        return;
    }
    // Released through a known fd meanwhile, or still held.
    let gone = FILES.get_ptr(file).is_none();
    let released = !gone && (file_refs(file) == 0 || inode_of(file) != inode);
    if !gone && !released {
        // SAFETY: a map value pointer; a racy read of a counter is fine here.
        if unsafe { core::ptr::read_volatile(&(*sweep).backlog) } != 0 {
            take_next(sweep, slot, file);
        }
        return;
    }
    // SAFETY: map value pointers; whoever claims the slot does the release.
    unsafe {
        if !atomic_cas(&mut (*slot).file, file, CLAIMING).1 {
            return;
        }
        atomic_add(&mut (*sweep).occupied, u64::MAX);
    }
    // Out of the set while the slot is still held, and only then free: the
    // `struct file` may be freed and reused at this address by a new file at
    // once, and a new orphan at this address must find the set without it (the
    // slot was freed first before, and such an orphan, between the two, was
    // taken for one already watched: never checked, its release never seen).
    let _ = ORPHAN_SET.remove(file);
    if released {
        queue_release(0, 0, file);
    }
    // SAFETY: as above; only this claimer changes the slot while it is CLAIMING.
    unsafe { atomic_cas(&mut (*slot).file, CLAIMING, 0) };
    take_next(sweep, slot, 0);
}

/// Puts the orphan at the front of the backlog into `slot`, whose orphan is
/// `file` (0: empty): a held orphan goes to the back of the backlog first.
#[inline(always)]
fn take_next(sweep: *mut OrphanSweep, slot: *mut OrphanSlot, file: u64) {
    // SAFETY: map value pointers; the slot is held as CLAIMING while it changes,
    // and only its claimer changes it then.
    unsafe {
        if core::ptr::read_volatile(&(*sweep).backlog) == 0
            || !atomic_cas(&mut (*slot).file, file, CLAIMING).1
        {
            return;
        }
        if file != 0 {
            let held = OrphanSlot {
                file,
                inode: (*slot).inode,
            };
            if ORPHAN_BACKLOG.push(held, 0).is_err() {
                atomic_cas(&mut (*slot).file, CLAIMING, file);
                return;
            }
            atomic_add(&mut (*sweep).backlog, 1);
        }
        match ORPHAN_BACKLOG.pop() {
            Ok(Some(next)) => {
                atomic_add(&mut (*sweep).backlog, u64::MAX);
                (*slot).inode = next.inode;
                atomic_cas(&mut (*slot).file, CLAIMING, next.file);
            }
            // Another CPU took the last one meanwhile (or the queue was busy):
            // the orphan pushed above is in the backlog or another slot.
            _ => {
                atomic_cas(&mut (*slot).file, CLAIMING, 0);
            }
        }
    }
}
