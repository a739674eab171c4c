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
pub mod maps;

pub use event::*;
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
    }

    #[test]
    fn map_value_layouts() {
        no_padding!(TrackedProcess, 8, [root_pid: u32, flags: u32]);
        no_padding!(ProbeConfig, 40, [task_pid_off: u32, task_tgid_off: u32,
            task_exit_code_off: u32, exit_group_dead_off: u32, switch_prev_pid_off: u32,
            switch_prev_state_off: u32, switch_next_pid_off: u32, exec_filename_off: u32,
            exec_old_pid_off: u32, system_wide: u32]);
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
