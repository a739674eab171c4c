//! `keling trace`: trace one command, running processes (`--pid`), or every process
//! with a name (`--comm`, those running now and those that exec into it later),
//! with their descendants.
//!
//! The pipeline: kernel ring buffer -> [`EventStream`] (decode) -> [`Model`] +
//! an output [`Sink`](crate::output::Sink), in [`Tracer`]'s loop. The trace ends when every tracked process has exited (the
//! kernel's tracked map is the judge, so dropped events cannot make it hang or end
//! early; with `--comm` it waits for more), after `--duration`, or on Ctrl-C (the
//! first one goes to a command Keling started, the next ends the trace); the
//! summary is written either way.
use std::{
    ffi::OsString,
    fs::File,
    io::{BufReader, BufWriter, Seek, Write},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;

use crate::{
    bpf::{LoadOptions, Probes, programs::Feature},
    defaults,
    event::EventStream,
    gpu::env::GpuArgs,
    os::{self, monotonic_ns, spawn::HeldChild},
    output::{self, Format},
    process_model::Model,
    trace_loop::{Child, End, Tracer, UnixSignals},
};

/// The output's write buffer. The drain timer flushes it every tick, so a line
/// waits no longer for it at a low rate. At a high rate the write path is the
/// price of each write: with the default 8 KiB, ext4's per-page work was half
/// of a full-rate `keling trace --format jsonl`'s CPU time (`perf record
/// --call-graph dwarf`), with 1 MiB a fifth.
const OUTPUT_BUFFER: usize = 1 << 20;

/// What a trace cannot do without.
const REQUIRED: &[Feature] = &[Feature::ProcessLifecycle, Feature::ContextSwitches];
/// ... and with an NVIDIA driver (or the simulated one) present.
const REQUIRED_WITH_GPU: &[Feature] = &[
    Feature::ProcessLifecycle,
    Feature::ContextSwitches,
    Feature::NvidiaFiles,
    Feature::NvidiaIoctls,
];

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Attach to this running process (and the children it forks from now on)
    /// instead of starting a command.
    #[arg(long, conflicts_with = "command")]
    pub pid: Option<u32>,
    /// Trace every process named NAME (its `comm`, as `ps -o comm` shows it, at
    /// most 15 characters): those running now and those that exec into that name
    /// later (caught in the kernel at their exec), and their children. The trace
    /// then runs until --duration or Ctrl-C. May be given several times.
    #[arg(long, value_name = "NAME", conflicts_with = "command")]
    pub comm: Vec<String>,
    /// Stop tracing after this many seconds (and write the summary). A command
    /// Keling started goes on untraced.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Follow the running agent's scheduling log (`keling run --sched-log FILE`)
    /// and show its decisions about the traced processes (freeze, thaw, kill, late
    /// decisions) in the trace.
    #[arg(long, value_name = "FILE")]
    pub sched_log: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the trace to FILE instead of standard output (keeps it apart from the
    /// traced command's own output).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show every context switch in the text timeline (jsonl always has them).
    #[arg(long)]
    pub switches: bool,
    /// Size of the kernel ring buffer in KiB (a power of two, at least 4).
    #[arg(long, default_value_t = defaults::RINGBUF_KIB, value_name = "KIB")]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The command to run and trace, after `--`. It is held before exec until the
    /// probes track it, so nothing it does is missed.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs the trace; returns the exit code `keling` should exit with.
pub fn trace(args: TraceArgs) -> anyhow::Result<i32> {
    if args.pid.is_none() && args.command.is_empty() && args.comm.is_empty() {
        anyhow::bail!(
            "nothing to trace: give a command after `--`, --pid PID or --comm NAME \
             (see `keling trace --help`)"
        );
    }
    let duration = match args.duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            anyhow::bail!("--duration must be a positive number of seconds, not {d}")
        }
        d => d.map(Duration::from_secs_f64),
    };
    let comms: Vec<String> = args.comm.iter().map(|c| comm_key(c)).collect();
    if comms.len() > keling_common::MAX_TRACE_COMMS as usize {
        anyhow::bail!(
            "at most {} --comm names at once",
            keling_common::MAX_TRACE_COMMS
        );
    }
    // Opened before anything is loaded: a wrong path is an error, not a silence.
    let sched_log = match &args.sched_log {
        Some(path) => {
            let mut f = File::open(path).with_context(|| format!("open {}", path.display()))?;
            // Decisions from now on: the trace's events start now too.
            f.seek(std::io::SeekFrom::End(0))?;
            Some(BufReader::new(f))
        }
        None => None,
    };
    os::check_privileges()?;
    // Fork first, before the probes and the runtime exist: a child that is only
    // forked (not exec'd) is cheap to throw away if loading fails.
    let held = if args.command.is_empty() {
        None
    } else {
        Some(HeldChild::spawn(&args.command)?)
    };
    let mut opts = LoadOptions::new(&args.gpu, false, args.ringbuf_kib, REQUIRED)?;
    if opts.has_gpu() {
        opts.required = REQUIRED_WITH_GPU;
    }
    let mut probes = Probes::load(&opts)?;
    // The output file appears only once every process to trace is tracked (before a
    // held command is released): its existence says the trace has attached.
    let open_output = || -> anyhow::Result<Box<dyn Write + Send>> {
        Ok(match &args.output {
            Some(path) => Box::new(BufWriter::with_capacity(
                OUTPUT_BUFFER,
                crate::os::files::open_for_writing(path, crate::os::files::Write::Truncate)
                    .with_context(|| format!("create {}", path.display()))?,
            )),
            None => Box::new(BufWriter::with_capacity(OUTPUT_BUFFER, std::io::stdout())),
        })
    };
    let start_ns = monotonic_ns();
    let mut model = Model::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _enter = runtime.enter();
    // SIGINT, SIGTERM and SIGUSR1 are ours before the child runs or anything is
    // reported: a SIGUSR1 sent once the traced program is seen working must ask
    // for a snapshot, not end Keling (the signal's default action).
    let signals = UnixSignals::new()?;
    let (child, out) = match held {
        Some(held) => {
            let pid = held.pid();
            probes.track(pid, pid)?;
            let out = open_output()?;
            let comm = args.command[0].to_string_lossy();
            let comm = comm.rsplit('/').next().unwrap_or_default().to_owned();
            model.add_process(pid, std::process::id(), comm, &[pid]);
            let pid = held.release(&args.command[0])?;
            (Some(Child::new(pid)?), out)
        }
        None => {
            // The kernel follows future execs into these names from here on, so a
            // process that execs between this and the scan below is not missed.
            for c in &comms {
                probes.follow_comm(c)?;
            }
            let mut pids: Vec<u32> = args.pid.into_iter().collect();
            if !comms.is_empty() {
                let me = std::process::id();
                for pid in os::proc::pids()? {
                    if pid != me
                        && !pids.contains(&pid)
                        && os::proc::stat(pid).is_ok_and(|s| comms.contains(&s.comm))
                    {
                        pids.push(pid);
                    }
                }
                log::info!(
                    "tracing {} running processes named {} and every process that execs into \
                     that name from now on, with their children; Ctrl-C{} to stop",
                    pids.len(),
                    comms.join(", "),
                    if duration.is_some() {
                        " or --duration"
                    } else {
                        ""
                    }
                );
            }
            for &pid in &pids {
                let stat = match os::proc::stat(pid) {
                    Ok(s) => s,
                    // Gone since the scan (a --comm match): nothing to trace.
                    Err(_) if Some(pid) != args.pid => continue,
                    Err(e) => return Err(e),
                };
                probes.track(pid, pid)?;
                if Some(pid) == args.pid {
                    log::info!(
                        "tracing process {pid} ({}) and the children it forks from now on",
                        stat.comm
                    );
                }
                let tids: Vec<u32> = os::proc::tids(pid)?.into_iter().collect();
                model.add_process(pid, stat.ppid, stat.comm, &tids);
            }
            if !pids.is_empty() {
                probes.adopt_existing_fds(Some(&pids), false)?;
            }
            (None, open_output()?)
        }
    };
    let sink = output::open(args.format, out, start_ns, args.switches);
    let end = End {
        wait_for_comms: !comms.is_empty(),
        duration,
    };
    runtime.block_on(async move {
        let events = EventStream::new(probes.take_events()?)?;
        Tracer::new(probes, events, model, sink, child, start_ns, end, sched_log)
            .run(signals)
            .await
    })
}

/// A name as the kernel keeps it in `comm`: at most 15 bytes.
fn comm_key(name: &str) -> String {
    let max = keling_common::COMM_LEN - 1;
    if name.len() <= max {
        return name.to_owned();
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    log::warn!(
        "--comm {name}: the kernel keeps at most {max} bytes of a name; matching {:?}",
        &name[..end]
    );
    name[..end].to_owned()
}
