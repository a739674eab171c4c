//! Mount points, from `/proc/self/mountinfo`. Mount points are paths, not text:
//! bytes that are not UTF-8 are kept as they are.
use std::{ffi::OsString, fs, os::unix::ffi::OsStringExt, path::PathBuf};

use anyhow::Context;

/// Mount point of the first filesystem of type `fstype`.
pub fn find(fstype: &str) -> anyhow::Result<Option<PathBuf>> {
    let info = fs::read("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    Ok(parse_mountinfo(&info, fstype.as_bytes()))
}

fn parse_mountinfo(info: &[u8], fstype: &[u8]) -> Option<PathBuf> {
    info.split(|&b| b == b'\n').find_map(|line| {
        // "id parent major:minor root mountpoint opts [optional...] - fstype source super"
        let sep = line.windows(3).position(|w| w == b" - ")?;
        let (left, right) = (&line[..sep], &line[sep + 3..]);
        let mountpoint = left.split(|&b| b == b' ').nth(4)?;
        let ty = right.split(|&b| b == b' ').next()?;
        (ty == fstype).then(|| PathBuf::from(OsString::from_vec(unescape_octal(mountpoint))))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && let Some(v) = std::str::from_utf8(&s[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn finds_mounts_by_type() {
        let info = b"22 1 0:21 / /sys rw - sysfs sysfs rw\n\
                    40 22 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    41 22 0:36 / /mnt/with\\040space rw - tracefs tracefs rw\n";
        assert_eq!(
            parse_mountinfo(info, b"cgroup2"),
            Some("/sys/fs/cgroup/unified".into())
        );
        assert_eq!(
            parse_mountinfo(info, b"tracefs"),
            Some("/mnt/with space".into())
        );
        assert_eq!(parse_mountinfo(info, b"fuse"), None);
    }

    #[test]
    fn mount_points_that_are_not_utf8_are_kept() {
        let mut info = b"22 1 0:21 / /a/".to_vec();
        info.extend_from_slice(&[0xff, 0xfe]);
        info.extend_from_slice(b" rw - cgroup2 cgroup2 rw\n");
        let p = parse_mountinfo(&info, b"cgroup2").unwrap();
        assert_eq!(p.as_os_str().as_bytes(), b"/a/\xff\xfe");
    }
}
