//! The long-running agent's "this process is working" signal.
//!
//! The scheduler only needs to know that a task is active (a thread of it got a
//! CPU, or it made an NVIDIA call), not each switch and call: at 100 000 calls a
//! second an event per call costs the traced process and the agent for nothing.
//! When `active_interval_ns` is set (`keling run`), such switches and plain calls
//! are not reported; instead at most one [`ActiveEvent`] per tracked root process
//! per interval is, decided here with a compare-and-swap on the root's last report
//! time, so concurrent CPUs cannot both report one interval. Each wakes the agent:
//! a quiet event would wait for the agent's drain timer (the bench measured freeze
//! delivery p50 4.8 ms, max 10 ms, that way).
use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_ns},
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use keling_common::{ActiveEvent, EventKind, MAX_TRACKED_PIDS};

use crate::{TRACKED_PIDS, atomic_cas, emit, header};

/// Tracked root pid -> when it was last reported active (ns). LRU: roots that are
/// gone fall out by themselves.
#[map]
static ACTIVE_LAST: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_TRACKED_PIDS, 0);

/// Per CPU: the last answer this CPU got from `ACTIVE_LAST`, as [a pid, until when
/// (ns) its root needs no report, a jiffies value during which that held for at
/// least [`JIFFY_BOUND_NS`] more (or [`NO_JIFFY`])]. A busy process's switches and
/// calls come back to the same CPU again and again; while the answer holds they
/// cost one array load and a read of jiffies instead of two hash lookups and the
/// clock (measured with `kernel.bpf_stats_enabled`, 8 rounds of 900 000
/// RM_CONTROLs under `keling run`: the hash lookups, `sys_enter_ioctl` 800 -> 733
/// ns a run, medians; the clock, see [`report`]). Keyed by pid, not root: a
/// process keeps its root for its life.
#[map]
static ACTIVE_SEEN: PerCpuArray<[u64; 3]> = PerCpuArray::with_max_entries(1, 0);

/// Longer than any jiffy (HZ is at least 100) with room for the tick to lag: a
/// call that still sees the jiffies value of a clock reading came less than this
/// after it. (A tick that lags more, e.g. its CPU held by a hypervisor, delays an
/// activity signal by the lag; never more than that.)
const JIFFY_BOUND_NS: u64 = 20_000_000;
const NO_JIFFY: u64 = u64::MAX;

const BPF_NOEXIST: u64 = 1;

/// Whether switches and plain calls are replaced by activity signals.
#[inline(always)]
pub fn limited() -> bool {
    config!(active_interval_ns) != 0
}

/// Reports that thread `tid` of `pid` was active (`cause`: an `active_cause`),
/// unless its tracked root was reported within the interval.
#[inline(never)]
pub fn report(pid: u32, tid: u32, cause: u32) {
    let Some(cache) = ACTIVE_SEEN.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs that report do not nest on a CPU.
    let cache = unsafe { &mut *cache };
    // The clock is the dearest part of a call that reports nothing (a VM's
    // `read_tsc`: ~6% of a traced RM_CONTROL's samples under `perf record`); a
    // jiffies value is a load. Without the clock here: `sys_enter_ioctl` 566 ->
    // 518 ns a run (`xtask/scripts/ab-ioctl.sh`, 6 interleaved rounds, medians).
    // SAFETY: no preconditions.
    let jiffies = unsafe { bpf_jiffies64() };
    let same_pid = cache[0] == u64::from(pid);
    if same_pid && cache[2] == jiffies {
        return;
    }
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if same_pid && now < cache[1] {
        cache[2] = jiffy_of(jiffies, now, cache[1]);
        return;
    }
    // SAFETY: copied out at once.
    let root = unsafe { TRACKED_PIDS.get(pid) }.map_or(pid, |t| t.root_pid);
    let interval = config!(active_interval_ns) as u64;
    match ACTIVE_LAST.get_ptr_mut(root) {
        Some(last) => {
            // SAFETY: a map value pointer; other CPUs change it only atomically.
            let seen = unsafe { core::ptr::read_volatile(last) };
            if now.wrapping_sub(seen) < interval {
                let until = seen.wrapping_add(interval);
                *cache = [u64::from(pid), until, jiffy_of(jiffies, now, until)];
                return;
            }
            // SAFETY: as above; an 8-byte aligned map value.
            let (was, won) = unsafe { atomic_cas(last, seen, now) };
            if !won {
                // Another CPU reported this interval.
                let until = was.wrapping_add(interval);
                *cache = [u64::from(pid), until, jiffy_of(jiffies, now, until)];
                return;
            }
        }
        None => {
            if ACTIVE_LAST.insert(root, now, BPF_NOEXIST).is_err() {
                return;
            }
        }
    }
    *cache = [
        u64::from(pid),
        now + interval,
        jiffy_of(jiffies, now, now + interval),
    ];
    // With a wake-up: a decision may hang on it (a waiting or yielded task that
    // is active again), and there is at most one per root process per interval.
    emit(ActiveEvent {
        header: header(EventKind::Active, pid, tid),
        root_pid: root,
        cause,
    });
}

/// `jiffies` if, read at `now`, the answer holds until `until` for longer than any
/// call can see that jiffies value; else [`NO_JIFFY`] (the clock decides).
#[inline(always)]
fn jiffy_of(jiffies: u64, now: u64, until: u64) -> u64 {
    if until.saturating_sub(now) > JIFFY_BOUND_NS {
        jiffies
    } else {
        NO_JIFFY
    }
}
