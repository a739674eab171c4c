//! The two backends' entry and exit programs: which ioctls are NVIDIA calls, on
//! which file, and what [`enter`] leaves pending for [`exit`].
use aya_ebpf::{
    helpers::bpf_get_current_task_btf,
    macros::{kprobe, kretprobe, map, tracepoint, uretprobe},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use keling_common::{
    NO_GPU, active_cause, device_file,
    nvidia::{self, escape, uvm},
    open_how, undecoded,
};

use super::{
    IN_FLIGHT, PENDING_IOCTL, PendingIoctl,
    decode::{count_calls, decode_enter},
    handlers::{IoctlCalls, Report, finish, handler, plain_exit},
};
use crate::{
    atomic_add, current_ids, kread,
    probes::files::{
        FILES, add_fd, device_of_file, fd_table_changes, file_in_table, find_slot, follows,
        proc_fds,
    },
    syscall_arg, syscall_ret, task_ids,
};

/// Where the entry builds a [`PendingIoctl`] (it does not fit the stack with the
/// rest), per CPU.
#[map]
static SCRATCH_IOCTL: aya_ebpf::maps::PerCpuArray<PendingIoctl> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// A table answer [`enter`] found: `pid`'s `fd` is `file`, NVIDIA device
/// `device`, while `FD_TABLE_CHANGES` was `changes`.
#[derive(Clone, Copy)]
#[repr(C)]
struct FdMemo {
    file: u64,
    changes: u64,
    pid: u32,
    fd: i32,
    device: u32,
    _reserved: u32,
}

/// Per CPU: the last [`FdMemo`]. A process's calls come back to the same CPU on
/// the same few fds again and again.
#[map]
static FD_MEMO: aya_ebpf::maps::PerCpuArray<FdMemo> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// The command has the shape of an RM escape ('F') or a UVM command (a plain
/// number up to UVM_IS_8_SUPPORTED, or INITIALIZE / DEINITIALIZE): worth looking at
/// the file.
#[inline(always)]
fn nvidia_shaped(cmd: u32) -> bool {
    nvidia::rm_type(cmd) == nvidia::RM_IOCTL_TYPE
        || (cmd != 0 && cmd <= uvm::IS_8_SUPPORTED)
        || cmd == uvm::INITIALIZE
        || cmd == uvm::DEINITIALIZE
}

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> i32 {
    // sys_enter_ioctl(fd, cmd, arg).
    let cmd = syscall_arg(&ctx, 1) as u32;
    if !nvidia_shaped(cmd) {
        return 0;
    }
    let (fd, arg) = (syscall_arg(&ctx, 0) as i32, syscall_arg(&ctx, 2));
    // One helper call for the task, then loads for its fd table and its ids.
    // SAFETY: no preconditions.
    let task = unsafe { bpf_get_current_task_btf() } as u64;
    let file = file_in_table(task, fd);
    if file != 0 {
        // SAFETY: the current task, BTF-typed.
        enter(unsafe { task_ids(task) }, fd, file, cmd, arg);
    }
    0
}

/// The driver-entry backend's entry: `unlocked_ioctl(struct file *, unsigned int
/// cmd, unsigned long arg)` of nvidia.ko or nvidia-uvm.ko. Every call here is an
/// NVIDIA call.
#[kprobe]
pub fn keling_driver_ioctl_entry(ctx: ProbeContext) -> u32 {
    let (Some(file), Some(cmd), Some(arg)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2))
    else {
        return 0;
    };
    let cmd = cmd as u32;
    // The same calls as the tracepoints look at.
    if nvidia_shaped(cmd)
        && let Some(fd) = ioctl_syscall_fd()
    {
        enter(current_ids(), fd, file, cmd, arg);
    }
    0
}

/// The fd of the ioctl(2) that led into the driver, from the user registers the
/// kernel saved at syscall entry; `None` for any other way into the driver (a
/// 32-bit process's compat ioctl, whose params have another layout, or none
/// known: the tracepoint backend does not see those either).
#[inline(always)]
fn ioctl_syscall_fd() -> Option<i32> {
    if config!(regs_arg0_off) == config!(regs_syscall_nr_off) {
        return None; // no registers' layout for this kernel
    }
    // SAFETY: these helpers have no preconditions; the registers are read with
    // checked kernel reads.
    let regs = unsafe {
        aya_ebpf::helpers::bpf_task_pt_regs(aya_ebpf::helpers::bpf_get_current_task_btf())
    } as u64;
    // x86-64's pt_regs has `di` just before `orig_ax`: then one read.
    let (fd, nr) = if config!(regs_syscall_nr_off) == config!(regs_arg0_off) + 8 {
        let pair = kread::<[u64; 2]>(regs, config!(regs_arg0_off))?;
        (pair[0], pair[1])
    } else {
        (
            kread::<u64>(regs, config!(regs_arg0_off))?,
            kread::<u64>(regs, config!(regs_syscall_nr_off))?,
        )
    };
    (nr == u64::from(config!(ioctl_syscall_nr))).then_some(fd as i32)
}

/// An NVIDIA-shaped call of the current thread (`(pid, tid)`) on `fd`, whose
/// open file is `file`: looked at if the file is an NVIDIA device the agent
/// follows, decoded, and left pending for [`exit`].
#[inline(always)]
fn enter((pid, tid): (u32, u32), fd: i32, file: u64, cmd: u32, arg: u64) {
    // The device from the process's table when it names this very file: this
    // CPU's last answer while no known fd has left any table since.
    let mut device = device_file::NONE;
    let mut known = false;
    let changes = fd_table_changes();
    let memo = FD_MEMO.get_ptr_mut(0);
    // SAFETY: this CPU's slot; programs that decode calls do not nest on a CPU.
    if let Some(m) = memo.map(|m| unsafe { &*m })
        && m.file == file
        && m.pid == pid
        && m.fd == fd
        && m.changes == changes
    {
        device = m.device;
        known = true;
    } else if let Some(fds) = proc_fds(pid, false)
        && let Some(i) = find_slot(fds, fd)
    {
        // SAFETY: a map value pointer; i is in bounds.
        let s = unsafe { &(*fds).slots[i] };
        if s.file_id == file {
            device = s.device;
            known = true;
            if let Some(m) = memo {
                // SAFETY: as above.
                unsafe {
                    *m = FdMemo {
                        file,
                        changes,
                        pid,
                        fd,
                        device,
                        _reserved: 0,
                    }
                };
            }
        }
    }
    if !known {
        device = device_of_file(file);
    }
    if device == device_file::NONE {
        return;
    }
    let followed = follows(pid);
    if !followed && FILES.get_ptr(file).is_none() {
        // `keling trace`: an untracked process, on a file no traced client lives on.
        return;
    }
    if !known {
        // Followed, or (`keling trace`) a process outside the trace using a traced
        // client's file: its table then says when it lets the file go.
        add_fd(fd, device, file, open_how::FIRST_USE, -1);
    }
    let Some(p) = SCRATCH_IOCTL.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot; the program runs to completion on this CPU.
    let p = unsafe { &mut *p };
    *p = PendingIoctl {
        params: arg,
        sub_params: 0,
        file_id: file,
        aux_file: 0,
        cmd,
        escape: 0,
        size: 0,
        device,
        fd,
        client: 0,
        parent: 0,
        handle: 0,
        class: 0,
        gpu: if device <= device_file::MAX_GPU {
            device
        } else {
            NO_GPU
        },
        sub: 0,
        aux: 0,
        aux2: 0,
        via_xfer: 0,
        undecoded: 0,
        pid,
        tid,
        ret: 0,
        mem_kind: 0,
        has_control: 0,
        bytes: 0,
    };
    if let Err(reason) = decode_enter(p) {
        p.undecoded = 1 + reason;
    }
    if crate::probes::active::limited() {
        // The long-running agent asks nothing of a plain call's result (only
        // memory, and activity): its activity is reported now and it leaves no
        // pending entry, so its exit costs one array read. Calls with a handler,
        // REGISTER_FD (its exit records the pairing) and undecoded ones (their
        // count) take the full path.
        if p.undecoded == 0
            && handler(p) == 0
            && (p.device == device_file::UVM || p.escape != escape::REGISTER_FD)
        {
            crate::probes::active::report(pid, tid, active_cause::IOCTL);
            return;
        }
    } else if followed {
        // Exact call counts are `keling trace`'s summary; the long-running agent
        // reads none, and is spared two hash updates a call.
        count_calls(p);
    }
    // Counted first: an exit never finds an entry the count does not include.
    let Some(n) = IN_FLIGHT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a map value pointer; every CPU changes it only atomically.
    unsafe { atomic_add(n, 1) };
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "a copy would go on the stack"
    )]
    if PENDING_IOCTL.insert(tid, &*p, 0).is_err() {
        // SAFETY: as above.
        unsafe { atomic_add(n, u64::MAX) };
    }
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> i32 {
    // No NVIDIA call in flight anywhere: nothing to look up.
    let idle = match IN_FLIGHT.get_ptr(0) {
        // SAFETY: a map value pointer; a plain load of a counter others add to.
        Some(n) => (unsafe { core::ptr::read_volatile(n) }) == 0,
        None => true,
    };
    if !idle {
        exit(&ctx, syscall_ret(&ctx));
    }
    0
}

/// The driver-entry backend's exit: the driver's `unlocked_ioctl` returned `ret`
/// (what the ioctl(2) returns).
#[kretprobe]
pub fn keling_driver_ioctl_return(ctx: RetProbeContext) -> u32 {
    let ret: i64 = ctx.ret();
    exit(&ctx, ret);
    0
}

/// The driver-entry backend's exit path where kprobes cannot attach (this
/// project's CI machines): the same [`exit`] in a program of the same type, run
/// by a uretprobe on a function the test workload calls right after each ioctl
/// returns, with its return value (keling-agent's `KELING_TEST_IOCTL_RETURN`).
/// Attached by nothing else.
#[uretprobe]
pub fn keling_test_ioctl_return(ctx: RetProbeContext) -> u32 {
    let ret: i64 = ctx.ret();
    exit(&ctx, ret);
    0
}

/// The call the current thread left pending at [`enter`] returned `ret`: reported,
/// or handed to its handler program.
#[inline(always)]
fn exit<C: IoctlCalls>(ctx: &C, ret: i64) {
    let (_, tid) = current_ids();
    // Worked on in place: a copy would take a third of the 512-byte stack.
    let Some(p) = PENDING_IOCTL.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a map value pointer, valid for this program run; only this thread's
    // syscall uses this entry.
    let p = unsafe { &mut *p };
    p.ret = ret;
    if p.undecoded == 0 && p.ret == 0 {
        let h = handler(p);
        if h != 0 {
            // SAFETY: a tail call to a program of the same type.
            unsafe { C::ioctl_prog().tail_call(ctx, h) };
            // Only reached if the tail call failed.
            p.undecoded = 1 + undecoded::TABLE_FULL;
        }
    }
    let result = if p.undecoded != 0 || p.ret != 0 {
        Ok(Some(Report::status(0)))
    } else {
        plain_exit(p)
    };
    finish(ctx, p, result);
}
