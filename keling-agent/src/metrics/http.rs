//! A minimal HTTP/1.1 server for `/metrics`, on the agent's tokio runtime, that no client
//! can turn against the scheduler:
//!
//! - each connection is served on its own task; at most [`MAX_CONNECTIONS`] at once (more
//!   are closed at once);
//! - the request head must arrive within [`READ_DEADLINE`] and fit in [`MAX_HEAD_BYTES`]
//!   (else 408 or 431), the response must be taken within [`WRITE_DEADLINE`];
//! - only `GET` and `HEAD` of `/metrics` (and `/`) are answered; anything else gets 400,
//!   404 or 405, and every connection is closed after one response;
//! - the run loop only ever sees a [`Scrape`] through a bounded channel, which the server
//!   never waits on: when it is full the client gets 503. The loop renders at most once per
//!   [`super::CACHE_NS`].
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot},
};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// The longest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a client has to send its request head.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client has to take its response.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a scrape waits for the run loop.
const RENDER_DEADLINE: Duration = Duration::from_secs(5);
/// Scrapes queued for the run loop.
pub const QUEUE: usize = 16;
/// How long accepting pauses after an error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The `Content-Type` of the Prometheus text format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A scrape for the run loop: it answers with the exposition text.
pub struct Scrape {
    pub reply: oneshot::Sender<Arc<String>>,
}

/// Serves `listener` until the runtime stops; scrapes go to `scrapes`.
pub fn spawn(listener: TcpListener, scrapes: mpsc::Sender<Scrape>) {
    let active = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("metrics: accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                active.fetch_sub(1, Ordering::AcqRel);
                drop(stream);
                continue;
            }
            let active = active.clone();
            let scrapes = scrapes.clone();
            tokio::spawn(async move {
                serve(stream, &scrapes).await;
                active.fetch_sub(1, Ordering::AcqRel);
            });
        }
    });
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    Index { head_only: bool },
    Error(u16, &'static str),
}

/// Reads a request head: `None` when the client went away or sent nothing in time.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Route> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            if let Some(end) = find_end(&head) {
                head.truncate(end);
                return Ok(());
            }
            if head.len() > MAX_HEAD_BYTES {
                return Err(Route::Error(431, "Request Header Fields Too Large"));
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Err(Route::Error(0, "")),
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    match tokio::time::timeout(READ_DEADLINE, read).await {
        Ok(Ok(())) => Ok(head),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Route::Error(408, "Request Timeout")),
    }
}

/// Where the head ends (before its blank line).
fn find_end(head: &[u8]) -> Option<usize> {
    let crlf = head.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = head.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Routes a request head.
fn route(head: &[u8]) -> Route {
    let Ok(text) = std::str::from_utf8(head) else {
        return Route::Error(400, "Bad Request");
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Error(400, "Bad Request");
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Error(400, "Bad Request");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::Error(405, "Method Not Allowed"),
    };
    let path = target.split(['?', '#']).next().unwrap_or("");
    match path {
        "/metrics" => Route::Metrics { head_only },
        "/" => Route::Index { head_only },
        _ => Route::Error(404, "Not Found"),
    }
}

async fn serve(mut stream: TcpStream, scrapes: &mpsc::Sender<Scrape>) {
    let route = match read_head(&mut stream).await {
        Ok(head) => route(&head),
        Err(Route::Error(0, _)) => return,
        Err(e) => e,
    };
    let (status, reason, content_type, body, head_only): (u16, &str, &str, Arc<String>, bool) =
        match route {
            Route::Metrics { head_only } => {
                let (tx, rx) = oneshot::channel();
                if scrapes.try_send(Scrape { reply: tx }).is_err() {
                    (
                        503,
                        "Service Unavailable",
                        "text/plain",
                        Arc::new("busy: try again\n".into()),
                        head_only,
                    )
                } else {
                    match tokio::time::timeout(RENDER_DEADLINE, rx).await {
                        Ok(Ok(text)) => (200, "OK", CONTENT_TYPE, text, head_only),
                        _ => (
                            503,
                            "Service Unavailable",
                            "text/plain",
                            Arc::new("the agent did not answer in time\n".into()),
                            head_only,
                        ),
                    }
                }
            }
            Route::Index { head_only } => (
                200,
                "OK",
                "text/plain; charset=utf-8",
                Arc::new("Keling agent: Prometheus metrics at /metrics\n".into()),
                head_only,
            ),
            Route::Error(status, reason) => (
                status,
                reason,
                "text/plain",
                Arc::new(format!("{status} {reason}\n")),
                false,
            ),
        };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let write = async {
        stream.write_all(out.as_bytes()).await?;
        if !head_only {
            stream.write_all(body.as_bytes()).await?;
        }
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(WRITE_DEADLINE, write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics?x=1 HTTP/1.0"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route(b"GET / HTTP/1.1"), Route::Index { head_only: false });
        assert_eq!(
            route(b"POST /metrics HTTP/1.1"),
            Route::Error(405, "Method Not Allowed")
        );
        assert_eq!(route(b"GET /x HTTP/1.1"), Route::Error(404, "Not Found"));
        for bad in [
            &b"garbage"[..],
            b"GET /metrics",
            b"GET /metrics SPDY/3",
            b"GET  /metrics HTTP/1.1",
            b"\xff\xfe",
        ] {
            assert_eq!(route(bad), Route::Error(400, "Bad Request"), "{bad:?}");
        }
        assert_eq!(find_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest"), Some(20));
        assert_eq!(find_end(b"GET / HTTP/1.0\n\n"), Some(14));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\n"), None);
    }

    /// A real server on a loopback port with a fake run loop: hostile clients do not
    /// stop a well-behaved one from being served.
    #[test]
    fn hostile_clients_do_not_block_a_scrape() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, mut rx) = mpsc::channel::<Scrape>(QUEUE);
            spawn(listener, tx);
            tokio::spawn(async move {
                while let Some(s) = rx.recv().await {
                    let _ = s.reply.send(Arc::new("keling_up 1\n".into()));
                }
            });
            // Silent clients, an oversized head, garbage.
            let mut silent = Vec::new();
            for _ in 0..10 {
                silent.push(TcpStream::connect(addr).await.unwrap());
            }
            let mut big = TcpStream::connect(addr).await.unwrap();
            big.write_all(&vec![b'a'; MAX_HEAD_BYTES + 1])
                .await
                .unwrap();
            let mut answer = String::new();
            let _ = big.read_to_string(&mut answer).await;
            assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
            let mut junk = TcpStream::connect(addr).await.unwrap();
            junk.write_all(b"\x00\x01\x02\r\n\r\n").await.unwrap();
            let mut answer = String::new();
            junk.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
            // A real scrape is answered at once.
            let started = std::time::Instant::now();
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            c.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert!(answer.contains("Content-Length: 12\r\n"), "{answer}");
            assert!(answer.ends_with("\r\n\r\nkeling_up 1\n"), "{answer}");
            assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
            drop(silent);
        });
    }
}
