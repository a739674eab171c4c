//! `keling report`: an HTML page with SVG figures and root-cause findings from
//! scheduling and input logs. The work is in the `report` module.
use std::path::PathBuf;

use keling_sched::{GpuInfo, SchedConfig};

use crate::{
    defaults,
    report::{self, ReportOptions, grid::WINDOW_NS},
};

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Scheduling logs (`keling run --sched-log`) and/or input logs
    /// (`--input-log`, replayed through the core), of one run or several.
    #[arg(value_name = "LOG", required = true)]
    pub logs: Vec<PathBuf>,
    /// Where to write index.html and report.json (created if needed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// `keling status --export json` output: the whole decision-latency
    /// distribution (the scheduling log has the late decisions only).
    #[arg(long, value_name = "FILE")]
    pub latency: Option<PathBuf>,
    /// Rows of the task heatmap and timelines (the tasks that waited longest).
    #[arg(long, default_value_t = 40)]
    pub task_rows: usize,
    /// Input logs without a header: GPU capacities, as `keling run --gpu-capacity`.
    #[arg(long = "gpu-capacity", value_name = "INDEX=BYTES", value_parser = super::values::gpu_capacity)]
    pub gpu_capacity: Vec<GpuInfo>,
    /// Input logs without a header: as `keling run --slots`.
    #[arg(long, default_value_t = defaults::SLOTS_PER_GPU)]
    pub slots: u32,
}

pub fn report(args: ReportArgs) -> anyhow::Result<i32> {
    let opts = ReportOptions {
        window_ns: WINDOW_NS,
        task_rows: args.task_rows.max(1),
        latency_json: args.latency,
        config: SchedConfig {
            gpus: args.gpu_capacity,
            slots_per_gpu: args.slots.max(1),
            idle_timeout_ms: defaults::IDLE_TIMEOUT_MS,
            default_max_duration_ms: defaults::MAX_DURATION_MS,
            default_grace_ms: defaults::GRACE_PERIOD_MS,
            ..SchedConfig::default()
        },
    };
    let r = report::build(&args.logs, &opts)?;
    let page = r.write(&args.out)?;
    println!("{}", page.display());
    for w in &r.long_waits {
        println!("  {}", w.text);
    }
    for f in r.gpu_findings.iter().chain(&r.task_findings) {
        println!("  {}", f.text);
    }
    if r.long_waits.is_empty() && r.gpu_findings.is_empty() && r.task_findings.is_empty() {
        println!("  no findings");
    }
    Ok(0)
}
