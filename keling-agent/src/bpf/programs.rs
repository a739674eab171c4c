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

/// The bench's floor (`keling floor`, for `cargo xtask bench`): two empty
/// programs on the ioctl tracepoints, attached by nothing else.
pub const FLOOR_PROGRAMS: &[Program] = &[
    Program {
        name: "floor_enter_ioctl",
        attach: Attach::Tracepoint("syscalls", "sys_enter_ioctl"),
        feature: Feature::NvidiaIoctls,
    },
    Program {
        name: "floor_exit_ioctl",
        attach: Attach::Tracepoint("syscalls", "sys_exit_ioctl"),
        feature: Feature::NvidiaIoctls,
    },
];

/// The bench's other floor (`keling floor --raw-syscalls`): two empty programs on
/// the raw tracepoints every syscall passes, attached by nothing else.
pub const FLOOR_RAW_PROGRAMS: &[Program] = &[
    Program {
        name: "floor_raw_sys_enter",
        attach: Attach::Raw("sys_enter"),
        feature: Feature::NvidiaIoctls,
    },
    Program {
        name: "floor_raw_sys_exit",
        attach: Attach::Raw("sys_exit"),
        feature: Feature::NvidiaIoctls,
    },
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
/// The program array, and its kprobe-type twin's.
pub const WORK_PROG_MAP: &str = work::MAP;
pub const WORK_PROG_MAP_KPROBE: &str = work::MAP_KPROBE;
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
/// Their program array, and its kprobe-type twin's.
pub const IOCTL_PROG_MAP: &str = ioctl::MAP;
pub const IOCTL_PROG_MAP_KPROBE: &str = ioctl::MAP_KPROBE;

/// Where NVIDIA ioctls are seen (see the probes' nvidia/backends.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoctlBackend {
    /// `sys_enter_ioctl` and `sys_exit_ioctl` (in [`PROGRAMS`]).
    Tracepoints,
    /// A kprobe and a kretprobe on each NVIDIA module's ioctl entry, in their
    /// place: other ioctls pay nothing.
    DriverEntry,
    /// Tests only (`KELING_TEST_IOCTL_RETURN`): entries at `sys_enter_ioctl`,
    /// exits through the driver-entry backend's exit path (its kprobe-type
    /// handler and work programs) from a uretprobe in the test workload, for a
    /// machine where kprobes cannot attach.
    TestReturnUprobe,
}

impl IoctlBackend {
    /// Its name, as `--ioctl-backend` and the trace summary spell it.
    pub fn name(self) -> &'static str {
        match self {
            IoctlBackend::Tracepoints => "tracepoints",
            IoctlBackend::DriverEntry => "driver-entry",
            IoctlBackend::TestReturnUprobe => "test-return-uprobe",
        }
    }

    /// The ioctl tracepoint programs it stands in for (not attached).
    pub fn replaces(self) -> &'static [&'static str] {
        match self {
            IoctlBackend::Tracepoints => &[],
            IoctlBackend::DriverEntry => IOCTL_TRACEPOINTS,
            IoctlBackend::TestReturnUprobe => &["sys_exit_ioctl"],
        }
    }
}

/// The tracepoint programs the driver-entry backend replaces.
pub const IOCTL_TRACEPOINTS: &[&str] = &["sys_enter_ioctl", "sys_exit_ioctl"];
/// The driver-entry backend's programs: at each module's ioctl entry, and at its
/// return.
pub const DRIVER_ENTRY: &str = "keling_driver_ioctl_entry";
pub const DRIVER_RETURN: &str = "keling_driver_ioctl_return";
/// [`IoctlBackend::TestReturnUprobe`]'s exit program.
pub const TEST_RETURN: &str = "keling_test_ioctl_return";
/// Each NVIDIA module (as /proc/kallsyms brackets it) and the names its
/// `unlocked_ioctl` file operation has had, newest first: nvidia.ko's
/// `nvidia_unlocked_ioctl` (nv.c; `nvidia_frontend_unlocked_ioctl` in drivers
/// that had the nv-frontend layer), nvidia-uvm.ko's `uvm_unlocked_ioctl_entry`
/// (uvm.c). Both modules are needed: UVM calls are part of the accounting.
pub const DRIVER_ENTRY_SYMBOLS: &[(&str, &[&str])] = &[
    (
        "nvidia",
        &["nvidia_unlocked_ioctl", "nvidia_frontend_unlocked_ioctl"],
    ),
    ("nvidia_uvm", &["uvm_unlocked_ioctl_entry"]),
];

/// Finds each module's ioctl entry in the text of /proc/kallsyms (`ADDR TYPE NAME
/// [MODULE]` lines): the symbols to attach to, or the first module whose entry is
/// missing.
pub fn driver_entry_symbols(kallsyms: &str) -> Result<Vec<&'static str>, &'static str> {
    let mut found: Vec<Option<&'static str>> = vec![None; DRIVER_ENTRY_SYMBOLS.len()];
    for line in kallsyms.lines() {
        let mut words = line.split_whitespace().skip(2);
        let (Some(name), Some(module)) = (words.next(), words.next()) else {
            continue;
        };
        let module = module.trim_start_matches('[').trim_end_matches(']');
        for (i, (m, names)) in DRIVER_ENTRY_SYMBOLS.iter().enumerate() {
            if *m != module {
                continue;
            }
            if let Some(rank) = names.iter().position(|n| *n == name)
                && found[i].is_none_or(|f| names.iter().position(|n| *n == f) > Some(rank))
            {
                found[i] = Some(names[rank]);
            }
        }
    }
    found
        .iter()
        .zip(DRIVER_ENTRY_SYMBOLS)
        .map(|(f, (module, _))| f.ok_or(*module))
        .collect()
}

/// The kprobe-type twin of a tail-called program.
pub fn kprobe_twin(name: &str) -> String {
    format!("{name}{}", keling_common::maps::tail_call::KPROBE_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_entry_symbols_come_from_the_modules_kallsyms() {
        let both = "ffffffffc0a01230 t nvidia_frontend_unlocked_ioctl\t[nvidia]\n\
                    ffffffffc0a01000 t nvidia_unlocked_ioctl\t[nvidia]\n\
                    ffffffff816f6ee0 t do_vfs_ioctl\n\
                    ffffffffc0b00000 t uvm_unlocked_ioctl_entry.part.0\t[nvidia_uvm]\n\
                    ffffffffc0b00100 t uvm_unlocked_ioctl_entry\t[nvidia_uvm]\n";
        // The newest name wins whatever the order; a .part clone is not the entry.
        assert_eq!(
            driver_entry_symbols(both),
            Ok(vec!["nvidia_unlocked_ioctl", "uvm_unlocked_ioctl_entry"])
        );
        let old = "0 t nvidia_frontend_unlocked_ioctl [nvidia]\n\
                   0 t uvm_unlocked_ioctl_entry [nvidia_uvm]\n";
        assert_eq!(
            driver_entry_symbols(old),
            Ok(vec![
                "nvidia_frontend_unlocked_ioctl",
                "uvm_unlocked_ioctl_entry"
            ])
        );
        // UVM not loaded (it loads on a first CUDA call), or no driver at all; a
        // symbol of the right name in another module or in the kernel is not it.
        assert_eq!(
            driver_entry_symbols("0 t nvidia_unlocked_ioctl [nvidia]\n"),
            Err("nvidia_uvm")
        );
        assert_eq!(
            driver_entry_symbols(
                "0 t nvidia_unlocked_ioctl\n0 t uvm_unlocked_ioctl_entry [other]\n"
            ),
            Err("nvidia")
        );
        assert_eq!(driver_entry_symbols(""), Err("nvidia"));
    }

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
            for name in [name.to_string(), kprobe_twin(name)] {
                assert!(
                    obj.programs.contains_key(&name),
                    "{name} is not in the object"
                );
            }
        }
        for name in [DRIVER_ENTRY, DRIVER_RETURN, TEST_RETURN]
            .into_iter()
            .chain(IOCTL_TRACEPOINTS.iter().copied())
        {
            assert!(
                obj.programs.contains_key(name),
                "{name} is not in the object"
            );
        }
        for map in [WORK_PROG_MAP_KPROBE, IOCTL_PROG_MAP_KPROBE] {
            assert!(obj.maps.contains_key(map), "{map} is not in the object");
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
