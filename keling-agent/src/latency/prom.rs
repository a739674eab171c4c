//! The decision latency as Prometheus metric families, through the prometheus-client
//! crate: one encoding behind `keling status --export prometheus`, `keling histo
//! export --format prom` and the agent's `/metrics`.
//!
//! Families (text exposition 0.0.4):
//! - `keling_decision_latency_seconds{stage,action}`: histogram per stage and action kind;
//! - `keling_decision_latency_all_actions_seconds{stage}`: the same over all actions, every
//!   stage (a separate family, so a sum over `action` does not count twice);
//! - `keling_decision_timeout_seconds{model}`: gauge, the timeout in force;
//! - `keling_decisions_total`, `keling_decisions_late_total`: counters.
//!
//! The HdrHistograms become fixed Prometheus buckets ([`BUCKETS_S`]): each recorded value
//! (to the histograms' 3 significant digits) counts in the first bucket whose bound is at
//! least its value, so every count is kept; `_sum` is the recorder's exact sum.
use std::fmt;

use hdrhistogram::Histogram;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use super::recorder::{Hist, LatencyRecorder, NS_PER_S, Selection, Stage};

/// Bucket bounds, seconds: 100 us to 60 s (the histograms' range), with the design's
/// default timeout, 23.8 ms, as a bound of its own.
pub const BUCKETS_S: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.0238, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 20.0, 30.0, 60.0,
];

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// One histogram series, ready to encode.
#[derive(Clone, Debug, PartialEq)]
pub struct PromHistogram {
    pub labels: Labels,
    pub sum_s: f64,
    pub count: u64,
    /// (upper bound s, count in this bucket alone); the encoder accumulates.
    pub buckets: Vec<(f64, u64)>,
}

impl PromHistogram {
    /// A series from an HdrHistogram of ns values and the exact sum of what it recorded.
    pub fn of(labels: Labels, h: &Histogram<u64>, sum_ns: u128) -> Self {
        let mut buckets: Vec<(f64, u64)> = BUCKETS_S.iter().map(|&b| (b, 0)).collect();
        let mut over = 0;
        for v in h.iter_recorded() {
            let s = v.value_iterated_to() as f64 / NS_PER_S;
            match buckets.iter_mut().find(|(b, _)| s <= *b) {
                Some((_, n)) => *n += v.count_at_value(),
                None => over += v.count_at_value(),
            }
        }
        buckets.push((f64::INFINITY, over));
        PromHistogram {
            labels,
            sum_s: sum_ns as f64 / NS_PER_S,
            count: h.len(),
            buckets,
        }
    }
}

/// Every latency family of a recorder, owned (a prometheus-client collector must be).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyFamilies {
    pub by_action: Vec<PromHistogram>,
    /// Empty when the selection names an action.
    pub all_actions: Vec<PromHistogram>,
    pub model: String,
    pub timeout_s: f64,
    pub decisions: u64,
    pub late: u64,
}

impl LatencyFamilies {
    /// The families of `r`, only the histograms `sel` selects.
    pub fn of(r: &LatencyRecorder, sel: &Selection) -> Self {
        let mut f = LatencyFamilies {
            model: r.model().kind().as_str().to_owned(),
            timeout_s: r.timeout_ns() as f64 / NS_PER_S,
            decisions: r.decisions(),
            late: r.late_count(),
            ..Self::default()
        };
        for (stage, action, h) in r.per_action() {
            if sel.stage(stage) && sel.action(Some(action)) {
                let labels = vec![
                    ("stage", stage.as_str().to_owned()),
                    ("action", action.to_owned()),
                ];
                f.by_action.push(PromHistogram::of(labels, &h.h, h.sum_ns));
            }
        }
        if sel.action.is_none() {
            let empty = Hist::new();
            for stage in Stage::ALL.into_iter().filter(|&s| sel.stage(s)) {
                let h = r.hist(stage, None).unwrap_or(&empty);
                let labels = vec![("stage", stage.as_str().to_owned())];
                f.all_actions
                    .push(PromHistogram::of(labels, &h.h, h.sum_ns));
            }
        }
        f
    }

    /// Encodes the families.
    pub fn encode_into(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        encode_histograms(
            enc,
            "keling_decision_latency_seconds",
            "Scheduler decision latency by stage and action kind, from the kernel event to confirmation.",
            &self.by_action,
        )?;
        if !self.all_actions.is_empty() {
            encode_histograms(
                enc,
                "keling_decision_latency_all_actions_seconds",
                "Scheduler decision latency by stage over all action kinds.",
                &self.all_actions,
            )?;
        }
        let mut m = enc.encode_descriptor(
            "keling_decision_timeout_seconds",
            "Decision timeout in force; decisions over it are late.",
            None,
            MetricType::Gauge,
        )?;
        let labels = vec![("model", self.model.clone())];
        m.encode_family(&labels)?.encode_gauge(&self.timeout_s)?;
        let mut m = enc.encode_descriptor(
            "keling_decisions",
            "Scheduler decisions recorded.",
            None,
            MetricType::Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, u64>(&self.decisions, None)?;
        let mut m = enc.encode_descriptor(
            "keling_decisions_late",
            "Decisions whose end-to-end latency exceeded the timeout in force.",
            None,
            MetricType::Counter,
        )?;
        m.encode_counter::<NoLabelSet, _, u64>(&self.late, None)
    }
}

/// One histogram family.
pub fn encode_histograms(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[PromHistogram],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for h in series {
        m.encode_family(&h.labels)?
            .encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)?;
    }
    Ok(())
}

impl Collector for LatencyFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        self.encode_into(&mut encoder)
    }
}

/// The Prometheus text exposition (0.0.4) of whatever a registry holds.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// The text exposition of `r`'s latency families.
pub fn latency_text(r: &LatencyRecorder, sel: &Selection) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LatencyFamilies::of(r, sel)));
    render(&registry)
}
