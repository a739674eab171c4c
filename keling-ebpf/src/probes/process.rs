//! Process lifecycle: fork, exec, exit.
//!
//! These programs see every process on the host. They keep `TRACKED_PIDS` and
//! `TRACKED_TIDS` up to date in the kernel, so a child of a tracked process is
//! tracked from the instant it exists, with no race against the agent.
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_task, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::HashMap,
    programs::{RawTracePointContext, TracePointContext},
};
use keling_common::{
    COMM_LEN, EventKind, ExecEvent, ExitEvent, FILENAME_LEN, ForkEvent, MAX_TRACE_COMMS,
    TrackedProcess,
};

use crate::{TRACKED_PIDS, TRACKED_TIDS, current_ids, emit, header, is_tracked_pid, track};

/// Names `keling trace --comm` follows (see `keling_common::MAP_TRACE_COMMS`).
/// Empty for every other command, so the lookup below never matches there.
#[map]
static TRACE_COMMS: HashMap<[u8; COMM_LEN], u32> = HashMap::with_max_entries(MAX_TRACE_COMMS, 0);

/// Whether an untracked process that just exec'd took a name `--comm` follows; if
/// so it is tracked from here on (before it runs a single instruction of its new
/// image), and so are its children from their fork.
#[inline(always)]
fn follow_by_comm(pid: u32, tid: u32) -> bool {
    // At sched_process_exec the task already carries its new comm.
    let Ok(comm) = bpf_get_current_comm() else {
        return false;
    };
    if TRACE_COMMS.get_ptr(comm).is_none() {
        return false;
    }
    // After exec the process has one thread: the current one.
    track(pid, tid);
    is_tracked_pid(pid)
}

/// Reads a `u32` field of a `task_struct` at a byte offset found in BTF.
#[inline(always)]
fn task_u32(task: *const u8, offset: u32) -> Result<u32, i64> {
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one is an error.
    unsafe { bpf_probe_read_kernel(task.add(offset as usize) as *const u32) }.map_err(|e| e as i64)
}

/// `sched_process_fork` as a raw tracepoint: its arguments are the parent and the
/// child `task_struct`, which is the only way to learn whether the child is a new
/// thread (same tgid) or a new process.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    match try_sched_process_fork(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_sched_process_fork(ctx: &RawTracePointContext) -> Result<(), i64> {
    let child: *const u8 = ctx.arg(1);
    let child_tid = task_u32(child, config!(task_pid_off))?;
    let child_pid = task_u32(child, config!(task_tgid_off))?;
    let (pid, tid) = current_ids();
    let new_process = child_pid != pid;
    if new_process {
        crate::forget_books(child_pid);
    }

    // SAFETY: the value is copied out at once.
    let parent = unsafe { TRACKED_PIDS.get(pid).copied() };
    if let Some(parent) = parent {
        // Insert before anything can run in the child: the child is not yet
        // runnable when this tracepoint fires.
        TRACKED_TIDS.insert(child_tid, child_pid, 0)?;
        if new_process {
            let proc = TrackedProcess {
                root_pid: parent.root_pid,
                flags: 0,
            };
            TRACKED_PIDS.insert(child_pid, proc, 0)?;
            super::files::on_fork(pid, child_pid);
        }
    } else {
        if new_process {
            // An untracked process holding a traced file (see files::watches).
            super::files::on_fork(pid, child_pid);
        }
        if !(new_process && config!(system_wide) != 0) {
            return Ok(());
        }
    }
    emit(ForkEvent {
        header: header(EventKind::Fork, pid, tid),
        child_pid,
        child_tid,
        tracked: parent.is_some() as u32,
        _reserved: 0,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    });
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> i32 {
    let rc = match try_sched_process_exec(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    // Files whose last fd went away are released in a tail call, last.
    super::deferred::run(&ctx);
    rc
}

fn try_sched_process_exec(ctx: &TracePointContext) -> Result<(), i64> {
    let (pid, tid) = current_ids();
    let tracked = is_tracked_pid(pid) || follow_by_comm(pid, tid);
    // Tracked or not: an untracked process may hold a traced file (files::watches).
    super::files::on_exec(pid, tid);
    if !tracked && config!(system_wide) == 0 {
        return Ok(());
    }
    // SAFETY: reads inside the tracepoint record at offsets from its format file.
    let old_tid: u32 =
        unsafe { ctx.read_at(config!(exec_old_pid_off) as usize) }.map_err(|e| e as i64)?;
    if tracked && old_tid != tid {
        // A non-leader thread exec'd and took the leader's id.
        let _ = TRACKED_TIDS.remove(old_tid);
        TRACKED_TIDS.insert(tid, pid, 0)?;
    }
    let mut event = ExecEvent {
        header: header(EventKind::Exec, pid, tid),
        old_tid,
        tracked: tracked as u32,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        filename: [0; FILENAME_LEN],
    };
    // __data_loc: low 16 bits are the offset of the string in the record.
    // SAFETY: as above.
    let loc: u32 =
        unsafe { ctx.read_at(config!(exec_filename_off) as usize) }.map_err(|e| e as i64)?;
    // SAFETY: the string lies inside the record; the helper bounds the copy.
    let src = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
    // SAFETY: as above.
    let _ = unsafe { bpf_probe_read_kernel_str_bytes(src, &mut event.filename) };
    emit(event);
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> i32 {
    let rc = match try_sched_process_exit(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    // Files whose last fd went away are released in a tail call, last.
    super::deferred::run(&ctx);
    rc
}

fn try_sched_process_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let (pid, tid) = current_ids();
    let group_dead = if config!(exit_group_dead_off) != 0 {
        // SAFETY: reads inside the tracepoint record at an offset from its format.
        let dead: u8 =
            unsafe { ctx.read_at(config!(exit_group_dead_off) as usize) }.map_err(|e| e as i64)?;
        dead != 0
    } else {
        tid == pid
    };
    let tracked = is_tracked_pid(pid);
    if group_dead {
        // Tracked or not: an untracked process may hold a traced file.
        super::files::on_exit(pid, tid);
    }
    if tracked {
        // The thread stays in TRACKED_TIDS until its last switch-out (see context_switch.rs),
        // so its final slice on the CPU is still accounted.
        if group_dead {
            let _ = TRACKED_PIDS.remove(pid);
        }
    } else if !(group_dead && config!(system_wide) != 0) {
        return Ok(());
    }
    // SAFETY: current task pointer; the read is checked by the helper.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let exit_status = task_u32(task, config!(task_exit_code_off))?;
    emit(ExitEvent {
        header: header(EventKind::Exit, pid, tid),
        exit_status,
        group_dead: group_dead as u32,
        tracked: tracked as u32,
        _reserved: 0,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    });
    Ok(())
}
