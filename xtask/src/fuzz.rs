//! `cargo xtask fuzz`: builds the libFuzzer targets of `fuzz/` (a workspace of
//! their own) with nightly, coverage instrumentation and AddressSanitizer, and
//! runs each for a while. A crash fails the command; libFuzzer saves its input
//! under `fuzz/artifacts/<target>/`.
//!
//! No cargo-fuzz: nightly cargo with the flags cargo-fuzz passes does the same,
//! and `cargo xtask setup` already installs nightly (for the eBPF programs).
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

use crate::root;

/// Every target, as `fuzz/Cargo.toml` names its bins.
pub const TARGETS: &[&str] = &[
    "control_request",
    "config_toml",
    "ring_record",
    "input_log",
    "sched_log",
    "interval_log",
    "nvsim_ioctl",
];

/// The host triple the targets build for: named, so RUSTFLAGS do not reach
/// build scripts and proc-macros (as cargo-fuzz does).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// cargo-fuzz's flags for libFuzzer's coverage (sancov, 8-bit counters,
/// compare tracing) and AddressSanitizer. Debug assertions and overflow checks
/// (a wrapped length is a bug too) are set in fuzz/Cargo.toml's profile, so
/// that one crate can be built as the release build does.
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing -Zsanitizer=address -Cforce-frame-pointers";

fn fuzz_dir() -> PathBuf {
    root().join("fuzz")
}

fn binary(target: &str) -> PathBuf {
    fuzz_dir()
        .join("target")
        .join(TRIPLE)
        .join("release")
        .join(target)
}

/// Builds the targets (all of them: one cargo run shares the dependencies).
fn build() -> anyhow::Result<()> {
    eprintln!("xtask: building the fuzz targets (nightly, libFuzzer, AddressSanitizer)");
    let mut c = crate::cargo_nightly();
    c.args(["build", "--release", "--bins", "--target", TRIPLE])
        .arg("--manifest-path")
        .arg(fuzz_dir().join("Cargo.toml"))
        .env("RUSTFLAGS", RUSTFLAGS)
        // The parsers need no eBPF object: the agent builds without its programs.
        .env("AYA_BUILD_SKIP", "1")
        .env_remove("KELING_EBPF_OBJ")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    crate::run(&mut c)
}

/// Type-checks the targets (nightly, no instrumentation): the fuzz crate is
/// outside the workspace, so nothing else notices when a change to the parsers'
/// types breaks a target (`cargo xtask test` runs this with its lints).
pub fn check() -> anyhow::Result<()> {
    eprintln!("xtask: the fuzz targets type-check (cargo check, nightly)");
    let mut c = crate::cargo_nightly();
    c.args(["check", "--bins", "--target", TRIPLE])
        .arg("--manifest-path")
        .arg(fuzz_dir().join("Cargo.toml"))
        .env("RUSTFLAGS", "--cfg fuzzing")
        .env("AYA_BUILD_SKIP", "1")
        .env_remove("KELING_EBPF_OBJ")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    crate::run(&mut c)
}

/// What one target's run came to.
struct Outcome {
    target: &'static str,
    execs: Option<u64>,
    corpus: usize,
    /// Crash, leak, timeout or OOM inputs libFuzzer saved in this run.
    crashes: Vec<PathBuf>,
    ok: bool,
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn run_target(target: &'static str, seconds: u64) -> anyhow::Result<Outcome> {
    let seeds = fuzz_dir().join("corpus").join(target);
    // New inputs go to the first corpus directory: kept out of git, beside the build.
    let work = fuzz_dir().join("target/corpus").join(target);
    let artifacts = fuzz_dir().join("artifacts").join(target);
    for d in [&work, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let before = files_in(&artifacts);
    eprintln!("xtask: fuzzing {target} for {seconds} s");
    let mut c = Command::new(binary(target));
    c.arg(&work)
        .arg(&seeds)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args([
            "-print_final_stats=1",
            // A hostile input must not hang the parser or blow up its memory.
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-malloc_limit_mb=2048",
        ])
        // Leaks are not what these targets look for, and a runtime held in a
        // static for the process's life reads as one at exit.
        .env("ASAN_OPTIONS", "detect_leaks=0:allocator_may_return_null=1")
        .current_dir(root())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .with_context(|| format!("start {}", binary(target).display()))?;
    let mut execs = None;
    for line in BufReader::new(child.stderr.take().expect("piped")).lines() {
        let line = line?;
        if let Some(n) = line
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
        {
            execs = Some(n);
        }
        // libFuzzer's progress lines are many: keep the summary and anything bad.
        let progress = line.starts_with('#')
            && line
                .split_whitespace()
                .nth(1)
                .is_some_and(|w| ["pulse", "NEW", "REDUCE", "RELOAD"].contains(&w));
        let dictionary = line.contains("# Uses: ")
            || line.contains("recommended dictionary")
            || line.contains("NEW_FUNC[");
        if !progress && !dictionary {
            eprintln!("  {target}: {line}");
        }
    }
    let status = child.wait()?;
    // The scratch files the targets keep for the process's life (named by its pid).
    let pid = child.id();
    for name in ["input_log", "sched_log"] {
        let _ = std::fs::remove_file(format!("/dev/shm/keling-fuzz-{name}-{pid}"));
        let _ =
            std::fs::remove_file(std::env::temp_dir().join(format!("keling-fuzz-{name}-{pid}")));
    }
    let _ =
        std::fs::remove_dir_all(std::env::temp_dir().join(format!("keling-fuzz-control-{pid}")));
    // libFuzzer also saves slow-unit-* (slower than -report_slow_units): worth a
    // look, not a failure; a hang is a timeout-*.
    let crashes: Vec<PathBuf> = files_in(&artifacts)
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with("slow-unit-"))
        })
        .collect();
    Ok(Outcome {
        target,
        execs,
        corpus: files_in(&work).len(),
        crashes,
        ok: status.success(),
    })
}

pub fn fuzz(seconds: u64, only: Option<String>) -> anyhow::Result<()> {
    let targets: Vec<&'static str> = match &only {
        Some(name) => match TARGETS.iter().find(|t| **t == name.as_str()) {
            Some(t) => vec![*t],
            None => bail!(
                "no fuzz target {name:?}; the targets are {}",
                TARGETS.join(", ")
            ),
        },
        None => TARGETS.to_vec(),
    };
    build()?;
    let mut outcomes = Vec::new();
    for t in targets {
        outcomes.push(run_target(t, seconds)?);
    }
    println!("\n{:<16} {:>12} {:>8}  result", "target", "execs", "corpus");
    let mut failed = Vec::new();
    for o in &outcomes {
        let execs = o.execs.map_or("?".into(), |n| n.to_string());
        let result = if o.ok && o.crashes.is_empty() {
            "ok".to_string()
        } else {
            failed.push(o.target);
            let saved: Vec<String> = o.crashes.iter().map(|p| p.display().to_string()).collect();
            format!("CRASH {}", saved.join(" "))
        };
        println!("{:<16} {execs:>12} {:>8}  {result}", o.target, o.corpus);
    }
    if !failed.is_empty() {
        bail!(
            "fuzz targets crashed: {}. Reproduce one with `{} FILE` (the input saved above); fix \
             it and add the input as a regression test beside the parser",
            failed.join(", "),
            binary("TARGET").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TARGETS` is what `fuzz/Cargo.toml` builds, and each has seeds.
    #[test]
    fn every_target_is_a_bin_with_a_seed_corpus() {
        let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "keling-fuzz")
            .collect();
        assert_eq!(
            bins, TARGETS,
            "fuzz/Cargo.toml's bins against fuzz::TARGETS"
        );
        for t in TARGETS {
            let seeds = files_in(&fuzz_dir().join("corpus").join(t));
            assert!(!seeds.is_empty(), "fuzz/corpus/{t}/ has no seed");
            assert!(
                fuzz_dir().join(format!("fuzz_targets/{t}.rs")).is_file(),
                "fuzz/fuzz_targets/{t}.rs"
            );
        }
    }
}
