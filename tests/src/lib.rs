//! Helpers for Keling's root integration tests: find the binaries, run a trace,
//! parse its JSON lines, and report skips so `cargo xtask test` can count them.
use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Output},
};

use serde_json::Value;

/// A binary built into the same target directory as this test.
fn sibling_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: run the integration tests with `cargo xtask test`",
        bin.display()
    );
    bin
}

/// The `keling` binary under test: `$KELING_BIN`, else the one built next to this
/// test binary (`cargo xtask test` builds it, with its eBPF programs, first).
pub fn keling_bin() -> PathBuf {
    std::env::var_os("KELING_BIN").map_or_else(|| sibling_bin("keling"), PathBuf::from)
}

/// The workload generator (a binary of this crate; cargo builds it for the tests).
pub fn workload_bin() -> PathBuf {
    sibling_bin("keling-workload")
}

/// Records a skipped test: prints "skipping: <reason>" and appends it to
/// `$KELING_SKIP_LOG`, which `cargo xtask test` counts and reports.
pub fn skip(test: &str, reason: &str) {
    eprintln!("skipping: {test}: {reason}");
    if let Some(path) = std::env::var_os("KELING_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{test}: {reason}");
    }
}

/// Whether this test can load eBPF here; records a skip when it cannot.
pub fn can_load_ebpf(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "not root: loading eBPF programs needs root");
        return false;
    }
    true
}

/// A finished `keling trace --format jsonl` run.
pub struct Trace {
    pub exit_code: i32,
    pub stderr: String,
    pub lines: Vec<Value>,
}

impl Trace {
    pub fn summary(&self) -> &Value {
        let last = self.lines.last().expect("trace printed nothing");
        assert_eq!(
            last["type"], "summary",
            "last line is not the summary: {last}"
        );
        last
    }

    pub fn of_type<'a>(&'a self, ty: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.lines.iter().filter(move |l| l["type"] == ty)
    }

    /// The summary's entry for `pid`.
    pub fn process(&self, pid: u64) -> &Value {
        self.summary()["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in summary: {}", self.summary()))
    }
}

/// Runs `keling trace --format jsonl --output FILE [extra...] -- cmd...` and parses
/// every line (each must be valid JSON with `type` and `ts_ns`).
pub fn trace(extra: &[&str], cmd: &[&str]) -> Trace {
    let dir = tempdir();
    let out_path = dir.join("trace.jsonl");
    let mut c = Command::new(keling_bin());
    c.args(["trace", "--format", "jsonl", "--output"])
        .arg(&out_path)
        .args(extra)
        .arg("--")
        .args(cmd);
    let Output { status, stderr, .. } = c.output().expect("run keling");
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    let text = std::fs::read_to_string(&out_path)
        .unwrap_or_else(|e| panic!("no trace output ({e}); keling said:\n{stderr}"));
    let lines = text
        .lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}"));
            assert!(
                v["type"].is_string() && v["ts_ns"].is_u64(),
                "line lacks type/ts_ns: {l}"
            );
            v
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    Trace {
        exit_code: status.code().unwrap_or(-1),
        stderr,
        lines,
    }
}

/// A fresh directory under the system temp dir, unique to this process and call.
pub fn tempdir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "keling-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A child process that is killed (by pid) and reaped when dropped, even when the
/// test panics.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
