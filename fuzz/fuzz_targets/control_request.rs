//! A control request as the agent's socket server takes it: the real server
//! (`control::server::spawn`) on a unix socket, a client that sends the bytes in
//! one or two writes, each with some fds attached (SCM_RIGHTS), then closes its
//! sending side and reads every reply to the end.
//!
//! Input: byte 0 = fds with the first write (low 3 bits) and with the second
//! (next 3 bits); byte 1 = where the second write starts (as a share of the
//! rest); the rest = the request bytes.
//!
//! Checked: the server answers and closes (no hang: libFuzzer's -timeout), a
//! request it hands on carries no more fds than were sent, and once the
//! connection is over every fd the client sent is closed again (none leaks).
#![no_main]
use std::{
    os::fd::{AsRawFd, RawFd},
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
};

use keling_agent::control::{
    send_with_fds,
    server::{self, Admit, Incoming},
};
use libfuzzer_sys::fuzz_target;
use tokio::{io::AsyncReadExt, net::UnixStream, runtime::Runtime, sync::mpsc};

struct Server {
    rt: Runtime,
    path: PathBuf,
    /// (fds the last handed-on request carried), set by the drain task.
    handed_on: Arc<Mutex<Vec<usize>>>,
    /// An fd to send: /dev/null.
    null: std::fs::File,
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = std::env::temp_dir().join(format!("keling-fuzz-control-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("socket directory");
        let path = dir.join("keling.sock");
        let handed_on = Arc::new(Mutex::new(Vec::new()));
        let seen = handed_on.clone();
        let listen = path.clone();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&listen).expect("bind the socket");
            let (tx, mut rx) = mpsc::channel::<Incoming>(64);
            let admit: Admit = Arc::new(|_| Ok(()));
            server::spawn(listener, tx, admit);
            // The agent's side: take each request and drop it (no reply: the
            // connection ends when its Replier is gone).
            tokio::spawn(async move {
                while let Some(incoming) = rx.recv().await {
                    seen.lock().unwrap().push(incoming.fds.len());
                }
            });
        });
        let null = std::fs::File::open("/dev/null").expect("open /dev/null");
        Server {
            rt,
            path,
            handed_on,
            null,
        }
    })
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 || data.len() > 100_000 {
        return;
    }
    let s = server();
    let first_fds = (data[0] & 7) as usize;
    let second_fds = ((data[0] >> 3) & 7) as usize;
    let body = &data[2..];
    let split = body.len() * data[1] as usize / 256;
    let (one, two) = body.split_at(split);
    let null = s.null.as_raw_fd();
    let before = open_fds();
    s.handed_on.lock().unwrap().clear();
    let sent = s.rt.block_on(async {
        let stream = UnixStream::connect(&s.path).await.expect("connect");
        let fd = stream.as_raw_fd();
        let mut sent = 0;
        for (part, n) in [(one, first_fds), (two, second_fds)] {
            if part.is_empty() {
                continue;
            }
            let fds: Vec<RawFd> = vec![null; n];
            if send_with_fds(fd, part, &fds).is_err() {
                break;
            }
            sent += n;
        }
        // SAFETY: shutdown of our own connected socket.
        unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        let mut replies = Vec::new();
        let mut stream = stream;
        // The server may close with bytes of ours unread (a launch's follow-ups
        // once its replies are done): then the end reads as a reset, not EOF.
        match stream.read_to_end(&mut replies).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("reading the replies: {e}"),
        }
        sent
    });
    // Let every task the connection started finish.
    for _ in 0..8 {
        s.rt.block_on(tokio::task::yield_now());
    }
    for n in s.handed_on.lock().unwrap().drain(..) {
        assert!(
            n <= sent,
            "a request carried {n} fds; the client sent {sent}"
        );
    }
    let after = open_fds();
    assert_eq!(before, after, "fds open before the request and after it");
});
