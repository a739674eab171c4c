//! `/proc`, parsed in one place. Every reader here treats the text as hostile: a
//! process may exit between two reads, and `comm` may hold any bytes, spaces and
//! parentheses included.
use std::{collections::BTreeSet, fs, path::PathBuf};

use anyhow::Context;

/// What `/proc/PID/stat` says about a process that Keling uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub comm: String,
    /// The one-letter state (`R`, `S`, `T`, `Z`, ...).
    pub state: char,
    /// When the process started, in clock ticks since boot: with the pid, an
    /// identity no later process can have.
    pub start_ticks: u64,
}

/// Parses the text of `/proc/PID/stat`: "pid (comm) state ppid ... starttime ...".
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // starttime is field 22; state was field 3 and ppid 4.
    let start_ticks = rest.nth(17)?.parse().ok()?;
    Some(Stat {
        ppid,
        comm,
        state,
        start_ticks,
    })
}

/// The start time of a process in clock ticks since boot (None when it is gone).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(parse_stat(&text)?.start_ticks)
}

/// Nanoseconds per clock tick of `/proc/PID/stat` times.
pub fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// When a process started, as CLOCK_MONOTONIC ns (the clock of kernel event
/// timestamps), to a clock tick. Start times count from boot (CLOCK_BOOTTIME),
/// which runs ahead of the monotonic clock by the time spent suspended.
pub fn start_monotonic_ns(pid: u32) -> Option<u64> {
    let boot_ns = start_ticks(pid)?.saturating_mul(tick_ns());
    let ahead = super::boottime_ns().saturating_sub(super::monotonic_ns());
    Some(boot_ns.saturating_sub(ahead))
}

/// The real uid of a process (None when it is gone).
pub fn uid(pid: u32) -> Option<u32> {
    uid_field(pid, 0)
}

/// The effective uid of a process (None when it is gone): what SO_PEERCRED
/// reports of a socket's peer.
pub fn effective_uid(pid: u32) -> Option<u32> {
    uid_field(pid, 1)
}

/// Field `n` of `Uid:` in `/proc/PID/status` (real, effective, saved, fs).
fn uid_field(pid: u32, n: usize) -> Option<u32> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(n)?.parse().ok())
}

/// Every resource Linux limits (`getrlimit(2)`), RLIMIT_CPU to RLIMIT_RTTIME,
/// with its name in `/proc/PID/limits`, which lists them in this order.
const RESOURCES: [(u32, &str); 16] = [
    (libc::RLIMIT_CPU, "Max cpu time"),
    (libc::RLIMIT_FSIZE, "Max file size"),
    (libc::RLIMIT_DATA, "Max data size"),
    (libc::RLIMIT_STACK, "Max stack size"),
    (libc::RLIMIT_CORE, "Max core file size"),
    (libc::RLIMIT_RSS, "Max resident set"),
    (libc::RLIMIT_NPROC, "Max processes"),
    (libc::RLIMIT_NOFILE, "Max open files"),
    (libc::RLIMIT_MEMLOCK, "Max locked memory"),
    (libc::RLIMIT_AS, "Max address space"),
    (libc::RLIMIT_LOCKS, "Max file locks"),
    (libc::RLIMIT_SIGPENDING, "Max pending signals"),
    (libc::RLIMIT_MSGQUEUE, "Max msgqueue size"),
    (libc::RLIMIT_NICE, "Max nice priority"),
    (libc::RLIMIT_RTPRIO, "Max realtime priority"),
    (libc::RLIMIT_RTTIME, "Max realtime timeout"),
];

/// Every resource limit of process `pid` as `(resource, soft, hard)`, from
/// `/proc/PID/limits` (which anyone may read: `prlimit` on another user's
/// process needs CAP_SYS_RESOURCE, which root lacks in some containers,
/// these machines included).
pub fn limits(pid: u32) -> anyhow::Result<Vec<(u32, u64, u64)>> {
    let text = fs::read_to_string(format!("/proc/{pid}/limits"))
        .with_context(|| format!("no process {pid}"))?;
    parse_limits(&text).with_context(|| format!("unreadable /proc/{pid}/limits"))
}

/// Parses the text of `/proc/PID/limits`: a header, then one line per
/// resource in [`RESOURCES`]' order, "NAME SOFT HARD [UNITS]" with
/// `unlimited` for RLIM_INFINITY.
pub fn parse_limits(text: &str) -> Option<Vec<(u32, u64, u64)>> {
    let value = |v: &str| match v {
        "unlimited" => Some(libc::RLIM_INFINITY),
        n => n.parse().ok(),
    };
    let mut lines = text.lines().skip(1);
    RESOURCES
        .iter()
        .map(|&(resource, name)| {
            let rest = lines.next()?.strip_prefix(name)?;
            let mut fields = rest.split_whitespace();
            let soft = value(fields.next()?)?;
            let hard = value(fields.next()?)?;
            Some((resource, soft, hard))
        })
        .collect()
}

/// `/proc/PID/oom_score_adj` (-1000 to 1000).
pub fn oom_score_adj(pid: u32) -> anyhow::Result<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .with_context(|| format!("no process {pid}"))?;
    text.trim()
        .parse()
        .ok()
        .filter(|v: &i32| (-1000..=1000).contains(v))
        .with_context(|| format!("unreadable /proc/{pid}/oom_score_adj: {text:?}"))
}

/// The umask of a process (`Umask:` in `/proc/PID/status`, octal).
pub fn umask(pid: u32) -> anyhow::Result<u32> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("no process {pid}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .filter(|m| *m <= 0o777)
        .with_context(|| format!("no umask in /proc/{pid}/status"))
}

/// `/proc/PID/stat`, or an error saying there is no such process.
pub fn stat(pid: u32) -> anyhow::Result<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process {pid}"))?;
    parse_stat(&text).with_context(|| format!("unreadable /proc/{pid}/stat"))
}

/// Whether the process is stopped (`T`) or gone: either way it does not run.
pub fn stopped_or_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).is_none_or(|s| matches!(s.state, 'T' | 't' | 'Z' | 'X')),
        Err(_) => true,
    }
}

/// Whether process `pid` is stopped (`T` or `t`); `None` when it has no live
/// thread to read (gone). Its leader's state answers, as it always did, unless
/// the leader is a zombie: a leader that called `pthread_exit` shows `Z` while
/// its other threads run, and would never show `T`; then the live threads
/// answer (all stopped, or one that is not). The actuation thread asks every
/// 0.5 ms while a stop is unconfirmed, so the common case stays one read.
pub fn threads_stopped(pid: u32) -> Option<bool> {
    let leader = stat(pid).ok()?;
    if !matches!(leader.state, 'Z' | 'X') {
        return Some(matches!(leader.state, 'T' | 't'));
    }
    let mut live = false;
    for tid in tids(pid).ok()? {
        let Some(s) = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            .ok()
            .and_then(|t| parse_stat(&t))
        else {
            continue; // gone since the listing
        };
        match s.state {
            'Z' | 'X' => {}
            'T' | 't' => live = true,
            _ => return Some(false),
        }
    }
    live.then_some(true)
}

/// Thread ids of a live process.
pub fn tids(pid: u32) -> anyhow::Result<BTreeSet<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = fs::read_dir(&dir).with_context(|| format!("no process {pid} ({dir})"))?;
    Ok(numeric_entries(entries).collect())
}

/// Every process id on the host, now.
pub fn pids() -> anyhow::Result<Vec<u32>> {
    Ok(numeric_entries(fs::read_dir("/proc").context("read /proc")?).collect())
}

fn numeric_entries(dir: fs::ReadDir) -> impl Iterator<Item = u32> {
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
}

/// `CapEff` from the text of `/proc/PID/status` (0 when absent).
pub fn parse_cap_eff(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// What config rules can match a process on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    pub comm: String,
    /// Real uid.
    pub uid: Option<u32>,
    /// The cgroup v2 path (`0::` line of `/proc/PID/cgroup`).
    pub cgroup: Option<String>,
    pub exe: Option<String>,
    /// Real gid and supplementary groups (`Gid:`, `Groups:`): whose `[[grant]]`
    /// applies to it.
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
}

impl ProcessFacts {
    /// Reads the facts of a live process.
    pub fn of_pid(pid: u32) -> Self {
        let read =
            |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let status = read("status");
        let first = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        };
        let uid = first("Uid:");
        let gid = first("Gid:");
        let groups = status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|g| g.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let cgroup = read("cgroup")
            .lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_owned));
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        Self {
            comm: read("comm").trim().to_owned(),
            uid,
            cgroup,
            exe,
            gid,
            groups,
        }
    }
}

/// One open fd of a process.
#[derive(Clone, Debug)]
pub struct OpenFd {
    pub fd: i32,
    /// What `/proc/PID/fd/N` points at.
    pub target: PathBuf,
    /// The open flags from `fdinfo` (octal there).
    pub flags: u32,
}

/// The open fds of a process (empty when it is gone or unreadable).
pub fn fds(pid: u32) -> Vec<OpenFd> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: i32 = e.file_name().to_str()?.parse().ok()?;
        let target = fs::read_link(e.path()).ok()?;
        let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(0);
        Some(OpenFd { fd, target, flags })
    })
    .collect()
}

/// What the open file behind `pid`'s `fd` is (its `stat`, following the
/// `/proc/PID/fd/N` link), or `None` when it is gone.
pub fn fd_metadata(pid: u32, fd: i32) -> Option<fs::Metadata> {
    fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// Whether `pid`'s cgroup v2 path (`/proc/PID/cgroup`'s `0::` line, from the
/// hierarchy's root) is `rel`. Compared as bytes: a path need not be UTF-8.
pub fn in_cgroup(pid: u32, rel: &[u8]) -> bool {
    fs::read(format!("/proc/{pid}/cgroup")).is_ok_and(|text| {
        text.split(|&b| b == b'\n')
            .any(|l| l.strip_prefix(b"0::") == Some(rel))
    })
}

/// The NVIDIA kernel module's version text (`/proc/driver/nvidia/version`), with
/// the path it came from; `None` without the module.
pub fn nvidia_driver_version_text() -> Option<(PathBuf, String)> {
    let path = PathBuf::from("/proc/driver/nvidia/version");
    let text = fs::read_to_string(&path).ok()?;
    Some((path, text))
}

/// The major number of a character device driver from `/proc/devices`.
pub fn char_major(name: &str) -> Option<u32> {
    let text = fs::read_to_string("/proc/devices").ok()?;
    parse_char_major(&text, name)
}

fn parse_char_major(text: &str, name: &str) -> Option<u32> {
    text.lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let mut parts = l.split_whitespace();
            let major = parts.next()?.parse().ok()?;
            (parts.next()? == name).then_some(major)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/self/limits` read back is what `getrlimit` says, for every
    /// resource; `unlimited` is RLIM_INFINITY; a line missing or out of
    /// order is no answer.
    #[test]
    fn limits_read_from_proc_are_getrlimits() {
        let read = limits(std::process::id()).unwrap();
        assert_eq!(read.len(), 16);
        for &(resource, soft, hard) in &read {
            let mut l = libc::rlimit64 {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: a valid rlimit64 to fill, for this process.
            assert_eq!(unsafe { libc::getrlimit64(resource, &mut l) }, 0);
            assert_eq!(
                (soft, hard),
                (l.rlim_cur, l.rlim_max),
                "resource {resource}"
            );
        }
        let text = std::fs::read_to_string("/proc/self/limits").unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.swap(1, 2);
        assert_eq!(parse_limits(&lines.join("\n")), None, "out of order");
        lines.truncate(10);
        assert_eq!(parse_limits(&lines.join("\n")), None, "cut short");
    }

    #[test]
    fn stat_survives_hostile_comm() {
        let s = parse_stat(
            "42 (a) b (c)) S 7 42 42 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10",
        )
        .unwrap();
        assert_eq!(
            (s.ppid, s.comm.as_str(), s.state, s.start_ticks),
            (7, "a) b (c)", 'S', 12345)
        );
        assert_eq!(parse_stat("42 (a) S 7 42 42 0 -1"), None, "truncated");
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert_eq!(s.ppid, std::os::unix::process::parent_id());
        assert!(tids(me).unwrap().contains(&me));
        assert!(!stopped_or_gone(me));
        assert!(pids().unwrap().contains(&me));
        assert_eq!(start_ticks(me), Some(s.start_ticks));
        let started = start_monotonic_ns(me).unwrap();
        assert!(started <= super::super::monotonic_ns() + tick_ns());
        // SAFETY: getuid has no preconditions.
        assert_eq!(uid(me), Some(unsafe { libc::getuid() }));
    }

    #[test]
    fn finds_char_majors() {
        let text = "Character devices:\n  1 mem\n195 nvidia-frontend\n509 nvidia-uvm\n\nBlock devices:\n  8 sd\n";
        assert_eq!(parse_char_major(text, "nvidia-uvm"), Some(509));
        assert_eq!(parse_char_major(text, "sd"), None);
        assert_eq!(
            parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            0x1ff_ffff_ffff
        );
    }
}
