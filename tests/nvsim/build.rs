//! Builds the sandbox's stat shim (`shim/chardev.c`) as a shared library that
//! `keling-nvsim sandbox` embeds and preloads into the command it runs.
use std::path::PathBuf;

fn main() {
    let src = "shim/chardev.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("libchardev.so");
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("run the C compiler for shim/chardev.c");
    assert!(status.success(), "compiling shim/chardev.c failed");
}
