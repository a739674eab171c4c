//! The scheduler's two logs: the scheduling log (one JSON line per task state
//! transition, placement, warning, enforcement record and late decision) and the
//! input log (every scheduler input, so `keling replay` can re-run the decisions).
//!
//! A write error is reported once and never stops the agent.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::Context;
use keling_sched::{EnforcementRecord, Input, TaskId, Transition};
use serde::Serialize;

/// One line of the scheduling log that is not a transition.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record<'a> {
    Placement {
        task: TaskId,
        pid: u32,
        gpu: u32,
        timestamp_ns: u64,
    },
    Warning {
        task: TaskId,
        pid: u32,
        remaining_ms: u64,
        timestamp_ns: u64,
    },
    Enforcement {
        task: TaskId,
        pid: u32,
        timestamp_ns: u64,
        record: &'a EnforcementRecord,
    },
    LateDecision {
        task: TaskId,
        action: &'a str,
        end_to_end_ns: u64,
        timeout_ns: u64,
        confirmed: bool,
    },
}

/// A transition as the scheduling log writes it.
#[derive(Serialize)]
struct TransitionLine<'a> {
    event_id: u64,
    state_transition: String,
    timestamp_ns: u64,
    task: TaskId,
    name: &'a str,
    pid: u32,
    gpu: Option<u32>,
    priority: u8,
    reason: keling_sched::Reason,
    exit_code: Option<i32>,
}

/// A JSON-lines file that reports its first write error and keeps going.
struct Lines {
    out: BufWriter<File>,
    path: String,
    failed: bool,
}

impl Lines {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let out = File::create(path)
            .map(BufWriter::new)
            .with_context(|| format!("create {}", path.display()))?;
        Ok(Self {
            out,
            path: path.display().to_string(),
            failed: false,
        })
    }

    fn write(&mut self, v: &impl Serialize) {
        let r = serde_json::to_writer(&mut self.out, v)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        self.check(r);
    }

    fn flush(&mut self) {
        let r = self.out.flush();
        self.check(r);
    }

    fn check(&mut self, r: std::io::Result<()>) {
        if let Err(e) = r
            && !self.failed
        {
            self.failed = true;
            log::warn!("cannot write {}: {e}; the agent carries on", self.path);
        }
    }
}

/// Both logs (each optional).
#[derive(Default)]
pub struct Logs {
    sched: Option<Lines>,
    input: Option<Lines>,
}

impl Logs {
    pub fn open(sched: Option<&Path>, input: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Self {
            sched: sched.map(Lines::create).transpose()?,
            input: input.map(Lines::create).transpose()?,
        })
    }

    pub fn input(&mut self, input: &Input) {
        if let Some(l) = &mut self.input {
            l.write(input);
        }
    }

    pub fn transition(&mut self, t: &Transition) {
        if let Some(l) = &mut self.sched {
            l.write(&TransitionLine {
                event_id: t.event_id,
                state_transition: t.state_transition(),
                timestamp_ns: t.timestamp_ns,
                task: t.task,
                name: &t.name,
                pid: t.pid,
                gpu: t.gpu,
                priority: t.priority,
                reason: t.reason,
                exit_code: t.exit_code,
            });
        }
    }

    pub fn record(&mut self, r: &Record) {
        if let Some(l) = &mut self.sched {
            l.write(r);
        }
    }

    pub fn flush(&mut self) {
        for l in [&mut self.sched, &mut self.input].into_iter().flatten() {
            l.flush();
        }
    }
}
