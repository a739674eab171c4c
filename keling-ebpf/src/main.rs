//! Keling's eBPF programs (built for `bpfel-unknown-none` by `cargo xtask build`, or
//! by keling-agent's build.rs with aya-build).
//!
//! One module per subsystem under `probes/`; the maps and the helpers every probe
//! shares are here. The event layouts and map contracts are in `keling-common`.
#![no_std]
#![no_main]
// The bpf target has no `core::sync::atomic` read-modify-write methods; the
// intrinsics compile to BPF atomic instructions (fetch-add, cmpxchg: BPF ISA v3).
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, Queue, RingBuf},
};
use keling_common::{
    DROP_COUNTERS, DROP_RINGBUF_FULL, EventHeader, EventKind, MAX_TRACKED_PIDS, MAX_TRACKED_TIDS,
    ProbeConfig, TrackedProcess, table_full, undecoded,
};

/// Events to the agent. 256 KiB unless the agent sets another size at load time.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Events lost because `EVENTS` was full, per CPU and per reason.
#[map]
static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_COUNTERS, 0);

/// NVIDIA calls (and table entries) Keling could not account for, per CPU and per
/// `undecoded` reason; and per process.
#[map]
static UNDECODED: PerCpuArray<u64> = PerCpuArray::with_max_entries(undecoded::COUNT, 0);
#[map]
static UNDECODED_PID: HashMap<u32, u64> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);
/// Of `undecoded::TABLE_FULL`: which table, per CPU and `table_full` site.
#[map]
static TABLE_FULL_AT: PerCpuArray<u64> = PerCpuArray::with_max_entries(table_full::COUNT, 0);
/// Per process: how often a table Keling needed for its books was full (its GPU
/// memory figure may be wrong from then on; the agent takes no quota decision on it).
#[map]
static TABLE_FULL_PID: HashMap<u32, u64> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);
/// Processes whose `TABLE_FULL_PID` row was just created: the agent pops them
/// before each batch of events instead of reading the whole map; a push that
/// finds the queue full is counted in `UNSURE_LOST` (the agent then reads the map).
#[map]
static UNSURE_NEW: Queue<u32> = Queue::with_max_entries(MAX_TRACKED_PIDS, 0);
#[map]
static UNSURE_LOST: Array<u64> = Array::with_max_entries(1, 0);

/// Tracked processes: pid -> who asked.
#[map]
static TRACKED_PIDS: HashMap<u32, TrackedProcess> = HashMap::with_max_entries(MAX_TRACKED_PIDS, 0);

/// Threads of tracked processes: tid -> pid.
#[map]
static TRACKED_TIDS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_TRACKED_TIDS, 0);

/// Load-time configuration (offsets for this kernel), written by the agent.
#[unsafe(no_mangle)]
static KELING_CONFIG: ProbeConfig = ProbeConfig::ZERO;

/// Reads one field of the load-time configuration. Volatile so the compiler cannot
/// fold the all-zero initial value into the code; one field at a time so the
/// struct is never copied onto the 512-byte stack.
macro_rules! config {
    ($($field:tt)+) => {{
        // Also used inside other unsafe blocks.
        #[allow(unused_unsafe)]
        // SAFETY: a plain read of a static the loader filled in before loading.
        let value = unsafe { core::ptr::read_volatile(&raw const $crate::KELING_CONFIG.$($field)+) };
        value
    }};
}

/// A tail-called program in both program types around one body `$body(&ctx)`
/// (the kernel tail-calls only within one type): a tracepoint-type one for the
/// tracepoints' program arrays and, named `$kprobe`, a kprobe-type one for the
/// driver-entry backend's (probes/nvidia/handlers.rs).
macro_rules! tail_called {
    ($(#[$doc:meta])* $tracepoint:ident, $kprobe:ident, $body:ident) => {
        $(#[$doc])*
        #[aya_ebpf::macros::tracepoint]
        pub fn $tracepoint(ctx: aya_ebpf::programs::TracePointContext) -> i32 {
            $body(&ctx);
            0
        }

        $(#[$doc])*
        #[aya_ebpf::macros::kprobe]
        pub fn $kprobe(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            $body(&ctx);
            0
        }
    };
}

mod probes;

/// Argument `i` (0-5) of a `syscalls:sys_enter_*` record, by a direct load
/// (tracepoint programs may read their context; cheaper than `read_at`'s helper
/// call).
#[inline(always)]
fn syscall_arg(ctx: &aya_ebpf::programs::TracePointContext, i: usize) -> u64 {
    use aya_ebpf::EbpfContext;
    // SAFETY: syscall records hold 6 u64 arguments from byte 16: `i` < 6 makes
    // an 8-aligned load inside the record.
    unsafe { *(ctx.as_ptr().add(16 + 8 * i) as *const u64) }
}

/// The return value of a `syscalls:sys_exit_*` record, by a direct load.
#[inline(always)]
fn syscall_ret(ctx: &aya_ebpf::programs::TracePointContext) -> i64 {
    use aya_ebpf::EbpfContext;
    // SAFETY: sys_exit_* records hold the return value at byte 16.
    unsafe { *(ctx.as_ptr().add(16) as *const i64) }
}

/// (pid, tid) of the current task.
#[inline(always)]
fn current_ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// (pid, tid) of `task`, as [`current_ids`] gives them for the current task: two
/// loads where that is a helper call.
///
/// # Safety
/// `task` must be the current task from `bpf_get_current_task_btf` (see
/// [`btf_load`]).
#[inline(always)]
unsafe fn task_ids(task: u64) -> (u32, u32) {
    // SAFETY: the caller's contract; the offsets are the loader's, from BTF.
    unsafe {
        (
            btf_load::<u32>(task, config!(task_tgid_off)),
            btf_load::<u32>(task, config!(task_pid_off)),
        )
    }
}

#[inline(always)]
fn header(kind: EventKind, pid: u32, tid: u32) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        // SAFETY: these helpers have no preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        // SAFETY: as above.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        pid,
        tid,
    }
}

#[inline(always)]
fn is_tracked_pid(pid: u32) -> bool {
    TRACKED_PIDS.get_ptr(pid).is_some()
}

/// Tracks `pid` (and the current thread) from now on: the long-running agent
/// tracks every process that has an NVIDIA device open.
#[inline(always)]
fn track(pid: u32, tid: u32) {
    if !is_tracked_pid(pid) {
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
}

/// Reads a `T` from kernel memory at `base + off`.
#[inline(always)]
fn kread<T>(base: u64, off: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// A `T` at `base + off` of a kernel object the verifier knows by its BTF type
/// (from `bpf_get_current_task_btf`, or a pointer field loaded from such an
/// object): one load instruction, which the JIT guards against faults (a fault
/// reads 0), where [`kread`] is a helper call.
///
/// # Safety
/// `base` must be such a typed pointer and `off` a constant to the verifier (a
/// loader-filled offset) at a field of type `T` of its type; the verifier
/// rejects the program otherwise.
#[inline(always)]
unsafe fn btf_load<T>(base: u64, off: u32) -> T {
    // SAFETY: the caller's contract; the kernel fault-guards the load.
    unsafe { core::ptr::read_volatile((base + off as u64) as *const T) }
}

/// Pid of a tracked thread, or `None`.
#[inline(always)]
fn tracked_tid(tid: u32) -> Option<u32> {
    // SAFETY: the value is copied out at once; a concurrent delete cannot free it
    // under us because hash-map values are RCU-protected for the program's run.
    unsafe { TRACKED_TIDS.get(tid).copied() }
}

/// Counts one event lost for `reason` on this CPU.
#[inline(always)]
fn count_drop(reason: u32) {
    if let Some(counter) = DROPS.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot: no other program writes it concurrently.
        unsafe { *counter += 1 };
    }
}

/// Counts one thing `pid` did that Keling could not account for (`reason`: an
/// `undecoded` code, with a `table_full` site + 1 in bits 8.. for TABLE_FULL,
/// see [`count_table_full`]): per CPU by reason (and site), and per process.
#[inline(never)]
fn count_undecoded(pid: u32, reason: u32) {
    let site = reason >> 8;
    if let Some(c) = UNDECODED.get_ptr_mut(reason & 0xff) {
        // SAFETY: per-CPU slot.
        unsafe { *c += 1 };
    }
    if site != 0
        && let Some(c) = TABLE_FULL_AT.get_ptr_mut(site - 1)
    {
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
    if reason & 0xff == undecoded::TABLE_FULL {
        count_unsure(pid);
    }
}

/// `undecoded::TABLE_FULL` with the table that was full (`site`: a `table_full`
/// code), for [`count_undecoded`]. Where a call's decoding stops at a full table
/// (`Err(TABLE_FULL)`), the site is `table_full::CALL`.
#[inline(always)]
const fn table_full_at(site: u32) -> u32 {
    undecoded::TABLE_FULL | (site + 1) << 8
}

/// Counts `undecoded::TABLE_FULL` for `pid`, and which table was full (`site`).
#[inline(always)]
fn count_table_full(pid: u32, site: u32) {
    count_undecoded(pid, table_full_at(site));
}

/// `pid`'s books may be wrong from now on (`TABLE_FULL_PID`).
#[inline(never)]
fn count_unsure(pid: u32) {
    match TABLE_FULL_PID.get_ptr_mut(pid) {
        // SAFETY: an aligned map value, updated atomically.
        Some(p) => unsafe {
            atomic_add(p, 1);
        },
        None => {
            // BPF_NOEXIST: only the CPU that creates the row tells the agent.
            if TABLE_FULL_PID.insert(pid, 1u64, 1).is_ok() {
                if UNSURE_NEW.push(pid, 0).is_err()
                    && let Some(lost) = UNSURE_LOST.get_ptr_mut(0)
                {
                    // SAFETY: an aligned map value, updated atomically.
                    unsafe { atomic_add(lost, 1) };
                }
            } else if let Some(p) = TABLE_FULL_PID.get_ptr_mut(pid) {
                // SAFETY: as above.
                unsafe { atomic_add(p, 1) };
            }
        }
    }
}

/// `pid` is a new process (its fork): rows an older process with the same pid
/// left in the per-process tables of full tables and undecoded calls go, so it
/// starts clean (the long-running agent removes an exited process's rows once it
/// handled its exit; `keling trace` reads them at its end).
#[inline(always)]
fn forget_books(pid: u32) {
    let _ = TABLE_FULL_PID.remove(pid);
    let _ = UNDECODED_PID.remove(pid);
}

/// Counts a full table at `site` only (`TABLE_FULL_AT`), held against no process:
/// for a table whose overflow Keling covers another way, so the books stay exact.
#[inline(always)]
fn count_table_site(site: u32) {
    if let Some(c) = TABLE_FULL_AT.get_ptr_mut(site) {
        // SAFETY: per-CPU slot.
        unsafe { *c += 1 };
    }
}

/// Writes `event` to the ring buffer and wakes the agent, or counts it as dropped.
/// For events a decision may hang on (process lifecycle, GPU memory).
#[inline(always)]
fn emit<T: 'static>(event: T) {
    submit(event, 0);
}

/// Writes a high-rate detail event (context switch, plain ioctl) without waking the
/// agent, except once each time the waiting bytes pass a multiple of a quarter of
/// the ring buffer: a wake-up per event costs the traced process more than the
/// probe itself. The agent drains on a short timer too, so these arrive within
/// its tick.
#[inline(always)]
fn emit_quiet<T: 'static>(event: T) {
    const BPF_RB_AVAIL_DATA: u64 = 0;
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    // The record this event takes: its 8-byte header and the event, 8-aligned.
    let record = (size_of::<T>() as u64 + 8 + 7) & !7;
    let every = config!(wakeup_bytes) as u64;
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA);
    // Only the event that takes the backlog to a mark wakes the agent. Waking on
    // every event while the backlog is over the mark (as before) made each one a
    // self-IPI, in a VM an exit: `keling trace` of 2 producers at full rate spent
    // ~10% of all CPU samples in `native_apic_msr_write` under
    // `bpf_ringbuf_submit`. A mark another CPU's event passes between this query
    // and that commit wakes no one; the next mark, or the agent's tick, drains it.
    let flags = if keling_common::wakes_consumer(waiting, record, every) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    submit(event, flags);
}

#[inline(always)]
fn submit<T: 'static>(event: T, flags: u64) {
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            entry.write(event);
            entry.submit(flags);
        }
        None => count_drop(DROP_RINGBUF_FULL),
    }
}

/// Atomically adds `v` to `*p`; returns the old value.
///
/// # Safety
/// `p` must point to a valid, 8-byte aligned `u64` (a map value field).
#[inline(always)]
pub unsafe fn atomic_add(p: *mut u64, v: u64) -> u64 {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};
    // SeqCst, not Relaxed: with a relaxed ordering LLVM's BPF backend (22) emits the
    // non-fetching `lock +=` and hands back the addend as if it were the old value,
    // which made every peak twice the largest allocation. Found by comparing the
    // peaks with keling-nvsim's ground truth; check the disassembly if this changes.
    // SAFETY: upheld by the caller.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(p, v) }
}

/// Atomically replaces `*p` with `new` if it is `old`; returns (previous, replaced).
///
/// # Safety
/// As [`atomic_add`].
#[inline(always)]
pub unsafe fn atomic_cas(p: *mut u64, old: u64, new: u64) -> (u64, bool) {
    use core::intrinsics::{AtomicOrdering, atomic_cxchg};
    // SAFETY: upheld by the caller.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(p, old, new)
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// bpf_probe_read_kernel is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
