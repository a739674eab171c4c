//! Users and groups: who is on the other end of a unix socket (SO_PEERCRED and
//! SO_PEERGROUPS), and names resolved to ids (through NSS: call it at start, not
//! per request, since a directory service may be slow).
use std::{ffi::CString, io, os::fd::RawFd};

/// Whom a process runs as: what a launched task gets from its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Whether `gid` is the primary or a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// `SO_PEERGROUPS` (asm-generic/socket.h; libc does not name it).
const SO_PEERGROUPS: libc::c_int = 59;

/// The supplementary groups of the process at the other end of a unix socket, as
/// they were when it connected.
pub fn peer_groups(sock: RawFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `groups`.
        let r = unsafe {
            libc::getsockopt(
                sock,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // ERANGE: `len` now says how much is needed.
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

/// The uid of user `name`, if there is one.
pub fn uid_of_user(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getpwnam_r writes within `buf`.
    let r = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (r == 0 && !result.is_null()).then_some(pw.pw_uid)
}

/// The name of user `uid`, if it has one.
pub fn name_of_uid(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getpwuid_r writes within `buf`.
    let r = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if r != 0 || result.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded: pw_name is a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// The gid of group `name`, if there is one.
pub fn gid_of_group(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: a zeroed group is a valid out-parameter.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut result = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getgrnam_r writes within `buf`.
    let r = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut gr,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (r == 0 && !result.is_null()).then_some(gr.gr_gid)
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsRawFd, unix::net::UnixStream};

    use super::*;

    #[test]
    fn peer_groups_are_ours_over_a_socketpair() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut ours = vec![0 as libc::gid_t; 256];
        // SAFETY: getgroups writes at most 256 gids.
        let n = unsafe { libc::getgroups(256, ours.as_mut_ptr()) };
        ours.truncate(n as usize);
        let mut theirs = peer_groups(a.as_raw_fd()).unwrap();
        ours.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(theirs, ours);
    }

    #[test]
    fn names_resolve() {
        assert_eq!(uid_of_user("root"), Some(0));
        assert_eq!(gid_of_group("root"), Some(0));
        assert_eq!(uid_of_user("no-such-user-keling"), None);
        assert_eq!(gid_of_group("no\0such"), None);
        let c = Credentials {
            uid: 5,
            gid: 6,
            groups: vec![7],
        };
        assert!(c.in_group(6) && c.in_group(7) && !c.in_group(5));
    }
}
