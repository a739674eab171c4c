//! Starting a command that is held before `exec` until the agent tracks it, so the
//! trace misses nothing the command does.
//!
//! `std::process::Command` cannot do this: `spawn` waits for the exec, which would
//! wait for us. So: fork, block the child on a pipe, exec when released.
//!
//! The child, once released, does in this order: its stdio, a session of its own
//! (when asked), its cgroup (as root), the caller's groups, gid and uid, the
//! working directory (as the caller, so it can only enter what the caller could),
//! default signal dispositions and an empty signal mask (every signal is blocked
//! from the fork until then, so none sent meanwhile is lost), then `execve` of the
//! first match along the `PATH` of the environment it is given (not the agent's).
//! A failing step is reported back (which step, errno) and the child exits 127
//! without running anything. Between fork and exec the child only makes system
//! calls on memory prepared before the fork: the agent has other threads.
//!
//! The release carries a GPU index ([`HeldChild::release_on`]): with
//! [`SpawnOptions::gpu_at_release`] the child writes it into
//! `CUDA_VISIBLE_DEVICES`, in an environment entry prepared before the fork, so a
//! task can wait held, unbound, and learn its GPU only when it is bound (late
//! binding). If the agent goes away (the hold pipe's EOF), the child exits 127
//! without running anything.
use std::{
    ffi::{CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::ffi::{OsStrExt, OsStringExt},
    },
    path::PathBuf,
};

use anyhow::{Context, bail};

use super::users::Credentials;

/// A forked child waiting to exec. Dropping it without releasing it kills and
/// reaps the child (it never ran the command).
pub struct HeldChild {
    pid: u32,
    go: Option<OwnedFd>,
    report: OwnedFd,
    context: ExecContext,
}

/// How to start a held child beyond its argv.
#[derive(Default)]
pub struct SpawnOptions {
    /// Environment variables: added to the agent's own, or the whole environment
    /// with `clear_env`.
    pub env: Vec<(OsString, OsString)>,
    /// Start from an empty environment instead of the agent's.
    pub clear_env: bool,
    /// fds to become the child's stdin, stdout, stderr.
    pub stdio: Option<[i32; 3]>,
    /// A `cgroup.procs` file the child moves itself into before exec.
    pub cgroup_procs: Option<PathBuf>,
    /// Working directory (entered with the child's credentials).
    pub cwd: Option<PathBuf>,
    /// Run as this user instead of the agent's.
    pub credentials: Option<Credentials>,
    /// A session (and process group) of its own: signals for the agent's
    /// terminal do not reach it.
    pub new_session: bool,
    /// `CUDA_VISIBLE_DEVICES` is the GPU the release names (any value in `env`
    /// or the agent's environment is dropped); a release naming none leaves the
    /// variable out.
    pub gpu_at_release: bool,
    /// Resource limits, OOM score adjustment and umask to take instead of the
    /// agent's (which raised its own limits and may run with a low OOM score).
    pub attributes: Option<Attributes>,
}

/// What a process passes on to what it starts besides its identity: its
/// resource limits, OOM score adjustment and umask. A task launched through
/// the agent takes them from the process that asked for it
/// ([`Attributes::of_process`]), as if that process had started it itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// `(resource, soft, hard)` for every resource the kernel has.
    pub limits: Vec<(u32, u64, u64)>,
    /// `/proc/PID/oom_score_adj`, -1000 to 1000.
    pub oom_score_adj: i32,
    pub umask: u32,
}

impl Attributes {
    /// Those of live process `pid`, which must be `uid`'s (its effective uid,
    /// as SO_PEERCRED reports a peer's) before and after they are read: a pid
    /// reused meanwhile by another user's process is refused, not copied.
    pub fn of_process(pid: u32, uid: u32) -> anyhow::Result<Self> {
        let owned = || super::proc::effective_uid(pid) == Some(uid);
        if !owned() {
            bail!("process {pid} is gone or is not uid {uid}'s");
        }
        let attributes = Attributes {
            limits: super::proc::limits(pid)?,
            oom_score_adj: super::proc::oom_score_adj(pid)?,
            umask: super::proc::umask(pid)?,
        };
        if !owned() {
            bail!("process {pid} went away while its limits were read");
        }
        Ok(attributes)
    }
}

/// `CUDA_VISIBLE_DEVICES=` and room for any u32 in decimal and its NUL.
const GPU_VAR: &[u8] = b"CUDA_VISIBLE_DEVICES=";
const GPU_VAR_LEN: usize = GPU_VAR.len() + 11;
/// The hold pipe's release message: a go byte, then the GPU (native-endian u32,
/// [`NO_GPU`] for none).
const RELEASE_LEN: usize = 5;
const NO_GPU: u32 = u32::MAX;

/// The step of the child's start that failed (reported through the pipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    Session = 1,
    Cgroup = 2,
    Credentials = 3,
    Cwd = 4,
    Exec = 5,
    Attributes = 6,
}

impl Step {
    fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Step::Session,
            2 => Step::Cgroup,
            3 => Step::Credentials,
            4 => Step::Cwd,
            5 => Step::Exec,
            6 => Step::Attributes,
            _ => return None,
        })
    }
}

/// Why a released child did not get to run its command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StartError {
    /// The step that failed, when the child reported one.
    pub step: Option<Step>,
    /// Its errno (0 when none was reported).
    pub errno: i32,
    /// What failed, for the person who launched it.
    pub message: String,
}

impl StartError {
    /// A failure with no step of the child's to name (it ended early, the report
    /// could not be read, the release failed).
    pub fn other(message: impl Into<String>) -> Self {
        StartError {
            step: None,
            errno: 0,
            message: message.into(),
        }
    }
}

/// What an error message about the start needs.
#[derive(Clone, Debug)]
struct ExecContext {
    program: String,
    cwd: Option<String>,
    uid: Option<u32>,
}

impl ExecContext {
    fn describe(&self, step: Option<Step>, errno: i32) -> String {
        let e = io::Error::from_raw_os_error(errno);
        let who = self.uid.map(|u| format!(" as uid {u}")).unwrap_or_default();
        match step {
            Some(Step::Exec) | None => format!("cannot execute {}{who}: {e}", self.program),
            Some(Step::Cwd) => format!(
                "cannot enter the working directory {}{who}: {e}",
                self.cwd.as_deref().unwrap_or("?")
            ),
            Some(Step::Credentials) => format!("cannot take the caller's identity{who}: {e}"),
            Some(Step::Cgroup) => format!("cannot join the task's cgroup: {e}"),
            Some(Step::Session) => format!("cannot start a session: {e}"),
            Some(Step::Attributes) => {
                format!("cannot take the caller's resource limits, OOM score or umask: {e}")
            }
        }
    }
}

/// The places `execve` is tried, in order, for `program` along `path` (as
/// `execvp` would: a name with a slash is used as it is; an empty PATH entry is
/// the working directory).
fn exec_candidates(program: &OsStr, path: Option<&OsStr>) -> Vec<Vec<u8>> {
    let p = program.as_bytes();
    if p.contains(&b'/') {
        return vec![p.to_vec()];
    }
    let path = path.map_or(&b"/usr/local/bin:/usr/bin:/bin"[..], |s| s.as_bytes());
    path.split(|&b| b == b':')
        .map(|dir| {
            let mut c = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            c.push(b'/');
            c.extend_from_slice(p);
            c
        })
        .collect()
}

fn cstring(bytes: impl Into<Vec<u8>>, what: &str) -> anyhow::Result<CString> {
    CString::new(bytes).with_context(|| format!("{what} contains a NUL byte"))
}

impl HeldChild {
    /// Forks a child that will run `argv` (looked up in PATH) once released.
    pub fn spawn(argv: &[OsString]) -> anyhow::Result<Self> {
        Self::spawn_with(argv, &SpawnOptions::default())
    }

    /// As [`HeldChild::spawn`], with environment, stdio, cgroup, directory,
    /// credentials and session.
    pub fn spawn_with(argv: &[OsString], opts: &SpawnOptions) -> anyhow::Result<Self> {
        let Some(program) = argv.first() else {
            bail!("no command given")
        };
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| cstring(a.as_bytes(), "an argument"))
            .collect::<anyhow::Result<_>>()?;
        let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        // The environment, prepared before the fork (setenv is not safe after it).
        let mut env: Vec<(OsString, OsString)> = if opts.clear_env {
            Vec::new()
        } else {
            std::env::vars_os()
                .filter(|(k, _)| !opts.env.iter().any(|(o, _)| o == k))
                .collect()
        };
        env.extend(opts.env.iter().cloned());
        if opts.gpu_at_release {
            env.retain(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
        }
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
        // The GPU entry, last: the child fills in the digits, or ends the
        // environment there when the release names no GPU.
        let mut gpu_var = [0u8; GPU_VAR_LEN];
        gpu_var[..GPU_VAR.len()].copy_from_slice(GPU_VAR);
        let gpu_entry = opts.gpu_at_release.then(|| {
            envp.push(gpu_var.as_ptr().cast());
            envp.len() - 1
        });
        envp.push(std::ptr::null());
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_os_str());
        let candidates: Vec<CString> = exec_candidates(program, path)
            .into_iter()
            .filter_map(|c| CString::new(c).ok())
            .collect();
        let cgroup_procs = opts
            .cgroup_procs
            .as_ref()
            .map(|p| cstring(p.as_os_str().as_bytes(), "the cgroup path"))
            .transpose()?;
        let cwd = opts
            .cwd
            .as_ref()
            .map(|p| cstring(p.as_os_str().as_bytes(), "the working directory"))
            .transpose()?;
        let creds = opts.credentials.clone();
        let groups: Vec<libc::gid_t> = creds.as_ref().map(|c| c.groups.clone()).unwrap_or_default();
        let stdio = opts.stdio;
        let new_session = opts.new_session;
        let limits: Vec<(u32, libc::rlimit64)> = opts
            .attributes
            .iter()
            .flat_map(|a| &a.limits)
            .map(|&(resource, soft, hard)| {
                let limit = libc::rlimit64 {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                (resource, limit)
            })
            .collect();
        let mut oom_text = [0u8; 12];
        let oom = opts.attributes.as_ref().map(|a| {
            let text = a.oom_score_adj.to_string();
            oom_text[..text.len()].copy_from_slice(text.as_bytes());
            (oom_text.as_ptr(), text.len())
        });
        let umask = opts.attributes.as_ref().map(|a| a.umask & 0o777);
        let context = ExecContext {
            program: program.to_string_lossy().into_owned(),
            cwd: opts.cwd.as_ref().map(|c| c.to_string_lossy().into_owned()),
            uid: creds.as_ref().map(|c| c.uid),
        };
        let (go_read, go_write) = super::pipe()?;
        let (report_read, report_write) = super::pipe()?;
        // Every signal is blocked across the fork: until the child has put back
        // the default dispositions, a signal for it (a forwarded Ctrl-C, a SIGTERM)
        // would run the agent's handlers in it and be lost. Blocked, it waits, and
        // acts just before the exec.
        // SAFETY: a zeroed sigset_t is valid; sigfillset initialises it below.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; pthread_sigmask fills it.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sigset pointers.
        unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        }
        // SAFETY: the child only makes system calls on memory prepared before the
        // fork (see the module doc) and ends in execve or _exit.
        let pid = unsafe { libc::fork() };
        if pid != 0 {
            // SAFETY: restoring this thread's mask.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        }
        if pid < 0 {
            return Err(io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // SAFETY: in the child; everything used was prepared above.
            unsafe {
                child(ChildPlan {
                    go: go_read.as_raw_fd(),
                    report: report_write.as_raw_fd(),
                    stdio,
                    new_session,
                    cgroup_procs: cgroup_procs.as_ref().map(|c| c.as_ptr()),
                    limits: &limits,
                    oom,
                    umask,
                    creds: creds.as_ref().map(|c| (c.uid, c.gid)),
                    groups: &groups,
                    cwd: cwd.as_ref().map(|c| c.as_ptr()),
                    candidates: &candidates,
                    argv: ptrs.as_ptr(),
                    envp: envp.as_mut_ptr(),
                    gpu_entry: gpu_entry.map(|i| (i, gpu_var.as_mut_ptr())),
                })
            }
        }
        drop((go_read, report_write));
        log::debug!("held child {pid} for {}", context.program);
        Ok(Self {
            pid: pid as u32,
            go: Some(go_write),
            report: report_read,
            context,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child go on to exec without waiting for it: the result comes from
    /// the returned [`PendingExec`].
    pub fn release_nowait(self) -> anyhow::Result<PendingExec> {
        self.release_on(None)
    }

    /// As [`HeldChild::release_nowait`], on `gpu`: with
    /// [`SpawnOptions::gpu_at_release`], the child's `CUDA_VISIBLE_DEVICES`.
    pub fn release_on(mut self, gpu: Option<u32>) -> anyhow::Result<PendingExec> {
        let go = self.go.take().expect("released once");
        let mut msg = [1u8; RELEASE_LEN];
        msg[1..].copy_from_slice(&gpu.unwrap_or(NO_GPU).to_ne_bytes());
        // SAFETY: writing from a valid buffer to our pipe (at most PIPE_BUF
        // bytes: one atomic write).
        let n = unsafe { libc::write(go.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        let write_error = io::Error::last_os_error();
        drop(go);
        if n != RELEASE_LEN as isize {
            // The child sees EOF and exits 127 without running anything.
            reap(self.pid);
            return Err(write_error).context("releasing the command");
        }
        // The child is the caller's now (it reaps it).
        let report = self
            .report
            .try_clone()
            .context("dup the exec report pipe")?;
        Ok(PendingExec {
            pid: self.pid,
            report,
            context: self.context.clone(),
        })
    }

    /// Ends a child that was never released (SIGKILL; it ran nothing) without
    /// reaping it: whoever watches its pidfd reaps it and sees the signal.
    pub fn cancel(mut self) {
        // SAFETY: our own child's pid, not yet reaped.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        // Closing the hold pipe ends it too, should the kill have failed.
        self.go = None;
    }

    /// Forgets a child that ended and was reaped by its pidfd: nothing is left
    /// to kill (its pid may be someone else's now).
    pub fn reaped(mut self) {
        self.go = None;
    }

    /// Lets the child exec and returns its pid, which the caller must now wait
    /// for. Blocks until the exec; fails (having reaped the child) if the command
    /// could not be started.
    pub fn release(self, _program: &OsString) -> anyhow::Result<u32> {
        let pending = self.release_nowait()?;
        let pid = pending.pid;
        if let Err(what) = pending.wait() {
            // The child has exited with 127; reap it.
            reap(pid);
            bail!(what);
        }
        Ok(pid)
    }
}

/// A released child on its way to exec: [`PendingExec::wait`] (blocking) or
/// [`PendingExec::outcome`] (async) says whether it got there.
pub struct PendingExec {
    pub pid: u32,
    report: OwnedFd,
    context: ExecContext,
}

impl PendingExec {
    /// Blocks until the exec succeeded (`Ok`) or a step failed (what failed). The
    /// child is not reaped.
    pub fn wait(self) -> Result<(), StartError> {
        let mut buf = [0u8; 8];
        let mut got = 0;
        while got < buf.len() {
            // SAFETY: reading into the rest of a valid buffer.
            let n = unsafe {
                libc::read(
                    self.report.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    buf.len() - got,
                )
            };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        self.verdict(&buf[..got])
    }

    /// As [`PendingExec::wait`], without blocking the thread (tokio).
    pub async fn outcome(self) -> Result<(), StartError> {
        let report = |e: io::Error| StartError::other(format!("reading the exec report: {e}"));
        let fd = self.report.try_clone().map_err(report)?;
        super::set_nonblocking(&fd).map_err(report)?;
        let fd = super::async_fd(fd)
            .map_err(|e| StartError::other(format!("reading the exec report: {e:#}")))?;
        let mut buf = [0u8; 8];
        let mut got = 0;
        loop {
            let mut guard = fd.readable().await.map_err(report)?;
            let r = guard.try_io(|f| {
                // SAFETY: reading into the rest of a valid buffer.
                let n = unsafe {
                    libc::read(
                        f.get_ref().as_raw_fd(),
                        buf[got..].as_mut_ptr().cast(),
                        buf.len() - got,
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(n as usize)
            });
            match r {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => {
                    got += n;
                    if got == buf.len() {
                        break;
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(report(e)),
                Err(_would_block) => {}
            }
        }
        self.verdict(&buf[..got])
    }

    fn verdict(&self, report: &[u8]) -> Result<(), StartError> {
        // Nothing: the pipe closed on exec (close-on-exec). Anything else: a failure.
        if report.is_empty() {
            return Ok(());
        }
        if report.len() < 8 {
            return Err(StartError::other(format!(
                "cannot start {}: the child ended early",
                self.context.program
            )));
        }
        let step = Step::from_u32(u32::from_ne_bytes(report[..4].try_into().expect("4 bytes")));
        let errno = i32::from_ne_bytes(report[4..8].try_into().expect("4 bytes"));
        Err(StartError {
            step,
            errno,
            message: self.context.describe(step, errno),
        })
    }
}

/// The kernel's `struct sigaction` (x86-64 layout) for `rt_sigaction`.
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// What the child does, prepared by the parent.
struct ChildPlan<'a> {
    go: i32,
    report: i32,
    stdio: Option<[i32; 3]>,
    new_session: bool,
    cgroup_procs: Option<*const libc::c_char>,
    limits: &'a [(u32, libc::rlimit64)],
    /// The OOM score adjustment's text and its length.
    oom: Option<(*const u8, usize)>,
    umask: Option<u32>,
    creds: Option<(u32, u32)>,
    groups: &'a [libc::gid_t],
    cwd: Option<*const libc::c_char>,
    candidates: &'a [CString],
    argv: *const *const libc::c_char,
    envp: *mut *const libc::c_char,
    /// With `gpu_at_release`: the GPU entry's index in `envp`, and the entry.
    gpu_entry: Option<(usize, *mut u8)>,
}

/// The child's whole life between fork and exec.
///
/// # Safety
/// Call only in the child of a fork, with a plan whose pointers were prepared
/// before the fork.
unsafe fn child(plan: ChildPlan) -> ! {
    let fail = |step: Step| -> ! {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(step as u32).to_ne_bytes());
        msg[4..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: writing 8 bytes from a valid buffer, then exiting.
        unsafe {
            libc::write(plan.report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };
    let mut msg = [0u8; RELEASE_LEN];
    let mut got = 0;
    while got < RELEASE_LEN {
        // SAFETY: reading into the rest of a valid buffer.
        let n = unsafe { libc::read(plan.go, msg[got..].as_mut_ptr().cast(), RELEASE_LEN - got) };
        if n > 0 {
            got += n as usize;
            continue;
        }
        if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // The agent went away without releasing us: run nothing.
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(127) };
        }
    }
    if let Some((index, entry)) = plan.gpu_entry {
        let gpu = u32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
        // SAFETY: `entry` is GPU_VAR_LEN bytes and `index` is inside `envp`
        // (both prepared before the fork; this is the child's copy).
        unsafe {
            if gpu == NO_GPU {
                *plan.envp.add(index) = std::ptr::null();
            } else {
                write_decimal(
                    gpu,
                    std::slice::from_raw_parts_mut(entry.add(GPU_VAR.len()), 11),
                );
            }
        }
    }
    // SAFETY: system calls on memory prepared before the fork.
    unsafe {
        if let Some(fds) = plan.stdio {
            for (target, fd) in fds.iter().enumerate() {
                libc::dup2(*fd, target as i32);
            }
        }
        if plan.new_session && libc::setsid() < 0 {
            fail(Step::Session);
        }
        if let Some(procs) = plan.cgroup_procs {
            // Join the task's cgroup before exec (and while still root): everything
            // it starts is in it.
            let f = libc::open(procs, libc::O_WRONLY | libc::O_CLOEXEC);
            if f < 0 || libc::write(f, b"0".as_ptr().cast(), 1) != 1 {
                fail(Step::Cgroup);
            }
            libc::close(f);
        }
        // The caller's limits, OOM score and umask, not the agent's (still
        // root). Raising a hard limit above the agent's, or the OOM score below
        // it, needs CAP_SYS_RESOURCE, which root lacks in some containers:
        // there the task gets the caller's figures capped at the agent's hard
        // limits, and keeps the agent's OOM score where the caller's is lower
        // (never more than the agent itself may have).
        let prlimit = |resource: u32, new: *const libc::rlimit64, old: *mut libc::rlimit64| {
            libc::syscall(libc::SYS_prlimit64, 0, resource, new, old)
        };
        for &(resource, limit) in plan.limits {
            if prlimit(resource, &raw const limit, std::ptr::null_mut()) == 0 {
                continue;
            }
            let mut now = libc::rlimit64 {
                rlim_cur: 0,
                rlim_max: 0,
            };
            let capped = libc::rlimit64 {
                rlim_cur: limit.rlim_cur.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if *libc::__errno_location() != libc::EPERM
                || prlimit(resource, std::ptr::null(), &raw mut now) != 0
            {
                fail(Step::Attributes);
            }
            let capped = libc::rlimit64 {
                rlim_cur: capped.rlim_cur.min(now.rlim_max),
                rlim_max: capped.rlim_max.min(now.rlim_max),
            };
            if prlimit(resource, &raw const capped, std::ptr::null_mut()) != 0 {
                fail(Step::Attributes);
            }
        }
        if let Some((text, len)) = plan.oom {
            let f = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if f < 0 {
                fail(Step::Attributes);
            }
            // A refusal (EACCES: lower than the agent's without the capability)
            // leaves the agent's, the higher.
            libc::write(f, text.cast(), len);
            libc::close(f);
        }
        if let Some(mask) = plan.umask {
            libc::umask(mask);
        }
        if let Some((uid, gid)) = plan.creds {
            // Raw system calls: they change this thread only, which is the whole
            // process here (glibc's wrappers would try to reach the agent's threads).
            if libc::syscall(libc::SYS_setgroups, plan.groups.len(), plan.groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                fail(Step::Credentials);
            }
        }
        if let Some(dir) = plan.cwd
            && libc::chdir(dir) != 0
        {
            fail(Step::Cwd);
        }
        // The agent's signal state must not leak into the task: Rust ignores
        // SIGPIPE, and an ignored signal stays ignored across exec. The raw call
        // reaches the signals glibc reserves for itself too.
        let default = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &raw const default,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                );
            }
        }
        // Signals that came since the fork act now, with their default action.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let mut errno = libc::ENOENT;
        for c in plan.candidates {
            libc::execve(c.as_ptr(), plan.argv, plan.envp);
            match *libc::__errno_location() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => errno = libc::EACCES,
                e => {
                    errno = e;
                    break;
                }
            }
        }
        *libc::__errno_location() = errno;
    }
    fail(Step::Exec)
}

/// Writes `v` in decimal and a NUL into `buf` (11 bytes hold any u32), without
/// allocating (the child of a fork may not).
fn write_decimal(mut v: u32, buf: &mut [u8]) {
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for (i, d) in digits[..n].iter().rev().enumerate() {
        buf[i] = *d;
    }
    buf[n] = 0;
}

/// Waits for our own child `pid`; its wait status.
fn reap(pid: u32) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    status
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        if self.go.is_none() {
            return; // released: the child is the caller's now
        }
        // Never released: the command never ran. Kill by pid (our unreaped child:
        // the pid is still its) and reap.
        // SAFETY: our own child's pid, not yet reaped.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        reap(self.pid);
    }
}

/// `KEY=VALUE` strings (as a client sends its environment) as pairs; entries
/// without `=` are dropped.
pub fn parse_env(entries: &[String]) -> Vec<(OsString, OsString)> {
    entries
        .iter()
        .filter_map(|e| {
            let (k, v) = e.split_once('=')?;
            (!k.is_empty()).then(|| (OsString::from_vec(k.as_bytes().to_vec()), OsString::from(v)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn candidates_follow_the_given_path() {
        let c = exec_candidates(OsStr::new("ls"), Some(OsStr::new("/a::/b")));
        assert_eq!(
            c,
            vec![b"/a/ls".to_vec(), b"./ls".to_vec(), b"/b/ls".to_vec()]
        );
        assert_eq!(
            exec_candidates(OsStr::new("./x"), Some(OsStr::new("/a"))),
            vec![b"./x".to_vec()]
        );
        assert_eq!(exec_candidates(OsStr::new("ls"), None).len(), 3);
    }

    #[test]
    fn env_entries_split_at_the_first_equals() {
        let env = parse_env(&["A=b=c".into(), "noequals".into(), "=x".into(), "E=".into()]);
        assert_eq!(
            env,
            vec![
                (OsString::from("A"), OsString::from("b=c")),
                (OsString::from("E"), OsString::from(""))
            ]
        );
    }

    #[test]
    fn a_child_gets_exactly_the_given_environment_and_directory() {
        let dir = std::env::temp_dir().join(format!("keling-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let argv = argv(&[
            "sh",
            "-c",
            "pwd > out; env | sort >> out; grep -E 'SigIgn|SigBlk' /proc/self/status >> out",
        ]);
        let opts = SpawnOptions {
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("ONLY".into(), "this".into()),
            ],
            clear_env: true,
            cwd: Some(dir.clone()),
            new_session: true,
            ..SpawnOptions::default()
        };
        let held = HeldChild::spawn_with(&argv, &opts).unwrap();
        let pid = held.pid();
        let pending = held.release_nowait().unwrap();
        pending.wait().unwrap();
        let status = reap(pid);
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(status, 0, "{text}");
        assert!(text.starts_with(&format!("{}\n", dir.display())), "{text}");
        assert!(text.contains("ONLY=this"), "{text}");
        assert!(
            !text.contains("CARGO"),
            "the agent's environment leaked: {text}"
        );
        // Nothing ignored or blocked leaks from the agent (Rust ignores SIGPIPE).
        assert!(text.contains("SigIgn:\t0000000000000000"), "{text}");
        assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `sh -c SCRIPT` with `attributes` in a fresh directory of its own
    /// (`keling-spawn-NAME-PID`) and returns what it wrote to `out` there.
    fn run_with(name: &str, attributes: Attributes, script: &str) -> String {
        let dir = std::env::temp_dir().join(format!("keling-spawn-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = SpawnOptions {
            cwd: Some(dir.clone()),
            attributes: Some(attributes),
            ..SpawnOptions::default()
        };
        let held = HeldChild::spawn_with(&argv(&["sh", "-c", script]), &opts).unwrap();
        let pid = held.pid();
        held.release_nowait().unwrap().wait().unwrap();
        assert_eq!(reap(pid), 0);
        let text = std::fs::read_to_string(dir.join("out")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        text
    }

    /// The attributes given are the child's, as the kernel shows them, not
    /// this process's: a lower open-files and locked-memory limit, a higher OOM
    /// score, another umask (each allowed without privileges); and
    /// [`Attributes::of_process`] reads back what `getrlimit` says here.
    #[test]
    fn a_child_takes_the_given_limits_oom_score_and_umask() {
        let me = std::process::id();
        // SAFETY: geteuid has no preconditions.
        let mut a = Attributes::of_process(me, unsafe { libc::geteuid() }).unwrap();
        let mut nofile = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit to fill.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut nofile) };
        let mine = a.limits.iter().find(|l| l.0 == libc::RLIMIT_NOFILE);
        assert_eq!(
            mine,
            Some(&(libc::RLIMIT_NOFILE, nofile.rlim_cur, nofile.rlim_max))
        );
        for l in &mut a.limits {
            if l.0 == libc::RLIMIT_NOFILE {
                (l.1, l.2) = (200, 200);
            }
            if l.0 == libc::RLIMIT_MEMLOCK {
                (l.1, l.2) = (65_536, 65_536);
            }
        }
        a.oom_score_adj = 321;
        a.umask = 0o027;
        let text = run_with(
            "attr",
            a,
            "grep -E '^Max (open files|locked memory)' /proc/$$/limits > out; \
             cat /proc/$$/oom_score_adj >> out; grep Umask /proc/$$/status >> out",
        );
        let squeezed: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            squeezed,
            [
                "Max open files 200 200 files",
                "Max locked memory 65536 65536 bytes",
                "321",
                "Umask: 0027",
            ],
            "{text}"
        );
    }

    /// A caller's hard limit above this process's own, or an OOM score below
    /// it, is taken where the kernel allows it (CAP_SYS_RESOURCE) and capped at
    /// this process's figures where it does not (root in some containers,
    /// these machines included): the start never fails for it.
    #[test]
    fn a_limit_above_the_agents_is_taken_or_capped_never_a_failure() {
        let me = std::process::id();
        // SAFETY: geteuid has no preconditions.
        let mut a = Attributes::of_process(me, unsafe { libc::geteuid() }).unwrap();
        let ours = a
            .limits
            .iter()
            .find(|l| l.0 == libc::RLIMIT_NOFILE)
            .copied()
            .unwrap();
        for l in &mut a.limits {
            if l.0 == libc::RLIMIT_NOFILE {
                (l.1, l.2) = (ours.2 + 1, ours.2 + 1);
            }
        }
        a.oom_score_adj = -1000;
        let text = run_with(
            "cap",
            a,
            "ulimit -Hn > out; cat /proc/$$/oom_score_adj >> out",
        );
        let mut lines = text.lines();
        let hard: u64 = lines.next().unwrap().parse().unwrap();
        assert!(hard == ours.2 + 1 || hard == ours.2, "{text}");
        let oom: i32 = lines.next().unwrap().parse().unwrap();
        let own = super::super::proc::oom_score_adj(me).unwrap();
        assert!(oom == -1000 || oom == own, "{text}");
    }

    #[test]
    fn a_signal_sent_before_the_exec_is_not_lost() {
        // As the agent's handlers would, this process's disposition would swallow
        // the signal in a child that has not yet reset its own.
        // SAFETY: ignoring SIGUSR2 in this test process (nothing here uses it).
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        let argv = vec![OsString::from("sleep"), OsString::from("10")];
        let held = HeldChild::spawn(&argv).unwrap();
        let pid = held.pid();
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(pid as i32, libc::SIGUSR2) };
        let _ = held.release_nowait().unwrap().wait();
        let status = reap(pid);
        assert_eq!(status & 0x7f, libc::SIGUSR2, "status {status:#x}");
    }

    /// Runs `sh -c 'echo "${CUDA_VISIBLE_DEVICES-unset}"'` held with
    /// `gpu_at_release`, an earlier value in its environment, released on `gpu`.
    fn gpu_seen_after_release_on(gpu: Option<u32>) -> String {
        let dir = std::env::temp_dir().join(format!(
            "keling-spawn-gpu-{}-{}",
            std::process::id(),
            gpu.map_or(-1, i64::from)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let argv = argv(&["sh", "-c", "echo \"${CUDA_VISIBLE_DEVICES-unset}\" > out"]);
        let opts = SpawnOptions {
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "7".into()),
            ],
            clear_env: true,
            cwd: Some(dir.clone()),
            gpu_at_release: true,
            ..SpawnOptions::default()
        };
        let held = HeldChild::spawn_with(&argv, &opts).unwrap();
        let pid = held.pid();
        held.release_on(gpu).unwrap().wait().unwrap();
        let status = reap(pid);
        assert_eq!(status, 0);
        let seen = std::fs::read_to_string(dir.join("out")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        seen.trim_end().to_owned()
    }

    #[test]
    fn the_release_names_the_gpu_the_child_sees() {
        assert_eq!(gpu_seen_after_release_on(Some(3)), "3");
        assert_eq!(gpu_seen_after_release_on(Some(0)), "0");
        assert_eq!(gpu_seen_after_release_on(Some(4_000_000_000)), "4000000000");
        assert_eq!(gpu_seen_after_release_on(None), "unset");
    }

    #[test]
    fn decimals_fit_their_buffer() {
        for v in [0, 9, 10, 99, 12345, u32::MAX - 1, u32::MAX] {
            let mut buf = [0xffu8; 11];
            write_decimal(v, &mut buf);
            let end = buf.iter().position(|&b| b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&buf[..end]).unwrap(), v.to_string());
        }
    }

    #[test]
    fn a_cancelled_child_dies_unreaped_and_ran_nothing() {
        let dir = std::env::temp_dir().join(format!("keling-spawn-cancel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let argv = argv(&["sh", "-c", "touch ran"]);
        let opts = SpawnOptions {
            cwd: Some(dir.clone()),
            ..SpawnOptions::default()
        };
        let held = HeldChild::spawn_with(&argv, &opts).unwrap();
        let pid = held.pid();
        held.cancel();
        let mut status = 0;
        // SAFETY: our own child, which cancel left for us to reap.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        assert_eq!(r, pid as i32);
        assert_eq!(status & 0x7f, libc::SIGKILL, "status {status:#x}");
        assert!(!dir.join("ran").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_failing_step_is_named() {
        let argv = vec![OsString::from("true")];
        let opts = SpawnOptions {
            cwd: Some("/no/such/dir".into()),
            ..SpawnOptions::default()
        };
        let held = HeldChild::spawn_with(&argv, &opts).unwrap();
        let err = held.release(&argv[0]).unwrap_err().to_string();
        assert!(err.contains("working directory /no/such/dir"), "{err}");
        let argv = vec![OsString::from("no-such-command-keling")];
        let held = HeldChild::spawn(&argv).unwrap();
        let err = held.release(&argv[0]).unwrap_err().to_string();
        assert!(
            err.contains("cannot execute no-such-command-keling"),
            "{err}"
        );
    }
}
