//! Tuning the decision timeout: replays a series of end-to-end latencies through both
//! timeout models at a range of multipliers and recommends one ([`tune`]); the report
//! (`keling histo tune`, `keling status --export tune`) puts the design's two settings
//! beside it ([`tune_report`]).
//!
//! The replay is causal, as the live agent is: for each decision, in time order, the model
//! recomputes (at most once per second), judges the decision against the timeout then in
//! force, and only then adds it to its window.
//!
//! # The recommendation
//! A timeout that is too low calls ordinary decisions late: each is logged and a freeze is
//! escalated to SIGSTOP. One that is too high waits longer before escalating a freeze that
//! really is stuck. So the recommendation is the setting with the lowest timeout (the one it
//! ends with) among those that call at most [`TARGET_LATE_FRACTION`] of the decisions late;
//! when none does, the one that calls the fewest late (then the lowest timeout).
use std::fmt;

use serde::Serialize;

use super::recorder::NS_PER_MS;
use super::timeout_model::{ModelKind, TimeoutModel};

/// Sigmas over the mean tried for the static model.
pub const STATIC_SIGMAS_GRID: [f64; 6] = [2.0, 2.5, 3.0, 4.0, 5.0, 6.0];
/// Factors on p99 tried for the adaptive model.
pub const ADAPTIVE_FACTOR_GRID: [f64; 6] = [1.0, 1.1, 1.2, 1.5, 2.0, 3.0];
/// The most decisions a recommended setting may call late.
pub const TARGET_LATE_FRACTION: f64 = 0.01;

/// What one model at one multiplier would have done over a series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub model: ModelKind,
    /// Sigmas (static) or the factor on p99 (adaptive).
    pub multiplier: f64,
    /// The timeout it ends with (recomputed over the final window), ms.
    pub timeout_ms: f64,
    /// The highest timeout it had in force at any decision, ms.
    pub max_timeout_ms: f64,
    /// Decisions over the timeout in force when they were made.
    pub late: u64,
    pub decisions: u64,
}

impl Candidate {
    /// Late decisions as a fraction of all (0 without decisions).
    pub fn late_fraction(&self) -> f64 {
        if self.decisions == 0 {
            0.0
        } else {
            self.late as f64 / self.decisions as f64
        }
    }

    /// Whether this is the design's setting (static x3, adaptive x1.2).
    pub fn is_default(&self) -> bool {
        self.multiplier == self.model.default_multiplier()
    }

    /// The `keling run` flags that select this setting.
    pub fn flags(&self) -> String {
        format!(
            "--timeout-model {} --timeout-multiplier {}",
            self.model.as_str(),
            self.multiplier
        )
    }
}

/// Replays a series sorted by time (`(ts_ns, end_to_end_ns)`) through one model.
pub fn replay(sorted: &[(u64, u64)], kind: ModelKind, multiplier: f64) -> Candidate {
    let mut model = TimeoutModel::with_multiplier(kind, multiplier);
    let mut late = 0;
    let mut max_timeout = model.timeout_ns();
    for &(ts, lat) in sorted {
        model.maybe_recompute(ts);
        max_timeout = max_timeout.max(model.timeout_ns());
        if lat > model.timeout_ns() {
            late += 1;
        }
        model.observe(lat, ts);
    }
    if let Some(&(last, _)) = sorted.last() {
        model.recompute(last);
    }
    Candidate {
        model: kind,
        multiplier: model.multiplier(),
        timeout_ms: model.timeout_ns() as f64 / NS_PER_MS,
        max_timeout_ms: max_timeout as f64 / NS_PER_MS,
        late,
        decisions: sorted.len() as u64,
    }
}

/// Every setting of both models over one series, and the one recommended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tuning {
    pub grid: Vec<Candidate>,
    pub recommended: Candidate,
    pub reasoning: String,
}

/// Replays `series` (any order) through every setting and recommends one.
pub fn tune(series: &[(u64, u64)]) -> Tuning {
    let mut sorted = series.to_vec();
    sorted.sort_by_key(|&(ts, _)| ts);
    let mut grid = Vec::new();
    for m in STATIC_SIGMAS_GRID {
        grid.push(replay(&sorted, ModelKind::Static, m));
    }
    for m in ADAPTIVE_FACTOR_GRID {
        grid.push(replay(&sorted, ModelKind::Adaptive, m));
    }
    let (recommended, reasoning) = recommend(&grid);
    Tuning {
        grid,
        recommended,
        reasoning,
    }
}

/// The recommendation rule of the module documentation, with its reasoning in words.
fn recommend(grid: &[Candidate]) -> (Candidate, String) {
    let default = *grid
        .iter()
        .find(|c| c.model == ModelKind::Adaptive && c.is_default())
        .expect("the grid holds the default");
    let decisions = default.decisions;
    if decisions == 0 {
        return (
            default,
            "no decisions were recorded, so there is nothing to tune: keep the default \
             (adaptive, p99 x 1.2, starting at 23.8 ms)"
                .to_owned(),
        );
    }
    let pct = |c: &Candidate| 100.0 * c.late_fraction();
    let name = |c: &Candidate| match c.model {
        ModelKind::Static => format!("static (mean + {} sigma)", c.multiplier),
        ModelKind::Adaptive => format!("adaptive (p99 x {})", c.multiplier),
    };
    let within: Vec<&Candidate> = grid
        .iter()
        .filter(|c| c.late_fraction() <= TARGET_LATE_FRACTION)
        .collect();
    let target_pct = 100.0 * TARGET_LATE_FRACTION;
    let (best, why) = if let Some(best) = within.iter().copied().min_by(|a, b| {
        a.timeout_ms
            .total_cmp(&b.timeout_ms)
            .then(a.late.cmp(&b.late))
    }) {
        (
            *best,
            format!(
                "{} of the {} settings call at most {target_pct}% of the {decisions} decisions late; \
                 of those it ends with the lowest timeout, so a freeze that is really stuck is \
                 escalated soonest without escalating ordinary ones",
                within.len(),
                grid.len()
            ),
        )
    } else {
        let best = grid
            .iter()
            .min_by(|a, b| {
                a.late
                    .cmp(&b.late)
                    .then(a.timeout_ms.total_cmp(&b.timeout_ms))
            })
            .expect("the grid is not empty");
        (
            *best,
            format!(
                "no setting calls {target_pct}% or fewer of the {decisions} decisions late (the \
                 latencies themselves are spread wide, or changed suddenly); it calls the fewest \
                 late. Look at the slow decisions' stages (`keling histo export --stage ...`) before \
                 raising the timeout further"
            ),
        )
    };
    let mut reasoning = format!(
        "{}: {} of {} decisions late ({:.2}%), final timeout {:.3} ms (at most {:.3} ms). {why}.",
        name(&best),
        best.late,
        decisions,
        pct(&best),
        best.timeout_ms,
        best.max_timeout_ms
    );
    if best != default {
        reasoning.push_str(&format!(
            " The default, {}, would have called {} late ({:.2}%) and ended at {:.3} ms.",
            name(&default),
            default.late,
            pct(&default),
            default.timeout_ms
        ));
    }
    reasoning.push_str(&format!(" Use it with `keling run {}`.", best.flags()));
    (best, reasoning)
}

impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  {:<10} {:>10} {:>12} {:>12} {:>8} {:>10} {:>8}",
            "model", "multiplier", "timeout_ms", "max_ms", "late", "decisions", "late_%"
        )?;
        for c in &self.grid {
            let mark = if *c == self.recommended { '*' } else { ' ' };
            writeln!(
                f,
                "{mark} {:<10} {:>10} {:>12.3} {:>12.3} {:>8} {:>10} {:>8.2}",
                c.model.as_str(),
                c.multiplier,
                c.timeout_ms,
                c.max_timeout_ms,
                c.late,
                c.decisions,
                100.0 * c.late_fraction()
            )?;
        }
        writeln!(f)?;
        writeln!(f, "recommended: {}", self.recommended.flags())?;
        writeln!(f, "why: {}", self.reasoning)
    }
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
/// ([`Tuning`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneReport {
    #[serde(rename = "static")]
    pub static_: ModelSummary,
    pub adaptive: ModelSummary,
    #[serde(flatten)]
    pub tuning: Tuning,
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
/// through both models at every multiplier of the grids ([`tune`]). For each sample:
/// `maybe_recompute(ts)`, judge (late = latency > the timeout now in force), then
/// `observe(latency, ts)`. The final timeout is a forced recomputation at the last sample's
/// time, so it reflects the whole final window.
pub fn tune_report(end_to_end_ns: &[(u64, u64)]) -> TuneReport {
    let tuning = tune(end_to_end_ns);
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

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
}
