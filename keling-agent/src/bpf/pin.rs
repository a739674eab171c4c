//! The GPU memory books across an agent restart: the kernel maps that hold them
//! are pinned in bpffs per instance (`/sys/fs/bpf/keling`, or
//! `/sys/fs/bpf/keling-NAME`), under a directory named after the eBPF object
//! (`obj-HASH`: only the same object's maps have the layouts its programs
//! expect), and the next agent's programs are loaded onto them.
//!
//! Only the maps are kept, not the programs' links: while no agent runs nothing
//! is counted, so a task taken back has its figure marked unsure
//! (`sched::daemon::restart`). The books are reused only when the agent starts
//! with tasks to take back (records of an earlier run); otherwise the pins are
//! removed and the maps start empty. An agent that stops with no launched task
//! running removes them ([`Pins::remove`]); one that stops while tasks run (a
//! restart, an upgrade) keeps them for the next.
//!
//! Where no bpf filesystem is mounted on `/sys/fs/bpf`, the agent mounts one and
//! marks it as Keling's (an empty directory [`MOUNTED_MARK`] in it); an agent
//! that removes its pins at a clean stop unmounts a filesystem so marked when
//! nothing of anyone's is pinned there any more (only the kernel's own
//! `maps.debug` and `progs.debug` are left), so the host is left as it was found.
//!
//! The directory is hostile input like any other: it must be a directory (not a
//! link) of this process's uid that nobody else can write, on a bpf filesystem;
//! otherwise nothing is pinned (the agent runs, and a restart loses the books).
use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use keling_common::{
    MAP_CLIENTS, MAP_FILES, MAP_MEMS, MAP_OBJECTS, MAP_PROC_FDS, MAP_TABLE_FULL_PID, MAP_TOTALS,
    MAP_UNDECODED_PID,
};

/// Where bpffs is mounted.
pub const BPFFS: &str = "/sys/fs/bpf";
/// A directory in bpffs's root that says Keling mounted it (no instance's
/// directory is named so: those are `keling` and `keling-NAME`; bpffs refuses
/// names with a dot).
pub const MOUNTED_MARK: &str = "keling_mounted";
/// What the kernel itself puts in a fresh bpffs (the preloaded iterators).
const KERNELS_OWN: &[&str] = &["maps.debug", "progs.debug"];
/// The bpf filesystem's magic (`statfs`).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The maps that hold the GPU memory books (per process and open file: fds,
/// files, clients, objects, memory, totals, and which figures are unsure).
pub const PINNED: &[&str] = &[
    MAP_PROC_FDS,
    MAP_FILES,
    MAP_CLIENTS,
    MAP_OBJECTS,
    MAP_MEMS,
    MAP_TOTALS,
    MAP_TABLE_FULL_PID,
    MAP_UNDECODED_PID,
];

/// Where this run's maps are pinned, and whether an earlier run's were found.
#[derive(Debug)]
pub struct Pins {
    /// The instance's directory (`/sys/fs/bpf/keling[-NAME]`).
    base: PathBuf,
    /// The bpf filesystem it is on (`/sys/fs/bpf`).
    root: PathBuf,
    /// This object's (`base/obj-HASH`).
    pub dir: PathBuf,
    /// The maps there were an earlier agent's: the books go on.
    pub reused: bool,
}

/// FNV-1a, 64 bits: names the object's directory (stable across builds of the
/// same object, unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether `path` is on a bpf filesystem.
fn on_bpffs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out buffer; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Mounts a bpf filesystem on `root` (where systemd mounts one at boot on most
/// hosts; this one had none): only on an existing directory (not a link) of
/// this uid that nobody else can write.
fn mount_bpffs(root: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let missing = || {
        anyhow::anyhow!(
            "{} is not a bpf filesystem and cannot be made one (mount one: `mount -t bpf bpf {}`)",
            root.display(),
            root.display()
        )
    };
    check_dir(root).map_err(|e| missing().context(e))?;
    let c = std::ffi::CString::new(root.as_os_str().as_bytes()).map_err(|_| missing())?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c.as_ptr(),
            c"bpf".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if r != 0 || !on_bpffs(root) {
        return Err(missing().context(std::io::Error::last_os_error()));
    }
    log::info!(
        "mounted a bpf filesystem on {} (there was none) to keep the GPU memory books across \
         a restart",
        root.display()
    );
    Ok(())
}

/// Checks that `dir` is a directory (not a link) of this uid that nobody else
/// can write.
fn check_dir(dir: &Path) -> anyhow::Result<()> {
    let m = fs::symlink_metadata(dir).with_context(|| format!("{}", dir.display()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        bail!(
            "{} is not a directory of uid {me} that only it can write (uid {}, mode {:o})",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        );
    }
    Ok(())
}

/// Makes `dir` (mode 0700) unless it is there, and checks it.
fn make_dir(dir: &Path) -> anyhow::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("create {}", dir.display())),
    }
    check_dir(dir)
}

impl Pins {
    /// Prepares the pins of `object`'s maps under `base` (the instance's
    /// directory in bpffs). With `keep` (tasks of an earlier run are to be taken
    /// back) an earlier run's maps of the same object are reused; anything else
    /// there (another object's, or without `keep`) is removed first.
    pub fn prepare(base: &Path, object: &[u8], keep: bool) -> anyhow::Result<Self> {
        let root = base.parent().unwrap_or(Path::new(BPFFS));
        if !on_bpffs(root) {
            mount_bpffs(root)?;
            if let Err(e) = fs::create_dir(root.join(MOUNTED_MARK)) {
                log::warn!(
                    "cannot mark {} as mounted by Keling ({e}): it stays mounted after the agent",
                    root.display()
                );
            }
        }
        let pins = Self::prepare_on(root, base, object, keep);
        if pins.is_err() {
            unmount_if_unused(root);
        }
        pins
    }

    fn prepare_on(root: &Path, base: &Path, object: &[u8], keep: bool) -> anyhow::Result<Self> {
        make_dir(base)?;
        let name = format!("obj-{:016x}", fnv1a(object));
        let dir = base.join(&name);
        for e in fs::read_dir(base)?.flatten() {
            if e.file_name() != name.as_str() || !keep {
                remove_tree(&e.path());
            }
        }
        let complete = PINNED
            .iter()
            .all(|m| fs::symlink_metadata(dir.join(m)).is_ok_and(|md| md.file_type().is_file()));
        if !complete {
            // Some missing (a start that failed half-way): all start afresh.
            remove_tree(&dir);
        }
        make_dir(&dir)?;
        Ok(Self {
            base: base.to_owned(),
            root: root.to_owned(),
            dir,
            reused: complete,
        })
    }

    /// Where map `name` is pinned.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Removes the pins (the agent stops and no task of it runs on): the maps go
    /// with the last program or fd that holds them. Unmounts the bpf filesystem
    /// if Keling mounted it and nothing else is pinned there.
    pub fn remove(&self) {
        remove_tree(&self.base);
        unmount_if_unused(&self.root);
    }
}

/// Unmounts the bpf filesystem on `root` if Keling mounted it ([`MOUNTED_MARK`])
/// and nobody pins anything there any more; says why not otherwise.
fn unmount_if_unused(root: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let mark = root.join(MOUNTED_MARK);
    if !on_bpffs(root) || !fs::symlink_metadata(&mark).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let others: Vec<String> = match fs::read_dir(root) {
        Ok(d) => d
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != MOUNTED_MARK && !KERNELS_OWN.contains(&n.as_str()))
            .collect(),
        Err(e) => {
            log::warn!(
                "{}: {e}: the bpf filesystem Keling mounted stays",
                root.display()
            );
            return;
        }
    };
    if !others.is_empty() {
        log::info!(
            "the bpf filesystem Keling mounted on {} stays: {} pinned there",
            root.display(),
            others.join(", ")
        );
        return;
    }
    let _ = fs::remove_dir(&mark);
    let Ok(c) = std::ffi::CString::new(root.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
        let e = std::io::Error::last_os_error();
        // Marked again, so that a later agent unmounts it.
        let _ = fs::create_dir(&mark);
        log::warn!(
            "cannot unmount the bpf filesystem Keling mounted on {} ({e}): unmount it with \
             `umount {}`",
            root.display(),
            root.display()
        );
        return;
    }
    log::info!(
        "unmounted the bpf filesystem Keling mounted on {}",
        root.display()
    );
}

/// Removes a directory of pins (or one pin), not following links.
fn remove_tree(path: &Path) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            if let Ok(entries) = fs::read_dir(path) {
                for e in entries.flatten() {
                    remove_tree(&e.path());
                }
            }
            let _ = fs::remove_dir(path);
        }
        Ok(_) => {
            let _ = fs::remove_file(path);
        }
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_name_is_stable_and_tells_objects_apart() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a(b"object one"), fnv1a(b"object two"));
    }

    #[test]
    fn pins_go_only_on_a_bpf_filesystem() {
        let dir = std::env::temp_dir().join(format!("keling-pins-{}", std::process::id()));
        let err = Pins::prepare(&dir.join("keling"), b"x", true).unwrap_err();
        assert!(
            format!("{err:#}").contains("not a bpf filesystem"),
            "{err:#}"
        );
        assert!(!dir.exists(), "nothing made");
    }
}
