//! Helpers for Keling's root integration tests: what each test starts with
//! ([`Fixture`]), find the binaries, run a trace, parse its JSON lines, and report
//! skips so `cargo xtask test` can count them.
use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Output},
    sync::{Arc, Mutex},
};

use serde_json::Value;

pub mod agent;
/// The kernel's own count of a process's eBPF hash-map entries (shared with
/// `cargo xtask soak`).
pub use keling_bpfmaps as bpfmaps;
pub mod fixture;
pub mod slurm;

pub use fixture::Fixture;

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

    /// The summary's entry for the process `keling trace` started: the one whose
    /// parent is not in the trace. (Entries are in pid order, and pids wrap: a
    /// child can have a lower pid than its parent.)
    pub fn root(&self) -> &Value {
        let procs = self.summary()["processes"].as_array().expect("processes");
        let roots: Vec<&Value> = procs
            .iter()
            .filter(|p| !procs.iter().any(|q| q["pid"] == p["ppid"]))
            .collect();
        assert_eq!(roots.len(), 1, "one root process: {}", self.summary());
        roots[0]
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
    // The kernel writes only records the contract defines, whatever the workload.
    assert!(
        !stderr.contains("undecodable event from the kernel"),
        "keling could not decode what the probes wrote:\n{stderr}"
    );
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
/// test panics. A child that leads a process group of its own (spawned with
/// `CommandExt::process_group(0)`) takes its group with it: what it started
/// there (`keling trace -- WORKLOAD`'s workload) is killed too, by the group's
/// id, even when the child died first and left it running.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let pid = self.0.id() as libc::pid_t;
        // Only while the child is not reaped (running, or a zombie): then its
        // id, and so its group's, cannot have gone to another process.
        // SAFETY: siginfo_t is plain data, valid when zeroed.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with WNOWAIT only looks; `info` is a valid siginfo_t.
        let unreaped = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        } == 0;
        // SAFETY: getpgid takes a plain id.
        if unreaped && unsafe { libc::getpgid(pid) } == pid {
            // SAFETY: kill takes a plain id: the group the child leads.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    /// Reads the child's piped standard error as it comes (it may stay open as
    /// long as the child runs), echoing each line as `tag: line`; what it has
    /// said so far, one line each. Panics if standard error was not piped.
    pub fn echo_stderr(&mut self, tag: &'static str) -> Arc<Mutex<String>> {
        use std::io::{BufRead, BufReader};
        let said = Arc::new(Mutex::new(String::new()));
        let lines = BufReader::new(self.0.stderr.take().expect("stderr piped")).lines();
        let keep = said.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                eprintln!("{tag}: {l}");
                let mut s = keep.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        said
    }
}

/// A GPU process Keling did not launch: `keling-gpu-workload --scenario busy`
/// (1,000,000 iterations) on `sim`, its progress written to `progress` (a config
/// rule adopts it by its comm).
pub fn unlaunched_gpu_process(sim: &Nvsim, progress: &std::path::Path) -> ChildGuard {
    ChildGuard(
        Command::new(gpu_workload_bin())
            .args([
                "--dev-dir",
                sim.dev_dir(),
                "--scenario",
                "busy",
                "--iterations",
                "1000000",
                "--progress",
            ])
            .arg(progress)
            .spawn()
            .unwrap(),
    )
}

/// Whether FUSE can be used here (for the simulated driver); records a skip if not.
pub fn can_use_fuse(test: &str) -> bool {
    if !std::path::Path::new("/dev/fuse").exists() {
        skip(test, "no /dev/fuse: the simulated NVIDIA driver needs FUSE");
        return false;
    }
    true
}

/// A mounted `keling-nvsim`: unmounted (SIGTERM by pid, then `umount -l` if the
/// mount is still there) and its directory removed on drop, even when a test fails.
pub struct Nvsim {
    pub dir: PathBuf,
    child: std::process::Child,
}

impl Nvsim {
    /// Mounts a simulated driver with `args` (e.g. `--gpus 2`) in a fresh directory.
    pub fn mount(args: &[&str]) -> Nvsim {
        use std::io::BufRead;
        let dir = tempdir().join("dev");
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(nvsim_bin())
            .arg("mount")
            .arg(&dir)
            .args(args)
            .arg("--foreground")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start keling-nvsim");
        let stderr = child.stderr.take().unwrap();
        let mut lines = std::io::BufReader::new(stderr).lines();
        let sim = Nvsim { dir, child };
        for line in lines.by_ref() {
            let line = line.expect("read nvsim stderr");
            if line.starts_with("nvsim: mounted") {
                std::thread::spawn(move || lines.for_each(drop));
                return sim;
            }
            eprintln!("{line}");
        }
        panic!("keling-nvsim exited before mounting");
    }

    pub fn state(&self) -> Value {
        let text =
            std::fs::read_to_string(self.dir.join("nvsim-state.json")).expect("read nvsim state");
        serde_json::from_str(&text).expect("nvsim state is JSON")
    }

    /// `--gpu-capacity INDEX=BYTES` for every simulated GPU (what `keling run` is
    /// told on a host without NVML).
    pub fn capacity_args(&self) -> Vec<String> {
        let state = self.state();
        state["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| {
                [
                    "--gpu-capacity".to_string(),
                    format!("{}={}", g["index"], g["capacity_bytes"]),
                ]
            })
            .collect()
    }

    pub fn dev_dir(&self) -> &str {
        self.dir.to_str().unwrap()
    }
}

impl Drop for Nvsim {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == self.dir.to_str())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// The GPU workload generator (a binary of the keling-nvsim crate).
pub fn gpu_workload_bin() -> PathBuf {
    sibling_bin("keling-gpu-workload")
}

/// The simulated driver's FUSE server.
pub fn nvsim_bin() -> PathBuf {
    sibling_bin("keling-nvsim")
}

/// (pid, gpu) -> [bytes, peak_bytes, host_bytes, egm_bytes, driver figure, allocs,
/// frees]; entries whose figures are all 0 are left out on both sides.
pub type GpuFigures = std::collections::BTreeMap<(u64, u64), [u64; 7]>;

/// What each figure is called in the comparison's messages.
pub const FIGURE_NAMES: &str = "[bytes, peak, host, egm, driver, allocs, frees]";

fn figures(processes: &Value, driver_field: &str) -> GpuFigures {
    let mut out = GpuFigures::new();
    for p in processes.as_array().expect("processes") {
        for g in p["gpus"].as_array().into_iter().flatten() {
            let f = [
                &g["bytes"],
                &g["peak_bytes"],
                &g["host_bytes"],
                &g["egm_bytes"],
                &g[driver_field],
                &g["allocs"],
                &g["frees"],
            ]
            .map(|v| {
                v.as_u64()
                    .unwrap_or_else(|| panic!("number expected in {g}"))
            });
            if f.iter().any(|&v| v != 0) {
                out.insert((p["pid"].as_u64().unwrap(), g["gpu"].as_u64().unwrap()), f);
            }
        }
    }
    out
}

/// The simulator's ground truth.
pub fn truth_figures(state: &Value) -> GpuFigures {
    figures(&state["processes"], "driver_video_bytes")
}

/// A command line of a doc's block as this test runs it: the binaries this test
/// was built with instead of `target/debug/`, and `dev` (the test's own mount
/// point) instead of `/tmp/keling-nvsim`.
pub fn doc_line_here(line: &str, bin_dir: &std::path::Path, dev: &std::path::Path) -> String {
    line.replace("target/debug/", &format!("{}/", bin_dir.display()))
        .replace("/tmp/keling-nvsim", dev.to_str().unwrap())
}

/// The same figures from a Keling `summary` or `gpu_snapshot` line.
pub fn keling_figures(line: &Value) -> GpuFigures {
    figures(&line["processes"], "driver_bytes")
}

/// Compares Keling's figures with the simulator's, re-reading the simulator's state
/// until they agree or `timeout` passes: FUSE delivers the release of a closed file
/// to the simulator asynchronously, after the close has returned, so its ground
/// truth may lag the kernel's by a moment. Returns the last difference on failure.
pub fn converge(
    sim: &Nvsim,
    ours: &GpuFigures,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let truth = truth_figures(&sim.state());
        if &truth == ours {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            let keys: std::collections::BTreeSet<_> = truth.keys().chain(ours.keys()).collect();
            let diff: Vec<String> = keys
                .into_iter()
                .filter(|k| truth.get(k) != ours.get(k))
                .map(|k| {
                    format!(
                        "(pid {}, gpu {}): simulator {:?} keling {:?}",
                        k.0,
                        k.1,
                        truth.get(k),
                        ours.get(k)
                    )
                })
                .collect();
            return Err(format!("{FIGURE_NAMES} differ:\n  {}", diff.join("\n  ")));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The repository's root (this crate is `tests/`).
fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The ```sh block of the Markdown file `doc` (relative to the repository root:
/// `README.md`, `docs/tracing.md`) in its section `## TITLE` that starts with
/// `first` (the commands a test runs as written).
pub fn doc_block(doc: &str, title: &str, first: &str) -> String {
    let path = repo_root().join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = text
        .split(&format!("\n## {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("{doc} has a {title:?} section"));
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.starts_with(first))
        .unwrap_or_else(|| panic!("a code block starting with {first:?} in {doc}, {title:?}"))
        .to_owned()
}

/// [`doc_block`] of README.md.
pub fn readme_block(title: &str, first: &str) -> String {
    doc_block("README.md", title, first)
}

/// The unpacked NVIDIA userspace 535 (`cargo xtask setup` puts Debian's packages
/// in `target/nvidia-userspace/VERSION`), if there; records a skip if not.
pub fn nvidia_userspace(test: &str) -> Option<PathBuf> {
    nvidia_userspace_of(test, "535.261.03")
}

/// [`nvidia_userspace`] of one version (535.261.03, 550.163.01, 555.58.02).
pub fn nvidia_userspace_of(test: &str, version: &str) -> Option<PathBuf> {
    let dir = sibling_bin("keling-nvsim")
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("nvidia-userspace")
        .join(version);
    if dir
        .join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1")
        .exists()
    {
        return Some(dir);
    }
    skip(
        test,
        &format!(
            "NVIDIA's userspace is not unpacked in {} (`cargo xtask setup` fetches it with apt from Debian)",
            dir.display()
        ),
    );
    None
}

/// `keling-nvsim sandbox DIR -- cmd...`: `cmd` runs where NVIDIA's real userspace
/// sees the simulator mounted at DIR.
pub fn sandbox(sim: &Nvsim, cmd: &[&str]) -> Command {
    let mut c = Command::new(nvsim_bin());
    c.arg("sandbox").arg(&sim.dir).arg("--").args(cmd);
    c
}

/// The CUDA driver-API probe (a binary of the keling-nvsim crate).
pub fn cuda_probe_bin() -> PathBuf {
    sibling_bin("keling-cuda-probe")
}

/// Checks of the documentation that need no root: the blocks the tests run are
/// there, and the links between README.md and docs/ resolve.
#[cfg(test)]
mod doc_tests {
    use std::path::Path;

    use super::{doc_block, repo_root};

    /// The string-literal arguments of each call `name(...)` in `src`.
    fn literal_calls(src: &str, name: &str) -> Vec<Result<Vec<String>, String>> {
        src.match_indices(&format!("{name}("))
            .filter(|(at, _)| !src[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
            .map(|(at, _)| {
                let line = src[..at].lines().count();
                let mut rest = &src[at + name.len() + 1..];
                let mut args = Vec::new();
                loop {
                    rest = rest.trim_start().trim_start_matches(',').trim_start();
                    if rest.starts_with(')') {
                        return Ok(args);
                    }
                    let lit = rest.strip_prefix('"').ok_or(format!(
                        "line {line}: an argument that is no string literal"
                    ))?;
                    let end = lit
                        .find('"')
                        .ok_or(format!("line {line}: no closing quote"))?;
                    args.push(lit[..end].to_owned());
                    rest = &lit[end + 1..];
                }
            })
            .collect()
    }

    #[test]
    fn every_block_a_test_runs_is_in_its_doc() {
        let dir = repo_root().join("tests/tests");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).expect("tests/tests") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let src = std::fs::read_to_string(&path).expect("test source");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            for (reader, arity) in [("doc_block", 3), ("readme_block", 2)] {
                for call in literal_calls(&src, reader) {
                    let args = call.unwrap_or_else(|e| {
                        panic!("{name}: {reader}: {e}; this check reads literals only")
                    });
                    assert_eq!(args.len(), arity, "{name}: {reader}{args:?}");
                    let (doc, title, first) = match &args[..] {
                        [doc, title, first] => (doc.as_str(), title, first),
                        [title, first] => ("README.md", title, first),
                        _ => unreachable!(),
                    };
                    let block = doc_block(doc, title, first);
                    assert!(block.starts_with(first.as_str()) && block.lines().count() > 1);
                    checked += 1;
                }
            }
        }
        assert!(checked >= 2, "found {checked} doc blocks that tests run");
    }

    /// GitHub's anchor for a heading: lowercase, only letters, digits, `-`, `_`
    /// and spaces kept, spaces as `-`.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// A Markdown file's lines outside fenced code blocks.
    fn prose(text: &str) -> Vec<&str> {
        let mut fenced = false;
        text.lines()
            .filter(|l| {
                if l.trim_start().starts_with("```") {
                    fenced = !fenced;
                    return false;
                }
                !fenced
            })
            .collect()
    }

    fn anchors(path: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).expect("markdown");
        prose(&text)
            .into_iter()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|h| anchor(h.trim_start_matches('#')))
            .collect()
    }

    #[test]
    fn readme_and_docs_links_resolve() {
        let root = repo_root();
        let mut files = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
        let mut broken = Vec::new();
        let mut links = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).expect("markdown");
            // Inline code is no link (`[[rule]]`), but a link's text may be code.
            let lines: Vec<String> = prose(&text)
                .into_iter()
                .map(|l| l.split('`').step_by(2).collect::<Vec<_>>().join(""))
                .collect();
            let prose = lines.join("\n");
            for (at, _) in prose.match_indices("](") {
                let target = &prose[at + 2..];
                let target = &target[..target.find(')').expect("closing paren")];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                links += 1;
                let (path, fragment) = target.split_once('#').unwrap_or((target, ""));
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path)
                };
                let name = file.strip_prefix(&root).unwrap().display();
                if !resolved.exists() {
                    broken.push(format!("{name}: {target}: no such file"));
                } else if !fragment.is_empty() && !anchors(&resolved).iter().any(|a| a == fragment)
                {
                    broken.push(format!("{name}: {target}: no such heading"));
                }
            }
        }
        for file in &files {
            let text = std::fs::read_to_string(file).expect("markdown");
            let name = file.strip_prefix(&root).unwrap().display().to_string();
            let (paths, problems) = code_paths(&root, file, &prose(&text).join("\n"));
            links += paths;
            broken.extend(problems.into_iter().map(|p| format!("{name}: {p}")));
        }
        assert!(
            broken.is_empty(),
            "broken links:\n  {}",
            broken.join("\n  ")
        );
        assert!(links > 10, "only {links} relative links found");
    }

    /// The top-level entries of the repository (what a relative path in the docs
    /// may start with), leaving out build output and hidden files.
    fn top_level(root: &Path) -> Vec<String> {
        std::fs::read_dir(root)
            .expect("repository root")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n != "target" && !n.starts_with('.'))
            .collect()
    }

    /// Checks the inline-code spans of `prose` (a Markdown file's text outside
    /// fenced blocks) that look like file paths: one that leaves the repository
    /// (`../`, `/work/`) is a problem; a relative one that starts with a top-level
    /// entry of the repository, or names a file beside `file`, must exist (a span
    /// with wildcards or placeholders is left alone, and so are absolute system
    /// paths such as `/proc/...` and upstream paths such as `src/nvidia/...`).
    /// Returns how many it checked and the problems.
    fn code_paths(root: &Path, file: &Path, prose: &str) -> (usize, Vec<String>) {
        let tops = top_level(root);
        let mut checked = 0;
        let mut problems = Vec::new();
        for span in prose.split('`').skip(1).step_by(2) {
            let path = span.trim();
            let pathlike = !path.is_empty()
                && path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+'))
                && (path.contains('/') || path.ends_with(".md") || path.ends_with(".rs"));
            if !pathlike {
                continue;
            }
            if path.starts_with("../") || path.starts_with("/work/") || path.contains("/../") {
                checked += 1;
                problems.push(format!("`{path}`: a path outside the repository"));
                continue;
            }
            if path.starts_with('/') {
                continue;
            }
            let first = path.split('/').next().unwrap();
            let beside = file.parent().unwrap().join(path);
            if tops.iter().any(|t| t == first) {
                checked += 1;
                if !root.join(path).exists() {
                    problems.push(format!("`{path}`: no such file in the repository"));
                }
            } else if beside.exists() {
                checked += 1;
            }
        }
        (checked, problems)
    }

    #[test]
    fn code_paths_are_checked() {
        let root = repo_root();
        let doc = root.join("docs/limits.md");
        let (n, problems) = code_paths(
            &root,
            &doc,
            "see `docs/tracing.md`, `keling-agent/src/lib.rs`, `scheduler.md`, \
             `/proc/self/fd`, `src/nvidia/x.c`, `tests/tests/*.rs`",
        );
        assert_eq!((n, problems.len()), (3, 0), "{problems:?}");
        let outside = format!(
            "`{}/{}/NOTES.md` and `/work/{}`",
            "..", "shared", "shared/X.md"
        );
        let (n, problems) = code_paths(&root, &doc, &outside);
        assert_eq!((n, problems.len()), (2, 2), "{problems:?}");
        let (_, problems) = code_paths(&root, &doc, "`docs/no-such-file.md`");
        assert_eq!(problems.len(), 1);
    }

    /// Every file of the repository (skipping build output and `.git`).
    fn repo_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("directory") {
            let entry = entry.expect("entry");
            let name = entry.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                repo_files(&entry.path(), out);
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }

    /// The repository stands alone: no file of it points at the team's notes
    /// outside it (the facts they hold are in docs/design.md and
    /// docs/nvidia-abi.md). The patterns are built here so that this file does not
    /// contain them.
    #[test]
    fn nothing_points_outside_the_repository() {
        let root = repo_root();
        let mut files = Vec::new();
        repo_files(&root, &mut files);
        assert!(files.len() > 50, "only {} files found", files.len());
        let mut patterns = vec![format!("{}/shared", ".."), format!("/work/{}", "shared")];
        for note in [
            "DESIGN",
            "NVIDIA-RM-ABI",
            "REAL-NVIDIA",
            "PLATFORM",
            "SLURM",
            "STYLE",
        ] {
            patterns.push(format!("shared/{note}.md"));
            // The notes by name: the upper-case file names are theirs (the
            // repository's own docs are lower-case).
            patterns.push(format!("{note}.md"));
        }
        let mut found = Vec::new();
        for file in &files {
            let bytes = std::fs::read(file).expect("file");
            let text = String::from_utf8_lossy(&bytes);
            for (n, line) in text.lines().enumerate() {
                if let Some(p) = patterns.iter().find(|p| line.contains(p.as_str())) {
                    let name = file.strip_prefix(&root).unwrap().display();
                    found.push(format!("{name}:{}: {p}", n + 1));
                }
            }
        }
        assert!(
            found.is_empty(),
            "paths outside the repository (point at docs/ instead):\n  {}",
            found.join("\n  ")
        );
    }

    /// The top-level modules of keling-agent as its source tree has them: each
    /// directory with a `mod.rs` and each `.rs` file but `lib.rs` and `main.rs`.
    fn agent_modules_on_disk(src: &Path) -> std::collections::BTreeSet<String> {
        let mut on_disk = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(src).expect("keling-agent/src") {
            let path = entry.expect("entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && path.join("mod.rs").exists() {
                on_disk.insert(name);
            } else if let Some(stem) = name.strip_suffix(".rs")
                && stem != "lib"
                && stem != "main"
            {
                on_disk.insert(stem.to_owned());
            }
        }
        on_disk
    }

    /// The first cells of the Markdown table that follows the line starting with
    /// `after` in `text`, as module names: `` `cmd/` `` or `` `defaults.rs` `` (the
    /// development guide), `` [`cmd`] `` (the crate doc, lines without `//! `).
    fn table_modules(text: &str, after: &str) -> Vec<String> {
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.strip_prefix("//!").map_or(l, |l| l.trim_start()))
            .collect();
        let start = lines
            .iter()
            .position(|l| l.starts_with(after))
            .unwrap_or_else(|| panic!("a line starting with {after:?}"));
        lines[start + 1..]
            .iter()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|row| {
                let cell = row.split('|').nth(1).unwrap().trim();
                let name = cell.trim_matches(|c| matches!(c, '[' | ']' | '`'));
                let name = name.strip_suffix('/').unwrap_or(name);
                name.strip_suffix(".rs").unwrap_or(name).to_owned()
            })
            .collect()
    }

    /// One map of keling-agent's modules: the table in docs/development.md and
    /// the crate doc's table in lib.rs list exactly the modules the source tree
    /// has (and lib.rs declares), each once.
    #[test]
    fn module_maps_match_the_source_tree() {
        let root = repo_root();
        let src = root.join("keling-agent/src");
        let on_disk = agent_modules_on_disk(&src);
        assert!(on_disk.len() > 10, "{on_disk:?}");
        let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
        let declared: std::collections::BTreeSet<String> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod "))
            .map(|m| m.trim_end_matches(';').to_owned())
            .collect();
        assert_eq!(declared, on_disk, "lib.rs's `pub mod`s against the files");
        let dev = std::fs::read_to_string(root.join("docs/development.md")).expect("guide");
        for (name, listed) in [
            (
                "docs/development.md",
                table_modules(&dev, "Inside `keling-agent/src/`"),
            ),
            (
                "keling-agent/src/lib.rs",
                table_modules(&lib, "(`main.rs`). The map of its modules"),
            ),
        ] {
            let set: std::collections::BTreeSet<String> = listed.iter().cloned().collect();
            assert_eq!(set.len(), listed.len(), "{name} lists a module twice");
            let missing: Vec<_> = on_disk.difference(&set).collect();
            let extra: Vec<_> = set.difference(&on_disk).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{name}'s module table: missing {missing:?}, not in keling-agent/src {extra:?}"
            );
        }
    }

    #[test]
    fn anchors_are_githubs() {
        assert_eq!(
            anchor(" The control socket, users and the fail-safe"),
            "the-control-socket-users-and-the-fail-safe"
        );
        assert_eq!(
            anchor(" What `keling launch` says"),
            "what-keling-launch-says"
        );
    }
}

#[cfg(test)]
mod guard_tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::ChildGuard;

    /// Whether `pid` is gone or a zombie (killed, not yet reaped by whoever
    /// inherited it).
    fn dead(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
        })
    }

    /// `sh -c SCRIPT` in a group of its own, and the pid of the `sleep` it
    /// starts in the background (what it prints first).
    fn shell_with_sleeper(script: &str) -> (ChildGuard, i32) {
        let mut guard = ChildGuard(
            Command::new("sh")
                .args(["-c", script])
                .process_group(0)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        BufReader::new(guard.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let sleeper: i32 = line.trim().parse().expect("the sleeper's pid");
        assert!(!dead(sleeper), "the sleeper runs before the guard drops");
        (guard, sleeper)
    }

    /// Waits until the sleeper is dead; if it is not within 10 s, kills it
    /// (by its pid) and fails.
    fn wait_dead(sleeper: i32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dead(sleeper) {
            if Instant::now() > deadline {
                // SAFETY: kill takes a plain pid, the sleeper this test started.
                unsafe { libc::kill(sleeper, libc::SIGKILL) };
                panic!("the sleeper {sleeper} ran on after its guard dropped");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_guard_kills_what_its_child_started_in_its_group() {
        let (guard, sleeper) = shell_with_sleeper("sleep 1000 & echo $!; wait");
        drop(guard);
        wait_dead(sleeper);
    }

    #[test]
    fn a_guard_kills_what_its_child_left_running_when_it_died_first() {
        // The shell exits at once; its sleeper runs on, orphaned, as a traced
        // workload does when `keling trace` dies.
        let (guard, sleeper) = shell_with_sleeper("sleep 1000 & echo $!");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dead(guard.0.id() as i32) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!dead(sleeper), "orphaned, it runs on");
        drop(guard);
        wait_dead(sleeper);
    }
}
