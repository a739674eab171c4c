//! The program table: every eBPF program Keling has, what it attaches to, and which
//! feature it serves. A program that cannot attach on this kernel stops the agent
//! only when its feature is required for what was asked; otherwise it is skipped
//! with a message saying what is lost.

use keling_common::maps::tail_call::{ioctl, work};

/// What a program serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Feature {
    /// fork, exec, exit: which processes exist and are tracked.
    ProcessLifecycle,
    /// Context switches of tracked threads.
    ContextSwitches,
    /// NVIDIA fds: opened, duplicated, closed, released.
    NvidiaFiles,
    /// NVIDIA ioctls: decoding and exact accounting.
    NvidiaIoctls,
    /// One way of duplicating or closing fds; without it that way is not followed.
    FdVariant,
}

impl Feature {
    /// What a user loses when a program of this feature is missing.
    pub fn lost(self) -> &'static str {
        match self {
            Feature::ProcessLifecycle => "process creation and exit are not seen",
            Feature::ContextSwitches => {
                "no context switches: per-thread CPU time and switch counts are missing, \
                 and the scheduler sees activity only from GPU calls"
            }
            Feature::NvidiaFiles => {
                "NVIDIA device files are not followed: the release of an open file does not \
                 free its clients in Keling's totals"
            }
            Feature::NvidiaIoctls => "NVIDIA ioctls are not decoded: no GPU memory figures",
            Feature::FdVariant => {
                "NVIDIA fds got or closed this way are learned only at their first ioctl \
                 (a release may be missed)"
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A raw tracepoint (its arguments are the kernel function's).
    Raw(&'static str),
    /// A classic tracepoint: (category, name).
    Tracepoint(&'static str, &'static str),
}

#[derive(Clone, Copy, Debug)]
pub struct Program {
    /// The program's symbol in the eBPF object.
    pub name: &'static str,
    pub attach: Attach,
    pub feature: Feature,
}

const fn tp(name: &'static str, category: &'static str, feature: Feature) -> Program {
    Program {
        name,
        attach: Attach::Tracepoint(category, name),
        feature,
    }
}

/// Every attached program. (The work programs are reached by tail call only.)
pub const PROGRAMS: &[Program] = &[
    Program {
        name: "sched_process_fork",
        attach: Attach::Raw("sched_process_fork"),
        feature: Feature::ProcessLifecycle,
    },
    tp("sched_process_exec", "sched", Feature::ProcessLifecycle),
    tp("sched_process_exit", "sched", Feature::ProcessLifecycle),
    tp("sched_switch", "sched", Feature::ContextSwitches),
    tp("sys_exit_openat", "syscalls", Feature::NvidiaFiles),
    tp("sys_enter_close", "syscalls", Feature::NvidiaFiles),
    tp("sys_exit_open", "syscalls", Feature::FdVariant),
    tp("sys_exit_openat2", "syscalls", Feature::FdVariant),
    tp("sys_enter_close_range", "syscalls", Feature::FdVariant),
    tp("sys_exit_dup", "syscalls", Feature::FdVariant),
    tp("sys_exit_dup2", "syscalls", Feature::FdVariant),
    tp("sys_exit_dup3", "syscalls", Feature::FdVariant),
    tp("sys_enter_fcntl", "syscalls", Feature::FdVariant),
    tp("sys_exit_fcntl", "syscalls", Feature::FdVariant),
    tp("sys_enter_recvmsg", "syscalls", Feature::FdVariant),
    tp("sys_exit_recvmsg", "syscalls", Feature::FdVariant),
    tp("sys_exit_pidfd_getfd", "syscalls", Feature::FdVariant),
    tp("sys_enter_ioctl", "syscalls", Feature::NvidiaIoctls),
    tp("sys_exit_ioctl", "syscalls", Feature::NvidiaIoctls),
];

/// The programs that do deferred accounting work (file releases, client
/// teardowns), reached by tail call from every program that can queue some, by
/// their slot in the program array (the work kind).
pub const WORK_PROGRAMS: &[(u32, &str)] = &[
    (work::RELEASE_FILE, "keling_release_file"),
    (work::TEARDOWN_SHARED, "keling_teardown_shared"),
    (work::TEARDOWN_CONTRIBUTORS, "keling_teardown_contributors"),
    (work::CLOSE_RANGE, "keling_close_range"),
    (work::ORPHAN, "keling_orphan"),
    (work::SWEEP, "keling_sweep"),
];
/// The program array.
pub const WORK_PROG_MAP: &str = work::MAP;
/// The handlers of the NVIDIA calls that change memory, reached by tail call from
/// `sys_exit_ioctl` by their slot.
pub const IOCTL_PROGRAMS: &[(u32, &str)] = &[
    (ioctl::ALLOC, "keling_ioctl_alloc"),
    (ioctl::FREE, "keling_ioctl_free"),
    (ioctl::CONTROL, "keling_ioctl_control"),
    (ioctl::DUP, "keling_ioctl_dup"),
    (ioctl::BATCH_EXPORT, "keling_ioctl_batch_export"),
    (ioctl::BATCH_IMPORT, "keling_ioctl_batch_import"),
];
/// Their program array.
pub const IOCTL_PROG_MAP: &str = ioctl::MAP;

#[cfg(test)]
mod tests {
    use super::*;

    /// Each program array's slots: distinct, in range, never 0 (0 means "no
    /// handler" to the probes), each holding a program of the object's.
    #[test]
    fn every_tail_call_slot_holds_one_program() {
        for table in [WORK_PROGRAMS, IOCTL_PROGRAMS] {
            let mut slots: Vec<u32> = table.iter().map(|&(s, _)| s).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), table.len(), "{table:?}");
            assert!(
                slots
                    .iter()
                    .all(|&s| s > 0 && s < keling_common::maps::tail_call::SLOTS)
            );
        }
        // The embedded object defines every program. Only a build that said it had
        // none (cfg keling_no_ebpf: build.rs found no nightly or bpf-linker) may lack it.
        let Some(obj) = crate::bpf::embedded_object() else {
            if cfg!(keling_no_ebpf) {
                eprintln!("skipping the object check: this build has no eBPF object");
                return;
            }
            panic!("build.rs embedded an empty eBPF object without cfg keling_no_ebpf");
        };
        let obj = aya_obj::Object::parse(obj).expect("the embedded eBPF object parses");
        for (_, name) in WORK_PROGRAMS.iter().chain(IOCTL_PROGRAMS) {
            assert!(
                obj.programs.contains_key(*name),
                "{name} is not in the object"
            );
        }
    }

    #[test]
    fn names_are_unique_and_every_feature_says_what_is_lost() {
        let mut names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PROGRAMS.len());
        for p in PROGRAMS {
            assert!(!p.feature.lost().is_empty());
        }
    }
}
