//! Fork, exec and wait; the exec'd child (`--exec-child`).
use super::*;

pub(crate) fn flush_stdout() {
    let _ = std::io::stdout().flush();
}

/// Forks; the child runs `f` and `_exit`s with its result.
pub(crate) fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    flush_stdout();
    // SAFETY: no other thread of ours runs at this point (threads are joined
    // before any fork), so the child may run ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die(&format!("fork: errno {}", errno()));
    }
    if pid == 0 {
        FORKED.store(true, Ordering::Relaxed);
        let code = f();
        leave(code);
    }
    pid
}

/// Waits for `pid`; returns the raw wait status.
pub(crate) fn wait(pid: libc::pid_t) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: `st` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return st;
        }
        if r < 0 && errno() != libc::EINTR {
            die(&format!("waitpid {pid}: errno {}", errno()));
        }
    }
}

pub(crate) fn expect_exit0(what: &str, st: i32) {
    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
        die(&format!("{what} child ended with wait status {st:#x}"));
    }
}

/// Continuing after exec as a child of the random scenario.
pub(crate) fn exec_child(cli: &Cli, env: &Env) -> i32 {
    let mut rng = Rng(cli.seed);
    // SAFETY: F_GETFD only inspects our descriptor table.
    let valid = unsafe { libc::fcntl(cli.ctl_fd, libc::F_GETFD) } >= 0;
    let mode = cli.exec_child.as_deref().unwrap_or("");
    let mut a = match mode {
        "inherit" => {
            if !valid {
                die(&format!("fd {} was not kept across exec", cli.ctl_fd));
            }
            Actor::new(env, rng.fork(), cli.ctl_fd, cli.handle_base)
                .join(cli.client, cli.device, cli.gpu)
        }
        "cloexec" => {
            if valid {
                die(&format!("O_CLOEXEC fd {} survived exec", cli.ctl_fd));
            }
            let fd = env.open("nvidiactl", false);
            let mut a = Actor::new(env, rng.fork(), fd, cli.handle_base);
            a.client_and_device(Some(cli.gpu));
            a
        }
        _ => die(&format!("unknown --exec-child {mode}")),
    };
    let n = 1 + a.rng.below(3);
    for _ in 0..n {
        a.alloc_random_video();
    }
    0 // exit without freeing
}
