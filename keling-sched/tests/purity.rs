//! "No clock, no I/O, no randomness, no hash order" as a test, not a comment: the
//! scheduler core must give the same outputs for the same inputs, which is what
//! lets `keling replay` re-run a recorded session exactly. This test fails if the
//! crate gains a dependency that could break that, or if its sources (`src/`,
//! every `.rs` file under it) name the clock, the file system, the network,
//! processes, threads, the environment, standard I/O or hash maps.
//!
//! This file is outside `src/` and may read files: it is not part of the core.

use std::fs;
use std::path::{Path, PathBuf};

const MANIFEST: &str = include_str!("../Cargo.toml");

/// The only dependencies allowed, per section.
const ALLOWED_DEPENDENCIES: &[&str] = &["serde"];
const ALLOWED_DEV_DEPENDENCIES: &[&str] = &["proptest", "serde_json"];

/// Crates that do I/O or read a clock; named anywhere in the manifest, they fail it.
const FORBIDDEN_CRATES: &[&str] = &[
    "tokio",
    "libc",
    "aya",
    "nix",
    "rand",
    "getrandom",
    "chrono",
    "time",
    "mio",
    "log",
];

/// What the sources must not name. The paths are split so that this list does not
/// match itself (this file is not under `src/` anyway).
fn forbidden_source_names() -> Vec<String> {
    let mut names = Vec::new();
    // `std::time`, `time::Instant`, ... and, for grouped imports such as
    // `use std::{fs, io}`, the modules' paths in use (`fs::read`).
    for module in FORBIDDEN_STD_MODULES {
        names.push(format!("std{}{module}", "::"));
        names.push(format!("{module}{}", "::"));
    }
    for ident in [
        "Instant",
        "SystemTime",
        "UNIX_EPOCH",
        "HashMap",
        "HashSet",
        "RandomState",
        "File",
        "OpenOptions",
        "TcpStream",
        "UdpSocket",
        "Command",
        "tokio",
        "libc",
        "aya",
        "rand",
        "unsafe",
        "extern",
    ] {
        names.push(ident.to_string());
    }
    for mac in ["print", "println", "eprint", "eprintln", "dbg"] {
        names.push(format!("{mac}!"));
    }
    names
}

/// Whether `needle` occurs in `text` starting at a word boundary (so `os::` does not
/// match `pos::`, nor `File` `Profile`).
fn names(text: &str, needle: &str) -> bool {
    text.match_indices(needle).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let word_start = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let ends_in_word = needle.ends_with(|c: char| c.is_alphanumeric() || c == '_');
        let after = text[at + needle.len()..].chars().next();
        let word_end = !ends_in_word || !after.is_some_and(|c| c.is_alphanumeric() || c == '_');
        word_start && word_end
    })
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// `(section, dependency name)` for every dependency the manifest declares,
/// `[target.*.dependencies]` and `[dependencies.NAME]` tables included.
fn declared_dependencies(manifest: &str) -> Vec<(String, String)> {
    let mut deps = Vec::new();
    let mut section = String::new();
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header.trim_matches(['[', ']']).trim().to_string();
            // `[dependencies.serde]`: the table names the dependency.
            for kind in ["dependencies", "dev-dependencies", "build-dependencies"] {
                if let Some(name) = section.strip_prefix(&format!("{kind}.")) {
                    deps.push((kind.to_string(), name.trim_matches('"').to_string()));
                }
            }
            continue;
        }
        if section.ends_with("dependencies")
            && let Some((name, _)) = line.split_once('=')
        {
            let name = name.trim().trim_matches('"');
            let name = name.split('.').next().unwrap_or(name);
            deps.push((section.clone(), name.to_string()));
        }
    }
    deps
}

#[test]
fn dependencies_are_only_the_allowed_pure_ones() {
    let deps = declared_dependencies(MANIFEST);
    assert!(
        deps.contains(&("dependencies".to_string(), "serde".to_string())),
        "the manifest parser missed serde: {deps:?}"
    );
    for (section, name) in &deps {
        let allowed = match section.as_str() {
            "dependencies" => ALLOWED_DEPENDENCIES,
            "dev-dependencies" => ALLOWED_DEV_DEPENDENCIES,
            _ => &[],
        };
        assert!(
            allowed.contains(&name.as_str()),
            "keling-sched must not depend on `{name}` ([{section}]): the core has no \
             clock and no I/O; allowed: {ALLOWED_DEPENDENCIES:?}, dev: {ALLOWED_DEV_DEPENDENCIES:?}"
        );
    }
    for line in MANIFEST.lines() {
        let code = line.split('#').next().unwrap_or("");
        for krate in FORBIDDEN_CRATES {
            assert!(
                !names(code, krate) || code.trim_start().starts_with("description"),
                "Cargo.toml names `{krate}`: {line}"
            );
        }
        assert!(
            !code.trim_start().starts_with("build"),
            "keling-sched has no build script: {line}"
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        !root.join("build.rs").exists(),
        "keling-sched has no build script"
    );
}

/// The modules under `std` the core must not touch.
const FORBIDDEN_STD_MODULES: &[&str] =
    &["time", "fs", "net", "process", "thread", "env", "io", "os"];

/// The top-level modules named by grouped imports, `use std::{fs, io::Write}` →
/// `fs`, `io`, wherever the braces and line breaks fall.
fn grouped_std_modules(text: &str) -> Vec<String> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let mut modules = Vec::new();
    for (at, _) in compact.match_indices("std::{") {
        let mut depth = 0;
        let mut segment = String::new();
        for c in compact[at + "std::{".len()..].chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    modules.push(std::mem::take(&mut segment));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    modules.push(std::mem::take(&mut segment));
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                segment.push(c);
            }
        }
    }
    modules
        .into_iter()
        .map(|s| s.split([':', '{']).next().unwrap_or("").to_string())
        .map(|s| s.split("as").next().unwrap_or("").to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// What `text` (one source file) names that the core must not.
fn offences(text: &str) -> Vec<String> {
    let forbidden = forbidden_source_names();
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for name in &forbidden {
            if names(line, name) {
                found.push(format!("line {}: `{name}`: {}", n + 1, line.trim()));
            }
        }
    }
    for module in grouped_std_modules(text) {
        if FORBIDDEN_STD_MODULES.contains(&module.as_str()) {
            found.push(format!("a grouped import of `std::{module}`"));
        }
    }
    found
}

#[test]
fn sources_name_no_clock_io_threads_or_hash_maps() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("lib.rs")) && files.len() > 5,
        "found only {files:?}"
    );
    let mut all = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        for offence in offences(&text) {
            all.push(format!("{}: {offence}", file.display()));
        }
    }
    assert!(
        all.is_empty(),
        "the scheduler core must not use a clock, I/O, threads or hash maps:\n{}",
        all.join("\n")
    );
}

#[test]
fn unsafe_code_is_forbidden_at_the_crate_root() {
    let lib = include_str!("../src/lib.rs");
    assert!(lib.contains("#![forbid(unsafe_code)]"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    let caught = |text: &str| !offences(text).is_empty();
    for bad in [
        "use std::time::Instant;",
        "let t = Instant::now();",
        "use std::{fs, collections::BTreeMap};",
        "use std::{\n    collections::BTreeMap,\n    time as t,\n};",
        "use std::{collections::{BTreeMap, BTreeSet}, io::Write};",
        "fs::read_to_string(path)",
        "let m: HashMap<u64, u64> = HashMap::new();",
        "std::thread::sleep(d);",
        "println!(\"{x}\");",
        "std::process::exit(1);",
        "let v = std::env::var(\"X\");",
        "unsafe { x() }",
    ] {
        assert!(caught(bad), "missed: {bad}");
    }
    for fine in [
        "use std::collections::{BTreeMap, BTreeSet, VecDeque};",
        "use std::{cmp::Reverse, collections::{BTreeMap, VecDeque}, fmt};",
        "use std::fmt;",
        "let pos = 3; // position",
        "fn timestamp_ns(&self) -> u64",
        "/// `Terminate` is followed by `Kill`",
        "Profile::default()",
        "idle_timeout_ms",
    ] {
        assert!(!caught(fine), "false alarm: {fine}");
    }
    let manifest = "[dependencies]\nserde = \"1\"\n[target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n[dev-dependencies.tokio]\nversion = \"1\"\n";
    assert_eq!(
        declared_dependencies(manifest),
        [
            ("dependencies", "serde"),
            ("target.'cfg(unix)'.dependencies", "libc"),
            ("dev-dependencies", "tokio"),
        ]
        .map(|(s, n)| (s.to_string(), n.to_string()))
    );
}
