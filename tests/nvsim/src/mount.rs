//! Mounting, unmounting and stale-mount detection for the FUSE server.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// An absolute, lexically normalized path that does not touch the
/// filesystem when `canonicalize` fails (a stale FUSE mount gives ENOTCONN).
pub fn absolute(dir: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(dir) {
        return c;
    }
    let base = if dir.is_absolute() {
        PathBuf::new()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
    };
    let mut out = PathBuf::from("/");
    for c in base.join(dir).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// `\040`-style octal escapes of `/proc/self/mountinfo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The filesystem type mounted exactly at `dir` (the topmost one), if any.
pub fn mounted_fstype(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let mut halves = line.splitn(2, " - ");
        let left: Vec<&str> = halves.next()?.split(' ').collect();
        let right = halves.next().unwrap_or("");
        if left.len() > 4 && unescape(left[4]) == want {
            found = right.split(' ').next().map(str::to_string);
        }
    }
    found
}

/// The (major, minor) device of the topmost mount exactly at `dir`.
pub fn mounted_dev(dir: &Path) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = dir.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 4 && unescape(f[4]) == want {
            let (ma, mi) = f[2].split_once(':')?;
            found = Some((ma.parse().ok()?, mi.parse().ok()?));
        }
    }
    found
}

/// True when the FUSE server of the mount at `dir` is gone (ENOTCONN).
pub fn server_gone(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid path and `st` a valid out buffer.
    let r = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st)
    };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// `umount2(dir, flags)`.
pub fn umount(dir: &Path, flags: i32) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens `/dev/fuse` and mounts it at `dir`; returns the device fd.
pub fn mount_fuse(dir: &Path) -> io::Result<OwnedFd> {
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/dev/fuse".as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let dev = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = CString::new(format!(
        "fd={fd},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions"
    ))?;
    let target = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let r = unsafe {
        libc::mount(
            c"keling-nvsim".as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// Unmounts (lazily) when dropped, so no exit path leaves a mount behind.
pub struct MountGuard {
    dir: PathBuf,
}

impl MountGuard {
    pub fn new(dir: PathBuf) -> Self {
        MountGuard { dir }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Err(e) = umount(&self.dir, libc::MNT_DETACH)
            && e.raw_os_error() != Some(libc::EINVAL)
        {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("nvsim: unmounting {}: {e}\n", self.dir.display()),
            );
        }
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP and returns a signalfd for them.
pub fn signal_fd() -> io::Result<OwnedFd> {
    // SAFETY: `set` is initialized by sigemptyset before use; the calls only
    // touch our own signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/x\\"), r"/x\\");
    }

    #[test]
    fn finds_the_root_mount_and_normalizes() {
        assert!(mounted_fstype(Path::new("/")).is_some());
        assert!(mounted_dev(Path::new("/")).is_some());
        assert_eq!(mounted_dev(Path::new("/definitely/not/mounted")), None);
        assert_eq!(mounted_fstype(Path::new("/definitely/not/mounted")), None);
        assert_eq!(
            absolute(Path::new("/nonexistent/a/../b/./c")),
            PathBuf::from("/nonexistent/b/c")
        );
    }
}
