//! Events the probes write to the `EVENTS` ring buffer (kernel -> user).
//!
//! Every event starts with an [`EventHeader`]; `kind` says which struct follows.
//! Kinds live in fixed numeric ranges per subsystem so that a new subsystem never
//! renumbers an old one: process 1-99, scheduler 100-199, GPU 200-299.

/// Length of a task's `comm` (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;
/// Bytes of an exec'd file name kept in an [`ExecEvent`]; longer names are cut.
pub const FILENAME_LEN: usize = 128;

/// What follows the header. `#[repr(u32)]` so it has the same width as the field.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Fork = 1,
    Exec = 2,
    Exit = 3,
    Switch = 100,
    Active = 101,
    GpuOpen = 200,
    GpuClose = 201,
    GpuAlloc = 210,
    GpuFree = 211,
    GpuObject = 212,
    GpuTeardown = 213,
    GpuIoctl = 214,
    GpuRef = 215,
    GpuExport = 216,
    GpuCharge = 217,
}

impl EventKind {
    /// Every kind, in numeric order.
    pub const ALL: [EventKind; 15] = [
        Self::Fork,
        Self::Exec,
        Self::Exit,
        Self::Switch,
        Self::Active,
        Self::GpuOpen,
        Self::GpuClose,
        Self::GpuAlloc,
        Self::GpuFree,
        Self::GpuObject,
        Self::GpuTeardown,
        Self::GpuIoctl,
        Self::GpuRef,
        Self::GpuExport,
        Self::GpuCharge,
    ];

    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Fork),
            2 => Some(Self::Exec),
            3 => Some(Self::Exit),
            100 => Some(Self::Switch),
            101 => Some(Self::Active),
            200 => Some(Self::GpuOpen),
            201 => Some(Self::GpuClose),
            210 => Some(Self::GpuAlloc),
            211 => Some(Self::GpuFree),
            212 => Some(Self::GpuObject),
            213 => Some(Self::GpuTeardown),
            214 => Some(Self::GpuIoctl),
            215 => Some(Self::GpuRef),
            216 => Some(Self::GpuExport),
            217 => Some(Self::GpuCharge),
            _ => None,
        }
    }
}

/// Common header of every event (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] as `u32` (a raw integer, not the enum, so that an unknown
    /// kind from a newer kernel object is an error the decoder reports, not UB).
    pub kind: u32,
    /// CPU the probe ran on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` when the probe ran (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// Process (tgid) of the task that was current when the probe ran.
    pub pid: u32,
    /// Thread of the task that was current when the probe ran.
    pub tid: u32,
}

/// A task was created (`sched_process_fork`; a new thread or a new process).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkEvent {
    /// `pid`/`tid` are the parent.
    pub header: EventHeader,
    pub child_pid: u32,
    pub child_tid: u32,
    /// Whether the parent process is tracked (1) or this is a system-wide
    /// process-creation event (0). `u32` instead of `bool` so the type has no padding.
    pub tracked: u32,
    pub _reserved: u32,
    /// The parent's `comm` (the child starts with the same one).
    pub comm: [u8; COMM_LEN],
}

/// A process called execve successfully (`sched_process_exec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// The thread id before exec; differs from `header.tid` when a non-leader thread
    /// exec'd and took over the leader's id.
    pub old_tid: u32,
    pub tracked: u32,
    /// `comm` after exec.
    pub comm: [u8; COMM_LEN],
    /// NUL-terminated (or cut) path passed to exec.
    pub filename: [u8; FILENAME_LEN],
}

/// A thread exited (`sched_process_exit`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// `task_struct.exit_code`: a wait(2) status (`code << 8`, or the signal number
    /// in the low 7 bits, 0x80 when it dumped core).
    pub exit_status: u32,
    /// 1 when this was the last live thread of the process (the process is gone).
    pub group_dead: u32,
    pub tracked: u32,
    pub _reserved: u32,
    pub comm: [u8; COMM_LEN],
}

/// A context switch involving at least one tracked thread (`sched_switch`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchEvent {
    /// `pid`/`tid` are the task switched out (current when the probe ran).
    pub header: EventHeader,
    pub prev_tid: u32,
    /// Process of `prev_tid` if tracked, else 0.
    pub prev_pid: u32,
    pub next_tid: u32,
    /// Process of `next_tid` if tracked, else 0.
    pub next_pid: u32,
    /// The tracepoint's `prev_state` (task state bits as `sched_switch` reports them).
    pub prev_state: u64,
    /// The kernel's own CPU-time counter of the thread switched out (its
    /// `se.sum_exec_runtime`, ns, brought up to date just before this tracepoint)
    /// when that thread is tracked, else 0. On-CPU time comes from it, so a switch
    /// the kernel never reported (some kernels hide switches away from certain
    /// tasks, see docs/limits.md) or a lost event costs no CPU time.
    pub prev_runtime_ns: u64,
}

/// A tracked process showed it is working: a thread of it was switched onto a CPU or
/// it made an NVIDIA call. The long-running agent gets these instead of every
/// switch and every plain call: at most one per [`ActiveEvent::root_pid`] per
/// `ProbeConfig::active_interval_ns`, decided in the kernel. `pid`/`tid` are the
/// process and thread that were active.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveEvent {
    pub header: EventHeader,
    /// The tracked root the process descends from (what the limit is kept per).
    pub root_pid: u32,
    /// [`active_cause`]: what showed it.
    pub cause: u32,
}

code_set! {
    /// [`ActiveEvent::cause`](crate::ActiveEvent::cause).
    pub mod active_cause, enum ActiveCause {
        /// A thread was switched onto a CPU.
        SWITCH_IN = 1, SwitchIn, "switch_in";
        /// An NVIDIA call that changed no memory and did not fail.
        IOCTL = 2, Ioctl, "ioctl";
    }
}

/// `prev_state` bits of `sched_switch` (the kernel's TASK_REPORT states).
pub mod task_state {
    pub const INTERRUPTIBLE: u64 = 0x01;
    pub const UNINTERRUPTIBLE: u64 = 0x02;
    pub const STOPPED: u64 = 0x04;
    pub const TRACED: u64 = 0x08;
    pub const EXIT_DEAD: u64 = 0x10;
    pub const EXIT_ZOMBIE: u64 = 0x20;
    pub const PARKED: u64 = 0x40;
    pub const IDLE: u64 = 0x80;
    /// Set (alone) when the task was preempted while runnable.
    pub const PREEMPTED: u64 = 0x100;
    /// Every "the task gave the CPU up itself" state.
    pub const SLEEP_MASK: u64 = 0xff;
    /// The task is dead: this is its last switch.
    pub const DEAD_MASK: u64 = EXIT_DEAD | EXIT_ZOMBIE;
}

impl SwitchEvent {
    /// A switch is voluntary when the task left the CPU in a sleeping, stopped or
    /// dead state; it is involuntary when it was still runnable (preempted, or
    /// `prev_state` 0 after a yield).
    pub const fn voluntary(&self) -> bool {
        self.prev_state & task_state::SLEEP_MASK != 0
    }
}
