//! Embeds Keling's eBPF object in the agent, as `OUT_DIR/keling.bpf.o`.
//!
//! Where the object comes from, the first that applies:
//!
//! | case | object |
//! |---|---|
//! | `KELING_EBPF_OBJ` is set (`cargo xtask` builds it in `target/bpf` first) | that file, copied |
//! | nightly with `rust-src` and `bpf-linker` are installed | `keling-ebpf` built here by aya-build |
//! | one of them is missing, or `AYA_BUILD_SKIP=1` | empty, with cfg `keling_no_ebpf` and a warning saying what to install; the agent says so at run time |
//!
//! aya-build runs a nested nightly cargo with its own target dir under `OUT_DIR`, so
//! it never waits for the lock this build holds on `target/`. `keling-ebpf` is a
//! build-dependency (its stub lib) as in aya-template, so cargo reruns this script
//! when it, `keling-common` or `aya-ebpf` change. aya-build's object also carries BTF
//! and debug info (it links with `--btf`), which `cargo xtask`'s does not.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

/// The eBPF crate (the name of its package and of its bin target).
const EBPF_PACKAGE: &str = "keling-ebpf";

fn main() {
    println!("cargo::rerun-if-env-changed=KELING_EBPF_OBJ");
    println!("cargo::rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo::rustc-check-cfg=cfg(keling_no_ebpf)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("keling.bpf.o");
    if let Some(src) = env::var_os("KELING_EBPF_OBJ") {
        let src = PathBuf::from(src);
        println!("cargo::rerun-if-changed={}", src.display());
        fs::copy(&src, &dest).unwrap_or_else(|e| {
            panic!(
                "KELING_EBPF_OBJ={}: {e}; run `cargo xtask build`",
                src.display()
            )
        });
        return;
    }
    let manifest_dir = env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let workspace = Path::new(&manifest_dir)
        .parent()
        .expect("keling-agent is one level below the workspace root");
    for path in [EBPF_PACKAGE, "keling-common", ".cargo/config.toml"] {
        println!("cargo::rerun-if-changed={}", workspace.join(path).display());
    }
    if env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return build_without(&dest, "AYA_BUILD_SKIP is set");
    }
    match missing_tool() {
        None => build_ebpf(workspace, &out, &dest),
        Some(m) => build_without(
            &dest,
            &format!(
                "{} is missing: {}; the next `cargo build` embeds them",
                m.what, m.fix
            ),
        ),
    }
}

/// The agent without programs: an empty object and cfg `keling_no_ebpf`.
fn build_without(dest: &Path, why: &str) {
    fs::write(dest, b"").expect("write empty eBPF object");
    println!("cargo::rustc-cfg=keling_no_ebpf");
    println!("cargo::warning=the agent is built WITHOUT its eBPF programs: {why}");
}

/// What this machine lacks to build the eBPF crate, and what to run.
struct Missing {
    what: &'static str,
    fix: String,
}

impl Missing {
    /// A tool `cargo xtask setup` installs, or `command` alone.
    fn tool(what: &'static str, command: &str) -> Self {
        Self {
            what,
            fix: format!("run `cargo xtask setup` (it installs what is missing) or `{command}`"),
        }
    }
}

/// The first tool aya-build needs that is not installed, watching where it would
/// appear so that the next build after installing it reruns this script.
fn missing_tool() -> Option<Missing> {
    let home = env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let cargo_home = env::var_os("CARGO_HOME").map_or_else(|| home.join(".cargo"), PathBuf::from);
    let rustup_home =
        env::var_os("RUSTUP_HOME").map_or_else(|| home.join(".rustup"), PathBuf::from);
    // `cargo install` puts bpf-linker here; rustup records toolchains it installs here.
    for dir in [cargo_home.join("bin"), rustup_home.join("update-hashes")] {
        if dir.is_dir() {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
    }
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .output();
    let sysroot = match sysroot {
        Err(_) => {
            return Some(Missing {
                what: "rustup",
                fix: "install rustup (https://rustup.rs), then run `cargo xtask setup`".into(),
            });
        }
        Ok(out) if !out.status.success() => {
            return Some(Missing::tool(
                "the nightly toolchain",
                "rustup toolchain install nightly --profile minimal --component rust-src",
            ));
        }
        Ok(out) => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
    };
    let components = sysroot.join("lib/rustlib/components");
    if components.is_file() {
        println!("cargo::rerun-if-changed={}", components.display());
    }
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Some(Missing::tool(
            "nightly's rust-src (for build-std)",
            "rustup component add rust-src --toolchain nightly",
        ));
    }
    let linker = Command::new("bpf-linker").arg("--version").output();
    if !linker.is_ok_and(|o| o.status.success()) {
        return Some(Missing::tool(
            "bpf-linker",
            "cargo +nightly install bpf-linker --locked --version 0.10.4",
        ));
    }
    None
}

/// Builds `keling-ebpf` (release, bpf target) with aya-build and moves it to `dest`.
fn build_ebpf(workspace: &Path, out: &Path, dest: &Path) {
    // aya-build passes its own flags in CARGO_ENCODED_RUSTFLAGS, which makes cargo
    // ignore `[target.bpfel-unknown-none] rustflags` of .cargo/config.toml (the BPF
    // ISA v3 the probes' atomics need). Profile rustflags are added to those, so the
    // config's flags go in as the release profile's, for the bpf target only (not for
    // build scripts and proc-macros: build-override).
    let flags = bpf_target_rustflags(&workspace.join(".cargo/config.toml"));
    // SAFETY: the build script has one thread; these are read by the cargo that
    // aya-build starts, which inherits them.
    unsafe {
        env::set_var("CARGO_UNSTABLE_PROFILE_RUSTFLAGS", "true");
        env::set_var("CARGO_PROFILE_RELEASE_RUSTFLAGS", flags.join(" "));
        env::set_var("CARGO_PROFILE_RELEASE_BUILD_OVERRIDE_RUSTFLAGS", "");
        // Only the compiler's messages come back (as warnings), not cargo's progress.
        env::set_var("CARGO_TERM_QUIET", "true");
    }
    let root_dir = workspace.join(EBPF_PACKAGE);
    let package = aya_build::Package {
        name: EBPF_PACKAGE,
        root_dir: root_dir.to_str().expect("the workspace path is UTF-8"),
        ..Default::default()
    };
    if let Err(e) = aya_build::build_ebpf([package], aya_build::Toolchain::Nightly) {
        panic!(
            "building the eBPF programs ({EBPF_PACKAGE}) with aya-build: {e:#}\n\
             (AYA_BUILD_SKIP=1 builds the agent without them)"
        );
    }
    // aya-build copies each bin target to OUT_DIR/<name>.
    let built = out.join(EBPF_PACKAGE);
    fs::rename(&built, dest)
        .unwrap_or_else(|e| panic!("aya-build's output {}: {e}", built.display()));
}

/// `[target.bpfel-unknown-none] rustflags` of the workspace's cargo config.
fn bpf_target_rustflags(config: &Path) -> Vec<String> {
    let text = fs::read_to_string(config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let config: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let flags = config
        .get("target")
        .and_then(|t| t.get("bpfel-unknown-none"))
        .and_then(|t| t.get("rustflags"))
        .and_then(|f| f.as_array())
        .map(|f| {
            f.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        });
    flags.unwrap_or_default()
}
