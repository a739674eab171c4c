//! `keling launch`: run a command as a task of the running agent, on this terminal.
//!
//! The task runs as the caller (uid, gid, groups), in the caller's directory, with
//! the caller's environment; its stdin, stdout and stderr are this command's. The
//! agent starts it, so it is not in this terminal's foreground process group:
//! Ctrl-C, SIGTERM, SIGHUP and SIGQUIT sent to `keling launch` are forwarded over
//! the connection, and the agent sends them to every process of the task. Three
//! Ctrl-C within two seconds leave without waiting (the task runs on). Ctrl-Z stops
//! this command only.
use std::{
    ffi::OsString,
    io::Write,
    os::unix::net::UnixStream,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::control::{
    DEFAULT_SOCKET, FORWARDED_SIGNALS, LaunchRequest, Reply, Request, client::Connection,
};

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
    /// The agent's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
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

/// Blocks the forwarded signals in this (still single-threaded) process and
/// starts a thread that takes them with `sigwait` and sends each to the agent.
fn forward_signals(mut to_agent: UnixStream) {
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
                    eprintln!("keling launch: leaving without waiting; the task runs on");
                    std::process::exit(130);
                }
            }
            if writeln!(to_agent, "{{\"forward\":{sig}}}").is_err() {
                return;
            }
        }
    });
}

/// `keling launch`: runs CMD as a managed task; returns its exit code.
pub fn launch(args: LaunchArgs) -> anyhow::Result<i32> {
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
    });
    let mut conn = Connection::request(&args.socket, &req, &[0, 1, 2])?;
    forward_signals(conn.sender().context("clone the connection")?);
    loop {
        match conn.next_reply()? {
            None => bail!("the agent closed the connection before the task ended (did it stop?)"),
            Some(Reply::ExitCode(code)) => return Ok(code),
            Some(Reply::Error(err)) => bail!("the agent refused the task: {err}"),
            Some(Reply::Accepted(a)) => {
                log::info!("launched as task {} on GPU {:?}", a.task, a.gpu);
            }
            Some(other) => bail!("unexpected reply from the agent: {other:?}"),
        }
    }
}
