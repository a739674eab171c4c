//! The `fd-flood` and `fd-hoard` scenarios.
use super::*;

/// A child opens `--fds` nvidiactl fds (openat), on each a client, a device and
/// 1 MiB of video memory on GPU 0 (checkpoint 1, the child's); then the child
/// exits holding them all, so every file is released by its exit, and the parent,
/// which never had them, waits for it (checkpoint 2) and exits after.
pub(crate) fn fd_flood(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let fds = cli.fds;
    let on = cp.on;
    let child = fork_child(|| {
        for _ in 0..fds {
            let ctl = env.open("nvidiactl", false);
            let (c, d) = env.session(ctl, 0);
            env.alloc_local(ctl, c, d, MIB);
        }
        let mut own = Checkpoints {
            on,
            every: 0,
            steps: 0,
            n: 0,
        };
        own.emit();
        0
    });
    expect_exit0("fd-flood child", wait(child));
    cp.n = 1;
    cp.emit();
}

/// `fd-hoard`: opens `--fds` nvidiactl fds and makes no call on them (what any
/// user of the host may do: the device is mode 0666), then a checkpoint, and
/// exits holding them.
pub(crate) fn fd_hoard(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let fds: Vec<RawFd> = (0..cli.fds).map(|_| env.open("nvidiactl", false)).collect();
    cp.emit();
    drop(fds);
}
