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

pub mod files;
pub mod lock;
pub mod mounts;
pub mod pidfd;
pub mod proc;
pub mod sched_attr;
pub mod spawn;
pub mod users;

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec pointer; the clocks passed exist on every kernel we
    // run on.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC` in ns: the clock behind the kernel's `bpf_ktime_get_ns`, so
/// agent times and event times can be subtracted.
/// Makes every CPU this process may run on switch tasks a few times: a
/// short-lived thread pinned to each sleeps 1 ms there, three times. The probes do their deferred work
/// (a released file's teardown, the orphan sweep) at a CPU's next context
/// switch, so work queued on an idle CPU waits for it; this is how a reader that
/// wants final figures gets that work done now.
pub fn switch_on_every_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size is the set's own; pid 0 is this thread.
    let ok =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) }
            == 0;
    if !ok {
        return;
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: cpu is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &allowed) })
        .collect();
    let threads: Vec<_> = cpus
        .into_iter()
        .filter_map(|cpu| {
            std::thread::Builder::new()
                .name(format!("keling-cpu{cpu}"))
                .spawn(move || {
                    // SAFETY: a zeroed set, then one CPU below CPU_SETSIZE in it.
                    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                    // SAFETY: as above.
                    unsafe { libc::CPU_SET(cpu, &mut one) };
                    // SAFETY: the set's own size; pid 0 is this new thread.
                    let pinned = unsafe {
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
                    } == 0;
                    if pinned {
                        for _ in 0..3 {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                })
                .ok()
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_BOOTTIME` in ns: the monotonic clock plus time spent suspended (what
/// process start times in `/proc` count from).
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// The CPU time the calling thread has had so far, in ns. In a VM whose kernel
/// accounts steal (paravirt time accounting), time the hypervisor took from the
/// thread's vCPU is not in it: wall time the thread spent neither on the CPU nor
/// switched out (no context switch) is time its vCPU did not run.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
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

/// Raises the soft limit on open files to the hard limit (a daemon serving many
/// clients needs more than the usual 1024). Returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        let wanted = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
            return wanted.rlim_cur;
        }
    }
    limit.rlim_cur
}

/// Puts the calling thread in the real-time class (SCHED_FIFO at `priority`,
/// 1-99), with SCHED_RESET_ON_FORK so that nothing it starts inherits it. Fails
/// without CAP_SYS_NICE, or where the cgroup gives real-time threads no time.
pub fn set_thread_realtime(priority: u8) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: i32::from(priority.clamp(1, 99)),
    };
    // SAFETY: sched_setscheduler(0, ...) acts on the calling thread; `param` is valid.
    let r = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh fds we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes an fd non-blocking.
pub fn set_nonblocking(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on an fd the caller owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
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
