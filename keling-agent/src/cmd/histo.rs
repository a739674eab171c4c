//! `keling histo`: the decision-latency histograms offline, from the interval log
//! `keling run --histo-log` appends to. The exports and the tuning report are the very
//! code behind `keling status --export` on a live agent.
use std::{io::Read, path::PathBuf};

use anyhow::Context;

use crate::latency::{
    HistoFormat, Selection, Stage,
    intervals::{self, ReadLog},
    tune_report,
};

#[derive(Debug, clap::Args)]
pub struct HistoArgs {
    #[command(subcommand)]
    command: HistoCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HistoCommand {
    /// Print the histograms of an interval log, added up over all its intervals:
    /// percentile tables (hgrm), Prometheus text (prom) or JSON.
    ///
    /// Examples:
    ///   keling histo export /var/log/keling/latency.hlog
    ///   keling histo export latency.hlog --stage actuation --action thaw
    ///   keling histo export latency.hlog --format prom
    ///   keling status --export interval-log | keling histo export -
    #[command(verbatim_doc_comment)]
    Export(ExportArgs),
    /// Replay an interval log's decisions through the static and adaptive timeout
    /// models at a range of multipliers: the timeout each would have chosen, how many
    /// decisions each would have called late, and the one recommended, with why.
    ///
    /// Example: keling histo tune /var/log/keling/latency.hlog
    #[command(verbatim_doc_comment)]
    Tune(TuneArgs),
}

#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// The interval log (`-`: standard input).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Only this stage: delivery, decision, actuation, confirmation, end_to_end.
    #[arg(long, value_parser = parse_stage, value_name = "STAGE")]
    stage: Option<Stage>,
    /// Only this action's histograms (freeze, thaw, stop, terminate, kill, place, warn).
    #[arg(long, value_name = "ACTION")]
    action: Option<String>,
    #[arg(long, value_enum, default_value_t = HistoFormat::Hgrm)]
    format: HistoFormat,
}

#[derive(Debug, clap::Args)]
struct TuneArgs {
    /// The interval log (`-`: standard input).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_stage(s: &str) -> Result<Stage, String> {
    Stage::ALL
        .into_iter()
        .find(|st| st.as_str() == s || st.as_str().replace('_', "-") == s)
        .ok_or_else(|| {
            format!("{s:?}: one of delivery, decision, actuation, confirmation, end_to_end")
        })
}

fn load(file: &PathBuf) -> anyhow::Result<ReadLog> {
    let mut bytes = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes)?;
    } else {
        bytes = std::fs::read(file).with_context(|| format!("read {}", file.display()))?;
    }
    intervals::read(&bytes).with_context(|| format!("{}", file.display()))
}

pub fn histo(args: HistoArgs) -> anyhow::Result<i32> {
    match args.command {
        HistoCommand::Export(a) => {
            let log = load(&a.file)?;
            let sel = Selection {
                stage: a.stage,
                action: a.action,
            };
            let mut out = std::io::stdout().lock();
            log.recorder.write_export(&mut out, a.format, &sel)?;
        }
        HistoCommand::Tune(a) => {
            let log = load(&a.file)?;
            let series = log
                .series()
                .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
            let report = tune_report(&series);
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
                return Ok(0);
            }
            let r = &log.recorder;
            let widest = log.intervals.iter().map(|i| i.length_s).fold(0.0, f64::max);
            println!(
                "{}: {} intervals of up to {widest:.3} s from {} agent run(s), {} decisions; \
                 the agent called {} late ({} model x{}, timeout {:.3} ms at the end).",
                a.file.display(),
                log.intervals.len(),
                log.segments.max(1),
                r.decisions(),
                r.late_count(),
                r.model().kind().as_str(),
                r.model().multiplier(),
                r.timeout_ns() as f64 / 1e6
            );
            if widest > 1.0 + 1e-9 {
                println!(
                    "note: intervals longer than the models' 1 s recomputation: each interval's \
                     decisions are replayed spread evenly over it, so late counts are estimates \
                     (use --histo-interval 1 for a replay as the agent saw it)."
                );
            }
            println!();
            print!("{report}");
        }
    }
    Ok(0)
}
