//! Shared maps and load-time configuration (user -> kernel).
//!
//! Map names are the symbols the probes define; the agent looks them up by these
//! constants so a rename breaks the build, not the run.

/// Ring buffer of events (kernel -> user). Size set by the agent at load time.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU `u64` array, index [`DROP_RINGBUF_FULL`]: events the ring buffer could not take.
pub const MAP_DROPS: &str = "DROPS";
/// Hash `pid -> TrackedProcess`: the processes being traced. Children are added by
/// the fork probe in the kernel, so none is missed; the exit probe removes them.
pub const MAP_TRACKED_PIDS: &str = "TRACKED_PIDS";
/// Hash `tid -> pid` of every thread of a tracked process, so `sched_switch` can
/// filter both sides of a switch with one lookup each.
pub const MAP_TRACKED_TIDS: &str = "TRACKED_TIDS";
/// Name of the [`ProbeConfig`] global the agent sets at load time.
pub const GLOBAL_CONFIG: &str = "KELING_CONFIG";

/// Tail-call slots: which program each program array holds where. The probes
/// tail-call by these numbers and the agent fills the arrays by them, so the two
/// sides cannot disagree on a literal.
pub mod tail_call {
    /// Entries of each program array (slot 0 is never used: 0 means "none").
    pub const SLOTS: u32 = 8;
    /// The kprobe-type twin of each tail-called program (the driver-entry
    /// backend's) is named with this suffix, and so is its program array.
    pub const KPROBE_SUFFIX: &str = "_kprobe";
    /// `WORK_PROG`: the deferred accounting work, by work kind.
    pub mod work {
        pub const MAP: &str = "WORK_PROG";
        pub const MAP_KPROBE: &str = "WORK_PROG_KPROBE";
        /// Release an open file: tear down its clients.
        pub const RELEASE_FILE: u32 = 1;
        /// Tear down memories shared with other clients.
        pub const TEARDOWN_SHARED: u32 = 2;
        /// Settle a torn-down client's contributors.
        pub const TEARDOWN_CONTRIBUTORS: u32 = 3;
        /// close_range: drop a range of fds.
        pub const CLOSE_RANGE: u32 = 4;
        /// A file whose fd went while other references remain.
        pub const ORPHAN: u32 = 5;
        /// Check a few orphans.
        pub const SWEEP: u32 = 6;
    }
    /// `IOCTL_PROG`: the handlers of the NVIDIA calls that change memory,
    /// reached from `sys_exit_ioctl`.
    pub mod ioctl {
        pub const MAP: &str = "IOCTL_PROG";
        pub const MAP_KPROBE: &str = "IOCTL_PROG_KPROBE";
        pub const ALLOC: u32 = 1;
        pub const FREE: u32 = 2;
        pub const CONTROL: u32 = 3;
        pub const DUP: u32 = 4;
        pub const BATCH_EXPORT: u32 = 5;
        pub const BATCH_IMPORT: u32 = 6;
    }
}

/// Index into `DROPS`: the ring buffer was full.
pub const DROP_RINGBUF_FULL: u32 = 0;
/// Number of drop counters in `DROPS`.
pub const DROP_COUNTERS: u32 = 1;

/// Most processes / threads that can be tracked at once.
pub const MAX_TRACKED_PIDS: u32 = 16384;
pub const MAX_TRACKED_TIDS: u32 = 65536;

/// Hash `comm -> 1`: the names `keling trace --comm` follows. The exec probe adds
/// an untracked process whose new `comm` is listed here to `TRACKED_PIDS` (its
/// children then follow from fork as usual). Keys are `comm` as the kernel keeps
/// it: at most 15 bytes, NUL-padded to `COMM_LEN`.
pub const MAP_TRACE_COMMS: &str = "TRACE_COMMS";
/// Most names `--comm` can follow at once.
pub const MAX_TRACE_COMMS: u32 = 16;

/// Value of `TRACKED_PIDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackedProcess {
    /// The process the agent asked to track (the root of this tree).
    pub root_pid: u32,
    /// Reserved for per-process flags; keeps the value 8 bytes with no padding.
    pub flags: u32,
}

/// Whether a detail event wakes the ring buffer's consumer: only the one whose
/// record (`record` bytes, header included) takes the bytes waiting to or past a
/// multiple of `every` ([`ProbeConfig::wakeup_bytes`]; 0: never), so a backlog
/// wakes the consumer once per `every` bytes and not once per event.
#[inline(always)]
pub const fn wakes_consumer(waiting: u64, record: u64, every: u64) -> bool {
    every != 0 && waiting / every != (waiting + record) / every
}

#[cfg(test)]
mod wake_tests {
    use super::wakes_consumer;

    #[test]
    fn only_the_event_that_reaches_a_mark_wakes() {
        assert!(!wakes_consumer(0, 64, 1024));
        assert!(!wakes_consumer(959, 64, 1024)); // short of the mark
        assert!(wakes_consumer(960, 64, 1024)); // to it
        assert!(wakes_consumer(1000, 64, 1024)); // past it
        assert!(!wakes_consumer(1024, 64, 1024)); // over the mark already
        assert!(wakes_consumer(2000, 64, 1024));
        assert!(!wakes_consumer(1 << 40, 64, 0));
    }

    #[test]
    fn a_growing_backlog_wakes_once_per_mark() {
        let (record, every) = (72u64, 4096u64);
        let mut waiting = 0;
        let mut wakes = 0;
        while waiting < 10 * every {
            wakes += u64::from(wakes_consumer(waiting, record, every));
            waiting += record;
        }
        assert_eq!(wakes, 10);
    }
}

/// Load-time configuration, written into the programs' read-only global
/// [`GLOBAL_CONFIG`] by the agent. The offsets differ between kernels, so the agent
/// reads them from `/sys/kernel/btf/vmlinux` and the tracepoints' `format` files
/// instead of compiling them in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Byte offsets inside `struct task_struct`.
    pub task_pid_off: u32,
    pub task_tgid_off: u32,
    pub task_exit_code_off: u32,
    /// `task_struct.files`.
    pub task_files_off: u32,
    /// `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`.
    pub files_fdt_off: u32,
    pub fdt_max_fds_off: u32,
    pub fdt_fd_off: u32,
    /// `file.f_inode`, and its reference count (`f_ref` or `f_count`).
    pub file_inode_off: u32,
    pub file_ref_off: u32,
    /// 1 when the count is a `file_ref_t` (6.13 and later: the stored value is the
    /// count - 1, negative once released); 0 for a plain `atomic_long_t f_count`.
    pub file_ref_biased: u32,
    /// `inode.i_rdev`, `inode.i_ino`, `inode.i_sb`, `super_block.s_dev`.
    pub inode_rdev_off: u32,
    pub inode_ino_off: u32,
    pub inode_sb_off: u32,
    pub sb_dev_off: u32,
    /// The `nvidia-uvm` character major (from /proc/devices); 0 when absent.
    pub uvm_major: u32,
    /// 1 when `SIM_FILES` lists simulated-driver files to recognise.
    pub sim_files: u32,
    /// `sched_process_exit`'s `group_dead` field; 0 when this kernel's tracepoint
    /// has none (before 6.17): the probe then treats the leader's exit as the
    /// process's.
    pub exit_group_dead_off: u32,
    /// `sched_switch` fields.
    pub switch_prev_pid_off: u32,
    pub switch_prev_state_off: u32,
    pub switch_next_pid_off: u32,
    /// `sched_process_exec` fields (`filename` is a `__data_loc`).
    pub exec_filename_off: u32,
    pub exec_old_pid_off: u32,
    /// 1: report fork/exec/exit of every process, and track every process that
    /// has an NVIDIA device open (the long-running agent); 0: only tracked ones
    /// (`keling trace`).
    pub system_wide: u32,
    /// Offset of NVOS21's `status` for the driver in use (28, or 24 before 535).
    pub nvos21_status_off: u32,
    /// The driver's major version (layouts that changed: the EGM bit from 550).
    pub driver_major: u32,
    /// Detail events wake the agent once each time this many more bytes are waiting.
    pub wakeup_bytes: u32,
    /// 0: report every context switch and every plain NVIDIA call (`keling trace`).
    /// N: report instead at most one [`crate::ActiveEvent`] per tracked root per N
    /// ns (the long-running agent, which only needs to know a task is working).
    pub active_interval_ns: u32,
    /// `task_struct.se.sum_exec_runtime`: the thread's CPU time so far (u64, ns).
    pub task_runtime_off: u32,
    /// The driver-entry backend's view of the syscall behind a driver call, in the
    /// user registers the kernel saved (`struct pt_regs`): where the first
    /// argument (the fd) and the syscall number are, and ioctl's number. All 0
    /// when this kernel's BTF has no such registers (then the backend is not
    /// offered).
    pub regs_arg0_off: u32,
    pub regs_syscall_nr_off: u32,
    pub ioctl_syscall_nr: u32,
    /// Where the driver in use writes the status of the calls whose layout moved
    /// between branches (`nvidia::branch::Layout`): UVM_FREE's rmStatus,
    /// UVM_MAP_EXTERNAL_ALLOCATION's, UVM_ALLOC_SEMAPHORE_POOL's and the dma-buf
    /// export's (escape 217) `status`.
    pub uvm_free_status_off: u32,
    pub uvm_map_external_status_off: u32,
    pub uvm_semaphore_pool_status_off: u32,
    pub dmabuf_export_status_off: u32,
}

impl ProbeConfig {
    pub const ZERO: Self = Self {
        task_pid_off: 0,
        task_tgid_off: 0,
        task_exit_code_off: 0,
        task_files_off: 0,
        files_fdt_off: 0,
        fdt_max_fds_off: 0,
        fdt_fd_off: 0,
        file_inode_off: 0,
        file_ref_off: 0,
        file_ref_biased: 0,
        inode_rdev_off: 0,
        inode_ino_off: 0,
        inode_sb_off: 0,
        sb_dev_off: 0,
        uvm_major: 0,
        sim_files: 0,
        exit_group_dead_off: 0,
        switch_prev_pid_off: 0,
        switch_prev_state_off: 0,
        switch_next_pid_off: 0,
        exec_filename_off: 0,
        exec_old_pid_off: 0,
        system_wide: 0,
        nvos21_status_off: 28,
        driver_major: 0,
        wakeup_bytes: 0,
        active_interval_ns: 0,
        task_runtime_off: 0,
        regs_arg0_off: 0,
        regs_syscall_nr_off: 0,
        ioctl_syscall_nr: 0,
        uvm_free_status_off: 0,
        uvm_map_external_status_off: 0,
        uvm_semaphore_pool_status_off: 0,
        dmabuf_export_status_off: 0,
    };
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: #[repr(C)], u32 fields only, no padding (checked by the layout tests).
    unsafe impl aya::Pod for TrackedProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProbeConfig {}
    // SAFETY: as above (the GPU map types: integer fields, no padding).
    unsafe impl aya::Pod for crate::FdSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ProcFds {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::FileInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ClientInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ObjectKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::ObjectInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::MemInfo {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::SimFileKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::OrphanSweep {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::TotalKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for crate::Totals {}
}
