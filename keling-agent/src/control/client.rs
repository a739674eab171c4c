//! The client side of the control protocol: connect, send one request, read the
//! replies. Blocking (the clients are short-lived commands).
use std::{
    io::{BufRead, BufReader, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::Path,
};

use anyhow::{Context, bail};

use super::{Reply, Request, send_with_fds};

/// What a failed connect means to the person who ran the command: an agent
/// that is not running, or one whose socket does not admit them.
fn connect_error(socket: &Path, e: &std::io::Error) -> anyhow::Error {
    use std::os::unix::fs::MetadataExt;
    let denied = matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM));
    if !denied {
        return anyhow::anyhow!(
            "cannot reach the Keling agent at {} ({e}): is `keling run` running (as root)? \
             Start it with `cargo xtask run` or `sudo keling run`",
            socket.display()
        );
    }
    // The socket (or, when its directory cannot be searched, the directory)
    // says which group it admits.
    let gid = std::fs::metadata(socket)
        .or_else(|_| std::fs::metadata(socket.parent().unwrap_or(Path::new("/"))))
        .map(|m| m.gid())
        .ok();
    match gid.filter(|&g| g != 0) {
        Some(gid) => {
            let group = group_name(gid).unwrap_or_else(|| gid.to_string());
            anyhow::anyhow!(
                "the Keling agent at {} is running, but its socket admits only root and the members \
                 of group {group}, and you are not one ({e}). Ask an administrator to add you: \
                 `sudo usermod -aG {group} $USER`, then log in again (or run `newgrp {group}`)",
                socket.display()
            )
        }
        None => anyhow::anyhow!(
            "the Keling agent's socket {} admits only root ({e}): run this as root, or ask an \
             administrator to create a `keling` group (or name one under [access] in the \
             agent's config) and add you to it",
            socket.display()
        ),
    }
}

/// The name of group `gid`, from the group database.
fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: `grp` and `buf` are valid out buffers of the sizes given; the
    // result pointer is checked before use and points into them.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let r = libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut out);
        if r != 0 || out.is_null() || grp.gr_name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(grp.gr_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// A connection to the agent after the request was sent.
pub struct Connection {
    reader: BufReader<UnixStream>,
}

impl Connection {
    /// Connects to the agent at `socket` and sends `request`, with `fds` attached
    /// (SCM_RIGHTS) when there are any.
    pub fn request(socket: &Path, request: &Request, fds: &[i32]) -> anyhow::Result<Self> {
        let mut stream = UnixStream::connect(socket).map_err(|e| connect_error(socket, &e))?;
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
