//! Reading the agent's two logs back, typed: the input log (one serde [`Input`] a
//! line, with an optional first-line [`InputLogHeader`] that carries the
//! [`keling_sched::SchedConfig`] and [`keling_sched::Policy`] that recorded it),
//! and the scheduling log (its lines are [`crate::log_format`]'s types, as
//! `sched/log_writer.rs` writes them).
//!
//! [`Decision`] is what replay compares: the part of the scheduling log the core
//! decides (transitions, placements, warnings, enforcement records), without the
//! agent's own clock readings (records' `timestamp_ns` are the agent's monotonic
//! clock at decision time, not the core's) and without late-decision records
//! (they are measurements, not decisions).
use std::{
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use keling_sched::{Action, Input, Output, TaskId, TaskState, Transition};

use crate::log_format::{INPUT_LOG_VERSION, InputLogHeader, Record, SchedLine};

/// Reads an input log a line at a time, reusing one buffer.
pub struct InputLogReader {
    lines: BufReader<File>,
    buf: Vec<u8>,
    path: PathBuf,
    line_no: u64,
    /// The header, when the first line was one.
    pub header: Option<InputLogHeader>,
    first: Option<Input>,
}

impl InputLogReader {
    /// Opens `path` and reads its header if it has one.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
        let mut reader = InputLogReader {
            lines: BufReader::with_capacity(1 << 20, file),
            buf: Vec::with_capacity(512),
            path: path.to_owned(),
            line_no: 0,
            header: None,
            first: None,
        };
        if reader.read_line()? {
            let line = trim(&reader.buf);
            if line.starts_with(b"{\"keling_input_log\"") {
                let header: InputLogHeader = serde_json::from_slice(line)
                    .with_context(|| format!("{}:1: bad header", path.display()))?;
                if header.keling_input_log != INPUT_LOG_VERSION {
                    bail!(
                        "{}:1: input log version {} (this keling reads {INPUT_LOG_VERSION})",
                        path.display(),
                        header.keling_input_log
                    );
                }
                reader.header = Some(header);
            } else if !line.is_empty() {
                reader.first = Some(reader.parse()?);
            }
        }
        Ok(reader)
    }

    fn read_line(&mut self) -> anyhow::Result<bool> {
        self.buf.clear();
        self.line_no += 1;
        let n = self
            .lines
            .read_until(b'\n', &mut self.buf)
            .with_context(|| format!("read {}", self.path.display()))?;
        Ok(n > 0)
    }

    fn parse(&self) -> anyhow::Result<Input> {
        serde_json::from_slice(trim(&self.buf)).with_context(|| {
            format!(
                "{}:{}: not a scheduler input: {}",
                self.path.display(),
                self.line_no,
                String::from_utf8_lossy(trim(&self.buf))
            )
        })
    }

    /// The next input; `None` at the end. Blank lines are skipped; a line that is
    /// not an input is an error naming the file and line.
    pub fn next_input(&mut self) -> anyhow::Result<Option<Input>> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            if !trim(&self.buf).is_empty() {
                return self.parse().map(Some);
            }
        }
    }

    /// Every remaining input.
    pub fn read_all(mut self) -> anyhow::Result<(Option<InputLogHeader>, Vec<Input>)> {
        let mut inputs = Vec::new();
        while let Some(input) = self.next_input()? {
            inputs.push(input);
        }
        Ok((self.header, inputs))
    }
}

impl Iterator for InputLogReader {
    type Item = anyhow::Result<Input>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_input().transpose()
    }
}

fn trim(line: &[u8]) -> &[u8] {
    line.trim_ascii()
}

/// Writes an input log with a header, the way synthetic runs record theirs.
pub struct InputLogWriter {
    out: BufWriter<File>,
}

impl InputLogWriter {
    pub fn create(path: &Path, header: &InputLogHeader) -> anyhow::Result<Self> {
        let file = crate::os::files::open_for_writing(path, crate::os::files::Write::Truncate)
            .with_context(|| format!("create {}", path.display()))?;
        let mut w = InputLogWriter {
            out: BufWriter::with_capacity(1 << 20, file),
        };
        serde_json::to_writer(&mut w.out, header)?;
        w.out.write_all(b"\n")?;
        Ok(w)
    }

    pub fn input(&mut self, input: &Input) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, input)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// Every line of a scheduling log; an unreadable line is an error naming it.
pub fn read_sched_log(path: &Path) -> anyhow::Result<Vec<SchedLine>> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut lines = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}:{}: not a scheduling log line: {line}",
                path.display(),
                n + 1
            )
        })?;
        lines.push(parsed);
    }
    Ok(lines)
}

/// What the core decided, as the scheduling log shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Decision {
    Transition {
        event_id: u64,
        task: TaskId,
        pid: u32,
        gpu: Option<u32>,
        priority: u8,
        from: TaskState,
        to: TaskState,
        reason: &'static str,
        timestamp_ns: u64,
        exit_code: Option<i32>,
    },
    Placement {
        task: TaskId,
        gpu: u32,
    },
    Warning {
        task: TaskId,
        remaining_ms: u64,
    },
    Enforcement {
        task: TaskId,
        allowed_ms: u64,
        actual_ms: u64,
    },
}

impl Decision {
    /// The decision a scheduling-log line records; `None` for late decisions and
    /// for a transition whose states have no name.
    pub fn of_line(line: &SchedLine) -> Option<Decision> {
        Some(match line {
            SchedLine::Transition(t) => {
                let (from, to) = t.states()?;
                Decision::Transition {
                    event_id: t.event_id,
                    task: t.task,
                    pid: t.pid,
                    gpu: t.gpu,
                    priority: t.priority,
                    from,
                    to,
                    reason: t.reason.as_str(),
                    timestamp_ns: t.timestamp_ns,
                    exit_code: t.exit_code,
                }
            }
            SchedLine::Record(Record::Placement { task, gpu, .. }) => Decision::Placement {
                task: *task,
                gpu: *gpu,
            },
            SchedLine::Record(Record::Warning {
                task, remaining_ms, ..
            }) => Decision::Warning {
                task: *task,
                remaining_ms: *remaining_ms,
            },
            SchedLine::Record(Record::Enforcement { task, record, .. }) => Decision::Enforcement {
                task: *task,
                allowed_ms: record.data.allowed_ms,
                actual_ms: record.data.actual_ms,
            },
            SchedLine::Record(Record::LateDecision { .. } | Record::Other) => return None,
        })
    }

    fn of_transition(t: &Transition) -> Decision {
        Decision::Transition {
            event_id: t.event_id,
            task: t.task,
            pid: t.pid,
            gpu: t.gpu,
            priority: t.priority,
            from: t.from,
            to: t.to,
            reason: t.reason.as_str(),
            timestamp_ns: t.timestamp_ns,
            exit_code: t.exit_code,
        }
    }

    /// The decisions of one output, in the order the agent logs them: the
    /// transitions, then the records of its actions. The agent logs an action's
    /// record only for tasks it still knows, which every action the core emits
    /// names.
    pub fn of_output(out: &Output, into: &mut Vec<Decision>) {
        into.extend(out.transitions.iter().map(Decision::of_transition));
        for a in &out.actions {
            match a {
                Action::Place { id, gpu } => into.push(Decision::Placement {
                    task: *id,
                    gpu: *gpu,
                }),
                Action::Warn { id, remaining_ms } => into.push(Decision::Warning {
                    task: *id,
                    remaining_ms: *remaining_ms,
                }),
                Action::Enforce { id, record } => into.push(Decision::Enforcement {
                    task: *id,
                    allowed_ms: record.data.allowed_ms,
                    actual_ms: record.data.actual_ms,
                }),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use keling_sched::{GpuInfo, Policy, SchedConfig, Scheduler, TaskSpec};

    use super::*;
    use crate::sched::log_writer::Logs;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("keling-replay-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    fn spec(id: TaskId, priority: u8) -> TaskSpec {
        TaskSpec {
            id,
            pid: 100 + id as u32,
            name: format!("job \"{id}\""),
            priority,
            gpu: Some(0),
            mem_quota_bytes: None,
            max_duration_ms: Some(1_000),
            grace_ms: Some(400),
            hard_kill: None,
            expected_runtime_ms: None,
        }
    }

    /// What the agent's writer (`sched::log_writer::Logs`) writes, this reader reads back
    /// as the same decisions the core made.
    #[test]
    fn the_agents_scheduling_log_reads_back_as_the_cores_decisions() {
        let path = temp("sched.jsonl");
        let mut logs = Logs::open(Some(&path), None).unwrap();
        let mut sched = Scheduler::new(SchedConfig {
            gpus: vec![GpuInfo {
                index: 0,
                capacity_bytes: 1 << 30,
            }],
            ..SchedConfig::default()
        });
        let inputs = [
            Input::Arrive {
                spec: spec(1, 9),
                ts_ns: 1_000,
            },
            Input::Arrive {
                spec: spec(2, 1),
                ts_ns: 2_000,
            },
            Input::Confirmed {
                id: 1,
                action: keling_sched::ActionKind::Freeze,
                ts_ns: 3_000,
            },
            Input::Tick { ts_ns: 700_000_000 },
            Input::Tick {
                ts_ns: 1_100_000_000,
            },
            Input::Exit {
                id: 2,
                exit_code: 137,
                ts_ns: 1_200_000_000,
            },
        ];
        let mut want = Vec::new();
        for input in &inputs {
            let out = sched.step(input);
            for t in &out.transitions {
                logs.transition(t);
            }
            for a in &out.actions {
                match a {
                    Action::Place { id, gpu } => logs.record(&Record::Placement {
                        task: *id,
                        pid: 0,
                        gpu: *gpu,
                        timestamp_ns: 5,
                    }),
                    Action::Warn { id, remaining_ms } => logs.record(&Record::Warning {
                        task: *id,
                        pid: 0,
                        remaining_ms: *remaining_ms,
                        timestamp_ns: 5,
                    }),
                    Action::Enforce { id, record } => logs.record(&Record::Enforcement {
                        task: *id,
                        pid: 0,
                        timestamp_ns: 5,
                        record: record.clone(),
                    }),
                    _ => {}
                }
            }
            Decision::of_output(&out, &mut want);
        }
        logs.record(&Record::LateDecision {
            task: 1,
            action: "freeze".into(),
            end_to_end_ns: 30_000_000,
            timeout_ns: 23_800_000,
            confirmed: true,
        });
        logs.flush();
        drop(logs);
        let lines = read_sched_log(&path).unwrap();
        let got: Vec<Decision> = lines.iter().filter_map(Decision::of_line).collect();
        assert_eq!(got, want);
        assert!(
            want.iter().any(|d| matches!(d, Decision::Warning { .. }))
                && want
                    .iter()
                    .any(|d| matches!(d, Decision::Enforcement { .. })),
            "the run covers warnings and enforcement: {want:?}"
        );
        let newer = temp("newer.jsonl");
        std::fs::write(&newer, "{\"type\":\"heartbeat\",\"ts_ns\":1}\n").unwrap();
        assert_eq!(
            read_sched_log(&newer).unwrap(),
            [SchedLine::Record(Record::Other)]
        );
        assert!(matches!(
            lines.last(),
            Some(SchedLine::Record(Record::LateDecision {
                end_to_end_ns: 30_000_000,
                ..
            }))
        ));
    }

    #[test]
    fn input_logs_read_with_and_without_a_header() {
        let inputs = vec![
            Input::Arrive {
                spec: spec(1, 3),
                ts_ns: 1,
            },
            Input::Tick { ts_ns: 2 },
        ];
        let header = InputLogHeader {
            keling_input_log: INPUT_LOG_VERSION,
            policy: Policy::Fifo,
            config: SchedConfig {
                slots_per_gpu: 3,
                ..SchedConfig::default()
            },
            core_rules: Some(keling_sched::RULES_REVISION),
        };
        let with = temp("with.jsonl");
        let mut w = InputLogWriter::create(&with, &header).unwrap();
        for i in &inputs {
            w.input(i).unwrap();
        }
        w.finish().unwrap();
        let (h, got) = InputLogReader::open(&with).unwrap().read_all().unwrap();
        assert_eq!((h, got), (Some(header.clone()), inputs.clone()));

        // A header written before the core's rules revision was recorded.
        let old = temp("old-header.jsonl");
        let line = serde_json::to_string(&header).unwrap();
        let rules = format!(",\"core_rules\":{}", keling_sched::RULES_REVISION);
        assert!(line.ends_with(&format!("{rules}}}")), "{line}");
        let line = line.replace(&rules, "");
        std::fs::write(&old, format!("{line}\n{{\"Tick\":{{\"ts_ns\":2}}}}\n")).unwrap();
        let (h, _) = InputLogReader::open(&old).unwrap().read_all().unwrap();
        assert_eq!(
            h,
            Some(InputLogHeader {
                core_rules: None,
                ..header.clone()
            })
        );

        // The agent's own format: one input a line, no header, maybe blank lines.
        let without = temp("without.jsonl");
        let text: String = inputs
            .iter()
            .map(|i| serde_json::to_string(i).unwrap() + "\n\n")
            .collect();
        std::fs::write(&without, text).unwrap();
        let (h, got) = InputLogReader::open(&without).unwrap().read_all().unwrap();
        assert_eq!((h, got), (None, inputs));

        std::fs::write(&without, "{\"Tick\":{\"ts_ns\":1}}\n{\"Tock\":{}}\n").unwrap();
        let err = InputLogReader::open(&without)
            .unwrap()
            .read_all()
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("without.jsonl:2: not a scheduler input"),
            "{err:#}"
        );
    }

    /// Every input-log file the agent's writer (`sched::log_writer::Logs`) starts, the
    /// rotated one and the new one, begins with the header, and this reader finds it
    /// there.
    #[test]
    fn every_input_log_file_starts_with_its_header() {
        let dir = std::env::temp_dir().join(format!("keling-hdr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("input.jsonl");
        let header = InputLogHeader {
            keling_input_log: INPUT_LOG_VERSION,
            policy: Policy::Hybrid,
            config: SchedConfig {
                slots_per_gpu: 3,
                ..Default::default()
            },
            core_rules: Some(keling_sched::RULES_REVISION),
        };
        let mut logs = Logs::open_bounded(None, Some(&path), 2000).unwrap();
        logs.input_header(&header);
        let mut n = 0u64;
        while !dir.join("input.jsonl.1").exists() || n < 100 {
            n += 1;
            logs.input(&Input::Tick { ts_ns: n });
        }
        logs.flush();
        let mut ticks = 0;
        for file in [dir.join("input.jsonl.1"), path.clone()] {
            let (h, inputs) = InputLogReader::open(&file).unwrap().read_all().unwrap();
            assert_eq!(h.as_ref(), Some(&header), "{}", file.display());
            ticks += inputs.len() as u64;
        }
        assert!(ticks > 0 && ticks <= n);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
