//! `keling thaw --all`: what the fail-safe does, by hand.
#[derive(Debug, clap::Args)]
pub struct ThawArgs {
    /// Everything Keling froze or stopped (the only mode).
    #[arg(long, required = true)]
    all: bool,
}

pub fn thaw(_args: ThawArgs) -> anyhow::Result<i32> {
    let n = crate::sched::cgroup::thaw_all();
    println!("thawed or continued {n} task(s)");
    Ok(0)
}
