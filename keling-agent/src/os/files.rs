//! Files the agent writes at paths it is given (`--sched-log`, `--input-log`,
//! `--histo-log`...). The agent runs as root and such a path may lie in a
//! directory others can write (/tmp): a symbolic link there, or a hard link,
//! could aim it at any file on the host, which root would then truncate or
//! append to. So the last component is never followed (O_NOFOLLOW), a regular
//! file with another name elsewhere (a hard link) is refused before anything is
//! written, and a FIFO without a reader is refused rather than waited on. The
//! error says why and what to do.
use std::{
    fs::{File, OpenOptions},
    io,
    os::{fd::AsRawFd, unix::fs::MetadataExt, unix::fs::OpenOptionsExt},
    path::Path,
};

/// How an existing file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Emptied first.
    Truncate,
    /// Appended to.
    Append,
}

/// Opens (creating it, mode 0666 less the umask, if absent) `path` for
/// writing, without following a link at its end; see the module's doc.
pub fn open_for_writing(path: &Path, how: Write) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .append(how == Write::Append)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::other(format!(
                "{} is a symbolic link: Keling does not write through one (whoever made it \
                 could aim it at any file root can write); give the path of the file itself",
                path.display()
            )),
            Some(libc::ENXIO) => io::Error::other(format!(
                "{} is a FIFO that nothing reads: start its reader first",
                path.display()
            )),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if meta.is_file() && meta.nlink() > 1 {
        return Err(io::Error::other(format!(
            "{} has {} hard links: Keling does not write a file that also has another name \
             (whoever linked it could aim it at any file root can write); remove it or give \
             another path",
            path.display(),
            meta.nlink()
        )));
    }
    // Blocking again (it was only so that opening a FIFO cannot hang).
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    if how == Write::Truncate && meta.is_file() {
        file.set_len(0)?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("keling-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Issue 32: `--sched-log` at a symlink truncated its target.
    #[test]
    fn a_symlink_is_refused_and_its_target_untouched() {
        let d = dir("symlink");
        let target = d.join("precious");
        std::fs::write(&target, "keep me\n").unwrap();
        let link = d.join("log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for how in [Write::Truncate, Write::Append] {
            let err = open_for_writing(&link, how).unwrap_err().to_string();
            assert!(err.contains("is a symbolic link"), "{err}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_hard_link_is_refused_and_untouched() {
        let d = dir("hardlink");
        let target = d.join("precious");
        std::fs::write(&target, "keep me\n").unwrap();
        let link = d.join("log");
        std::fs::hard_link(&target, &link).unwrap();
        let err = open_for_writing(&link, Write::Truncate)
            .unwrap_err()
            .to_string();
        assert!(err.contains("hard links"), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_plain_file_is_created_truncated_or_appended_to() {
        use std::io::Write as _;
        let d = dir("plain");
        let p = d.join("log");
        open_for_writing(&p, Write::Truncate)
            .unwrap()
            .write_all(b"one\n")
            .unwrap();
        open_for_writing(&p, Write::Append)
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
        open_for_writing(&p, Write::Truncate)
            .unwrap()
            .write_all(b"three\n")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "three\n");
        // Devices work as before (the tests' `--sched-log /dev/full`).
        open_for_writing(Path::new("/dev/null"), Write::Truncate).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
