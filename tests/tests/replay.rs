//! `keling replay`: a synthetic run's logs (written with the agent's own
//! scheduling-log writer) replay exactly, with and without the input log's header;
//! a tampered scheduling log is caught; what-if runs under other policies report
//! what would have happened. Speed is printed (`--stats`), never asserted.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use keling_agent::replay::{
    exact::{self, Reproduction},
    log::{InputLogReader, read_sched_log},
    synthetic::{Placement, RunLogs, SyntheticOptions, run, workload},
    what_if::{self, WhatIfOptions},
};
use keling_sched::Policy;

/// A small but busy run: two GPUs near full load, so jobs queue, preempt and rotate.
fn options() -> SyntheticOptions {
    SyntheticOptions {
        gpus: 2,
        hours: 2.0,
        load: 0.95,
        seed: 7,
        // Coarser than the agent's 10 ms: the test's time goes to replaying.
        tick_ms: 50,
        ..SyntheticOptions::default()
    }
}

struct Logs {
    dir: PathBuf,
    input: PathBuf,
    sched: PathBuf,
}

impl Drop for Logs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn recorded(policy: Policy) -> Logs {
    let dir = keling_tests::tempdir();
    let logs = Logs {
        input: dir.join("input.jsonl"),
        sched: dir.join("sched.jsonl"),
        dir,
    };
    let opts = options();
    run(
        &opts,
        &workload(&opts),
        policy,
        Placement::Weighted,
        &RunLogs {
            input_log: Some(logs.input.clone()),
            sched_log: Some(logs.sched.clone()),
        },
    )
    .unwrap();
    logs
}

fn reproduce(input: &Path, sched: &Path) -> Reproduction {
    let reader = InputLogReader::open(input).unwrap();
    let header = reader.header.clone().expect("synthetic logs have a header");
    let recorded = exact::recorded_decisions(&read_sched_log(sched).unwrap());
    exact::replay(reader, header.config, header.policy, Some(&recorded)).unwrap()
}

#[test]
fn every_policy_replays_its_own_recording_exactly() {
    for policy in Policy::ALL {
        let logs = recorded(policy);
        let r = reproduce(&logs.input, &logs.sched);
        let c = r.comparison.unwrap();
        assert!(
            c.recorded > 100,
            "{policy}: a busy run ({} decisions)",
            c.recorded
        );
        assert_eq!(
            (c.matched, c.replayed, c.match_rate, c.first_difference),
            (c.recorded, c.recorded, 1.0, None),
            "{policy}"
        );
        assert_eq!(r.policy, policy);
        if policy == Policy::Hybrid {
            assert!(r.summary.preemptions > 0, "the hybrid run preempts");
        }
    }
}

#[test]
fn a_changed_decision_is_caught_and_located() {
    let logs = recorded(Policy::Hybrid);
    let text = std::fs::read_to_string(&logs.sched).unwrap();
    // Change the GPU of the first placement record.
    let at = text.find(r#""type":"placement""#).unwrap();
    let line_end = at + text[at..].find('\n').unwrap();
    let line = &text[text[..at].rfind('\n').map_or(0, |n| n + 1)..line_end];
    let changed = if line.contains(r#""gpu":0"#) {
        line.replace(r#""gpu":0"#, r#""gpu":1"#)
    } else {
        line.replace(r#""gpu":1"#, r#""gpu":0"#)
    };
    let tampered = logs.dir.join("tampered.jsonl");
    std::fs::write(&tampered, text.replacen(line, &changed, 1)).unwrap();
    let c = reproduce(&logs.input, &tampered).comparison.unwrap();
    assert_eq!(c.matched, c.recorded - 1);
    assert!(c.match_rate < 1.0);
    let d = c.first_difference.expect("where they differ");
    assert!(
        d.recorded.unwrap().starts_with("Placement"),
        "the changed line"
    );
}

#[test]
fn what_if_compares_policies_on_a_recording() {
    let logs = recorded(Policy::Hybrid);
    let header = InputLogReader::open(&logs.input).unwrap().header.unwrap();
    let what_if = |policy| {
        what_if::replay(
            InputLogReader::open(&logs.input).unwrap(),
            header.config.clone(),
            policy,
            WhatIfOptions::default(),
        )
        .unwrap()
    };
    let fifo = what_if(Policy::Fifo);
    let hybrid = what_if(Policy::Hybrid);
    assert_eq!(fifo.summary.preemptions, 0, "FIFO never preempts");
    assert!(hybrid.summary.preemptions > 0);
    assert_eq!(
        fifo.recorded_inputs, hybrid.recorded_inputs,
        "the same recording"
    );
    // Real-time tasks never wait longer under the hybrid policy than under FIFO.
    let rt_wait = |s: &keling_agent::replay::Summary| -> f64 {
        s.per_task
            .iter()
            .filter(|d| d.priority <= 2)
            .map(|d| d.queueing_delay_ms)
            .sum()
    };
    assert!(rt_wait(&hybrid.summary) <= rt_wait(&fifo.summary));
    assert_eq!(hybrid.summary.gpus.len(), 2);
    assert!(hybrid.summary.load_balance_error.is_finite());
}

/// The command line, when the binary is there: exact replay of the agent's format
/// (no header: the config comes from the flags), exit code 2 on a mismatch, a
/// what-if, and the speed line.
#[test]
fn keling_replay_command_line() {
    let Some(bin) = keling_bin() else {
        return;
    };
    let logs = recorded(Policy::Hybrid);
    // The agent's own input log has no header: drop it and give the flags.
    let text = std::fs::read_to_string(&logs.input).unwrap();
    let headerless = logs.dir.join("agent-input.jsonl");
    std::fs::write(&headerless, &text[text.find('\n').unwrap() + 1..]).unwrap();
    let gib80 = (80u64 << 30).to_string();
    let keling = |args: &[&str]| {
        let out = Command::new(&bin)
            .arg("replay")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = keling(&[
        headerless.to_str().unwrap(),
        "--sched-log",
        logs.sched.to_str().unwrap(),
        "--gpu-capacity",
        &format!("0={gib80}"),
        "--gpu-capacity",
        &format!("1={gib80}"),
        // The recording placed at arrival (`weighted`); the agent binds late
        // by default.
        "--binding",
        "at-arrival",
        "--stats",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("match rate 100.0000%"), "{stdout}");
    assert!(stderr.contains("has no header"), "{stderr}");
    assert!(
        stdout.contains("stats:") && stdout.contains("inputs/s"),
        "{stdout}"
    );

    // The wrong config (the agent's default late binding, for a recording
    // placed at arrival) is a different run: not reproduced, exit 2.
    let (code, stdout, _) = keling(&[
        headerless.to_str().unwrap(),
        "--sched-log",
        logs.sched.to_str().unwrap(),
        "--gpu-capacity",
        &format!("0={gib80}"),
        "--gpu-capacity",
        &format!("1={gib80}"),
    ]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("NOT REPRODUCED"), "{stdout}");

    let (code, stdout, _) = keling(&[logs.input.to_str().unwrap(), "--policy", "rr", "--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["policy"], "round_robin");
    assert!(v["summary"]["queueing_delay_ms"]["p99"].is_number());
}

/// `$KELING_BIN`, else a `keling` built next to this test; a skip when neither.
fn keling_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("KELING_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("keling"))
        })?;
    if bin.exists() {
        Some(bin)
    } else {
        keling_tests::skip(
            "keling_replay_command_line",
            "no keling binary (cargo xtask test builds one; or set KELING_BIN)",
        );
        None
    }
}
