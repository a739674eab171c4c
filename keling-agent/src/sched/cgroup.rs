//! cgroup v2 actuators: one cgroup per launched task under `<cgroup2>/keling`, frozen,
//! thawed and killed through `cgroup.freeze` / `cgroup.kill`, and confirmed by
//! `cgroup.events` (`frozen 1`), which the kernel notifies with POLLPRI.
//!
//! Also the way back: [`thaw_all`] thaws every cgroup Keling made, which the
//! supervisor runs when the agent dies and `keling thaw --all` runs by hand.
use std::{
    fs,
    io::{Read, Seek},
    os::fd::AsRawFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// Keling's subtree of the cgroup v2 hierarchy.
#[derive(Clone, Debug)]
pub struct CgroupRoot {
    pub dir: PathBuf,
}

/// The cgroup v2 mount point, from /proc/self/mountinfo (here /sys/fs/cgroup/unified,
/// on most hosts /sys/fs/cgroup).
pub fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    crate::os::mounts::find("cgroup2")?.context(
        "no cgroup v2 hierarchy is mounted (cgroup2 in /proc/self/mountinfo); Keling freezes tasks through cgroup.freeze",
    )
}

impl CgroupRoot {
    /// `<cgroup2>/keling`, created if needed.
    pub fn open() -> anyhow::Result<Self> {
        let dir = cgroup2_mount()?.join("keling");
        if !dir.exists() {
            fs::create_dir(&dir).with_context(|| format!("create cgroup {}", dir.display()))?;
        }
        Ok(Self { dir })
    }

    /// Only if it exists (for `thaw --all` and the supervisor: never create).
    pub fn existing() -> Option<Self> {
        let dir = cgroup2_mount().ok()?.join("keling");
        dir.is_dir().then_some(Self { dir })
    }

    /// A fresh cgroup for one task.
    pub fn create_task(&self, name: &str) -> anyhow::Result<TaskCgroup> {
        let dir = self.dir.join(name);
        if dir.exists() {
            // Left by a previous run: it must be empty to be reused.
            let _ = fs::write(dir.join("cgroup.freeze"), "0");
            let _ = fs::remove_dir(&dir);
        }
        fs::create_dir(&dir).with_context(|| format!("create cgroup {}", dir.display()))?;
        Ok(TaskCgroup { dir })
    }

    /// The task cgroups under the root.
    pub fn tasks(&self) -> Vec<TaskCgroup> {
        fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(|e| {
                    let e = e.ok()?;
                    e.file_type()
                        .ok()?
                        .is_dir()
                        .then(|| TaskCgroup { dir: e.path() })
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
}

impl TaskCgroup {
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    pub fn set_frozen(&self, frozen: bool) -> anyhow::Result<()> {
        fs::write(
            self.dir.join("cgroup.freeze"),
            if frozen { "1" } else { "0" },
        )
        .with_context(|| format!("write {}/cgroup.freeze", self.dir.display()))
    }

    pub fn kill(&self) -> anyhow::Result<()> {
        fs::write(self.dir.join("cgroup.kill"), "1")
            .with_context(|| format!("write {}/cgroup.kill", self.dir.display()))
    }

    /// Sends `signal` to every process in the cgroup.
    pub fn signal(&self, signal: i32) {
        for pid in self.pids() {
            // SAFETY: kill(2) by pid on processes in our own cgroup.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Waits until cgroup.events says `frozen` is `want`, or `timeout` passes.
    /// Returns whether it was confirmed. Blocks: run it on a blocking thread.
    pub fn wait_frozen(&self, want: bool, timeout: Duration) -> anyhow::Result<bool> {
        let path = self.dir.join("cgroup.events");
        let mut file = fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let deadline = Instant::now() + timeout;
        let mut text = String::new();
        loop {
            text.clear();
            file.rewind()?;
            file.read_to_string(&mut text)?;
            if parse_events(&text).frozen == want {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // kernfs notifies changes of cgroup.events with POLLPRI.
            let mut pfd = libc::pollfd {
                fd: file.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, ms) };
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
}

struct Events {
    frozen: bool,
}

fn parse_events(text: &str) -> Events {
    let frozen = text.lines().any(|l| l.trim() == "frozen 1");
    Events { frozen }
}

/// Where the agent lists the processes it has stopped with SIGSTOP (tasks it did
/// not launch), so that whoever outlives it can continue them.
pub fn stopped_list_path() -> PathBuf {
    PathBuf::from("/run/keling/stopped")
}

/// Replaces the list of processes Keling has stopped.
pub fn write_stopped(pids: &[u32]) -> anyhow::Result<()> {
    let path = stopped_list_path();
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &path)?;
    Ok(())
}

/// Thaws every cgroup under Keling's root, continues every process in them (a
/// freeze escalated to SIGSTOP) and every process on the stopped list. Returns how
/// many it thawed or continued. Never creates anything; safe to run at any time.
pub fn thaw_all() -> usize {
    let mut n = 0;
    if let Some(root) = CgroupRoot::existing() {
        for cg in root.tasks() {
            if cg.set_frozen(false).is_ok() && !cg.pids().is_empty() {
                n += 1;
            }
            // A freeze escalated to SIGSTOP: continue those too.
            cg.signal(libc::SIGCONT);
        }
    }
    if let Ok(text) = fs::read_to_string(stopped_list_path()) {
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: SIGCONT to a process Keling stopped; harmless if it is gone.
            if unsafe { libc::kill(pid, libc::SIGCONT) } == 0 {
                n += 1;
            }
        }
        let _ = fs::remove_file(stopped_list_path());
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cgroup_events() {
        assert!(parse_events("populated 1\nfrozen 1\n").frozen);
        assert!(!parse_events("populated 1\nfrozen 0\n").frozen);
        assert!(!parse_events("").frozen);
    }
}
