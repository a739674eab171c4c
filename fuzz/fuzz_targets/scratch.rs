//! A file for the targets whose parser reads a path: one per process, in
//! /dev/shm when there is one (no disk writes per input).
use std::path::PathBuf;

pub fn write(name: &str, data: &[u8]) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("keling-fuzz-{name}-{}", std::process::id()));
    std::fs::write(&path, data).expect("write the fuzz input to a scratch file");
    path
}
