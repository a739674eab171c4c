//! Every way a process gets a device fd, and passing descriptors over a socket.
use super::*;

/// How a device file is opened by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpenWay {
    /// openat(AT_FDCWD, absolute path): what glibc's open() does.
    Openat,
    /// The raw open(2) system call.
    RawOpen,
    /// openat2(2).
    Openat2,
    /// chdir into the device directory, a relative path, chdir back.
    Relative,
    /// Through a symlink in a fresh temporary directory.
    Symlink,
}

pub(crate) const OPEN_WAYS: [OpenWay; 5] = [
    OpenWay::Openat,
    OpenWay::RawOpen,
    OpenWay::Openat2,
    OpenWay::Relative,
    OpenWay::Symlink,
];

/// How a second descriptor of an open file is made.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DupWay {
    Dup,
    Dup2,
    Dup3Cloexec,
    FcntlDupfd,
    FcntlDupfdCloexec,
}

pub(crate) const DUP_WAYS: [DupWay; 5] = [
    DupWay::Dup,
    DupWay::Dup2,
    DupWay::Dup3Cloexec,
    DupWay::FcntlDupfd,
    DupWay::FcntlDupfdCloexec,
];

/// `struct open_how` of openat2(2).
#[repr(C)]
pub(crate) struct OpenHow {
    pub(crate) flags: u64,
    pub(crate) mode: u64,
    pub(crate) resolve: u64,
}

pub(crate) fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

impl Env {
    /// Opens `name` of the device directory `way`.
    pub(crate) fn open_way(&self, name: &str, way: OpenWay, cloexec: bool) -> RawFd {
        static LINKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let path = self.dir.join(name);
        let flags = libc::O_RDWR | if cloexec { libc::O_CLOEXEC } else { 0 };
        let fd = match way {
            OpenWay::Openat => openat(&path, flags),
            OpenWay::RawOpen => {
                let c = cpath(&path);
                // SAFETY: a valid NUL-terminated path; the descriptor is ours.
                unsafe { libc::syscall(libc::SYS_open, c.as_ptr(), flags, 0) as RawFd }
            }
            OpenWay::Openat2 => {
                let c = cpath(&path);
                let how = OpenHow {
                    flags: flags as u64,
                    mode: 0,
                    resolve: 0,
                };
                // SAFETY: a valid path and open_how of the size passed.
                unsafe {
                    libc::syscall(
                        libc::SYS_openat2,
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        &how as *const OpenHow,
                        std::mem::size_of::<OpenHow>(),
                    ) as RawFd
                }
            }
            OpenWay::Relative => {
                // No other thread of ours runs here (threads are joined), so
                // changing the working directory for a moment is safe.
                let here = openat(
                    Path::new("."),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                let dir = cpath(&self.dir);
                // SAFETY: a valid NUL-terminated path.
                if here < 0 || unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                    die(&format!("chdir {}: errno {}", self.dir.display(), errno()));
                }
                let fd = openat(Path::new(name), flags);
                let e = std::io::Error::last_os_error();
                // SAFETY: returning to the directory we came from, by fd.
                unsafe { libc::fchdir(here) };
                close(here);
                if fd < 0 {
                    die(&format!(
                        "open {name} relative to {}: {e}",
                        self.dir.display()
                    ));
                }
                fd
            }
            OpenWay::Symlink => {
                let n = LINKS.fetch_add(1, Ordering::Relaxed);
                let tmp =
                    std::env::temp_dir().join(format!("keling-wl-{}-{n}", std::process::id()));
                let link = tmp.join(name);
                let made = std::fs::create_dir_all(&tmp)
                    .and_then(|_| std::os::unix::fs::symlink(&path, &link));
                if let Err(e) = made {
                    die(&format!("symlink {}: {e}", link.display()));
                }
                let fd = openat(&link, flags);
                let e = std::io::Error::last_os_error();
                let _ = std::fs::remove_file(&link);
                let _ = std::fs::remove_dir(&tmp);
                if fd < 0 {
                    die(&format!("open {}: {e}", link.display()));
                }
                fd
            }
        };
        if fd < 0 {
            die(&format!(
                "open {} ({way:?}): errno {}",
                path.display(),
                errno()
            ));
        }
        fd
    }
}

/// openat(AT_FDCWD, path, flags).
pub(crate) fn openat(path: &Path, flags: i32) -> RawFd {
    let c = cpath(path);
    // SAFETY: a valid NUL-terminated path; the descriptor is ours.
    unsafe { libc::openat(libc::AT_FDCWD, c.as_ptr(), flags) }
}

/// The lowest free descriptor number from `from` on.
pub(crate) fn free_fd_from(from: RawFd) -> RawFd {
    let mut n = from;
    // SAFETY: F_GETFD only inspects our descriptor table.
    while unsafe { libc::fcntl(n, libc::F_GETFD) } >= 0 {
        n += 1;
    }
    n
}

/// A second descriptor of `fd`'s open file, made `way`.
pub(crate) fn dup_way(fd: RawFd, way: DupWay) -> RawFd {
    // SAFETY: descriptor-table operations on our own descriptors.
    let d = unsafe {
        match way {
            DupWay::Dup => libc::dup(fd),
            DupWay::Dup2 => libc::dup2(fd, free_fd_from(200)),
            DupWay::Dup3Cloexec => libc::dup3(fd, free_fd_from(300), libc::O_CLOEXEC),
            DupWay::FcntlDupfd => libc::fcntl(fd, libc::F_DUPFD, 100),
            DupWay::FcntlDupfdCloexec => libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100),
        }
    };
    if d < 0 {
        die(&format!("{way:?} of {fd}: errno {}", errno()));
    }
    d
}

/// Sends `data` with descriptors `fds` (SCM_RIGHTS) on a unix socket.
pub(crate) fn send_msg(sock: RawFd, data: &[u8], fds: &[RawFd]) {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_* only compute sizes and offsets inside `cbuf`, which is
    // large enough and 8-aligned; `msg` points at live buffers for sendmsg.
    let r = unsafe {
        let space = libc::CMSG_SPACE(payload as u32) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
        libc::sendmsg(sock, &msg, 0)
    };
    if r != data.len() as isize {
        die(&format!("sendmsg: errno {}", errno()));
    }
}

/// Receives one message into `data` and the descriptors it carries; None
/// at end of file.
pub(crate) fn recv_msg(sock: RawFd, data: &mut [u8]) -> Option<Vec<RawFd>> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: as in send_msg; the kernel fills `cbuf` with at most `space`
    // bytes and the CMSG_* walk stays inside it.
    let r = unsafe {
        let space = libc::CMSG_SPACE(8 * 4) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let r = loop {
            let r = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r >= 0 || errno() != libc::EINTR {
                break r;
            }
        };
        if r > 0 {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    let p: *const RawFd = libc::CMSG_DATA(c).cast();
                    for i in 0..n {
                        fds.push(std::ptr::read_unaligned(p.add(i)));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        r
    };
    match r {
        0 => None,
        r if r < 0 => die(&format!("recvmsg: errno {}", errno())),
        _ => Some(fds),
    }
}
