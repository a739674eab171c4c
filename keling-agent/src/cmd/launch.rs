//! `keling launch`: run a command as a task of the running agent, on this terminal.
//!
//! The task runs as the caller (uid, gid, groups), in the caller's directory, with
//! the caller's environment; its stdin, stdout and stderr are this command's. The
//! agent starts it, so it is not in this terminal's foreground process group:
//! Ctrl-C, SIGTERM, SIGHUP and SIGQUIT sent to `keling launch` are forwarded over
//! the connection, and the agent sends them to every process of the task. Three
//! Ctrl-C within two seconds leave without waiting (the task runs on). Ctrl-Z stops
//! this command only.
//!
//! What Keling does to the task is told on this command's standard error, each
//! line starting with [`PREFIX`] so it cannot be mistaken for the task's output:
//! the placement, the duration warning, the 4003 record, an eviction or quota end,
//! why the task ended when Keling ended it, and with `--notify-preempt` each freeze
//! and resume. The agent pushes them on the launch's connection as they happen
//! ([`Notice`]); [`notice_line`] turns one into its line. `--quiet` prints none.
//!
//! When the agent goes away while the task runs (a restart), the client waits
//! for the next one (`--reconnect-timeout`) and sends it `attach` for its task:
//! the new agent took the task back from its record, and the client goes on as
//! before. Otherwise it exits [`EXIT_AGENT_GONE`] (the task runs on unmanaged),
//! or [`EXIT_STATUS_UNKNOWN`] when the task ended and how cannot be known.
use std::{
    ffi::OsString,
    io::Write,
    os::unix::net::UnixStream,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use super::human;
use crate::control::{
    AttachRequest, ErrorKind, FORWARDED_SIGNALS, LaunchRequest, Notice, Reply, Request, TaskRef,
    client::Connection,
};

/// What starts every line Keling itself prints on a launch's standard error.
pub const PREFIX: &str = "keling: ";

/// `keling launch`'s exit code when the agent went away (stopped, restarted,
/// killed) while the task still runs: the task goes on, unmanaged, and its exit
/// code cannot be told (EX_TEMPFAIL; a task's own codes are its, 1 is Keling's
/// other errors).
pub const EXIT_AGENT_GONE: i32 = 75;

/// `keling launch`'s code when its task ended but its exit status cannot be
/// known: it ended while no agent ran (the agent restarted), or the agent that
/// took it back after a restart (not its parent) did not see its exit.
pub const EXIT_STATUS_UNKNOWN: i32 = 76;

/// How long `keling launch` waits by default for an agent that went away to
/// come back, before it leaves the task running on unmanaged.
pub const RECONNECT_TIMEOUT_S: u64 = 60;
/// How often it says it is still waiting.
const RECONNECT_PROGRESS: Duration = Duration::from_secs(5);
/// How often it tries the socket.
const RECONNECT_POLL: Duration = Duration::from_millis(200);

/// The task this client launched: its id and root process (pid and start time,
/// read when the agent said it was accepted).
struct Launched {
    task: u64,
    pid: u32,
    start_ticks: Option<u64>,
}

impl Launched {
    /// Whether the task's root process still runs (the same process: same start
    /// time).
    fn runs(&self) -> bool {
        let now = crate::os::proc::start_ticks(self.pid);
        now.is_some() && now == self.start_ticks
    }
}

/// The connection closed before the task ended: what happened, in words, and
/// the exit code.
fn agent_gone(launched: Option<&Launched>) -> anyhow::Result<i32> {
    match launched {
        Some(l) if l.runs() => {
            eprintln!(
                "{PREFIX}the agent went away (stopped or restarted) while task {} ran: the task \
                 goes on, no longer scheduled by Keling, as pid {} (its exit code cannot be \
                 told here; `kill {}` ends it); exit code {EXIT_AGENT_GONE}",
                l.task, l.pid, l.pid
            );
            Ok(EXIT_AGENT_GONE)
        }
        Some(l) => bail!(
            "the agent closed the connection before it said how task {} (pid {}) ended, and \
             that process is gone: its exit code is unknown",
            l.task,
            l.pid
        ),
        None => bail!("the agent closed the connection before the task ended (did it stop?)"),
    }
}

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Priority 0-15 (0 highest): real-time 0-2, interactive 3-6, background 7-15.
    /// The agent's config says which a user may use (real-time is root's by default).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=15))]
    pub priority: Option<u8>,
    /// GPU index, or `auto` to let Keling place the task (CUDA_VISIBLE_DEVICES
    /// tells the task where it went).
    #[arg(long, default_value = "auto")]
    pub gpu: String,
    /// Session duration limit in ms (default 3 600 000, or the config's).
    #[arg(long, env = "KELING_MAX_DURATION_MS", value_name = "MS")]
    pub max_duration_ms: Option<u64>,
    /// Warning window before the limit, in ms (default 30 000).
    #[arg(long, env = "KELING_GRACE_PERIOD_MS", value_name = "MS")]
    pub grace_ms: Option<u64>,
    /// Kill at the limit (true) or send SIGTERM and kill after a grace (false).
    #[arg(long, env = "KELING_HARD_KILL", value_name = "BOOL")]
    pub hard_kill: Option<bool>,
    /// GPU memory quota in bytes: going over it ends the task.
    #[arg(long, value_name = "BYTES")]
    pub mem_quota: Option<u64>,
    /// How long the task is expected to run, in ms (memory-pressure victims must
    /// have more than 3 s left).
    #[arg(long, value_name = "MS")]
    pub expected_runtime_ms: Option<u64>,
    /// The agent's control socket (default: the instance's, `/run/keling/keling.sock`
    /// or `/run/keling/NAME/keling.sock` with `--instance NAME`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print none of Keling's notices (errors still are); the exit code is the
    /// command's either way.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print each notice as one JSON object after `keling: `: the 4003 record
    /// exactly as the design has it, the others as the control protocol's notices.
    #[arg(long)]
    pub json: bool,
    /// Also tell when the task is frozen (who it yielded to) and resumed (after
    /// how long).
    #[arg(long)]
    pub notify_preempt: bool,
    /// When the agent goes away while the task runs (a restart), try its socket
    /// this long, s, to attach to the task again under the next agent; 0: do
    /// not wait (the task goes on unmanaged, exit code 75).
    #[arg(long, default_value_t = RECONNECT_TIMEOUT_S, value_name = "SECS")]
    pub reconnect_timeout: u64,
    /// The command, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// This process's environment as `KEY=VALUE` strings (entries that are not UTF-8
/// cannot travel in the JSON request: they are left out, and said so).
fn environment() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, v)| match (k.to_str(), v.to_str()) {
            (Some(k), Some(v)) => Some(format!("{k}={v}")),
            _ => {
                log::warn!(
                    "environment variable {} is not UTF-8: the task will not have it",
                    k.to_string_lossy()
                );
                None
            }
        })
        .collect()
}

/// The signals forwarded, as a set.
fn forwarded_set() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is initialised by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset_t pointer; valid signal numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in FORWARDED_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Where forwarded signals go: the connection of the moment (replaced when the
/// client attaches again after a restart).
type ToAgent = std::sync::Arc<std::sync::Mutex<UnixStream>>;

/// Blocks the forwarded signals in this (still single-threaded) process and
/// starts a thread that takes them with `sigwait` and sends each to the agent.
fn forward_signals(to_agent: ToAgent, quiet: bool) {
    let set = forwarded_set();
    // SAFETY: blocking signals in the calling thread; threads started after
    // inherit the mask, so only `sigwait` below ever takes them.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    std::thread::spawn(move || {
        let mut interrupts: Vec<Instant> = Vec::new();
        loop {
            let mut sig = 0;
            // SAFETY: valid set and out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if sig == libc::SIGINT {
                let now = Instant::now();
                interrupts.retain(|t| now.duration_since(*t) < Duration::from_secs(2));
                interrupts.push(now);
                if interrupts.len() >= 3 {
                    if !quiet {
                        eprintln!("{PREFIX}leaving without waiting; the task runs on");
                    }
                    std::process::exit(130);
                }
            }
            // Lost while no agent runs (the task has no scheduler to pass it on).
            let mut stream = to_agent.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(stream, "{{\"forward\":{sig}}}");
        }
    });
}

/// `keling launch`: runs CMD as a managed task; returns its exit code.
pub fn launch(args: LaunchArgs) -> anyhow::Result<i32> {
    let socket = (args.socket.clone()).unwrap_or_else(|| crate::instance::current().socket());
    let gpu = match args.gpu.as_str() {
        "auto" => None,
        g => Some(
            g.parse()
                .with_context(|| format!("--gpu {g}: a GPU index or `auto`"))?,
        ),
    };
    let req = Request::Launch(LaunchRequest {
        argv: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir()?,
        priority: args.priority,
        gpu,
        max_duration_ms: args.max_duration_ms,
        grace_ms: args.grace_ms,
        mem_quota_bytes: args.mem_quota,
        hard_kill: args.hard_kill,
        expected_runtime_ms: args.expected_runtime_ms,
        env: Some(environment()),
        notify_preempt: args.notify_preempt && !args.quiet,
    });
    let mut conn = Connection::request(&socket, &req, &[0, 1, 2])?;
    let to_agent: ToAgent = std::sync::Arc::new(std::sync::Mutex::new(
        conn.sender().context("clone the connection")?,
    ));
    forward_signals(to_agent.clone(), args.quiet);
    let mut launched: Option<Launched> = None;
    // Attached again after a restart: its errors mean another thing.
    let mut attached = false;
    loop {
        let reply = match conn.next_reply() {
            Ok(r) => r,
            // A reset, as an agent that dies may leave: the same as a close.
            Err(e) if launched.is_some() && e.downcast_ref::<std::io::Error>().is_some() => None,
            Err(e) => return Err(e),
        };
        match reply {
            None => {
                let Some(l) = launched.as_ref().filter(|l| l.runs()) else {
                    return agent_gone(launched.as_ref());
                };
                if args.reconnect_timeout == 0 {
                    return agent_gone(launched.as_ref());
                }
                match reattach(&socket, l, &args) {
                    Reattach::Connected(c) => {
                        conn = c;
                        attached = true;
                        if let Ok(s) = conn.sender() {
                            *to_agent.lock().unwrap_or_else(|e| e.into_inner()) = s;
                        }
                    }
                    Reattach::NoAgent => return agent_gone(launched.as_ref()),
                    Reattach::Ended => {
                        eprintln!(
                            "{PREFIX}task {} (pid {}) ended while no agent ran: its exit status \
                             cannot be known; exit code {EXIT_STATUS_UNKNOWN}",
                            l.task, l.pid
                        );
                        return Ok(EXIT_STATUS_UNKNOWN);
                    }
                }
            }
            Some(Reply::ExitCode(code)) => return Ok(code),
            Some(Reply::Error(err)) => match err.kind {
                ErrorKind::ExitUnknown => {
                    eprintln!("{PREFIX}{err}; exit code {EXIT_STATUS_UNKNOWN}");
                    return Ok(EXIT_STATUS_UNKNOWN);
                }
                ErrorKind::NotFound if attached => {
                    eprintln!("{PREFIX}{err}; exit code {EXIT_STATUS_UNKNOWN}");
                    return Ok(EXIT_STATUS_UNKNOWN);
                }
                ErrorKind::NotPermitted | ErrorKind::Refused if attached => {
                    bail!("the agent refused to attach this client to its task again: {err}")
                }
                ErrorKind::Invalid | ErrorKind::Refused | ErrorKind::NotPermitted => {
                    bail!("the agent refused the task: {err}")
                }
                ErrorKind::StartFailed => bail!("the task could not start: {err}"),
                // It was accepted and queued, and ended before it started.
                ErrorKind::NeverRan
                | ErrorKind::NotFound
                | ErrorKind::Internal
                | ErrorKind::Unsupported => bail!("{err}"),
            },
            Some(Reply::Accepted(a)) => {
                if let Some(l) = launched.as_ref().filter(|l| l.task == a.task) {
                    if !args.quiet {
                        eprintln!(
                            "{PREFIX}attached again to task {} (pid {}): the agent is back and \
                             schedules it",
                            l.task, l.pid
                        );
                    }
                    continue;
                }
                log::debug!("launched as task {} on GPU {:?}", a.task, a.gpu);
                launched = Some(Launched {
                    task: a.task,
                    pid: a.pid,
                    start_ticks: crate::os::proc::start_ticks(a.pid),
                });
            }
            Some(Reply::Notice(n)) if !args.quiet => {
                // One write per line, so it never interleaves with the task's own
                // output mid-line.
                let line = format!("{PREFIX}{}\n", notice_line(&n, args.json));
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(line.as_bytes());
                let _ = err.flush();
            }
            Some(Reply::Notice(_)) => {}
            Some(other) => bail!("unexpected reply from the agent: {other:?}"),
        }
    }
}

/// What came of waiting for the agent to come back.
enum Reattach {
    /// An agent answers at the socket: the attach request is sent (its reply,
    /// `accepted` or an error, is the next one read).
    Connected(Connection),
    /// None came back in time: the task goes on unmanaged.
    NoAgent,
    /// The task ended while no agent ran.
    Ended,
}

/// The agent went away while task `l` runs: tries the socket every
/// [`RECONNECT_POLL`] for `--reconnect-timeout`, saying so on standard error,
/// and sends `attach` to the first agent that answers.
fn reattach(socket: &std::path::Path, l: &Launched, args: &LaunchArgs) -> Reattach {
    let window = Duration::from_secs(args.reconnect_timeout);
    let started = Instant::now();
    if !args.quiet {
        eprintln!(
            "{PREFIX}the agent went away while task {} (pid {}) ran; the task goes on: waiting up \
             to {} for an agent to come back to schedule it",
            l.task,
            l.pid,
            human::duration_ms(window.as_millis() as u64)
        );
    }
    let mut said = started;
    let req = Request::Attach(AttachRequest {
        task: l.task,
        pid: l.pid,
        notify_preempt: args.notify_preempt && !args.quiet,
    });
    loop {
        if let Ok(c) = Connection::request(socket, &req, &[]) {
            return Reattach::Connected(c);
        }
        if !l.runs() {
            return Reattach::Ended;
        }
        if started.elapsed() >= window {
            return Reattach::NoAgent;
        }
        if !args.quiet && said.elapsed() >= RECONNECT_PROGRESS {
            said = Instant::now();
            eprintln!(
                "{PREFIX}still no agent at {} after {} s; task {} runs on",
                socket.display(),
                started.elapsed().as_secs(),
                l.task
            );
        }
        std::thread::sleep(RECONNECT_POLL);
    }
}

/// `task 5 (infer, priority 1)`.
fn task_ref(t: &TaskRef) -> String {
    format!("task {} ({}, priority {})", t.task, t.name, t.priority)
}

/// The line (after [`PREFIX`]) that tells one notice: in words, or with `json` as
/// one JSON object (the 4003 record exactly as the design has it).
pub fn notice_line(n: &Notice, json: bool) -> String {
    if json {
        let text = match n {
            Notice::Enforcement { record, .. } => serde_json::to_string(record),
            other => serde_json::to_string(other),
        };
        return text.unwrap_or_default();
    }
    match n {
        Notice::Queued {
            task,
            pid,
            ahead,
            reason,
            ..
        } => format!(
            "task {task} (pid {pid}) queued behind {}: {}; it starts when a GPU can run it",
            human::jobs(*ahead),
            human::wait_reason(*reason)
        ),
        Notice::Placed {
            task,
            pid,
            gpu,
            priority,
        } => format!(
            "task {task} (pid {pid}) placed on GPU {gpu} at priority {priority} ({})",
            match keling_sched::class_of(*priority) {
                keling_sched::Class::RealTime => "real-time",
                keling_sched::Class::Interactive => "interactive",
                keling_sched::Class::Background => "background",
            }
        ),
        Notice::Warning {
            task,
            remaining_ms,
            allowed_ms,
            hard_kill,
        } => format!(
            "task {task} reaches its session limit of {} in {}; it will then be {}",
            human::duration_ms(*allowed_ms),
            human::duration_ms(*remaining_ms),
            if *hard_kill {
                "killed"
            } else {
                "sent SIGTERM, then killed if it does not exit"
            }
        ),
        Notice::Enforcement { task, record } => format!(
            "task {task} ran past its session limit: {} ms of {} ms allowed ({} {}, {})",
            record.data.actual_ms,
            record.data.allowed_ms,
            record.code,
            record.message,
            record.data.reason
        ),
        Notice::Ending {
            task,
            reason,
            signal,
            evicted_for,
            bytes,
            gpu,
            quota_bytes,
        } => {
            let why = match (reason, evicted_for, bytes, quota_bytes) {
                (keling_sched::Reason::EvictedForMemory, Some(t), Some(b), _) => format!(
                    "evicted to free {} on GPU {} for {}",
                    human::bytes(*b),
                    gpu.map_or("?".into(), |g| g.to_string()),
                    task_ref(t)
                ),
                (keling_sched::Reason::OverQuota, _, Some(held), Some(quota)) => format!(
                    "over its GPU memory quota ({} held, quota {})",
                    human::bytes(*held),
                    human::bytes(*quota)
                ),
                (r, ..) => human::reason(*r).to_owned(),
            };
            format!(
                "Keling sent {} to task {task}: {why}",
                human::signal(*signal)
            )
        }
        Notice::Ended {
            task,
            reason,
            exit_code,
        } => format!(
            "task {task} was ended by Keling ({}): {}",
            human::reason(*reason),
            human::exit_code(*exit_code)
        ),
        Notice::Frozen {
            task,
            reason,
            yielded_to,
        } => {
            let to = match yielded_to.as_slice() {
                [] => String::new(),
                [one] => format!("; yielded to {}", task_ref(one)),
                [first, rest @ ..] => {
                    format!("; yielded to {} and {} more", task_ref(first), rest.len())
                }
            };
            format!("task {task} frozen: {}{to}", human::reason(*reason))
        }
        Notice::Resumed { task, frozen_ms } => format!(
            "task {task} resumed after {} frozen",
            human::duration_ms(*frozen_ms)
        ),
        Notice::Dropped { count } => {
            format!("{count} notice(s) dropped: this terminal did not read them in time")
        }
    }
}

#[cfg(test)]
mod tests {
    use keling_sched::{EnforcementRecord, Reason};

    use super::*;

    #[test]
    fn the_4003_record_is_printed_exactly_with_json() {
        let n = Notice::Enforcement {
            task: 3,
            record: EnforcementRecord::duration_exceeded(1500, 1502),
        };
        assert_eq!(
            notice_line(&n, true),
            r#"{"code":4003,"message":"session duration exceeded limit","data":{"allowed_ms":1500,"actual_ms":1502,"reason":"server_enforced"}}"#
        );
        assert_eq!(
            notice_line(&n, false),
            "task 3 ran past its session limit: 1502 ms of 1500 ms allowed \
             (4003 session duration exceeded limit, server_enforced)"
        );
        let w = Notice::Warning {
            task: 3,
            remaining_ms: 500,
            allowed_ms: 1500,
            hard_kill: true,
        };
        assert_eq!(
            notice_line(&w, true),
            r#"{"warning":{"task":3,"remaining_ms":500,"allowed_ms":1500,"hard_kill":true}}"#
        );
    }

    #[test]
    fn every_notice_reads_as_a_sentence() {
        let infer = TaskRef {
            task: 5,
            name: "infer".into(),
            priority: 1,
        };
        let cases = [
            (
                Notice::Queued {
                    task: 3,
                    pid: 4242,
                    position: 3,
                    ahead: 2,
                    reason: keling_sched::WaitReason::SlotsHeld,
                },
                "task 3 (pid 4242) queued behind 2 jobs: every GPU it may use is taken; it \
                 starts when a GPU can run it",
            ),
            (
                Notice::Placed {
                    task: 3,
                    pid: 4242,
                    gpu: 0,
                    priority: 8,
                },
                "task 3 (pid 4242) placed on GPU 0 at priority 8 (background)",
            ),
            (
                Notice::Warning {
                    task: 3,
                    remaining_ms: 500,
                    allowed_ms: 1500,
                    hard_kill: true,
                },
                "task 3 reaches its session limit of 1.50 s in 500 ms; it will then be killed",
            ),
            (
                Notice::Ending {
                    task: 3,
                    reason: Reason::EvictedForMemory,
                    signal: libc::SIGTERM,
                    evicted_for: Some(infer.clone()),
                    bytes: Some(512 << 20),
                    gpu: Some(0),
                    quota_bytes: None,
                },
                "Keling sent SIGTERM to task 3: evicted to free 512 MiB on GPU 0 for \
                 task 5 (infer, priority 1)",
            ),
            (
                Notice::Ending {
                    task: 3,
                    reason: Reason::OverQuota,
                    signal: libc::SIGTERM,
                    evicted_for: None,
                    bytes: Some(3 << 29),
                    gpu: None,
                    quota_bytes: Some(1 << 30),
                },
                "Keling sent SIGTERM to task 3: over its GPU memory quota (1.50 GiB held, \
                 quota 1.00 GiB)",
            ),
            (
                Notice::Ending {
                    task: 3,
                    reason: Reason::DurationLimit,
                    signal: libc::SIGKILL,
                    evicted_for: None,
                    bytes: None,
                    gpu: None,
                    quota_bytes: None,
                },
                "Keling sent SIGKILL to task 3: session duration limit",
            ),
            (
                Notice::Ended {
                    task: 3,
                    reason: Reason::DurationLimit,
                    exit_code: 137,
                },
                "task 3 was ended by Keling (session duration limit): killed by SIGKILL \
                 (exit code 137)",
            ),
            (
                Notice::Frozen {
                    task: 3,
                    reason: Reason::PreemptedByHigherPriority,
                    yielded_to: vec![infer.clone()],
                },
                "task 3 frozen: preempted by a higher priority; yielded to task 5 (infer, \
                 priority 1)",
            ),
            (
                Notice::Resumed {
                    task: 3,
                    frozen_ms: 1250,
                },
                "task 3 resumed after 1.25 s frozen",
            ),
            (
                Notice::Dropped { count: 2 },
                "2 notice(s) dropped: this terminal did not read them in time",
            ),
        ];
        for (n, text) in cases {
            assert_eq!(notice_line(&n, false), text);
            // Every notice also reads back from its JSON form.
            let back: Notice = serde_json::from_str(&serde_json::to_string(&n).unwrap()).unwrap();
            assert_eq!(back, n);
        }
    }
}
