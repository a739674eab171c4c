//! What every root integration test starts with: the checks that decide whether it
//! can run here (the first that fails is recorded by [`skip`](crate::skip), which
//! `cargo xtask test` counts), a fresh directory, the simulated driver when the
//! test drives one, and, for the scheduler's tests, the lock that runs them one at
//! a time.
//!
//! ```no_run
//! use keling_tests::{Fixture, agent::Agent};
//!
//! let Some(fx) = Fixture::scheduler("equal_priorities_take_turns", &["--gpus", "1"]) else {
//!     return; // skipped, and recorded as such
//! };
//! let agent = Agent::start(fx.sim(), &[]);
//! let progress = fx.dir.join("a");
//! ```
//!
//! | constructor            | checks                | one at a time | simulator        |
//! |------------------------|-----------------------|---------------|------------------|
//! | [`Fixture::new`]       | root (eBPF)           | no            | none             |
//! | [`Fixture::gpu`]       | root, FUSE            | no            | mounted (`args`) |
//! | [`Fixture::scheduler`] | root, FUSE, cgroup v2 | yes           | mounted (`args`) |
//!
//! Anything else is built with [`Fixture::needs`]: `.fuse()`, `.cgroups()`,
//! `.check(f)`, `.sim(args)`, then `.ready()`.
use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
};

use crate::{Nvsim, agent::cgroup2, can_load_ebpf, can_use_fuse, skip, tempdir};

/// The scheduler's tests share the host's cgroup tree and the one-agent lock, so
/// the tests of one binary that ask for cgroups run one at a time. (Each test
/// binary has its own copy of this lock; cargo runs the binaries one after another.)
static SERIAL: Mutex<()> = Mutex::new(());

/// A test that can run here, and what it was given. Dropped at the end of the test
/// (declare it first, so that it goes last): the simulator is unmounted, the
/// directory removed, then the lock let go.
pub struct Fixture {
    /// The test's name, for its own [`skip`] records.
    pub name: &'static str,
    /// A fresh directory for the test's files.
    pub dir: PathBuf,
    sim: Option<Nvsim>,
    _serial: Option<MutexGuard<'static, ()>>,
}

/// What a test needs before it can start; [`Needs::ready`] checks it.
#[must_use = "nothing is checked until ready()"]
pub struct Needs {
    name: &'static str,
    fuse: bool,
    cgroups: bool,
    checks: Vec<fn(&str) -> bool>,
    sim: Option<Vec<String>>,
}

impl Fixture {
    /// A test that loads eBPF programs (root), with a fresh directory.
    pub fn new(name: &'static str) -> Option<Fixture> {
        Fixture::needs(name).ready()
    }

    /// A test of the GPU side: also FUSE, and the simulated driver mounted with
    /// `sim_args` (e.g. `["--gpus", "2"]`).
    pub fn gpu(name: &'static str, sim_args: &[&str]) -> Option<Fixture> {
        Fixture::needs(name).sim(sim_args).ready()
    }

    /// A scheduler test (`keling run`): also cgroup v2, one test at a time, and the
    /// simulated driver mounted with `sim_args`.
    pub fn scheduler(name: &'static str, sim_args: &[&str]) -> Option<Fixture> {
        Fixture::needs(name).cgroups().sim(sim_args).ready()
    }

    /// Anything else: root, and what the builder adds.
    pub fn needs(name: &'static str) -> Needs {
        Needs {
            name,
            fuse: false,
            cgroups: false,
            checks: Vec::new(),
            sim: None,
        }
    }

    /// The simulated driver; panics if the test did not ask for one.
    pub fn sim(&self) -> &Nvsim {
        self.sim
            .as_ref()
            .expect("this fixture mounted no simulator: ask with .sim(args)")
    }
}

impl Needs {
    /// FUSE (`/dev/fuse`), for a simulator the test mounts itself.
    pub fn fuse(mut self) -> Needs {
        self.fuse = true;
        self
    }

    /// What the scheduler's tests need: FUSE and a cgroup v2 hierarchy; and they
    /// run one at a time.
    pub fn cgroups(mut self) -> Needs {
        self.fuse = true;
        self.cgroups = true;
        self
    }

    /// One more precondition, checked after the others and before the simulator is
    /// mounted; it records its own skip (e.g. [`nvidia_userspace`](crate::nvidia_userspace)).
    pub fn check(mut self, check: fn(&str) -> bool) -> Needs {
        self.checks.push(check);
        self
    }

    /// The simulated driver, mounted with `args` (needs FUSE).
    pub fn sim(mut self, args: &[&str]) -> Needs {
        self.fuse = true;
        self.sim = Some(args.iter().map(|a| a.to_string()).collect());
        self
    }

    /// Checks, in order, root, FUSE, cgroup v2 and the extra checks, as asked; the
    /// first that fails records the skip and gives None. Otherwise takes the lock
    /// (for cgroups), makes the directory and mounts the simulator.
    pub fn ready(self) -> Option<Fixture> {
        // Taken before anything is looked at, as each test did on its own before.
        let serial = self
            .cgroups
            .then(|| SERIAL.lock().unwrap_or_else(|e| e.into_inner()));
        if !can_load_ebpf(self.name) || (self.fuse && !can_use_fuse(self.name)) {
            return None;
        }
        if self.cgroups && cgroup2().is_none() {
            skip(self.name, "no cgroup v2 hierarchy mounted");
            return None;
        }
        if !self.checks.iter().all(|check| check(self.name)) {
            return None;
        }
        let dir = tempdir();
        let sim = self.sim.map(|args| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Nvsim::mount(&args)
        });
        Some(Fixture {
            name: self.name,
            dir,
            sim,
            _serial: serial,
        })
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.sim.take());
        // Never descend into something still mounted under the directory (a test's
        // own simulator that failed to unmount): leave it all for a person to see.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounted_under(&mounts, &self.dir) {
            eprintln!(
                "{}: {} still has a mount under it; not removed",
                self.name,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether `/proc/self/mounts` (as `mounts`) lists a mount point at or under `dir`.
fn mounted_under(mounts: &str, dir: &Path) -> bool {
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .any(|m| Path::new(m).starts_with(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulator_or_cgroups_need_fuse() {
        let n = Fixture::needs("t");
        assert!(!n.fuse && !n.cgroups && n.sim.is_none());
        let n = Fixture::needs("t").sim(&["--gpus", "2"]);
        assert!(n.fuse && !n.cgroups);
        assert_eq!(
            n.sim.as_deref(),
            Some(&["--gpus".to_string(), "2".into()][..])
        );
        let n = Fixture::needs("t").cgroups();
        assert!(n.fuse && n.cgroups && n.sim.is_none());
    }

    #[test]
    fn drop_removes_the_directory_unless_something_is_mounted_under_it() {
        let dir = tempdir();
        std::fs::write(dir.join("progress"), "5").unwrap();
        drop(Fixture {
            name: "t",
            dir: dir.clone(),
            sim: None,
            _serial: None,
        });
        assert!(!dir.exists());
        let mounts = "proc /proc proc rw 0 0\n\
                      nvsim /tmp/keling-test-1-2/dev fuse.nvsim rw 0 0\n";
        assert!(mounted_under(mounts, Path::new("/tmp/keling-test-1-2")));
        assert!(!mounted_under(mounts, Path::new("/tmp/keling-test-1-20")));
        assert!(!mounted_under(mounts, Path::new("/tmp/keling-test-1-3")));
    }
}
