//! The queueing-delay heatmap and its root-cause findings (docs/design.md, "Outputs").
//!
//! **Cells.** Rows are GPUs (or tasks), columns are [`WINDOW_NS`] = 15 s windows
//! from the start of the log. A cell's value is the mean queueing delay, in ms,
//! of the waits (see `replay::figures`) of that row that ended in that window; a
//! cell with no wait is 0 (nobody waited).
//!
//! **Findings**, in this order, each naming the row and the window(s):
//! - a **hot cell** is one of at least [`HOT_MS`] = 200 ms;
//! - a **column stripe** (a global cause: every GPU waited at once) is a window
//!   in which at least half the rows, and at least 2, are hot; consecutive such
//!   windows make one finding;
//! - a **row stripe** (one saturated device or task) is a run of at least
//!   [`ROW_RUN_MIN`] = 3 consecutive hot cells in one row;
//! - a **local imbalance** is a hot cell in neither kind of stripe whose 3x3
//!   neighbourhood (the cells that exist around it, itself included) has a
//!   population variance above [`LOCAL_VARIANCE_MS2`] = 85 ms².
//!
//! Pure: no I/O, no clock.
use std::collections::BTreeSet;

use serde::Serialize;

/// Width of a heatmap column.
pub const WINDOW_NS: u64 = 15_000_000_000;
/// A cell this hot (mean queueing delay, ms) or hotter is hot.
pub const HOT_MS: f64 = 200.0;
/// A hot cell whose 3x3 neighbourhood varies more than this (ms²) is a local
/// imbalance.
pub const LOCAL_VARIANCE_MS2: f64 = 85.0;
/// Consecutive hot cells in a row that make a row stripe.
pub const ROW_RUN_MIN: usize = 3;

/// A heatmap: `cells[row][window]`, ms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Grid {
    /// What each row is: "GPU 0", "task 7 (train)".
    pub rows: Vec<String>,
    pub start_ns: u64,
    pub window_ns: u64,
    pub cells: Vec<Vec<f64>>,
}

/// Sums for one grid being filled.
#[derive(Clone, Debug)]
pub struct GridBuilder {
    rows: Vec<String>,
    start_ns: u64,
    window_ns: u64,
    windows: usize,
    sum_ms: Vec<Vec<f64>>,
    count: Vec<Vec<u32>>,
}

impl GridBuilder {
    /// A grid of `rows` over `[start_ns, end_ns]`.
    pub fn new(rows: Vec<String>, start_ns: u64, end_ns: u64, window_ns: u64) -> Self {
        let window_ns = window_ns.max(1);
        let windows = (end_ns.saturating_sub(start_ns) / window_ns + 1) as usize;
        let n = rows.len();
        GridBuilder {
            rows,
            start_ns,
            window_ns,
            windows,
            sum_ms: vec![vec![0.0; windows]; n],
            count: vec![vec![0; windows]; n],
        }
    }

    /// A wait of `ms` that ended at `end_ns`, in `row`.
    pub fn add(&mut self, row: usize, end_ns: u64, ms: f64) {
        if row >= self.rows.len() {
            return;
        }
        let w = (end_ns.saturating_sub(self.start_ns) / self.window_ns) as usize;
        let w = w.min(self.windows - 1);
        self.sum_ms[row][w] += ms;
        self.count[row][w] += 1;
    }

    pub fn build(self) -> Grid {
        let cells = self
            .sum_ms
            .iter()
            .zip(&self.count)
            .map(|(sums, counts)| {
                sums.iter()
                    .zip(counts)
                    .map(|(&s, &c)| if c == 0 { 0.0 } else { s / f64::from(c) })
                    .collect()
            })
            .collect();
        Grid {
            rows: self.rows,
            start_ns: self.start_ns,
            window_ns: self.window_ns,
            cells,
        }
    }
}

/// What a finding points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A hot cell among cooler neighbours.
    LocalImbalance,
    /// Hot windows across most rows: something global.
    GlobalCause,
    /// Hot windows in a row: that device or task is saturated.
    Saturated,
}

/// One root-cause finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The rows concerned (one, or every hot row of a column stripe).
    pub rows: Vec<String>,
    /// First and last window (inclusive, 0-based).
    pub first_window: usize,
    pub last_window: usize,
    /// The hottest cell's value, ms.
    pub peak_ms: f64,
    /// Local imbalances: the neighbourhood's variance, ms².
    pub variance_ms2: Option<f64>,
    /// One sentence naming the row(s) and the window(s).
    pub text: String,
}

impl Grid {
    pub fn windows(&self) -> usize {
        self.cells.first().map_or(0, Vec::len)
    }

    fn hot(&self, r: usize, c: usize) -> bool {
        self.cells[r][c] >= HOT_MS
    }

    /// Population variance of the 3x3 neighbourhood of `(r, c)`, clipped at the
    /// edges.
    pub fn neighbourhood_variance(&self, r: usize, c: usize) -> f64 {
        let mut values = Vec::with_capacity(9);
        for rr in r.saturating_sub(1)..=(r + 1).min(self.rows.len() - 1) {
            for cc in c.saturating_sub(1)..=(c + 1).min(self.windows() - 1) {
                values.push(self.cells[rr][cc]);
            }
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64
    }

    /// The mean of the up-to-8 cells around `(r, c)` (the cell itself left out),
    /// and how many there are: what a local imbalance is told against.
    pub fn neighbours_mean(&self, r: usize, c: usize) -> (f64, usize) {
        let mut sum = 0.0;
        let mut n = 0;
        for rr in r.saturating_sub(1)..=(r + 1).min(self.rows.len() - 1) {
            for cc in c.saturating_sub(1)..=(c + 1).min(self.windows() - 1) {
                if (rr, cc) != (r, c) {
                    sum += self.cells[rr][cc];
                    n += 1;
                }
            }
        }
        (if n == 0 { 0.0 } else { sum / n as f64 }, n)
    }

    /// `"w12 (180-195 s)"`: a window by index and offset from the start.
    pub fn window_name(&self, first: usize, last: usize) -> String {
        let s = |w: usize| w as u64 * self.window_ns / 1_000_000_000;
        if first == last {
            format!("window {first} ({}-{} s)", s(first), s(first + 1))
        } else {
            format!("windows {first}-{last} ({}-{} s)", s(first), s(last + 1))
        }
    }

    /// The root-cause findings (module doc), columns first, then rows, then
    /// local imbalances in row-major order.
    pub fn findings(&self) -> Vec<Finding> {
        let (rows, windows) = (self.rows.len(), self.windows());
        if rows == 0 || windows == 0 {
            return Vec::new();
        }
        // (row, window) of the cells in a column or row stripe.
        let mut in_stripe: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut found = Vec::new();

        let column_min = rows.div_ceil(2).max(2);
        let hot_column = |c: usize| (0..rows).filter(|&r| self.hot(r, c)).count() >= column_min;
        let mut c = 0;
        while c < windows {
            if !hot_column(c) {
                c += 1;
                continue;
            }
            let first = c;
            while c + 1 < windows && hot_column(c + 1) {
                c += 1;
            }
            let last = c;
            let mut hot_rows = Vec::new();
            let mut peak: f64 = 0.0;
            for r in 0..rows {
                let mut any = false;
                for w in first..=last {
                    if self.hot(r, w) {
                        in_stripe.insert((r, w));
                        any = true;
                        peak = peak.max(self.cells[r][w]);
                    }
                }
                if any {
                    hot_rows.push(self.rows[r].clone());
                }
            }
            let text = format!(
                "global cause: {} of {} rows hot in {} (peak {:.0} ms): {}",
                hot_rows.len(),
                rows,
                self.window_name(first, last),
                peak,
                hot_rows.join(", ")
            );
            found.push(Finding {
                kind: FindingKind::GlobalCause,
                rows: hot_rows,
                first_window: first,
                last_window: last,
                peak_ms: peak,
                variance_ms2: None,
                text,
            });
            c += 1;
        }

        for r in 0..rows {
            let mut c = 0;
            while c < windows {
                if !self.hot(r, c) {
                    c += 1;
                    continue;
                }
                let first = c;
                while c + 1 < windows && self.hot(r, c + 1) {
                    c += 1;
                }
                let last = c;
                if last + 1 - first >= ROW_RUN_MIN {
                    let peak = self.cells[r][first..=last]
                        .iter()
                        .copied()
                        .fold(0.0, f64::max);
                    in_stripe.extend((first..=last).map(|w| (r, w)));
                    found.push(Finding {
                        kind: FindingKind::Saturated,
                        rows: vec![self.rows[r].clone()],
                        first_window: first,
                        last_window: last,
                        peak_ms: peak,
                        variance_ms2: None,
                        text: format!(
                            "saturated: {} hot for {} consecutive windows, {} (peak {:.0} ms)",
                            self.rows[r],
                            last + 1 - first,
                            self.window_name(first, last),
                            peak
                        ),
                    });
                }
                c += 1;
            }
        }

        for r in 0..rows {
            for c in 0..windows {
                if !self.hot(r, c) || in_stripe.contains(&(r, c)) {
                    continue;
                }
                let variance = self.neighbourhood_variance(r, c);
                if variance > LOCAL_VARIANCE_MS2 {
                    let (around, n) = self.neighbours_mean(r, c);
                    found.push(Finding {
                        kind: FindingKind::LocalImbalance,
                        rows: vec![self.rows[r].clone()],
                        first_window: c,
                        last_window: c,
                        peak_ms: self.cells[r][c],
                        variance_ms2: Some(variance),
                        text: format!(
                            "local imbalance: {} in {}: waits of {:.0} ms on average, against {:.0} ms in the {} cells around it",
                            self.rows[r],
                            self.window_name(c, c),
                            self.cells[r][c],
                            around,
                            n
                        ),
                    });
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(cells: Vec<Vec<f64>>) -> Grid {
        Grid {
            rows: (0..cells.len()).map(|r| format!("GPU {r}")).collect(),
            start_ns: 0,
            window_ns: WINDOW_NS,
            cells,
        }
    }

    #[test]
    fn cells_are_the_mean_wait_ending_in_each_window() {
        let mut b = GridBuilder::new(
            vec!["a".into(), "b".into()],
            1_000,
            1_000 + 31 * 1_000_000_000,
            WINDOW_NS,
        );
        b.add(0, 1_000, 10.0);
        b.add(0, 1_000 + 14_999_999_999, 30.0);
        b.add(1, 1_000 + 15_000_000_000, 5.0);
        b.add(1, u64::MAX, 7.0); // past the end: the last window
        b.add(9, 0, 1.0); // no such row: ignored
        let g = b.build();
        assert_eq!(g.cells, vec![vec![20.0, 0.0, 0.0], vec![0.0, 5.0, 7.0]]);
    }

    #[test]
    fn each_pattern_is_found_once_and_named() {
        let mut cells = vec![vec![0.0; 10]; 4];
        // GPU 1: one hot cell alone at window 2.
        cells[1][2] = 250.0;
        // Window 6: every GPU hot.
        for row in &mut cells {
            row[6] = 400.0;
        }
        // GPU 3: saturated from window 7 to 9 (and window 6, part of the column).
        cells[3][7..10].fill(300.0);
        let g = grid(cells);
        let f = g.findings();
        let kinds: Vec<(FindingKind, Vec<String>, usize, usize)> = f
            .iter()
            .map(|f| (f.kind, f.rows.clone(), f.first_window, f.last_window))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (
                    FindingKind::GlobalCause,
                    vec![
                        "GPU 0".into(),
                        "GPU 1".into(),
                        "GPU 2".into(),
                        "GPU 3".into()
                    ],
                    6,
                    6
                ),
                (FindingKind::Saturated, vec!["GPU 3".into()], 6, 9),
                (FindingKind::LocalImbalance, vec!["GPU 1".into()], 2, 2),
            ]
        );
        // 250 among eight zeros: variance = 250² × 8 / 81.
        let v = f[2].variance_ms2.unwrap();
        assert!((v - 250.0f64.powi(2) * 8.0 / 81.0).abs() < 1e-9, "{v}");
        assert!(
            f[2].text.contains("GPU 1") && f[2].text.contains("window 2 (30-45 s)"),
            "{}",
            f[2].text
        );
        // Told in waits a person can compare, not as a variance.
        assert!(
            f[2].text
                .ends_with("waits of 250 ms on average, against 0 ms in the 8 cells around it"),
            "{}",
            f[2].text
        );
        assert!(
            f[1].text.contains("windows 6-9 (90-150 s)"),
            "{}",
            f[1].text
        );
    }

    #[test]
    fn a_hot_cell_in_an_even_neighbourhood_is_not_a_local_imbalance() {
        // 200-209 ms all around: hot, but the variance is 8.25 ms² < 85.
        let cells: Vec<Vec<f64>> = (0..3)
            .map(|r| (0..3).map(|c| 200.0 + (r * 3 + c) as f64).collect())
            .collect();
        let mut g = grid(cells);
        // Break the column and row stripes: only the centre stays hot.
        for r in 0..3 {
            for c in 0..3 {
                if (r, c) != (1, 1) {
                    g.cells[r][c] -= 10.0;
                }
            }
        }
        assert!(g.neighbourhood_variance(1, 1) < LOCAL_VARIANCE_MS2);
        assert!(g.findings().is_empty(), "{:?}", g.findings());
        // Cooler neighbours make it one.
        g.cells[0][0] = 0.0;
        let f = g.findings();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::LocalImbalance);
    }

    #[test]
    fn empty_grids_find_nothing() {
        assert!(grid(vec![]).findings().is_empty());
        assert!(grid(vec![vec![]]).findings().is_empty());
    }
}
