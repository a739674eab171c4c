//! `keling status`: what the running agent is doing.
use std::path::PathBuf;

use anyhow::bail;

use crate::control::{DEFAULT_SOCKET, ExportFormat, Reply, Request, client::Connection};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the decision-latency histograms instead, in this format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub export: Option<ExportFormat>,
    /// The agent's control socket.
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
}

pub fn status(args: StatusArgs) -> anyhow::Result<i32> {
    let request = match args.export {
        Some(f) => Request::Export(f),
        None => Request::Status(true),
    };
    let status = match Connection::request(&args.socket, &request, &[])?.one()? {
        Reply::Export(text) => {
            print!("{text}");
            return Ok(0);
        }
        Reply::Status(s) => s,
        other => bail!("unexpected reply from the agent: {other:?}"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    println!(
        "{:>5} {:>7} {:<16} {:<10} {:>4} {:>4} {:>12} {:>10}",
        "TASK", "PID", "NAME", "STATE", "PRIO", "GPU", "GPU MEM", "TIME ms"
    );
    for t in &status.tasks {
        println!(
            "{:>5} {:>7} {:<16} {:<10} {:>4} {:>4} {:>12} {:>10}",
            t.id,
            t.pid,
            t.name,
            t.state,
            t.priority,
            t.gpu.map_or("-".into(), |g| g.to_string()),
            t.mem_bytes,
            t.elapsed_ms
        );
    }
    let l = &status.latency;
    println!(
        "decision timeout {} ms ({} model), {} late of {} decisions",
        l.timeout_ms, l.model, l.late, l.decisions
    );
    Ok(0)
}
