//! `keling`: the Keling agent. See `keling --help`; the library's crate doc maps
//! its modules.
fn main() {
    std::process::exit(keling_agent::cmd::main());
}
