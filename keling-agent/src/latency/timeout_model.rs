//! The decision timeout: a sliding window of end-to-end latencies and the model that
//! turns it into the timeout in force ([`TimeoutModel`], [`ModelKind`]).
//!
//! Both models start at [`DEFAULT_TIMEOUT_NS`] = 23.8 ms (the design's 12.4 ms + 3 x 3.8 ms) and
//! keep it while the window holds fewer than [`MIN_OBSERVATIONS`] observations.
//!
//! - The window is the intersection of "the last [`WINDOW_MAX_DECISIONS`] = 1000 observations" and
//!   "observations whose timestamp is no more than [`WINDOW_MAX_AGE_NS`] = 60 s before the time of
//!   the recomputation", i.e. whichever of the two is smaller. (`observe` also drops, from the
//!   front, observations more than 60 s older than the one it adds.) An observation's timestamp
//!   is the `now_ns` given to `observe`; the recorder uses
//!   [`DecisionTimes::latest_ns`](super::DecisionTimes::latest_ns).
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
//! The model only holds numbers: it judges nothing and records nothing (the recorder
//! does, against [`TimeoutModel::timeout_ns`]), and it reads no clock (every time is given).

use std::collections::VecDeque;

use serde::Serialize;

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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

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
}
