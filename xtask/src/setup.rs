//! Installs what a fresh machine lacks, idempotently: each step checks first and
//! does nothing when its tool is already there.
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::run;

/// bpf-linker 0.10.4 loads rustc's own LLVM at run time; 0.11+ needs a system
/// LLVM 22 that Debian 12 lacks.
const BPF_LINKER_VERSION: &str = "0.10.4";

/// Debian packages the tests and tools need: FUSE for the simulated driver,
/// `promtool` (package `prometheus`) and curl for the `/metrics` tests, and a
/// C++ compiler for libFuzzer (`cargo xtask fuzz`; libfuzzer-sys builds it), and
/// Slurm with munge for the Slurm tests (a controller and two nodes on this
/// machine; installing starts no daemon: the tests start their own).
const DEBIAN_PACKAGES: &[&str] = &[
    "fuse3",
    "prometheus",
    "curl",
    "g++",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
];

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
    debian_packages(DEBIAN_PACKAGES)?;
    nvidia_userspace()
}

/// NVIDIA's own userspace, the judge of the simulated driver in the tests
/// (`keling-nvsim sandbox`): Debian bookworm's non-free packages at one pinned
/// version, unpacked under `target/` and never installed system-wide (a full
/// install pulls in dkms and kernel headers). The product never uses them.
pub const NVIDIA_USERSPACE_VERSION: &str = "535.261.03";
const NVIDIA_PACKAGES: &[&str] = &[
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-smi",
    "libnvidia-ptxjitcompiler1",
];
/// The apt source this step adds: the non-free component of the host's own
/// bookworm mirror.
const NONFREE_SOURCES: &str = "/etc/apt/sources.list.d/keling-nvidia-non-free.sources";

/// Where the packages are unpacked (`dpkg -x`).
pub fn nvidia_userspace_dir() -> std::path::PathBuf {
    crate::root()
        .join("target/nvidia-userspace")
        .join(NVIDIA_USERSPACE_VERSION)
}

fn nvidia_userspace() -> anyhow::Result<()> {
    let dir = nvidia_userspace_dir();
    let marker = dir.join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1");
    if marker.exists() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    if !release.lines().any(|l| l == "VERSION_CODENAME=bookworm") {
        eprintln!(
            "setup: not Debian bookworm: NVIDIA's userspace {NVIDIA_USERSPACE_VERSION} is not \
             fetched and the tests that run it will skip"
        );
        return Ok(());
    }
    if !crate::is_root() {
        bail!(
            "NVIDIA's userspace {NVIDIA_USERSPACE_VERSION} is not in {}: run `sudo cargo xtask setup` \
             (it adds Debian's non-free component to apt's sources and unpacks the packages there)",
            dir.display()
        );
    }
    eprintln!(
        "setup: fetching NVIDIA's userspace {NVIDIA_USERSPACE_VERSION} (Debian non-free, unpacked \
         under target/, not installed)"
    );
    add_nonfree_source()?;
    run(Command::new("apt-get").args(["update", "-q"]))?;
    let download = crate::root().join("target/nvidia-userspace/debs");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download)?;
    // `apt-get download` writes into its working directory (and says so when
    // the `_apt` user cannot write there: harmless).
    let status = Command::new("apt-get")
        .args(["download", "-q"])
        .args(
            NVIDIA_PACKAGES
                .iter()
                .map(|p| format!("{p}={NVIDIA_USERSPACE_VERSION}-1")),
        )
        .current_dir(&download)
        .status()
        .context("start apt-get download")?;
    if !status.success() {
        bail!(
            "apt-get download of {NVIDIA_PACKAGES:?} {NVIDIA_USERSPACE_VERSION} failed: {status}"
        );
    }
    // Unpack into a fresh directory and move it in place last, so an
    // interrupted run never leaves a half tree that looks complete.
    let partial = dir.with_file_name(format!("{NVIDIA_USERSPACE_VERSION}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    for deb in std::fs::read_dir(&download)? {
        let deb = deb?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
        }
    }
    if !partial
        .join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1")
        .exists()
    {
        bail!(
            "the unpacked packages in {} hold no libcuda.so.1",
            partial.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(())
}

/// Adds the non-free component of the host's bookworm source (same URIs and
/// key as its `main` entry), once.
fn add_nonfree_source() -> anyhow::Result<()> {
    if std::path::Path::new(NONFREE_SOURCES).exists() {
        return Ok(());
    }
    let mut uris = None;
    let mut key = None;
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for f in dir.flatten() {
            let p = f.path();
            if p.extension().is_none_or(|e| e != "sources") {
                continue;
            }
            for stanza in std::fs::read_to_string(&p)
                .unwrap_or_default()
                .split("\n\n")
            {
                let field = |name: &str| {
                    stanza
                        .lines()
                        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                };
                let suites = field("Suites:").unwrap_or_default();
                if uris.is_none() && suites.split_whitespace().any(|s| s == "bookworm") {
                    uris = field("URIs:");
                    key = field("Signed-By:");
                }
            }
        }
    }
    let Some(uris) = uris else {
        bail!(
            "no apt source for Debian bookworm found in /etc/apt/sources.list.d/*.sources: add one \
             with the non-free component to fetch NVIDIA's userspace"
        );
    };
    let mut text = format!(
        "# Added by `cargo xtask setup` (Keling): NVIDIA's userspace for the simulator's tests.\n\
         Types: deb\nURIs: {uris}\nSuites: bookworm bookworm-updates\nComponents: non-free\n"
    );
    if let Some(k) = key {
        text.push_str(&format!("Signed-By: {k}\n"));
    }
    std::fs::write(NONFREE_SOURCES, text).with_context(|| format!("write {NONFREE_SOURCES}"))
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
