//! `cargo xtask`: set up, build, run, test and benchmark Keling on a fresh machine.
//!
//! Every command first runs `setup`, which installs only what is missing, so the
//! same command works on a fresh machine and costs nothing on a prepared one.
mod bench;
mod demo;
mod fuzz;
mod setup;
mod soak;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Build, run, test and benchmark Keling (installs what a fresh machine lacks)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: nightly rust-src, bpf-linker 0.10.4, Debian packages.
    Setup,
    /// Build the eBPF programs (nightly) and the agent with them embedded.
    Build {
        /// Build the optimised release profile.
        #[arg(long)]
        release: bool,
    },
    /// Build (release) and run `keling` as root with ARGS (default: `run`).
    Run {
        /// Arguments for `keling`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every test: unit, property and root integration tests with real eBPF,
    /// then rustfmt and clippy (both passes). Prints skipped tests and a total.
    Test {
        /// Skip `cargo fmt --check`, clippy and the fuzz targets' type-check.
        #[arg(long)]
        no_lint: bool,
        /// Extra arguments for `cargo test` (after `--`), e.g. a test name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run clippy on the host crates and on the eBPF crate (bpf target).
    Clippy,
    /// Prepare (and with --local, run) the GPU check: trace a short PyTorch job
    /// with known allocations and report Keling's bytes next to NVML's, with every
    /// ioctl Keling could not decode. Builds here; the bundle runs on a GPU host.
    GpuCheck {
        /// Run the bundle on this host (it must have an NVIDIA GPU and PyTorch).
        #[arg(long)]
        local: bool,
    },
    /// Fuzz the parsers of outside input (libFuzzer, nightly, AddressSanitizer):
    /// each target for SECONDS; fails on a crash, saving its input under
    /// fuzz/artifacts/TARGET/.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Run only this target (control_request, config_toml, ring_record,
        /// input_log, sched_log, interval_log, nvsim_ioctl).
        #[arg(long)]
        target: Option<String>,
    },
    /// Measure probe overhead and ring-buffer throughput, as ratios from one run.
    Bench {
        /// Rounds of the interleaved call-cost measurement (each figure's spread is
        /// over them; decisions always run 1100 freeze/thaw cycles per host condition).
        #[arg(long, default_value_t = 15)]
        rounds: usize,
    },
    /// Drive the agent at random against the simulated driver, checking it at every
    /// checkpoint; RSS, fds and map entries over time (root).
    Soak(soak::Args),
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Runs a command in the workspace root, failing with its name if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// The cargo of the toolchain running xtask (stable).
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Nightly cargo, through rustup (needed only for the eBPF crate).
fn cargo_nightly() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC");
    c
}

/// Nightly `cargo SUBCOMMAND` on the eBPF crate, for the bpf target. It gets its
/// own target dir so the host build's flags never mix with build-std's.
fn ebpf_cargo(subcommand: &str) -> Command {
    let mut c = cargo_nightly();
    c.args([
        subcommand,
        "--package",
        "keling-ebpf",
        "--release",
        "--target",
        "bpfel-unknown-none",
    ])
    .args(["-Z", "build-std=core", "--target-dir", "target/bpf"]);
    c
}

/// The compiled eBPF object.
fn ebpf_object() -> PathBuf {
    root().join("target/bpf/bpfel-unknown-none/release/keling-ebpf")
}

fn build_ebpf() -> anyhow::Result<PathBuf> {
    eprintln!("xtask: building eBPF programs (nightly, bpfel-unknown-none)");
    run(&mut ebpf_cargo("build"))?;
    Ok(ebpf_object())
}

/// Builds the eBPF object and the host binaries (agent, tests' helpers, simulator):
/// the workspace's default members, which leave the eBPF crate out.
fn build(release: bool) -> anyhow::Result<PathBuf> {
    let obj = build_ebpf()?;
    eprintln!("xtask: building the agent with its eBPF programs embedded");
    let mut c = cargo();
    c.args(["build", "--bins"]).env("KELING_EBPF_OBJ", &obj);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    // The SPANK plugin (a cdylib: `--bins` leaves it out), beside `keling` as
    // `libkeling_spank.so`, where `keling slurm plugstack` looks for it.
    let mut c = cargo();
    c.args(["build", "--package", "keling-spank"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    Ok(root()
        .join("target")
        .join(if release { "release" } else { "debug" }))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `prog args` as root: directly when we are root, else through `sudo -E`.
pub fn as_root(prog: &Path, args: &[String]) -> Command {
    if is_root() {
        let mut c = Command::new(prog);
        c.args(args);
        c
    } else {
        let mut c = Command::new("sudo");
        c.arg("-E").arg(prog).args(args);
        c
    }
}

fn cmd_run(args: Vec<String>) -> anyhow::Result<()> {
    let dir = build(true)?;
    let args = if args.is_empty() {
        vec!["run".to_string()]
    } else {
        args
    };
    let wants_demo = args.first().map(String::as_str) == Some("run")
        && !args.iter().any(|a| a.starts_with("--dev-dir"))
        && !host_has_driver();
    if wants_demo {
        return demo::run_with_simulated_driver(&dir, &args);
    }
    let status = as_root(&dir.join("keling"), &args)
        .status()
        .context("start keling")?;
    std::process::exit(status.code().unwrap_or(1));
}

/// Whether an NVIDIA driver serves `/dev/nvidiactl`: the node exists, opens,
/// and the module's version file is there. A node without a driver (libcuda run
/// as root on a host without one creates 195:255) is said and counts as none.
fn host_has_driver() -> bool {
    let ctl = Path::new("/dev/nvidiactl");
    if std::fs::symlink_metadata(ctl).is_err() {
        return false;
    }
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(ctl);
    let version = Path::new("/proc/driver/nvidia/version").exists();
    match (opened, version) {
        (Ok(_), true) => {
            eprintln!(
                "xtask: NVIDIA driver found (/dev/nvidiactl opens, /proc/driver/nvidia/version)"
            );
            true
        }
        (opened, _) => {
            let why = match opened {
                Err(e) => format!("open: {e}"),
                Ok(_) => "/proc/driver/nvidia/version is absent".to_string(),
            };
            eprintln!(
                "xtask: /dev/nvidiactl is a node with no NVIDIA driver behind it ({why}); probably \
                 left by libcuda run as root on a host without the driver (remove it if no driver is \
                 expected). Running against the simulated driver instead."
            );
            false
        }
    }
}

/// Totals parsed from `cargo test` output.
#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds one "test result: ok. 3 passed; 0 failed; 1 ignored; ..." line.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.split_once("test result:").map(|(_, r)| r) else {
            return;
        };
        for part in rest.split([';', '.']) {
            let mut words = part.split_whitespace();
            if let (Some(n), Some(what)) = (words.next(), words.next()) {
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        }
    }
}

fn cmd_test(no_lint: bool, extra: Vec<String>) -> anyhow::Result<()> {
    let dir = build(false)?;
    let skip_log = root().join("target/test-skips.log");
    let _ = std::fs::remove_file(&skip_log);
    if !is_root() {
        eprintln!("xtask: not root: the integration tests that load eBPF will be skipped");
    }
    eprintln!("xtask: running tests");
    let mut c = cargo();
    // Every test binary runs, so one failure does not hide the others.
    c.args(["test", "--no-fail-fast"])
        .env("KELING_EBPF_OBJ", ebpf_object())
        .env("KELING_BIN", dir.join("keling"))
        .env("KELING_SKIP_LOG", &skip_log)
        .current_dir(root())
        .stdout(Stdio::piped());
    if !extra.is_empty() {
        c.arg("--").args(&extra);
    }
    let mut child = c.spawn().context("start cargo test")?;
    let mut totals = Totals::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        totals.add_line(&line);
    }
    let status = child.wait()?;
    // The GPU check's report generator, on synthetic traces (Python's unittest).
    let py_ok = if extra.is_empty() {
        let out = Command::new("python3")
            .arg(root().join("xtask/gpu-check/test_report.py"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .context("run python3 xtask/gpu-check/test_report.py")?;
        let said = String::from_utf8_lossy(&out.stderr);
        print!("{said}");
        let ran: u64 = said
            .lines()
            .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
            .unwrap_or(0);
        if out.status.success() {
            totals.passed += ran;
        } else {
            totals.failed += ran.max(1);
        }
        out.status.success()
    } else {
        true
    };
    let skips = std::fs::read_to_string(&skip_log).unwrap_or_default();
    let skipped = skips.lines().count() as u64;
    if skipped > 0 {
        println!("\nxtask: {skipped} skipped:");
        for s in skips.lines() {
            println!("  skipping: {s}");
        }
    }
    // Tests that skip still count as "passed" in cargo's totals; report them apart.
    println!(
        "\ntests: {} passed, {} failed, {} skipped",
        totals.passed - skipped.min(totals.passed),
        totals.failed,
        skipped + totals.ignored
    );
    if !status.success() {
        bail!("cargo test failed");
    }
    if !py_ok {
        bail!("xtask/gpu-check/test_report.py failed");
    }
    if !no_lint {
        eprintln!("xtask: cargo fmt --check");
        run(cargo().args(["fmt", "--all", "--check"]))?;
        cmd_clippy()?;
        fuzz::check()?;
    }
    Ok(())
}

/// Writes target/gpu-check/ (keling, job.py, report.py, run.sh).
fn gpu_check(local: bool) -> anyhow::Result<()> {
    let bin = build(true)?;
    let bundle = root().join("target/gpu-check");
    std::fs::create_dir_all(&bundle)?;
    std::fs::copy(bin.join("keling"), bundle.join("keling"))?;
    for f in ["job.py", "report.py", "run.sh"] {
        std::fs::copy(root().join("xtask/gpu-check").join(f), bundle.join(f))?;
    }
    eprintln!("xtask: GPU check bundle ready in {}", bundle.display());
    if local {
        return run(Command::new("sh").arg(bundle.join("run.sh")));
    }
    eprintln!(
        "xtask: on a GPU host run `sh target/gpu-check/run.sh` (root); with the device tool: \
         command `OUT=$OUT sh target/gpu-check/run.sh`, carry [\"target/gpu-check\"]"
    );
    Ok(())
}

fn cmd_clippy() -> anyhow::Result<()> {
    eprintln!("xtask: clippy (host crates)");
    run(cargo()
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .env("KELING_EBPF_OBJ", ebpf_object()))?;
    eprintln!("xtask: clippy (eBPF crate, bpf target)");
    run(ebpf_cargo("clippy").args(["--", "-D", "warnings"]))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if !matches!(cli.command, Cmd::Setup) {
        setup::setup()?;
    }
    match cli.command {
        Cmd::Setup => setup::setup(),
        Cmd::Build { release } => build(release).map(drop),
        Cmd::Run { args } => cmd_run(args),
        Cmd::Test { no_lint, args } => cmd_test(no_lint, args),
        Cmd::Clippy => cmd_clippy(),
        Cmd::GpuCheck { local } => gpu_check(local),
        Cmd::Fuzz { seconds, target } => fuzz::fuzz(seconds, target),
        Cmd::Bench { rounds } => {
            let dir = build(true)?;
            bench::bench(&dir, rounds)
        }
        Cmd::Soak(args) => soak::soak(args, build),
    }
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_cargo_test_result_lines() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        t.add_line(
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 3 tests");
        assert_eq!((t.passed, t.failed, t.ignored), (5, 1, 1));
    }
}
