//! The server side of the control protocol. Every client is served on its own task,
//! with a deadline and a size limit on its request, so no client (silent, slow,
//! sending garbage or a flood) can delay the agent's event loop: the loop only ever
//! sees a fully read, well-formed [`Incoming`] request, and sends replies through a
//! channel that never blocks it.
use std::{
    os::fd::{AsRawFd, OwnedFd},
    time::Duration,
};

use tokio::{
    io::AsyncWriteExt,
    net::{UnixListener, UnixStream},
    sync::mpsc,
};

use super::{MAX_REQUEST_BYTES, REQUEST_DEADLINE, Reply, Request, recv_with_fds};

/// How long the agent waits for a client to take a reply before dropping it.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How long accepting pauses after an error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Who is on the other end (SO_PEERCRED).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// Replies to one client; dropping it ends the connection once they are written.
#[derive(Clone, Debug)]
pub struct Replier(mpsc::UnboundedSender<Reply>);

impl Replier {
    /// Queues a reply. Never blocks; a client that went away is not an error.
    pub fn send(&self, reply: Reply) {
        let _ = self.0.send(reply);
    }
}

/// A request read in full from a client.
pub struct Incoming {
    pub request: Request,
    /// fds passed with it (a launch's stdin, stdout, stderr).
    pub fds: Vec<OwnedFd>,
    pub peer: Peer,
    pub reply: Replier,
}

/// Accepts clients on `listener` for as long as the agent runs, handing each
/// well-formed request to `requests`.
pub fn spawn(listener: UnixListener, requests: mpsc::Sender<Incoming>) {
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve(stream, requests.clone()));
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOMEM...: say so and try again shortly.
                    log::warn!("control socket: accept failed: {e}; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    });
}

async fn serve(stream: UnixStream, requests: mpsc::Sender<Incoming>) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid(),
        },
        Err(e) => {
            log::warn!("control socket: no peer credentials: {e}");
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let replier = Replier(tx);
    match tokio::time::timeout(REQUEST_DEADLINE, read_request(&stream)).await {
        Ok(Ok((request, fds))) => {
            let incoming = Incoming {
                request,
                fds,
                peer,
                reply: replier,
            };
            if requests.send(incoming).await.is_err() {
                return; // the agent is stopping
            }
        }
        Ok(Err(what)) => replier.send(Reply::Error(what)),
        Err(_) => replier.send(Reply::Error(format!(
            "no complete request within {} s; send one JSON line (see `keling --help`)",
            REQUEST_DEADLINE.as_secs()
        ))),
    }
    let mut stream = stream;
    while let Some(reply) = rx.recv().await {
        let mut line = serde_json::to_vec(&reply).expect("replies serialise");
        line.push(b'\n');
        match tokio::time::timeout(WRITE_DEADLINE, stream.write_all(&line)).await {
            Ok(Ok(())) => {}
            _ => return, // gone or not reading: drop it
        }
    }
}

/// Reads one request line (with any fds), within the size limit.
async fn read_request(stream: &UnixStream) -> Result<(Request, Vec<OwnedFd>), String> {
    let mut bytes = Vec::new();
    let mut fds = Vec::new();
    loop {
        stream.readable().await.map_err(|e| e.to_string())?;
        let (chunk, more_fds) = match recv_with_fds(stream.as_raw_fd()) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(format!("reading the request: {e}")),
            Ok(r) => r,
        };
        if chunk.is_empty() {
            return Err("the connection closed before a complete request".into());
        }
        fds.extend(more_fds);
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(format!(
                "request larger than {MAX_REQUEST_BYTES} bytes: refused"
            ));
        }
        if let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            bytes.truncate(end);
            break;
        }
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| "the request is not UTF-8".to_string())?;
    let request = serde_json::from_str(text.trim()).map_err(|e| {
        format!("bad request ({e}): expected one JSON line such as {{\"status\":true}}")
    })?;
    Ok((request, fds))
}
