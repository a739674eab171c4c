//! `keling`: the Keling agent. See `keling --help`.
mod btf;
mod decode;
mod gpu_env;
mod gpu_names;
mod latency;
mod model;
mod nvml;
mod output;
mod probes;
mod run;
mod sched;
mod spawn;
mod sys;
mod trace;

use clap::{Parser, Subcommand};

/// Keling: exact per-process tracing of GPU jobs with eBPF, and a preemptive
/// scheduler over them.
///
/// Needs root (or CAP_BPF and CAP_PERFMON): it loads eBPF programs into the kernel.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// Log level for the agent's own messages on standard error (error, warn,
    /// info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info", value_name = "LEVEL")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Trace one command, or one running process, and every process it starts:
    /// forks, execs, exits with their codes, and each thread's context switches.
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
    Launch(sched::control::LaunchArgs),
    /// Show the running agent's tasks, their states, GPUs, memory, priorities and
    /// time, with the decision timeout and latency figures.
    Status(sched::control::StatusArgs),
    /// Thaw every task Keling froze and continue every process it stopped (what
    /// the fail-safe does when the agent dies; for when you must do it by hand).
    Thaw(ThawArgs),
}

#[derive(Debug, clap::Args)]
struct ThawArgs {
    /// Everything Keling froze or stopped (the only mode).
    #[arg(long, required = true)]
    all: bool,
}

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::new()
        .parse_filters(&cli.log_level)
        .parse_env("RUST_LOG")
        .format_timestamp(None)
        .format_target(false)
        .init();
    let result = match cli.command {
        Command::Trace(args) => trace::trace(args),
        Command::Run(args) => run::run(args),
        Command::Launch(args) => sched::control::launch(args),
        Command::Status(args) => sched::control::status(args),
        Command::Thaw(_) => {
            let n = sched::cgroup::thaw_all();
            println!("thawed or continued {n} task(s)");
            Ok(0)
        }
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("keling: error: {e:#}");
            std::process::exit(1);
        }
    }
}
