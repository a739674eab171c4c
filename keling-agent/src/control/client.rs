//! The client side of the control protocol: connect, send one request, read the
//! replies. Blocking (the clients are short-lived commands).
use std::{
    io::{BufRead, BufReader, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::Path,
};

use anyhow::{Context, bail};

use super::{Reply, Request, send_with_fds};

/// A connection to the agent after the request was sent.
pub struct Connection {
    reader: BufReader<UnixStream>,
}

impl Connection {
    /// Connects to the agent at `socket` and sends `request`, with `fds` attached
    /// (SCM_RIGHTS) when there are any.
    pub fn request(socket: &Path, request: &Request, fds: &[i32]) -> anyhow::Result<Self> {
        let mut stream = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot reach the Keling agent at {}: is `keling run` running (as root)? \
                 Start it with `cargo xtask run` or `sudo keling run`",
                socket.display()
            )
        })?;
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        if fds.is_empty() {
            stream.write_all(&line).context("send the request")?;
        } else {
            send_with_fds(stream.as_raw_fd(), &line, fds).context("send the request")?;
        }
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    /// A second handle on the connection, to send follow-ups (a launch's
    /// forwarded signals) from another thread while this one reads replies.
    pub fn sender(&self) -> std::io::Result<UnixStream> {
        self.reader.get_ref().try_clone()
    }

    /// The next reply; `None` when the agent closed the connection.
    pub fn next_reply(&mut self) -> anyhow::Result<Option<Reply>> {
        let mut text = String::new();
        if self.reader.read_line(&mut text)? == 0 {
            return Ok(None);
        }
        let reply: Reply = serde_json::from_str(&text)
            .with_context(|| format!("bad reply from the agent: {text:?}"))?;
        Ok(Some(reply))
    }

    /// The one reply a status or export request gets; an agent error is an error.
    pub fn one(mut self) -> anyhow::Result<Reply> {
        match self.next_reply()? {
            Some(Reply::Error(e)) => bail!("{e}"),
            Some(r) => Ok(r),
            None => bail!("the agent closed the connection without answering"),
        }
    }
}
