//! cgroup v2 actuators: one cgroup per launched task under the instance's root
//! (`<cgroup2>/keling`, or `<cgroup2>/keling-NAME`: [`crate::instance`]), frozen,
//! thawed and killed through `cgroup.freeze` / `cgroup.kill`, and confirmed by
//! `cgroup.events` (`frozen 1`, `populated 0`), which the kernel notifies with
//! POLLPRI.
//!
//! A cgroup is the task's membership: whatever is in it belongs to the task, however
//! it got there and whatever the trace saw or lost. Signals to "every process of
//! the task" go through a pidfd per process, each checked to be in the cgroup after
//! its pidfd was opened, so a pid reused between reading `cgroup.procs` and the
//! signal reaches nobody.
//!
//! Also the way back: [`thaw_all`] thaws every cgroup Keling made and continues the
//! processes it stopped, which the fail-safe runs when the agent dies or stalls and
//! `keling thaw --all` runs by hand; [`clean_leftovers`] removes what earlier runs
//! left.
use std::{
    ffi::OsString,
    fs,
    io::{Read, Seek},
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::os::{pidfd::Pidfd, proc};

/// Keling's subtree of the cgroup v2 hierarchy.
#[derive(Clone, Debug)]
pub struct CgroupRoot {
    /// The cgroup2 mount point.
    pub mount: PathBuf,
    pub dir: PathBuf,
}

/// The cgroup v2 mount point, from /proc/self/mountinfo (here /sys/fs/cgroup/unified,
/// on most hosts /sys/fs/cgroup). Bytes that are not UTF-8 are kept.
pub fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    crate::os::mounts::find("cgroup2")?.context(
        "no cgroup v2 hierarchy is mounted (cgroup2 in /proc/self/mountinfo); Keling freezes tasks through cgroup.freeze",
    )
}

impl CgroupRoot {
    /// The instance's root (`<cgroup2>/keling`, or `<cgroup2>/keling-NAME`),
    /// created if needed.
    pub fn open() -> anyhow::Result<Self> {
        let mount = cgroup2_mount()?;
        let root = Self {
            dir: mount.join(crate::instance::current().cgroup_name()),
            mount,
        };
        root.make()?;
        Ok(root)
    }

    /// Creates the root's directory unless it is there (another agent may be
    /// creating it at the same moment).
    fn make(&self) -> anyhow::Result<()> {
        match fs::create_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(e).with_context(|| format!("create cgroup {}", self.dir.display()))
            }
            _ => Ok(()),
        }
    }

    /// Removes the root if no task cgroup is left in it (the agent is stopping:
    /// it leaves nothing behind but the cgroups of tasks still running). Another
    /// agent's task cgroups keep it; one that is just making its first finds the
    /// root gone and makes it again ([`Self::create_task`]).
    pub fn remove_if_empty(&self) {
        let _ = fs::remove_dir(&self.dir);
    }

    /// Only if it exists (for `thaw --all` and the fail-safe: never create).
    pub fn existing() -> Option<Self> {
        let mount = cgroup2_mount().ok()?;
        let dir = mount.join(crate::instance::current().cgroup_name());
        dir.is_dir().then_some(Self { mount, dir })
    }

    fn task_at(&self, dir: PathBuf) -> TaskCgroup {
        // The path /proc/PID/cgroup shows: from the hierarchy's root.
        let rel = dir
            .strip_prefix(&self.mount)
            .map(|r| {
                let mut v = b"/".to_vec();
                v.extend_from_slice(r.as_os_str().as_bytes());
                OsString::from_vec(v)
            })
            .unwrap_or_default();
        TaskCgroup {
            dir,
            rel,
            freeze: Arc::default(),
        }
    }

    /// A fresh cgroup for one task.
    pub fn create_task(&self, name: &str) -> anyhow::Result<TaskCgroup> {
        let dir = self.dir.join(name);
        if dir.exists() {
            // Left by a previous run: it must be empty to be reused.
            let _ = fs::write(dir.join("cgroup.freeze"), "0");
            let _ = fs::remove_dir(&dir);
        }
        let mut made = fs::create_dir(&dir);
        if made
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            // Another agent, stopping, removed the empty root.
            self.make()?;
            made = fs::create_dir(&dir);
        }
        made.with_context(|| format!("create cgroup {}", dir.display()))?;
        let task = self.task_at(dir);
        if let Err(e) = task.freeze_file() {
            // Nothing entered it yet: it goes, whatever the error was (EMFILE...).
            if let Err(rm) = fs::remove_dir(&task.dir) {
                log::warn!("cannot remove {}: {rm}", task.dir.display());
            }
            return Err(e);
        }
        Ok(task)
    }

    /// An existing task cgroup, `dir`, directly under the root (an earlier
    /// agent's: a record names it). Anything else is refused.
    pub fn existing_task(&self, dir: &Path) -> anyhow::Result<TaskCgroup> {
        let under = dir.parent() == Some(self.dir.as_path())
            && dir
                .file_name()
                .is_some_and(|n| n != "." && n != ".." && !n.is_empty());
        if !under {
            bail!(
                "{} is not a task cgroup under {}",
                dir.display(),
                self.dir.display()
            );
        }
        let m = fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
        if !m.is_dir() {
            bail!("{} is not a directory", dir.display());
        }
        Ok(self.task_at(dir.to_owned()))
    }

    /// The task cgroups under the root.
    pub fn tasks(&self) -> Vec<TaskCgroup> {
        fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(|e| {
                    let e = e.ok()?;
                    e.file_type().ok()?.is_dir().then(|| self.task_at(e.path()))
                })
                .collect()
            })
            .unwrap_or_default()
    }
}

/// One task's cgroup.
#[derive(Clone, Debug)]
pub struct TaskCgroup {
    pub dir: PathBuf,
    /// Its path as `/proc/PID/cgroup` shows it (`/keling/task-...`).
    rel: OsString,
    /// `cgroup.freeze`, opened once (at creation, or at the first freeze): a
    /// freeze or thaw is then one `pwrite`, with no path walk, allocation or
    /// kernfs open and release on the actuation path.
    freeze: Arc<OnceLock<fs::File>>,
}

/// What `cgroup.events` says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    pub populated: bool,
    pub frozen: bool,
}

impl TaskCgroup {
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn events_file(&self) -> PathBuf {
        self.dir.join("cgroup.events")
    }

    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn freeze_file(&self) -> anyhow::Result<&fs::File> {
        if let Some(f) = self.freeze.get() {
            return Ok(f);
        }
        let path = self.dir.join("cgroup.freeze");
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        Ok(self.freeze.get_or_init(|| f))
    }

    pub fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        use std::os::unix::fs::FileExt;
        let value: &[u8] = if frozen { b"1" } else { b"0" };
        self.freeze_file()?
            .write_at(value, 0)
            .with_context(|| format!("write {}/cgroup.freeze", self.dir.display()))
            .and_then(|n| match n {
                1 => Ok(()),
                _ => bail!("short write to {}/cgroup.freeze", self.dir.display()),
            })
    }

    pub fn kill(&self) -> anyhow::Result<()> {
        fs::write(self.dir.join("cgroup.kill"), "1")
            .with_context(|| format!("write {}/cgroup.kill", self.dir.display()))
    }

    /// Whether `pid` is in this cgroup now.
    pub fn holds(&self, pid: u32) -> bool {
        self.contains(pid)
    }

    /// Whether `pid` is in this cgroup now.
    fn contains(&self, pid: u32) -> bool {
        crate::os::proc::in_cgroup(pid, self.rel.as_bytes())
    }

    /// The processes in the cgroup, each by a pidfd opened while it was in it.
    pub fn members(&self) -> Vec<Pidfd> {
        self.pids()
            .into_iter()
            .filter_map(|pid| {
                let p = Pidfd::open(pid).ok()?;
                // Checked after the open: if the pid was reused in between, the
                // process held is not in our cgroup and is left alone.
                p.read_proc(|pid| self.contains(pid).then_some(()))?;
                Some(p)
            })
            .collect()
    }

    /// Sends `signal` to every process in the cgroup (through pidfds); returns
    /// how many it reached.
    pub fn signal(&self, signal: i32) -> usize {
        self.members()
            .iter()
            .filter(|p| p.signal(signal).is_ok())
            .count()
    }

    /// What `cgroup.events` says now.
    pub fn events(&self) -> anyhow::Result<Events> {
        let text = fs::read_to_string(self.events_file())
            .with_context(|| format!("read {}", self.events_file().display()))?;
        Ok(parse_events(&text))
    }

    /// Waits until `done(events)` holds (POLLPRI on `cgroup.events`), or
    /// `timeout` passes. Returns whether it held. Blocks.
    pub fn wait_events(&self, timeout: Duration, done: impl Fn(Events) -> bool) -> bool {
        let Ok(mut file) = fs::File::open(self.events_file()) else {
            return false; // gone
        };
        let deadline = Instant::now() + timeout;
        loop {
            match read_events(&mut file) {
                Ok(e) if done(e) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            poll_pri(&file, left);
        }
    }

    /// Removes the cgroup once it is empty (thawing it first so nothing stays frozen).
    pub fn remove(&self) -> anyhow::Result<()> {
        let _ = self.set_frozen(false);
        if !self.pids().is_empty() {
            bail!("{} still has processes", self.dir.display());
        }
        fs::remove_dir(&self.dir).with_context(|| format!("remove {}", self.dir.display()))
    }

    /// Kills whatever is left in it, waits (at most `timeout`) for it to empty,
    /// and removes it. Blocks.
    pub fn kill_and_remove(&self, timeout: Duration) -> anyhow::Result<()> {
        if !self.dir.exists() {
            return Ok(());
        }
        let _ = self.set_frozen(false);
        if !self.pids().is_empty() {
            self.kill()?;
            self.wait_events(timeout, |e| !e.populated);
        }
        // rmdir can race the last exit by a moment.
        let deadline = Instant::now() + timeout;
        loop {
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("remove {}", self.dir.display()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }
}

/// Reads `cgroup.events` through an open file from its start (which also re-arms
/// its POLLPRI notification).
pub fn read_events(file: &mut fs::File) -> std::io::Result<Events> {
    let mut text = String::new();
    file.rewind()?;
    file.read_to_string(&mut text)?;
    Ok(parse_events(&text))
}

/// Waits for POLLPRI (kernfs's change notification) on `file`, at most `timeout`.
pub fn poll_pri(file: &fs::File, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

pub fn parse_events(text: &str) -> Events {
    let mut e = Events::default();
    for l in text.lines() {
        match l.trim() {
            "frozen 1" => e.frozen = true,
            "populated 1" => e.populated = true,
            _ => {}
        }
    }
    e
}

/// Where the agent lists the processes it has stopped with SIGSTOP (tasks it did
/// not launch), so that whoever outlives it can continue them: one `PID START`
/// line each, START being the process's start time in clock ticks (a pid alone
/// may have been reused by the time the list is read).
pub fn stopped_list_path() -> PathBuf {
    crate::instance::current().stopped_list()
}

/// A process Keling stopped: its pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StoppedProcess {
    pub pid: u32,
    pub start_ticks: u64,
}

/// Replaces the list of processes Keling has stopped.
pub fn write_stopped(list: &[StoppedProcess]) -> anyhow::Result<()> {
    write_stopped_at(&stopped_list_path(), list)
}

fn write_stopped_at(path: &Path, list: &[StoppedProcess]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let text: String = list
        .iter()
        .map(|p| format!("{} {}\n", p.pid, p.start_ticks))
        .collect();
    let tmp = path.with_extension("tmp");
    // Never through a link someone left at the temporary name.
    std::io::Write::write_all(
        &mut crate::os::files::open_for_writing(&tmp, crate::os::files::Write::Truncate)?,
        text.as_bytes(),
    )?;
    fs::rename(&tmp, path)?;
    Ok(())
}

fn parse_stopped(text: &str) -> Vec<StoppedProcess> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some(StoppedProcess {
                pid: w.next()?.parse().ok()?,
                start_ticks: w.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// SIGCONT to a listed process, only if it is still the one that was listed.
fn continue_listed(p: StoppedProcess) -> bool {
    let Ok(pidfd) = Pidfd::open(p.pid) else {
        return false;
    };
    let same = pidfd
        .read_proc(proc::start_ticks)
        .is_some_and(|t| t == p.start_ticks);
    same && pidfd.signal(libc::SIGCONT).is_ok()
}

/// Continues every process on the stopped list at `path` that is still the one
/// listed, and removes the list. Returns how many it continued.
fn continue_stopped_at(path: &Path) -> usize {
    let Ok(text) = fs::read_to_string(path) else {
        return 0;
    };
    let n = parse_stopped(&text)
        .into_iter()
        .filter(|&p| continue_listed(p))
        .count();
    let _ = fs::remove_file(path);
    n
}

impl TaskCgroup {
    /// Puts back the threads an agent raised for a freeze of this cgroup and
    /// recorded before it died or stalled ([`super::boost`]), before anything
    /// thaws them. Returns how many.
    fn undo_boost(&self) -> usize {
        super::boost::undo_recorded(
            &super::boost::record_path(&super::boost::record_dir(), &self.dir),
            |tid| self.contains(tid),
        )
    }
}

/// Thaws every cgroup under Keling's root, continues every process in them (a
/// freeze escalated to SIGSTOP) and every process on the stopped list, having put
/// back first whatever threads a freeze boost left raised. Returns how many it
/// thawed or continued. Never creates anything; safe to run at any time.
pub fn thaw_all() -> usize {
    let mut n = 0;
    if let Some(root) = CgroupRoot::existing() {
        for cg in root.tasks() {
            let unboosted = cg.undo_boost();
            if unboosted > 0 {
                eprintln!(
                    "keling: put back {unboosted} thread(s) of {} that a freeze boost had \
                     raised to the real-time class",
                    cg.dir.display()
                );
            }
            if cg.set_frozen(false).is_ok() && !cg.pids().is_empty() {
                n += 1;
            }
            // A freeze escalated to SIGSTOP: continue those too.
            cg.signal(libc::SIGCONT);
        }
    }
    n + continue_stopped_at(&stopped_list_path())
}

/// What [`clean_leftovers`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Task cgroups thawed and removed (they were empty).
    pub removed: usize,
    /// Task cgroups that still hold processes (tasks of an earlier agent, still
    /// running): thawed and left alone.
    pub still_running: usize,
    /// Processes on the stopped list that were continued.
    pub continued: usize,
    /// Threads a freeze boost had left in the real-time class, put back.
    pub unboosted: usize,
}

/// What earlier runs left: puts back threads a freeze boost left raised, thaws
/// everything, removes the empty task cgroups, the boost records and the stopped
/// list. For the agent's start (it holds the instance lock, so no other agent's
/// tasks are in flight).
pub fn clean_leftovers() -> Leftovers {
    let mut out = Leftovers::default();
    if let Some(root) = CgroupRoot::existing() {
        for cg in root.tasks() {
            out.unboosted += cg.undo_boost();
            let _ = cg.set_frozen(false);
            if cg.pids().is_empty() {
                if fs::remove_dir(&cg.dir).is_ok() {
                    out.removed += 1;
                }
            } else {
                cg.signal(libc::SIGCONT);
                out.still_running += 1;
            }
        }
    }
    super::boost::remove_records(&super::boost::record_dir());
    out.continued = continue_stopped_at(&stopped_list_path());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cgroup_events() {
        let e = parse_events("populated 1\nfrozen 1\n");
        assert!(e.frozen && e.populated);
        let e = parse_events("populated 0\nfrozen 0\n");
        assert!(!e.frozen && !e.populated);
        assert_eq!(parse_events(""), Events::default());
    }

    /// Removes a test's cgroup (and its task cgroup) however the test ends.
    struct Remove(PathBuf);

    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = fs::remove_dir(self.0.join("t"));
            let _ = fs::remove_dir(&self.0);
        }
    }

    /// As root, on a real cgroup: the agent's root goes at its stop only when no
    /// task cgroup is left in it, and a task made after another agent removed it
    /// makes it again.
    #[test]
    fn the_root_goes_when_empty_and_comes_back_for_a_new_task() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: not root (needs a cgroup)");
            return;
        }
        let Ok(mount) = cgroup2_mount() else {
            eprintln!("skipping: no cgroup v2 hierarchy");
            return;
        };
        let root = CgroupRoot {
            dir: mount.join(format!("keling-unit-root-{}", std::process::id())),
            mount,
        };
        let _remove = Remove(root.dir.clone());
        root.make().unwrap();
        root.make().unwrap(); // there already: fine
        let task = root.create_task("t").unwrap();
        root.remove_if_empty();
        assert!(task.dir.is_dir(), "a task cgroup keeps the root");
        task.remove().unwrap();
        root.remove_if_empty();
        assert!(!root.dir.exists(), "the empty root is removed");
        let again = root.create_task("t").unwrap();
        assert!(again.dir.is_dir(), "the root is made again for a new task");
        again.remove().unwrap();
        root.remove_if_empty();
        assert!(!root.dir.exists());
    }

    #[test]
    fn the_stopped_list_continues_only_the_processes_listed() {
        let dir = std::env::temp_dir().join(format!("keling-stopped-{}", std::process::id()));
        let path = dir.join("stopped");
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let pid = child.id();
        // SAFETY: stopping our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let state = || proc::stat(pid).unwrap().state;
        while state() != 'T' {
            std::thread::sleep(Duration::from_millis(1));
        }
        let start = proc::start_ticks(pid).unwrap();
        // The same pid with another start time is another process: left alone.
        write_stopped_at(
            &path,
            &[StoppedProcess {
                pid,
                start_ticks: start + 1,
            }],
        )
        .unwrap();
        assert_eq!(continue_stopped_at(&path), 0);
        assert_eq!(state(), 'T');
        assert!(!path.exists(), "the list is consumed");
        write_stopped_at(
            &path,
            &[StoppedProcess {
                pid,
                start_ticks: start,
            }],
        )
        .unwrap();
        assert_eq!(parse_stopped(&fs::read_to_string(&path).unwrap()).len(), 1);
        assert_eq!(continue_stopped_at(&path), 1);
        while state() == 'T' {
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
