//! `keling replay`: re-run recorded scheduler inputs, compare policies, or run a
//! synthetic workload. The work is in the `replay` module; this measures its
//! own speed (the library reads no clock).
use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, bail};
use keling_sched::{Binding, GpuInfo, Policy, SchedConfig, Sharing};
use serde::Serialize;

use crate::{
    defaults,
    replay::{
        Summary,
        exact::{self, Reproduction},
        log::{InputLogReader, read_sched_log},
        seeds::{self, Aggregate, Figures, OverSeeds},
        synthetic::{self, Mix, Placement, RunLogs, Runtimes, SyntheticOptions, SyntheticRun},
        what_if::{self, WhatIf, WhatIfOptions},
    },
    sched::config::Config,
};

/// The design articles' figures for their weighting on their mix.
const ARTICLES_LOAD_BALANCE_ERROR: f64 = 0.0228;
const ARTICLES_MEAN_QUEUEING_DELAY_MS: f64 = 42.3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// The agent's: priorities, preemption, round robin among equals.
    Hybrid,
    /// First come, first served per GPU; no preemption.
    Fifo,
    /// Round robin, equal priorities for everyone (100 ms turns).
    Rr,
    /// The hybrid policy with the design articles' preemption guard: only tasks
    /// expecting more than 3 s are candidates, and at least 2 must qualify.
    Goav,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::Hybrid => Policy::Hybrid,
            PolicyArg::Fifo => Policy::Fifo,
            PolicyArg::Rr => Policy::RoundRobin,
            PolicyArg::Goav => Policy::Goav,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BindingArg {
    /// Place unpinned tasks at arrival (the agent's protocol today).
    AtArrival,
    /// Hold unpinned tasks unbound until a GPU can run them.
    Late,
}

impl From<BindingArg> for Binding {
    fn from(b: BindingArg) -> Binding {
        match b {
            BindingArg::AtArrival => Binding::AtArrival,
            BindingArg::Late => Binding::Late,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The input log `keling run --input-log` wrote (or a synthetic run's). A log
    /// the agent rotated is replayed as its pieces in order, oldest first
    /// (`in.jsonl.1 in.jsonl`); an exact replay needs it from the agent's start.
    #[arg(value_name = "INPUT_LOG", required_unless_present = "synthetic")]
    pub input_logs: Vec<PathBuf>,
    /// The scheduling log of the same run (repeat for rotated pieces, oldest
    /// first): report how many of its decisions the replay reproduces (under
    /// 100% is a bug when the log was recorded under this keling's core rules,
    /// which its header says).
    #[arg(long, value_name = "FILE")]
    pub sched_log: Vec<PathBuf>,
    /// Policy to replay under (default: the recording's, which is hybrid unless
    /// the log's header says otherwise). Another policy is a what-if.
    #[arg(long, value_enum, value_name = "POLICY")]
    pub policy: Option<PolicyArg>,
    /// The agent's config file (TOML, as `keling run --config`): its `[[gpu]]`
    /// capacities.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The core's whole config as JSON (what an input log header holds).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub sched_config: Option<PathBuf>,
    /// As `keling run --gpu-capacity` (repeat for each GPU).
    #[arg(long = "gpu-capacity", value_name = "INDEX=BYTES", value_parser = super::values::gpu_capacity)]
    pub gpu_capacity: Vec<GpuInfo>,
    /// As `keling run --slots`: tasks at once on a GPU (by slots), or their
    /// cap (by memory, 0: none) [default: the agent's].
    #[arg(long)]
    pub slots: Option<u32>,
    /// As `keling run --sharing`: `memory`, every task whose memory fits runs
    /// at once; `slots`, `--slots` tasks at once [default: the agent's].
    #[arg(long, value_enum, value_name = "SHARING")]
    pub sharing: Option<super::values::SharingArg>,
    /// As `keling run --overload`: the first design article's overload rule on
    /// (with a recording: what it would have done).
    #[arg(long)]
    pub overload: bool,
    /// As `keling run --overload-session-ms` [default: 200].
    #[arg(long, value_name = "MS")]
    pub overload_session_ms: Option<u64>,
    /// As `keling run --overload-mem-pct` [default: 95].
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub overload_mem_pct: Option<u32>,
    /// As `keling run --overload-waiting` [default: 8].
    #[arg(long, value_name = "N")]
    pub overload_waiting: Option<u32>,
    /// Synthetic: make every run twice, with the overload rule off and on (its
    /// thresholds from the flags above), to compare them.
    #[arg(long)]
    pub overload_compare: bool,
    /// As `keling run --idle-timeout-ms` [default: 300].
    #[arg(long)]
    pub idle_timeout_ms: Option<u64>,
    /// As `keling run --max-duration-ms` [default: 3600000].
    #[arg(long)]
    pub max_duration_ms: Option<u64>,
    /// As `keling run --grace-period-ms` [default: 30000].
    #[arg(long)]
    pub grace_period_ms: Option<u64>,
    /// As `keling run --hard-kill` [default: true].
    #[arg(long, action = clap::ArgAction::Set)]
    pub hard_kill: Option<bool>,
    /// When unpinned tasks are bound to a GPU [default: the recording's, or
    /// at-arrival]. `late` with `--unpin` asks what late binding would have done
    /// with a recording. Synthetic runs choose it by placement (`late`).
    #[arg(long, value_enum, value_name = "BINDING")]
    pub binding: Option<BindingArg>,
    /// Late binding's tie-break seed [default: the recording's, or 0].
    #[arg(long, value_name = "SEED")]
    pub placement_seed: Option<u64>,
    /// Replay as a what-if even with the recording's policy and config: drop the
    /// recorded confirmations and confirm every actuation after
    /// --actuation-ms instead.
    #[arg(long)]
    pub what_if: bool,
    /// What-if and synthetic runs: delay from a decision to its confirmation.
    #[arg(long, default_value_t = 1, value_name = "MS")]
    pub actuation_ms: u64,
    /// What-if: let the core place every task (ignore the GPUs recorded specs name).
    #[arg(long)]
    pub unpin: bool,
    /// Run a generated workload (12 job classes) instead of a recording, and
    /// compare policies and placements on it.
    #[arg(long)]
    pub synthetic: bool,
    /// Synthetic: which job classes (repeat for several: one table, the mix in
    /// its first column): `mixed`, real-time inference to multi-hour training;
    /// `transcode`, live transcoding, resolution x codec.
    #[arg(long, value_enum, default_values_t = [Mix::Mixed])]
    pub mix: Vec<Mix>,
    /// Synthetic: the workload's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Synthetic: run every seed of a range or list (`1-20`, `1,4,9`) and
    /// report each figure's median and worst seed per mix, policy and placement.
    #[arg(long, value_name = "SEEDS", value_parser = parse_seeds, conflicts_with = "seed")]
    pub seeds: Option<Seeds>,
    /// Synthetic: GPUs.
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Synthetic: hours of arrivals to simulate.
    #[arg(long, default_value_t = 24.0)]
    pub hours: f64,
    /// Synthetic: offered GPU work over GPU capacity.
    #[arg(long, default_value_t = 0.7)]
    pub load: f64,
    /// Synthetic: memory of each GPU, GiB (an H100's; the H200 has 141).
    #[arg(long, default_value_t = synthetic::GPU_MEMORY_GIB)]
    pub gpu_memory_gib: u64,
    /// Synthetic: jobs declare their memory budget (their class's upper end, as
    /// `keling launch --mem-quota` would); `false`: the core learns a job's
    /// memory only as it allocates.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub budgets: bool,
    /// Synthetic: the runtime each job declares (as `keling launch
    /// --expected-runtime-ms` would), which late binding under memory sharing
    /// balances GPU time by: its class's mean work, its exact work (an oracle,
    /// to see what placement loses for not knowing) or none.
    #[arg(long, value_enum, default_value_t = Runtimes::ClassMean)]
    pub runtimes: Runtimes,
    /// Synthetic: write the table of medians and worst seeds as Markdown into
    /// FILE between its `<!-- keling replay --markdown: begin/end -->` marks
    /// (`-`: print it). The docs' table: `keling replay --synthetic --mix
    /// mixed --mix transcode --seeds 1-20 --placement late --placement weighted
    /// --markdown docs/replay.md`.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Synthetic: placements to compare (repeat; default: late and weighted
    /// with every policy, the three pinning placements with the hybrid one).
    #[arg(long, value_enum)]
    pub placement: Vec<Placement>,
    /// Synthetic: the core's tick, ms (the agent's is 10).
    #[arg(long, default_value_t = defaults::RUN_TICK_MS)]
    pub tick_ms: u64,
    /// Synthetic: how often a running job shows activity, ms.
    #[arg(long, default_value_t = 100)]
    pub active_ms: u64,
    /// Synthetic: runs at once (threads).
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Synthetic, one run only: write its inputs here (with a header), to replay.
    #[arg(long, value_name = "FILE")]
    pub write_input_log: Option<PathBuf>,
    /// Synthetic, one run only: write its scheduling log here (for `keling report`
    /// or `--sched-log`).
    #[arg(long, value_name = "FILE")]
    pub write_sched_log: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print how fast the replay ran (inputs per second, one thread).
    #[arg(long)]
    pub stats: bool,
}

/// Seeds of `--seeds`, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seeds(pub Vec<u64>);

/// The most seeds one command runs.
const MAX_SEEDS: usize = 1000;

fn parse_seeds(s: &str) -> Result<Seeds, String> {
    let mut seeds: Vec<u64> = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let num = |x: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| format!("{x:?} is not a seed (a number, or a range like 1-20)"))
        };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if b < a {
            return Err(format!("{part}: a range goes up (1-20)"));
        }
        if b - a >= MAX_SEEDS as u64 || seeds.len() + (b - a) as usize >= MAX_SEEDS {
            return Err(format!("at most {MAX_SEEDS} seeds"));
        }
        for seed in a..=b {
            if !seeds.contains(&seed) {
                seeds.push(seed);
            }
        }
    }
    Ok(Seeds(seeds))
}

impl ReplayArgs {
    /// The config: `base` (a header's, or the agent's defaults) with the flags.
    fn sched_config(&self, base: Option<&SchedConfig>) -> anyhow::Result<SchedConfig> {
        if let Some(path) = &self.sched_config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read {}", path.display()))?;
            return serde_json::from_str(&text)
                .with_context(|| format!("{}: not a scheduler config (JSON)", path.display()));
        }
        let mut c = base.cloned().unwrap_or_else(defaults::sched_config);
        if !self.gpu_capacity.is_empty() {
            c.gpus = self.gpu_capacity.clone();
        } else if let Some(path) = &self.config {
            let file = Config::load(path)?;
            if !file.gpus.is_empty() {
                c.gpus = file.gpus;
            }
        }
        c.sharing = self.sharing.map_or(c.sharing, Sharing::from);
        let thresholds = self.overload_session_ms.is_some()
            || self.overload_mem_pct.is_some()
            || self.overload_waiting.is_some();
        if self.overload || self.overload_compare || (thresholds && c.overload.is_some()) {
            let rule = c.overload.unwrap_or_default();
            c.overload = Some(keling_sched::OverloadRule {
                min_session_ms: self.overload_session_ms.unwrap_or(rule.min_session_ms),
                mem_peak_pct: self.overload_mem_pct.unwrap_or(rule.mem_peak_pct),
                min_waiting: self.overload_waiting.unwrap_or(rule.min_waiting),
            });
        }
        // By memory 0 is "no cap"; by slots it counts as 1.
        c.slots_per_gpu = self.slots.unwrap_or(c.slots_per_gpu);
        c.idle_timeout_ms = self.idle_timeout_ms.unwrap_or(c.idle_timeout_ms);
        c.default_max_duration_ms = self.max_duration_ms.unwrap_or(c.default_max_duration_ms);
        c.default_grace_ms = self.grace_period_ms.unwrap_or(c.default_grace_ms);
        c.default_hard_kill = self.hard_kill.unwrap_or(c.default_hard_kill);
        c.binding = self.binding.map_or(c.binding, Binding::from);
        c.placement_seed = self.placement_seed.unwrap_or(c.placement_seed);
        Ok(c)
    }
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<i32> {
    if args.synthetic {
        return synthetic_runs(&args);
    }
    if args.overload_compare || args.seeds.is_some() || args.markdown.is_some() {
        bail!(
            "--overload-compare, --seeds and --markdown are for --synthetic runs; to compare \
             the overload rule on a recording, replay it with and without --overload"
        );
    }
    let Some(path) = args.input_logs.first() else {
        bail!("an INPUT_LOG is needed");
    };
    let mut readers = Vec::new();
    for p in &args.input_logs {
        readers.push(InputLogReader::open(p)?);
    }
    let header = readers[0].header.clone();
    if let Some(later) = readers[1..]
        .iter()
        .find(|r| r.header.is_some() && r.header != header)
    {
        eprintln!(
            "keling: a later input log has another header than the first ({:?}): using the first's",
            later.header
        );
    }
    let reader = readers.into_iter().flatten();
    let recorded_policy = header.as_ref().map_or(Policy::Hybrid, |h| h.policy);
    let policy = args.policy.map_or(recorded_policy, Policy::from);
    let config = args.sched_config(header.as_ref().map(|h| &h.config))?;
    // Without a header the flags describe the recording; with one, a flag that
    // changes its config asks what would have happened.
    let other_config = header.as_ref().is_some_and(|h| h.config != config);
    let what_if = args.what_if || policy != recorded_policy || other_config;
    if header.is_none() && !what_if {
        eprintln!(
            "keling: {} has no header: replaying with the config from the flags \
             (they must be the ones `keling run` had: --slots, --idle-timeout-ms, \
             --max-duration-ms, --grace-period-ms, --hard-kill, GPU capacities)",
            path.display()
        );
    }
    let started = Instant::now();
    if what_if {
        if !args.sched_log.is_empty() {
            eprintln!(
                "keling: --sched-log is compared only in an exact replay (the recording's policy and config)"
            );
        }
        let options = WhatIfOptions {
            actuation_ns: args.actuation_ms.saturating_mul(1_000_000),
            unpin: args.unpin,
        };
        let result = what_if::replay(reader, config, policy, options)?;
        let secs = started.elapsed().as_secs_f64();
        if args.json {
            println!("{}", serde_json::to_string_pretty(&result)?);
        } else {
            print_what_if(&result);
        }
        if args.stats {
            print_stats(result.recorded_inputs + result.feedback_inputs, secs);
        }
        return Ok(0);
    }
    let recorded = if args.sched_log.is_empty() {
        None
    } else {
        let mut lines = Vec::new();
        for p in &args.sched_log {
            lines.extend(read_sched_log(p)?);
        }
        Some(exact::recorded_decisions(&lines))
    };
    let result = exact::replay(reader, config, policy, recorded.as_deref())?;
    let secs = started.elapsed().as_secs_f64();
    let recorded_core_rules = header.as_ref().and_then(|h| h.core_rules);
    if args.json {
        let report = ExactReport {
            reproduction: &result,
            recorded_core_rules,
            core_rules: keling_sched::RULES_REVISION,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_exact(&result, path, recorded_core_rules);
    }
    if args.stats {
        print_stats(result.inputs, secs);
    }
    let reproduced = result
        .comparison
        .as_ref()
        // Every decision, in the recorded order: a reordering is not a reproduction.
        .is_none_or(|c| c.match_rate == 1.0 && c.first_difference.is_none());
    Ok(if reproduced { 0 } else { 2 })
}

fn print_stats(inputs: u64, secs: f64) {
    println!(
        "stats: {inputs} inputs in {secs:.3} s: {:.2} M inputs/s (one thread, reading and parsing included)",
        inputs as f64 / secs.max(1e-9) / 1e6
    );
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn print_summary(s: &Summary) {
    let q = &s.queueing_delay_ms;
    let w = &s.wait_to_start_ms;
    println!(
        "tasks: {} over {:.1} s; queueing delay per task: mean {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         arrival to first run: mean {:.1} ms, p99 {:.1} ms",
        s.tasks, s.span_s, q.mean, q.p99, q.max, w.mean, w.p99
    );
    let reasons: Vec<String> = s
        .preemptions_by_reason
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    println!(
        "preemptions: {} ({}); evictions: {}",
        s.preemptions,
        if reasons.is_empty() {
            "none".to_owned()
        } else {
            reasons.join(", ")
        },
        s.evictions
    );
    let busy: Vec<String> = s
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.gpu, pct(g.busy_share)))
        .collect();
    println!(
        "GPU busy share: {}; load-balance error (max-min)/mean: {} of busy time, {} of memory held; \
         idle while queued: {:.1} GPU-s",
        if busy.is_empty() {
            "no GPUs".to_owned()
        } else {
            busy.join(", ")
        },
        pct(s.load_balance_error),
        pct(s.memory_load_balance_error),
        s.idle_while_queued_gpu_s
    );
}

/// An exact replay as `--json` gives it: what it found, and the core's rules
/// revision the log was recorded under (its header's; `None`: not said) beside
/// this keling's.
#[derive(Serialize)]
struct ExactReport<'a> {
    #[serde(flatten)]
    reproduction: &'a Reproduction,
    recorded_core_rules: Option<u32>,
    core_rules: u32,
}

/// What a decision the replay does not reproduce means, by the core's rules
/// revision the log was recorded under: a bug under this keling's rules, the
/// rules' change under others.
fn not_reproduced(recorded_core_rules: Option<u32>) -> String {
    let now = keling_sched::RULES_REVISION;
    match recorded_core_rules {
        Some(r) if r == now => "NOT REPRODUCED (a bug: please report it with both logs)".to_owned(),
        Some(r) => format!(
            "NOT REPRODUCED: the log was recorded under the core's rules revision {r} and this \
             keling has revision {now}: decisions differ where the rules changed (replay it with \
             the keling that recorded it to check it)"
        ),
        None => format!(
            "NOT REPRODUCED: the log's header does not say which core rules made its decisions \
             (logs written before keling recorded them); this keling has revision {now}. If the \
             log is that old, decisions differ where the rules changed since; if not, a bug: \
             please report it with both logs"
        ),
    }
}

fn print_exact(r: &Reproduction, path: &Path, recorded_core_rules: Option<u32>) {
    println!(
        "replay of {}: {} inputs through the {} policy with the recorded feedback",
        path.display(),
        r.inputs,
        r.policy
    );
    match &r.comparison {
        Some(c) => {
            println!(
                "decisions: {} recorded, {} replayed, {} matched: match rate {:.4}%",
                c.recorded,
                c.replayed,
                c.matched,
                c.match_rate * 100.0
            );
            if let Some(d) = &c.first_difference {
                println!(
                    "{}: first difference at decision {}:\n  recorded: {}\n  replayed: {}",
                    not_reproduced(recorded_core_rules),
                    d.index,
                    d.recorded.as_deref().unwrap_or("(none)"),
                    d.replayed.as_deref().unwrap_or("(none)")
                );
            }
        }
        None => println!("decisions: not compared (give --sched-log FILE)"),
    }
    print_summary(&r.summary);
}

fn print_what_if(w: &WhatIf) {
    println!(
        "what-if: {} recorded inputs (their feedback dropped) through the {} policy, \
         a perfect actuator confirming after {:.1} ms ({} inputs){}",
        w.recorded_inputs,
        w.policy,
        w.options.actuation_ns as f64 / 1e6,
        w.feedback_inputs,
        if w.options.unpin {
            ", tasks unpinned"
        } else {
            ""
        }
    );
    print_summary(&w.summary);
}

/// One synthetic run with how long it took.
#[derive(Serialize)]
struct Timed {
    #[serde(flatten)]
    run: SyntheticRun,
    wall_s: f64,
    inputs_per_s: f64,
}

#[derive(Serialize)]
struct SyntheticReport {
    /// The options of the first mix (the others differ by `mix` only).
    options: SyntheticOptions,
    /// Jobs per mix, in the order of `mixes`.
    mixes: Vec<MixJobs>,
    articles: Articles,
    runs: Vec<Timed>,
}

#[derive(Serialize)]
struct MixJobs {
    mix: Mix,
    jobs: usize,
}

#[derive(Serialize)]
struct Articles {
    load_balance_error: f64,
    mean_queueing_delay_ms: f64,
}

/// The runs `--synthetic` makes for one mix: every policy with late binding and
/// with placement at arrival, then the pinning placements with the hybrid
/// policy; `--policy` and `--placement` narrow it.
fn synthetic_plan(args: &ReplayArgs) -> Vec<(Policy, Placement)> {
    let policies: Vec<Policy> = match args.policy {
        Some(p) => vec![p.into()],
        None => Policy::EVERY.to_vec(),
    };
    let mut plan: Vec<(Policy, Placement)> = Vec::new();
    match (args.policy, args.placement.is_empty()) {
        (None, true) => {
            for placement in [Placement::Late, Placement::Weighted] {
                plan.extend(policies.iter().map(|&p| (p, placement)));
            }
            plan.extend(Placement::ALL[2..].iter().map(|&pl| (Policy::Hybrid, pl)));
        }
        (_, true) => {
            for &p in &policies {
                plan.extend(Placement::ALL.iter().map(|&pl| (p, pl)));
            }
        }
        (_, false) => {
            for &p in &policies {
                plan.extend(args.placement.iter().map(|&pl| (p, pl)));
            }
        }
    }
    plan
}

fn synthetic_runs(args: &ReplayArgs) -> anyhow::Result<i32> {
    if !args.input_logs.is_empty() {
        bail!("give either INPUT_LOG or --synthetic");
    }
    if args.binding.is_some() {
        bail!(
            "--synthetic chooses the binding by placement: `--placement late` binds late, \
             `--placement weighted` at arrival (the other placements pin)"
        );
    }
    let mut mixes: Vec<Mix> = Vec::new();
    for &m in &args.mix {
        if !mixes.contains(&m) {
            mixes.push(m);
        }
    }
    let seeds = args.seeds.clone().map_or_else(|| vec![args.seed], |s| s.0);
    // The agent's config with the flags that change it (GPUs and binding are
    // the run's).
    let agent = args.sched_config(None)?;
    let options = |mix, seed| synthetic_options(args, &agent, mix, seed);
    let variants = overload_variants(args, &agent);
    let plan: Vec<(SyntheticOptions, Policy, Placement)> = mixes
        .iter()
        .flat_map(|&mix| seeds.iter().map(move |&seed| (mix, seed)))
        .flat_map(|(mix, seed)| {
            let variants = &variants;
            synthetic_plan(args)
                .into_iter()
                .flat_map(move |(policy, placement)| {
                    variants
                        .iter()
                        .map(move |v| (synthetic_options(args, v, mix, seed), policy, placement))
                })
        })
        .collect();
    let logs = RunLogs {
        input_log: args.write_input_log.clone(),
        sched_log: args.write_sched_log.clone(),
    };
    if (logs.input_log.is_some() || logs.sched_log.is_some()) && plan.len() != 1 {
        bail!(
            "--write-input-log and --write-sched-log need one run: give --policy, --placement, one --mix and one seed"
        );
    }
    let workloads: Vec<((Mix, u64), Vec<synthetic::Job>)> = mixes
        .iter()
        .flat_map(|&mix| seeds.iter().map(move |&seed| (mix, seed)))
        .map(|(mix, seed)| ((mix, seed), synthetic::workload(&options(mix, seed))))
        .collect();
    let jobs_of = |mix: Mix, seed: u64| {
        workloads
            .iter()
            .find(|(k, _)| *k == (mix, seed))
            .map_or(&[][..], |(_, j)| &j[..])
    };
    // One seed: every run's whole summary is kept (per class, per GPU, JSON);
    // several: each run is reduced to its figures as it ends.
    let keep_runs = seeds.len() == 1;
    let runs = run_all(&plan, args.jobs, |opts, policy, placement| {
        let started = Instant::now();
        let run = synthetic::run(opts, jobs_of(opts.mix, opts.seed), policy, placement, &logs)?;
        let wall_s = started.elapsed().as_secs_f64();
        Ok(Done {
            figures: Figures::of(&run),
            inputs: run.summary.inputs,
            timed: keep_runs.then(|| Timed {
                inputs_per_s: run.summary.inputs as f64 / wall_s.max(1e-9),
                run,
                wall_s,
            }),
            wall_s,
        })
    })?;
    let figures: Vec<Figures> = runs.iter().map(|d| d.figures.clone()).collect();
    let aggregates = seeds::aggregate(&figures);
    if let Some(path) = &args.markdown {
        let what = format!(
            "Seeds {}, {} GPUs x {} GiB, {} h of arrivals at load {}, jobs {}declaring their budgets, \
             declared runtimes: {}; medians over the seeds, then the worst seed's figure and the \
             seed; the agent's defaults in bold (generated by `keling replay --synthetic{} --seeds {} \
             --hours {} --markdown FILE`).",
            seeds_text(&seeds),
            args.gpus,
            args.gpu_memory_gib,
            args.hours,
            args.load,
            if args.budgets { "" } else { "not " },
            args.runtimes.as_str(),
            mixes
                .iter()
                .map(|m| format!(" --mix {}", m.as_str()))
                .collect::<String>()
                + &args
                    .placement
                    .iter()
                    .map(|p| format!(" --placement {}", p.as_str()))
                    .collect::<String>()
                + if args.budgets { "" } else { " --budgets false" }
                + &if args.runtimes == Runtimes::default() {
                    String::new()
                } else {
                    format!(" --runtimes {}", args.runtimes.as_str())
                },
            seeds_text(&seeds),
            args.hours
        );
        let table = seeds::markdown(&what, &aggregates);
        if path.as_os_str() == "-" {
            print!("{table}");
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read {}", path.display()))?;
            let Some(new) = seeds::splice(&text, &table) else {
                bail!(
                    "{}: no table marks to write between: put a line `{}` and a line `{}` \
                     where the table goes (once each)",
                    path.display(),
                    seeds::MARKDOWN_BEGIN,
                    seeds::MARKDOWN_END
                );
            };
            std::fs::write(path, new).with_context(|| format!("write {}", path.display()))?;
            eprintln!("keling: wrote the table into {}", path.display());
        }
    }
    if !keep_runs {
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&SeedsReport {
                    options: options(mixes.first().copied().unwrap_or_default(), seeds[0]),
                    seeds: seeds.clone(),
                    runs: figures,
                    aggregates: aggregates.clone(),
                })?
            );
        } else if args.markdown.is_none() {
            print_seeds(&seeds, &aggregates);
        }
        if args.stats {
            let inputs: u64 = runs.iter().map(|d| d.inputs).sum();
            let wall_s: f64 = runs.iter().map(|d| d.wall_s).sum();
            println!(
                "stats: {} runs, {inputs} inputs in {wall_s:.1} s of run time: {:.2} M inputs/s (one thread a run, simulation included)",
                runs.len(),
                inputs as f64 / wall_s.max(1e-9) / 1e6
            );
        }
        return Ok(0);
    }
    let report = SyntheticReport {
        options: options(mixes.first().copied().unwrap_or_default(), seeds[0]),
        mixes: workloads
            .iter()
            .map(|((mix, _), j)| MixJobs {
                mix: *mix,
                jobs: j.len(),
            })
            .collect(),
        articles: Articles {
            load_balance_error: ARTICLES_LOAD_BALANCE_ERROR,
            mean_queueing_delay_ms: ARTICLES_MEAN_QUEUEING_DELAY_MS,
        },
        runs: runs.into_iter().filter_map(|d| d.timed).collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.markdown.is_none() {
        print_synthetic(&report);
    }
    if args.stats {
        for t in &report.runs {
            println!(
                "stats: {} {} {}: {} inputs in {:.2} s: {:.2} M inputs/s (one thread, simulation included)",
                t.run.mix.as_str(),
                t.run.policy,
                t.run.placement.as_str(),
                t.run.summary.inputs,
                t.wall_s,
                t.inputs_per_s / 1e6
            );
        }
    }
    Ok(0)
}

/// The agent configs each synthetic run is made with: `agent`, or with
/// `--overload-compare` `agent` with the overload rule off, then on.
fn overload_variants(args: &ReplayArgs, agent: &SchedConfig) -> Vec<SchedConfig> {
    if !args.overload_compare {
        return vec![agent.clone()];
    }
    let on = SchedConfig {
        overload: Some(agent.overload.unwrap_or_default()),
        ..agent.clone()
    };
    let off = SchedConfig {
        overload: None,
        ..agent.clone()
    };
    vec![off, on]
}

/// The options of one synthetic mix and seed; `agent` is the agent's config
/// with the flags that change it.
fn synthetic_options(
    args: &ReplayArgs,
    agent: &SchedConfig,
    mix: Mix,
    seed: u64,
) -> SyntheticOptions {
    SyntheticOptions {
        mix,
        seed,
        gpus: args.gpus.max(1),
        hours: args.hours,
        load: args.load,
        gpu_capacity_bytes: args.gpu_memory_gib << 30,
        budgets: args.budgets,
        runtimes: args.runtimes,
        agent: agent.clone(),
        tick_ms: args.tick_ms.max(1),
        active_ms: args.active_ms.max(1),
        actuation_ms: args.actuation_ms,
    }
}

/// One run's outcome.
struct Done {
    figures: Figures,
    inputs: u64,
    wall_s: f64,
    /// The whole run, when kept.
    timed: Option<Timed>,
}

#[derive(Serialize)]
struct SeedsReport {
    /// The options of the first mix and seed (the others differ by those only).
    options: SyntheticOptions,
    seeds: Vec<u64>,
    runs: Vec<Figures>,
    aggregates: Vec<Aggregate>,
}

/// `1-20` for a run of consecutive seeds, else the list.
fn seeds_text(seeds: &[u64]) -> String {
    let consecutive = seeds.windows(2).all(|w| w[1] == w[0] + 1);
    match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) if consecutive && seeds.len() > 1 => format!("{a}-{b}"),
        _ => seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Runs every item of `plan` on `threads` threads, each taking the next item
/// when it is done with one (the runs' lengths differ a lot), and says on
/// standard error how far it is when there is more than one.
fn run_all(
    plan: &[(SyntheticOptions, Policy, Placement)],
    threads: usize,
    run: impl Fn(&SyntheticOptions, Policy, Placement) -> anyhow::Result<Done> + Sync,
) -> anyhow::Result<Vec<Done>> {
    use std::sync::{
        Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    };
    let threads = threads.clamp(1, plan.len().max(1));
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<anyhow::Result<Done>>>> =
        Mutex::new((0..plan.len()).map(|_| None).collect());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= plan.len() || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let (opts, policy, placement) = &plan[i];
                    let r = run(opts, *policy, *placement);
                    let n = finished.fetch_add(1, Ordering::Relaxed) + 1;
                    if plan.len() > 1 {
                        let elapsed = started.elapsed().as_secs_f64();
                        eprintln!(
                            "keling: [{n}/{}] {} seed {} {} {}: {} ({:.0} s in, about {:.0} s left)",
                            plan.len(),
                            opts.mix.as_str(),
                            opts.seed,
                            policy.as_str(),
                            placement.as_str(),
                            match &r {
                                Ok(d) => format!("{:.1} s", d.wall_s),
                                Err(e) => format!("failed: {e:#}"),
                            },
                            elapsed,
                            elapsed / n as f64 * (plan.len() - n) as f64
                        );
                    }
                    failed.fetch_or(r.is_err(), Ordering::Relaxed);
                    results.lock().expect("not poisoned")[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .flatten()
        .collect()
}

fn print_seeds(seeds: &[u64], aggregates: &[Aggregate]) {
    println!(
        "synthetic runs over seeds {}: median / worst (seed) of each figure; * the agent's defaults",
        seeds_text(seeds)
    );
    let pct = |x: f64| format!("{:.2}%", x * 100.0);
    let ms = |x: f64| format!("{x:.1} ms");
    let num = |x: f64| format!("{x:.0}");
    let cell = |o: &OverSeeds, f: &dyn Fn(f64) -> String| {
        format!("{} / {} ({})", f(o.median), f(o.worst), o.worst_seed)
    };
    println!(
        "{:<9} {:<7} {:<14} {:>24} {:>24} {:>30} {:>30} {:>18} {:>14}",
        "mix",
        "policy",
        "placement",
        "LBE busy",
        "LBE mem",
        "queue mean",
        "real-time p99",
        "idle-q GPU-s",
        "evictions"
    );
    for a in aggregates {
        println!(
            "{:<9} {:<7} {:<14} {:>24} {:>24} {:>30} {:>30} {:>18} {:>14}",
            a.mix.as_str(),
            a.policy.as_str(),
            format!(
                "{}{}{}",
                a.placement.as_str(),
                if a.overload { "+ov" } else { "" },
                if a.default { " *" } else { "" }
            ),
            cell(&a.lbe_busy, &pct),
            cell(&a.lbe_mem, &pct),
            cell(&a.queue_mean_ms, &ms),
            a.rt_p99_ms
                .as_ref()
                .map_or("-".to_owned(), |o| cell(o, &ms)),
            cell(&a.idle_while_queued_gpu_s, &num),
            cell(&a.evictions, &num),
        );
    }
    for a in aggregates.iter().filter(|a| a.default) {
        println!(
            "mix {} at the agent's defaults ({} {}): goals (reported, not asserted):",
            a.mix.as_str(),
            a.policy.as_str(),
            a.placement.as_str()
        );
        for g in seeds::goals(a) {
            println!(
                "  {}: {}: {}",
                g.goal,
                g.figure,
                if g.met { "met" } else { "NOT met" }
            );
        }
    }
    if !aggregates.iter().any(|a| a.default) {
        println!(
            "(no run at the agent's defaults: a flag changed its policy, placement, config or tick)"
        );
    }
}

fn print_synthetic(r: &SyntheticReport) {
    let o = &r.options;
    println!(
        "synthetic runs: seed {}, {} GPUs x {} GiB, slots per GPU {}, {} h of arrivals at load {:.2}, \
         budgets {}, runtimes declared: {}; tick {} ms, activity every {} ms, actuation {} ms; \
         * the agent's defaults",
        o.seed,
        o.gpus,
        o.gpu_capacity_bytes >> 30,
        o.agent.slots_per_gpu,
        o.hours,
        o.load,
        if o.budgets {
            "declared"
        } else {
            "not declared"
        },
        o.runtimes.as_str(),
        o.tick_ms,
        o.active_ms,
        o.actuation_ms
    );
    let mixes: Vec<String> = r
        .mixes
        .iter()
        .map(|m| format!("{} {} jobs", m.mix.as_str(), m.jobs))
        .collect();
    println!("mixes (12 classes each): {}", mixes.join(", "));
    let runs: Vec<&Timed> = r.runs.iter().collect();
    print_synthetic_table(&runs);
    for m in &r.mixes {
        let runs: Vec<&Timed> = r.runs.iter().filter(|t| t.run.mix == m.mix).collect();
        if let Some(first) = runs.first() {
            print_synthetic_detail(first);
        }
        // The goals are the defaults': those runs, or every run when a flag
        // left none at the defaults.
        let any_default = runs.iter().any(|t| t.run.default);
        println!(
            "mix {}: goals (reported, not asserted){}:",
            m.mix.as_str(),
            if any_default {
                ", the agent's defaults"
            } else {
                ", no run at the agent's defaults"
            }
        );
        for t in runs.iter().filter(|t| t.run.default || !any_default) {
            println!(
                "  {:<6} {:<13} {}",
                t.run.policy.as_str(),
                t.run.placement.as_str(),
                goals(&t.run)
            );
        }
    }
    println!(
        "design articles (their weighting on their mix): load-balance error {}, mean queueing delay {} ms",
        pct(r.articles.load_balance_error),
        r.articles.mean_queueing_delay_ms
    );
}

fn print_synthetic_table(runs: &[&Timed]) {
    println!(
        "{:<9} {:<7} {:<14} {:>11} {:>11} {:>12} {:>9} {:>8} {:>8} {:>12} {:>8} {:>6} {:>9} {:>9}",
        "mix",
        "policy",
        "placement",
        "queue mean",
        "queue p99",
        "start mean",
        "busy avg",
        "LBE busy",
        "LBE mem",
        "idle-q GPU-s",
        "preempt",
        "evict",
        "completed",
        "work done"
    );
    for t in runs {
        let s = &t.run.summary;
        let busy = s.gpus.iter().map(|g| g.busy_share).sum::<f64>() / s.gpus.len().max(1) as f64;
        println!(
            "{:<9} {:<7} {:<14} {:>8.1} ms {:>8.0} ms {:>9.1} ms {:>9} {:>8} {:>8} {:>12.0} {:>8} {:>6} {:>9} {:>9}",
            t.run.mix.as_str(),
            t.run.policy.as_str(),
            format!(
                "{}{}{}",
                t.run.placement.as_str(),
                if t.run.config.overload.is_some() {
                    "+ov"
                } else {
                    ""
                },
                if t.run.default { " *" } else { "" }
            ),
            s.queueing_delay_ms.mean,
            s.queueing_delay_ms.p99,
            s.wait_to_start_ms.mean,
            pct(busy),
            pct(s.load_balance_error),
            pct(s.memory_load_balance_error),
            s.idle_while_queued_gpu_s,
            s.preemptions,
            s.evictions,
            t.run.completed,
            pct(t.run.work_done_share)
        );
    }
}

/// Per class and per GPU, for one run.
fn print_synthetic_detail(t: &Timed) {
    let s = &t.run.summary;
    println!(
        "mix {}, per class ({} policy, {} placement): queueing delay mean / p50 / p99",
        t.run.mix.as_str(),
        t.run.policy,
        t.run.placement.as_str()
    );
    let mut classes = s.by_name.clone();
    classes.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.name.cmp(&b.name)));
    for c in classes {
        let q = &c.queueing_delay_ms;
        println!(
            "  {:<18} priority {:>2}: {:>5} jobs, {:>10.1} / {:>10.1} / {:>10.1} ms",
            c.name, c.priority, c.tasks, q.mean, q.p50, q.p99
        );
    }
    let busy: Vec<String> = s
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.gpu, pct(g.busy_share)))
        .collect();
    println!("  GPU busy share: {}", busy.join(", "));
}

/// One run against issue 34's goals for its mix.
fn goals(run: &SyntheticRun) -> String {
    let a = seeds::aggregate(&[Figures::of(run)]);
    a.first()
        .map(|a| {
            seeds::goals(a)
                .iter()
                .map(|g| {
                    format!(
                        "{}: {}: {}",
                        g.goal,
                        g.figure,
                        if g.met { "met" } else { "NOT met" }
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// A difference is called a bug only for a log recorded under this core's
    /// rules; under other rules it says which, and a log that does not say
    /// gets both readings.
    #[test]
    fn a_difference_is_a_bug_only_under_the_same_core_rules() {
        let now = keling_sched::RULES_REVISION;
        assert!(not_reproduced(Some(now)).contains("a bug"));
        let other = not_reproduced(Some(now + 1));
        assert!(!other.contains("bug"), "{other}");
        assert!(
            other.contains(&format!("revision {}", now + 1))
                && other.contains(&format!("revision {now}")),
            "{other}"
        );
        let unsaid = not_reproduced(None);
        assert!(
            unsaid.contains("does not say") && unsaid.contains("a bug"),
            "{unsaid}"
        );
    }

    fn replay_args(flags: &[&str]) -> ReplayArgs {
        let argv = ["keling", "replay", "--synthetic"].iter().chain(flags);
        match super::super::Cli::try_parse_from(argv).unwrap().command {
            super::super::Command::Replay(a) => a,
            _ => unreachable!(),
        }
    }

    /// `keling run` with no flag: its parsed defaults through the function
    /// that builds its config.
    fn keling_run_default(gpus: Vec<GpuInfo>) -> SchedConfig {
        match super::super::Cli::try_parse_from(["keling", "run"])
            .unwrap()
            .command
        {
            super::super::Command::Run(a) => super::super::run::sched_config(&a, gpus),
            _ => unreachable!(),
        }
    }

    /// The runs `args` makes for one mix (a few simulated minutes each), and
    /// their `default` marks and configs.
    fn marked(flags: &[&str]) -> Vec<(Policy, Placement, bool, SchedConfig)> {
        let args = replay_args(flags);
        let agent = args.sched_config(None).unwrap();
        let mut runs = Vec::new();
        for (policy, placement) in synthetic_plan(&args) {
            for v in overload_variants(&args, &agent) {
                let opts = synthetic_options(&args, &v, Mix::Transcode, 1);
                let jobs = synthetic::workload(&opts);
                let r =
                    synthetic::run(&opts, &jobs, policy, placement, &RunLogs::default()).unwrap();
                runs.push((policy, placement, r.default, r.config));
            }
        }
        runs
    }

    #[test]
    fn the_run_marked_default_has_keling_runs_default_config() {
        let small = ["--gpus", "2", "--hours", "0.02", "--mix", "transcode"];
        let runs = marked(&small);
        assert_eq!(runs.len(), 11, "4 policies x late/weighted, 3 pinning");
        let defaults: Vec<_> = runs.iter().filter(|r| r.2).collect();
        assert_eq!(
            defaults.len(),
            1,
            "exactly one run is keling run's: {runs:?}"
        );
        let (policy, placement, _, config) = defaults[0];
        assert_eq!(*policy, Policy::default());
        assert!(!placement.pins());
        assert_eq!(config, &keling_run_default(config.gpus.clone()));
        assert_eq!(config.gpus.len(), 2);
        assert!(config.gpus.iter().all(|g| g.capacity_bytes == 80 << 30));
        // Every other run differs from it.
        for r in runs.iter().filter(|r| !r.2) {
            assert!(
                r.0 != *policy || r.1 != *placement,
                "the same policy and placement must be the default: {r:?}"
            );
        }
        // A flag that changes the agent's config, policy or tick: none is.
        for flags in [
            &["--slots", "3"][..],
            &["--idle-timeout-ms", "50"],
            &["--placement-seed", "9"],
            &["--policy", "fifo"],
            &["--tick-ms", "50"],
            &["--placement", "round-robin"],
        ] {
            let args: Vec<&str> = small.iter().chain(flags).copied().collect();
            assert!(
                marked(&args).iter().all(|r| !r.2),
                "{flags:?} leaves no run at the defaults"
            );
        }
    }

    /// `--overload-compare` makes each run with the overload rule off and on
    /// (thresholds from the flags); only the one off can be the default.
    #[test]
    fn overload_compare_runs_each_with_the_rule_off_and_on() {
        let runs = marked(&[
            "--gpus",
            "2",
            "--hours",
            "0.02",
            "--policy",
            "hybrid",
            "--placement",
            "late",
            "--overload-compare",
            "--overload-waiting",
            "3",
        ]);
        let rules: Vec<Option<keling_sched::OverloadRule>> =
            runs.iter().map(|r| r.3.overload).collect();
        assert_eq!(
            rules,
            [
                None,
                Some(keling_sched::OverloadRule {
                    min_waiting: 3,
                    ..Default::default()
                })
            ]
        );
        assert_eq!(runs.iter().map(|r| r.2).collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn seeds_parse_as_ranges_and_lists() {
        assert_eq!(parse_seeds("1-3").unwrap(), Seeds(vec![1, 2, 3]));
        assert_eq!(parse_seeds("4, 1-2,2").unwrap(), Seeds(vec![4, 1, 2]));
        assert_eq!(parse_seeds("7").unwrap(), Seeds(vec![7]));
        assert!(parse_seeds("3-1").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("1-18446744073709551615").is_err());
        assert!(parse_seeds("1-999,2000-2001").is_err());
        assert_eq!(seeds_text(&[1, 2, 3]), "1-3");
        assert_eq!(seeds_text(&[1, 3]), "1,3");
    }
}
