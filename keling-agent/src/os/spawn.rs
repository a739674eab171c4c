//! Starting a command that is held before `exec` until the agent tracks it, so the
//! trace misses nothing the command does.
//!
//! `std::process::Command` cannot do this: `spawn` waits for the exec, which would
//! wait for us. So: fork, block the child on a pipe, exec when released.
use std::{
    ffi::{CString, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::PathBuf,
};

use anyhow::{Context, bail};

/// A forked child waiting to exec. Dropping it without [`HeldChild::release`]
/// kills and reaps the child (it never ran the command).
pub struct HeldChild {
    pid: u32,
    go: Option<OwnedFd>,
    exec_error: OwnedFd,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh fds we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// How to start a held child beyond its argv.
#[derive(Default)]
pub struct SpawnOptions {
    /// Extra environment variables (added to the agent's own).
    pub env: Vec<(OsString, OsString)>,
    /// fds to become the child's stdin, stdout, stderr.
    pub stdio: Option<[i32; 3]>,
    /// A `cgroup.procs` file the child moves itself into before exec.
    pub cgroup_procs: Option<PathBuf>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
}

impl HeldChild {
    /// Forks a child that will run `argv` (looked up in PATH) once released.
    pub fn spawn(argv: &[OsString]) -> anyhow::Result<Self> {
        Self::spawn_with(argv, &SpawnOptions::default())
    }

    /// As [`HeldChild::spawn`], with environment, stdio, cgroup and directory.
    pub fn spawn_with(argv: &[OsString], opts: &SpawnOptions) -> anyhow::Result<Self> {
        let Some(program) = argv.first() else {
            bail!("no command given")
        };
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()).context("argument contains a NUL byte"))
            .collect::<anyhow::Result<_>>()?;
        let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // The environment, prepared before the fork (setenv is not safe after it).
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| !opts.env.iter().any(|(o, _)| o == k))
            .collect();
        env.extend(opts.env.iter().cloned());
        let cenv: Vec<CString> = env
            .iter()
            .filter_map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).ok()
            })
            .collect();
        let mut envp: Vec<*const libc::c_char> = cenv.iter().map(|c| c.as_ptr()).collect();
        envp.push(std::ptr::null());
        let cgroup_procs = opts
            .cgroup_procs
            .as_ref()
            .map(|p| CString::new(p.as_os_str().as_bytes()))
            .transpose()?;
        let cwd = opts
            .cwd
            .as_ref()
            .map(|p| CString::new(p.as_os_str().as_bytes()))
            .transpose()?;
        let stdio = opts.stdio;
        let (go_read, go_write) = pipe()?;
        let (err_read, err_write) = pipe()?;
        // SAFETY: the child only calls async-signal-safe functions (read, execvp,
        // write, _exit) on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // Child.
            let mut byte = 0u8;
            loop {
                // SAFETY: reading one byte into a valid buffer.
                let n = unsafe { libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1) };
                if n == 1 {
                    break;
                }
                if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    // The agent went away without releasing us: run nothing.
                    // SAFETY: _exit is always safe to call.
                    unsafe { libc::_exit(127) };
                }
            }
            // SAFETY: async-signal-safe calls on memory prepared before the fork.
            unsafe {
                if let Some(fds) = stdio {
                    for (target, fd) in fds.iter().enumerate() {
                        libc::dup2(*fd, target as i32);
                    }
                }
                if let Some(procs) = &cgroup_procs {
                    // Join the task's cgroup before exec: everything it starts is in it.
                    let f = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    let me = b"0";
                    if f < 0 || libc::write(f, me.as_ptr().cast(), 1) != 1 {
                        libc::_exit(126);
                    }
                    libc::close(f);
                }
                if let Some(dir) = &cwd {
                    libc::chdir(dir.as_ptr());
                }
                libc::execvpe(ptrs[0], ptrs.as_ptr(), envp.as_ptr());
            }
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // SAFETY: writing 4 bytes from a valid buffer, then exiting.
            unsafe {
                libc::write(err_write.as_raw_fd(), (&raw const errno).cast(), 4);
                libc::_exit(127);
            }
        }
        drop((go_read, err_write));
        log::debug!("held child {pid} for {}", program.to_string_lossy());
        Ok(Self {
            pid: pid as u32,
            go: Some(go_write),
            exec_error: err_read,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exec and returns its pid, which the caller must now wait
    /// for. Fails if the command could not be executed.
    pub fn release(mut self, program: &OsString) -> anyhow::Result<u32> {
        let go = self.go.take().expect("released once");
        // SAFETY: writing one byte from a valid buffer to our pipe.
        let n = unsafe { libc::write(go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        let write_error = io::Error::last_os_error();
        drop(go);
        if n != 1 {
            // The child sees EOF and exits 127 without running anything.
            reap(self.pid);
            return Err(write_error).context("releasing the traced command");
        }
        let mut errno = 0i32;
        // Blocks until exec succeeds (the CLOEXEC pipe closes: 0 bytes) or fails.
        // SAFETY: reading 4 bytes into a valid i32.
        let n = unsafe { libc::read(self.exec_error.as_raw_fd(), (&raw mut errno).cast(), 4) };
        let pid = self.pid;
        if n == 4 {
            // The child has exited with 127; reap it.
            reap(pid);
            bail!(
                "cannot execute {}: {}",
                program.to_string_lossy(),
                io::Error::from_raw_os_error(errno)
            );
        }
        Ok(pid)
    }
}

fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        if self.go.is_none() {
            return; // released: the child is the caller's now
        }
        // Never released: the command never ran. Kill by pid and reap.
        // SAFETY: our own child's pid, not yet reaped.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        reap(self.pid);
    }
}
