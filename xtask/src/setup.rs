//! Installs what a fresh machine lacks, idempotently: each step checks first and
//! does nothing when its tool is already there.
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::run;

/// bpf-linker 0.10.4 loads rustc's own LLVM at run time; 0.11+ needs a system
/// LLVM 22 that Debian 12 lacks (see shared/PLATFORM.md).
const BPF_LINKER_VERSION: &str = "0.10.4";

/// Debian packages the tests and tools need: FUSE for the simulated driver,
/// `promtool` (package `prometheus`) and curl for the `/metrics` tests.
const DEBIAN_PACKAGES: &[&str] = &["fuse3", "prometheus", "curl"];

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn setup() -> anyhow::Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is not installed: Keling needs rustup with a nightly toolchain")?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!("setup: installing the nightly toolchain (eBPF programs need it)");
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("setup: adding rust-src to nightly (build-std for the bpf target)");
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("setup: installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        run(crate::cargo_nightly().args([
            "install",
            "bpf-linker",
            "--locked",
            "--force",
            "--version",
            BPF_LINKER_VERSION,
        ]))?;
    }
    debian_packages(DEBIAN_PACKAGES)
}

/// Installs the Debian packages of `wanted` that are missing (root only; others are
/// told the command to run).
pub fn debian_packages(wanted: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|p| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]));
            !status.is_some_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if !missing.is_empty() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "missing Debian packages {missing:?}: run `sudo apt-get install {}`",
                missing.join(" ")
            );
        }
        eprintln!("setup: installing Debian packages {missing:?}");
        run(Command::new("apt-get").arg("update").arg("-q"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    Ok(())
}
