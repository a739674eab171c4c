//! Decision latency: per-stage HdrHistograms, the timeout model, and their exports.
//!
//! Every scheduler decision (freeze, thaw, stop, terminate, kill, place, warn) carries five
//! timestamps, all `u64` nanoseconds of `CLOCK_MONOTONIC` (the clock behind the kernel's
//! `bpf_ktime_get_ns`): the kernel event that triggered it, when the agent received it, when it
//! decided, when the actuation call returned, and when the effect was confirmed (if ever). This
//! module turns them into stage latencies, keeps one HdrHistogram per (stage, action kind) and per
//! stage for all actions, judges each decision against the timeout in force, and exports the
//! histograms (interval log V2, classic percentile table, Prometheus text, JSON).
//!
//! Pure logic: no clock reads and no I/O other than writing exports to a caller's writer.
//!
//! # Stages
//! | stage          | from          | to                                         |
//! |----------------|---------------|--------------------------------------------|
//! | `Delivery`     | `event_ns`    | `received_ns`                              |
//! | `Decision`     | `received_ns` | `decided_ns`                               |
//! | `Actuation`    | `decided_ns`  | `actuated_ns`                              |
//! | `Confirmation` | `actuated_ns` | `confirmed_ns` (not recorded when `None`)  |
//! | `EndToEnd`     | `event_ns`    | `confirmed_ns`, or `actuated_ns` when `None` |
//!
//! Every difference saturates at 0, so out-of-order timestamps give 0, never a panic.
//!
//! # Histograms
//! Values are recorded in nanoseconds with a lowest discernible value of 1 us, a highest
//! trackable value of 60 s and 3 significant digits. Values above 60 s are clamped to 60 s in the
//! histogram (the exact sum used for Prometheus `_sum` is kept unclamped). At most
//! [`MAX_ACTION_KINDS`] distinct action names get their own histograms; further names are
//! recorded under [`OTHER_ACTION`], so a misbehaving caller cannot grow memory without bound.
//!
//! # Timeout model
//! Both models start at [`DEFAULT_TIMEOUT_NS`] = 23.8 ms (the design's 12.4 ms + 3 x 3.8 ms) and
//! keep it while the window holds fewer than [`MIN_OBSERVATIONS`] observations.
//!
//! - The window is the intersection of "the last [`WINDOW_MAX_DECISIONS`] = 1000 observations" and
//!   "observations whose timestamp is no more than [`WINDOW_MAX_AGE_NS`] = 60 s before the time of
//!   the recomputation", i.e. whichever of the two is smaller. (`observe` also drops, from the
//!   front, observations more than 60 s older than the one it adds.) An observation's timestamp
//!   is the `now_ns` given to `observe`; the recorder uses [`DecisionTimes::latest_ns`].
//! - Static: mean + 3 sigma of the window, sigma being the population standard deviation (divide
//!   by n: the window is the whole population the timeout describes).
//! - Adaptive: p99 of the window x 1.2. The p99 is the exact nearest-rank percentile of the
//!   window's values (the value at rank ceil(0.99 n) of the sorted window), not an HdrHistogram
//!   estimate: the window holds at most 1000 values, so sorting a copy once a second is cheap.
//! - Both recompute in [`TimeoutModel::maybe_recompute`], at most once per second of the supplied
//!   time (the first call always recomputes; a later one only when at least 1 s has passed since
//!   the last recomputation; time that goes backwards never recomputes).
//! - Timeouts are rounded to whole nanoseconds and never go below [`MIN_TIMEOUT_NS`] (1 us, the
//!   histograms' resolution), so a window of zeros does not make every decision late.
//!
//! A decision is late when its end-to-end latency is strictly greater than the timeout in force
//! when it is recorded (before its own latency joins the window).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub mod intervals;
pub mod prom;
pub mod tune;

/// Timeout before the window holds enough data: 12.4 ms + 3 x 3.8 ms.
pub const DEFAULT_TIMEOUT_NS: u64 = 23_800_000;
/// A window with fewer observations than this keeps [`DEFAULT_TIMEOUT_NS`].
pub const MIN_OBSERVATIONS: usize = 20;
/// The window never holds more than this many observations (the newest ones).
pub const WINDOW_MAX_DECISIONS: usize = 1000;
/// Observations older than this (relative to the time of recomputation) leave the window.
pub const WINDOW_MAX_AGE_NS: u64 = 60_000_000_000;
/// The models recompute at most once per this much supplied time.
pub const RECOMPUTE_INTERVAL_NS: u64 = 1_000_000_000;
/// Static model: mean + `STATIC_SIGMAS` x sigma.
pub const STATIC_SIGMAS: f64 = 3.0;
/// Adaptive model: p99 x `ADAPTIVE_FACTOR` by default.
pub const ADAPTIVE_FACTOR: f64 = 1.2;
/// The adaptive factor is applied in thousandths, in integer arithmetic.
const ADAPTIVE_FACTOR_DEN_MILLI: u128 = 1000;
/// Lower bound of any computed timeout.
pub const MIN_TIMEOUT_NS: u64 = 1_000;

/// Lowest discernible value of the histograms (1 us, in ns).
pub const HIST_LOW_NS: u64 = 1_000;
/// Highest trackable value of the histograms (60 s, in ns); larger values are clamped.
pub const HIST_HIGH_NS: u64 = 60_000_000_000;
/// Significant value digits of the histograms.
pub const HIST_SIGFIG: u8 = 3;
/// Distinct action names with their own histograms; others go to [`OTHER_ACTION`].
pub const MAX_ACTION_KINDS: usize = 32;
/// Action name under which names beyond [`MAX_ACTION_KINDS`] are recorded.
pub const OTHER_ACTION: &str = "other";

const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;
/// Stage order of the exports: end-to-end first, then the pipeline.
const EXPORT_STAGES: [Stage; 5] = [
    Stage::EndToEnd,
    Stage::Delivery,
    Stage::Decision,
    Stage::Actuation,
    Stage::Confirmation,
];

/// One stage of a decision's latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Kernel event -> agent received it.
    Delivery,
    /// Received -> decided.
    Decision,
    /// Decided -> actuation call returned.
    Actuation,
    /// Actuated -> effect confirmed.
    Confirmation,
    /// Kernel event -> confirmed (or -> actuated when nothing was confirmed).
    EndToEnd,
}

impl Stage {
    /// All stages, in pipeline order with end-to-end last.
    pub const ALL: [Stage; 5] = [
        Stage::Delivery,
        Stage::Decision,
        Stage::Actuation,
        Stage::Confirmation,
        Stage::EndToEnd,
    ];

    /// The snake_case name used in every export.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Delivery => "delivery",
            Stage::Decision => "decision",
            Stage::Actuation => "actuation",
            Stage::Confirmation => "confirmation",
            Stage::EndToEnd => "end_to_end",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The timestamps of one decision, all ns of `CLOCK_MONOTONIC`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionTimes {
    /// Action kind: "freeze", "thaw", "stop", "terminate", "kill", "place", "warn", ...
    pub action: String,
    /// Kernel timestamp of the triggering event.
    pub event_ns: u64,
    /// When the agent received the event.
    pub received_ns: u64,
    /// When the scheduler decided.
    pub decided_ns: u64,
    /// When the actuation call returned.
    pub actuated_ns: u64,
    /// When the effect was confirmed; `None` if never (or nothing to confirm).
    pub confirmed_ns: Option<u64>,
}

impl DecisionTimes {
    /// The latest of the decision's timestamps: when its end-to-end latency became known
    /// (robust to out-of-order timestamps). Used as the observation time for the window.
    pub fn latest_ns(&self) -> u64 {
        self.event_ns
            .max(self.received_ns)
            .max(self.decided_ns)
            .max(self.actuated_ns)
            .max(self.confirmed_ns.unwrap_or(0))
    }
}

/// Stage latencies of one decision, each saturating at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StageDurations {
    pub delivery_ns: u64,
    pub decision_ns: u64,
    pub actuation_ns: u64,
    /// `None` when the decision was never confirmed.
    pub confirmation_ns: Option<u64>,
    pub end_to_end_ns: u64,
}

impl StageDurations {
    /// Computes the stage latencies; never panics.
    pub fn of(t: &DecisionTimes) -> Self {
        let end = t.confirmed_ns.unwrap_or(t.actuated_ns);
        StageDurations {
            delivery_ns: t.received_ns.saturating_sub(t.event_ns),
            decision_ns: t.decided_ns.saturating_sub(t.received_ns),
            actuation_ns: t.actuated_ns.saturating_sub(t.decided_ns),
            confirmation_ns: t.confirmed_ns.map(|c| c.saturating_sub(t.actuated_ns)),
            end_to_end_ns: end.saturating_sub(t.event_ns),
        }
    }

    /// The latency of one stage; `None` only for an unconfirmed `Confirmation`.
    pub fn get(&self, stage: Stage) -> Option<u64> {
        match stage {
            Stage::Delivery => Some(self.delivery_ns),
            Stage::Decision => Some(self.decision_ns),
            Stage::Actuation => Some(self.actuation_ns),
            Stage::Confirmation => self.confirmation_ns,
            Stage::EndToEnd => Some(self.end_to_end_ns),
        }
    }
}

/// Which timeout model is in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// mean + 3 sigma over the window.
    Static,
    /// p99 of the window x 1.2, recomputed every second.
    Adaptive,
}

impl ModelKind {
    /// The design's multiplier: 3 sigmas (static), p99 x 1.2 (adaptive).
    pub fn default_multiplier(self) -> f64 {
        match self {
            ModelKind::Static => STATIC_SIGMAS,
            ModelKind::Adaptive => ADAPTIVE_FACTOR,
        }
    }

    /// "static" or "adaptive".
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Static => "static",
            ModelKind::Adaptive => "adaptive",
        }
    }
}

/// The decision timeout: a sliding window of end-to-end latencies and the model applied to it.
/// See the module documentation for the window and the formulas.
#[derive(Clone, Debug)]
pub struct TimeoutModel {
    kind: ModelKind,
    /// Static: sigmas over the mean; adaptive: the factor on p99 (see [`ModelKind::default_multiplier`]).
    multiplier: f64,
    /// `(observed_at_ns, end_to_end_ns)`, oldest first (by insertion).
    window: VecDeque<(u64, u64)>,
    timeout_ns: u64,
    last_recompute_ns: Option<u64>,
}

impl TimeoutModel {
    /// A model with an empty window and the default 23.8 ms timeout.
    pub fn new(kind: ModelKind) -> Self {
        Self::with_multiplier(kind, kind.default_multiplier())
    }

    /// A model with another multiplier: sigmas over the mean (static), or the factor
    /// on p99 (adaptive). Negative or non-finite multipliers count as 0.
    pub fn with_multiplier(kind: ModelKind, multiplier: f64) -> Self {
        TimeoutModel {
            kind,
            multiplier: if multiplier.is_finite() {
                multiplier.max(0.0)
            } else {
                0.0
            },
            window: VecDeque::with_capacity(WINDOW_MAX_DECISIONS + 1),
            timeout_ns: DEFAULT_TIMEOUT_NS,
            last_recompute_ns: None,
        }
    }

    /// The model's kind.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// The model's multiplier (sigmas, or the factor on p99).
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// Adds one end-to-end latency observed at `now_ns`. Does not change the timeout by itself.
    pub fn observe(&mut self, end_to_end_ns: u64, now_ns: u64) {
        self.window.push_back((now_ns, end_to_end_ns));
        while self.window.len() > WINDOW_MAX_DECISIONS {
            self.window.pop_front();
        }
        // Cheap in-order eviction; `recompute` does the exact one.
        let cutoff = now_ns.saturating_sub(WINDOW_MAX_AGE_NS);
        while self.window.front().is_some_and(|&(ts, _)| ts < cutoff) {
            self.window.pop_front();
        }
    }

    /// The timeout in force, in ns.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// A model whose timeout in force is `timeout_ns` (read back from a log), with an
    /// empty window.
    pub fn with_timeout(kind: ModelKind, multiplier: f64, timeout_ns: u64) -> Self {
        let mut m = Self::with_multiplier(kind, multiplier);
        m.timeout_ns = timeout_ns;
        m
    }

    /// Observations currently in the window (as of the last eviction).
    #[cfg(test)]
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Recomputes the timeout unless it was recomputed less than 1 s (of `now_ns`) ago.
    /// Returns whether it recomputed.
    pub fn maybe_recompute(&mut self, now_ns: u64) -> bool {
        let due = self.last_recompute_ns.is_none_or(|last| {
            now_ns
                .checked_sub(last)
                .is_some_and(|d| d >= RECOMPUTE_INTERVAL_NS)
        });
        if due {
            self.recompute(now_ns);
        }
        due
    }

    /// Recomputes the timeout now, ignoring the once-per-second limit.
    pub fn recompute(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(WINDOW_MAX_AGE_NS);
        self.window.retain(|&(ts, _)| ts >= cutoff);
        self.last_recompute_ns = Some(now_ns);
        if self.window.len() < MIN_OBSERVATIONS {
            self.timeout_ns = DEFAULT_TIMEOUT_NS;
            return;
        }
        let computed = match self.kind {
            ModelKind::Static => {
                static_timeout(self.window.iter().map(|&(_, v)| v), self.multiplier)
            }
            ModelKind::Adaptive => {
                let mut values: Vec<u64> = self.window.iter().map(|&(_, v)| v).collect();
                values.sort_unstable();
                let p99 = nearest_rank(&values, 99);
                // In thousandths, in integers: 1.2 gives exactly p99 x 6 / 5, rounded.
                let milli = (self.multiplier * ADAPTIVE_FACTOR_DEN_MILLI as f64).round() as u128;
                let t = u128::from(p99) * milli;
                let t = (t + ADAPTIVE_FACTOR_DEN_MILLI / 2) / ADAPTIVE_FACTOR_DEN_MILLI;
                u64::try_from(t).unwrap_or(u64::MAX)
            }
        };
        self.timeout_ns = computed.max(MIN_TIMEOUT_NS);
    }
}

/// mean + `sigmas` x population sigma, rounded to ns. `values` must not be empty.
fn static_timeout(values: impl Iterator<Item = u64> + Clone, sigmas: f64) -> u64 {
    let n = values.clone().count() as f64;
    let mean = values.clone().map(|v| v as f64).sum::<f64>() / n;
    let var = values
        .map(|v| {
            let d = v as f64 - mean;
            d * d
        })
        .sum::<f64>()
        / n;
    let t = mean + sigmas * var.max(0.0).sqrt();
    // `as` saturates for out-of-range floats.
    t.round() as u64
}

/// The value at rank ceil(pct/100 x n) of a sorted, non-empty slice.
fn nearest_rank(sorted: &[u64], pct: usize) -> u64 {
    let n = sorted.len();
    let rank = (pct * n).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

/// The outcome of recording one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// End-to-end latency was strictly over the timeout in force.
    pub late: bool,
    pub end_to_end_ns: u64,
    /// The timeout the decision was judged against.
    pub timeout_ns: u64,
}

/// Summary of one histogram, all values in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub count: u64,
}

/// One histogram plus the exact (unclamped) sum of what it recorded.
#[derive(Clone, Debug)]
struct Hist {
    h: Histogram<u64>,
    sum_ns: u128,
}

impl Hist {
    fn new() -> Self {
        Hist {
            h: Histogram::new_with_bounds(HIST_LOW_NS, HIST_HIGH_NS, HIST_SIGFIG)
                .expect("constant histogram bounds are valid"),
            sum_ns: 0,
        }
    }

    fn record(&mut self, v: u64) {
        self.h.saturating_record(v);
        self.sum_ns += u128::from(v);
    }

    fn percentiles(&self) -> Option<Percentiles> {
        if self.h.is_empty() {
            return None;
        }
        Some(Percentiles {
            p50_ns: self.h.value_at_quantile(0.5),
            p90_ns: self.h.value_at_quantile(0.9),
            p99_ns: self.h.value_at_quantile(0.99),
            max_ns: self.h.max(),
            count: self.h.len(),
        })
    }
}

/// The latency histograms of every decision and the timeout model they feed.
#[derive(Clone, Debug)]
pub struct LatencyRecorder {
    model: TimeoutModel,
    /// One per stage, all actions.
    all: BTreeMap<Stage, Hist>,
    /// One per (stage, action kind), created on first use.
    by_action: BTreeMap<(Stage, String), Hist>,
    late_by_action: BTreeMap<String, u64>,
    decisions: u64,
    late: u64,
    /// Latest timestamp seen in a record or a tick.
    last_ns: Option<u64>,
    /// What was recorded since the last [`LatencyRecorder::take_interval`], when an
    /// interval log is kept.
    interval: Option<Interval>,
}

/// The decisions of one interval of an interval log: histograms keyed by (stage,
/// action or `None` for all actions), and what the model did with them.
#[derive(Clone, Debug, Default)]
pub struct Interval {
    pub histograms: BTreeMap<(Stage, Option<String>), Histogram<u64>>,
    pub decisions: u64,
    pub late: u64,
}

/// Which histograms an export shows: one stage or all; with an action, only that
/// action's histograms (without, the all-actions ones, and in JSON and Prometheus
/// the per-action ones too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub stage: Option<Stage>,
    pub action: Option<String>,
}

impl Selection {
    fn stage(&self, s: Stage) -> bool {
        self.stage.is_none_or(|x| x == s)
    }

    fn action(&self, a: Option<&str>) -> bool {
        match (&self.action, a) {
            (None, _) => true,
            (Some(want), Some(a)) => want == a,
            (Some(_), None) => false,
        }
    }
}

impl LatencyRecorder {
    /// An empty recorder whose timeout follows `kind`.
    pub fn new(kind: ModelKind) -> Self {
        Self::with_multiplier(kind, kind.default_multiplier())
    }

    /// An empty recorder whose timeout follows `kind` with another multiplier (see
    /// [`TimeoutModel::with_multiplier`]).
    pub fn with_multiplier(kind: ModelKind, multiplier: f64) -> Self {
        LatencyRecorder {
            interval: None,
            model: TimeoutModel::with_multiplier(kind, multiplier),
            all: Stage::ALL.iter().map(|&s| (s, Hist::new())).collect(),
            by_action: BTreeMap::new(),
            late_by_action: BTreeMap::new(),
            decisions: 0,
            late: 0,
            last_ns: None,
        }
    }

    /// The name a decision's action is recorded under (capped, see [`MAX_ACTION_KINDS`]).
    fn action_key(&self, action: &str) -> String {
        if self.late_by_action.contains_key(action) || self.late_by_action.len() < MAX_ACTION_KINDS
        {
            action.to_owned()
        } else {
            OTHER_ACTION.to_owned()
        }
    }

    /// Records every stage of one decision, judges its end-to-end latency against the timeout
    /// in force, then adds it to the model's window (observed at [`DecisionTimes::latest_ns`]).
    pub fn record(&mut self, t: &DecisionTimes) -> Verdict {
        let d = StageDurations::of(t);
        let action = self.action_key(&t.action);
        for stage in Stage::ALL {
            if let Some(v) = d.get(stage) {
                self.all.entry(stage).or_insert_with(Hist::new).record(v);
                self.by_action
                    .entry((stage, action.clone()))
                    .or_insert_with(Hist::new)
                    .record(v);
            }
        }
        let timeout_ns = self.model.timeout_ns();
        let late = d.end_to_end_ns > timeout_ns;
        if let Some(iv) = &mut self.interval {
            for stage in Stage::ALL {
                if let Some(v) = d.get(stage) {
                    for key in [(stage, None), (stage, Some(action.clone()))] {
                        iv.histograms
                            .entry(key)
                            .or_insert_with(|| Hist::new().h)
                            .saturating_record(v);
                    }
                }
            }
            iv.decisions += 1;
            iv.late += u64::from(late);
        }
        self.decisions += 1;
        let late_here = self.late_by_action.entry(action).or_insert(0);
        if late {
            self.late += 1;
            *late_here += 1;
        }
        let now = t.latest_ns();
        self.model.observe(d.end_to_end_ns, now);
        self.note_time(now);
        Verdict {
            late,
            end_to_end_ns: d.end_to_end_ns,
            timeout_ns,
        }
    }

    /// Starts keeping what each interval recorded, for an interval log.
    pub fn keep_intervals(&mut self) {
        self.interval.get_or_insert_with(Interval::default);
    }

    /// What was recorded since the last call (or since [`Self::keep_intervals`]);
    /// `None` when intervals are not kept.
    pub fn take_interval(&mut self) -> Option<Interval> {
        self.interval.as_mut().map(std::mem::take)
    }

    /// The model in force.
    pub fn model(&self) -> &TimeoutModel {
        &self.model
    }

    /// A recorder rebuilt from exported histograms (an interval log): the exports
    /// then show what the live agent's did. `histograms` are keyed as in
    /// [`Interval`]; Prometheus sums are estimated from the histograms (mean x count).
    pub fn from_histograms(
        model: TimeoutModel,
        histograms: BTreeMap<(Stage, Option<String>), Histogram<u64>>,
        decisions: u64,
        late: u64,
        late_by_action: BTreeMap<String, u64>,
    ) -> Self {
        let mut r = Self::with_multiplier(model.kind(), model.multiplier());
        r.model = model;
        r.decisions = decisions;
        r.late = late;
        for ((stage, action), h) in histograms {
            let mut hist = Hist::new();
            if hist.h.add(&h).is_err() {
                // Values beyond 60 s: clamp them like a live recording would.
                for v in h.iter_recorded() {
                    hist.h
                        .saturating_record_n(v.value_iterated_to(), v.count_at_value());
                }
            }
            hist.sum_ns = (hist.h.mean() * hist.h.len() as f64).round() as u128;
            match action {
                None => {
                    r.all.insert(stage, hist);
                }
                Some(a) => {
                    r.late_by_action.entry(a.clone()).or_insert(0);
                    r.by_action.insert((stage, a), hist);
                }
            }
        }
        for (a, n) in late_by_action {
            r.late_by_action.insert(a, n);
        }
        r
    }

    /// Lets the model recompute (at most once per second of `now_ns`).
    pub fn tick(&mut self, now_ns: u64) {
        self.note_time(now_ns);
        self.model.maybe_recompute(now_ns);
    }

    fn note_time(&mut self, now_ns: u64) {
        self.last_ns = Some(self.last_ns.map_or(now_ns, |l| l.max(now_ns)));
    }

    /// The timeout in force, in ns.
    pub fn timeout_ns(&self) -> u64 {
        self.model.timeout_ns()
    }

    /// Decisions called late so far.
    pub fn late_count(&self) -> u64 {
        self.late
    }

    /// Decisions recorded so far.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// Late decisions per action kind (every recorded kind appears, possibly with 0).
    pub fn late_by_action(&self) -> &BTreeMap<String, u64> {
        &self.late_by_action
    }

    fn hist(&self, stage: Stage, action: Option<&str>) -> Option<&Hist> {
        match action {
            None => self.all.get(&stage),
            Some(a) => self.by_action.get(&(stage, a.to_owned())),
        }
    }

    /// Percentiles of one stage, for one action kind or (`None`) all of them. `None` when
    /// nothing was recorded there.
    pub fn percentiles(&self, stage: Stage, action: Option<&str>) -> Option<Percentiles> {
        self.hist(stage, action).and_then(Hist::percentiles)
    }

    fn actions(&self) -> impl Iterator<Item = &String> {
        self.late_by_action.keys()
    }

    /// A compact status (ms values) for the agent's status endpoint.
    pub fn status(&self) -> LatencyStatus {
        LatencyStatus {
            timeout_ms: self.timeout_ns() as f64 / NS_PER_MS,
            model: self.model.kind().as_str().to_owned(),
            late: self.late,
            decisions: self.decisions,
            stages: Stage::ALL
                .iter()
                .map(|&s| {
                    (
                        s.as_str().to_owned(),
                        MsPercentiles::of(self.percentiles(s, None)),
                    )
                })
                .collect(),
            by_action: self
                .actions()
                .map(|a| {
                    (
                        a.clone(),
                        MsPercentiles::of(self.percentiles(Stage::EndToEnd, Some(a))),
                    )
                })
                .collect(),
            late_by_action: self.late_by_action.clone(),
        }
    }

    /// [`LatencyRecorder::status`] as JSON.
    pub fn status_json(&self) -> Value {
        serde_json::to_value(self.status()).expect("plain data serialises")
    }

    /// Every histogram in export order: end-to-end of all actions, the other stages of all
    /// actions, then per (stage, action kind). Items are (stage, action or `None` for all, hist).
    fn export_order(&self) -> Vec<(Stage, Option<&str>, &Hist)> {
        self.export_selected(&Selection::default())
    }

    /// [`Self::export_order`], only what `sel` selects.
    fn export_selected(&self, sel: &Selection) -> Vec<(Stage, Option<&str>, &Hist)> {
        let mut out = Vec::new();
        for stage in EXPORT_STAGES {
            if let Some(h) = self.all.get(&stage)
                && sel.stage(stage)
                && sel.action(None)
            {
                out.push((stage, None, h));
            }
        }
        for ((stage, action), h) in &self.by_action {
            if sel.stage(*stage) && sel.action(Some(action)) {
                out.push((*stage, Some(action.as_str()), h));
            }
        }
        out
    }

    /// Every histogram in export order, for the interval log and Prometheus.
    pub fn histograms(&self) -> Vec<(Stage, Option<&str>, &Histogram<u64>)> {
        self.export_order()
            .into_iter()
            .map(|(s, a, h)| (s, a, &h.h))
            .collect()
    }

    /// The exact sum of what a histogram recorded, ns (estimated for imported ones).
    pub fn sum_ns(&self, stage: Stage, action: Option<&str>) -> u128 {
        self.hist(stage, action).map_or(0, |h| h.sum_ns)
    }

    /// Writes one export format, only the histograms `sel` selects.
    pub fn write_export(
        &self,
        w: &mut impl Write,
        format: HistoFormat,
        sel: &Selection,
    ) -> io::Result<()> {
        match format {
            HistoFormat::Hgrm => self.write_percentile_table_selected(w, sel),
            HistoFormat::Prom => self.write_prometheus_selected(w, sel),
            HistoFormat::Json => self.write_json_selected(w, sel),
        }
    }

    /// Writes an HdrHistogram interval log (V2, deflate-compressed histograms, readable by
    /// `IntervalLogIterator` and Java's `HistogramLogReader`): one interval starting at
    /// `start_ns` and lasting until the latest timestamp seen. The untagged histogram is
    /// end-to-end for all actions; the other stages are tagged with their name
    /// (`delivery`, ...), and per-action histograms with `stage/action` (characters a tag
    /// cannot hold become `_`). Values are ns; the max column is in ms; interval timestamps are
    /// seconds of `CLOCK_MONOTONIC` (no StartTime/BaseTime: this module reads no wall clock).
    pub fn write_interval_log(&self, w: &mut impl Write, start_ns: u64) -> io::Result<()> {
        let start = Duration::from_nanos(start_ns);
        let length =
            Duration::from_nanos(self.last_ns.unwrap_or(start_ns).saturating_sub(start_ns));
        let mut serializer = V2DeflateSerializer::new();
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment("[Histogram log format version 1.3]")
            .add_comment(
                "[Keling decision latency: values in ns, interval timestamps in s of CLOCK_MONOTONIC, \
                 untagged = end_to_end of all actions]",
            )
            .with_max_value_divisor(NS_PER_MS)
            .begin_log_with(w, &mut serializer)?;
        for (stage, action, h) in self.export_order() {
            let tag_text = match action {
                None if stage == Stage::EndToEnd => None,
                None => Some(stage.as_str().to_owned()),
                Some(a) => Some(format!("{}/{}", stage.as_str(), sanitize_tag(a))),
            };
            let tag = tag_text.as_deref().and_then(Tag::new);
            log.write_histogram(&h.h, start, length, tag)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(())
    }

    /// Writes HdrHistogram's classic percentile distribution (`Value Percentile TotalCount
    /// 1/(1-Percentile)`, 5 ticks per half distance, values in ms) for end-to-end and then each
    /// stage, all actions; each table is preceded by a `#[Stage: ..]` line.
    pub fn write_percentile_table(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_percentile_table_selected(w, &Selection::default())
    }

    /// [`Self::write_percentile_table`] for the selected stages, of one action when
    /// the selection names one.
    pub fn write_percentile_table_selected(
        &self,
        w: &mut impl Write,
        sel: &Selection,
    ) -> io::Result<()> {
        let empty = Hist::new();
        let stages = EXPORT_STAGES.into_iter().filter(|&s| sel.stage(s));
        for (i, stage) in stages.enumerate() {
            if i > 0 {
                writeln!(w)?;
            }
            let actions = sel.action.as_deref().unwrap_or("all");
            writeln!(w, "#[Stage: {stage}, actions: {actions}, values in ms]")?;
            let h = self.hist(stage, sel.action.as_deref()).unwrap_or(&empty);
            write_percentile_distribution(w, &h.h)?;
        }
        Ok(())
    }

    /// Writes the Prometheus text exposition format (0.0.4) through prometheus-client:
    /// the families of [`prom`] (histograms per stage and action, per stage over all
    /// actions, the timeout in force, decisions and late decisions).
    pub fn write_prometheus(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_prometheus_selected(w, &Selection::default())
    }

    /// [`Self::write_prometheus`] with only the histograms `sel` selects.
    pub fn write_prometheus_selected(&self, w: &mut impl Write, sel: &Selection) -> io::Result<()> {
        w.write_all(prom::latency_text(self, sel).as_bytes())
    }

    /// Writes a JSON document (one line): the status summary plus every histogram with its
    /// statistics (ns) and recorded buckets as `[value_ns, count]` pairs (value = highest value
    /// equivalent to the bucket).
    pub fn write_json(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_json_selected(w, &Selection::default())
    }

    /// [`Self::write_json`] with only the histograms `sel` selects.
    pub fn write_json_selected(&self, w: &mut impl Write, sel: &Selection) -> io::Result<()> {
        let histograms: Vec<Value> = self
            .export_selected(sel)
            .into_iter()
            .map(|(stage, action, h)| {
                let buckets: Vec<[u64; 2]> =
                    h.h.iter_recorded()
                        .map(|v| [v.value_iterated_to(), v.count_at_value()])
                        .collect();
                let p = h.percentiles();
                json!({
                    "stage": stage,
                    "action": action,
                    "count": h.h.len(),
                    "sum_ns": u64::try_from(h.sum_ns).unwrap_or(u64::MAX),
                    "min_ns": p.map(|_| h.h.min()),
                    "mean_ns": h.h.mean(),
                    "stdev_ns": h.h.stdev(),
                    "p50_ns": p.map(|p| p.p50_ns),
                    "p90_ns": p.map(|p| p.p90_ns),
                    "p99_ns": p.map(|p| p.p99_ns),
                    "p999_ns": p.map(|_| h.h.value_at_quantile(0.999)),
                    "max_ns": p.map(|p| p.max_ns),
                    "buckets": buckets,
                })
            })
            .collect();
        let doc = json!({
            "unit": "ns",
            "lowest_discernible_ns": HIST_LOW_NS,
            "highest_trackable_ns": HIST_HIGH_NS,
            "significant_digits": HIST_SIGFIG,
            "timeout_ns": self.timeout_ns(),
            "summary": self.status_json(),
            "histograms": histograms,
        });
        serde_json::to_writer(&mut *w, &doc)?;
        writeln!(w)
    }
}

/// One histogram's summary in ms; null percentiles and count 0 when empty.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MsPercentiles {
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub count: u64,
}

impl MsPercentiles {
    fn of(p: Option<Percentiles>) -> Self {
        let ms = |v: u64| Some(v as f64 / NS_PER_MS);
        match p {
            Some(p) => Self {
                p50_ms: ms(p.p50_ns),
                p90_ms: ms(p.p90_ns),
                p99_ms: ms(p.p99_ns),
                max_ms: ms(p.max_ns),
                count: p.count,
            },
            None => Self {
                p50_ms: None,
                p90_ms: None,
                p99_ms: None,
                max_ms: None,
                count: 0,
            },
        }
    }
}

/// What `keling status` shows of the decision latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencyStatus {
    /// The timeout in force.
    pub timeout_ms: f64,
    /// `static` or `adaptive`.
    pub model: String,
    pub late: u64,
    pub decisions: u64,
    /// Per stage, all actions.
    pub stages: BTreeMap<String, MsPercentiles>,
    /// End-to-end, per action.
    pub by_action: BTreeMap<String, MsPercentiles>,
    pub late_by_action: BTreeMap<String, u64>,
}

/// Replaces the characters an interval-log tag cannot hold.
fn sanitize_tag(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ',' | ' ' | '\r' | '\n' => '_',
            c => c,
        })
        .collect()
}

/// HdrHistogram's `outputPercentileDistribution(out, 5, 1e6)`, as the Java implementation
/// formats it (values ns -> ms, 3 decimals).
fn write_percentile_distribution(w: &mut impl Write, h: &Histogram<u64>) -> io::Result<()> {
    writeln!(
        w,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total: u64 = 0;
    if !h.is_empty() {
        for v in h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let value = v.value_iterated_to() as f64 / NS_PER_MS;
            if q < 1.0 {
                writeln!(
                    w,
                    "{value:12.3} {q:2.12} {total:10} {:14.2}",
                    1.0 / (1.0 - q)
                )?;
            } else {
                writeln!(w, "{value:12.3} {q:2.12} {total:10}")?;
            }
        }
    }
    let sub_buckets = (2 * 10u64.pow(u32::from(h.sigfig()))).next_power_of_two();
    writeln!(
        w,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / NS_PER_MS,
        h.stdev() / NS_PER_MS
    )?;
    writeln!(
        w,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64 / NS_PER_MS,
        h.len()
    )?;
    writeln!(
        w,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        sub_buckets
    )
}

/// What one model would have done over a replayed series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ModelSummary {
    /// The timeout the model ends with (recomputed over the final window), ms.
    pub timeout_ms: f64,
    /// Decisions over the timeout in force when they were made.
    pub late: u64,
    pub decisions: u64,
}

/// Both models replayed over the same series, at their default multipliers
/// (`static`, `adaptive`) and over a range of multipliers with a recommendation
/// ([`tune::Tuning`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneReport {
    #[serde(rename = "static")]
    pub static_: ModelSummary,
    pub adaptive: ModelSummary,
    #[serde(flatten)]
    pub tuning: tune::Tuning,
}

impl fmt::Display for TuneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "The design's settings (static: mean + 3 sigma; adaptive: p99 x 1.2):"
        )?;
        writeln!(
            f,
            "{:<10} {:>12} {:>10} {:>10}",
            "model", "timeout_ms", "late", "decisions"
        )?;
        for (name, s) in [("static", &self.static_), ("adaptive", &self.adaptive)] {
            writeln!(
                f,
                "{:<10} {:>12.3} {:>10} {:>10}",
                name, s.timeout_ms, s.late, s.decisions
            )?;
        }
        writeln!(f)?;
        writeln!(f, "Every setting tried (* recommended):")?;
        write!(f, "{}", self.tuning)
    }
}

/// Replays `(ts_ns, end_to_end_ns)` samples, in time order (stable for equal timestamps),
/// through both models at every multiplier of [`tune`]. For each sample:
/// `maybe_recompute(ts)`, judge (late = latency > the timeout now in force), then
/// `observe(latency, ts)`. The final timeout is a forced recomputation at the last sample's
/// time, so it reflects the whole final window.
pub fn tune_report(end_to_end_ns: &[(u64, u64)]) -> TuneReport {
    let tuning = tune::tune(end_to_end_ns);
    let summary = |kind: ModelKind| {
        let c = tuning
            .grid
            .iter()
            .find(|c| c.model == kind && c.is_default())
            .expect("the grid holds both defaults");
        ModelSummary {
            timeout_ms: c.timeout_ms,
            late: c.late,
            decisions: c.decisions,
        }
    };
    TuneReport {
        static_: summary(ModelKind::Static),
        adaptive: summary(ModelKind::Adaptive),
        tuning,
    }
}

/// The formats `keling histo export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HistoFormat {
    /// HdrHistogram percentile distribution (`.hgrm`), values in ms.
    #[value(alias = "percentiles")]
    Hgrm,
    /// Prometheus text exposition (histograms).
    #[value(alias = "prometheus")]
    Prom,
    /// JSON: a summary and every histogram's buckets.
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn times(action: &str, e2e_ns: u64) -> DecisionTimes {
        let event = 10 * S;
        let end = event + e2e_ns;
        DecisionTimes {
            action: action.to_owned(),
            event_ns: event,
            received_ns: event,
            decided_ns: event,
            actuated_ns: end,
            confirmed_ns: None,
        }
    }

    fn close(a: u64, b: u64, rel: f64) -> bool {
        (a as f64 - b as f64).abs() <= rel * b as f64
    }

    #[test]
    fn static_model_mean_plus_three_sigma_is_23_8_ms() {
        // Alternating 8.6 / 16.2 ms: population mean 12.4 ms, sigma exactly 3.8 ms.
        let mut m = TimeoutModel::new(ModelKind::Static);
        for i in 0..200u64 {
            let v = if i % 2 == 0 { 8_600_000 } else { 16_200_000 };
            m.observe(v, i * 10 * MS);
        }
        assert!(m.maybe_recompute(2 * S));
        let t = m.timeout_ns();
        assert!(t.abs_diff(23_800_000) <= 100_000, "timeout {t}");
        // And it is mean + 3 sigma, not a coincidence of the default.
        let mut m = TimeoutModel::new(ModelKind::Static);
        for i in 0..200u64 {
            let v = if i % 2 == 0 { 5 * MS } else { 15 * MS };
            m.observe(v, i * 10 * MS);
        }
        m.recompute(2 * S);
        assert_eq!(m.timeout_ns(), 25 * MS); // 10 + 3 x 5
    }

    #[test]
    fn adaptive_is_p99_times_1_2_recomputed_once_per_second() {
        let mut m = TimeoutModel::new(ModelKind::Adaptive);
        let mut seen: Vec<u64> = Vec::new();
        let mut prev = m.timeout_ns();
        for i in 0..80u64 {
            let now = i * S / 2; // 0.5 s apart
            // increasing latencies with a pseudo-random wobble, so every recompute changes it
            let lat = 5 * MS + i * 150_000 + (i * 7919 % 13) * 10_000;
            m.observe(lat, now);
            seen.push(lat);
            let recomputed = m.maybe_recompute(now);
            let t = m.timeout_ns();
            assert_eq!(recomputed, now.is_multiple_of(S), "i={i}");
            if !now.is_multiple_of(S) {
                assert_eq!(t, prev, "changed between second boundaries at i={i}");
            } else if seen.len() < MIN_OBSERVATIONS {
                assert_eq!(t, DEFAULT_TIMEOUT_NS);
            } else {
                let mut sorted = seen.clone();
                sorted.sort();
                let rank = (sorted.len() as f64 * 0.99).ceil() as usize;
                let expect = (sorted[rank - 1] as f64 * 1.2) as u64;
                assert!(close(t, expect, 0.001), "i={i} t={t} expect={expect}");
                assert_ne!(t, prev, "did not change on a boundary at i={i}");
            }
            prev = t;
        }
        // Extra calls within the same second do nothing even if the data changes.
        m.observe(500 * MS, 80 * S / 2);
        assert!(!m.maybe_recompute(80 * S / 2 - 1));
        assert_eq!(m.timeout_ns(), prev);
        // Time going backwards never recomputes.
        assert!(!m.maybe_recompute(S));
    }

    #[test]
    fn both_models_keep_default_before_20_observations() {
        for kind in [ModelKind::Static, ModelKind::Adaptive] {
            let mut m = TimeoutModel::new(kind);
            assert_eq!(m.timeout_ns(), DEFAULT_TIMEOUT_NS);
            for i in 0..19u64 {
                m.observe(100 * MS, i * MS);
            }
            m.recompute(S);
            assert_eq!(m.timeout_ns(), DEFAULT_TIMEOUT_NS, "{kind:?}");
            m.observe(100 * MS, S);
            m.recompute(3 * S);
            assert!(m.timeout_ns() >= 100 * MS, "{kind:?} at 20 observations");
        }
    }

    #[test]
    fn window_evicts_by_count_and_by_age() {
        for kind in [ModelKind::Static, ModelKind::Adaptive] {
            // By count: 1000 slow ones, then 1000 fast ones within a few seconds.
            let mut m = TimeoutModel::new(kind);
            for i in 0..1000u64 {
                m.observe(80 * MS, i * MS);
            }
            m.recompute(S);
            assert!(m.timeout_ns() >= 80 * MS);
            for i in 0..1000u64 {
                m.observe(10 * MS, S + i * MS);
            }
            m.recompute(3 * S);
            assert_eq!(m.window_len(), WINDOW_MAX_DECISIONS);
            assert!(m.timeout_ns() <= 12 * MS, "{kind:?}: {}", m.timeout_ns());
            // One more slow one pushes out one fast one and counts.
            m.observe(80 * MS, 3 * S);
            m.recompute(5 * S);
            assert_eq!(m.window_len(), WINDOW_MAX_DECISIONS);

            // By age: 100 slow ones at t=0..1 s, then 30 fast ones 70 s later.
            let mut m = TimeoutModel::new(kind);
            for i in 0..100u64 {
                m.observe(80 * MS, i * 10 * MS);
            }
            for i in 0..30u64 {
                m.observe(10 * MS, 70 * S + i * MS);
            }
            m.recompute(71 * S);
            assert_eq!(m.window_len(), 30);
            assert!(m.timeout_ns() <= 12 * MS, "{kind:?}: {}", m.timeout_ns());
            // And 61 s of silence empties the window: back to the default.
            m.recompute(132 * S);
            assert_eq!(m.window_len(), 0);
            assert_eq!(m.timeout_ns(), DEFAULT_TIMEOUT_NS);
        }
    }

    #[test]
    fn age_eviction_is_exact_at_60_s() {
        let mut m = TimeoutModel::new(ModelKind::Adaptive);
        for _ in 0..20 {
            m.observe(10 * MS, 0);
        }
        m.recompute(WINDOW_MAX_AGE_NS);
        assert_eq!(m.window_len(), 20, "exactly 60 s old stays");
        m.recompute(WINDOW_MAX_AGE_NS + 1);
        assert_eq!(m.window_len(), 0, "older than 60 s leaves");
    }

    #[test]
    fn late_is_strictly_over_the_timeout_in_force() {
        let mut r = LatencyRecorder::new(ModelKind::Adaptive);
        let v = r.record(&times("freeze", 30 * MS));
        assert_eq!(
            v,
            Verdict {
                late: true,
                end_to_end_ns: 30 * MS,
                timeout_ns: DEFAULT_TIMEOUT_NS
            }
        );
        assert!(!r.record(&times("freeze", 20 * MS)).late);
        assert!(
            !r.record(&times("thaw", 23_800_000)).late,
            "equal is not late"
        );
        assert!(r.record(&times("thaw", 23_800_001)).late);
        assert_eq!(r.late_count(), 2);
        assert_eq!(r.decisions(), 4);
        assert_eq!(r.late_by_action()["freeze"], 1);
        assert_eq!(r.late_by_action()["thaw"], 1);

        // After the model learns ~5 ms decisions, 20 ms is late.
        let mut r = LatencyRecorder::new(ModelKind::Adaptive);
        for i in 0..50u64 {
            let mut t = times("freeze", 5 * MS);
            t.event_ns += i * 100 * MS;
            t.actuated_ns += i * 100 * MS;
            assert!(!r.record(&t).late);
        }
        r.tick(20 * S);
        assert_eq!(r.timeout_ns(), 6 * MS);
        let v = r.record(&times("freeze", 20 * MS));
        assert!(v.late);
        assert_eq!(v.timeout_ns, 6 * MS);
        assert_eq!(r.late_count(), 1);
    }

    #[test]
    fn stage_arithmetic() {
        let t = DecisionTimes {
            action: "freeze".into(),
            event_ns: 1_000_000,
            received_ns: 1_500_000,
            decided_ns: 1_700_000,
            actuated_ns: 2_700_000,
            confirmed_ns: Some(5_000_000),
        };
        let d = StageDurations::of(&t);
        assert_eq!(
            d,
            StageDurations {
                delivery_ns: 500_000,
                decision_ns: 200_000,
                actuation_ns: 1_000_000,
                confirmation_ns: Some(2_300_000),
                end_to_end_ns: 4_000_000,
            }
        );
        // Unconfirmed: end-to-end runs to actuation and there is no confirmation stage.
        let u = DecisionTimes {
            confirmed_ns: None,
            ..t.clone()
        };
        let d = StageDurations::of(&u);
        assert_eq!(d.confirmation_ns, None);
        assert_eq!(d.end_to_end_ns, 1_700_000);

        let mut r = LatencyRecorder::new(ModelKind::Static);
        r.record(&t);
        r.record(&u);
        assert_eq!(r.percentiles(Stage::Confirmation, None).unwrap().count, 1);
        assert_eq!(r.percentiles(Stage::Delivery, None).unwrap().count, 2);
        assert_eq!(
            r.percentiles(Stage::Delivery, Some("freeze"))
                .unwrap()
                .count,
            2
        );
        assert_eq!(r.percentiles(Stage::Delivery, Some("thaw")), None);
        let e = r.percentiles(Stage::EndToEnd, None).unwrap();
        assert!(close(e.max_ns, 4_000_000, 0.001), "{e:?}");
        assert!(close(e.p50_ns, 1_700_000, 0.001), "{e:?}");

        // Out of order: every backwards step saturates to 0.
        let o = DecisionTimes {
            action: "kill".into(),
            event_ns: 9_000,
            received_ns: 5_000,
            decided_ns: 1_000,
            actuated_ns: 0,
            confirmed_ns: Some(3),
        };
        let d = StageDurations::of(&o);
        assert_eq!(d.delivery_ns, 0);
        assert_eq!(d.decision_ns, 0);
        assert_eq!(d.actuation_ns, 0);
        assert_eq!(d.confirmation_ns, Some(3));
        assert_eq!(d.end_to_end_ns, 0);
        assert_eq!(o.latest_ns(), 9_000);
        let v = r.record(&o);
        assert_eq!(v.end_to_end_ns, 0);
        assert!(!v.late);
        // Extremes saturate too (and clamp at the histogram's 60 s).
        let x = DecisionTimes {
            action: "warn".into(),
            event_ns: 0,
            received_ns: u64::MAX,
            decided_ns: 0,
            actuated_ns: u64::MAX,
            confirmed_ns: Some(u64::MAX),
        };
        assert!(r.record(&x).late);
        assert_eq!(
            r.percentiles(Stage::EndToEnd, Some("warn")).unwrap().max_ns,
            r.percentiles(Stage::EndToEnd, Some("warn")).unwrap().p50_ns
        );
        assert!(r.percentiles(Stage::EndToEnd, Some("warn")).unwrap().max_ns >= HIST_HIGH_NS);
    }

    #[test]
    fn action_kinds_are_capped() {
        let mut r = LatencyRecorder::new(ModelKind::Adaptive);
        for i in 0..(MAX_ACTION_KINDS + 10) {
            r.record(&times(&format!("a{i}"), MS));
        }
        assert_eq!(r.late_by_action().len(), MAX_ACTION_KINDS + 1);
        assert_eq!(
            r.percentiles(Stage::EndToEnd, Some(OTHER_ACTION))
                .unwrap()
                .count,
            10
        );
        // Known kinds keep their own histograms.
        r.record(&times("a0", MS));
        assert_eq!(r.percentiles(Stage::EndToEnd, Some("a0")).unwrap().count, 2);
    }

    fn sample_recorder() -> LatencyRecorder {
        let mut r = LatencyRecorder::new(ModelKind::Adaptive);
        for i in 0..300u64 {
            let base = 5 * S + i * 10 * MS;
            let action = ["freeze", "thaw", "kill", "we\"ird, one"][(i % 4) as usize];
            let t = DecisionTimes {
                action: action.into(),
                event_ns: base,
                received_ns: base + 50_000 + (i % 7) * 10_000,
                decided_ns: base + 200_000,
                actuated_ns: base + 1_000_000 + (i % 11) * 100_000,
                confirmed_ns: (i % 3 != 0).then_some(base + 3_000_000 + (i % 13) * 1_000_000),
            };
            r.record(&t);
            r.tick(base + 5 * MS);
        }
        r
    }

    /// Minimal standard base64 decoder (the test has no base64 crate).
    fn b64(s: &str) -> Vec<u8> {
        let val = |c: u8| -> u32 {
            match c {
                b'A'..=b'Z' => u32::from(c - b'A'),
                b'a'..=b'z' => u32::from(c - b'a') + 26,
                b'0'..=b'9' => u32::from(c - b'0') + 52,
                b'+' => 62,
                b'/' => 63,
                _ => panic!("bad base64 {c}"),
            }
        };
        let mut out = Vec::new();
        for chunk in s.trim_end_matches('=').as_bytes().chunks(4) {
            let mut acc = 0u32;
            for (i, &c) in chunk.iter().enumerate() {
                acc |= val(c) << (18 - 6 * i);
            }
            let n = chunk.len() * 6 / 8;
            out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
        }
        out
    }

    #[test]
    fn interval_log_round_trip() {
        let r = sample_recorder();
        let mut buf = Vec::new();
        r.write_interval_log(&mut buf, 5 * S).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(
            text.starts_with("#[Histogram log format version 1.3]\n"),
            "{text}"
        );

        let mut tags = Vec::new();
        for entry in IntervalLogIterator::new(&buf) {
            let LogEntry::Interval(ilh) = entry.expect("parses") else {
                panic!("only intervals expected");
            };
            assert_eq!(ilh.start_timestamp(), Duration::from_secs(5));
            assert!(
                ilh.duration() >= Duration::from_millis(2990),
                "{:?}",
                ilh.duration()
            );
            let bytes = b64(ilh.encoded_histogram());
            let h: Histogram<u64> = Deserializer::new()
                .deserialize(&mut &bytes[..])
                .expect("V2 histogram decodes");
            let tag = ilh.tag().map(|t| t.as_str().to_owned());
            let (stage, action) = match tag.as_deref() {
                None => (Stage::EndToEnd, None),
                Some(t) => {
                    let (s, a) = t.split_once('/').map_or((t, None), |(s, a)| (s, Some(a)));
                    let stage = *Stage::ALL.iter().find(|st| st.as_str() == s).unwrap();
                    (stage, a.map(|a| a.to_owned()))
                }
            };
            // Sanitized tag for the odd action name.
            let action = action.map(|a| {
                if a == "we\"ird__one" {
                    "we\"ird, one".to_owned()
                } else {
                    a
                }
            });
            let p = r
                .percentiles(stage, action.as_deref())
                .unwrap_or_else(|| panic!("{tag:?} {stage:?} {action:?}"));
            assert_eq!(h.len(), p.count, "{tag:?}");
            assert_eq!(h.max(), p.max_ns, "{tag:?}");
            assert_eq!(h.value_at_quantile(0.99), p.p99_ns, "{tag:?}");
            assert!(
                (ilh.max() - p.max_ns as f64 / 1e6).abs() < 0.001,
                "max column in ms"
            );
            tags.push(tag);
        }
        assert_eq!(tags[0], None, "untagged end-to-end comes first");
        assert_eq!(tags.iter().filter(|t| t.is_none()).count(), 1);
        for s in ["delivery", "decision", "actuation", "confirmation"] {
            assert!(tags.contains(&Some(s.to_owned())), "{s}");
        }
        assert!(tags.contains(&Some("end_to_end/freeze".to_owned())));
        assert!(tags.contains(&Some("end_to_end/we\"ird__one".to_owned())));
        // 5 all-action stages + 4 actions x 5 stages
        assert_eq!(tags.len(), 5 + 4 * 5);
    }

    /// Parses Prometheus text format line by line; returns (metric name, labels, value).
    /// One parsed sample: (metric name, labels, value).
    type PromSample = (String, Vec<(String, String)>, f64);

    fn parse_prom(text: &str) -> Vec<PromSample> {
        let mut samples = Vec::new();
        let mut typed: Vec<(String, String)> = Vec::new();
        let valid_name = |n: &str| {
            !n.is_empty()
                && n.chars().enumerate().all(|(i, c)| {
                    c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
                })
        };
        let mut helped = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP has text");
                assert!(valid_name(name) && !help.is_empty(), "{line}");
                helped.push(name.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("TYPE has a type");
                assert!(valid_name(name), "{line}");
                assert!(
                    ["counter", "gauge", "summary", "histogram", "untyped"].contains(&ty),
                    "{line}"
                );
                assert!(!typed.iter().any(|(n, _)| n == name), "TYPE twice: {line}");
                assert_eq!(
                    helped.last().map(String::as_str),
                    Some(name),
                    "HELP before TYPE"
                );
                typed.push((name.to_owned(), ty.to_owned()));
                continue;
            }
            assert!(
                !line.starts_with('#') && !line.is_empty(),
                "stray line {line:?}"
            );
            let (series, value) = line.rsplit_once(' ').expect("name value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("closing brace");
                    let mut labels = Vec::new();
                    let mut chars = body.chars().peekable();
                    while chars.peek().is_some() {
                        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                        assert!(valid_name(&key), "label name {key:?} in {line}");
                        assert_eq!(chars.next(), Some('"'), "{line}");
                        let mut val = String::new();
                        loop {
                            match chars.next().expect("unterminated label") {
                                '\\' => match chars.next().unwrap() {
                                    'n' => val.push('\n'),
                                    c @ ('\\' | '"') => val.push(c),
                                    c => panic!("bad escape \\{c} in {line}"),
                                },
                                '"' => break,
                                c => val.push(c),
                            }
                        }
                        labels.push((key, val));
                        match chars.next() {
                            None => break,
                            Some(',') => {}
                            Some(c) => panic!("unexpected {c} in {line}"),
                        }
                    }
                    (name, labels)
                }
            };
            assert!(valid_name(name), "{line}");
            // every sample belongs to the most recently TYPEd family
            let (family, ty) = typed.last().expect("sample before TYPE");
            let ok = name == family
                || (ty == "histogram"
                    && [
                        format!("{family}_sum"),
                        format!("{family}_count"),
                        format!("{family}_bucket"),
                    ]
                    .contains(&name.to_owned()));
            assert!(ok, "{name} outside its family {family}");
            samples.push((name.to_owned(), labels, value));
        }
        samples
    }

    #[test]
    fn prometheus_exposition_is_valid() {
        let r = sample_recorder();
        let mut buf = Vec::new();
        r.write_prometheus(&mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for family in [
            "keling_decision_latency_seconds histogram",
            "keling_decision_latency_all_actions_seconds histogram",
            "keling_decision_timeout_seconds gauge",
            "keling_decisions_total counter",
            "keling_decisions_late_total counter",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family}\n")),
                "{family}\n{text}"
            );
        }
        let samples = parse_prom(&text);
        let find = |name: &str, labels: &[(&str, &str)]| -> f64 {
            samples
                .iter()
                .find(|(n, l, _)| {
                    n == name
                        && l.len() == labels.len()
                        && labels.iter().all(|(k, v)| {
                            l.iter().any(|(k2, v2)| {
                                // A bucket bound is a number, however it is spelled.
                                k2 == k
                                    && (v2 == v
                                        || (*k == "le"
                                            && v2.parse::<f64>().ok() == v.parse::<f64>().ok()))
                            })
                        })
                })
                .unwrap_or_else(|| panic!("{name} {labels:?} not in\n{text}"))
                .2
        };
        let p = r.percentiles(Stage::Actuation, Some("freeze")).unwrap();
        let labels = [("stage", "actuation"), ("action", "freeze")];
        assert_eq!(
            find("keling_decision_latency_seconds_count", &labels),
            p.count as f64
        );
        assert_eq!(
            find(
                "keling_decision_latency_seconds_bucket",
                &[labels[0], labels[1], ("le", "+Inf")]
            ),
            p.count as f64
        );
        // Cumulative buckets: what is at most 1 s is every value at most 1 s.
        let h = r.hist(Stage::Actuation, Some("freeze")).unwrap();
        let under_1s: u64 =
            h.h.iter_recorded()
                .filter(|v| v.value_iterated_to() <= 1_000_000_000)
                .map(|v| v.count_at_value())
                .sum();
        assert_eq!(
            find(
                "keling_decision_latency_seconds_bucket",
                &[labels[0], labels[1], ("le", "1.0")]
            ),
            under_1s as f64
        );
        let sum = find("keling_decision_latency_seconds_sum", &labels);
        assert!((sum - h.sum_ns as f64 / 1e9).abs() < 1e-9);
        // The awkward action name survives escaping.
        let odd = find(
            "keling_decision_latency_seconds_count",
            &[("stage", "end_to_end"), ("action", "we\"ird, one")],
        );
        assert_eq!(odd, 75.0);
        assert_eq!(
            find(
                "keling_decision_latency_all_actions_seconds_count",
                &[("stage", "end_to_end")]
            ),
            300.0
        );
        assert_eq!(find("keling_decisions_total", &[]), 300.0);
        assert_eq!(
            find("keling_decisions_late_total", &[]),
            r.late_count() as f64
        );
        assert!(
            (find("keling_decision_timeout_seconds", &[("model", "adaptive")])
                - r.timeout_ns() as f64 / 1e9)
                .abs()
                < 1e-12
        );

        // An empty recorder is valid too.
        let mut buf = Vec::new();
        LatencyRecorder::new(ModelKind::Static)
            .write_prometheus(&mut buf)
            .unwrap();
        let samples = parse_prom(&String::from_utf8(buf).unwrap());
        assert!(
            samples
                .iter()
                .any(|(n, _, v)| n == "keling_decisions_total" && *v == 0.0)
        );
    }

    #[test]
    fn percentile_table_has_header_and_100_percent_line() {
        let r = sample_recorder();
        let mut buf = Vec::new();
        r.write_percentile_table(&mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let header = "       Value     Percentile TotalCount 1/(1-Percentile)";
        assert_eq!(text.matches(header).count(), 5);
        assert!(text.starts_with("#[Stage: end_to_end, actions: all, values in ms]\n"));
        // The 100th percentile line of end-to-end: max in ms, quantile 1, total count, no 4th column.
        let e2e = r.percentiles(Stage::EndToEnd, None).unwrap();
        let last = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("1.000000000000"))
            .expect("100th percentile line");
        let cols: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(cols.len(), 3, "{last}");
        assert!((cols[0].parse::<f64>().unwrap() - e2e.max_ns as f64 / 1e6).abs() < 0.001);
        assert_eq!(cols[2], "300");
        // A middle line has four numeric columns and the 1/(1-p) value matches.
        let mid = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("0.500000000000"))
            .expect("median line");
        let cols: Vec<f64> = mid.split_whitespace().map(|c| c.parse().unwrap()).collect();
        assert_eq!(cols.len(), 4);
        assert!((cols[3] - 2.0).abs() < 1e-9);
        assert!(text.contains("#[Max     = "));
        assert!(text.contains("SubBuckets     =         2048]"));
        // Confirmation table shows 200 confirmed decisions.
        let conf = text.split("#[Stage: confirmation").nth(1).unwrap();
        assert!(conf.contains("Total count    =          200]"), "{conf}");
    }

    #[test]
    fn json_exports() {
        let r = sample_recorder();
        let s = r.status_json();
        assert_eq!(s["model"], "adaptive");
        assert_eq!(s["decisions"], 300);
        assert_eq!(s["stages"]["confirmation"]["count"], 200);
        assert_eq!(s["by_action"]["freeze"]["count"], 75);
        assert!(s["timeout_ms"].as_f64().unwrap() > 0.0);
        let p99 = r.percentiles(Stage::Delivery, None).unwrap().p99_ns as f64 / 1e6;
        assert_eq!(s["stages"]["delivery"]["p99_ms"].as_f64().unwrap(), p99);

        let mut buf = Vec::new();
        r.write_json(&mut buf).unwrap();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["summary"]["decisions"], 300);
        assert_eq!(v["summary"]["late"], r.late_count());
        assert_eq!(v["timeout_ns"], r.timeout_ns());
        let hs = v["histograms"].as_array().unwrap();
        assert_eq!(hs.len(), 25);
        let first = &hs[0];
        assert_eq!(first["stage"], "end_to_end");
        assert_eq!(first["action"], Value::Null);
        let total: u64 = first["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_u64().unwrap())
            .sum();
        assert_eq!(total, 300);

        let empty = LatencyRecorder::new(ModelKind::Static).status_json();
        assert_eq!(empty["model"], "static");
        assert_eq!(empty["timeout_ms"], 23.8);
        assert_eq!(empty["stages"]["end_to_end"]["count"], 0);
        assert_eq!(empty["stages"]["end_to_end"]["p99_ms"], Value::Null);
    }

    #[test]
    fn tune_report_step_change_by_hand() {
        // 30 decisions at 10 ms (t = 0..29 s), then 70 at 40 ms (t = 30..99 s), 1 s apart.
        let mut series: Vec<(u64, u64)> = (0..30).map(|i| (i * S, 10 * MS)).collect();
        series.extend((30..100).map(|i| (i * S, 40 * MS)));
        // Given out of order: the report sorts by time.
        series.reverse();
        let r = tune_report(&series);
        // Hand computation (late = latency > timeout in force, recomputed at each sample):
        // t < 20 s: window < 20 -> 23.8 ms, nothing late.
        // 20..29 s: static 10 ms (sigma 0; 10 is not > 10), adaptive 12 ms: nothing late.
        // t = 30 s: first 40 ms sample, both models still at 10 / 12 ms: late for both.
        // adaptive from 31 s: p99 of <= 61 values is the max, 40 ms -> 48 ms: never late again.
        // static with k 40-ms samples among 30 10-ms ones: p = k/(30+k),
        //   timeout = 10 + 30p + 90 sqrt(p(1-p)) ms, > 40 iff p > 0.1 iff k >= 4, so
        //   k = 1, 2, 3 (t = 31, 32, 33 s) are late (26.9, 33.7, 38.6 ms), later ones are not;
        //   from t = 90 s the window holds only 40 ms samples: 40 ms, and 40 is not > 40.
        // Final window (t = 99 s, ages <= 60 s): only 40 ms -> static 40 ms, adaptive 48 ms.
        assert_eq!(
            r.static_,
            ModelSummary {
                timeout_ms: 40.0,
                late: 4,
                decisions: 100
            }
        );
        assert_eq!(
            r.adaptive,
            ModelSummary {
                timeout_ms: 48.0,
                late: 1,
                decisions: 100
            }
        );
        let shown = r.to_string();
        assert!(
            shown.contains("static") && shown.contains("48.000"),
            "{shown}"
        );
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["static"]["late"], 4);
        assert_eq!(j["adaptive"]["timeout_ms"], 48.0);

        // Before the step the adaptive timeout was 12 ms; after it, higher.
        let before = tune_report(
            &series
                .iter()
                .copied()
                .filter(|&(t, _)| t < 30 * S)
                .collect::<Vec<_>>(),
        );
        assert_eq!(before.adaptive.timeout_ms, 12.0);
        assert_eq!(before.static_.timeout_ms, 10.0);
        assert!(r.adaptive.timeout_ms > before.adaptive.timeout_ms);
    }

    #[test]
    fn tune_report_step_change_with_jitter() {
        // ~10 ms for 60 s, then ~40 ms for 120 s, 10 decisions a second, deterministic jitter.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut jitter = |spread_ms: f64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % 10_000) as f64 / 10_000.0 - 0.5) * spread_ms * MS as f64
        };
        let mut series = Vec::new();
        for i in 0..1800u64 {
            let ts = i * 100 * MS;
            let base = if ts < 60 * S { 10.0 } else { 40.0 };
            series.push((ts, (base * MS as f64 + jitter(4.0)) as u64));
        }
        let r = tune_report(&series);
        // The replay is causal, so the prefix's counts are the full run's counts before the step.
        let pre: Vec<(u64, u64)> = series
            .iter()
            .copied()
            .filter(|&(t, _)| t < 60 * S)
            .collect();
        let pre_r = tune_report(&pre);
        assert_eq!(pre.len(), 600);
        assert!(
            r.adaptive.timeout_ms > pre_r.adaptive.timeout_ms + 20.0,
            "{r}"
        );
        assert!(r.adaptive.timeout_ms > r.static_.timeout_ms, "{r}");
        let adaptive_after = r.adaptive.late - pre_r.adaptive.late;
        let static_after = r.static_.late - pre_r.static_.late;
        assert!(adaptive_after < static_after, "{r}\n{pre_r}");
    }

    #[test]
    fn tune_report_empty() {
        let r = tune_report(&[]);
        assert_eq!(r.static_.timeout_ms, 23.8);
        assert_eq!(r.adaptive.late, 0);
        assert_eq!(r.adaptive.decisions, 0);
    }

    fn arb_times() -> impl Strategy<Value = DecisionTimes> {
        // Mostly real kinds and awkward names; now and then any string at all.
        let action = prop_oneof![
            6 => proptest::sample::select(vec![
                "freeze", "thaw", "kill", "", "we\"ird, one\n", "a\\b{c}=d\r",
            ])
            .prop_map(str::to_owned),
            1 => any::<String>(),
        ];
        let ts = prop_oneof![any::<u64>(), 0u64..10_000_000_000u64];
        (
            action,
            ts.clone(),
            ts.clone(),
            ts.clone(),
            ts.clone(),
            proptest::option::of(ts),
        )
            .prop_map(
                |(action, event_ns, received_ns, decided_ns, actuated_ns, confirmed_ns)| {
                    DecisionTimes {
                        action,
                        event_ns,
                        received_ns,
                        decided_ns,
                        actuated_ns,
                        confirmed_ns,
                    }
                },
            )
    }

    /// Records `ts` (ticking now and then) and checks every count; returns the recorder.
    fn check_counts(
        kind: ModelKind,
        ts: &[DecisionTimes],
        ticks: &[u64],
    ) -> Result<LatencyRecorder, TestCaseError> {
        let mut r = LatencyRecorder::new(kind);
        for (i, t) in ts.iter().enumerate() {
            let before = r.timeout_ns();
            let v = r.record(t);
            prop_assert_eq!(v.end_to_end_ns, StageDurations::of(t).end_to_end_ns);
            prop_assert_eq!(v.timeout_ns, before);
            prop_assert_eq!(v.late, v.end_to_end_ns > v.timeout_ns);
            if let Some(&tick) = ticks.get(i % 7) {
                r.tick(tick);
            }
        }
        let n = ts.len() as u64;
        prop_assert_eq!(r.decisions(), n);
        prop_assert!(r.late_count() <= n);
        prop_assert_eq!(r.late_by_action().values().sum::<u64>(), r.late_count());
        let count = |s| r.percentiles(s, None).map_or(0, |p| p.count);
        for s in [
            Stage::Delivery,
            Stage::Decision,
            Stage::Actuation,
            Stage::EndToEnd,
        ] {
            prop_assert_eq!(count(s), n);
        }
        let confirmed = ts.iter().filter(|t| t.confirmed_ns.is_some()).count() as u64;
        prop_assert_eq!(count(Stage::Confirmation), confirmed);
        let per_action: u64 = r
            .late_by_action()
            .keys()
            .map(|a| {
                r.percentiles(Stage::EndToEnd, Some(a))
                    .map_or(0, |p| p.count)
            })
            .sum();
        prop_assert_eq!(per_action, n);
        Ok(r)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn arbitrary_times_never_panic_and_counts_match(
            ts in proptest::collection::vec(arb_times(), 0..40),
            ticks in proptest::collection::vec(any::<u64>(), 0..5),
        ) {
            check_counts(ModelKind::Static, &ts, &ticks)?;
            let r = check_counts(ModelKind::Adaptive, &ts, &ticks)?;
            // Every export works and the text ones stay parseable.
            let n = ts.len() as f64;
            let mut prom = Vec::new();
            r.write_prometheus(&mut prom).unwrap();
            let samples = parse_prom(&String::from_utf8(prom).unwrap());
            prop_assert!(
                samples
                    .iter()
                    .any(|(name, _, v)| name == "keling_decisions_total" && *v == n)
            );
            let mut log = Vec::new();
            r.write_interval_log(&mut log, ticks.first().copied().unwrap_or(0)).unwrap();
            let entries: Vec<_> = IntervalLogIterator::new(&log).collect();
            prop_assert!(entries.iter().all(|e| e.is_ok()));
            let mut table = Vec::new();
            r.write_percentile_table(&mut table).unwrap();
            prop_assert!(String::from_utf8(table).is_ok());
            let mut json_out = Vec::new();
            r.write_json(&mut json_out).unwrap();
            let v: Value = serde_json::from_slice(&json_out).unwrap();
            prop_assert_eq!(v["summary"]["decisions"].as_u64(), Some(ts.len() as u64));
        }
    }
}
