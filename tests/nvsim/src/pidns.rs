//! The pid a process has in another process's pid namespace, as the driver's
//! `osFindNsPid` answers it for GPU_GET_PIDS and (from 565) GPU_GET_PID_INFO:
//! the simulator knows every caller by its pid in the FUSE server's namespace
//! (the driver's `ProcID`, the initial namespace's) and answers a caller in a
//! container with the pids that container sees.
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

/// `NS_GET_PARENT` (`_IO(0xb7, 0x2)`, linux/nsfs.h): the parent pid namespace.
const NS_GET_PARENT: u64 = 0xb702;

/// `pid`'s pid in `caller`'s pid namespace, or `None` when `caller` cannot see
/// `pid` (it lives outside that namespace) or `pid` is gone. Both are pids as
/// this process sees them; a caller whose namespace cannot be read (gone, or
/// no `/proc`) is taken to share ours.
pub fn ns_pid(pid: u32, caller: u32) -> Option<u32> {
    let ns = |p: u32| fs::metadata(format!("/proc/{p}/ns/pid")).ok();
    let (Some(caller_ns), Some(own_ns)) = (ns(caller), fs::metadata("/proc/self/ns/pid").ok())
    else {
        return Some(pid);
    };
    if (caller_ns.dev(), caller_ns.ino()) == (own_ns.dev(), own_ns.ino()) {
        // The caller shares our namespace (no container): pids are ours.
        return Some(pid);
    }
    let levels = |p: u32| -> Option<Vec<u32>> {
        let status = fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
        line.split_whitespace().map(|n| n.parse().ok()).collect()
    };
    let level = levels(caller)?.len().checked_sub(1)?;
    let mine = levels(pid)?;
    let seen = *mine.get(level)?;
    // `pid` is `level` namespaces deep or deeper: is its namespace at that
    // depth the caller's? Climb from its own.
    let mut fd = fs::File::open(format!("/proc/{pid}/ns/pid")).ok()?;
    for _ in level + 1..mine.len() {
        // SAFETY: an ioctl on a descriptor we own; it returns a new one.
        let parent = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_PARENT as _) };
        if parent < 0 {
            return None;
        }
        // SAFETY: the kernel just gave us this descriptor.
        fd = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(parent) };
    }
    let at = fd.metadata().ok()?;
    ((at.dev(), at.ino()) == (caller_ns.dev(), caller_ns.ino())).then_some(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_our_own_namespace_a_pid_is_itself() {
        let me = std::process::id();
        assert_eq!(ns_pid(1, me), Some(1));
        assert_eq!(ns_pid(me, me), Some(me));
        // A caller that is gone is taken to share our namespace.
        assert_eq!(ns_pid(me, u32::MAX - 1), Some(me));
    }

    /// A process in a new pid namespace (`unshare --pid --fork`, root) is pid 1
    /// to itself and sees none of ours; we see it by its own pid. Skipped
    /// (said on stderr) without root or `unshare`.
    #[test]
    fn a_process_in_a_new_namespace_is_pid_1_there_and_sees_none_of_ours() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to make a pid namespace");
            return;
        }
        let Ok(mut unshare) = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "sleep", "30"])
            .spawn()
        else {
            eprintln!("skipped: no unshare");
            return;
        };
        let children = format!("/proc/{}/task/{}/children", unshare.id(), unshare.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let inner = loop {
            let found = fs::read_to_string(&children)
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse::<u32>().ok());
            if let Some(p) = found {
                break p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unshare's child never came"
            );
            std::thread::yield_now();
        };
        let me = std::process::id();
        let seen = (ns_pid(inner, inner), ns_pid(me, inner), ns_pid(inner, me));
        let _ = unshare.kill();
        let _ = unshare.wait();
        assert_eq!(seen, (Some(1), None, Some(inner)));
    }
}
