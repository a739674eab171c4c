//! The agent's control socket and its clients (`keling launch`, `keling status`).
//!
//! A unix stream socket at `/run/keling/keling.sock`, in a 0700 directory, so only
//! root can use it. One JSON request line per connection:
//! - `{"launch": LaunchRequest}`, sent with the client's stdin/stdout/stderr as
//!   SCM_RIGHTS: the agent starts the command as a managed task on those fds (the
//!   client relays nothing), answers `{"accepted": {...}}` and, when the task ends,
//!   `{"exit_code": N}`.
//! - `{"status": true}`: one JSON line with the tasks and the latency figures.
use std::{
    ffi::OsString,
    io::{BufRead, BufReader, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::net::UnixStream,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

pub const DEFAULT_SOCKET: &str = "/run/keling/keling.sock";

/// What `keling launch` asks for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Launch(LaunchRequest),
    Status(bool),
    /// Latency figures in an export format (answered as `{"export": text}`).
    Export(String),
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

/// Receives one message with up to 3 fds. Returns (bytes, fds).
pub fn recv_with_fds(sock: RawFd) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 64 * 1024];
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

fn connect(socket: &Path) -> anyhow::Result<UnixStream> {
    UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the Keling agent at {}: is `keling run` running (as root)? \
             Start it with `cargo xtask run` or `sudo keling run`",
            socket.display()
        )
    })
}

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
    let stream = connect(&args.socket)?;
    let mut line = serde_json::to_vec(&req)?;
    line.push(b'\n');
    send_with_fds(stream.as_raw_fd(), &line, &[0, 1, 2]).context("send the launch request")?;
    let mut reader = BufReader::new(stream);
    let mut text = String::new();
    loop {
        text.clear();
        if reader.read_line(&mut text)? == 0 {
            bail!("the agent closed the connection before the task ended (did it stop?)");
        }
        let v: serde_json::Value =
            serde_json::from_str(&text).context("bad reply from the agent")?;
        if let Some(code) = v.get("exit_code").and_then(|c| c.as_i64()) {
            return Ok(code as i32);
        }
        if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
            bail!("the agent refused the task: {err}");
        }
        if let Some(acc) = v.get("accepted") {
            log::info!("launched as task {} on GPU {}", acc["task"], acc["gpu"]);
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the decision-latency histograms instead: prometheus (text exposition),
    /// percentiles (HdrHistogram table), interval-log (HdrHistogram log V2), json,
    /// or tune (which timeout each model would choose and how many decisions each
    /// would have called late).
    #[arg(long, value_name = "FORMAT")]
    pub export: Option<String>,
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
}

pub fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let mut stream = connect(&args.socket)?;
    let request = match &args.export {
        Some(f) => Request::Export(f.clone()),
        None => Request::Status(true),
    };
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut text = String::new();
    BufReader::new(stream).read_line(&mut text)?;
    let v: serde_json::Value = serde_json::from_str(&text).context("bad reply from the agent")?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        bail!("{err}");
    }
    if let Some(text) = v.get("export").and_then(|e| e.as_str()) {
        print!("{text}");
        return Ok(0);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!(
        "{:>5} {:>7} {:<16} {:<10} {:>4} {:>4} {:>12} {:>10}",
        "TASK", "PID", "NAME", "STATE", "PRIO", "GPU", "GPU MEM", "TIME ms"
    );
    for t in v["tasks"].as_array().into_iter().flatten() {
        println!(
            "{:>5} {:>7} {:<16} {:<10} {:>4} {:>4} {:>12} {:>10}",
            t["id"],
            t["pid"],
            t["name"].as_str().unwrap_or(""),
            t["state"].as_str().unwrap_or(""),
            t["priority"],
            t["gpu"],
            t["mem_bytes"],
            t["elapsed_ms"]
        );
    }
    let l = &v["latency"];
    println!(
        "decision timeout {} ms ({} model), {} late of {} decisions",
        l["timeout_ms"], l["model"], l["late"], l["decisions"]
    );
    Ok(0)
}
