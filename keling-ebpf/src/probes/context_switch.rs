//! Context switches of tracked threads (`sched:sched_switch`).
//!
//! Filtered in the kernel: a switch is reported only when the thread going off or
//! coming on the CPU is in `TRACKED_TIDS`; everything else costs two hash lookups.
//! For the long-running agent a switch-in is only an activity signal (active.rs).
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::tracepoint,
    programs::TracePointContext,
};
use keling_common::{EventKind, SwitchEvent, active_cause, task_state};

use crate::{TRACKED_TIDS, current_ids, emit_quiet, header, tracked_tid};

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch(ctx: TracePointContext) -> i32 {
    let rc = match try_sched_switch(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    // Orphaned files are checked from here now and then (see orphans.rs).
    if super::orphans::sweep_due() {
        super::orphans::queue_sweep();
    }
    // Accounting work a chain of tail calls left on this CPU is done here.
    super::deferred::run(&ctx);
    rc
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: reads inside the tracepoint record at offsets from its format file.
    let prev_tid: u32 =
        unsafe { ctx.read_at(config!(switch_prev_pid_off) as usize) }.map_err(|e| e as i64)?;
    // SAFETY: as above.
    let next_tid: u32 =
        unsafe { ctx.read_at(config!(switch_next_pid_off) as usize) }.map_err(|e| e as i64)?;
    let prev_pid = tracked_tid(prev_tid);
    let next_pid = tracked_tid(next_tid);
    if prev_pid.is_none() && next_pid.is_none() {
        return Ok(());
    }
    // SAFETY: as above.
    let prev_state: u64 =
        unsafe { ctx.read_at(config!(switch_prev_state_off) as usize) }.map_err(|e| e as i64)?;
    if prev_pid.is_some() && prev_state & task_state::DEAD_MASK != 0 {
        // The thread's last switch: it will never run again.
        let _ = TRACKED_TIDS.remove(prev_tid);
    }
    if super::active::limited() {
        if let Some(next_pid) = next_pid {
            super::active::report(next_pid, next_tid, active_cause::SWITCH_IN);
        }
        return Ok(());
    }
    let (pid, tid) = current_ids();
    // The thread going off is `current`; the scheduler charged it its time on the
    // CPU just before this tracepoint, so the counter is up to date.
    let prev_runtime_ns = if prev_pid.is_some() {
        // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error,
        // reported as 0 (the agent then falls back to the switch timestamps).
        unsafe {
            let task = bpf_get_current_task() as *const u8;
            bpf_probe_read_kernel(task.add(config!(task_runtime_off) as usize) as *const u64)
        }
        .unwrap_or(0)
    } else {
        0
    };
    emit_quiet(SwitchEvent {
        header: header(EventKind::Switch, pid, tid),
        prev_tid,
        prev_pid: prev_pid.unwrap_or(0),
        next_tid,
        next_pid: next_pid.unwrap_or(0),
        prev_state,
        prev_runtime_ns,
    });
    Ok(())
}
