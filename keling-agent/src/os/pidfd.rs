//! Processes held by pidfd: a signal sent through one can only reach the process
//! it was opened on, never a process that reused its pid after it died.
//!
//! A pidfd is opened while the process is known to be the right one: our own
//! child before it is reaped (its pid cannot be reused until then), or a process
//! whose start time was checked after the open ([`Pidfd::open_started_by`]).
use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use super::proc;

/// A process, by pidfd.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    /// Opens a pidfd for `pid` as it is now. Only safe against pid reuse when the
    /// caller knows `pid` is the process it means (its own unreaped child), or
    /// checks afterwards (see [`Pidfd::open_started_by`]).
    pub fn open(pid: u32) -> io::Result<Self> {
        Ok(Self {
            fd: super::pidfd_open(pid)?,
            pid,
        })
    }

    /// Opens a pidfd for `pid` only if that process existed at monotonic time
    /// `seen_ns` (an event's timestamp): a process that started after it is another
    /// one that reused the pid. The check runs after the open, so the process
    /// checked is the one held.
    pub fn open_started_by(pid: u32, seen_ns: u64) -> io::Result<Self> {
        let pidfd = Self::open(pid)?;
        let started_ns = proc::start_monotonic_ns(pid)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        // The start time has the resolution of a clock tick: allow one.
        if started_ns > seen_ns.saturating_add(proc::tick_ns()) || !pidfd.is_alive() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(pidfd)
    }

    /// The pid the process had when opened (valid while [`Pidfd::is_alive`]).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` to the process; `ESRCH` when it has exited.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(pidfd, sig, NULL, 0) with a pidfd we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the process has not exited yet. (A pidfd polls readable once the
    /// process has exited, zombie or reaped.)
    pub fn is_alive(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 0
    }

    /// Runs `f` only while the process is alive, then checks it still is: a read of
    /// `/proc/PID/...` inside `f` is then known to be about this process.
    pub fn read_proc<T>(&self, f: impl FnOnce(u32) -> Option<T>) -> Option<T> {
        if !self.is_alive() {
            return None;
        }
        let v = f(self.pid)?;
        self.is_alive().then_some(v)
    }

    /// Reaps our child without blocking: its wait status once it has exited.
    pub fn try_wait(&self) -> io::Result<Option<u32>> {
        self.wait(libc::WNOHANG)
    }

    /// Reaps our child, blocking until it exits: its wait status.
    pub fn wait_blocking(&self) -> io::Result<u32> {
        loop {
            match self.wait(0) {
                Ok(Some(status)) => return Ok(status),
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn wait(&self, flags: i32) -> io::Result<Option<u32>> {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(P_PIDFD, fd, &info, ...) on a pidfd we own.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                self.fd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | flags,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: waitid filled `info` for a child state change (or left it zeroed).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None); // WNOHANG and still running
        }
        Ok(Some(wait_status(info.si_code, status)))
    }
}

/// The `waitpid` status word for a `waitid` result.
fn wait_status(code: i32, status: i32) -> u32 {
    match code {
        libc::CLD_EXITED => ((status & 0xff) as u32) << 8,
        libc::CLD_DUMPED => (status & 0x7f) as u32 | 0x80,
        _ => (status & 0x7f) as u32,
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Pidfd {
    /// A second fd on the same pidfd file (for a reactor that owns its fd).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Wraps an fd known to be a pidfd of `pid`.
    ///
    /// # Safety
    /// `fd` must be an open pidfd owned by the caller.
    pub unsafe fn from_raw(fd: RawFd, pid: u32) -> Self {
        Self {
            // SAFETY: the caller's promise.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_match_waitpid() {
        assert_eq!(wait_status(libc::CLD_EXITED, 3), 3 << 8);
        assert_eq!(wait_status(libc::CLD_KILLED, 9), 9);
        assert_eq!(wait_status(libc::CLD_DUMPED, 11), 11 | 0x80);
    }

    #[test]
    fn a_pidfd_follows_its_child_and_only_it() {
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let p = Pidfd::open(pid).unwrap();
        assert!(p.is_alive());
        assert_eq!(p.try_wait().unwrap(), None);
        p.signal(libc::SIGKILL).unwrap();
        assert_eq!(p.wait_blocking().unwrap(), 9);
        assert!(!p.is_alive());
        // Reaped: the pid may belong to anyone now; the pidfd reaches nobody.
        assert_eq!(
            p.signal(libc::SIGCONT).unwrap_err().raw_os_error(),
            Some(libc::ESRCH)
        );
        std::mem::forget(child); // reaped above
    }

    #[test]
    fn a_process_that_started_after_the_event_is_refused() {
        let me = std::process::id();
        let now = crate::os::monotonic_ns();
        assert!(Pidfd::open_started_by(me, now).is_ok());
        // An event from before this process started is about someone else.
        let started = proc::start_monotonic_ns(me).unwrap();
        assert!(Pidfd::open_started_by(me, started.saturating_sub(1_000_000_000)).is_err());
    }
}
