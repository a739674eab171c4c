//! Decision latency: per-stage HdrHistograms, the timeout model, and their exports.
//!
//! Every scheduler decision (freeze, thaw, stop, terminate, kill, place, warn) carries five
//! timestamps, all ns of `CLOCK_MONOTONIC`, from the kernel event that triggered it to the
//! confirmation of its effect. This module turns them into stage latencies, keeps them in
//! HdrHistograms, judges each decision against the timeout in force, and exports the
//! histograms. One job per submodule:
//!
//! | module | owns | must not |
//! |---|---|---|
//! | [`timeout_model`] | the timeout models ([`ModelKind`], [`TimeoutModel`]): the window and the formulas that decide the timeout | judge or record decisions |
//! | [`recorder`] | [`LatencyRecorder`]: stages ([`Stage`], [`DecisionTimes`]), the histograms, late or not ([`Verdict`]), what each interval recorded, which of them an export shows ([`Selection`]) | format anything |
//! | [`export`] | the exports of a recorder: percentile tables, JSON, status ([`LatencyStatus`]), the one-shot interval log; [`HistoFormat`] | change the recorder |
//! | [`intervals`] | the interval log: its one writer ([`intervals::IntervalLogAppender`], behind `keling run --histo-log` and the one-shot export) and its reader | know what the exports show |
//! | [`prom`] | the Prometheus families (one encoding for the exports and `/metrics`) | |
//! | [`tune`] | replaying a series through both models at a range of multipliers, the recommendation, the report ([`tune_report`]) | read a log itself (it is handed the series) |
//!
//! Pure logic: no clock reads and no I/O other than writing exports to a caller's writer.
//! The names callers need are re-exported here.

pub mod export;
pub mod intervals;
pub mod prom;
pub mod recorder;
pub mod timeout_model;
pub mod tune;

pub use export::{HistoFormat, LatencyStatus, MsPercentiles};
pub use recorder::{
    DecisionTimes, HIST_HIGH_NS, HIST_LOW_NS, HIST_SIGFIG, Interval, LatencyRecorder,
    MAX_ACTION_KINDS, OTHER_ACTION, Percentiles, Selection, Stage, StageDurations, Verdict,
};
pub use timeout_model::{
    ADAPTIVE_FACTOR, DEFAULT_TIMEOUT_NS, MIN_OBSERVATIONS, MIN_TIMEOUT_NS, ModelKind,
    RECOMPUTE_INTERVAL_NS, STATIC_SIGMAS, TimeoutModel, WINDOW_MAX_AGE_NS, WINDOW_MAX_DECISIONS,
};
pub use tune::{ModelSummary, TuneReport, tune_report};
