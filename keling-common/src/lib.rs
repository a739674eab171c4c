//! The kernel/user contract of Keling, in one place.
//!
//! Everything that crosses the boundary between `keling-ebpf` (kernel) and
//! `keling-agent` (user) is defined here: the ring-buffer event layouts, the keys and
//! values of the shared maps, and the load-time configuration the agent writes into
//! the programs' globals. Both sides compile this crate, so a layout can only change
//! in one place.
//!
//! Rules every type here follows:
//! - `#[repr(C)]`, fields ordered so that there is no implicit padding (a test checks
//!   each size against the sum of its fields), so the bytes the kernel writes are the
//!   bytes the agent reads and the `aya::Pod` impls are sound.
//! - Units in names: `_ns` is nanoseconds of `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`).
//! - "pid" means what the kernel calls tgid (a process); "tid" a thread.
#![no_std]

pub mod event;
pub mod gpu;
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
        no_padding!(SwitchEvent, 48, [header: EventHeader, prev_tid: u32, prev_pid: u32,
            next_tid: u32, next_pid: u32, prev_state: u64]);
        no_padding!(GpuFileEvent, 48, [header: EventHeader, fd: i32, device: u32,
            file_id: u64, released: u32, arg: u32]);
        no_padding!(GpuEvent, 104, [header: EventHeader, client: u32, parent: u32,
            handle: u32, class: u32, kind: u32, gpu: u32, bytes: u64, host_bytes: u64,
            owner_pid: u32, escape: u32, cmd: u32, control_cmd: u32, status: u32, fd: i32,
            ret: i64, reason: u32, via_xfer: u32]);
    }

    #[test]
    fn map_value_layouts() {
        no_padding!(TrackedProcess, 8, [root_pid: u32, flags: u32]);
        no_padding!(ProbeConfig, 120, [task_pid_off: u32, task_tgid_off: u32,
            task_exit_code_off: u32, exit_group_dead_off: u32, switch_prev_pid_off: u32,
            switch_prev_state_off: u32, switch_next_pid_off: u32, exec_filename_off: u32,
            exec_old_pid_off: u32, system_wide: u32, nvos21_status_off: u32,
            dev_prefix_len: u32, wakeup_bytes: u32, _reserved: u32,
            dev_prefix: [u8; DEV_PREFIX_LEN]]);
        no_padding!(FdSlot, 24, [fd: i32, device: u32, file_id: u64, cloexec: u32,
            _reserved: u32]);
        assert_eq!(size_of::<ProcFds>(), 24 * FD_SLOTS);
        no_padding!(FileInfo, 16 + 4 * FILE_CLIENTS, [refs: u32, device: u32,
            opener_pid: u32, _reserved: u32, clients: [u32; FILE_CLIENTS]]);
        no_padding!(Contributor, 32, [pid: u32, gpu: u32, device: u32, objects: u32,
            bytes: u64, host_bytes: u64]);
        no_padding!(ClientInfo, 16 + 32 * CLIENT_CONTRIBUTORS, [file_id: u64,
            creator_pid: u32, gen_: u32, contributors: [Contributor; CLIENT_CONTRIBUTORS]]);
        no_padding!(ObjectKey, 8, [client: u32, handle: u32]);
        no_padding!(ObjectInfo, 40, [class: u32, kind: u32, parent: u32, device: u32,
            gpu: u32, owner_pid: u32, client_gen: u32, _reserved: u32, bytes: u64]);
        no_padding!(TotalKey, 8, [pid: u32, gpu: u32]);
        no_padding!(Totals, 48, [bytes: u64, peak_bytes: u64, host_bytes: u64,
            peak_host_bytes: u64, allocs: u64, frees: u64]);
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
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(4), None);
    }
}
