//! The HTTP/1.1 server for `/metrics`: hyper on the agent's tokio runtime, configured so
//! that no client can turn it against the scheduler:
//!
//! - each connection is served on its own task; at most [`MAX_CONNECTIONS`] at once (more
//!   are closed at once, never queued): a semaphore in the accept loop;
//! - the request head must arrive within [`READ_DEADLINE`] (hyper's `header_read_timeout`:
//!   else the connection is closed) and fit in [`MAX_HEAD_BYTES`] (hyper's `max_buf_size`:
//!   else 431); malformed requests get hyper's 400;
//! - a whole connection lasts at most [`CONNECTION_DEADLINE`], which leaves the client
//!   [`WRITE_DEADLINE`] to take its response;
//! - only `GET` and `HEAD` of `/metrics` (and `/`) are answered; anything else gets 404
//!   or 405, and every connection is closed after one response (keep-alive off);
//! - the run loop only ever sees a [`Scrape`] through a bounded channel, which the server
//!   never waits on: when it is full the client gets 503. The loop renders at most once per
//!   [`super::CACHE_NS`].
use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Bytes,
    header::{ALLOW, CONTENT_TYPE as CONTENT_TYPE_HEADER, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, mpsc, oneshot},
};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// The longest request head (request line and headers). hyper's smallest `max_buf_size`.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a client has to send its request head.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client has to take its response.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a scrape waits for the run loop.
const RENDER_DEADLINE: Duration = Duration::from_secs(5);
/// The longest a connection lives: its head, the render, then the response. hyper has no
/// write timeout, so the write deadline is what is left of this one.
pub const CONNECTION_DEADLINE: Duration = READ_DEADLINE
    .saturating_add(RENDER_DEADLINE)
    .saturating_add(WRITE_DEADLINE);
/// Scrapes queued for the run loop.
pub const QUEUE: usize = 16;
/// How long accepting pauses after an error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The `Content-Type` of the Prometheus text format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// The `Content-Type` of errors and of 503.
const PLAIN: &str = "text/plain";

/// A scrape for the run loop: it answers with the exposition text.
pub struct Scrape {
    pub reply: oneshot::Sender<Arc<String>>,
}

/// Serves `listener` until the runtime stops; scrapes go to `scrapes`.
pub fn spawn(listener: TcpListener, scrapes: mpsc::Sender<Scrape>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(READ_DEADLINE)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        // The same head as before hyper: `Content-Length`, no `date`.
        .title_case_headers(true)
        .auto_date_header(false);
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let scrapes = scrapes.clone();
            let conn = http.serve_connection(
                TokioIo::new(stream),
                service_fn(move |request| answer(request, scrapes.clone())),
            );
            tokio::spawn(async move {
                // An error or the deadline: the client is gone or cut off, nothing to do.
                let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
                drop(slot);
            });
        }
    });
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    Index,
    Error(StatusCode),
}

/// Routes a request that hyper parsed. The method is checked first: `POST /x` is 405.
fn route(method: &Method, path: &str) -> Route {
    if method != Method::GET && method != Method::HEAD {
        return Route::Error(StatusCode::METHOD_NOT_ALLOWED);
    }
    match path {
        "/metrics" => Route::Metrics,
        "/" => Route::Index,
        _ => Route::Error(StatusCode::NOT_FOUND),
    }
}

/// Answers one request. hyper leaves the body out of a `HEAD` answer and keeps its length.
async fn answer<B>(
    request: Request<B>,
    scrapes: mpsc::Sender<Scrape>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(match route(request.method(), request.uri().path()) {
        Route::Metrics => {
            let (tx, rx) = oneshot::channel();
            if scrapes.try_send(Scrape { reply: tx }).is_err() {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "busy: try again\n".into(),
                )
            } else {
                match tokio::time::timeout(RENDER_DEADLINE, rx).await {
                    // A copy of the run loop's cached text: a scrape is rare and small.
                    Ok(Ok(text_)) => text(StatusCode::OK, CONTENT_TYPE, text_.as_str().into()),
                    _ => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        PLAIN,
                        "the agent did not answer in time\n".into(),
                    ),
                }
            }
        }
        Route::Index => text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "Keling agent: Prometheus metrics at /metrics\n".into(),
        ),
        Route::Error(status) => {
            let reason = status.canonical_reason().unwrap_or("");
            let mut response = text(status, PLAIN, format!("{} {reason}\n", status.as_u16()));
            if status == StatusCode::METHOD_NOT_ALLOWED {
                response
                    .headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            response
        }
    })
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Instant};

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::GET, "/"), Route::Index);
        assert_eq!(
            route(&Method::POST, "/metrics"),
            Route::Error(StatusCode::METHOD_NOT_ALLOWED)
        );
        assert_eq!(
            route(&Method::POST, "/x"),
            Route::Error(StatusCode::METHOD_NOT_ALLOWED)
        );
        assert_eq!(
            route(&Method::GET, "/x"),
            Route::Error(StatusCode::NOT_FOUND)
        );
    }

    /// Runs `test` against a real server on a loopback port whose fake run loop answers
    /// `keling_up 1\n`, or never reads its queue when `answering` is false.
    fn with_server<F: Future<Output = ()>>(
        queue: usize,
        answering: bool,
        test: impl FnOnce(SocketAddr) -> F,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, mut rx) = mpsc::channel::<Scrape>(queue);
            spawn(listener, tx);
            if answering {
                tokio::spawn(async move {
                    while let Some(s) = rx.recv().await {
                        let _ = s.reply.send(Arc::new("keling_up 1\n".into()));
                    }
                });
                test(addr).await;
            } else {
                test(addr).await;
                drop(rx);
            }
        });
    }

    /// Sends `request` on a new connection and reads until the server closes it.
    async fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer).await;
        String::from_utf8(answer).unwrap()
    }

    /// Hostile clients do not stop a well-behaved one from being served.
    #[test]
    fn hostile_clients_do_not_block_a_scrape() {
        with_server(QUEUE, true, |addr| async move {
            // Silent clients, an oversized head, garbage.
            let mut silent = Vec::new();
            for _ in 0..10 {
                silent.push(TcpStream::connect(addr).await.unwrap());
            }
            let answer = ask(addr, &vec![b'a'; MAX_HEAD_BYTES + 1]).await;
            assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
            let answer = ask(addr, b"\x00\x01\x02\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
            for bad in [
                &b"GET /metrics SPDY/3\r\n\r\n"[..],
                b"GET  /metrics HTTP/1.1\r\n\r\n",
                b"\xff\xfe\r\n\r\n",
            ] {
                let answer = ask(addr, bad).await;
                assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
            }
            // A real scrape is answered at once.
            let started = Instant::now();
            let answer = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
            assert_eq!(
                answer,
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n\
                     Connection: close\r\nContent-Length: 12\r\n\r\nkeling_up 1\n"
                )
            );
            assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
            drop(silent);
        });
    }

    /// What is not a `GET` of `/metrics` or `/`, and `HEAD`.
    #[test]
    fn answers_other_methods_and_paths() {
        with_server(QUEUE, true, |addr| async move {
            let answer = ask(addr, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
            assert!(answer.ends_with("Content-Length: 12\r\n\r\n"), "{answer}");
            let answer = ask(addr, b"GET / HTTP/1.1\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert!(
                answer.ends_with("\r\n\r\nKeling agent: Prometheus metrics at /metrics\n"),
                "{answer}"
            );
            let answer = ask(
                addr,
                b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
            assert!(answer.contains("\r\nAllow: GET, HEAD\r\n"), "{answer}");
            assert!(
                answer.ends_with("\r\n\r\n405 Method Not Allowed\n"),
                "{answer}"
            );
            let answer = ask(addr, b"GET /x HTTP/1.1\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
            assert!(answer.ends_with("\r\n\r\n404 Not Found\n"), "{answer}");
            // One response per connection, even when the client asks for more.
            let answer = ask(
                addr,
                b"GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            )
            .await;
            assert_eq!(answer.matches("HTTP/1.1 200").count(), 1, "{answer}");
        });
    }

    /// A client that trickles its head is cut off at the read deadline.
    #[test]
    fn a_slow_head_is_cut_off() {
        with_server(QUEUE, true, |addr| async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let started = Instant::now();
            c.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
            let trickle = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if c.write_all(b"X: y\r\n").await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(READ_DEADLINE * 3, trickle).await;
            let mut rest = Vec::new();
            let _ = c.read_to_end(&mut rest).await;
            let took = started.elapsed();
            assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
            assert!(
                took >= READ_DEADLINE && took < READ_DEADLINE * 2,
                "cut off after {took:?}"
            );
        });
    }

    /// Past [`MAX_CONNECTIONS`] a connection is closed at once; a freed slot serves again.
    #[test]
    fn connections_past_the_limit_are_closed() {
        with_server(QUEUE, true, |addr| async move {
            let mut held = Vec::new();
            for _ in 0..MAX_CONNECTIONS {
                held.push(TcpStream::connect(addr).await.unwrap());
            }
            let started = Instant::now();
            let answer = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
            assert_eq!(answer, "");
            assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
            drop(held.pop());
            // The slot is free once the server has seen the close.
            let answer = loop {
                let answer = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
                if !answer.is_empty() || started.elapsed() > READ_DEADLINE {
                    break answer;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        });
    }

    /// A full queue to the run loop is a 503 at once, not a wait.
    #[test]
    fn a_full_queue_is_busy() {
        with_server(1, false, |addr| async move {
            // The first scrape fills the queue and waits for a loop that never reads it.
            let mut first = TcpStream::connect(addr).await.unwrap();
            first
                .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = Instant::now();
            let answer = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
            assert!(answer.ends_with("\r\n\r\nbusy: try again\n"), "{answer}");
            assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
            drop(first);
        });
    }
}
