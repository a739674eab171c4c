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

/// NVIDIA's own userspace, the judges of the simulated driver in the tests
/// (`keling-nvsim sandbox --nvidia DIR`): Debian's non-free packages of each
/// branch Debian has, at pinned versions, unpacked under
/// `target/nvidia-userspace/VERSION` and never installed (a full install pulls in
/// dkms and kernel headers). The product never uses them.
pub struct NvidiaUserspace {
    pub version: &'static str,
    /// Debian's revision of the packages (`VERSION-REVISION` is what is pinned).
    pub revision: u32,
    /// The Debian suite that has this version (non-free, amd64).
    pub suite: &'static str,
    /// From 550, libcuda1 depends on libnvidia-pkcs11-openssl3 of the same version.
    pub pkcs11: bool,
}

/// Every branch fetched, oldest first. The default judge is the first.
pub const NVIDIA_USERSPACES: &[NvidiaUserspace] = &[
    NvidiaUserspace {
        version: "535.261.03",
        revision: 1,
        suite: "bookworm",
        pkcs11: false,
    },
    NvidiaUserspace {
        version: "550.163.01",
        revision: 2,
        suite: "trixie",
        pkcs11: true,
    },
    NvidiaUserspace {
        version: "555.58.02",
        revision: 4,
        suite: "experimental",
        pkcs11: true,
    },
];
const NVIDIA_PACKAGES: &[&str] = &[
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-smi",
    "libnvidia-ptxjitcompiler1",
];
/// Debian's archive key (package debian-archive-keyring) signs every suite above.
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Where the unpacked libcuda is, to tell a complete tree.
const LIBCUDA: &str = "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1";

/// Where each version is unpacked (`dpkg -x`).
pub fn nvidia_userspace_dir(version: &str) -> std::path::PathBuf {
    crate::root().join("target/nvidia-userspace").join(version)
}

fn nvidia_userspace() -> anyhow::Result<()> {
    for u in NVIDIA_USERSPACES {
        nvidia_userspace_of(u)?;
    }
    Ok(())
}

/// The apt options that give apt a state of its own under `dir` (lists, cache,
/// sources), so that nothing of the host's apt configuration changes: a suite
/// such as trixie or experimental in the host's own sources would let the next
/// `apt-get upgrade` upgrade the host from it.
fn own_apt_state(dir: &std::path::Path) -> Vec<String> {
    let d = dir.display();
    vec![
        format!("-oDir::State::Lists={d}/lists"),
        format!("-oDir::Cache={d}/cache"),
        format!("-oDir::Etc::SourceList={d}/sources.list"),
        "-oDir::Etc::SourceParts=/dev/null".into(),
        // Nothing of the host's preferences (pins) either.
        "-oDir::Etc::Preferences=/dev/null".into(),
        "-oDir::Etc::PreferencesParts=/dev/null".into(),
    ]
}

fn nvidia_userspace_of(u: &NvidiaUserspace) -> anyhow::Result<()> {
    let version = u.version;
    let dir = nvidia_userspace_dir(version);
    if dir.join(LIBCUDA).exists() {
        return Ok(());
    }
    if !std::path::Path::new("/usr/bin/apt-get").exists()
        || !std::path::Path::new(DEBIAN_KEYRING).exists()
    {
        eprintln!(
            "setup: no apt-get or no {DEBIAN_KEYRING} (not Debian): NVIDIA's userspace {version} \
             is not fetched and the tests that run it will skip"
        );
        return Ok(());
    }
    eprintln!(
        "setup: fetching NVIDIA's userspace {version} (Debian {} non-free, with an apt state of \
         its own; unpacked under target/, not installed)",
        u.suite
    );
    let work = crate::root()
        .join("target/nvidia-userspace/apt")
        .join(u.suite);
    let _ = std::fs::remove_dir_all(&work);
    for d in ["lists/partial", "cache/archives/partial", "debs"] {
        std::fs::create_dir_all(work.join(d))?;
    }
    std::fs::write(
        work.join("sources.list"),
        format!(
            "# Written by `cargo xtask setup` (Keling); read only by its own apt calls.\n\
             deb [arch=amd64 signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {} non-free\n",
            u.suite
        ),
    )?;
    let apt = own_apt_state(&work);
    // Root is not needed with a state of one's own: no lock of the host's is taken.
    run(Command::new("apt-get")
        .args(&apt)
        .args(["-q", "update"])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    let mut packages: Vec<String> = NVIDIA_PACKAGES
        .iter()
        .map(|p| format!("{p}={version}-{}", u.revision))
        .collect();
    if u.pkcs11 {
        packages.push(format!(
            "libnvidia-pkcs11-openssl3={version}-{}",
            u.revision
        ));
    }
    // `apt-get download` writes into its working directory (and says so when
    // the `_apt` user cannot write there: harmless).
    let download = work.join("debs");
    let status = Command::new("apt-get")
        .args(&apt)
        .args(["-q", "download"])
        .args(&packages)
        .current_dir(&download)
        .status()
        .context("start apt-get download")?;
    if !status.success() {
        bail!(
            "apt-get download of {packages:?} from Debian {} failed: {status} (the pinned \
             version may have left the archive: see docs/real-nvidia.md)",
            u.suite
        );
    }
    // Unpack into a fresh directory and move it in place last, so an
    // interrupted run never leaves a half tree that looks complete.
    let partial = dir.with_file_name(format!("{version}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    for deb in std::fs::read_dir(&download)? {
        let deb = deb?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
        }
    }
    if !partial.join(LIBCUDA).exists() {
        bail!(
            "the unpacked packages in {} hold no libcuda.so.1",
            partial.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    let _ = std::fs::remove_dir_all(&work);
    if let Some(apt) = work.parent() {
        let _ = std::fs::remove_dir(apt); // when empty
    }
    Ok(())
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
