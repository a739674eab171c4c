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
//!   step that failed) and, when the task ends, `{"exit_code": N}`. Between them
//!   come `{"notice": ...}` lines ([`Notice`]): the placement (just before
//!   `accepted`; a command that fails to start gets only its error), the duration warning,
//!   the 4003 record, an eviction or quota end and why the task ended when Keling
//!   ended it, and (with `notify_preempt`) each freeze and resume; a notice always
//!   precedes the `exit_code` it explains. Notices go through a bounded queue per
//!   client: one that does not read loses the excess (and is told how many),
//!   never the `accepted` or `exit_code`, and never slows the agent. Until then the
//!   client may send `{"forward": SIGNAL}` lines (SIGINT, SIGTERM, SIGHUP or
//!   SIGQUIT): the signal goes to every process of the task, as a terminal's would
//!   to its foreground process group. (`keling launch` forwards its own Ctrl-C,
//!   SIGTERM and SIGHUP this way: the task cannot be in the client's foreground
//!   process group, since it is the agent's child in another session.)
//!   `priority` is 0-15 (anything else is refused, not clamped) and each `env`
//!   entry is `KEY=VALUE` with a key and no NUL (else refused, the entry named).
//!   At most 3 fds may come with a request; more, and the client is dropped.
//! - `{"status": true}`: answered with `{"status": StatusReply}` (whose tasks are
//!   marked `mine` when they belong to the caller). It lists every live task and
//!   only the [`STATUS_ARCHIVED_DEFAULT`] archived tasks that finished last, with
//!   counts of the rest ([`ArchiveSummary`]); `{"status_page": {"archived": N,
//!   "skip": M}}` lists others ([`StatusPage`]).
//! - `{"history": TASK}`: answered with `{"history": TaskHistory}`: the task now,
//!   its transitions and its decisions with their latencies.
//! - `{"export": "prometheus"}` (or another [`ExportFormat`]): `{"export": "text"}`.
//! - `{"signal": {"task": ID, "signal": N}}`: signal a task (its owner or root):
//!   `{"signalled": COUNT}`.
//! - `{"attach": {"task": ID, "pid": PID}}`: after an agent restart, the client
//!   of a launch reconnects to its task (its owner or root only; [`AttachRequest`]).
//!   Answered as a launch is, from `accepted` on; `forward` lines may follow.
//! - `{"gpus": true}`: the GPUs the agent schedules and their capacities
//!   (`keling slurm gres`): `{"gpus": [GpuInfo]}`.
//! - `{"slurm_attach": SlurmAttachRequest}` ([`SlurmAttachRequest`]), root only and for the
//!   caller's own process (SO_PEERCRED pid), with at most one fd (the task's
//!   standard error): the Slurm plugin hands a job step's task to the agent
//!   before it execs. It becomes a task in a cgroup of its own, answered with
//!   `{"accepted": {...}}` once it is in it and tracked; what `keling launch`
//!   would print about it goes to that fd (see `crate::slurm`).
//!
//! Anything else is answered with `{"error": {"kind": "invalid", "message": "what is
//! wrong"}}` and the connection is closed. Every failure is such an
//! [`ReplyError`]: its [`ErrorKind`] tells a refusal (`refused`, `not_permitted`)
//! from a command that could not start (`start_failed`), one that was ended while
//! queued (`never_ran`), a task that is not there (`not_found`), a malformed
//! request (`invalid`) and the agent's own trouble (`internal`).
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
    /// Also push [`Notice::Frozen`] and [`Notice::Resumed`] (`--notify-preempt`).
    /// Left out of the line when false, so an older agent still reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_preempt: bool,
}

/// A Slurm job step's task: which job, step and task it is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlurmRef {
    pub job: u32,
    /// The step id; Slurm's batch step is 0xfffffffb, shown as `batch`.
    pub step: u32,
    /// The task's global id in the step.
    #[serde(default)]
    pub task: u32,
}

impl SlurmRef {
    /// Slurm's id of a batch script's step.
    pub const BATCH_STEP: u32 = 0xffff_fffb;
    /// Slurm's id of a job's extern step.
    pub const EXTERN_STEP: u32 = 0xffff_fffc;

    /// `JOB.STEP` as Slurm writes it (`12.0`, `12.batch`).
    pub fn step_label(&self) -> String {
        match self.step {
            Self::BATCH_STEP => format!("{}.batch", self.job),
            Self::EXTERN_STEP => format!("{}.extern", self.job),
            s => format!("{}.{s}", self.job),
        }
    }
}

/// What the Slurm plugin (`keling-spank`) asks for a job step's task, from inside
/// that task before it execs (as root): make this process a task.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlurmAttachRequest {
    /// The process: the caller itself (checked against SO_PEERCRED).
    pub pid: u32,
    /// The job's owner: whose task it is, and whose access rules apply.
    pub uid: u32,
    pub gid: u32,
    pub slurm: SlurmRef,
    /// The GPU indices of its allocation on this node; the task's GPU is the first.
    pub gpus: Vec<u32>,
    /// Its memory budget on that GPU (its shards, 1 GiB each); `None`: whole GPUs.
    pub mem_budget_bytes: Option<u64>,
    /// `--gpu-priority`; `None`: the config's rule or the default.
    pub priority: Option<u8>,
    /// Also tell it each freeze and resume (`--gpu-notify-preempt`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_preempt: bool,
    /// The owner's supplementary groups in the job (whose `[[grant]] group=`
    /// applies); empty from a plugin that does not send them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
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
    /// One task's history (`keling status TASK`).
    History(u64),
    /// Status listing other archived tasks than `{"status": true}` does.
    StatusPage(StatusPage),
    /// A launch's client reconnects to its task after the agent restarted.
    Attach(AttachRequest),
    /// The GPUs the agent schedules, with their capacities.
    Gpus(bool),
    /// A Slurm job step's task, handed over by the plugin (root only).
    SlurmAttach(SlurmAttachRequest),
}

/// `{"attach": {"task": ID, "pid": PID}}`: the client of a launch whose agent
/// went away reconnects to its task (now the new agent's). Only the task's
/// owner (by SO_PEERCRED) or root may; `pid` is the task's root process as
/// `accepted` said it. Answered like a launch: `accepted`, notices, then
/// `exit_code` (or an `exit_unknown` error).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub task: u64,
    pub pid: u32,
    /// Also push freeze and resume notices.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_preempt: bool,
}

/// Archived tasks a status lists when not asked for others, and the most one
/// lists: a reply's size is bounded whatever the archive holds.
pub const STATUS_ARCHIVED_DEFAULT: usize = 50;
pub const STATUS_ARCHIVED_MAX: usize = 1000;

/// Which archived tasks a status lists (`{"status_page": {"archived": N, "skip":
/// M}}`): the `archived` (at most [`STATUS_ARCHIVED_MAX`]) that finished last
/// after skipping the `skip` that finished after them. Live tasks are always
/// listed in full.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StatusPage {
    #[serde(default = "default_archived")]
    pub archived: usize,
    #[serde(default)]
    pub skip: usize,
}

fn default_archived() -> usize {
    STATUS_ARCHIVED_DEFAULT
}

impl Default for StatusPage {
    fn default() -> Self {
        Self {
            archived: STATUS_ARCHIVED_DEFAULT,
            skip: 0,
        }
    }
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
    Error(ReplyError),
    /// Something Keling did to a launched task, pushed to its client while it runs.
    Notice(Notice),
    /// One task's history.
    History(Box<TaskHistory>),
    /// The GPUs the agent schedules.
    Gpus(Vec<keling_sched::GpuInfo>),
}

/// What kind of failure a [`Reply::Error`] is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed, or asks for something that does not exist (a
    /// signal number out of range, no command).
    Invalid,
    /// The access rules refuse it (a priority or a quota not the caller's).
    Refused,
    /// The task is not there (finished and forgotten, or never was).
    NotFound,
    /// The task is someone else's.
    NotPermitted,
    /// The command could not be started (which step failed and why).
    StartFailed,
    /// The task was ended while it waited queued: its command never ran.
    NeverRan,
    /// The agent could not do it (a cgroup it could not make, an export that
    /// failed).
    Internal,
    /// The task ended, but how cannot be known: it was taken back after a
    /// restart (not the agent's child) and the trace lost its exit event.
    ExitUnknown,
    /// The agent does not take the task on where the host is set up so (a Slurm
    /// job step's task in Slurm's own cgroup): the task runs without Keling.
    Unsupported,
}

/// A failure, as the control socket answers it: `{"error": {"kind", "message"}}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ReplyError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ReplyError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ReplyError {
            kind,
            message: message.into(),
        }
    }
}

/// A task named in a notice or a status: which one, and its priority.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TaskRef {
    pub task: u64,
    pub name: String,
    pub priority: u8,
}

/// What Keling tells a launch's client about its task, as it happens (on the
/// launch's connection, before its `exit_code`). Pushed through a bounded queue:
/// a client that does not read them loses the excess, and hears how many with
/// [`Notice::Dropped`]; it never slows the agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Notice {
    /// Late binding: the task waits unbound, held before exec, in the host-level
    /// queue at `position` (1: bound next), behind `ahead` tasks, for `reason`.
    /// `placed` follows when a GPU can run it.
    Queued {
        task: u64,
        pid: u32,
        position: usize,
        ahead: usize,
        reason: keling_sched::WaitReason,
    },
    /// The task was placed on a GPU (told once its command is executing, just
    /// before `accepted`; or at once when a running task is placed again).
    Placed {
        task: u64,
        pid: u32,
        gpu: u32,
        priority: u8,
    },
    /// The session duration limit is `remaining_ms` away; at the limit the task
    /// is killed (`hard_kill`) or sent SIGTERM, then killed.
    Warning {
        task: u64,
        remaining_ms: u64,
        allowed_ms: u64,
        hard_kill: bool,
    },
    /// The limit was reached: the 4003 record, as the scheduling log has it.
    Enforcement {
        task: u64,
        record: keling_sched::EnforcementRecord,
    },
    /// Keling is ending the task for `reason` (`duration_limit`,
    /// `evicted_for_memory`, `over_quota`) and sent it `signal`.
    Ending {
        task: u64,
        reason: keling_sched::Reason,
        signal: i32,
        /// Eviction: the higher-priority task that needed the memory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evicted_for: Option<TaskRef>,
        /// Eviction: the bytes it was short of on `gpu`; quota: the bytes held.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        /// Quota: the task's quota.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quota_bytes: Option<u64>,
    },
    /// The task ended after Keling started ending it: why, and its exit code.
    Ended {
        task: u64,
        reason: keling_sched::Reason,
        exit_code: i32,
    },
    /// The task was frozen (`--notify-preempt`): why, and the task(s) holding
    /// its GPU now.
    Frozen {
        task: u64,
        reason: keling_sched::Reason,
        yielded_to: Vec<TaskRef>,
    },
    /// The task runs again after `frozen_ms` frozen (`--notify-preempt`).
    Resumed { task: u64, frozen_ms: u64 },
    /// `count` notices were dropped: the client did not read them in time.
    Dropped { count: u64 },
}

/// Why a preempted task waits (in [`TaskStatus`]).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Waiting {
    /// The reason of its last move to PREEMPTED (`preempted_by_higher_priority`,
    /// `quantum_expired`, `round_robin`, `idle`, `queued`).
    pub reason: keling_sched::Reason,
    /// The tasks holding its GPU's slots now.
    pub behind: Vec<TaskRef>,
    /// How long it has been preempted, ms.
    pub for_ms: u64,
}

/// One decision about a task and its latency, stage by stage (ns), from the
/// kernel event that caused it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DecisionRecord {
    /// `freeze`, `thaw`, `stop`, `terminate`, `kill`, `place`, `warn`.
    pub action: String,
    /// When it was decided (CLOCK_MONOTONIC).
    pub decided_ns: u64,
    pub delivery_ns: u64,
    pub decision_ns: u64,
    pub actuation_ns: u64,
    /// `None`: nothing to confirm, or never confirmed.
    pub confirmation_ns: Option<u64>,
    pub end_to_end_ns: u64,
    /// The timeout it was judged against, and whether it was over it.
    pub timeout_ns: u64,
    pub late: bool,
}

/// `keling status TASK`: one task now, its transitions and its decisions (the
/// most recent [`HISTORY_MAX`] of each).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskHistory {
    pub task: TaskStatus,
    /// The core's clock at its arrival (the transitions' and decisions' zero).
    pub arrived_ns: u64,
    pub transitions: Vec<keling_sched::Transition>,
    pub decisions: Vec<DecisionRecord>,
    /// Older entries no longer kept.
    pub transitions_dropped: u64,
    pub decisions_dropped: u64,
}

/// The most transitions, and decisions, kept per task.
pub const HISTORY_MAX: usize = 256;

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
    /// `mem_bytes` may be wrong: a kernel table Keling needed for the task's books
    /// was full. Its quota is not enforced on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mem_unsure: bool,
    pub on_gpu_ms: u64,
    pub elapsed_ms: u64,
    pub wants_gpu: bool,
    /// `RUNNING` without its slot: idle, it gave the slot to a waiting task
    /// without being frozen.
    #[serde(default)]
    pub yielded: bool,
    pub in_flight: Option<keling_sched::ActionKind>,
    /// The task's cgroup (tasks Keling launched); bytes that are not UTF-8 are
    /// shown as U+FFFD.
    pub cgroup: Option<String>,
    /// Whose task it is: the launching user, or the adopted process's real uid.
    #[serde(default)]
    pub uid: Option<u32>,
    /// A Slurm job step's task: its job, step and task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmRef>,
    /// Its GPU memory quota (a Slurm task's budget: its shards), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_quota_bytes: Option<u64>,
    /// The task belongs to the user asking (SO_PEERCRED).
    #[serde(default)]
    pub mine: bool,
    /// How long it has been in its state, ms.
    #[serde(default)]
    pub state_for_ms: u64,
    /// PREEMPTED tasks: why they wait.
    #[serde(default)]
    pub waiting: Option<Waiting>,
    /// Tasks queued unbound (late binding): where they stand and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<keling_sched::QueuedView>,
    /// What a task that waits (queued, frozen, or arrived and not running)
    /// waits for: `memory`, `slots_held` (a cap), `higher_priority`, `ending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_reason: Option<keling_sched::WaitReason>,
    /// The GPU its launch or rule pinned it to (it waits for that one only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_gpu: Option<u32>,
    /// Why Keling is ending it (`duration_limit`, `evicted_for_memory`,
    /// `over_quota`, `overloaded`), once it started to.
    #[serde(default)]
    pub ending_reason: Option<keling_sched::Reason>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// Placement: each GPU's weight (higher is better) and how evenly memory is spread.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PlacementStatus {
    pub weights: Vec<(u32, f64)>,
    /// (max - min) / mean of the bytes used per GPU.
    pub load_balance_error: f64,
}

/// One GPU's memory as the scheduler sees it (`keling status`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GpuMemoryStatus {
    pub gpu: u32,
    pub capacity_bytes: u64,
    /// Held by the live tasks (running, frozen or waiting: frozen tasks keep theirs).
    pub tasks_bytes: u64,
    /// Held by processes in no task.
    pub outside_bytes: u64,
    /// Capacity less both.
    pub free_bytes: u64,
}

/// What `keling status` shows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatusReply {
    /// The uid of the client that asked (SO_PEERCRED).
    #[serde(default)]
    pub caller_uid: Option<u32>,
    pub tasks: Vec<TaskStatus>,
    pub latency: LatencyStatus,
    /// Per action (freeze, thaw), per stage.
    pub stages_by_action: BTreeMap<String, BTreeMap<String, Percentiles>>,
    pub placement: PlacementStatus,
    /// The archive: how many finished tasks are kept and how many `tasks` lists.
    #[serde(default)]
    pub archive: ArchiveSummary,
    /// Per configured GPU: its memory (capacity, tasks, outside, free).
    #[serde(default)]
    pub gpus: Vec<GpuMemoryStatus>,
}

/// Finished tasks: the archive and what became of them since the agent started.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// Archived tasks kept now.
    pub kept: usize,
    /// Of them, how many the reply lists (the last to finish after `skipped`).
    pub listed: usize,
    pub skipped: usize,
    /// How many are kept at most, and how long, s.
    pub max_kept: usize,
    pub retention_s: u64,
    /// Since the agent started: tasks that completed, that failed, and archived
    /// tasks forgotten (past the retention window or over `max_kept`).
    pub completed: u64,
    pub failed: u64,
    pub forgotten: u64,
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

    /// A client tells a refusal from a failed start by the error's kind, on the
    /// wire as `{"error": {"kind", "message"}}`.
    #[test]
    fn errors_carry_their_kind() {
        let e = Reply::Error(ReplyError::new(
            ErrorKind::Refused,
            "priority 1 is not allowed",
        ));
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(
            text,
            r#"{"error":{"kind":"refused","message":"priority 1 is not allowed"}}"#
        );
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), e);
        let never: Reply =
            serde_json::from_str(r#"{"error":{"kind":"never_ran","message":"x"}}"#).unwrap();
        assert!(matches!(
            never,
            Reply::Error(ReplyError {
                kind: ErrorKind::NeverRan,
                ..
            })
        ));
    }

    #[test]
    fn wire_format_is_stable() {
        let r: Request = serde_json::from_str(r#"{"export":"interval-log"}"#).unwrap();
        assert_eq!(r, Request::Export(ExportFormat::IntervalLog));
        let r: Request = serde_json::from_str(r#"{"status":true}"#).unwrap();
        assert_eq!(r, Request::Status(true));
        let r: Request = serde_json::from_str(r#"{"status_page":{"skip":3}}"#).unwrap();
        assert_eq!(
            r,
            Request::StatusPage(StatusPage {
                archived: STATUS_ARCHIVED_DEFAULT,
                skip: 3
            })
        );
        assert!(serde_json::from_str::<Request>(r#"{"status_page":{"archived":-1}}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"status_page":{"all":true}}"#).is_err());
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
