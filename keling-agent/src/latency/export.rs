//! The exports of a [`LatencyRecorder`]: what `keling status --export`, `keling histo export`
//! and the status endpoint show. Each export picks its histograms with a [`Selection`].
//!
//! | export | written by | format |
//! |---|---|---|
//! | percentile tables | [`LatencyRecorder::write_percentile_table`] | HdrHistogram's classic `.hgrm` text, values in ms |
//! | Prometheus text | [`LatencyRecorder::write_prometheus`] | text exposition 0.0.4, the families of [`super::prom`] |
//! | JSON | [`LatencyRecorder::write_json`] | a summary and every histogram's buckets |
//! | interval log | [`LatencyRecorder::write_interval_log`] | one interval, through [`super::intervals`]' writer |
//! | status | [`LatencyRecorder::status`] | [`LatencyStatus`], ms values |
//!
//! Exports only read the recorder and write to the caller's writer.

use std::collections::BTreeMap;
use std::io::{self, Write};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::intervals::{IntervalLogAppender, IntervalMeta};
use super::prom;
use super::recorder::{
    HIST_HIGH_NS, HIST_LOW_NS, HIST_SIGFIG, Hist, LatencyRecorder, NS_PER_MS, Percentiles,
    Selection, Stage,
};

/// Stage order of the exports: end-to-end first, then the pipeline.
const EXPORT_STAGES: [Stage; 5] = [
    Stage::EndToEnd,
    Stage::Delivery,
    Stage::Decision,
    Stage::Actuation,
    Stage::Confirmation,
];

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

impl LatencyRecorder {
    /// A compact status (ms values) for the agent's status endpoint.
    pub fn status(&self) -> LatencyStatus {
        LatencyStatus {
            timeout_ms: self.timeout_ns() as f64 / NS_PER_MS,
            model: self.model().kind().as_str().to_owned(),
            late: self.late_count(),
            decisions: self.decisions(),
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
                .late_by_action()
                .keys()
                .map(|a| {
                    (
                        a.clone(),
                        MsPercentiles::of(self.percentiles(Stage::EndToEnd, Some(a))),
                    )
                })
                .collect(),
            late_by_action: self.late_by_action().clone(),
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
            if let Some(h) = self.hist(stage, None)
                && sel.stage(stage)
                && sel.action(None)
            {
                out.push((stage, None, h));
            }
        }
        for (stage, action, h) in self.per_action() {
            if sel.stage(stage) && sel.action(Some(action)) {
                out.push((stage, Some(action), h));
            }
        }
        out
    }

    /// Every histogram in export order, as the interval log writes them.
    pub fn histograms(&self) -> Vec<(Stage, Option<&str>, &Histogram<u64>)> {
        self.export_order()
            .into_iter()
            .map(|(s, a, h)| (s, a, &h.h))
            .collect()
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

    /// Writes the whole recording as an HdrHistogram interval log of one interval
    /// (`keling status --export interval-log`), through the writer `keling run --histo-log`
    /// appends with ([`IntervalLogAppender`]): the interval starts at `start_ns` and lasts
    /// until the latest timestamp seen; it holds every histogram in export order, the empty
    /// all-action ones included. Its timestamps are seconds of `CLOCK_MONOTONIC` (no
    /// StartTime/BaseTime: the recorder reads no wall clock). See [`super::intervals`] for the
    /// format and the tags.
    pub fn write_interval_log(&self, w: &mut impl Write, start_ns: u64) -> io::Result<()> {
        let meta = IntervalMeta::of(self.model(), self.decisions(), self.late_count());
        let end_ns = self.last_ns().unwrap_or(start_ns);
        IntervalLogAppender::start_monotonic(w, start_ns)?.write_interval(
            &meta,
            self.histograms(),
            end_ns,
        )
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::latency::{DecisionTimes, ModelKind, StageDurations};
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

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
