//! The control protocol between the agent (`keling run`) and its clients
//! (`keling launch`, `keling status`): typed requests and replies, shared by the
//! [`server`] and the [`client`].
//!
//! A unix stream socket (default [`DEFAULT_SOCKET`]), for root and the members of
//! one group (see `sched::access`; the peer is identified with SO_PEERCRED and
//! SO_PEERGROUPS). One JSON request line per connection, at most
//! [`MAX_REQUEST_BYTES`], sent within [`REQUEST_DEADLINE`]:
//! - `{"launch": LaunchRequest}`, sent with the client's stdin/stdout/stderr as
//!   SCM_RIGHTS: the agent starts the command as a managed task on those fds (the
//!   client relays nothing), as the caller (uid, gid, groups), in the caller's
//!   directory, with the environment the request carries. It answers
//!   `{"accepted": {...}}` once the command is executing (or an error naming the
//!   step that failed) and, when the task ends, `{"exit_code": N}`. Until then the
//!   client may send `{"forward": SIGNAL}` lines (SIGINT, SIGTERM, SIGHUP or
//!   SIGQUIT): the signal goes to every process of the task, as a terminal's would
//!   to its foreground process group. (`keling launch` forwards its own Ctrl-C,
//!   SIGTERM and SIGHUP this way: the task cannot be in the client's foreground
//!   process group, since it is the agent's child in another session.)
//! - `{"status": true}`: answered with `{"status": StatusReply}`.
//! - `{"export": "prometheus"}` (or another [`ExportFormat`]): `{"export": "text"}`.
//! - `{"signal": {"task": ID, "signal": N}}`: signal a task (its owner or root):
//!   `{"signalled": COUNT}`.
//!
//! Anything else is answered with `{"error": "what is wrong"}` and the connection is
//! closed.
use std::{
    collections::BTreeMap,
    os::fd::{FromRawFd, OwnedFd, RawFd},
    path::PathBuf,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::latency::{LatencyStatus, Percentiles};

pub mod client;
pub mod server;

pub const DEFAULT_SOCKET: &str = "/run/keling/keling.sock";
/// The most bytes a request may have (a launch carries the caller's environment).
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;
/// The signals a launch's client may forward to its task.
pub const FORWARDED_SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
/// How long a client has to send its request once connected.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// What `keling launch` asks for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub priority: Option<u8>,
    /// None: the config's rule or automatic placement.
    pub gpu: Option<u32>,
    pub max_duration_ms: Option<u64>,
    pub grace_ms: Option<u64>,
    pub mem_quota_bytes: Option<u64>,
    pub hard_kill: Option<bool>,
    pub expected_runtime_ms: Option<u64>,
    /// The caller's environment, `KEY=VALUE` each: the task gets exactly this (and
    /// `CUDA_VISIBLE_DEVICES`). `None`: a minimal one (`PATH` only).
    #[serde(default)]
    pub env: Option<Vec<String>>,
}

/// A signal for a task (its owner or root may send one).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    pub task: u64,
    pub signal: i32,
}

/// A latency export format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ExportFormat {
    /// Prometheus text exposition.
    Prometheus,
    /// HdrHistogram percentile table.
    Percentiles,
    /// HdrHistogram interval log (V2, compressed).
    IntervalLog,
    /// JSON.
    Json,
    /// Which timeout each model would have chosen, and how many decisions each
    /// would have called late.
    Tune,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Launch(LaunchRequest),
    Status(bool),
    /// Latency figures in an export format.
    Export(ExportFormat),
    /// Signal a task.
    Signal(SignalRequest),
    /// After a launch, on its connection: a signal for that task.
    Forward(i32),
}

/// Where a launched task went.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Accepted {
    pub task: u64,
    pub gpu: Option<u32>,
    pub pid: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Accepted(Accepted),
    /// The launched task ended with this code (128 + N for signal N).
    ExitCode(i32),
    Status(Box<StatusReply>),
    Export(String),
    /// How many processes a signal reached.
    Signalled(usize),
    Error(String),
}

/// One task in `keling status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskStatus {
    pub id: u64,
    pub pid: u32,
    pub name: String,
    pub priority: u8,
    pub class: keling_sched::Class,
    /// `RUNNING`, `PREEMPTED`, ...
    pub state: String,
    pub gpu: Option<u32>,
    /// GPU memory held, all GPUs.
    pub mem_bytes: u64,
    pub mem_bytes_per_gpu: BTreeMap<u32, u64>,
    pub on_gpu_ms: u64,
    pub elapsed_ms: u64,
    pub wants_gpu: bool,
    pub in_flight: Option<keling_sched::ActionKind>,
    /// The task's cgroup (tasks Keling launched); bytes that are not UTF-8 are
    /// shown as U+FFFD.
    pub cgroup: Option<String>,
    /// Whose task it is: the launching user, or the adopted process's real uid.
    #[serde(default)]
    pub uid: Option<u32>,
}

/// Placement: each GPU's weight (higher is better) and how evenly memory is spread.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PlacementStatus {
    pub weights: Vec<(u32, f64)>,
    /// (max - min) / mean of the bytes used per GPU.
    pub load_balance_error: f64,
}

/// What `keling status` shows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatusReply {
    pub tasks: Vec<TaskStatus>,
    pub latency: LatencyStatus,
    /// Per action (freeze, thaw), per stage.
    pub stages_by_action: BTreeMap<String, BTreeMap<String, Percentiles>>,
    pub placement: PlacementStatus,
}

/// Sends `data` with `fds` attached (SCM_RIGHTS).
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: the control buffer is CMSG_SPACE bytes, room for one header + fds.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            fds.len(),
        );
    }
    // SAFETY: a fully initialised msghdr on a connected socket.
    if unsafe { libc::sendmsg(sock, &msg, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Receives what is waiting, at most `max` bytes, with up to 3 fds.
/// Returns (bytes, fds); fds beyond 3 are closed by the kernel (MSG_CTRUNC).
pub fn recv_with_fds(sock: RawFd, max: usize) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a size computation.
    let space = unsafe { libc::CMSG_SPACE(3 * size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: as in send_with_fds.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: valid buffers; MSG_CMSG_CLOEXEC so received fds never leak into execs.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((buf, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_stable() {
        let r: Request = serde_json::from_str(r#"{"export":"interval-log"}"#).unwrap();
        assert_eq!(r, Request::Export(ExportFormat::IntervalLog));
        let r: Request = serde_json::from_str(r#"{"status":true}"#).unwrap();
        assert_eq!(r, Request::Status(true));
        assert_eq!(
            serde_json::to_string(&Reply::ExitCode(3)).unwrap(),
            r#"{"exit_code":3}"#
        );
        assert_eq!(
            serde_json::to_string(&Reply::Accepted(Accepted {
                task: 1,
                gpu: Some(0),
                pid: 9
            }))
            .unwrap(),
            r#"{"accepted":{"task":1,"gpu":0,"pid":9}}"#
        );
        assert!(
            serde_json::from_str::<Request>(r#"{"launch":{"argv":[],"cwd":"/","x":1}}"#).is_err()
        );
        let r: Request = serde_json::from_str(r#"{"forward":2}"#).unwrap();
        assert_eq!(r, Request::Forward(2));
        let r: Request = serde_json::from_str(r#"{"signal":{"task":3,"signal":15}}"#).unwrap();
        assert_eq!(
            r,
            Request::Signal(SignalRequest {
                task: 3,
                signal: 15
            })
        );
        // A launch without `env` (an older client) still reads.
        let r: Request = serde_json::from_str(
            r#"{"launch":{"argv":["x"],"cwd":"/","priority":null,"gpu":null,"max_duration_ms":null,"grace_ms":null,"mem_quota_bytes":null,"hard_kill":null,"expected_runtime_ms":null}}"#,
        )
        .unwrap();
        assert!(matches!(
            r,
            Request::Launch(LaunchRequest { env: None, .. })
        ));
        assert_eq!(
            serde_json::to_string(&Reply::Signalled(2)).unwrap(),
            r#"{"signalled":2}"#
        );
    }
}
