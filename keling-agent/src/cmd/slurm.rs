//! `keling slurm`: the lines a Slurm site adds to run jobs under Keling
//! (`docs/slurm.md`): this node's `gres.conf` (from the running agent's GPUs)
//! and the `plugstack.conf` line that loads the SPANK plugin.
use std::path::PathBuf;

use anyhow::bail;

use crate::{
    control::{Reply, Request, client::Connection},
    slurm::gres,
};

#[derive(Debug, clap::Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    command: SlurmCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SlurmCommand {
    /// Print this node's gres.conf lines: a `gpu` per GPU the running agent
    /// schedules and a `shard` count equal to its memory in GiB (1 shard = 1 GiB
    /// of one GPU), with the `Gres=` value for the node's slurm.conf line.
    Gres {
        /// The node's name in slurm.conf (default: the instance's name, else
        /// this host's name).
        #[arg(long, value_parser = gres::parse_node_name)]
        node: Option<String>,
        /// Where the GPUs' device files are (`File=DIR/nvidiaN`).
        #[arg(long, default_value = "/dev")]
        device_dir: PathBuf,
        /// The agent's control socket (default: the instance's).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Print the plugstack.conf line that loads Keling's SPANK plugin.
    Plugstack {
        /// The plugin (default: `libkeling_spank.so` beside this `keling`).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Refuse a job's tasks when the node's agent is down (default: they run
        /// without Keling, and each job is told so once on its standard error).
        #[arg(long)]
        refuse_without_agent: bool,
    },
}

pub fn slurm(args: SlurmArgs) -> anyhow::Result<i32> {
    match args.command {
        SlurmCommand::Gres {
            node,
            device_dir,
            socket,
        } => {
            let socket = socket.unwrap_or_else(|| crate::instance::current().socket());
            let gpus = match Connection::request(&socket, &Request::Gpus(true), &[])?.one()? {
                Reply::Gpus(g) => g,
                other => bail!("unexpected reply from the agent: {other:?}"),
            };
            if gpus.is_empty() {
                bail!(
                    "the agent knows no GPU capacities (no NVML, --gpu-capacity or config \
                     [[gpu]]): give it them, then run this again"
                );
            }
            let node = match node {
                Some(n) => n,
                None => default_node()?,
            };
            eprintln!(
                "# slurm.conf: NodeName={node} Gres={} ... and GresTypes=gpu,shard",
                gres::node_gres(&gpus)
            );
            print!("{}", gres::gres_lines(&node, &gpus, &device_dir));
            Ok(0)
        }
        SlurmCommand::Plugstack {
            plugin,
            refuse_without_agent,
        } => {
            let plugin = match plugin {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name(gres::PLUGIN_FILE),
            };
            if !plugin.exists() {
                eprintln!(
                    "keling: warning: {} does not exist (build it with `cargo xtask build`, or \
                     name it with --plugin)",
                    plugin.display()
                );
            }
            let mut plugin_args = Vec::new();
            if refuse_without_agent {
                plugin_args.push("refuse_without_agent".to_string());
            }
            print!("{}", gres::plugstack_line(&plugin, &plugin_args));
            Ok(0)
        }
    }
}

/// The node's name: the instance's name, else the host's (what slurmd uses
/// when not told `-N`).
pub fn default_node() -> anyhow::Result<String> {
    if let Some(name) = crate::instance::current().name() {
        return gres::parse_node_name(name).map_err(anyhow::Error::msg);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    let short = host.trim().split('.').next().unwrap_or_default();
    gres::parse_node_name(short).map_err(anyhow::Error::msg)
}
