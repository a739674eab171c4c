//! A thread's scheduling attributes: `sched_getattr(2)` and `sched_setattr(2)`,
//! which libc does not wrap.
use std::io;

pub const SCHED_OTHER: u32 = 0;
pub const SCHED_FIFO: u32 = 1;
pub const SCHED_RR: u32 = 2;
pub const SCHED_BATCH: u32 = 3;
pub const SCHED_IDLE: u32 = 5;
pub const SCHED_DEADLINE: u32 = 6;
/// Children of the thread start in SCHED_OTHER at nice 0 (or their nice, if
/// not negative) instead of inheriting its class.
pub const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// `struct sched_attr` (linux/sched/types.h), its first published size
/// (`SCHED_ATTR_SIZE_VER1`, 56 bytes, with the utilization clamps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedAttr {
    pub size: u32,
    pub policy: u32,
    pub flags: u64,
    /// For SCHED_OTHER, SCHED_BATCH and SCHED_IDLE (the kernel reports 0 for the
    /// other classes; `/proc/TID/stat` still has it).
    pub nice: i32,
    /// SCHED_FIFO and SCHED_RR: 1-99.
    pub priority: u32,
    /// SCHED_DEADLINE's runtime; for the fair classes, the thread's time slice (ns).
    pub runtime: u64,
    pub deadline: u64,
    pub period: u64,
    pub util_min: u32,
    pub util_max: u32,
}

const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;

impl SchedAttr {
    /// A request for `policy` (fields the caller does not set are 0).
    pub fn new(policy: u32) -> Self {
        Self {
            size: SIZE,
            policy,
            ..Self::default()
        }
    }
}

/// The attributes of thread `tid` (0: the calling thread).
pub fn get(tid: u32) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is a valid, writable sched_attr of SIZE bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid as libc::pid_t,
            &raw mut attr,
            SIZE,
            0u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Sets the attributes of thread `tid` (0: the calling thread).
pub fn set(tid: u32, attr: &SchedAttr) -> io::Result<()> {
    let mut attr = *attr;
    attr.size = SIZE;
    // SAFETY: `attr` is a valid sched_attr whose size field says SIZE.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid as libc::pid_t,
            &raw const attr,
            0u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_threads_class() {
        assert_eq!(SIZE, 56);
        let a = get(0).unwrap();
        assert!(a.size == 0 || a.size <= SIZE, "{a:?}");
        // Whatever runs the tests, it is one of the known classes.
        assert!(
            [
                SCHED_OTHER,
                SCHED_FIFO,
                SCHED_RR,
                SCHED_BATCH,
                SCHED_IDLE,
                SCHED_DEADLINE
            ]
            .contains(&a.policy),
            "{a:?}"
        );
    }

    #[test]
    fn setting_the_same_fair_class_needs_no_privilege() {
        // A thread of our own, in SCHED_OTHER, set to SCHED_BATCH and back at
        // its nice: allowed to anyone (no higher priority is asked for).
        std::thread::spawn(|| {
            let before = get(0).unwrap();
            if before.policy != SCHED_OTHER {
                return; // run under another class: nothing to check here
            }
            let mut batch = SchedAttr::new(SCHED_BATCH);
            batch.nice = before.nice;
            set(0, &batch).unwrap();
            assert_eq!(get(0).unwrap().policy, SCHED_BATCH);
            let mut back = SchedAttr::new(SCHED_OTHER);
            back.nice = before.nice;
            set(0, &back).unwrap();
            let after = get(0).unwrap();
            assert_eq!((after.policy, after.nice), (SCHED_OTHER, before.nice));
        })
        .join()
        .unwrap();
    }
}
