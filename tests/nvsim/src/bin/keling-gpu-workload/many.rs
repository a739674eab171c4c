//! The `many-fds` and `many-clients` scenarios.
use super::*;

/// More NVIDIA fds than Keling's per-process table holds (40 against 32, opened
/// with openat): on each a client, a device and 1 MiB of video memory.
/// Checkpoints: 1 all allocated; 2 the 29th to 34th fds closed (releasing their
/// files: four held by Keling's table, two beyond it); then it exits holding the
/// rest, six beyond the table among them (their release at exit tears them down).
pub(crate) fn many_fds(env: &Env, cp: &mut Checkpoints) {
    let mut fds = Vec::new();
    for _ in 0..40 {
        let ctl = env.open("nvidiactl", false);
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
        fds.push(ctl);
    }
    cp.emit();
    for fd in fds.drain(28..34) {
        close(fd);
    }
    cp.emit();
}

/// One nvidiactl file that outlives many clients: 20 sessions made and freed on
/// it one after another (more than an open file's table of clients holds at
/// once), then 3 kept, with 1 MiB each (checkpoint 1); then the file is closed,
/// which frees those 3 (checkpoint 2).
pub(crate) fn many_clients(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    for _ in 0..20 {
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
        expect_ok("free client", env.free(ctl, c, 0, c));
    }
    for _ in 0..3 {
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
    }
    cp.emit();
    close(ctl);
    cp.emit();
}
