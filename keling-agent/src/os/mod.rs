//! Everything the agent asks of the operating system outside eBPF: `/proc`
//! (only [`proc`] parses it), mount points, spawning held children, clocks,
//! privileges, resource limits, pidfds.
//!
//! Nothing here knows about GPUs, the scheduler or the trace; the other modules
//! call in, never the other way round.
use std::{
    fs,
    os::fd::{FromRawFd, OwnedFd},
};

use anyhow::{Context, bail};
use tokio::io::unix::AsyncFd;

pub mod mounts;
pub mod proc;
pub mod spawn;

/// `CLOCK_MONOTONIC` in ns: the clock behind the kernel's `bpf_ktime_get_ns`, so
/// agent times and event times can be subtracted.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Fails with a message that says what to do when the agent cannot load eBPF.
pub fn check_privileges() -> anyhow::Result<()> {
    // CAP_BPF is 39, CAP_PERFMON 38, CAP_SYS_ADMIN 21 (linux/capability.h).
    let status = fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let eff = proc::parse_cap_eff(&status);
    let has = |cap: u32| eff & (1 << cap) != 0;
    if has(21) || (has(39) && has(38)) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    bail!(
        "Keling loads eBPF programs and needs root (or CAP_BPF + CAP_PERFMON); running as uid {euid} \
         with effective capabilities {eff:#x}. Run it with sudo, or `cargo xtask run`, which does."
    )
}

/// Registers an fd-owning value with the tokio reactor.
///
/// Only for types that own their fd for their whole life and always return the same
/// one (`OwnedFd`, aya's `RingBuf`): that is what `AsyncFd::register` requires.
pub fn async_fd<T: std::os::fd::AsRawFd>(inner: T) -> anyhow::Result<AsyncFd<T>> {
    // SAFETY: see above; every caller passes such an owner.
    unsafe { AsyncFd::register(inner) }.map_err(|e| anyhow::anyhow!("register fd with tokio: {e}"))
}

/// Raises RLIMIT_MEMLOCK: kernels before 5.11 charge BPF maps to it.
pub fn raise_memlock() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit struct; failure is reported, not fatal (5.11+ ignores it).
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A pidfd for `pid`: signals sent through it can never reach a process that
/// reused the pid.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reaps our child `pid` if it has exited, without blocking.
pub fn try_wait(pid: u32) -> Option<u32> {
    let mut status = 0;
    // SAFETY: our own child; WNOHANG never blocks.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    (r == pid as i32).then_some(status as u32)
}

/// Reaps any child that has exited, without blocking: `(pid, wait status)`.
pub fn reap_any() -> Option<(u32, u32)> {
    let mut status = 0;
    // SAFETY: reaping our own children without blocking.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid as u32, status as u32))
}
