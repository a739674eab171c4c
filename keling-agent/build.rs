//! Embeds the eBPF object that `cargo xtask build` compiled (with nightly, for
//! bpfel-unknown-none) and passes in `KELING_EBPF_OBJ`.
//!
//! Without it (a plain `cargo build`, which must work on stable) the agent is built
//! with an empty object and says so at run time instead of failing to compile.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=KELING_EBPF_OBJ");
    println!("cargo::rustc-check-cfg=cfg(keling_no_ebpf)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("keling.bpf.o");
    match env::var_os("KELING_EBPF_OBJ") {
        Some(src) => {
            let src = PathBuf::from(src);
            println!("cargo::rerun-if-changed={}", src.display());
            fs::copy(&src, &dest).unwrap_or_else(|e| {
                panic!(
                    "KELING_EBPF_OBJ={}: {e}; run `cargo xtask build`",
                    src.display()
                )
            });
        }
        None => {
            fs::write(&dest, b"").expect("write empty eBPF object");
            println!("cargo::rustc-cfg=keling_no_ebpf");
        }
    }
}
