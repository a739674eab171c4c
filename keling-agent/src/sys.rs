//! What the agent needs from the host before it can load probes: privileges, a
//! locked-memory limit, tracefs, and the layouts of the tracepoints it reads.
use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use tokio::io::unix::AsyncFd;

/// Fails with a message that says what to do when the agent cannot load eBPF.
pub fn check_privileges() -> anyhow::Result<()> {
    // CAP_BPF is 39, CAP_PERFMON 38, CAP_SYS_ADMIN 21 (linux/capability.h).
    let status = fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1 << cap) != 0;
    if has(21) || (has(39) && has(38)) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    bail!(
        "Keling loads eBPF programs and needs root (or CAP_BPF + CAP_PERFMON); running as uid {euid} \
         with effective capabilities {eff:#x}. Run it with sudo, or `cargo xtask run`, which does."
    )
}

/// Registers an fd-owning value with the tokio reactor.
///
/// Only for types that own their fd for their whole life and always return the same
/// one (`OwnedFd`, aya's `RingBuf`): that is what `AsyncFd::register` requires.
pub fn async_fd<T: std::os::fd::AsRawFd>(inner: T) -> anyhow::Result<AsyncFd<T>> {
    // SAFETY: see above; every caller passes such an owner.
    unsafe { AsyncFd::register(inner) }.map_err(|e| anyhow::anyhow!("register fd with tokio: {e}"))
}

/// Raises RLIMIT_MEMLOCK: kernels before 5.11 charge BPF maps to it.
pub fn raise_memlock() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit struct; failure is reported, not fatal (5.11+ ignores it).
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) } != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The tracefs mount point, mounting it at /sys/kernel/tracing when it is absent
/// (fresh machines here boot without it; aya needs it to resolve tracepoint ids).
pub fn ensure_tracefs() -> anyhow::Result<PathBuf> {
    if let Some(dir) = find_mount("tracefs")? {
        return Ok(dir);
    }
    let target = Path::new("/sys/kernel/tracing");
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (src, dst, fstype) = (c("tracefs"), c("/sys/kernel/tracing"), c("tracefs"));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it at {} failed: {err}. \
             Mount it by hand: mount -t tracefs tracefs {}",
            target.display(),
            target.display()
        );
    }
    log::info!("mounted tracefs at {}", target.display());
    Ok(target.to_path_buf())
}

/// Mount point of the first filesystem of type `fstype`, from /proc/self/mountinfo.
pub fn find_mount(fstype: &str) -> anyhow::Result<Option<PathBuf>> {
    let info = fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    Ok(parse_mountinfo(&info, fstype))
}

fn parse_mountinfo(info: &str, fstype: &str) -> Option<PathBuf> {
    info.lines().find_map(|line| {
        // "id parent major:minor root mountpoint opts [optional...] - fstype source super"
        let (left, right) = line.split_once(" - ")?;
        let mountpoint = left.split(' ').nth(4)?;
        (right.split(' ').next()? == fstype).then(|| PathBuf::from(unescape_octal(mountpoint)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
            continue;
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

/// Field offsets of one tracepoint, from its `format` file.
pub struct TracepointFormat {
    fields: Vec<(String, u32)>,
}

impl TracepointFormat {
    pub fn read(tracefs: &Path, category: &str, name: &str) -> anyhow::Result<Self> {
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: this kernel lacks the tracepoint {category}:{name}",
                path.display()
            )
        })?;
        Ok(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|line| {
                let line = line.trim();
                let decl = line.strip_prefix("field:")?.split(';').next()?;
                let name = decl.split_whitespace().last()?;
                let name = name.split('[').next()?.to_owned();
                let offset = line
                    .split(';')
                    .find_map(|p| p.trim().strip_prefix("offset:"))?
                    .parse()
                    .ok()?;
                Some((name, offset))
            })
            .collect();
        Self { fields }
    }

    pub fn offset(&self, field: &str) -> Option<u32> {
        self.fields
            .iter()
            .find(|(n, _)| n == field)
            .map(|&(_, o)| o)
    }

    pub fn require(&self, tp: &str, field: &str) -> anyhow::Result<u32> {
        self.offset(field)
            .with_context(|| format!("tracepoint {tp} has no field {field} on this kernel"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracepoint_format() {
        let text = "name: sched_process_exit\nID: 369\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
            \tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n\nprint fmt: \"x\"\n";
        let f = TracepointFormat::parse(text);
        assert_eq!(f.offset("comm"), Some(8));
        assert_eq!(f.offset("pid"), Some(24));
        assert_eq!(f.offset("group_dead"), Some(32));
        assert_eq!(f.offset("filename"), Some(8));
        assert_eq!(f.offset("nope"), None);
    }

    #[test]
    fn finds_mounts_by_type() {
        let info = "22 1 0:21 / /sys rw - sysfs sysfs rw\n\
                    40 22 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    41 22 0:36 / /mnt/with\\040space rw - tracefs tracefs rw\n";
        assert_eq!(
            parse_mountinfo(info, "cgroup2"),
            Some("/sys/fs/cgroup/unified".into())
        );
        assert_eq!(
            parse_mountinfo(info, "tracefs"),
            Some("/mnt/with space".into())
        );
        assert_eq!(parse_mountinfo(info, "fuse"), None);
    }
}
