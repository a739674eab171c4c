//! The HdrHistogram interval log: its one writer, [`IntervalLogAppender`], and reading it
//! back ([`read`]) for `keling histo export` and `keling histo tune`.
//!
//! Two uses write through the appender: `keling run --histo-log` appends an interval to a
//! file every few seconds ([`IntervalLogAppender::append`]), and `keling status --export
//! interval-log` writes the whole recording as one interval
//! ([`LatencyRecorder::write_interval_log`]).
//!
//! # Format
//! The standard interval log (format version 1.3), histograms V2 deflate-compressed and
//! base64-encoded, values in ns, the max column in ms (as Java's `HistogramLogWriter`
//! writes it). Each start of the agent appends a header:
//! ```text
//! #[Logged with Keling 0.1.0 (keling run --histo-log)]
//! #[Histogram log format version 1.3]
//! #[Keling decision latency: values in ns; untagged = end_to_end of all actions, ...]
//! #[StartTime: 1764589102.123 (seconds since epoch), 2026-12-01T11:38:22Z]
//! #[BaseTime: 1764589102.123 (seconds since epoch)]
//! "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
//! ```
//! then, every interval, a comment with what the timeout model did and the interval's
//! histograms, timestamps in seconds since the BaseTime:
//! ```text
//! #[Keling interval: model=adaptive multiplier=1.2 timeout_ns=23800000 decisions=3 late=0]
//! 12.000,1.000,0.412,HISTFAAAA...                (end-to-end, all actions; always written)
//! Tag=delivery,12.000,1.000,0.003,HISTF...       (each other stage with data, all actions)
//! Tag=end_to_end/freeze,12.000,1.000,0.412,...   (each stage with data, per action: STAGE/ACTION)
//! ```
//! An action's characters that a tag cannot hold (`,`, space, CR, LF) become `_`.
//!
//! The one-shot export has no wall clock to give, so its header names none and its
//! timestamps are seconds of `CLOCK_MONOTONIC`:
//! ```text
//! #[Histogram log format version 1.3]
//! #[Keling decision latency: values in ns, interval timestamps in s of CLOCK_MONOTONIC, ...]
//! #[MaxValueDivisor: 1000000.000]
//! #[Keling interval: model=adaptive multiplier=1.2 timeout_ns=18000000 decisions=300 late=0]
//! 5.000,2.995,15.008,HISTFAAAA...
//! ```
//! and its one interval holds every histogram in export order (end-to-end, the other stages,
//! then per stage and action), the all-action ones even when empty.
//!
//! Readers that know nothing of Keling (the hdrhistogram crate's `IntervalLogIterator`,
//! Java's `HistogramLogReader`, HdrHistogram_py) skip the comments.
use std::{
    collections::BTreeMap,
    fmt,
    io::{self, Write},
    time::Duration,
};

use base64::Engine;
use hdrhistogram::{
    Histogram,
    serialization::{
        Deserializer, Serializer, V2DeflateSerializer,
        interval_log::{IntervalLogIterator, LogEntry},
    },
};

use super::recorder::{Interval, LatencyRecorder, NS_PER_MS, Stage, new_histogram};
use super::timeout_model::{ModelKind, TimeoutModel};

const LEGEND: &str =
    "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"";
const VERSION_COMMENT: &str = "#[Histogram log format version 1.3]";
const INTERVAL_COMMENT: &str = "#[Keling interval: ";

/// What a log's timestamps count from; its header says which.
enum TimeBase {
    /// Seconds since the BaseTime: the wall clock, ns since the epoch, at the log's start.
    Wall { epoch_ns: u128 },
    /// Seconds of `CLOCK_MONOTONIC`; the header has no StartTime or BaseTime.
    Monotonic,
}

/// Writes an interval log: a header, then intervals. The only writer of the format.
pub struct IntervalLogAppender<W: Write> {
    w: W,
    /// `CLOCK_MONOTONIC` at the BaseTime (0 when timestamps are monotonic seconds).
    base_mono_ns: u64,
    /// Where the next interval starts (monotonic ns).
    next_start_ns: u64,
    serializer: V2DeflateSerializer,
    buf: Vec<u8>,
}

impl<W: Write> IntervalLogAppender<W> {
    /// Writes a header whose StartTime and BaseTime are `wall_epoch_ns` (the wall clock
    /// now), taken at `mono_ns` (the monotonic clock now).
    pub fn start(w: W, wall_epoch_ns: u128, mono_ns: u64) -> io::Result<Self> {
        Self::begin(
            w,
            TimeBase::Wall {
                epoch_ns: wall_epoch_ns,
            },
            mono_ns,
        )
    }

    /// Writes a header without StartTime or BaseTime: timestamps are seconds of
    /// `CLOCK_MONOTONIC`, and the first interval starts at `mono_ns`.
    pub fn start_monotonic(w: W, mono_ns: u64) -> io::Result<Self> {
        Self::begin(w, TimeBase::Monotonic, mono_ns)
    }

    fn begin(mut w: W, base: TimeBase, mono_ns: u64) -> io::Result<Self> {
        let base_mono_ns = match base {
            TimeBase::Wall { epoch_ns } => {
                let secs = epoch_ns as f64 / 1e9;
                writeln!(
                    w,
                    "#[Logged with Keling {} (keling run --histo-log)]",
                    env!("CARGO_PKG_VERSION")
                )?;
                writeln!(w, "{VERSION_COMMENT}")?;
                writeln!(
                    w,
                    "#[Keling decision latency: values in ns; untagged = end_to_end of all actions, \
                     Tag=STAGE of all actions, Tag=STAGE/ACTION]"
                )?;
                writeln!(
                    w,
                    "#[StartTime: {secs:.3} (seconds since epoch), {}]",
                    rfc3339((epoch_ns / 1_000_000_000) as u64)
                )?;
                writeln!(w, "#[BaseTime: {secs:.3} (seconds since epoch)]")?;
                writeln!(w, "{LEGEND}")?;
                mono_ns
            }
            TimeBase::Monotonic => {
                writeln!(w, "{VERSION_COMMENT}")?;
                writeln!(
                    w,
                    "#[Keling decision latency: values in ns, interval timestamps in s of \
                     CLOCK_MONOTONIC, untagged = end_to_end of all actions]"
                )?;
                // The line hdrhistogram's own writer adds for a max value divisor.
                writeln!(w, "#[MaxValueDivisor: {NS_PER_MS:.3}]")?;
                0
            }
        };
        w.flush()?;
        Ok(Self {
            w,
            base_mono_ns,
            next_start_ns: mono_ns,
            serializer: V2DeflateSerializer::new(),
            buf: Vec::new(),
        })
    }

    /// Appends the interval from the previous one's end to `now_mono_ns`: the model's
    /// state, the end-to-end histogram of all actions (always, empty or not) and every
    /// other histogram that recorded something. Flushes.
    pub fn append(
        &mut self,
        iv: &Interval,
        model: &TimeoutModel,
        now_mono_ns: u64,
    ) -> io::Result<()> {
        let untagged = (Stage::EndToEnd, None);
        let empty = new_histogram();
        let e2e = iv.histograms.get(&untagged).unwrap_or(&empty);
        let others = iv
            .histograms
            .iter()
            .filter(|(key, h)| **key != untagged && !h.is_empty())
            .map(|((stage, action), h)| (*stage, action.as_deref(), h));
        self.write_interval(
            &IntervalMeta::of(model, iv.decisions, iv.late),
            std::iter::once((Stage::EndToEnd, None, e2e)).chain(others),
            now_mono_ns,
        )
    }

    /// Appends one interval, from the previous one's end to `end_mono_ns`: the Keling
    /// comment with `meta`, then a line per histogram in the order given. The untagged
    /// end-to-end histogram of all actions must come first: [`read`] takes the comment
    /// just above it as its interval's. Flushes.
    pub(super) fn write_interval<'h>(
        &mut self,
        meta: &IntervalMeta,
        histograms: impl IntoIterator<Item = (Stage, Option<&'h str>, &'h Histogram<u64>)>,
        end_mono_ns: u64,
    ) -> io::Result<()> {
        let start_ns = self.next_start_ns;
        let length_ns = end_mono_ns.saturating_sub(start_ns);
        self.next_start_ns = start_ns + length_ns;
        writeln!(self.w, "{meta}")?;
        for (stage, action, h) in histograms {
            self.line(tag(stage, action).as_deref(), h, start_ns, length_ns)?;
        }
        self.w.flush()
    }

    fn line(
        &mut self,
        tag: Option<&str>,
        h: &Histogram<u64>,
        start_ns: u64,
        length_ns: u64,
    ) -> io::Result<()> {
        self.buf.clear();
        self.serializer
            .serialize(h, &mut self.buf)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        if let Some(tag) = tag {
            write!(self.w, "Tag={tag},")?;
        }
        writeln!(
            self.w,
            "{:.3},{:.3},{:.3},{}",
            seconds(start_ns.saturating_sub(self.base_mono_ns)),
            seconds(length_ns),
            h.max() as f64 / NS_PER_MS,
            base64::engine::general_purpose::STANDARD.encode(&self.buf)
        )
    }
}

/// A histogram's tag: none for end-to-end of all actions, `STAGE` for another stage of
/// all actions, `STAGE/ACTION` for one action.
fn tag(stage: Stage, action: Option<&str>) -> Option<String> {
    match action {
        None if stage == Stage::EndToEnd => None,
        None => Some(stage.as_str().to_owned()),
        Some(a) => Some(format!("{}/{}", stage.as_str(), sanitize_tag(a))),
    }
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

/// `ns` in seconds for a timestamp column: whole seconds plus the fraction, as the
/// hdrhistogram crate's writer computes them (`ns as f64` alone drops nanoseconds past
/// 2^53 ns, 104 days, and then rounds the third decimal wrongly more often).
fn seconds(ns: u64) -> f64 {
    let d = Duration::from_nanos(ns);
    d.as_secs() as f64 + f64::from(d.subsec_nanos()) / 1e9
}

/// `YYYY-MM-DDTHH:MM:SSZ` of seconds since the epoch (UTC).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// What the agent's timeout model did in one interval (the Keling comment before it).
#[derive(Clone, Debug, PartialEq)]
pub struct IntervalMeta {
    pub model: ModelKind,
    pub multiplier: f64,
    pub timeout_ns: u64,
    pub decisions: u64,
    pub late: u64,
}

impl IntervalMeta {
    /// Where `model` stands after an interval of `decisions` decisions, `late` of them late.
    pub fn of(model: &TimeoutModel, decisions: u64, late: u64) -> Self {
        IntervalMeta {
            model: model.kind(),
            multiplier: model.multiplier(),
            timeout_ns: model.timeout_ns(),
            decisions,
            late,
        }
    }
}

/// The Keling comment line before an interval; `parse_meta` reads it back.
impl fmt::Display for IntervalMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{INTERVAL_COMMENT}model={} multiplier={} timeout_ns={} decisions={} late={}]",
            self.model.as_str(),
            self.multiplier,
            self.timeout_ns,
            self.decisions,
            self.late
        )
    }
}

/// One interval read back: its end-to-end histogram over all actions.
#[derive(Clone, Debug)]
pub struct ReadInterval {
    /// Seconds since the epoch (BaseTime + the interval's timestamp).
    pub start_s: f64,
    pub length_s: f64,
    pub end_to_end: Histogram<u64>,
    pub meta: Option<IntervalMeta>,
}

/// A whole interval log read back.
pub struct ReadLog {
    /// Every interval's histograms added up, as a recorder: the exports of `keling
    /// status --export` work on it unchanged.
    pub recorder: LatencyRecorder,
    pub intervals: Vec<ReadInterval>,
    /// Headers (agent starts) seen.
    pub segments: usize,
}

/// A log that cannot be read, and where.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {what}")]
pub struct ReadError {
    pub line: usize,
    pub what: String,
}

fn line_of(input: &[u8], offset: usize) -> usize {
    input[..offset.min(input.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn parse_meta(text: &str) -> Option<IntervalMeta> {
    let body = text.strip_prefix(INTERVAL_COMMENT)?.strip_suffix(']')?;
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    for kv in body.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        fields.insert(k, v);
    }
    Some(IntervalMeta {
        model: match *fields.get("model")? {
            "static" => ModelKind::Static,
            "adaptive" => ModelKind::Adaptive,
            _ => return None,
        },
        multiplier: fields.get("multiplier")?.parse().ok()?,
        timeout_ns: fields.get("timeout_ns")?.parse().ok()?,
        decisions: fields.get("decisions")?.parse().ok()?,
        late: fields.get("late")?.parse().ok()?,
    })
}

fn parse_tag(tag: Option<&str>) -> Result<(Stage, Option<String>), String> {
    let Some(tag) = tag else {
        return Ok((Stage::EndToEnd, None));
    };
    let (stage, action) = match tag.split_once('/') {
        Some((s, a)) => (s, Some(a.to_owned())),
        None => (tag, None),
    };
    let stage = Stage::ALL
        .into_iter()
        .find(|s| s.as_str() == stage)
        .ok_or_else(|| {
            format!("tag {tag:?}: not a Keling stage (delivery, decision, actuation, confirmation, end_to_end)")
        })?;
    Ok((stage, action))
}

/// The most decisions [`ReadLog::series`] expands (16 bytes each: 160 MB), more
/// than a day of an agent deciding a hundred times a second.
pub const MAX_SERIES_DECISIONS: u64 = 10_000_000;

/// The cookies of a V2 histogram and of a compressed one (HdrHistogram's
/// encoding, as hdrhistogram 7 writes and reads them).
const V2_COOKIE: u32 = 0x1c84_9313;
const V2_COMPRESSED_COOKIE: u32 = 0x1c84_9314;

/// Deflate's largest expansion: one compressed byte inflates to at most about
/// 1032 (zlib's technical details), so more than this many bytes per
/// compressed byte is a lie.
const MAX_INFLATE_RATIO: u64 = 1032;

/// A V2 histogram states how many bytes of counts follow its header (inside
/// the compressed stream, when compressed), and hdrhistogram allocates that
/// many before reading them (7.6.0, `deser_v2`): a 138-byte log claimed 2 GiB
/// (found by `cargo xtask fuzz --target interval_log`). Refuses a claim that
/// the bytes could not hold; anything else is left to the decoder.
fn check_counts_fit(encoded: &[u8]) -> Result<(), String> {
    use std::io::Read;
    let Some((head, rest)) = encoded.split_first_chunk::<8>() else {
        return Ok(());
    };
    let cookie = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if cookie == V2_COOKIE {
        let claimed = u64::from(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
        if claimed > rest.len() as u64 {
            return Err(format!(
                "histogram does not decode: it claims {claimed} bytes of counts, more than \
                 its {} bytes",
                rest.len()
            ));
        }
        return Ok(());
    }
    if cookie != V2_COMPRESSED_COOKIE {
        return Ok(());
    }
    let compressed = rest;
    let mut inner = [0u8; 8];
    if flate2::read::ZlibDecoder::new(compressed)
        .read_exact(&mut inner)
        .is_err()
    {
        return Ok(());
    }
    let claimed = u64::from(u32::from_be_bytes([inner[4], inner[5], inner[6], inner[7]]));
    let most = (compressed.len() as u64).saturating_mul(MAX_INFLATE_RATIO);
    if claimed > most {
        return Err(format!(
            "histogram does not decode: it claims {claimed} bytes of counts, more than its \
             {} compressed bytes can hold",
            compressed.len()
        ));
    }
    Ok(())
}

/// Reads an interval log (the hdrhistogram crate's `IntervalLogIterator` parses it).
/// Every count is kept; values keep the histograms' precision. Errors name the line.
pub fn read(input: &[u8]) -> Result<ReadLog, ReadError> {
    let text = std::str::from_utf8(input).map_err(|e| ReadError {
        line: line_of(input, e.valid_up_to()),
        what: "not UTF-8 text".into(),
    })?;
    // Keling's comments, which the crate's reader skips, by line.
    let mut metas: BTreeMap<usize, IntervalMeta> = BTreeMap::new();
    let mut segments = 0;
    for (i, l) in text.lines().enumerate() {
        if l.starts_with(INTERVAL_COMMENT) {
            let meta = parse_meta(l).ok_or_else(|| ReadError {
                line: i + 1,
                what: format!("a Keling interval comment that does not parse: {l:?}"),
            })?;
            metas.insert(i + 1, meta);
        } else if l.starts_with("#[Histogram log format version") {
            segments += 1;
        }
    }
    let mut totals: BTreeMap<(Stage, Option<String>), Histogram<u64>> = BTreeMap::new();
    let mut intervals = Vec::new();
    let mut base_s = 0.0;
    let mut deserializer = Deserializer::new();
    let mut last_meta: Option<IntervalMeta> = None;
    for entry in IntervalLogIterator::new(input) {
        let entry = entry.map_err(|e| {
            let hdrhistogram::serialization::interval_log::LogIteratorError::ParseError { offset } =
                e;
            ReadError {
                line: line_of(input, offset),
                what: "not an interval log line (histogram, comment or legend)".into(),
            }
        })?;
        let h = match entry {
            LogEntry::BaseTime(t) => {
                base_s = t.as_secs_f64();
                continue;
            }
            LogEntry::StartTime(_) => continue,
            LogEntry::Interval(h) => h,
        };
        let encoded = h.encoded_histogram();
        let offset = encoded.as_ptr() as usize - input.as_ptr() as usize;
        let line = line_of(input, offset);
        let err = |what: String| ReadError { line, what };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| err(format!("histogram is not base64: {e}")))?;
        check_counts_fit(&bytes).map_err(err)?;
        let hist: Histogram<u64> = deserializer
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| err(format!("histogram does not decode: {e:?}")))?;
        let key = parse_tag(h.tag().map(|t| t.as_str())).map_err(err)?;
        let total = totals.entry(key.clone()).or_insert_with(new_histogram);
        if total.add(&hist).is_err() {
            for v in hist.iter_recorded() {
                total.saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
        if key == (Stage::EndToEnd, None) {
            let meta = metas.get(&(line - 1)).cloned();
            if meta.is_some() {
                last_meta.clone_from(&meta);
            }
            intervals.push(ReadInterval {
                start_s: base_s + h.start_timestamp().as_secs_f64(),
                length_s: h.duration().as_secs_f64(),
                end_to_end: hist,
                meta,
            });
        }
    }
    let decisions = totals
        .get(&(Stage::EndToEnd, None))
        .map_or(0, Histogram::len);
    let late = intervals
        .iter()
        .filter_map(|i| i.meta.as_ref())
        .map(|m| m.late)
        .sum();
    let model = match &last_meta {
        Some(m) => TimeoutModel::with_timeout(m.model, m.multiplier, m.timeout_ns),
        None => TimeoutModel::new(ModelKind::Adaptive),
    };
    Ok(ReadLog {
        recorder: LatencyRecorder::from_histograms(model, totals, decisions, late, BTreeMap::new()),
        intervals,
        segments,
    })
}

impl ReadLog {
    /// `(ts_ns, end_to_end_ns)` of every decision, for [`super::tune::tune_report`]: an
    /// interval's decisions are spread evenly over it, in a fixed pseudo-random order of
    /// their values. With intervals of 1 s or less (the models recompute at most once a
    /// second) this is what the live models saw, to the histograms' precision.
    ///
    /// A log holding more than [`MAX_SERIES_DECISIONS`] is an error: a histogram's
    /// counts are the file's word, and a few hundred bytes can claim billions.
    pub fn series(&self) -> Result<Vec<(u64, u64)>, String> {
        let total = self
            .intervals
            .iter()
            .map(|iv| iv.end_to_end.len())
            .fold(0u64, u64::saturating_add);
        if total > MAX_SERIES_DECISIONS {
            return Err(format!(
                "the log's intervals hold {total} decisions; tuning replays at most \
                 {MAX_SERIES_DECISIONS}: give it fewer intervals (each is a `#[Keling interval` \
                 comment and the lines after it)"
            ));
        }
        let mut out = Vec::with_capacity(total as usize);
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for iv in &self.intervals {
            let mut values: Vec<u64> = Vec::with_capacity(iv.end_to_end.len() as usize);
            for v in iv.end_to_end.iter_recorded() {
                let value = iv.end_to_end.median_equivalent(v.value_iterated_to());
                values.extend(std::iter::repeat_n(value, v.count_at_value() as usize));
            }
            // Fisher-Yates with xorshift64: the same order on every run.
            for i in (1..values.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                values.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            let n = values.len() as f64;
            let start_ns = iv.start_s * 1e9;
            let len_ns = iv.length_s * 1e9;
            for (i, v) in values.into_iter().enumerate() {
                let ts = start_ns + len_ns * (i as f64 + 0.5) / n;
                out.push((ts as u64, v));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::{DecisionTimes, Selection};

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn decision(action: &str, at: u64, e2e: u64, confirmed: bool) -> DecisionTimes {
        DecisionTimes {
            action: action.into(),
            event_ns: at,
            received_ns: at + e2e / 10,
            decided_ns: at + e2e / 5,
            actuated_ns: at + e2e / 2,
            confirmed_ns: confirmed.then_some(at + e2e),
        }
    }

    /// A recorder that logs 5 intervals of decisions, and the log it wrote.
    fn recorded() -> (LatencyRecorder, Vec<u8>) {
        let mut r = LatencyRecorder::new(ModelKind::Adaptive);
        r.keep_intervals();
        let mut log = Vec::new();
        let t0 = 100 * S;
        let mut app = IntervalLogAppender::start(&mut log, 1_764_589_102_123_000_000, t0).unwrap();
        for sec in 0..5u64 {
            for i in 0..40u64 {
                let at = t0 + sec * S + i * 20 * MS;
                let action = ["freeze", "thaw", "kill"][(i % 3) as usize];
                r.record(&decision(
                    action,
                    at,
                    (1 + i % 7) * MS + sec * 100_000,
                    i % 3 != 2,
                ));
                r.tick(at);
            }
            let iv = r.take_interval().unwrap();
            app.append(&iv, r.model(), t0 + (sec + 1) * S).unwrap();
        }
        (r, log)
    }

    #[test]
    fn header_is_the_usual_one() {
        let (_, log) = recorded();
        let text = String::from_utf8(log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("#[Logged with Keling "));
        assert_eq!(lines[1], "#[Histogram log format version 1.3]");
        assert_eq!(
            lines[3],
            "#[StartTime: 1764589102.123 (seconds since epoch), 2025-12-01T11:38:22Z]"
        );
        assert_eq!(
            lines[4],
            "#[BaseTime: 1764589102.123 (seconds since epoch)]"
        );
        assert_eq!(lines[5], LEGEND);
        assert!(lines[6].starts_with("#[Keling interval: model=adaptive multiplier=1.2 "));
        assert!(lines[7].starts_with("0.000,1.000,"), "{}", lines[7]);
        assert!(text.contains("\nTag=end_to_end/freeze,4.000,1.000,"));
    }

    #[test]
    fn the_crates_reader_reads_every_interval_and_every_count() {
        let (r, log) = recorded();
        let mut d = Deserializer::new();
        let mut untagged = 0;
        let mut e2e_count = 0;
        for e in IntervalLogIterator::new(&log) {
            let LogEntry::Interval(h) = e.unwrap() else {
                continue;
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(h.encoded_histogram())
                .unwrap();
            let hist: Histogram<u64> = d.deserialize(&mut bytes.as_slice()).unwrap();
            if h.tag().is_none() {
                untagged += 1;
                e2e_count += hist.len();
                assert_eq!(h.duration(), std::time::Duration::from_secs(1));
            }
        }
        assert_eq!(untagged, 5);
        assert_eq!(e2e_count, r.decisions());
    }

    /// Each histogram line of a log as the crate's reader gives it: (tag, start,
    /// length, max column, histogram, the line's payload).
    type Read = (
        Option<String>,
        Duration,
        Duration,
        f64,
        Histogram<u64>,
        String,
    );

    fn read_with_the_crate(log: &[u8]) -> Vec<Read> {
        let mut d = Deserializer::new();
        IntervalLogIterator::new(log)
            .filter_map(|e| match e.expect("the crate's reader parses every line") {
                LogEntry::Interval(h) => Some(h),
                LogEntry::StartTime(_) | LogEntry::BaseTime(_) => None,
            })
            .map(|h| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(h.encoded_histogram())
                    .unwrap();
                let hist: Histogram<u64> = d.deserialize(&mut bytes.as_slice()).unwrap();
                (
                    h.tag().map(|t| t.as_str().to_owned()),
                    h.start_timestamp(),
                    h.duration(),
                    h.max(),
                    hist,
                    h.encoded_histogram().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn both_uses_write_what_the_crates_reader_reads_back() {
        // One recording written both ways: appended as one interval of a live log, and
        // exported at once. Nothing confirmed (so the all-action confirmation histogram is
        // empty), some decisions late, an action name a tag cannot hold.
        let mut r = LatencyRecorder::new(ModelKind::Static);
        r.keep_intervals();
        let t0 = 100 * S;
        for i in 0..60u64 {
            let at = t0 + i * 50 * MS;
            let action = ["freeze", "thaw", "a, b"][(i % 3) as usize];
            // Unconfirmed, so the end-to-end latency is half of this: 30 ms is late.
            let e2e = if i % 7 == 0 {
                60 * MS
            } else {
                (1 + i % 5) * MS
            };
            r.record(&decision(action, at, e2e, false));
            r.tick(at);
        }
        assert!(r.late_count() > 0);
        let end = r.last_ns().unwrap();
        let mut live = Vec::new();
        let mut app = IntervalLogAppender::start(&mut live, 1_764_589_102_123_000_000, t0).unwrap();
        app.append(&r.take_interval().unwrap(), r.model(), end)
            .unwrap();
        let mut oneshot = Vec::new();
        r.write_interval_log(&mut oneshot, t0).unwrap();

        let live = (read_with_the_crate(&live), live);
        let oneshot = (read_with_the_crate(&oneshot), oneshot);
        for (stage, action, h) in r.histograms() {
            let want = tag(stage, action);
            let find = |log: &[Read]| log.iter().find(|e| e.0 == want).cloned();
            // The one-shot holds every histogram; the live log all but the empty ones
            // (end-to-end of all actions it always holds).
            let o = find(&oneshot.0).unwrap_or_else(|| panic!("{want:?} in the one-shot"));
            assert_eq!(&o.4, h, "{want:?}");
            assert!((o.3 - h.max() as f64 / 1e6).abs() < 0.001, "{want:?}");
            match find(&live.0) {
                Some(l) => {
                    assert_eq!(&l.4, h, "{want:?}");
                    // One writer: the same line but for the timestamps.
                    assert_eq!((l.3, &l.5), (o.3, &o.5), "{want:?}");
                    assert_eq!(l.1, Duration::ZERO, "live: seconds since its BaseTime");
                    assert_eq!(o.1, Duration::from_secs(100), "one-shot: monotonic seconds");
                    assert_eq!(l.2, o.2);
                    let length = Duration::from_nanos(end - t0);
                    assert!(
                        l.2.abs_diff(length) <= Duration::from_micros(500),
                        "to the ms"
                    );
                }
                None => assert!(
                    h.is_empty() && want.is_some(),
                    "{want:?} not in the live log"
                ),
            }
        }
        assert!(
            oneshot
                .0
                .iter()
                .any(|e| e.0.as_deref() == Some("confirmation") && e.4.is_empty())
        );
        assert!(
            live.0
                .iter()
                .any(|e| e.0.as_deref() == Some("end_to_end/a__b"))
        );
        assert_eq!(oneshot.0.len(), r.histograms().len());
        assert_eq!(live.0[0].0, None, "untagged end-to-end first");
        assert_eq!(oneshot.0[0].0, None, "untagged end-to-end first");

        // Both carry the model's state, so reading either back keeps it.
        for (_, log) in [&live, &oneshot] {
            let back = read(log).unwrap();
            assert_eq!(back.segments, 1);
            assert_eq!(back.intervals.len(), 1);
            let b = &back.recorder;
            assert_eq!(b.decisions(), r.decisions());
            assert_eq!(b.late_count(), r.late_count());
            assert_eq!(b.timeout_ns(), r.timeout_ns());
            assert_eq!(b.model().kind(), ModelKind::Static);
            assert_eq!(b.model().multiplier(), r.model().multiplier());
        }
    }

    #[test]
    fn import_keeps_every_count_and_the_exports_match() {
        let (r, log) = recorded();
        let back = read(&log).unwrap();
        assert_eq!(back.segments, 1);
        assert_eq!(back.intervals.len(), 5);
        let b = &back.recorder;
        assert_eq!(b.decisions(), r.decisions());
        assert_eq!(b.late_count(), r.late_count());
        assert_eq!(b.timeout_ns(), r.timeout_ns());
        for (stage, action, h) in r.histograms() {
            let p = b.percentiles(stage, action).expect("imported");
            assert_eq!(p.count, h.len(), "{stage} {action:?}");
            assert_eq!(p, r.percentiles(stage, action).unwrap());
        }
        // The tables are the same text.
        for sel in [
            Selection::default(),
            Selection {
                stage: Some(Stage::Actuation),
                action: Some("thaw".into()),
            },
        ] {
            let (mut a, mut c) = (Vec::new(), Vec::new());
            r.write_percentile_table_selected(&mut a, &sel).unwrap();
            b.write_percentile_table_selected(&mut c, &sel).unwrap();
            assert_eq!(String::from_utf8(a).unwrap(), String::from_utf8(c).unwrap());
        }
        // The series has every decision, in the log's time range.
        let series = back.series().unwrap();
        assert_eq!(series.len() as u64, r.decisions());
        let base = 1_764_589_102_123_000_000u64;
        assert!(
            series
                .iter()
                .all(|&(t, _)| t >= base - 1000 && t <= base + 5 * S)
        );
    }

    /// Found by `cargo xtask fuzz --target interval_log` (its checksums then made
    /// valid: fuzz builds skip zlib's): 1.5 kB whose histograms claim 10.6 M
    /// decisions made `series` (`keling histo tune`) expand them all, 5 s and
    /// 800 MB here; a count of 2^60 would abort. Past the cap it is refused.
    #[test]
    fn a_log_claiming_more_decisions_than_tune_replays_is_refused() {
        let bytes = include_bytes!("../../tests/fuzz-regressions/interval_log-huge-counts");
        let log = read(bytes).unwrap();
        let claimed: u64 = log.intervals.iter().map(|i| i.end_to_end.len()).sum();
        assert!(claimed > MAX_SERIES_DECISIONS, "{claimed}");
        let e = log.series().unwrap_err();
        assert!(e.contains(&format!("hold {claimed} decisions")), "{e}");
    }

    /// Found by `cargo xtask fuzz --target interval_log`: a histogram whose
    /// encoded counts hold a run of zeros of length -i64::MIN. hdrhistogram
    /// (7.6.0) negates it; built with overflow checks that panicked, so
    /// hdrhistogram is built without them in every profile, as in the release
    /// build, where the negation wraps and the decoder refuses the histogram.
    #[test]
    fn a_zero_run_of_i64_min_is_refused_not_a_panic() {
        let what = refused(include_bytes!(
            "../../tests/fuzz-regressions/interval_log-zero-run-of-i64-min"
        ));
        assert!(what.contains("does not decode"), "{what}");
    }

    /// Why `read` refuses `bytes`; fails if it reads them.
    fn refused(bytes: &[u8]) -> String {
        match read(bytes) {
            Ok(_) => panic!("a histogram that cannot be decoded was read"),
            Err(e) => e.what,
        }
    }

    /// Found by `cargo xtask fuzz --target interval_log`: 138 bytes whose
    /// histogram claims 2 GiB of counts, which hdrhistogram allocated before
    /// reading them.
    #[test]
    fn a_histogram_claiming_more_counts_than_it_holds_is_refused() {
        let what = refused(include_bytes!(
            "../../tests/fuzz-regressions/interval_log-claims-2-gib"
        ));
        assert!(what.contains("claims 2147483"), "{what}");
    }

    /// What Keling writes passes the check: its claims are what it holds.
    #[test]
    fn real_histograms_pass_the_claim_check() {
        let (_, log) = recorded();
        assert!(read(&log).is_ok());
    }

    #[test]
    fn appended_segments_read_as_one_log() {
        let (_, mut log) = recorded();
        let (_, second) = recorded();
        log.extend_from_slice(&second);
        let back = read(&log).unwrap();
        assert_eq!(back.segments, 2);
        assert_eq!(back.intervals.len(), 10);
        assert_eq!(back.recorder.decisions(), 400);
    }

    #[test]
    fn corrupt_input_names_the_line() {
        let (_, log) = recorded();
        let text = String::from_utf8(log).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        // A line that is no interval log line at all.
        let mut bad = lines.clone();
        bad.insert(9, "this is not a histogram".into());
        let e = read(bad.join("\n").as_bytes()).err().unwrap();
        assert_eq!(e.line, 10, "{e}");
        assert!(e.to_string().starts_with("line 10: "), "{e}");
        // A histogram whose payload is damaged.
        let i = lines
            .iter()
            .position(|l| l.starts_with("Tag=delivery"))
            .unwrap();
        lines[i] = lines[i].replace("HISTF", "HISTx");
        let e = read((lines.join("\n") + "\n").as_bytes()).err().unwrap();
        assert_eq!(e.line, i + 1, "{e}");
        // A tag that names no stage.
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let i = lines
            .iter()
            .position(|l| l.starts_with("Tag=delivery"))
            .unwrap();
        lines[i] = lines[i].replace("Tag=delivery", "Tag=nonsense");
        let e = read((lines.join("\n") + "\n").as_bytes()).err().unwrap();
        assert_eq!(e.line, i + 1, "{e}");
        assert!(e.to_string().contains("nonsense"), "{e}");
        // A Keling comment that does not parse.
        let e = read(b"#[Keling interval: model=what]\n").err().unwrap();
        assert_eq!(e.line, 1);
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
    }
}
