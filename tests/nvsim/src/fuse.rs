//! A minimal FUSE server, written by hand over `/dev/fuse`.
//!
//! Why not the `fuser` crate: it (0.18) does not hand the ioctl `arg` — the
//! caller's user pointer — to the filesystem. The nvidia-uvm commands are
//! plain numbers (0x30000001, 23, 25, ...) whose `_IOC_DIR` bits are NONE, so
//! in FUSE's "restricted" ioctl mode (the only one for regular files) the
//! kernel copies no data in or out and the server must read and write the
//! params itself at `fuse_ioctl_in.arg` with `process_vm_readv/writev`. RM
//! escapes need the same for the pointers inside their params. The protocol
//! subset we need is small, so it is spoken here directly (`linux/fuse.h`):
//! INIT, LOOKUP, FORGET/BATCH_FORGET, GETATTR, OPEN, READ, WRITE, RELEASE, FLUSH,
//! OPENDIR/READDIR/RELEASEDIR, STATFS, ACCESS, IOCTL, INTERRUPT, DESTROY;
//! everything else gets ENOSYS.
//!
//! One thread serves every request in order, so the driver state needs no
//! locks. Nothing in a request handler blocks: the only syscalls on the way
//! are `process_vm_*` on a caller that is itself waiting for our reply, reads
//! of `/proc/<tid>/status`, `pidfd_open`/`pidfd_getfd`, and the reply write.
//!
//! ## Descriptors named inside the params
//! The export/import controls name an nvidiactl file by its descriptor number
//! *in the calling process*; a FUSE request only carries the fh of the file
//! the ioctl was made on. To learn the fh of the named one, the server takes
//! its own copy of the caller's descriptor (`pidfd_open` + `pidfd_getfd`,
//! which needs ptrace rights over the caller), and a helper thread checks that
//! the copy is a regular file of this mount and issues [`WHICH_FILE_CMD`] on
//! it: the kernel sends that ioctl to us with the fh of the very same open
//! file description. The loop answers it (recording the fh), the helper
//! closes its copy (a FLUSH, and the RELEASE if the caller closed its own
//! meanwhile) and wakes the loop through an eventfd; only then is the
//! export/import request handed to the driver and answered. The loop keeps
//! serving everything else while such a request is pending. A descriptor that
//! cannot be resolved this way is answered as one that names no nvidiactl
//! file (NV_ERR_INVALID_PARAMETER).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::driver::{Driver, FdResolver, FileKind, NoFds};
use crate::procmem::{ProcMem, tgid_of};

/// `_IOW('K', 1, 16)`: the server's own command, issued by a helper thread on
/// a copy of a caller's descriptor to learn which open file (fh) it is. Its
/// type is not `'F'` (an RM escape) and it is not a plain UVM number. The 16
/// bytes are the pending request's token (u64) and 8 zero bytes.
pub const WHICH_FILE_CMD: u32 = (1 << 30) | (16 << 16) | ((b'K' as u32) << 8) | 1;

// Opcodes (linux/fuse.h).
const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_OPENDIR: u32 = 27;
const FUSE_READDIR: u32 = 28;
const FUSE_RELEASEDIR: u32 = 29;
const FUSE_ACCESS: u32 = 34;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_IOCTL: u32 = 39;
const FUSE_BATCH_FORGET: u32 = 42;

const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// The size device files report: room for any mapping offset the driver hands out.
const DEVICE_FILE_SIZE: u64 = 1 << 40;
const FUSE_IOCTL_DIR: u32 = 1 << 4;

/// Minor protocol version we speak (7.31: everything we use is older).
const OUR_MINOR: u32 = 31;
const MAX_WRITE: u32 = 128 * 1024;
/// Read buffer: must exceed max_write plus headers.
const BUF_SIZE: usize = 1 << 20;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

const ROOT: u64 = 1;
const VERSION: u64 = 2;
const STATE: u64 = 3;
const CTL: u64 = 4;
const UVM: u64 = 5;
const GPU0: u64 = 6;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Root,
    Version,
    State,
    Device(FileKind),
}

struct OpenFile {
    node: Node,
    /// Snapshot of `nvsim-state.json` for this open (refreshed on a read at 0).
    snapshot: Vec<u8>,
}

/// An export/import ioctl waiting for the fh of the descriptor it names.
struct Pending {
    unique: u64,
    tid: u32,
    pid: u32,
    fh: u64,
    file: FileKind,
    cmd: u32,
    arg: u64,
    in_data: Vec<u8>,
    out_size: usize,
    fd: i32,
    resolved: Option<u64>,
}

/// Why [`Server::run`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// A signal arrived on the signal fd.
    Signal,
    /// The kernel ended the connection (unmounted or aborted) or sent DESTROY.
    Unmounted,
}

pub struct Server {
    dev: OwnedFd,
    driver: Driver,
    files: HashMap<u64, OpenFile>,
    next_fh: u64,
    version_text: String,
    uid: u32,
    gid: u32,
    mtime: u64,
    initialized: bool,
    /// (major, minor) of this mount's device, to recognise our files.
    own_dev: Option<(u32, u32)>,
    pending: HashMap<u64, Pending>,
    next_token: u64,
    done_tx: mpsc::Sender<u64>,
    done_rx: mpsc::Receiver<u64>,
    /// An eventfd the helper threads write to when done.
    wake: Arc<OwnedFd>,
}

/// Reads little-endian fields of a request.
struct Req<'a> {
    b: &'a [u8],
}

impl Req<'_> {
    fn u32(&self, off: usize) -> u32 {
        crate::abi::le::u32_at(self.b, off)
    }
    fn u64(&self, off: usize) -> u64 {
        crate::abi::le::u64_at(self.b, off)
    }
}

/// Builds reply payloads.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

impl Server {
    /// `dev` is an open `/dev/fuse` already mounted with `fd=`.
    pub fn new(dev: OwnedFd, driver: Driver) -> Self {
        let version_text = format!(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (keling-nvsim)\nGCC version:  gcc version 12.2.0\n",
            driver.config().driver_version
        );
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // SAFETY: eventfd has no memory preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(efd >= 0, "eventfd: {}", io::Error::last_os_error());
        // SAFETY: `efd` was just created and is owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
        let (done_tx, done_rx) = mpsc::channel();
        Server {
            dev,
            driver,
            files: HashMap::new(),
            next_fh: 1,
            version_text,
            uid,
            gid,
            mtime: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            initialized: false,
            own_dev: None,
            pending: HashMap::new(),
            next_token: 1,
            done_tx,
            done_rx,
            wake,
        }
    }

    /// The (major, minor) device of this mount (`/proc/self/mountinfo`), so
    /// that the descriptor resolution only ever sends [`WHICH_FILE_CMD`] to
    /// files of this mount. Without it, any FUSE file is tried.
    pub fn set_own_dev(&mut self, dev: Option<(u32, u32)>) {
        self.own_dev = dev;
    }

    fn gpus(&self) -> u32 {
        self.driver.config().gpus
    }

    fn node_of(&self, ino: u64) -> Option<Node> {
        match ino {
            ROOT => Some(Node::Root),
            VERSION => Some(Node::Version),
            STATE => Some(Node::State),
            CTL => Some(Node::Device(FileKind::Ctl)),
            UVM => Some(Node::Device(FileKind::Uvm)),
            n if n >= GPU0 && n < GPU0 + self.gpus() as u64 => {
                Some(Node::Device(FileKind::Gpu((n - GPU0) as u32)))
            }
            _ => None,
        }
    }

    /// (name, inode) of every directory entry.
    fn entries(&self) -> Vec<(String, u64)> {
        let mut v = vec![
            ("version".to_string(), VERSION),
            ("nvsim-state.json".to_string(), STATE),
            ("nvidiactl".to_string(), CTL),
            ("nvidia-uvm".to_string(), UVM),
        ];
        for i in 0..self.gpus() {
            v.push((format!("nvidia{i}"), GPU0 + i as u64));
        }
        v
    }

    fn attr(&self, ino: u64, node: Node, out: &mut Out) {
        let (mode, nlink, size) = match node {
            Node::Root => (libc::S_IFDIR | 0o755, 2, 0),
            Node::Version => (libc::S_IFREG | 0o444, 1, self.version_text.len() as u64),
            Node::State => (libc::S_IFREG | 0o444, 1, 0),
            // A size, so that a mapping of a device file can be faulted in
            // (pages past the end of a file raise SIGBUS); reads return
            // nothing (zero-filled pages), writes are taken and dropped.
            Node::Device(_) => (libc::S_IFREG | 0o666, 1, DEVICE_FILE_SIZE),
        };
        out.u64(ino).u64(size).u64(0); // ino, size, blocks
        out.u64(self.mtime).u64(self.mtime).u64(self.mtime);
        out.u32(0).u32(0).u32(0); // nsecs
        out.u32(mode).u32(nlink).u32(self.uid).u32(self.gid);
        out.u32(0).u32(4096).u32(0); // rdev, blksize, flags
    }

    /// Serves until a signal arrives on `sigfd` or the kernel ends the
    /// connection. `on_init` runs once, right after INIT is answered.
    pub fn run(&mut self, sigfd: i32, mut on_init: impl FnMut()) -> io::Result<Stop> {
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.dev.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: sigfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let nfds = if sigfd >= 0 { 3 } else { 2 };
            // SAFETY: `fds` is a valid array of `nfds` pollfds.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), nfds, -1) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            if nfds == 3 && fds[2].revents != 0 {
                return Ok(Stop::Signal);
            }
            if fds[1].revents != 0 {
                self.complete_pending()?;
            }
            if fds[0].revents & (libc::POLLERR | libc::POLLHUP) != 0
                && fds[0].revents & libc::POLLIN == 0
            {
                return Ok(Stop::Unmounted);
            }
            if fds[0].revents == 0 {
                continue;
            }
            // SAFETY: `buf` has `buf.len()` writable bytes.
            let n = unsafe { libc::read(self.dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                    Some(libc::ENODEV) => return Ok(Stop::Unmounted),
                    _ => return Err(e),
                }
            }
            let n = n as usize;
            if n < IN_HEADER {
                continue;
            }
            let was_init = self.initialized;
            if self.handle(&buf[..n])? {
                return Ok(Stop::Unmounted);
            }
            if !was_init && self.initialized {
                on_init();
            }
        }
    }

    fn reply(&self, unique: u64, error: i32, payload: &[u8]) -> io::Result<()> {
        let len = OUT_HEADER + if error == 0 { payload.len() } else { 0 };
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_le_bytes());
        msg.extend_from_slice(&(-error).to_le_bytes());
        msg.extend_from_slice(&unique.to_le_bytes());
        if error == 0 {
            msg.extend_from_slice(payload);
        }
        // SAFETY: `msg` is a valid buffer of `msg.len()` bytes.
        let n = unsafe { libc::write(self.dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: the request was interrupted/aborted meanwhile.
            if e.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("fuse reply {unique}: {e}");
            }
        }
        Ok(())
    }

    fn ok(&self, unique: u64, payload: &[u8]) -> io::Result<()> {
        self.reply(unique, 0, payload)
    }

    fn err(&self, unique: u64, errno: i32) -> io::Result<()> {
        self.reply(unique, errno, &[])
    }

    /// Handles one request; true when the session is over (DESTROY).
    fn handle(&mut self, msg: &[u8]) -> io::Result<bool> {
        let h = Req { b: msg };
        let opcode = h.u32(4);
        let unique = h.u64(8);
        let nodeid = h.u64(16);
        let pid = h.u32(32);
        let body = &msg[IN_HEADER.min(msg.len())..];
        let r = Req { b: body };
        log::debug!("fuse op {opcode} node {nodeid} pid {pid} len {}", msg.len());
        match opcode {
            FUSE_INIT => {
                let major = r.u32(0);
                let minor = r.u32(4);
                let max_readahead = r.u32(8);
                if major < 7 {
                    return self.err(unique, libc::EPROTO).map(|_| false);
                }
                let mut o = Out::default();
                o.u32(7).u32(if major > 7 {
                    OUR_MINOR
                } else {
                    minor.min(OUR_MINOR)
                });
                o.u32(max_readahead).u32(0); // flags: none
                o.u16(64).u16(48); // max_background, congestion_threshold
                o.u32(MAX_WRITE).u32(1); // max_write, time_gran
                o.u16(0).u16(0).u32(0); // max_pages, map_alignment, flags2
                o.zeros(7 * 4);
                self.ok(unique, &o.0)?;
                if major == 7 {
                    self.initialized = true;
                }
            }
            FUSE_DESTROY => {
                self.ok(unique, &[])?;
                return Ok(true);
            }
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {} // no reply
            FUSE_LOOKUP => {
                let name = body.split(|&c| c == 0).next().unwrap_or(&[]);
                let name = String::from_utf8_lossy(name);
                let found = (nodeid == ROOT)
                    .then(|| self.entries().into_iter().find(|(n, _)| *n == name))
                    .flatten();
                match found.and_then(|(_, ino)| self.node_of(ino).map(|n| (ino, n))) {
                    Some((ino, node)) => {
                        let mut o = Out::default();
                        o.u64(ino)
                            .u64(0)
                            .u64(1)
                            .u64(if node == Node::State { 0 } else { 1 });
                        o.u32(0).u32(0);
                        self.attr(ino, node, &mut o);
                        self.ok(unique, &o.0)?;
                    }
                    None => self.err(unique, libc::ENOENT)?,
                }
            }
            FUSE_GETATTR => match self.node_of(nodeid) {
                Some(node) => {
                    let mut o = Out::default();
                    o.u64(if node == Node::State { 0 } else { 1 }).u32(0).u32(0);
                    self.attr(nodeid, node, &mut o);
                    self.ok(unique, &o.0)?;
                }
                None => self.err(unique, libc::ENOENT)?,
            },
            FUSE_OPEN => {
                let flags = r.u32(0) as i32;
                let Some(node) = self.node_of(nodeid) else {
                    return self.err(unique, libc::ENOENT).map(|_| false);
                };
                let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
                match node {
                    Node::Root => return self.err(unique, libc::EISDIR).map(|_| false),
                    Node::Version | Node::State if writes => {
                        return self.err(unique, libc::EACCES).map(|_| false);
                    }
                    _ => {}
                }
                let fh = self.next_fh;
                self.next_fh += 1;
                let snapshot = if node == Node::State {
                    self.driver.state_json().into_bytes()
                } else {
                    Vec::new()
                };
                if let Node::Device(k) = node {
                    self.driver.open(fh, k);
                }
                self.files.insert(fh, OpenFile { node, snapshot });
                // Device files go through the page cache so that they can be
                // mmapped (libcuda maps the usermode page of nvidiaN with
                // MAP_SHARED, PROT_WRITE, which FOPEN_DIRECT_IO refuses with
                // ENODEV); the generated files stay direct.
                let open_flags = match node {
                    Node::Device(_) => 0,
                    _ => FOPEN_DIRECT_IO,
                };
                let mut o = Out::default();
                o.u64(fh).u32(open_flags).u32(0);
                self.ok(unique, &o.0)?;
            }
            FUSE_READ => {
                let fh = r.u64(0);
                let offset = r.u64(8) as usize;
                let size = r.u32(16) as usize;
                let data: Vec<u8> = match self.files.get(&fh).map(|f| f.node) {
                    Some(Node::Version) => self.version_text.as_bytes().to_vec(),
                    Some(Node::State) => {
                        if offset == 0 {
                            let fresh = self.driver.state_json().into_bytes();
                            if let Some(f) = self.files.get_mut(&fh) {
                                f.snapshot = fresh;
                            }
                        }
                        self.files[&fh].snapshot.clone()
                    }
                    // Zeros as far as asked: a short read would make the
                    // kernel shrink the file to it and fault a mapping.
                    Some(_) => {
                        let end = offset.saturating_add(size).min(DEVICE_FILE_SIZE as usize);
                        return self
                            .ok(unique, &vec![0; end.saturating_sub(offset)])
                            .map(|_| false);
                    }
                    None => return self.err(unique, libc::EBADF).map(|_| false),
                };
                let start = offset.min(data.len());
                let end = offset.saturating_add(size).min(data.len());
                self.ok(unique, &data[start..end])?;
            }
            FUSE_WRITE => {
                // Write-back of a shared mapping of a device file: accepted
                // and dropped (the simulator has no registers behind it).
                let fh = r.u64(0);
                let size = r.u32(16);
                match self.files.get(&fh).map(|f| f.node) {
                    Some(Node::Device(_)) => {
                        let mut o = Out::default();
                        o.u32(size).u32(0);
                        self.ok(unique, &o.0)?;
                    }
                    Some(_) => self.err(unique, libc::EACCES)?,
                    None => self.err(unique, libc::EBADF)?,
                }
            }
            FUSE_RELEASE => {
                let fh = r.u64(0);
                if let Some(f) = self.files.remove(&fh)
                    && matches!(f.node, Node::Device(_))
                {
                    self.driver.release(fh);
                }
                self.ok(unique, &[])?;
            }
            FUSE_FLUSH | FUSE_RELEASEDIR | FUSE_ACCESS => self.ok(unique, &[])?,
            FUSE_OPENDIR => {
                if nodeid != ROOT {
                    return self.err(unique, libc::ENOTDIR).map(|_| false);
                }
                let mut o = Out::default();
                o.u64(0).u32(0).u32(0);
                self.ok(unique, &o.0)?;
            }
            FUSE_READDIR => {
                let offset = r.u64(8) as usize;
                let size = r.u32(16) as usize;
                let mut all = vec![(".".to_string(), ROOT), ("..".to_string(), ROOT)];
                all.extend(self.entries());
                let mut o = Out::default();
                for (i, (name, ino)) in all.iter().enumerate().skip(offset) {
                    let rec = 24 + name.len();
                    let padded = (rec + 7) & !7;
                    if o.0.len() + padded > size {
                        break;
                    }
                    let typ = if *ino == ROOT {
                        libc::DT_DIR
                    } else {
                        libc::DT_REG
                    };
                    o.u64(*ino)
                        .u64(i as u64 + 1)
                        .u32(name.len() as u32)
                        .u32(typ as u32);
                    o.0.extend_from_slice(name.as_bytes());
                    o.zeros(padded - rec);
                }
                self.ok(unique, &o.0)?;
            }
            FUSE_STATFS => {
                let mut o = Out::default();
                o.u64(0).u64(0).u64(0).u64(0).u64(0); // blocks..ffree
                o.u32(4096).u32(255).u32(4096).u32(0).zeros(6 * 4);
                self.ok(unique, &o.0)?;
            }
            FUSE_IOCTL => self.ioctl(unique, pid, body)?,
            _ => self.err(unique, libc::ENOSYS)?,
        }
        Ok(false)
    }

    fn ioctl(&mut self, unique: u64, tid: u32, body: &[u8]) -> io::Result<()> {
        let r = Req { b: body };
        let fh = r.u64(0);
        let flags = r.u32(8);
        let cmd = r.u32(12);
        let arg = r.u64(16);
        let in_size = r.u32(24) as usize;
        let out_size = r.u32(28) as usize;
        let in_data = body.get(32..32 + in_size).unwrap_or(&[]);
        log::debug!("ioctl {cmd:#x} fh {fh} in {in_size} out {out_size} flags {flags:#x}");
        if cmd == WHICH_FILE_CMD && flags & FUSE_IOCTL_DIR == 0 {
            // From one of our helper threads: this fh is the file it holds.
            let token = crate::abi::le::u64_at(in_data, 0);
            if self.files.contains_key(&fh)
                && let Some(p) = self.pending.get_mut(&token)
            {
                p.resolved = Some(fh);
            }
            let mut o = Out::default();
            o.u32(0).u32(0).u32(0).u32(0);
            return self.ok(unique, &o.0);
        }
        let file = match self.files.get(&fh).map(|f| f.node) {
            Some(Node::Device(k)) if flags & FUSE_IOCTL_DIR == 0 => k,
            _ => return self.err(unique, libc::ENOTTY),
        };
        let pid = tgid_of(tid).unwrap_or(tid);
        let mem = ProcMem { tid };
        if let Some(fd) = self.driver.named_fd(file, cmd, arg, in_data, &mem)
            && let Some(copy) = copy_fd(pid, fd)
        {
            let token = self.next_token;
            self.next_token += 1;
            self.pending.insert(
                token,
                Pending {
                    unique,
                    tid,
                    pid,
                    fh,
                    file,
                    cmd,
                    arg,
                    in_data: in_data.to_vec(),
                    out_size,
                    fd,
                    resolved: None,
                },
            );
            let (tx, wake, own_dev) = (self.done_tx.clone(), self.wake.clone(), self.own_dev);
            std::thread::spawn(move || which_file(copy, token, own_dev, tx, wake));
            return Ok(());
        }
        self.answer_ioctl(
            unique, fh, file, pid, cmd, arg, in_data, out_size, &mem, &NoFds,
        )
    }

    /// Answers the pending requests whose helper thread is done.
    fn complete_pending(&mut self) -> io::Result<()> {
        let mut b = [0u8; 8];
        // SAFETY: reading the eventfd's 8-byte counter into `b` (resets it).
        unsafe { libc::read(self.wake.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        while let Ok(token) = self.done_rx.try_recv() {
            let Some(p) = self.pending.remove(&token) else {
                continue;
            };
            let fds: BTreeMap<i32, u64> = p.resolved.map(|fh| (p.fd, fh)).into_iter().collect();
            let mem = ProcMem { tid: p.tid };
            self.answer_ioctl(
                p.unique, p.fh, p.file, p.pid, p.cmd, p.arg, &p.in_data, p.out_size, &mem, &fds,
            )?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn answer_ioctl(
        &mut self,
        unique: u64,
        fh: u64,
        file: FileKind,
        pid: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: usize,
        mem: &ProcMem,
        fds: &dyn FdResolver,
    ) -> io::Result<()> {
        match self
            .driver
            .ioctl_fds(fh, file, pid, cmd, arg, in_data, out_size, mem, fds)
        {
            Ok(out) => {
                let mut o = Out::default();
                o.u32(0).u32(0).u32(0).u32(0); // result, flags, in_iovs, out_iovs
                o.0.extend_from_slice(&out[..out.len().min(out_size)]);
                self.ok(unique, &o.0)
            }
            Err(errno) => self.err(unique, errno),
        }
    }
}

/// Our own copy of descriptor `fd` of process `pid` (`pidfd_getfd`).
fn copy_fd(pid: u32, fd: i32) -> Option<OwnedFd> {
    // SAFETY: plain syscalls on integers; the returned descriptors are ours.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) as i32;
        if pidfd < 0 {
            log::debug!("pidfd_open {pid}: {}", io::Error::last_os_error());
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd);
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) as i32;
        if copy < 0 {
            log::debug!("pidfd_getfd {pid} {fd}: {}", io::Error::last_os_error());
            return None;
        }
        Some(OwnedFd::from_raw_fd(copy))
    }
}

/// The helper thread of one pending request: if `copy` is a regular file of
/// this mount, issue [`WHICH_FILE_CMD`] on it (the loop records the fh); then
/// close it and wake the loop.
fn which_file(
    copy: OwnedFd,
    token: u64,
    own_dev: Option<(u32, u32)>,
    done: mpsc::Sender<u64>,
    wake: Arc<OwnedFd>,
) {
    // SAFETY: `st` is a valid out buffer; `copy` is our descriptor. This runs
    // off the loop thread, so FUSE requests it causes are served meanwhile.
    let ours = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let mut sfs: libc::statfs = std::mem::zeroed();
        libc::fstat(copy.as_raw_fd(), &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && match own_dev {
                Some((ma, mi)) => libc::major(st.st_dev) == ma && libc::minor(st.st_dev) == mi,
                None => {
                    libc::fstatfs(copy.as_raw_fd(), &mut sfs) == 0 && sfs.f_type == 0x6573_5546 // FUSE_SUPER_MAGIC
                }
            }
    };
    if ours {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&token.to_le_bytes());
        // SAFETY: `b` is the 16 bytes the command's size says.
        unsafe {
            libc::ioctl(
                copy.as_raw_fd(),
                WHICH_FILE_CMD as libc::c_ulong,
                b.as_mut_ptr(),
            )
        };
    }
    drop(copy);
    let _ = done.send(token);
    let one = 1u64.to_le_bytes();
    // SAFETY: writing the 8-byte increment to our eventfd.
    unsafe { libc::write(wake.as_raw_fd(), one.as_ptr().cast(), 8) };
}
