//! The `pass-server`, `pass-client` and `pass-holder` scenarios.
use super::*;

/// A client, a device on GPU 0 and 4 + 6 MiB of video memory on an nvidiactl fd,
/// which then goes to whoever connects to `--socket` (SCM_RIGHTS) with the four
/// handles; our own fd is closed at once, so the file lives on only in the other
/// process. Checkpoints: 1 allocated, 2 fd sent and closed, 3 the other side hung up.
pub(crate) fn pass_server(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-server needs --socket"));
    let ctl = env.open("nvidiactl", true);
    let (c, d) = env.session(ctl, 0);
    let mut handles = [c, d, 0, 0];
    for (i, size) in [4 * MIB, 6 * MIB].into_iter().enumerate() {
        handles[2 + i] = env.alloc_local(ctl, c, d, size);
    }
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .unwrap_or_else(|e| die(&format!("bind {}: {e}", path.display())));
    cp.emit();
    let (mut stream, _) = listener
        .accept()
        .unwrap_or_else(|e| die(&format!("accept: {e}")));
    let mut data = [0u8; 16];
    for (i, h) in handles.iter().enumerate() {
        put_u32(&mut data, 4 * i, *h);
    }
    send_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &data, &[ctl]);
    close(ctl);
    cp.emit();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut rest);
    cp.emit();
}

/// The other side of pass-server, in a process of its own: receives the nvidiactl fd
/// and the handles, frees the first 4 MiB allocation, allocates 2 MiB of its own under
/// the received device, moves the file to a dup of the fd and closes both, which
/// releases the file. Checkpoints: 1 received, 2 freed and allocated, 3 closed.
pub(crate) fn pass_client(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-client needs --socket"));
    let stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| die(&format!("connect {}: {e}", path.display())));
    let mut data = [0u8; 16];
    let fds = recv_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &mut data)
        .unwrap_or_else(|| die("no fd from pass-server"));
    let [ctl] = fds[..] else {
        die(&format!("expected one fd, got {fds:?}"))
    };
    let [c, d, h1] = [0, 4, 8].map(|o| u32_at(&data, o));
    cp.emit();
    expect_ok("free", env.free(ctl, c, d, h1));
    env.alloc_local(ctl, c, d, 2 * MIB);
    cp.emit();
    // SAFETY: dup of an fd we own.
    let copy = unsafe { libc::dup(ctl) };
    if copy < 0 {
        die("dup");
    }
    close(ctl);
    close(copy);
    cp.emit();
    drop(stream);
}

/// The other side of pass-server, second kind: receives the fd and holds it without
/// ever using it, then closes it (the last reference: the file is released here).
/// Checkpoints: 1 received, 2 closed.
pub(crate) fn pass_holder(cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-holder needs --socket"));
    let stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| die(&format!("connect {}: {e}", path.display())));
    let mut data = [0u8; 16];
    let fds = recv_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &mut data)
        .unwrap_or_else(|| die("no fd from pass-server"));
    cp.emit();
    for fd in fds {
        close(fd);
    }
    cp.emit();
    drop(stream);
}
