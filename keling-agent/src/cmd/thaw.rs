//! `keling thaw --all`: what the fail-safe does, by hand, for one instance
//! (`--instance NAME`; default: the default one).
#[derive(Debug, clap::Args)]
pub struct ThawArgs {
    /// Everything the instance's agent froze or stopped (the only mode): only the
    /// cgroups under its root and its stopped list, never another instance's.
    #[arg(long, required = true)]
    all: bool,
}

pub fn thaw(_args: ThawArgs) -> anyhow::Result<i32> {
    let n = crate::sched::cgroup::thaw_all();
    println!("thawed or continued {n} task(s)");
    Ok(0)
}
