//! `keling floor` (hidden): attaches two empty eBPF programs to the ioctl
//! tracepoints Keling uses and holds them until SIGINT or SIGTERM. It is
//! `cargo xtask bench`'s floor: what any tracer attached there costs at least,
//! measured with Keling's own loader.

#[derive(Debug, clap::Args)]
pub struct FloorArgs {}

pub fn floor(_args: FloorArgs) -> anyhow::Result<i32> {
    let ebpf = crate::bpf::attach_floor()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        eprintln!(
            "{} (empty programs on sys_enter_ioctl and sys_exit_ioctl; Ctrl-C detaches)",
            keling_common::lines::FLOOR_READY
        );
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    drop(ebpf);
    Ok(0)
}
