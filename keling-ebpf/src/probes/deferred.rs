//! The deferred-work queue: what one program leaves for the `keling_*` work
//! programs (work.rs) to do.
//!
//! The release of a file, the teardown of a client, the judging of a close_range
//! and the orphan checks are too much to verify inside every program that can cause
//! one, so they are queued here, per CPU, as [`Work`] items, and done one item per
//! tail call through `WORK_PROG`, at the end of the program that queued them ([`run`]),
//! or at the next context switch on that CPU if a chain of tail calls ran out.
//!
//! The kernel tail-calls only between programs of one type, so each program type
//! that queues work has its own array of the same work programs ([`TailCalls`]):
//! `WORK_PROG` for the tracepoints, `WORK_PROG_KPROBE` for the driver-entry
//! backend's kprobes (nvidia/).
//!
//! This module owns the queue and the program array, and nothing that decides what
//! the work does: it imports no other probe module, so every module that queues
//! work (files, accounting, orphans, nvidia) can use it without importing the work
//! programs, which import them.
use aya_ebpf::{
    EbpfContext,
    macros::map,
    maps::{PerCpuArray, ProgramArray},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use keling_common::{table_full, tail_call};

use crate::count_table_full;

/// What a teardown covers: all of a client (both 0), a device or a subdevice.
#[derive(Clone, Copy, Default)]
pub struct Scope {
    /// The device's handle, or 0.
    pub device: u32,
    /// The subdevice's handle, or 0.
    pub sub: u32,
}

/// A client's teardown, in its two steps: first its handles to shared memories,
/// one per run ([`Work::TeardownShared`]), then its contributors, a few per run
/// ([`Work::TeardownContributors`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Teardown {
    pub client: u32,
    /// A `teardown` reason.
    pub reason: u32,
    pub scope: Scope,
    /// The shared step: the next handle on the client's shared list; 0 before the
    /// first run (start at the list's head; a handle is never 0).
    pub next_handle: u32,
    /// The contributors' step: the first contributor slot of the next run.
    pub next_contributor: u32,
    /// The file being released (its clients' handles are all going, so none of them
    /// may inherit a charge), or 0.
    pub releasing_file: u64,
}

/// The judging of a close_range's fds, one slot of the process's table per run.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CloseRange {
    /// The process whose fds close (the queue's pid is that of its last writer).
    pub pid: u32,
    /// The range, inclusive.
    pub first_fd: u32,
    pub last_fd: u32,
    /// The `PROC_FDS` slot the next run looks from.
    pub next_slot: u32,
}

/// One item of deferred work, each kind with its own fields. The discriminant is
/// the slot of the program that does it in `WORK_PROG` (keling-common's
/// `tail_call::work`), so [`run`] tail-calls by it without a match.
///
/// Layout (`repr(C, u32)`: a `u32` tag, then a union of the kinds' fields at offset
/// 8): 40 bytes, a teardown's; the queue holds 64 per CPU.
#[repr(C, u32)]
#[derive(Clone, Copy)]
pub enum Work {
    /// A slot never written: map memory starts zeroed, and slot 0 holds no program.
    #[expect(dead_code, reason = "never queued; it makes the zeroed queue valid")]
    Vacant = 0,
    /// The last reference to an open file went away: tear down its clients.
    ReleaseFile { file_id: u64 } = tail_call::work::RELEASE_FILE,
    /// A teardown's first step: the client's handles to shared memories.
    TeardownShared(Teardown) = tail_call::work::TEARDOWN_SHARED,
    /// A teardown's second step: the client's contributors.
    TeardownContributors(Teardown) = tail_call::work::TEARDOWN_CONTRIBUTORS,
    /// A close_range, before the kernel closes the fds.
    CloseRange(CloseRange) = tail_call::work::CLOSE_RANGE,
    /// A file whose fd went while other references remain (see orphans.rs).
    Orphan { file_id: u64 } = tail_call::work::ORPHAN,
    /// Check a few orphans (see orphans.rs).
    Sweep = tail_call::work::SWEEP,
}

const _: () = assert!(size_of::<Work>() == 40);
const _: () = assert!(size_of::<Teardown>() == 32 && size_of::<CloseRange>() == 16);

impl Work {
    /// The teardown of `client` (all of it, or a device or subdevice), for
    /// `reason`; `releasing_file`: the file whose release causes it, or 0.
    #[inline(always)]
    pub fn teardown(client: u32, scope: Scope, reason: u32, releasing_file: u64) -> Self {
        Work::TeardownShared(Teardown {
            client,
            reason,
            scope,
            next_handle: 0,
            next_contributor: 0,
            releasing_file,
        })
    }

    /// Judging `pid`'s fds `first_fd..=last_fd`, which a close_range is about to
    /// close.
    #[inline(always)]
    pub fn close_range(pid: u32, first_fd: u32, last_fd: u32) -> Self {
        Work::CloseRange(CloseRange {
            pid,
            first_fd,
            last_fd,
            next_slot: 0,
        })
    }

    /// Moves a teardown on from its shared step to its contributors' step, in place.
    #[inline(always)]
    pub fn start_contributors_step(&mut self) {
        if let Work::TeardownShared(t) = self {
            // Field by field: a copy of the whole `Teardown` would go through the
            // stack (the item is both source and destination).
            let Teardown {
                client,
                reason,
                scope,
                next_handle,
                releasing_file,
                ..
            } = *t;
            *self = Work::TeardownContributors(Teardown {
                client,
                reason,
                scope,
                next_handle,
                next_contributor: 0,
                releasing_file,
            });
        }
    }

    /// The slot of the program that does this item.
    #[inline(always)]
    fn slot(&self) -> u32 {
        // SAFETY: `repr(C, u32)`: the discriminant is a `u32` at offset 0.
        unsafe { *(self as *const Self as *const u32) }
    }
}

/// Items queued per CPU (a power of two).
const WORK_SLOTS: usize = 64;

/// A FIFO of work, per CPU.
#[repr(C)]
struct WorkQueue {
    /// The process and thread of the program that queued the last item.
    pid: u32,
    tid: u32,
    start: u32,
    len: u32,
    items: [Work; WORK_SLOTS],
}

#[map]
static WORK_QUEUE: PerCpuArray<WorkQueue> = PerCpuArray::with_max_entries(1, 0);
/// The work programs by work kind, set by the agent at load time.
#[map]
static WORK_PROG: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);
/// The same, as kprobe programs (the driver-entry backend).
#[map]
static WORK_PROG_KPROBE: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);

/// A program type and the array of work programs of that type, which its programs
/// tail-call (monomorphised: a program refers only to its own type's array, as the
/// kernel requires).
pub trait TailCalls: EbpfContext {
    fn work_prog() -> &'static ProgramArray;
}

impl TailCalls for TracePointContext {
    #[inline(always)]
    fn work_prog() -> &'static ProgramArray {
        &WORK_PROG
    }
}

impl TailCalls for ProbeContext {
    #[inline(always)]
    fn work_prog() -> &'static ProgramArray {
        &WORK_PROG_KPROBE
    }
}

impl TailCalls for RetProbeContext {
    #[inline(always)]
    fn work_prog() -> &'static ProgramArray {
        &WORK_PROG_KPROBE
    }
}

/// Queues `w` at the back.
#[inline(always)]
pub fn push(pid: u32, tid: u32, w: Work) {
    let Some(q) = WORK_QUEUE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs run to completion on one CPU.
    unsafe {
        let len = (*q).len as usize;
        if len >= WORK_SLOTS {
            count_table_full(pid, table_full::WORK_QUEUE);
            return;
        }
        let at = ((*q).start as usize + len) & (WORK_SLOTS - 1);
        (*q).items[at] = w;
        (*q).len += 1;
        (*q).pid = pid;
        (*q).tid = tid;
    }
}

/// Puts `w` at the front of the queue (work that must run before what is queued,
/// or the item just taken off it, which goes on).
#[inline(always)]
pub fn push_front(pid: u32, tid: u32, w: Work) {
    let Some(q) = WORK_QUEUE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs run to completion on one CPU.
    unsafe {
        if (*q).len as usize >= WORK_SLOTS {
            count_table_full(pid, table_full::WORK_QUEUE);
            return;
        }
        let at = ((*q).start.wrapping_sub(1)) & (WORK_SLOTS as u32 - 1);
        (*q).items[at as usize] = w;
        (*q).start = at;
        (*q).len += 1;
        (*q).pid = pid;
        (*q).tid = tid;
    }
}

/// Whether this CPU's work queue is empty.
#[inline(always)]
pub fn is_empty() -> bool {
    // SAFETY: this CPU's slot.
    WORK_QUEUE
        .get_ptr(0)
        .is_none_or(|q| unsafe { (*q).len } == 0)
}

/// Does the queued work, one item per tail call, each kind in its own program
/// (together they are too much for the verifier). Call last: on success it does
/// not return.
#[inline(always)]
pub fn run<C: TailCalls>(ctx: &C) {
    let Some(q) = WORK_QUEUE.get_ptr(0) else {
        return;
    };
    // SAFETY: this CPU's slot.
    let (len, start) = unsafe { ((*q).len, (*q).start) };
    if len == 0 {
        return;
    }
    // SAFETY: as above; the index is masked into bounds.
    let slot = unsafe { (*q).items[start as usize & (WORK_SLOTS - 1)].slot() };
    // SAFETY: a tail call to a program of the same type.
    unsafe { C::work_prog().tail_call(ctx, slot) };
    // Only reached if the tail call failed (the chain is at its limit): the work
    // stays queued for the next program on this CPU.
}

/// Takes the next work item off this CPU's queue: (pid, tid, item).
#[inline(always)]
pub fn pop() -> Option<(u32, u32, Work)> {
    let q = WORK_QUEUE.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot.
    let q = unsafe { &mut *q };
    if q.len == 0 {
        return None;
    }
    let w = q.items[q.start as usize & (WORK_SLOTS - 1)];
    q.start = (q.start + 1) & (WORK_SLOTS as u32 - 1);
    q.len -= 1;
    Some((q.pid, q.tid, w))
}

/// The item at the front of this CPU's queue, in place: (pid, tid, item).
#[inline(always)]
pub fn front() -> Option<(u32, u32, &'static mut Work)> {
    let q = WORK_QUEUE.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; programs run to completion on one CPU.
    let q = unsafe { &mut *q };
    if q.len == 0 {
        return None;
    }
    let w = &mut q.items[q.start as usize & (WORK_SLOTS - 1)];
    Some((q.pid, q.tid, w))
}
