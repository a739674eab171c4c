//! The latency recorder: a decision's timestamps become stage latencies, each recorded
//! into HdrHistograms, judged against the timeout in force and fed to the timeout model
//! ([`LatencyRecorder`]). What it holds is read by the exports; it writes nothing itself.
//!
//! Every scheduler decision (freeze, thaw, stop, terminate, kill, place, warn) carries five
//! timestamps, all `u64` nanoseconds of `CLOCK_MONOTONIC` (the clock behind the kernel's
//! `bpf_ktime_get_ns`): the kernel event that triggered it, when the agent received it, when it
//! decided, when the actuation call returned, and when the effect was confirmed (if ever).
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
//! One HdrHistogram per (stage, action kind) and one per stage for all actions. Values are
//! recorded in nanoseconds with a lowest discernible value of 1 us, a highest trackable value of
//! 60 s and 3 significant digits. Values above 60 s are clamped to 60 s in the histogram (the
//! exact sum used for Prometheus `_sum` is kept unclamped). At most [`MAX_ACTION_KINDS`] distinct
//! action names get their own histograms; further names are recorded under [`OTHER_ACTION`], so a
//! misbehaving caller cannot grow memory without bound. When an interval log is kept
//! ([`LatencyRecorder::keep_intervals`]), the recorder also keeps what each interval recorded
//! ([`Interval`]) until the log takes it.
//!
//! # Late
//! A decision is late when its end-to-end latency is strictly greater than the timeout in force
//! when it is recorded (before its own latency joins the window).

use std::collections::BTreeMap;
use std::fmt;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::timeout_model::{ModelKind, TimeoutModel};

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

/// Unit conversions for the exports (values are recorded in ns).
pub(super) const NS_PER_MS: f64 = 1e6;
pub(super) const NS_PER_S: f64 = 1e9;

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
pub(super) struct Hist {
    pub(super) h: Histogram<u64>,
    pub(super) sum_ns: u128,
}

/// An empty histogram with the bounds of the module documentation.
pub(super) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(HIST_LOW_NS, HIST_HIGH_NS, HIST_SIGFIG)
        .expect("constant histogram bounds are valid")
}

impl Hist {
    pub(super) fn new() -> Self {
        Hist {
            h: new_histogram(),
            sum_ns: 0,
        }
    }

    fn record(&mut self, v: u64) {
        self.h.saturating_record(v);
        self.sum_ns += u128::from(v);
    }

    pub(super) fn percentiles(&self) -> Option<Percentiles> {
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
                            .or_insert_with(new_histogram)
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

    /// Latest timestamp seen in a record or a tick.
    pub(super) fn last_ns(&self) -> Option<u64> {
        self.last_ns
    }

    /// One histogram: of one action kind, or (`None`) of all of them.
    pub(super) fn hist(&self, stage: Stage, action: Option<&str>) -> Option<&Hist> {
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

    /// The per-action histograms, by stage then action name.
    pub(super) fn per_action(&self) -> impl Iterator<Item = (Stage, &str, &Hist)> {
        self.by_action
            .iter()
            .map(|((stage, action), h)| (*stage, action.as_str(), h))
    }

    /// The exact sum of what a histogram recorded, ns (estimated for imported ones).
    pub fn sum_ns(&self, stage: Stage, action: Option<&str>) -> u128 {
        self.hist(stage, action).map_or(0, |h| h.sum_ns)
    }
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
    pub(super) fn stage(&self, s: Stage) -> bool {
        self.stage.is_none_or(|x| x == s)
    }

    pub(super) fn action(&self, a: Option<&str>) -> bool {
        match (&self.action, a) {
            (None, _) => true,
            (Some(want), Some(a)) => want == a,
            (Some(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::timeout_model::DEFAULT_TIMEOUT_NS;

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
}
