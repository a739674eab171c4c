//! `keling launch`: run a command as a task of the running agent, on this terminal.
use std::{ffi::OsString, path::PathBuf};

use anyhow::{Context, bail};

use crate::control::{DEFAULT_SOCKET, LaunchRequest, Reply, Request, client::Connection};

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Priority 0-15 (0 highest): real-time 0-2, interactive 3-6, background 7-15.
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
    });
    let mut conn = Connection::request(&args.socket, &req, &[0, 1, 2])?;
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
