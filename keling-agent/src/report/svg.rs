//! The report's figures as SVG text: the heatmap, the task state timelines and
//! the decision-latency histogram. Every shape carries `data-*` attributes with
//! the values it shows, so tests (and curious readers) can check a figure
//! without rendering it.
use std::fmt::Write;

use keling_sched::TaskState;

use super::grid::{Grid, HOT_MS};

/// Escapes text for XML (SVG and HTML).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

/// `h:mm:ss` of an offset in seconds.
pub fn clock(s: u64) -> String {
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// White (0 ms) through yellow to red at and above `HOT_MS` x 5.
fn heat_colour(ms: f64) -> String {
    if ms <= 0.0 {
        return "#f7f7f7".to_owned();
    }
    let x = (ms / (HOT_MS * 5.0)).min(1.0);
    // Light yellow (255,245,200) -> orange (253,141,60) -> dark red (165,0,38).
    let (r, g, b) = if x < 0.5 {
        let t = x * 2.0;
        (255.0 - 2.0 * t, 245.0 - 104.0 * t, 200.0 - 140.0 * t)
    } else {
        let t = (x - 0.5) * 2.0;
        (253.0 - 88.0 * t, 141.0 - 141.0 * t, 60.0 - 22.0 * t)
    };
    format!("#{:02x}{:02x}{:02x}", r as u8, g as u8, b as u8)
}

/// Most columns a heatmap draws; longer logs merge windows (max of each group).
pub const MAX_DRAWN_COLUMNS: usize = 480;

/// Room for the longest of `labels` at `font_px` (about 0.6 em a character in the
/// sans-serif fonts browsers use), and never less than `min`: row names are never
/// cut off at the left edge.
fn label_width<'a>(labels: impl Iterator<Item = &'a str>, font_px: f64, min: f64) -> f64 {
    let longest = labels.map(|l| l.chars().count()).max().unwrap_or(0);
    (longest as f64 * font_px * 0.62 + 12.0).max(min)
}

/// The heatmap: a row per GPU or task, a column per window (merged when there
/// are more than [`MAX_DRAWN_COLUMNS`]); hot cells are outlined.
pub fn heatmap(grid: &Grid, id: &str) -> String {
    let windows = grid.windows();
    let per_col = windows.div_ceil(MAX_DRAWN_COLUMNS).max(1);
    let cols = windows.div_ceil(per_col);
    let (label_w, cell_w, cell_h, top) = (
        label_width(grid.rows.iter().map(String::as_str), 11.0, 170.0),
        (900.0 / cols.max(1) as f64).clamp(2.0, 24.0),
        18.0,
        24.0,
    );
    let width = label_w + cell_w * cols as f64 + 20.0;
    let height = top + cell_h * grid.rows.len() as f64 + 40.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="{id}" class="heatmap" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" data-windows="{windows}" data-window-s="{}" data-merged="{per_col}">"#,
        grid.window_ns / 1_000_000_000
    );
    for (r, name) in grid.rows.iter().enumerate() {
        let y = top + cell_h * r as f64;
        let _ = write!(
            s,
            r#"<text x="{:.0}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"#,
            label_w - 6.0,
            y + cell_h * 0.7,
            esc(name)
        );
        for c in 0..cols {
            let range = c * per_col..((c + 1) * per_col).min(windows);
            let (w, ms) =
                range
                    .map(|w| (w, grid.cells[r][w]))
                    .fold((c * per_col, 0.0f64), |best, (w, v)| {
                        if v > best.1 { (w, v) } else { best }
                    });
            let x = label_w + cell_w * c as f64;
            let hot = ms >= HOT_MS;
            let _ = write!(
                s,
                r#"<rect class="cell{}" x="{x:.1}" y="{y:.1}" width="{cell_w:.1}" height="{cell_h:.1}" fill="{}" stroke="{}" stroke-width="{}" data-row="{}" data-window="{w}" data-ms="{ms:.3}"><title>{}, {}: {ms:.1} ms</title></rect>"#,
                if hot { " hot" } else { "" },
                heat_colour(ms),
                if hot { "#000" } else { "#fff" },
                if hot { 1.2 } else { 0.5 },
                esc(name),
                esc(name),
                grid.window_name(w, w)
            );
        }
    }
    // Time axis: about six labels.
    let axis_y = top + cell_h * grid.rows.len() as f64 + 14.0;
    let step = cols.div_ceil(6).max(1);
    for c in (0..cols).step_by(step) {
        let x = label_w + cell_w * c as f64;
        let secs = (c * per_col) as u64 * grid.window_ns / 1_000_000_000;
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{axis_y:.1}" font-size="10">{}</text>"#,
            clock(secs)
        );
    }
    let _ = write!(
        s,
        r##"<text x="{label_w:.0}" y="{:.1}" font-size="10" fill="#555">time since the log's start (h:mm:ss); one column = {} s{}; cell = mean queueing delay of the waits that ended in it; outlined: &#8805; {HOT_MS:.0} ms</text>"##,
        axis_y + 14.0,
        per_col as u64 * grid.window_ns / 1_000_000_000,
        if per_col > 1 {
            " (the hottest window of each group)"
        } else {
            ""
        }
    );
    s.push_str("</svg>");
    s
}

fn state_colour(state: TaskState) -> &'static str {
    match state {
        TaskState::Pending => "#bdbdbd",
        TaskState::Running => "#2ca25f",
        TaskState::Preempted => "#fd8d3c",
        TaskState::Completed => "#3182bd",
        TaskState::Failed => "#de2d26",
        TaskState::Archived => "#eeeeee",
    }
}

/// One task's states over time: `(start_ns, end_ns, state)`.
pub struct Timeline {
    pub label: String,
    pub segments: Vec<(u64, u64, TaskState)>,
}

/// A row per task: its PENDING, RUNNING and PREEMPTED spans, and a mark where it
/// completed or failed.
pub fn timelines(rows: &[Timeline], start_ns: u64, end_ns: u64) -> String {
    let (label_w, plot_w, row_h, top) = (
        label_width(rows.iter().map(|r| r.label.as_str()), 10.0, 220.0),
        880.0,
        14.0,
        10.0,
    );
    let span = end_ns.saturating_sub(start_ns).max(1) as f64;
    let x = |ns: u64| label_w + plot_w * (ns.saturating_sub(start_ns) as f64 / span);
    let width = label_w + plot_w + 20.0;
    let height = top + row_h * rows.len() as f64 + 50.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="timelines" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" data-tasks="{}">"#,
        rows.len()
    );
    for (i, row) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        let _ = write!(
            s,
            r#"<text x="{:.0}" y="{:.1}" text-anchor="end" font-size="10">{}</text>"#,
            label_w - 6.0,
            y + row_h * 0.75,
            esc(&row.label)
        );
        for &(a, b, state) in &row.segments {
            let (xa, xb) = (x(a), x(b));
            if matches!(state, TaskState::Completed | TaskState::Failed) {
                let _ = write!(
                    s,
                    r#"<rect class="end" x="{:.1}" y="{:.1}" width="3" height="{:.1}" fill="{}" data-state="{}"><title>{} {} at {:.3} s</title></rect>"#,
                    xa - 1.5,
                    y + 1.0,
                    row_h - 2.0,
                    state_colour(state),
                    state.as_str(),
                    esc(&row.label),
                    state.as_str(),
                    a.saturating_sub(start_ns) as f64 / 1e9
                );
                continue;
            }
            if state == TaskState::Archived {
                continue;
            }
            let _ = write!(
                s,
                r#"<rect class="span" x="{xa:.2}" y="{:.1}" width="{:.2}" height="{:.1}" fill="{}" data-state="{}"><title>{} {} {:.3}-{:.3} s</title></rect>"#,
                y + 1.0,
                (xb - xa).max(0.5),
                row_h - 2.0,
                state_colour(state),
                state.as_str(),
                esc(&row.label),
                state.as_str(),
                a.saturating_sub(start_ns) as f64 / 1e9,
                b.saturating_sub(start_ns) as f64 / 1e9
            );
        }
    }
    let ly = top + row_h * rows.len() as f64 + 16.0;
    let mut lx = label_w;
    for state in [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Preempted,
        TaskState::Completed,
        TaskState::Failed,
    ] {
        let _ = write!(
            s,
            r#"<rect x="{lx:.0}" y="{:.0}" width="10" height="10" fill="{}"/><text x="{:.0}" y="{ly:.0}" font-size="10">{}</text>"#,
            ly - 9.0,
            state_colour(state),
            lx + 14.0,
            state.as_str()
        );
        lx += 100.0;
    }
    let _ = write!(
        s,
        r##"<text x="{label_w:.0}" y="{:.0}" font-size="10" fill="#555">0 to {} (h:mm:ss since the log's start)</text>"##,
        ly + 16.0,
        clock((span / 1e9) as u64)
    );
    s.push_str("</svg>");
    s
}

/// Log-scale bins: 4 a decade from 10 µs to 100 s.
const BIN_LOW_NS: f64 = 1e4;
const BINS_PER_DECADE: f64 = 4.0;
const BINS: usize = 28;

fn bin_of(ns: u64) -> usize {
    let v = (ns as f64).max(BIN_LOW_NS);
    (((v / BIN_LOW_NS).log10() * BINS_PER_DECADE) as usize).min(BINS - 1)
}

fn bin_low_ns(b: usize) -> f64 {
    BIN_LOW_NS * 10f64.powf(b as f64 / BINS_PER_DECADE)
}

fn ms_label(ns: f64) -> String {
    let ms = ns / 1e6;
    if ms >= 1000.0 {
        format!("{:.0} s", ms / 1000.0)
    } else if ms >= 1.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.0} µs", ms * 1000.0)
    }
}

/// A histogram of decision latencies, `(value_ns, count)`, on log-scale bins,
/// with the timeout as a line when known.
pub fn latency_histogram(values: &[(u64, u64)], timeout_ns: Option<u64>, title: &str) -> String {
    let mut counts = [0u64; BINS];
    for &(v, n) in values {
        counts[bin_of(v)] += n;
    }
    let total: u64 = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let (left, plot_w, plot_h, top) = (50.0, 840.0, 200.0, 24.0);
    let bar_w = plot_w / BINS as f64;
    let width = left + plot_w + 20.0;
    let height = top + plot_h + 50.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="latency" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" data-decisions="{total}">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left:.0}" y="14" font-size="12">{}</text>"#,
        esc(title)
    );
    for (b, &n) in counts.iter().enumerate() {
        let h = plot_h * n as f64 / max;
        let x = left + bar_w * b as f64;
        let _ = write!(
            s,
            r##"<rect class="bar" x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#6baed6" data-low-ns="{:.0}" data-count="{n}"><title>{}-{}: {n}</title></rect>"##,
            top + plot_h - h,
            bar_w - 1.0,
            bin_low_ns(b),
            ms_label(bin_low_ns(b)),
            ms_label(bin_low_ns(b + 1))
        );
        if b % 4 == 0 {
            let _ = write!(
                s,
                r#"<text x="{x:.1}" y="{:.0}" font-size="10">{}</text>"#,
                top + plot_h + 14.0,
                ms_label(bin_low_ns(b))
            );
        }
    }
    let _ = write!(
        s,
        r##"<line x1="{left:.0}" y1="{:.0}" x2="{:.0}" y2="{:.0}" stroke="#999"/>"##,
        top + plot_h,
        left + plot_w,
        top + plot_h
    );
    if let Some(t) = timeout_ns {
        let pos = ((t as f64).max(BIN_LOW_NS) / BIN_LOW_NS).log10() * BINS_PER_DECADE;
        let x = left + bar_w * pos.min(BINS as f64);
        let _ = write!(
            s,
            r##"<line id="timeout" x1="{x:.1}" y1="{top:.0}" x2="{x:.1}" y2="{:.0}" stroke="#de2d26" stroke-dasharray="4 3" data-timeout-ns="{t}"/><text x="{:.1}" y="{:.0}" font-size="10" fill="#de2d26">timeout {}</text>"##,
            top + plot_h,
            x + 3.0,
            top + 10.0,
            ms_label(t as f64)
        );
    }
    let _ = write!(
        s,
        r##"<text x="{left:.0}" y="{:.0}" font-size="10" fill="#555">end-to-end decision latency (log scale, 4 bins a decade); {total} decisions; bar height = count</text>"##,
        top + plot_h + 32.0
    );
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_get_room_for_the_longest_and_never_less_than_the_minimum() {
        assert_eq!(
            label_width(["GPU 0", "GPU 1"].into_iter(), 11.0, 170.0),
            170.0
        );
        let long = "sched.jsonl: task 12 (batch-transcode)";
        let w = label_width([long, "x"].into_iter(), 11.0, 170.0);
        // About 0.6 em a character, plus the gap before the plot.
        assert!(w > 170.0 && w >= long.len() as f64 * 11.0 * 0.6, "{w}");
    }

    #[test]
    fn text_is_escaped_and_times_are_clock_like() {
        assert_eq!(esc(r#"<a & "b">'"#), "&lt;a &amp; &quot;b&quot;&gt;&#39;");
        assert_eq!(clock(3_725), "1:02:05");
    }

    #[test]
    fn latencies_fall_in_log_bins() {
        assert_eq!(bin_of(0), 0);
        assert_eq!(bin_of(10_000), 0);
        assert_eq!(bin_of(100_000), 4);
        assert_eq!(bin_of(1_000_000), 8, "1 ms");
        assert_eq!(bin_of(u64::MAX), BINS - 1);
        let svg = latency_histogram(&[(1_000_000, 3), (30_000_000, 2)], Some(23_800_000), "x");
        assert!(svg.contains(r#"data-decisions="5""#));
        assert!(svg.contains(r#"data-timeout-ns="23800000""#));
    }
}
