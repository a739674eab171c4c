//! The scheduler's two logs: the scheduling log (one JSON line per task state
//! transition, placement, warning, enforcement record and late decision) and the
//! input log (every scheduler input, so `keling replay` can re-run the decisions).
//! What a line holds is [`crate::log_format`]'s (the readers use the same types);
//! this module only writes the files.
//!
//! A write error is reported once and never stops the agent. Each log is bounded:
//! at `max_bytes` it is renamed to `FILE.1` (replacing the one before) and a new
//! one is started, so a long-running agent holds at most twice that on disk per
//! log. Files that are not regular files (a pipe, `/dev/null`) are never rotated.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context;

use crate::os::files::{self, open_for_writing};
use keling_sched::{Input, Transition};
use serde::Serialize;

use crate::log_format::{InputLogHeader, Record, TransitionLine};

/// A JSON-lines file that reports its first write error, keeps going, and
/// rotates at a size.
struct Lines {
    out: BufWriter<File>,
    path: PathBuf,
    /// 0: never rotate.
    max_bytes: u64,
    written: u64,
    failed: bool,
    /// Written first in every file (the input log's header), again after a rotation.
    header: Option<Vec<u8>>,
}

impl Lines {
    fn create(path: &Path, max_bytes: u64) -> anyhow::Result<Self> {
        let file = open_for_writing(path, files::Write::Truncate)
            .with_context(|| format!("create {}", path.display()))?;
        let regular = file.metadata().is_ok_and(|m| m.is_file());
        Ok(Self {
            out: BufWriter::new(file),
            path: path.to_owned(),
            max_bytes: if regular { max_bytes } else { 0 },
            written: 0,
            failed: false,
            header: None,
        })
    }

    /// Makes `v` the first line of this file (written now) and of every file after a
    /// rotation.
    fn set_header(&mut self, v: &impl Serialize) {
        match serde_json::to_vec(v) {
            Ok(mut line) => {
                line.push(b'\n');
                let r = self.out.write_all(&line);
                self.written += line.len() as u64;
                self.check(r);
                self.header = Some(line);
            }
            Err(e) => self.check(Err(e.into())),
        }
    }

    fn write(&mut self, v: &impl Serialize) {
        let mut line = match serde_json::to_vec(v) {
            Ok(l) => l,
            Err(e) => return self.check(Err(e.into())),
        };
        line.push(b'\n');
        let r = self.out.write_all(&line);
        self.written += line.len() as u64;
        self.check(r);
        if self.max_bytes > 0 && self.written >= self.max_bytes {
            self.rotate();
        }
    }

    /// `FILE` becomes `FILE.1`; a new `FILE` is started.
    fn rotate(&mut self) {
        let r = self.out.flush();
        self.check(r);
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        let r = std::fs::rename(&self.path, &old)
            .and_then(|()| open_for_writing(&self.path, files::Write::Truncate));
        match r {
            Ok(file) => {
                self.out = BufWriter::new(file);
                self.written = 0;
                if let Some(line) = &self.header {
                    let r = self.out.write_all(line);
                    self.written = line.len() as u64;
                    self.check(r);
                }
            }
            Err(e) => {
                // Keep writing where we are; try again at the next bound.
                self.written = 0;
                self.check(Err(e));
            }
        }
    }

    fn flush(&mut self) {
        let r = self.out.flush();
        self.check(r);
    }

    fn check(&mut self, r: std::io::Result<()>) {
        match r {
            Err(e) if !self.failed => {
                self.failed = true;
                log::warn!(
                    "cannot write {}: {e}; the agent carries on without it",
                    self.path.display()
                );
            }
            Ok(()) if self.failed && self.out.buffer().is_empty() => {
                self.failed = false;
                log::info!("writing {} again", self.path.display());
            }
            _ => {}
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
    /// Opens the logs asked for, unbounded.
    pub fn open(sched: Option<&Path>, input: Option<&Path>) -> anyhow::Result<Self> {
        Self::open_bounded(sched, input, 0)
    }

    /// Opens the logs asked for, each rotating at `max_bytes` (0: never).
    pub fn open_bounded(
        sched: Option<&Path>,
        input: Option<&Path>,
        max_bytes: u64,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            sched: sched.map(|p| Lines::create(p, max_bytes)).transpose()?,
            input: input.map(|p| Lines::create(p, max_bytes)).transpose()?,
        })
    }

    /// Starts the input log (and each file after a rotation) with `header`: the
    /// policy and configuration `keling replay` needs to reproduce the decisions.
    pub fn input_header(&mut self, header: &InputLogHeader) {
        if let Some(l) = &mut self.input {
            l.set_header(header);
        }
    }

    pub fn input(&mut self, input: &Input) {
        if let Some(l) = &mut self.input {
            l.write(input);
        }
    }

    pub fn transition(&mut self, t: &Transition) {
        if let Some(l) = &mut self.sched {
            l.write(&TransitionLine::from(t));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_rotates_at_its_bound_and_keeps_one_old_file() {
        let dir = std::env::temp_dir().join(format!("keling-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sched.jsonl");
        let mut l = Lines::create(&path, 100).unwrap();
        for i in 0..50u32 {
            l.write(&serde_json::json!({ "i": i, "pad": "xxxxxxxxxx" }));
        }
        l.flush();
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.join("sched.jsonl.1")).unwrap();
        assert!(now.len() < 100 && old.len() >= 100, "{now:?} {old:?}");
        assert!(now.lines().last().unwrap().contains("\"i\":49"));
        assert!(!dir.join("sched.jsonl.2").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_errors_are_survived_and_not_rotated_away() {
        // /dev/full: every write fails with ENOSPC; not a regular file.
        let mut l = Lines::create(Path::new("/dev/full"), 10).unwrap();
        assert_eq!(l.max_bytes, 0);
        for i in 0..10_000u32 {
            l.write(&serde_json::json!({ "i": i }));
        }
        l.flush();
        assert!(l.failed);
    }
}
