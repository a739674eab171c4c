//! Agent instances: several agents on one host, each with its own cgroup root,
//! run directory (stopped list, boost records, task records), control socket and
//! lock, so that one never touches what another froze. `--instance NAME` names
//! one on every command that talks to an agent; without it, the default instance
//! keeps the paths Keling always had (`<cgroup2>/keling`, `/run/keling`).
//!
//! The instance is chosen once per process, at the start of `main`
//! ([`select`]); everything that derives a path asks [`current`].
use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// Where the default instance keeps its files.
pub const RUN_DIR: &str = "/run/keling";
/// The default instance's cgroup, under the cgroup2 mount.
pub const CGROUP_NAME: &str = "keling";
/// The longest instance name.
pub const NAME_MAX: usize = 32;
/// Names that are files of the default instance's run directory, so no
/// instance's directory can be one of them.
const RESERVED: &[&str] = &["boosted", "stopped", "tasks", "keling.sock", "keling.lock"];

/// One agent instance: the default one, or a named one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    name: Option<String>,
}

/// Checks an instance name: 1 to [`NAME_MAX`] of `[A-Za-z0-9_-]`, starting with a
/// letter or digit, and not one of the default instance's own file names.
pub fn parse_name(s: &str) -> Result<String, String> {
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if s.is_empty() || s.len() > NAME_MAX || !ok_chars {
        return Err(format!(
            "{s:?}: an instance name is 1 to {NAME_MAX} letters, digits, `_` or `-`"
        ));
    }
    if !s.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(format!(
            "{s:?}: an instance name starts with a letter or a digit"
        ));
    }
    if RESERVED.contains(&s) {
        return Err(format!(
            "{s:?}: reserved (a file of the default instance in {RUN_DIR}); choose another name"
        ));
    }
    Ok(s.to_owned())
}

impl Instance {
    /// The default instance, or the one named `name` (checked).
    pub fn new(name: Option<&str>) -> Result<Self, String> {
        Ok(Self {
            name: name.map(parse_name).transpose()?,
        })
    }

    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `/run/keling`, or `/run/keling/NAME`.
    pub fn run_dir(&self) -> PathBuf {
        let base = Path::new(RUN_DIR);
        match &self.name {
            None => base.to_owned(),
            Some(n) => base.join(n),
        }
    }

    /// The name of the instance's cgroup root under the cgroup2 mount: `keling`,
    /// or `keling-NAME` (beside it, not in it: every directory in `keling` is a
    /// task's cgroup).
    pub fn cgroup_name(&self) -> String {
        match &self.name {
            None => CGROUP_NAME.to_owned(),
            Some(n) => format!("{CGROUP_NAME}-{n}"),
        }
    }

    /// The control socket's default path.
    pub fn socket(&self) -> PathBuf {
        self.run_dir().join("keling.sock")
    }

    /// The one-agent lock's default path.
    pub fn lock(&self) -> PathBuf {
        self.run_dir().join("keling.lock")
    }

    /// The list of processes the agent stopped with SIGSTOP.
    pub fn stopped_list(&self) -> PathBuf {
        self.run_dir().join("stopped")
    }

    /// The freeze boost's records.
    pub fn boost_dir(&self) -> PathBuf {
        self.run_dir().join("boosted")
    }

    /// The launched tasks' records (for the next agent to adopt them).
    pub fn task_dir(&self) -> PathBuf {
        self.run_dir().join("tasks")
    }

    /// Where the GPU memory books' maps are pinned across a restart:
    /// `/sys/fs/bpf/keling`, or `/sys/fs/bpf/keling-NAME` (`bpf::pin`).
    pub fn bpf_dir(&self) -> PathBuf {
        Path::new(crate::bpf::pin::BPFFS).join(self.cgroup_name())
    }

    /// The arguments that name this instance to another `keling` command.
    pub fn args(&self) -> Vec<String> {
        match &self.name {
            None => Vec::new(),
            Some(n) => vec!["--instance".into(), n.clone()],
        }
    }
}

static CURRENT: OnceLock<Instance> = OnceLock::new();

/// Chooses this process's instance (once, at the start; a second call is ignored
/// if it names the same one, and refused otherwise).
pub fn select(instance: Instance) -> Result<(), String> {
    let chosen = CURRENT.get_or_init(|| instance.clone());
    if *chosen == instance {
        Ok(())
    } else {
        Err(format!(
            "instance {:?} chosen already, not {:?}",
            chosen.name(),
            instance.name()
        ))
    }
}

/// This process's instance (the default one unless [`select`] chose another).
pub fn current() -> &'static Instance {
    CURRENT.get_or_init(Instance::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_instance_keeps_the_old_paths() {
        let d = Instance::default();
        assert_eq!(d.run_dir(), Path::new("/run/keling"));
        assert_eq!(d.cgroup_name(), "keling");
        assert_eq!(d.socket(), Path::new("/run/keling/keling.sock"));
        assert_eq!(d.lock(), Path::new("/run/keling/keling.lock"));
        assert_eq!(d.stopped_list(), Path::new("/run/keling/stopped"));
        assert_eq!(d.boost_dir(), Path::new("/run/keling/boosted"));
        assert_eq!(d.socket(), Path::new(crate::control::DEFAULT_SOCKET));
        assert_eq!(d.lock(), Path::new(crate::defaults::LOCK_FILE));
        assert!(d.args().is_empty());
    }

    #[test]
    fn a_named_instance_has_its_own_paths_and_cgroup_root() {
        let i = Instance::new(Some("gpu-a_2")).unwrap();
        assert_eq!(i.run_dir(), Path::new("/run/keling/gpu-a_2"));
        assert_eq!(i.cgroup_name(), "keling-gpu-a_2");
        assert_eq!(i.socket(), Path::new("/run/keling/gpu-a_2/keling.sock"));
        assert_eq!(i.lock(), Path::new("/run/keling/gpu-a_2/keling.lock"));
        assert_eq!(i.stopped_list(), Path::new("/run/keling/gpu-a_2/stopped"));
        assert_eq!(i.boost_dir(), Path::new("/run/keling/gpu-a_2/boosted"));
        assert_eq!(i.task_dir(), Path::new("/run/keling/gpu-a_2/tasks"));
        assert_eq!(i.args(), ["--instance", "gpu-a_2"]);
        // Nothing of one instance is a path of another.
        let d = Instance::default();
        let j = Instance::new(Some("b")).unwrap();
        for (x, y) in [(&i, &d), (&i, &j), (&j, &d)] {
            assert_ne!(x.cgroup_name(), y.cgroup_name());
            for p in [
                x.socket(),
                x.lock(),
                x.stopped_list(),
                x.boost_dir(),
                x.task_dir(),
            ] {
                for q in [
                    y.socket(),
                    y.lock(),
                    y.stopped_list(),
                    y.boost_dir(),
                    y.task_dir(),
                ] {
                    assert!(!p.starts_with(&q) && !q.starts_with(&p), "{p:?} {q:?}");
                }
            }
        }
    }

    #[test]
    fn instance_names_are_short_plain_words() {
        for bad in [
            "",
            "a/b",
            "..",
            ".",
            "a b",
            "a.b",
            "-a",
            "_a",
            "boosted",
            "stopped",
            "tasks",
            "keling.sock",
            "é",
            "a\n",
        ] {
            assert!(parse_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_name(&"a".repeat(NAME_MAX + 1)).is_err());
        assert!(parse_name(&"a".repeat(NAME_MAX)).is_ok());
        for good in ["a", "A1", "slurm-job_42", "0"] {
            assert_eq!(parse_name(good).unwrap(), good);
        }
    }
}
