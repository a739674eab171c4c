//! The server side of the control protocol. Every client is served on its own task,
//! with a deadline and a size limit on its request, so no client (silent, slow,
//! sending garbage or a flood, or hundreds of them) can delay the agent's event
//! loop: the loop only ever sees a fully read, well-formed [`Incoming`] request
//! from a peer the access rule admits, and sends replies through a channel that
//! never blocks it. Accept errors (EMFILE, ENFILE, ENOMEM) are logged and retried
//! after a pause; clients still reading their request beyond [`MAX_READING`] (or
//! [`MAX_READING_PER_UID`] of one user's) are turned away at once, root's never.
//!
//! File descriptors passed with requests (SCM_RIGHTS) are capped, since each one
//! received takes a slot of the agent's fd table: a request carries at most
//! [`MAX_FDS_PER_REQUEST`] (a launch's stdin, stdout and stderr), and all the
//! clients being read at once hold at most [`MAX_FDS_IN_ALL`] between them until
//! their requests are handed on. A client over either cap has what it sent
//! closed at once and is dropped with an error, so no member of the group can
//! fill the agent's fd table.
use std::{
    collections::HashMap,
    os::fd::{AsRawFd, OwnedFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest},
    net::{UnixListener, UnixStream, unix::OwnedReadHalf},
    sync::mpsc,
};

use super::{
    ErrorKind, MAX_REQUEST_BYTES, Notice, REQUEST_DEADLINE, Reply, ReplyError, Request,
    recv_with_fds,
};
use crate::os::users::{Credentials, peer_groups};

/// How long the agent waits for a client to take a reply before dropping it.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// How long accepting pauses after an error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Clients that may be reading their first request at once.
pub const MAX_READING: usize = 512;
/// Of those, how many one user may have: one member of the access group
/// cannot take every place (the places of four can). Root is never turned
/// away by either cap, nor by [`MAX_FDS_IN_ALL`]: the Slurm plugin attaching a
/// job's task and an administrator's `keling status` are root.
pub const MAX_READING_PER_UID: usize = 128;
/// The longest follow-up line (`{"forward":N}`) on a launch's connection.
const MAX_FOLLOW_UP_BYTES: usize = 1024;
/// The most signals one launch's connection forwards in a second: each is a
/// walk of the task's processes on the event loop. A person's Ctrl-Cs are a
/// few; the excess of a flood is dropped.
const MAX_FORWARDS_PER_S: u32 = 20;
/// How much one read takes from the socket.
const CHUNK_BYTES: usize = 64 * 1024;
/// Notices queued per client before the excess is dropped (and counted).
pub const NOTICE_QUEUE: usize = 64;
/// The most fds one request may carry: a launch's stdin, stdout and stderr.
pub const MAX_FDS_PER_REQUEST: usize = 3;
/// The most received fds the clients not yet handed on may hold between them.
pub const MAX_FDS_IN_ALL: usize = 1024;

/// Who is on the other end (SO_PEERCRED, SO_PEERGROUPS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub creds: Credentials,
    pub pid: Option<i32>,
}

/// Replies to one client; dropping it ends the connection once they are written.
///
/// Replies proper (`accepted`, `exit_code`, an answer) are a handful per
/// connection and are never dropped. Notices can come at the scheduler's pace (a
/// freeze and a thaw per quantum), so they go through a queue of
/// [`NOTICE_QUEUE`]: when a client does not keep up the excess is dropped and
/// counted, and the client hears how many ([`Notice::Dropped`]) before its next
/// line. Neither ever blocks the agent.
#[derive(Clone, Debug)]
pub struct Replier {
    replies: mpsc::UnboundedSender<Reply>,
    notices: mpsc::Sender<Notice>,
    dropped: Arc<AtomicU64>,
}

/// What a [`Replier`]'s connection reads from.
struct ReplyQueues {
    replies: mpsc::UnboundedReceiver<Reply>,
    notices: mpsc::Receiver<Notice>,
    dropped: Arc<AtomicU64>,
    /// A notice taken from the queue while a note of dropped ones was due:
    /// written right after the note.
    held: Option<Notice>,
}

impl Replier {
    fn new() -> (Self, ReplyQueues) {
        let (replies, replies_rx) = mpsc::unbounded_channel();
        let (notices, notices_rx) = mpsc::channel(NOTICE_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        (
            Self {
                replies,
                notices,
                dropped: dropped.clone(),
            },
            ReplyQueues {
                replies: replies_rx,
                notices: notices_rx,
                dropped,
                held: None,
            },
        )
    }

    /// Queues a reply. Never blocks; a client that went away is not an error.
    pub fn send(&self, reply: Reply) {
        let _ = self.replies.send(reply);
    }

    /// Queues a notice, or counts it dropped when the client is behind. Never
    /// blocks.
    pub fn notify(&self, notice: Notice) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.notices.try_send(notice) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A replier whose replies go nowhere (for tests).
    pub fn detached() -> Self {
        Self::new().0
    }

    /// A replier whose replies are read from the [`ReplyStream`] instead of
    /// being written to a socket (a Slurm job's output: `crate::slurm::job`).
    pub fn stream() -> (Self, ReplyStream) {
        let (r, q) = Self::new();
        (r, ReplyStream(q))
    }

    /// A replier and what it sends, for tests of what a client is told.
    #[cfg(test)]
    pub fn for_test() -> (Self, TestReceiver) {
        let (r, q) = Self::new();
        (r, TestReceiver(q))
    }
}

/// The other end of [`Replier::stream`]: what a client would read, in order.
pub struct ReplyStream(ReplyQueues);

impl ReplyStream {
    /// The next reply or notice; `None` once every [`Replier`] is gone and all
    /// was read.
    pub async fn next(&mut self) -> Option<Reply> {
        self.0.next().await
    }
}

/// The other end of [`Replier::for_test`].
#[cfg(test)]
pub struct TestReceiver(ReplyQueues);

#[cfg(test)]
impl TestReceiver {
    /// What a client would read now, in the order the server writes it.
    pub fn drain(&mut self) -> Vec<Reply> {
        let mut out = Vec::new();
        while let Some(r) = self.0.try_next() {
            out.push(r);
        }
        out
    }
}

impl ReplyQueues {
    /// The next line for the client: a pending note of dropped notices first,
    /// then notices (so a notice sent before a reply is written before it), then
    /// replies. `None` once the replier is gone and everything was written.
    async fn next(&mut self) -> Option<Reply> {
        if let Some(note) = self.dropped_note() {
            return Some(note);
        }
        if let Some(n) = self.held.take() {
            return Some(Reply::Notice(n));
        }
        tokio::select! {
            biased;
            Some(n) = self.notices.recv() => Some(match self.dropped_note() {
                // Notices were dropped while this one waited: the note
                // first, this one next.
                Some(note) => {
                    self.held = Some(n);
                    note
                }
                None => Reply::Notice(n),
            }),
            r = self.replies.recv() => match r {
                Some(r) => Some(r),
                // The replier is gone: what it queued last is all that is left.
                None => self.notices.try_recv().ok().map(Reply::Notice),
            },
        }
    }

    /// Without waiting: what `next` would give now.
    #[cfg(test)]
    fn try_next(&mut self) -> Option<Reply> {
        if let Some(note) = self.dropped_note() {
            return Some(note);
        }
        if let Some(n) = self.held.take() {
            return Some(Reply::Notice(n));
        }
        if let Ok(n) = self.notices.try_recv() {
            return Some(Reply::Notice(n));
        }
        self.replies.try_recv().ok()
    }

    fn dropped_note(&self) -> Option<Reply> {
        match self.dropped.swap(0, Ordering::Relaxed) {
            0 => None,
            count => Some(Reply::Notice(Notice::Dropped { count })),
        }
    }
}

/// A request read in full from a client.
pub struct Incoming {
    pub request: Request,
    /// fds passed with it (a launch's stdin, stdout, stderr).
    pub fds: Vec<OwnedFd>,
    pub peer: Peer,
    pub reply: Replier,
    /// The connection it came on (a launch's follow-ups share its launch's).
    pub conn: u64,
}

/// Says whether a peer may use the socket; `Err` says why not (sent to it).
pub type Admit = Arc<dyn Fn(&Credentials) -> Result<(), String> + Send + Sync>;

/// Accepts clients on `listener` for as long as the agent runs, handing each
/// well-formed request from an admitted peer to `requests`.
pub fn spawn(listener: UnixListener, requests: mpsc::Sender<Incoming>, admit: Admit) {
    spawn_limited(listener, requests, admit, MAX_FDS_IN_ALL, Some(0));
}

/// As [`spawn`], with `max_fds_in_all` for [`MAX_FDS_IN_ALL`].
fn spawn_limited(
    listener: UnixListener,
    requests: mpsc::Sender<Incoming>,
    admit: Admit,
    max_fds_in_all: usize,
    exempt_uid: Option<u32>,
) {
    tokio::spawn(async move {
        let reading = Arc::new(AtomicUsize::new(0));
        let reading_by_uid = Arc::new(Mutex::new(HashMap::new()));
        let held_fds = Arc::new(AtomicUsize::new(0));
        let next_conn = AtomicU64::new(1);
        let mut failing = false;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if failing {
                        failing = false;
                        log::info!("control socket: accepting again");
                    }
                    let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(serve(
                        stream,
                        conn,
                        requests.clone(),
                        admit.clone(),
                        Limits {
                            reading: reading.clone(),
                            reading_by_uid: reading_by_uid.clone(),
                            held_fds: held_fds.clone(),
                            max_fds_in_all,
                            exempt_uid,
                        },
                    ));
                }
                Err(e) => {
                    // EMFILE, ENFILE, ENOMEM...: say so (once per spell) and retry.
                    if !failing {
                        log::warn!("control socket: accept failed: {e}; retrying every 100 ms");
                        failing = true;
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    });
}

/// What all clients share: how many are reading (in all and per user), how
/// many fds they hold; and the user no cap turns away (root).
#[derive(Clone)]
struct Limits {
    reading: Arc<AtomicUsize>,
    reading_by_uid: Arc<Mutex<HashMap<u32, usize>>>,
    held_fds: Arc<AtomicUsize>,
    max_fds_in_all: usize,
    exempt_uid: Option<u32>,
}

/// Counts a client as reading its request for as long as it lives, in all
/// and for its user.
struct ReadingSlot {
    limits: Limits,
    uid: u32,
}

impl ReadingSlot {
    /// A place for a client of `uid`, or why there is none.
    fn take(limits: &Limits, uid: u32) -> Result<Self, String> {
        let slot = ReadingSlot {
            limits: limits.clone(),
            uid,
        };
        let in_all = limits.reading.fetch_add(1, Ordering::Relaxed);
        let mine = {
            let mut by_uid = limits
                .reading_by_uid
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let n = by_uid.entry(uid).or_insert(0);
            *n += 1;
            *n - 1
        };
        if limits.exempt_uid == Some(uid) {
            return Ok(slot);
        }
        if mine >= MAX_READING_PER_UID {
            return Err(format!(
                "the agent is busy: uid {uid} has {MAX_READING_PER_UID} connections sending \
                 requests; try again when they are done"
            ));
        }
        if in_all >= MAX_READING {
            return Err(format!(
                "the agent is busy: {MAX_READING} clients are sending requests; try again"
            ));
        }
        Ok(slot)
    }
}

impl Drop for ReadingSlot {
    fn drop(&mut self) {
        self.limits.reading.fetch_sub(1, Ordering::Relaxed);
        let mut by_uid = self
            .limits
            .reading_by_uid
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                by_uid.remove(&self.uid);
            }
        }
    }
}

/// The fds one client holds, counted in [`Limits::held_fds`] until dropped.
struct FdCharge {
    held: Arc<AtomicUsize>,
    count: usize,
}

impl FdCharge {
    /// Counts `n` more fds, or says why not when that would pass the cap.
    fn add(&mut self, n: usize, max: usize) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let before = self.held.fetch_add(n, Ordering::Relaxed);
        self.count += n;
        if before + n > max {
            return Err(format!(
                "the agent is busy: clients hold {max} file descriptors passed with requests \
                 not yet read in full; try again"
            ));
        }
        Ok(())
    }
}

impl Drop for FdCharge {
    fn drop(&mut self) {
        self.held.fetch_sub(self.count, Ordering::Relaxed);
    }
}

async fn serve(
    stream: UnixStream,
    conn: u64,
    requests: mpsc::Sender<Incoming>,
    admit: Admit,
    limits: Limits,
) {
    let (replier, mut rx) = Replier::new();
    let mut charge = FdCharge {
        held: limits.held_fds.clone(),
        count: 0,
    };
    let first = read_first(&stream, &admit, &limits, &mut charge).await;
    let mut follow_ups = None;
    match first {
        Ok((request, fds, peer)) => {
            let is_launch = matches!(request, Request::Launch(_) | Request::Attach(_));
            let incoming = Incoming {
                request,
                fds,
                peer: peer.clone(),
                reply: replier.clone(),
                conn,
            };
            if requests.send(incoming).await.is_err() {
                return; // the agent is stopping
            }
            // Handed on: the loop's queue is bounded, and closes them once handled.
            drop(charge);
            if is_launch {
                follow_ups = Some((peer, requests));
            }
        }
        Err(what) => {
            drop(charge); // what it sent is closed already
            replier.send(Reply::Error(ReplyError::new(ErrorKind::Invalid, what)));
        }
    }
    drop(replier);
    let (read_half, mut write_half) = stream.into_split();
    // A launch's connection also carries the client's forwarded signals.
    let mut lines =
        follow_ups.map(|(peer, requests)| FollowUps::new(read_half, peer, requests, conn));
    loop {
        let reply = match &mut lines {
            Some(f) => {
                tokio::select! {
                    reply = rx.next() => reply,
                    more = f.next() => {
                        if !more {
                            lines = None; // the client stopped sending: replies only
                        }
                        continue;
                    }
                }
            }
            None => rx.next().await,
        };
        let Some(reply) = reply else {
            return; // every reply sent
        };
        let line = encode_for_client(reply).await;
        match tokio::time::timeout(WRITE_DEADLINE, write_half.write_all(&line)).await {
            Ok(Ok(())) => {}
            _ => return, // gone or not reading: drop it
        }
    }
}

/// The length of each reply encoded and the thread that encoded it (for the
/// test that large replies are encoded off the loop's thread).
#[cfg(test)]
static ENCODED_ON: std::sync::Mutex<Vec<(usize, std::thread::ThreadId)>> =
    std::sync::Mutex::new(Vec::new());

/// One reply as the line a client reads.
fn encode(reply: &Reply) -> Vec<u8> {
    let mut line = match serde_json::to_vec(reply) {
        Ok(l) => l,
        Err(e) => {
            log::warn!("control socket: a reply did not serialise: {e}");
            serde_json::to_vec(&Reply::Error(ReplyError::new(
                ErrorKind::Internal,
                format!("internal error: {e}"),
            )))
            .unwrap_or_default()
        }
    };
    line.push(b'\n');
    #[cfg(test)]
    ENCODED_ON
        .lock()
        .unwrap()
        .push((line.len(), std::thread::current().id()));
    line
}

/// [`encode`], off the event loop's thread for the replies that can be large
/// (status, a task's history, an export): the loop runs in the real-time class
/// and the blocking pool's threads do not (its class is reset on fork), so
/// writing out a big reply never holds up a decision. The small ones (a notice,
/// an exit code) are encoded in place: a thread hand-off would cost more.
async fn encode_for_client(reply: Reply) -> Vec<u8> {
    if matches!(
        reply,
        Reply::Status(_) | Reply::History(_) | Reply::Export(_)
    ) {
        match tokio::task::spawn_blocking(move || encode(&reply)).await {
            Ok(line) => line,
            Err(e) => encode(&Reply::Error(ReplyError::new(
                ErrorKind::Internal,
                format!("internal error: {e}"),
            ))),
        }
    } else {
        encode(&reply)
    }
}

/// Reads the first request (within the deadline, the size limit and the cap on
/// clients reading at once) from an admitted peer.
async fn read_first(
    stream: &UnixStream,
    admit: &Admit,
    limits: &Limits,
    charge: &mut FdCharge,
) -> Result<(Request, Vec<OwnedFd>, Peer), String> {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer {
            creds: Credentials {
                uid: c.uid(),
                gid: c.gid(),
                groups: peer_groups(stream.as_raw_fd()).unwrap_or_default(),
            },
            pid: c.pid(),
        },
        Err(e) => return Err(format!("no peer credentials: {e}")),
    };
    admit(&peer.creds)?;
    let slot = ReadingSlot::take(limits, peer.creds.uid)?;
    let max_fds = if limits.exempt_uid == Some(peer.creds.uid) {
        usize::MAX
    } else {
        limits.max_fds_in_all
    };
    let read = tokio::time::timeout(
        REQUEST_DEADLINE,
        read_request(stream, |n| charge.add(n, max_fds)),
    )
    .await;
    drop(slot);
    match read {
        Ok(Ok((Request::Forward(_), _))) => {
            Err("`forward` is only valid on a launch's connection, after the launch".into())
        }
        Ok(Ok((request, fds))) => Ok((request, fds, peer)),
        Ok(Err(what)) => Err(what),
        Err(_) => Err(format!(
            "no complete request within {} s; send one JSON line such as {{\"status\":true}}",
            REQUEST_DEADLINE.as_secs()
        )),
    }
}

/// Reads one request line (with any fds), within the size limit and the caps on
/// fds: at most [`MAX_FDS_PER_REQUEST`], and each batch received counted by
/// `charge` (which refuses it over the cap in all). Fds over either cap are
/// closed at once, with all the others. Bytes after the line stay in the socket:
/// a launch's follow-ups are read after it.
async fn read_request(
    stream: &UnixStream,
    mut charge: impl FnMut(usize) -> Result<(), String>,
) -> Result<(Request, Vec<OwnedFd>), String> {
    let mut bytes = Vec::new();
    let mut fds = Vec::new();
    loop {
        stream.readable().await.map_err(|e| e.to_string())?;
        // Peek first, so nothing past the request line is consumed.
        let mut peek = vec![0u8; CHUNK_BYTES];
        let peeked = stream.try_io(Interest::READABLE, || {
            // SAFETY: recv into a valid buffer of its length.
            let n = unsafe {
                libc::recv(
                    stream.as_raw_fd(),
                    peek.as_mut_ptr().cast(),
                    peek.len(),
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(n as usize)
        });
        let n = match peeked {
            // tokio's readiness is cleared: wait for more.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the request: {e}")),
            Ok(0) => return Err("the connection closed before a complete request".into()),
            Ok(n) => n,
        };
        let take = peek[..n]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(n, |end| end + 1);
        let (chunk, more_fds) = match recv_with_fds(stream.as_raw_fd(), take) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(format!("reading the request: {e}")),
            Ok(r) => r,
        };
        charge(more_fds.len())?;
        fds.extend(more_fds);
        if fds.len() > MAX_FDS_PER_REQUEST {
            return Err(format!(
                "more than {MAX_FDS_PER_REQUEST} file descriptors sent with one request (a \
                 launch passes its stdin, stdout and stderr, nothing else needs any): refused"
            ));
        }
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(format!(
                "request larger than {MAX_REQUEST_BYTES} bytes: refused"
            ));
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            break;
        }
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| "the request is not UTF-8".to_string())?;
    let request = serde_json::from_str(text.trim()).map_err(|e| {
        format!("bad request ({e}): expected one JSON line such as {{\"status\":true}}")
    })?;
    Ok((request, fds))
}

/// The follow-up lines of a launch's connection.
///
/// [`FollowUps::next`] runs in a `select!` beside the replies, which may win
/// at any await: what it has read of a line, and a line read but not yet
/// handed on, stay here for the next call (a forwarded Ctrl-C that arrived
/// with a notice was lost otherwise).
struct FollowUps {
    reader: BufReader<OwnedReadHalf>,
    peer: Peer,
    requests: mpsc::Sender<Incoming>,
    conn: u64,
    /// The line being read, so far.
    partial: Vec<u8>,
    /// A forward read in full, waiting for room in the loop's queue.
    ready: Option<Request>,
    /// The current second's start and the forwards handed on in it.
    window: (tokio::time::Instant, u32),
}

impl FollowUps {
    fn new(reader: OwnedReadHalf, peer: Peer, requests: mpsc::Sender<Incoming>, conn: u64) -> Self {
        FollowUps {
            reader: BufReader::new(reader),
            peer,
            requests,
            conn,
            partial: Vec::new(),
            ready: None,
            window: (tokio::time::Instant::now(), 0),
        }
    }

    /// Whether one more forward fits in this second's allowance.
    fn allowed(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now.duration_since(self.window.0) >= Duration::from_secs(1) {
            self.window = (now, 0);
        }
        self.window.1 += 1;
        if self.window.1 == MAX_FORWARDS_PER_S + 1 {
            log::warn!(
                "control socket: over {MAX_FORWARDS_PER_S} forwarded signals in a second on \
                 connection {}; the rest of this second's are dropped",
                self.conn
            );
        }
        self.window.1 <= MAX_FORWARDS_PER_S
    }

    /// Reads and hands on one line; false once there will be no more (the
    /// client closed, or sent something that is not a `forward` line: its
    /// connection is read no further, so a flood of bad lines costs one log
    /// line, not one each).
    async fn next(&mut self) -> bool {
        if self.ready.is_none() {
            let room = (MAX_FOLLOW_UP_BYTES + 1).saturating_sub(self.partial.len());
            let mut limited = (&mut self.reader).take(room as u64);
            match limited.read_until(b'\n', &mut self.partial).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
            if self.partial.len() > MAX_FOLLOW_UP_BYTES {
                log::warn!(
                    "control socket: a follow-up line over {MAX_FOLLOW_UP_BYTES} bytes; \
                     no more are read from this client"
                );
                return false;
            }
            if self.partial.last() != Some(&b'\n') {
                return false; // closed in the middle of a line
            }
            let line = std::mem::take(&mut self.partial);
            match serde_json::from_slice::<Request>(&line) {
                Ok(Request::Forward(_)) if !self.allowed() => return true,
                Ok(request @ Request::Forward(_)) => self.ready = Some(request),
                _ => {
                    log::warn!(
                        "control socket: a follow-up that is not `forward`; no more are read \
                         from this client"
                    );
                    return false;
                }
            }
        }
        // Room first (cancelling the wait loses nothing), then the send.
        let Ok(permit) = self.requests.reserve().await else {
            return false;
        };
        if let Some(request) = self.ready.take() {
            permit.send(Incoming {
                request,
                fds: Vec::new(),
                peer: self.peer.clone(),
                reply: Replier::detached(),
                conn: self.conn,
            });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncBufReadExt;

    use super::*;

    /// A large reply (here a 4 MB export) is encoded on another thread than the
    /// loop's, to the same line.
    #[tokio::test]
    async fn large_replies_are_encoded_off_the_loop_thread() {
        let loop_thread = std::thread::current().id();
        let big = Reply::Export("x".repeat((4 << 20) + 7));
        let line = encode_for_client(big.clone()).await;
        let encoders: Vec<std::thread::ThreadId> = ENCODED_ON
            .lock()
            .unwrap()
            .iter()
            .filter(|(len, _)| *len == line.len())
            .map(|(_, thread)| *thread)
            .collect();
        assert_eq!(encoders.len(), 1, "{encoders:?}");
        assert_ne!(encoders[0], loop_thread, "encoded on the loop thread");
        assert_eq!(line, encode(&big));
        let small = encode_for_client(Reply::ExitCode(3)).await;
        assert_eq!(small, b"{\"exit_code\":3}\n");
    }

    /// What `tests/tests/chaos.rs` once timed ("status within 100 ms with 100
    /// silent clients connected"), as what it stands for: a complete request
    /// reaches the loop, and its answer the client, while a hundred others stay
    /// connected and silent, none of them turned away and no deadline waited for.
    #[tokio::test(start_paused = true)]
    async fn a_request_is_served_while_a_hundred_clients_stay_silent() {
        let dir = std::env::temp_dir().join(format!("keling-server-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        let _ = std::fs::remove_file(&path);
        let (requests, mut incoming) = mpsc::channel(64);
        spawn(
            UnixListener::bind(&path).unwrap(),
            requests,
            Arc::new(|_| Ok(())),
        );
        let mut silent = Vec::new();
        for _ in 0..100 {
            silent.push(UnixStream::connect(&path).await.unwrap());
        }
        let started = tokio::time::Instant::now();
        let mut client = UnixStream::connect(&path).await.unwrap();
        client.write_all(b"{\"status\":true}\n").await.unwrap();
        let got = incoming.recv().await.expect("the request reached the loop");
        assert_eq!(got.request, Request::Status(true));
        got.reply.send(Reply::Signalled(0));
        drop(got);
        let mut line = String::new();
        BufReader::new(&mut client)
            .read_line(&mut line)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Reply>(&line).unwrap(),
            Reply::Signalled(0)
        );
        assert!(
            started.elapsed() < REQUEST_DEADLINE,
            "served only after {:?}: a silent client's deadline was waited for",
            started.elapsed()
        );
        for (i, s) in silent.iter().enumerate() {
            let mut buf = [0u8; 64];
            match s.try_read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => panic!("silent client {i} was answered: {other:?}"),
            }
        }
        assert!(incoming.try_recv().is_err(), "nothing came from the silent");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A listener on a fresh path, its requests, and the path (no user exempt
    /// from the caps).
    fn listen(name: &str, max_fds_in_all: usize) -> (std::path::PathBuf, mpsc::Receiver<Incoming>) {
        listen_exempting(name, max_fds_in_all, None)
    }

    /// As [`listen`], with `exempt` never turned away.
    fn listen_exempting(
        name: &str,
        max_fds_in_all: usize,
        exempt: Option<u32>,
    ) -> (std::path::PathBuf, mpsc::Receiver<Incoming>) {
        let dir = std::env::temp_dir().join(format!("keling-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        let _ = std::fs::remove_file(&path);
        let (requests, incoming) = mpsc::channel(64);
        spawn_limited(
            UnixListener::bind(&path).unwrap(),
            requests,
            Arc::new(|_| Ok(())),
            max_fds_in_all,
            exempt,
        );
        (path, incoming)
    }

    /// The first line the agent answers `client` with.
    async fn answer(client: &mut UnixStream) -> Reply {
        let mut line = String::new();
        BufReader::new(client).read_line(&mut line).await.unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// Whether the write end of a pipe is closed everywhere (its read end at EOF).
    fn all_closed(read: &std::fs::File) -> bool {
        let mut pfd = libc::pollfd {
            fd: read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a timeout of 2 s.
        let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
        n == 1 && pfd.revents & libc::POLLHUP != 0
    }

    /// Issue 32: 1-byte messages each carrying 3 fds filled the agent's fd table.
    /// A request may carry 3; the client that sends more is dropped with an
    /// error, and every fd it sent is closed (the pipe's write end, sent each
    /// time, is closed everywhere once the client closes its own).
    #[tokio::test]
    async fn a_client_sending_more_than_three_fds_is_dropped_and_they_are_closed() {
        let (path, mut incoming) = listen("fds-per-request", MAX_FDS_IN_ALL);
        let (read, write) = crate::os::pipe().unwrap();
        let read = std::fs::File::from(read);
        let mut client = UnixStream::connect(&path).await.unwrap();
        let w = write.as_raw_fd();
        let mut sent = 0;
        for _ in 0..50 {
            client.writable().await.unwrap();
            match super::super::send_with_fds(client.as_raw_fd(), b"{", &[w, w, w]) {
                Ok(()) => sent += 1,
                Err(_) => break, // dropped by the agent
            }
            tokio::task::yield_now().await;
        }
        assert!(sent >= 2, "sent {sent}");
        match answer(&mut client).await {
            Reply::Error(e) => assert!(
                e.message.contains("more than 3 file descriptors"),
                "{}",
                e.message
            ),
            other => panic!("not refused: {other:?}"),
        }
        drop(client);
        drop(write);
        assert!(all_closed(&read), "an fd the client sent is still open");
        assert!(incoming.try_recv().is_err(), "nothing reached the loop");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// Clients each within the cap of 3 hold no more than the cap in all (6
    /// here): the one over it is turned away, and once the others are gone a
    /// request's 3 fds are taken again; every fd sent is closed in the end.
    #[tokio::test]
    async fn clients_together_hold_no_more_fds_than_the_cap() {
        let (path, mut incoming) = listen("fds-in-all", 6);
        let (read, write) = crate::os::pipe().unwrap();
        let read = std::fs::File::from(read);
        let w = write.as_raw_fd();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let c = UnixStream::connect(&path).await.unwrap();
            super::super::send_with_fds(c.as_raw_fd(), b"{", &[w, w, w]).unwrap();
            clients.push(c);
        }
        // Whichever is read last is over the cap; the others wait for their
        // deadline.
        let mut over = 0;
        for c in &mut clients {
            match answer(c).await {
                Reply::Error(e) if e.message.contains("file descriptors") => over += 1,
                Reply::Error(e) => {
                    assert!(e.message.contains("no complete request"), "{}", e.message)
                }
                other => panic!("not refused: {other:?}"),
            }
        }
        assert_eq!(over, 1, "one client was over the cap of 6 fds");
        drop(clients);
        let client = UnixStream::connect(&path).await.unwrap();
        let line = b"{\"status\":true}\n";
        super::super::send_with_fds(client.as_raw_fd(), line, &[w, w, w]).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), incoming.recv())
            .await
            .expect("taken within 5 s")
            .unwrap();
        assert_eq!(got.fds.len(), 3);
        drop(got);
        drop(write);
        drop(client);
        assert!(all_closed(&read), "an fd a client sent is still open");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// One user holding [`MAX_READING_PER_UID`] silent connections is turned
    /// away at the next, at once; the user exempt (root, in the agent) is
    /// not: its request reaches the loop beside as many, and its fds are
    /// taken past the cap on all clients' fds.
    #[tokio::test]
    async fn one_user_cannot_take_every_place_and_root_is_never_turned_away() {
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        let (path, mut incoming) = listen("per-uid", MAX_FDS_IN_ALL);
        let mut silent = Vec::new();
        for _ in 0..MAX_READING_PER_UID {
            silent.push(UnixStream::connect(&path).await.unwrap());
        }
        // The server takes the silent ones in turn: a probe may be read
        // before the last of them is counted, and is then served.
        let mut refused = None;
        for _ in 0..50 {
            let mut probe = UnixStream::connect(&path).await.unwrap();
            probe.write_all(b"{\"status\":true}\n").await.unwrap();
            tokio::select! {
                got = incoming.recv() => {
                    let got = got.unwrap();
                    got.reply.send(Reply::Signalled(0));
                }
                reply = answer(&mut probe) => {
                    refused = Some(reply);
                    break;
                }
            }
        }
        match refused.expect("never turned away") {
            Reply::Error(e) => assert!(
                e.message
                    .contains(&format!("uid {me} has {MAX_READING_PER_UID} connections")),
                "{}",
                e.message
            ),
            other => panic!("not refused: {other:?}"),
        }
        drop(silent);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();

        let (path, mut incoming) = listen_exempting("exempt", 6, Some(me));
        let (_read, write) = crate::os::pipe().unwrap();
        let w = write.as_raw_fd();
        let mut silent = Vec::new();
        for _ in 0..MAX_READING_PER_UID + 10 {
            let c = UnixStream::connect(&path).await.unwrap();
            silent.push(c);
        }
        for c in silent.iter().take(3) {
            super::super::send_with_fds(c.as_raw_fd(), b"{", &[w, w, w]).unwrap();
        }
        let client = UnixStream::connect(&path).await.unwrap();
        super::super::send_with_fds(client.as_raw_fd(), b"{\"status\":true}\n", &[w, w, w])
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), incoming.recv())
            .await
            .expect("served within 5 s")
            .unwrap();
        assert_eq!(got.request, Request::Status(true));
        assert_eq!(got.fds.len(), 3, "12 fds held, over the cap of 6");
        drop((got, silent, client));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// A launch connection's follow-up reader (as root) on one end of a socket
    /// pair, the other end to write to, the loop's queue (of `cap`) it hands
    /// forwards to, and the server's write half (kept open).
    fn follow_ups(
        cap: usize,
    ) -> (
        UnixStream,
        FollowUps,
        mpsc::Receiver<Incoming>,
        tokio::net::unix::OwnedWriteHalf,
    ) {
        let (client, server) = UnixStream::pair().unwrap();
        let (read_half, write_half) = server.into_split();
        let (requests, incoming) = mpsc::channel(cap);
        let peer = Peer {
            creds: Credentials {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            },
            pid: None,
        };
        let f = FollowUps::new(read_half, peer, requests, 1);
        (client, f, incoming, write_half)
    }

    /// A forward whose line arrives in pieces, with the reading cancelled
    /// between them (as `select!` does when a reply is ready first), is
    /// handed on whole; a line that is not a forward ends the reading.
    #[tokio::test]
    async fn a_follow_up_read_in_pieces_across_a_cancel_is_not_lost() {
        let (mut client, mut f, mut incoming, _write_half) = follow_ups(4);
        client.write_all(b"{\"forw").await.unwrap();
        // Nothing complete yet: the call is cancelled, as a reply would.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), f.next())
                .await
                .is_err()
        );
        client.write_all(b"ard\":2}\n").await.unwrap();
        assert!(f.next().await);
        let got = incoming.try_recv().expect("the forward was handed on");
        assert_eq!(got.request, Request::Forward(2));
        client
            .write_all(b"garbage\n{\"forward\":15}\n")
            .await
            .unwrap();
        assert!(!f.next().await, "a bad line ends the reading");
        assert!(incoming.try_recv().is_err());
    }

    /// Notices dropped while the writer waited for the next one: the note
    /// of how many comes first, then that notice (it was replaced by the
    /// note), then the rest.
    #[tokio::test]
    async fn a_notice_received_with_a_note_due_is_written_after_it() {
        let (replier, mut queues) = Replier::new();
        let queued = |i: u64| Notice::Dropped { count: 1000 + i };
        {
            let first = queues.next();
            tokio::pin!(first);
            // Waiting, with nothing queued.
            assert!(
                tokio::time::timeout(Duration::ZERO, &mut first)
                    .await
                    .is_err()
            );
            for i in 0..=NOTICE_QUEUE as u64 {
                replier.notify(queued(i)); // the last one is dropped
            }
            assert_eq!(
                first.await,
                Some(Reply::Notice(Notice::Dropped { count: 1 }))
            );
        }
        for i in 0..NOTICE_QUEUE as u64 {
            assert_eq!(
                queues.try_next(),
                Some(Reply::Notice(queued(i))),
                "notice {i}"
            );
        }
        assert_eq!(queues.try_next(), None);
    }

    /// A flood of forwarded signals on one connection: the first
    /// [`MAX_FORWARDS_PER_S`] of a second reach the loop, the rest of that
    /// second do not; the next second has its own.
    #[tokio::test(start_paused = true)]
    async fn forwarded_signals_are_limited_per_second() {
        let (mut client, mut f, mut incoming, _write_half) = follow_ups(256);
        let flood = "{\"forward\":28}\n".repeat(50);
        client.write_all(flood.as_bytes()).await.unwrap();
        for _ in 0..50 {
            assert!(f.next().await);
        }
        let mut got = 0;
        while incoming.try_recv().is_ok() {
            got += 1;
        }
        assert_eq!(got, MAX_FORWARDS_PER_S);
        tokio::time::advance(Duration::from_secs(1)).await;
        client.write_all(b"{\"forward\":2}\n").await.unwrap();
        assert!(f.next().await);
        assert_eq!(incoming.try_recv().unwrap().request, Request::Forward(2));
    }
}
