//! `keling floor` (hidden): attaches two empty eBPF programs to the ioctl
//! tracepoints Keling uses and holds them until SIGINT or SIGTERM. It is
//! `cargo xtask bench`'s floor: what any tracer attached there costs at least,
//! measured with Keling's own loader. With `--raw-syscalls`, the two are on the
//! raw `sys_enter` and `sys_exit` tracepoints instead: the bench's measure of the
//! other way to see syscalls, a program run on every one.

#[derive(Debug, clap::Args)]
pub struct FloorArgs {
    /// Attach to the raw sys_enter and sys_exit tracepoints (every syscall)
    /// instead of sys_enter_ioctl and sys_exit_ioctl.
    #[arg(long)]
    raw_syscalls: bool,
}

pub fn floor(args: FloorArgs) -> anyhow::Result<i32> {
    let ebpf = crate::bpf::attach_floor(args.raw_syscalls)?;
    let on = if args.raw_syscalls {
        "the raw sys_enter and sys_exit tracepoints"
    } else {
        "sys_enter_ioctl and sys_exit_ioctl"
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        eprintln!(
            "{} (empty programs on {on}; Ctrl-C detaches)",
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
