//! Fail-safe: a small process that outlives the agent and thaws everything Keling
//! froze the moment the agent is gone, however it ended (SIGKILL included).
//!
//! The agent forks it first thing, before loading eBPF or starting threads; it
//! holds the read end of a pipe whose write end only the agent has. When the agent
//! dies the kernel closes that end, the read returns, and the supervisor runs
//! [`super::cgroup::thaw_all`] and exits. It closes every other fd it inherited, so
//! it never keeps the agent's probes or sockets alive.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::Context;

/// The agent's end of the link; dropping it lets the supervisor thaw and exit.
pub struct Supervisor {
    link: Option<OwnedFd>,
    pid: i32,
}

/// Forks the supervisor. Call before any thread exists.
pub fn spawn() -> anyhow::Result<Supervisor> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe for the supervisor");
    }
    // SAFETY: fresh fds from pipe2.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is single-threaded here (documented precondition), so the
    // child may run ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork the supervisor");
    }
    if pid == 0 {
        supervise(read_end.as_raw_fd());
    }
    drop(read_end);
    Ok(Supervisor {
        link: Some(write_end),
        pid,
    })
}

/// The supervisor's whole life.
fn supervise(link: i32) -> ! {
    // SAFETY: plain syscalls on our own process.
    unsafe {
        // Out of the agent's session: a Ctrl-C for the agent is not for us.
        libc::setsid();
        // Keep the link as fd 3 and stderr; drop everything else (probe, map and
        // socket fds must not outlive the agent through us).
        libc::dup2(link, 3);
        libc::close_range(4, u32::MAX, 0);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        libc::dup2(null, 0);
        libc::dup2(null, 1);
        if null > 3 {
            libc::close(null);
        }
        libc::prctl(libc::PR_SET_NAME, c"keling-guard".as_ptr());
    }
    let mut byte = 0u8;
    loop {
        // SAFETY: reading into a valid one-byte buffer.
        let n = unsafe { libc::read(3, (&raw mut byte).cast(), 1) };
        if n == 0 || (n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            break;
        }
    }
    let n = super::cgroup::thaw_all();
    if n > 0 {
        eprintln!("keling-guard: the agent is gone; thawed or continued {n} task(s)");
    }
    // SAFETY: ending the supervisor.
    unsafe { libc::_exit(0) }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        drop(self.link.take());
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}
