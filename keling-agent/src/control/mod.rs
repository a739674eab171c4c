//! The control protocol between the agent (`keling run`) and its clients
//! (`keling launch`, `keling status`): typed requests and replies, shared by the
//! [`server`] and the [`client`].
//!
//! A unix stream socket (default [`DEFAULT_SOCKET`]). One JSON request line per
//! connection, at most [`MAX_REQUEST_BYTES`], sent within [`REQUEST_DEADLINE`]:
//! - `{"launch": LaunchRequest}`, sent with the client's stdin/stdout/stderr as
//!   SCM_RIGHTS: the agent starts the command as a managed task on those fds (the
//!   client relays nothing), answers `{"accepted": {...}}` and, when the task ends,
//!   `{"exit_code": N}`.
//! - `{"status": true}`: answered with `{"status": StatusReply}`.
//! - `{"export": "prometheus"}` (or another [`ExportFormat`]): `{"export": "text"}`.
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
/// The most bytes a request may have.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
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
    /// The task's cgroup (tasks Keling launched).
    pub cgroup: Option<PathBuf>,
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

/// Receives one message of at most [`MAX_REQUEST_BYTES`] with up to 3 fds.
/// Returns (bytes, fds); fds beyond 3 are closed by the kernel (MSG_CTRUNC).
pub fn recv_with_fds(sock: RawFd) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
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
    }
}
