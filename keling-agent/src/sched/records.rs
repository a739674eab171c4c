//! Task records: one small file per launched task in the instance's run
//! directory (`/run/keling[/NAME]/tasks/task-ID`), to be written when it is
//! launched and removed when it ends, so that an agent that starts while a
//! previous run's tasks still run can find them again: who owns each, its
//! priority, budget, GPU and limits, its root process (pid and start time: a pid
//! alone may have been reused) and its cgroup.
//!
//! Written when a launched task is placed (its command released to exec) and
//! removed when it ends ([`super::restart`] wires them in): an agent that starts
//! reads them, checks each against the kernel and takes the task back.
//!
//! A record is hostile input when it is read: the directory must be root's (the
//! agent's own uid) and writable by nobody else; each file is opened without
//! following a link, must be a regular file of at most [`RECORD_MAX`] bytes, must
//! parse exactly (unknown fields refused), must be named after its task id, and
//! its cgroup must be a task cgroup directly under the instance's root. Whatever
//! fails is refused with the reason and removed; a record that passes is then
//! checked against the kernel ([`TaskRecord::check_alive`]) before anything
//! trusts it.
use std::{
    fs,
    io::{Read, Write as _},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Component, Path, PathBuf},
};

use keling_sched::TaskSpec;
use serde::{Deserialize, Serialize};

/// The largest record read (a real one is a few hundred bytes).
pub const RECORD_MAX: u64 = 4096;
/// The record format's version.
pub const VERSION: u32 = 1;
/// The longest name kept.
const NAME_MAX: usize = 255;

/// One launched task, as the next agent needs it: its spec for the core (one
/// definition: [`TaskSpec`], with the GPU it was placed on), its root process's
/// start time, its cgroup and its owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRecord {
    pub version: u32,
    /// Its id, root pid, name, priority, GPU and limits.
    pub spec: TaskSpec,
    /// The root process's start time in clock ticks (`/proc/PID/stat`).
    pub start_ticks: u64,
    /// The task's cgroup directory.
    pub cgroup: PathBuf,
    /// Its owner (who may signal it and attach to it).
    pub uid: u32,
    /// The Slurm job step's task it is, for a task the Slurm plugin handed
    /// over: taken back without it, its memory would count as held outside
    /// Slurm's jobs (and drain the node) and its end would not reach the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<crate::control::SlurmRef>,
}

/// The file name of task `id`'s record.
fn file_name(id: u64) -> String {
    format!("task-{id}")
}

/// The task id a record's file name says, if it is one.
fn id_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("task-")?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Checks that `dir` is a directory (not a link) owned by this process's uid
/// and writable by nobody else.
fn check_dir(dir: &Path) -> Result<(), String> {
    let m = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is owned by uid {} with mode {:o}: task records are read only from a \
             directory of uid {me} that nobody else can write",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Writes `rec` into `dir` (made, mode 0700, if absent), atomically.
pub fn write(dir: &Path, rec: &TaskRecord) -> anyhow::Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    check_dir(dir).map_err(anyhow::Error::msg)?;
    let name = file_name(rec.spec.id);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = crate::os::files::open_for_writing(&tmp, crate::os::files::Write::Truncate)?;
    f.write_all(&serde_json::to_vec(rec)?)?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

/// Removes task `id`'s record (the task ended).
pub fn remove(dir: &Path, id: u64) {
    let _ = fs::remove_file(dir.join(file_name(id)));
}

/// Reads one record file: no link followed, a regular file, at most
/// [`RECORD_MAX`] bytes, exact JSON.
fn read_one(path: &Path) -> Result<TaskRecord, String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("open: {e}"))?;
    let m = f.metadata().map_err(|e| format!("stat: {e}"))?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    if m.len() > RECORD_MAX {
        return Err(format!("{} bytes, more than {RECORD_MAX}", m.len()));
    }
    let mut text = Vec::new();
    f.take(RECORD_MAX + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    if text.len() as u64 > RECORD_MAX {
        return Err(format!("more than {RECORD_MAX} bytes"));
    }
    serde_json::from_slice(&text).map_err(|e| format!("not a task record: {e}"))
}

impl TaskRecord {
    /// Checks what a record says against what any record must be: this format,
    /// its file's task id, a cgroup directly under `cgroup_root`, sane values.
    fn validate(&self, id: u64, cgroup_root: &Path) -> Result<(), String> {
        if self.version != VERSION {
            return Err(format!("version {}, not {VERSION}", self.version));
        }
        let spec = &self.spec;
        if spec.id != id || id == 0 {
            return Err(format!("task {} in the record of task {id}", spec.id));
        }
        if spec.pid <= 1 {
            return Err(format!("pid {}", spec.pid));
        }
        if spec.priority > super::launch::MAX_PRIORITY {
            return Err(format!("priority {}", spec.priority));
        }
        if spec.name.len() > NAME_MAX {
            return Err("too long a name".into());
        }
        let plain = self
            .cgroup
            .strip_prefix(cgroup_root)
            .ok()
            .map(|rel| rel.components().collect::<Vec<_>>())
            .is_some_and(|c| c.len() == 1 && matches!(c[0], Component::Normal(_)));
        if !plain {
            return Err(format!(
                "cgroup {} is not a task cgroup under {}",
                self.cgroup.display(),
                cgroup_root.display()
            ));
        }
        Ok(())
    }

    /// Whether the record's task still runs: its pid is the same process (same
    /// start time) and still in the record's cgroup (`cgroup_rel`: the path
    /// `/proc/PID/cgroup` shows for it).
    pub fn check_alive(&self, cgroup_rel: &[u8]) -> Result<(), String> {
        let pid = self.spec.pid;
        match crate::os::proc::start_ticks(pid) {
            None => Err(format!("pid {pid} is gone")),
            Some(t) if t != self.start_ticks => Err(format!(
                "pid {pid} is another process now (started at tick {t}, not {})",
                self.start_ticks
            )),
            Some(_) if !crate::os::proc::in_cgroup(pid, cgroup_rel) => Err(format!(
                "pid {pid} is no longer in {}",
                self.cgroup.display()
            )),
            Some(_) => Ok(()),
        }
    }
}

/// What [`read_all`] found: the records that passed, and what was refused (each
/// file's name and why; those files are removed).
#[derive(Debug, Default)]
pub struct Found {
    pub records: Vec<TaskRecord>,
    pub refused: Vec<(String, String)>,
}

/// Reads every record in `dir` (see the module's doc); a refused one is removed.
/// A `dir` that is not safe to read is refused whole (and left alone).
pub fn read_all(dir: &Path, cgroup_root: &Path) -> Found {
    let mut found = Found::default();
    if fs::symlink_metadata(dir).is_err() {
        return found;
    }
    if let Err(why) = check_dir(dir) {
        found.refused.push((dir.display().to_string(), why));
        return found;
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let outcome = match id_of(&name) {
            None => Err("not a task record's name".to_string()),
            Some(id) => read_one(&path).and_then(|r| r.validate(id, cgroup_root).map(|()| r)),
        };
        match outcome {
            Ok(r) => found.records.push(r),
            Err(why) => {
                let _ = fs::remove_file(&path);
                found.refused.push((name, why));
            }
        }
    }
    found.records.sort_by_key(|r| r.spec.id);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::SlurmRef;

    fn record(id: u64, root: &Path) -> TaskRecord {
        TaskRecord {
            version: VERSION,
            spec: TaskSpec {
                id,
                pid: 4242,
                name: "python".into(),
                priority: 10,
                gpu: Some(1),
                mem_quota_bytes: Some(1 << 30),
                max_duration_ms: Some(60_000),
                grace_ms: None,
                hard_kill: Some(false),
                expected_runtime_ms: None,
            },
            start_ticks: 77,
            cgroup: root.join(format!("task-{id}")),
            uid: 1000,
            slurm: (id % 2 == 1).then_some(SlurmRef {
                job: 12,
                step: SlurmRef::BATCH_STEP,
                task: 0,
            }),
        }
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "keling-records-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_record_written_is_read_back_the_same_and_removed_at_the_end() {
        let base = tempdir();
        let dir = base.join("tasks");
        let root = Path::new("/sys/fs/cgroup/keling");
        write(&dir, &record(7, root)).unwrap();
        write(&dir, &record(3, root)).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let found = read_all(&dir, root);
        assert!(found.refused.is_empty(), "{:?}", found.refused);
        assert_eq!(found.records, vec![record(3, root), record(7, root)]);
        remove(&dir, 7);
        assert_eq!(read_all(&dir, root).records, vec![record(3, root)]);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn hostile_records_are_refused_and_removed() {
        let base = tempdir();
        let dir = base.join("tasks");
        let root = Path::new("/sys/fs/cgroup/keling");
        write(&dir, &record(1, root)).unwrap();
        let put = |name: &str, text: &str| fs::write(dir.join(name), text).unwrap();
        // Another task's record under this name.
        put("task-2", &serde_json::to_string(&record(9, root)).unwrap());
        // A cgroup outside the root, or deeper, or `..`.
        for (n, cg) in [
            ("task-3", "/sys/fs/cgroup/other/task-3"),
            ("task-4", "/sys/fs/cgroup/keling/a/b"),
            ("task-5", "/sys/fs/cgroup/keling/.."),
        ] {
            let mut r = record(n[5..].parse().unwrap(), root);
            r.cgroup = cg.into();
            put(n, &serde_json::to_string(&r).unwrap());
        }
        put("task-6", "{\"version\": 1");
        let mut unknown: serde_json::Value = serde_json::to_value(record(7, root)).unwrap();
        unknown["extra"] = 1.into();
        put("task-7", &unknown.to_string());
        put("task-8", &" ".repeat(RECORD_MAX as usize + 1));
        let mut r = record(10, root);
        r.spec.priority = 200;
        put("task-10", &serde_json::to_string(&r).unwrap());
        put("junk", "x");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("task-11")).unwrap();
        fs::create_dir(dir.join("task-12")).unwrap();
        let found = read_all(&dir, root);
        assert_eq!(found.records, vec![record(1, root)]);
        let mut refused: Vec<&str> = found.refused.iter().map(|(n, _)| n.as_str()).collect();
        refused.sort();
        assert_eq!(
            refused,
            [
                "junk", "task-10", "task-11", "task-12", "task-2", "task-3", "task-4", "task-5",
                "task-6", "task-7", "task-8"
            ]
        );
        // Removed (the directory is left: it is not a file).
        assert!(!dir.join("task-2").exists() && fs::symlink_metadata(dir.join("task-11")).is_err());
        assert!(fs::metadata("/etc/passwd").is_ok());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_not_read() {
        let base = tempdir();
        let dir = base.join("tasks");
        let root = Path::new("/sys/fs/cgroup/keling");
        write(&dir, &record(1, root)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let found = read_all(&dir, root);
        assert!(found.records.is_empty());
        assert_eq!(found.refused.len(), 1, "{:?}", found.refused);
        assert!(
            dir.join("task-1").exists(),
            "an unsafe directory is left alone"
        );
        // Nor through a link to a directory.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(read_all(&link, root).records.is_empty());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_record_of_a_process_that_is_gone_or_another_is_stale() {
        let root = Path::new("/sys/fs/cgroup/keling");
        let mut r = record(1, root);
        // This process, with its real start time and cgroup: alive.
        let me = std::process::id();
        r.spec.pid = me;
        r.start_ticks = crate::os::proc::start_ticks(me).unwrap();
        let cg = fs::read(format!("/proc/{me}/cgroup")).unwrap();
        let rel = cg
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(b"0::"))
            .unwrap()
            .to_vec();
        assert_eq!(r.check_alive(&rel), Ok(()));
        // Another process under the same pid (another start time).
        r.start_ticks += 1;
        assert!(r.check_alive(&rel).unwrap_err().contains("another process"));
        r.start_ticks -= 1;
        // Moved out of its cgroup.
        assert!(
            r.check_alive(b"/elsewhere")
                .unwrap_err()
                .contains("no longer")
        );
        // Gone.
        r.spec.pid = u32::MAX - 1;
        assert!(r.check_alive(&rel).unwrap_err().contains("gone"));
    }
}
