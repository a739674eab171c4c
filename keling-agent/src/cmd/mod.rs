//! The subcommands, one module each. Nothing outside `cmd` imports from it.
use clap::{Parser, Subcommand};

pub mod floor;
pub mod histo;
mod human;
pub mod launch;
pub mod replay;
pub mod report;
pub mod run;
pub mod slurm;
pub mod status;
pub mod thaw;
pub mod trace;
mod values;

/// Keling: exact per-process tracing of GPU jobs with eBPF, and a preemptive
/// scheduler over them.
///
/// Needs root (or CAP_BPF and CAP_PERFMON) for `trace` and `run`: they load eBPF
/// programs into the kernel.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// Log level for the agent's own messages on standard error (error, warn,
    /// info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info", value_name = "LEVEL")]
    log_level: String,
    /// The agent instance to run or talk to: its own cgroup root
    /// (`<cgroup2>/keling-NAME`), run directory (`/run/keling/NAME`: socket, lock,
    /// stopped list, boost and task records). Default: the one instance
    /// (`<cgroup2>/keling`, `/run/keling`). 1-32 letters, digits, `_` or `-`.
    #[arg(long, global = true, value_name = "NAME",
          value_parser = crate::instance::parse_name)]
    instance: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Trace one command, or one running process, and every process it starts:
    /// forks, execs, exits with their codes, each thread's context switches, and
    /// exact GPU memory per process.
    ///
    /// Examples:
    ///   keling trace -- make -j8
    ///   keling trace --format jsonl --output trace.jsonl -- python train.py
    ///   keling trace --pid 4242
    ///
    /// `keling trace -- CMD` exits with CMD's exit code (128 + N if a signal N
    /// killed it).
    #[command(verbatim_doc_comment)]
    Trace(trace::TraceArgs),
    /// Run the long-running agent: trace every GPU process and schedule the tasks
    /// launched through it, until Ctrl-C or SIGTERM.
    Run(run::RunArgs),
    /// Ask the running agent to run CMD as a managed task in its own cgroup, on
    /// this terminal; exits with CMD's exit code.
    ///
    /// Example: keling launch --priority 3 --gpu auto -- python infer.py
    #[command(verbatim_doc_comment)]
    Launch(launch::LaunchArgs),
    /// Show the running agent's tasks, their states, GPUs, memory, priorities and
    /// time, with the decision timeout and latency figures.
    Status(status::StatusArgs),
    /// Thaw every task Keling froze and continue every process it stopped (what
    /// the fail-safe does when the agent dies; for when you must do it by hand).
    Thaw(thaw::ThawArgs),
    /// Re-run a recorded input log through the scheduler core (exactly, or under
    /// another policy or config), or compare policies on a synthetic workload.
    Replay(replay::ReplayArgs),
    /// Write an HTML page with queueing-delay heatmaps, task timelines, decision
    /// latency and root-cause findings from scheduling and input logs.
    Report(report::ReportArgs),
    /// Slurm: this node's gres.conf lines (GPUs and their memory as shards) and
    /// the plugstack.conf line that loads Keling's SPANK plugin.
    Slurm(slurm::SlurmArgs),
    /// Decision-latency histograms offline, from `keling run --histo-log`'s
    /// interval log: export them, or replay them through the timeout models
    /// for a tuning recommendation.
    Histo(histo::HistoArgs),
    /// The bench's floor: two empty eBPF programs on the ioctl tracepoints (or
    /// the raw syscall ones), attached until Ctrl-C (for `cargo xtask bench`).
    #[command(hide = true)]
    Floor(floor::FloorArgs),
}

/// Parses the command line, runs the subcommand, and returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    env_logger::Builder::new()
        .parse_filters(&cli.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp(None)
        .format_target(false)
        .init();
    if let Err(e) =
        crate::instance::Instance::new(cli.instance.as_deref()).and_then(crate::instance::select)
    {
        eprintln!("keling: error: --instance {e}");
        return 2;
    }
    let result = match cli.command {
        Command::Trace(args) => trace::trace(args),
        Command::Run(args) => run::run(args),
        Command::Launch(args) => launch::launch(args),
        Command::Status(args) => status::status(args),
        Command::Thaw(args) => thaw::thaw(args),
        Command::Replay(args) => replay::replay(args),
        Command::Report(args) => report::report(args),
        Command::Histo(args) => histo::histo(args),
        Command::Slurm(args) => slurm::slurm(args),
        Command::Floor(args) => floor::floor(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keling: error: {e:#}");
            1
        }
    }
}
