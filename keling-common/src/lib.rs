//! The kernel/user contract of Keling, in one place.
//!
//! Everything that crosses the boundary between `keling-ebpf` (kernel) and
//! `keling-agent` (user) is defined here: the ring-buffer event layouts, the keys and
//! values of the shared maps, and the load-time configuration the agent writes into
//! the programs' globals. Both sides compile this crate, so a layout can only change
//! in one place. Likewise [`lines`]: the lines the agent prints that the bench and
//! the tests read.
//!
//! Rules every type here follows:
//! - `#[repr(C)]`, fields ordered so that there is no implicit padding (a test checks
//!   each size against the sum of its fields), so the bytes the kernel writes are the
//!   bytes the agent reads and the `aya::Pod` impls are sound.
//! - Units in names: `_ns` is nanoseconds of `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`).
//! - "pid" means what the kernel calls tgid (a process); "tid" a thread.
#![no_std]

#[macro_use]
mod codes;
pub mod event;
pub mod gpu;
pub mod lines;
pub mod maps;
pub mod nvidia;

pub use event::*;
pub use gpu::*;
pub use maps::*;

#[cfg(test)]
mod layout_tests {
    use core::mem::{align_of, offset_of, size_of};

    use super::*;

    /// Each struct's size equals the sum of its fields (no implicit padding), and its
    /// alignment is at most 8 (ring-buffer records are 8-byte aligned).
    macro_rules! no_padding {
        ($t:ty, $size:expr, [$($f:ident: $ft:ty),* $(,)?]) => {{
            let fields = 0 $(+ size_of::<$ft>())*;
            assert_eq!(size_of::<$t>(), fields, "{} has implicit padding", stringify!($t));
            assert_eq!(size_of::<$t>(), $size, "{} changed size", stringify!($t));
            assert!(align_of::<$t>() <= 8);
            let mut last = 0usize;
            $(
                let off = offset_of!($t, $f);
                assert!(off >= last, "{}.{} out of order", stringify!($t), stringify!($f));
                last = off + size_of::<$ft>();
            )*
            assert_eq!(last, size_of::<$t>());
        }};
    }

    #[test]
    fn event_layouts() {
        no_padding!(EventHeader, 24, [kind: u32, cpu: u32, ts_ns: u64, pid: u32, tid: u32]);
        no_padding!(ForkEvent, 56, [header: EventHeader, child_pid: u32, child_tid: u32,
            tracked: u32, _reserved: u32, comm: [u8; COMM_LEN]]);
        no_padding!(ExecEvent, 176, [header: EventHeader, old_tid: u32, tracked: u32,
            comm: [u8; COMM_LEN], filename: [u8; FILENAME_LEN]]);
        no_padding!(ExitEvent, 56, [header: EventHeader, exit_status: u32, group_dead: u32,
            tracked: u32, _reserved: u32, comm: [u8; COMM_LEN]]);
        no_padding!(SwitchEvent, 56, [header: EventHeader, prev_tid: u32, prev_pid: u32,
            next_tid: u32, next_pid: u32, prev_state: u64, prev_runtime_ns: u64]);
        no_padding!(ActiveEvent, 32, [header: EventHeader, root_pid: u32, cause: u32]);
        no_padding!(GpuOpenEvent, 48, [header: EventHeader, fd: i32, device: u32,
            file_id: u64, how: u32, src_fd: i32]);
        no_padding!(GpuCloseEvent, 48, [header: EventHeader, fd: i32, device: u32,
            file_id: u64, released: u32, _reserved: u32]);
        no_padding!(GpuAllocEvent, 64, [header: EventHeader, client: u32, parent: u32,
            handle: u32, class: u32, mem_kind: u32, gpu: u32, escape: u32, via_xfer: u32,
            bytes: u64]);
        no_padding!(GpuFreeEvent, 64, [header: EventHeader, client: u32, handle: u32,
            class: u32, kind: u32, gpu: u32, mem_kind: u32, freed_pid: u32, escape: u32,
            bytes: u64]);
        no_padding!(GpuObjectEvent, 48, [header: EventHeader, client: u32, parent: u32,
            handle: u32, class: u32, kind: u32, gpu: u32]);
        no_padding!(GpuTeardownEvent, 80, [header: EventHeader, client: u32, reason: u32,
            owner_pid: u32, gpu: u32, device: u32, sub: u32, objects: u32, _reserved: u32,
            bytes: u64, host_bytes: u64, egm_bytes: u64]);
        no_padding!(GpuRefEvent, 64, [header: EventHeader, client: u32, parent: u32,
            handle: u32, how: u32, src_client: u32, src_handle: u32, gpu: u32, mem_kind: u32,
            bytes: u64]);
        no_padding!(GpuExportEvent, 56, [header: EventHeader, client: u32, handle: u32,
            file_id: u64, position: u32, gpu: u32, bytes: u64]);
        no_padding!(GpuChargeEvent, 56, [header: EventHeader, from_pid: u32, to_pid: u32,
            gpu: u32, mem_kind: u32, client: u32, handle: u32, bytes: u64]);
        no_padding!(GpuIoctlEvent, 88, [header: EventHeader, fd: i32, device: u32,
            escape: u32, cmd: u32, control_cmd: u32, class: u32, gpu: u32, _reserved: u32,
            status: u32, outcome: u32, undecoded: u32, via_xfer: u32, ret: i64,
            requested_bytes: u64]);
    }

    #[test]
    fn map_value_layouts() {
        no_padding!(TrackedProcess, 8, [root_pid: u32, flags: u32]);
        no_padding!(ProbeConfig, 140, [task_pid_off: u32, task_tgid_off: u32,
            task_exit_code_off: u32, task_files_off: u32, files_fdt_off: u32,
            fdt_max_fds_off: u32, fdt_fd_off: u32, file_inode_off: u32, file_ref_off: u32,
            file_ref_biased: u32, inode_rdev_off: u32, inode_ino_off: u32, inode_sb_off: u32,
            sb_dev_off: u32, uvm_major: u32, sim_files: u32, exit_group_dead_off: u32,
            switch_prev_pid_off: u32, switch_prev_state_off: u32, switch_next_pid_off: u32,
            exec_filename_off: u32, exec_old_pid_off: u32, system_wide: u32,
            nvos21_status_off: u32, driver_major: u32, wakeup_bytes: u32,
            active_interval_ns: u32, task_runtime_off: u32, regs_arg0_off: u32,
            regs_syscall_nr_off: u32, ioctl_syscall_nr: u32, uvm_free_status_off: u32,
            uvm_map_external_status_off: u32, uvm_semaphore_pool_status_off: u32,
            dmabuf_export_status_off: u32]);
        no_padding!(FdSlot, 16, [fd: i32, device: u32, file_id: u64]);
        assert_eq!(size_of::<ProcFds>(), 16 * FD_SLOTS);
        no_padding!(FileInfo, 16 + 4 * FILE_CLIENTS + 8 * FILE_EXPORTS, [device: u32,
            opener_pid: u32, clients: [u32; FILE_CLIENTS], exports: [u64; FILE_EXPORTS],
            gen_: u64]);
        no_padding!(Contributor, 48, [pid: u32, gpu: u32, device: u32, sub: u32,
            objects: u32, _reserved: u32, bytes: u64, host_bytes: u64, egm_bytes: u64]);
        no_padding!(ClientInfo, 24 + 48 * CLIENT_CONTRIBUTORS, [
            file_id: u64, creator_pid: u32, gen_: u32, shared_head: u32, file_gen: u32,
            contributors: [Contributor; CLIENT_CONTRIBUTORS]]);
        no_padding!(ObjectKey, 8, [client: u32, handle: u32]);
        no_padding!(ObjectInfo, 64, [class: u32, kind: u32, parent: u32, device: u32,
            sub: u32, gpu: u32, owner_pid: u32, client_gen: u32, mem_id: u64, bytes: u64,
            mem_kind: u32, in_shared_list: u32, shared_prev: u32, shared_next: u32]);
        no_padding!(MemHandle, 24, [client: u32, handle: u32, device: u32, sub: u32,
            pid: u32, seq: u32]);
        no_padding!(MemInfo, 32 + 24 * MEM_HANDLES, [bytes: u64, kind: u32, gpu: u32,
            export_refs: u32, charged_pid: u32, charged: u32, next_seq: u32,
            handles: [MemHandle; MEM_HANDLES]]);
        no_padding!(TotalKey, 8, [pid: u32, gpu: u32]);
        no_padding!(Totals, 64, [bytes: u64, peak_bytes: u64, host_bytes: u64,
            peak_host_bytes: u64, egm_bytes: u64, driver_bytes: u64, allocs: u64,
            frees: u64]);
        no_padding!(SimFileKey, 16, [dev: u32, _reserved: u32, ino: u64]);
        no_padding!(OrphanSlot, 16, [file: u64, inode: u64]);
        no_padding!(OrphanSweep, 24, [checked: u64, occupied: u64, backlog: u64]);
    }

    #[test]
    fn kinds_round_trip() {
        for k in [
            EventKind::Fork,
            EventKind::Exec,
            EventKind::Exit,
            EventKind::Switch,
        ] {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
        }
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(202), None);
        assert_eq!(EventKind::from_u32(4), None);
    }
}
