//! One agent at a time: an exclusive `flock` on a file, held for the agent's life
//! (the kernel drops it however the agent ends, SIGKILL included). The file holds
//! the holder's pid, so a second agent can say who is running.
use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    pub path: PathBuf,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another keling agent{} holds {path}", holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Held { path: PathBuf, holder: Option<u32> },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl InstanceLock {
    /// Takes the lock at `path` without waiting (creating the file and its
    /// directory if needed); fails at once if another process holds it.
    pub fn acquire(path: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => io(std::io::Error::other(
                    "a symbolic link: Keling does not write through one (whoever made it could \
                     aim it at any file root can write); give the path of the file itself",
                )),
                _ => io(e),
            })?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Held {
                    path: path.to_owned(),
                    holder: text.trim().parse().ok(),
                });
            }
            return Err(io(e));
        }
        let pid = std::process::id();
        let wrote = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{pid}"));
        wrote.map_err(io)?;
        Ok(Self {
            _file: file,
            path: path.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_who_holds_it() {
        let dir = std::env::temp_dir().join(format!("keling-lock-{}", std::process::id()));
        let path = dir.join("sub/keling.lock");
        let first = InstanceLock::acquire(&path).unwrap();
        // flock locks belong to the open file: a second open in this process
        // conflicts just as another process's would.
        match InstanceLock::acquire(&path) {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        let again = InstanceLock::acquire(&path).unwrap();
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
