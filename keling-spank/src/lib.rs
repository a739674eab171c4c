//! Keling's SPANK plugin: Slurm's job steps under the node's Keling agent.
//!
//! Loaded by `srun`, `sbatch`, `salloc` and `slurmstepd` through
//! `plugstack.conf` (`keling slurm plugstack` prints the line). It adds
//! `--gpu-priority=P` (0 highest to 15) and `--gpu-notify-preempt` to `srun`,
//! `sbatch` and `salloc`, and, in each task of a job step that has GPUs on this
//! node, before it execs (`slurm_spank_task_init_privileged`: in the task's own
//! process, as root), hands the task to the node's agent over its control
//! socket (`{"slurm_attach": ...}`): job and step, owner, GPUs (`SLURM_STEP_GPUS`, else
//! `SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES`), a memory budget of its shards
//! (`SLURM_SHARDS_ON_NODE` GiB) and the priority, with the task's standard error
//! for what Keling tells it. The agent answers once the task is in a cgroup of
//! its own; from then on it is scheduled, counted and enforced like a launched
//! task.
//!
//! The agent is found by the node's name (`SLURMD_NODENAME`), as the instance
//! of that name (`/run/keling/NODE/keling.sock`), else the default instance
//! (`/run/keling/keling.sock`), so several slurmd on one machine each reach
//! their own. Plugin arguments (in `plugstack.conf`, after the path):
//! `refuse_without_agent` (a task whose node's agent is down fails instead of
//! running without Keling), `run_dir=DIR` (instead of `/run/keling`),
//! `socket=PATH` (one socket for every node).
//!
//! A node whose agent is down runs the job as if Keling were absent, and says
//! so once (its first local task) on the job's standard error.
//!
//! The SPANK calls are declared by hand ([`ffi`]: Slurm 22.05's `spank.h`, the
//! handful used); they are resolved from the process that loads the plugin.
use std::{
    ffi::{CStr, c_char, c_int},
    io::{BufRead, BufReader, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Serialize;

#[cfg(not(test))]
mod ffi;
#[cfg(not(test))]
mod hooks;

/// The highest number (lowest priority) `--gpu-priority` takes.
pub const MAX_PRIORITY: u8 = 15;
/// One shard: 1 GiB of a GPU (as `keling slurm gres` counts them).
pub const SHARD_BYTES: u64 = 1 << 30;
/// How long the agent has to answer (it answers once the task is in its cgroup).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the agents' run directories are.
pub const RUN_DIR: &str = "/run/keling";

/// The plugin's arguments from `plugstack.conf`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginArgs {
    pub refuse_without_agent: bool,
    pub run_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
}

/// Parses the plugin's arguments; an unknown one is an error (named).
pub fn parse_args<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<PluginArgs, String> {
    let mut out = PluginArgs::default();
    for a in args {
        match a.split_once('=') {
            None if a == "refuse_without_agent" => out.refuse_without_agent = true,
            Some(("run_dir", d)) if d.starts_with('/') => out.run_dir = Some(d.into()),
            Some(("socket", s)) if s.starts_with('/') => out.socket = Some(s.into()),
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (known: refuse_without_agent, run_dir=/ABS, socket=/ABS)"
                ));
            }
        }
    }
    Ok(out)
}

/// Parses `--gpu-priority`'s value: 0 to [`MAX_PRIORITY`].
pub fn parse_priority(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(p) if p <= MAX_PRIORITY => Ok(p),
        _ => Err(format!(
            "--gpu-priority={s}: a priority is 0 (highest) to {MAX_PRIORITY} (lowest)"
        )),
    }
}

/// The GPU indices of a Slurm list (`0,2`; `0-1` ranges too).
pub fn parse_gpus(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>())
                    && a <= b
                    && b - a < 64
                {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(g) = part.parse() {
                    out.push(g);
                }
            }
        }
    }
    out.truncate(64);
    out
}

/// A Slurm job step's task, as the agent's `attach` request has it (the agent's
/// `control::SlurmAttachRequest`; a test reads this as that type).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Attach {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub slurm: SlurmRef,
    pub gpus: Vec<u32>,
    pub mem_budget_bytes: Option<u64>,
    pub priority: Option<u8>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub notify_preempt: bool,
    /// The owner's supplementary groups in the job (Slurm's
    /// `S_JOB_SUPPLEMENTARY_GIDS`): a `[[grant]] group=` applies to them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct SlurmRef {
    pub job: u32,
    pub step: u32,
    pub task: u32,
}

/// What the job's environment says of its GPUs on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobGpus {
    pub gpus: Vec<u32>,
    /// Its shards on this node (`SLURM_SHARDS_ON_NODE`), as bytes.
    pub budget_bytes: Option<u64>,
}

/// The step id Slurm gives a batch script's step (`SLURM_BATCH_SCRIPT`).
pub const BATCH_STEP: u32 = 0xffff_fffb;
/// The step id of salloc's interactive step (`SLURM_INTERACTIVE_STEP`).
pub const INTERACTIVE_STEP: u32 = 0xffff_fffa;

/// The GPUs of step `step` from the job's variables (`getenv` reads one):
/// `None` for a step with no GPU here (nothing for Keling to do). Only the
/// variable slurmstepd sets for that step counts (it sets or unsets
/// `SLURM_JOB_GPUS` for a batch script or salloc's interactive step,
/// `SLURM_STEP_GPUS` for any other, before this hook; measured in Slurm 22.05's
/// slurmstepd): the other one, and `CUDA_VISIBLE_DEVICES`, are whatever the
/// submitting environment carried, which the job's owner chooses.
pub fn job_gpus(step: u32, getenv: impl Fn(&str) -> Option<String>) -> Option<JobGpus> {
    let var = if matches!(step, BATCH_STEP | INTERACTIVE_STEP) {
        "SLURM_JOB_GPUS"
    } else {
        "SLURM_STEP_GPUS"
    };
    let gpus = getenv(var)
        .map(|s| parse_gpus(&s))
        .filter(|g| !g.is_empty())?;
    let budget_bytes = getenv("SLURM_SHARDS_ON_NODE")
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .map(|n| n.saturating_mul(SHARD_BYTES));
    Some(JobGpus { gpus, budget_bytes })
}

/// This node's name in Slurm: `SLURMD_NODENAME` in slurmstepd's own
/// environment (`own`: it sets it for itself when it starts; the job's copy is
/// set only after this hook, and before that is whatever the job carried),
/// else the last part of `SLURM_TOPOLOGY_ADDR` in the job's (`job`: slurmstepd
/// writes it before this hook; the node's name under the default topology,
/// the last of `switch.switch.node` under a tree; measured with Slurm 22.05).
pub fn node_name(
    own: impl Fn(&str) -> Option<String>,
    job: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    if let Some(n) = own("SLURMD_NODENAME").filter(|n| !n.is_empty()) {
        return Some(n);
    }
    let addr = job("SLURM_TOPOLOGY_ADDR")?;
    addr.rsplit('.')
        .next()
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

/// The socket of node `node`'s agent: `socket=`, else the instance named as the
/// node when it has one, else the default instance's.
pub fn socket_for(args: &PluginArgs, node: Option<&str>) -> PathBuf {
    if let Some(s) = &args.socket {
        return s.clone();
    }
    let run_dir = args.run_dir.as_deref().unwrap_or(Path::new(RUN_DIR));
    if let Some(n) = node.filter(|n| is_instance_name(n)) {
        let s = run_dir.join(n).join("keling.sock");
        if s.exists() {
            return s;
        }
    }
    run_dir.join("keling.sock")
}

/// What can be an agent instance's name (so never a path).
fn is_instance_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How an attach went.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The agent took the task on as task `task`.
    Attached { task: u64 },
    /// The agent refused it (its message).
    Refused(String),
    /// No agent answered (why).
    NoAgent(String),
    /// The agent does not take this task on where the host is set up so (why):
    /// the job runs without Keling, as with no agent.
    NotTaken(String),
}

/// Sends `req` to the agent at `socket` with `stderr` attached, and reads its
/// answer (at most [`REPLY_TIMEOUT`]).
pub fn attach(socket: &Path, req: &Attach, stderr: c_int) -> Outcome {
    let stream = match connect(socket) {
        Ok(s) => s,
        Err(e) => return Outcome::NoAgent(format!("{}: {e}", socket.display())),
    };
    let _ = stream.set_read_timeout(Some(REPLY_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REPLY_TIMEOUT));
    let mut line = match serde_json::to_vec(&serde_json::json!({ "slurm_attach": req })) {
        Ok(l) => l,
        Err(e) => return Outcome::NoAgent(e.to_string()),
    };
    line.push(b'\n');
    if let Err(e) = send_with_fd(&stream, &line, stderr) {
        return Outcome::NoAgent(format!("{}: sending: {e}", socket.display()));
    }
    let mut answer = String::new();
    match BufReader::new(&stream).read_line(&mut answer) {
        Ok(0) => Outcome::NoAgent("the agent closed the connection".into()),
        Ok(_) => read_answer(&answer),
        Err(e) => Outcome::NoAgent(format!("no answer within {REPLY_TIMEOUT:?}: {e}")),
    }
}

/// Connects to `socket` without ever waiting: a connection to an agent that
/// accepts none (wedged, or stopped with its socket left) waits in the
/// socket's backlog, and once that is full a blocking connect would hold the
/// job's start in slurmstepd for as long as the agent stays so. Non-blocking,
/// a full backlog is an error at once (`EAGAIN`); the stream is made blocking
/// again, with its timeouts, for the request and the answer.
pub fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    use std::os::{fd::FromRawFd, unix::ffi::OsStrExt};
    let path = socket.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= addr.sun_path.len() || path.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a usable socket path (empty, a NUL, or over 107 bytes)",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as c_char;
    }
    // SAFETY: no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a socket just made, owned from here on.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    // SAFETY: a valid sockaddr_un and a length inside it.
    let r = unsafe { libc::connect(fd, (&raw const addr).cast(), len as libc::socklen_t) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EAGAIN) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "the agent accepts no connection (its socket's backlog is full)",
            ));
        }
        return Err(e);
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The agent's answer line: `{"accepted": {"task": N, ...}}` or `{"error":
/// {"kind", "message"}}`.
pub fn read_answer(line: &str) -> Outcome {
    let v: serde_json::Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Outcome::NoAgent(format!("a reply that is not JSON ({e})")),
    };
    if let Some(task) = v["accepted"]["task"].as_u64() {
        return Outcome::Attached { task };
    }
    match v["error"]["message"].as_str() {
        Some(m) if v["error"]["kind"] == "unsupported" => Outcome::NotTaken(m.to_owned()),
        Some(m) => Outcome::Refused(m.to_owned()),
        None => Outcome::NoAgent(format!("an unexpected reply: {}", line.trim())),
    }
}

/// Sends `data` with `fd` attached (SCM_RIGHTS).
fn send_with_fd(stream: &UnixStream, data: &[u8], fd: c_int) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    // SAFETY: a size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: the control buffer has room for one header and one fd.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>(), fd);
    }
    // SAFETY: a fully initialised msghdr on a connected socket.
    if unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the job is told when its node's agent is down.
pub fn no_agent_message(node: &str, why: &str, refused: bool) -> String {
    if refused {
        format!(
            "keling: the Keling agent of node {node} is not running ({why}); this node refuses \
             GPU jobs without it (plugin option refuse_without_agent): ask its administrator"
        )
    } else {
        format!(
            "keling: the Keling agent of node {node} is not running ({why}); this job runs \
             without Keling: its GPU memory is neither counted nor enforced"
        )
    }
}

/// What the task hears when the agent does not take it on (`why`), with or
/// without `refuse_without_agent` (`refused`).
pub fn not_taken_message(node: &str, why: &str, refused: bool) -> String {
    if refused {
        format!(
            "keling: the Keling agent of node {node} does not take this task on ({why}); this \
             node refuses GPU jobs without it (plugin option refuse_without_agent): ask its \
             administrator"
        )
    } else {
        format!(
            "keling: the Keling agent of node {node} does not take this task on ({why}); this \
             job runs without Keling: its GPU memory is neither counted nor enforced"
        )
    }
}

/// Writes one line to `fd` (the task's standard error), ignoring failures.
pub fn tell(fd: c_int, line: &str) {
    let mut text = line.to_owned();
    text.push('\n');
    // SAFETY: borrowing a descriptor we do not own for one write; ManuallyDrop
    // keeps it open.
    let mut f = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
    });
    let _ = f.write_all(text.as_bytes());
}

/// A C string argument list as `&str`s (invalid UTF-8 ones are kept lossily).
///
/// # Safety
/// `argv` points at `argc` NUL-terminated strings (or is null with `argc` 0).
pub unsafe fn args_of(argc: c_int, argv: *const *const c_char) -> Vec<String> {
    if argv.is_null() || argc <= 0 {
        return Vec::new();
    }
    (0..argc as usize)
        .filter_map(|i| {
            // SAFETY: within the caller's promise.
            let p = unsafe { *argv.add(i) };
            // SAFETY: a NUL-terminated string, per the caller.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_reads_as_the_agents_own_type() {
        let req = Attach {
            pid: 42,
            uid: 1000,
            gid: 100,
            slurm: SlurmRef {
                job: 7,
                step: 0xffff_fffb,
                task: 0,
            },
            gpus: vec![1],
            mem_budget_bytes: Some(3 * SHARD_BYTES),
            priority: Some(2),
            notify_preempt: true,
            groups: vec![100, 27],
        };
        let line = serde_json::to_string(&serde_json::json!({ "slurm_attach": &req })).unwrap();
        let parsed: keling_agent::control::Request = serde_json::from_str(&line).unwrap();
        let keling_agent::control::Request::SlurmAttach(a) = parsed else {
            panic!("{line} read as another request");
        };
        assert_eq!(
            (
                a.pid,
                a.uid,
                a.gid,
                a.slurm.job,
                a.slurm.step,
                a.gpus.clone()
            ),
            (42, 1000, 100, 7, 0xffff_fffb, vec![1])
        );
        assert_eq!(a.mem_budget_bytes, Some(3 << 30));
        assert_eq!((a.priority, a.notify_preempt), (Some(2), true));
        assert_eq!(a.groups, vec![100, 27]);
    }

    #[test]
    fn the_agents_answers_read_back() {
        let accepted = keling_agent::control::Reply::Accepted(keling_agent::control::Accepted {
            task: 9,
            gpu: Some(0),
            pid: 5,
        });
        let line = serde_json::to_string(&accepted).unwrap();
        assert_eq!(read_answer(&line), Outcome::Attached { task: 9 });
        let refused = keling_agent::control::Reply::Error(keling_agent::control::ReplyError::new(
            keling_agent::control::ErrorKind::Refused,
            "priority 1 is not allowed",
        ));
        let line = serde_json::to_string(&refused).unwrap();
        assert_eq!(
            read_answer(&line),
            Outcome::Refused("priority 1 is not allowed".into())
        );
        assert!(matches!(read_answer("garbage"), Outcome::NoAgent(_)));
        let unsupported =
            keling_agent::control::Reply::Error(keling_agent::control::ReplyError::new(
                keling_agent::control::ErrorKind::Unsupported,
                "in Slurm's own cgroup",
            ));
        let line = serde_json::to_string(&unsupported).unwrap();
        assert_eq!(
            read_answer(&line),
            Outcome::NotTaken("in Slurm's own cgroup".into())
        );
        assert!(not_taken_message("n1", "why", false).contains("runs without Keling"));
        assert!(not_taken_message("n1", "why", true).contains("refuse_without_agent"));
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    /// Each step reads only the variable slurmstepd set for it: a job that
    /// submits with `SLURM_STEP_GPUS=1` in its environment does not choose
    /// its batch script's GPU, nor does a stale `SLURM_JOB_GPUS` an srun
    /// step's; `CUDA_VISIBLE_DEVICES` (local indices, and the job's to set)
    /// never counts.
    #[test]
    fn gpus_and_budget_come_from_the_variable_slurmstepd_sets_for_the_step() {
        let all = env(&[
            ("SLURM_STEP_GPUS", "1"),
            ("SLURM_JOB_GPUS", "0-2,5"),
            ("CUDA_VISIBLE_DEVICES", "3"),
            ("SLURM_SHARDS_ON_NODE", "3"),
        ]);
        assert_eq!(
            job_gpus(0, &all),
            Some(JobGpus {
                gpus: vec![1],
                budget_bytes: Some(3 << 30)
            })
        );
        for step in [BATCH_STEP, INTERACTIVE_STEP] {
            assert_eq!(
                job_gpus(step, &all),
                Some(JobGpus {
                    gpus: vec![0, 1, 2, 5],
                    budget_bytes: Some(3 << 30)
                })
            );
        }
        assert_eq!(job_gpus(BATCH_STEP, env(&[("SLURM_STEP_GPUS", "1")])), None);
        assert_eq!(job_gpus(7, env(&[("SLURM_JOB_GPUS", "1")])), None);
        assert_eq!(job_gpus(7, env(&[("CUDA_VISIBLE_DEVICES", "0")])), None);
        assert_eq!(job_gpus(7, env(&[("SLURM_SHARDS_ON_NODE", "3")])), None);
        assert_eq!(job_gpus(7, env(&[("SLURM_STEP_GPUS", "")])), None);
    }

    #[test]
    fn the_node_is_named_by_slurmstepd_else_by_its_topology_address() {
        let none = env(&[]);
        assert_eq!(
            node_name(
                env(&[("SLURMD_NODENAME", "n1")]),
                env(&[("SLURMD_NODENAME", "forged"), ("SLURM_TOPOLOGY_ADDR", "x")])
            ),
            Some("n1".into())
        );
        assert_eq!(
            node_name(&none, env(&[("SLURMD_NODENAME", "forged")])),
            None,
            "the job's own copy is never read"
        );
        assert_eq!(
            node_name(&none, env(&[("SLURM_TOPOLOGY_ADDR", "n2")])),
            Some("n2".into())
        );
        assert_eq!(
            node_name(&none, env(&[("SLURM_TOPOLOGY_ADDR", "s0.s1.gpu7")])),
            Some("gpu7".into())
        );
        assert_eq!(node_name(&none, &none), None);
    }

    /// An agent that accepts nothing: once its socket's backlog is full,
    /// `connect` says so at once (a blocking connect waited as long as the
    /// agent did, in slurmstepd, holding the job). The listener's backlog is
    /// set to 1 so that a few connections fill it.
    #[test]
    fn a_full_backlog_is_an_answer_not_a_wait() {
        let dir = std::env::temp_dir().join(format!("keling-spank-backlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // SAFETY: a listening socket we own; listen again only lowers its backlog.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 1) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let outcome = loop {
                match connect(&p) {
                    Ok(s) if held.len() < 64 => held.push(s),
                    Ok(_) => break Err("64 connections and the backlog never filled".to_owned()),
                    Err(e) => break Ok((held.len(), e)),
                }
            };
            let _ = tx.send(outcome);
        });
        // A generous bound that only a blocked connect reaches.
        let outcome = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("connect blocked on a full backlog");
        let (made, e) = outcome.unwrap();
        assert!(made >= 1, "the first connections wait in the backlog");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        assert!(e.to_string().contains("backlog is full"), "{e}");
        let gone = connect(&dir.join("none.sock")).unwrap_err();
        assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn priorities_and_arguments_are_checked() {
        assert_eq!(parse_priority("3"), Ok(3));
        assert!(parse_priority("16").is_err());
        assert!(parse_priority("-1").is_err());
        assert_eq!(
            parse_args(["refuse_without_agent", "run_dir=/x"]),
            Ok(PluginArgs {
                refuse_without_agent: true,
                run_dir: Some("/x".into()),
                socket: None
            })
        );
        assert!(parse_args(["run_dir=relative"]).is_err());
        assert!(parse_args(["bogus"]).is_err());
    }

    #[test]
    fn a_node_finds_its_own_agent_by_name() {
        let dir = std::env::temp_dir().join(format!("keling-spank-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("n2")).unwrap();
        std::fs::write(dir.join("n2/keling.sock"), "").unwrap();
        let args = PluginArgs {
            run_dir: Some(dir.clone()),
            ..PluginArgs::default()
        };
        assert_eq!(socket_for(&args, Some("n2")), dir.join("n2/keling.sock"));
        assert_eq!(socket_for(&args, Some("n1")), dir.join("keling.sock"));
        assert_eq!(socket_for(&args, Some("../etc")), dir.join("keling.sock"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
