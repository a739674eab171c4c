//! The peer: a second process with its own client.
use super::*;

/// Peer requests: op@0 a@4 b@8 c@12 seed@16 (24 bytes); replies: status@0
/// n@4 handle@8 (12 bytes), with descriptors where said.
pub(crate) const P_IMPORT: u32 = 1;
pub(crate) const P_ALLOC: u32 = 2;
pub(crate) const P_FREE: u32 = 3;
pub(crate) const P_CLOSE_KEPT: u32 = 4;
pub(crate) const P_CLOSE_FILE: u32 = 5;
pub(crate) const P_SEND_FD: u32 = 6;
pub(crate) const P_EXIT: u32 = 7;

/// A forked process, driven over a socketpair, that holds its own client on
/// its own nvidiactl file. It only acts on a request and answers when done,
/// so it is quiescent whenever the main process reaches a checkpoint.
pub(crate) struct Peer {
    pub(crate) pid: libc::pid_t,
    pub(crate) sock: RawFd,
}

impl Peer {
    pub(crate) fn start(env: &Env, rng: Rng, way: OpenWay) -> Peer {
        let mut sv = [0i32; 2];
        // SAFETY: `sv` has room for two descriptors.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        } != 0
        {
            die("socketpair");
        }
        let pid = fork_child(move || peer_main(env, rng, sv[1], way));
        close(sv[1]);
        Peer { pid, sock: sv[0] }
    }

    /// One request; dies unless the peer answers status 0. Returns (n,
    /// handle, descriptors received).
    pub(crate) fn call(
        &self,
        op: u32,
        a: u32,
        b: u32,
        c: u32,
        seed: u64,
        fds: &[RawFd],
    ) -> (u32, u32, Vec<RawFd>) {
        let mut m = [0u8; 24];
        put_u32(&mut m, 0, op);
        put_u32(&mut m, 4, a);
        put_u32(&mut m, 8, b);
        put_u32(&mut m, 12, c);
        put_u64(&mut m, 16, seed);
        send_msg(self.sock, &m, fds);
        let mut r = [0u8; 12];
        let Some(got) = recv_msg(self.sock, &mut r) else {
            die(&format!("peer {} ended during request {op}", self.pid));
        };
        expect_ok(&format!("peer request {op}"), u32_at(&r, 0));
        if op == P_SEND_FD && b == 0 {
            // The peer's word that its close of its copy has returned: until
            // then its reference still counts (a close drops it only after the
            // file's flush), and our own close would not be the last one. The
            // release would then happen in the peer, at a moment no order
            // relates to our next calls, and the driver's peak with it.
            let mut closed = [0u8; 12];
            if recv_msg(self.sock, &mut closed).is_none() {
                die(&format!("peer {} ended before closing its copy", self.pid));
            }
        }
        (u32_at(&r, 4), u32_at(&r, 8), got)
    }

    /// The peer exits without freeing anything (its file's release tears its
    /// client down); waits for it.
    pub(crate) fn stop(self) {
        let mut m = [0u8; 24];
        put_u32(&mut m, 0, P_EXIT);
        send_msg(self.sock, &m, &[]);
        expect_exit0("peer", wait(self.pid));
        close(self.sock);
    }
}

pub(crate) struct PeerState<'e> {
    pub(crate) env: &'e Env,
    pub(crate) rng: Rng,
    pub(crate) way: OpenWay,
    pub(crate) ctl: Option<RawFd>,
    pub(crate) client: u32,
    /// GPU -> device handle.
    pub(crate) devs: std::collections::BTreeMap<u32, u32>,
    /// Handles held (imports and own allocations), in creation order.
    pub(crate) handles: Vec<u32>,
    /// Descriptors kept (export files, files it sent).
    pub(crate) kept: Vec<RawFd>,
}

impl PeerState<'_> {
    /// (ctl, client, device on `gpu`), made on first use.
    pub(crate) fn device(&mut self, gpu: u32) -> (RawFd, u32, u32) {
        let ctl = match self.ctl {
            Some(fd) => fd,
            None => {
                let fd = self.env.open_way("nvidiactl", self.way, false);
                self.ctl = Some(fd);
                self.client = self.env.root_client(fd, "peer client");
                fd
            }
        };
        let c = self.client;
        let dev = match self.devs.get(&gpu) {
            Some(d) => *d,
            None => {
                let d = self.env.device(ctl, c, gpu, "peer device");
                self.devs.insert(gpu, d);
                d
            }
        };
        (ctl, c, dev)
    }

    /// Handles one request; returns the reply (n, handle, descriptors to send).
    pub(crate) fn serve(
        &mut self,
        op: u32,
        a: u32,
        b: u32,
        c: u32,
        fds: Vec<RawFd>,
    ) -> (u32, u32, Vec<RawFd>) {
        match op {
            P_IMPORT => {
                let &[fd] = fds.as_slice() else {
                    die("peer: import without exactly one descriptor");
                };
                let (ctl, client, dev) = self.device(a);
                let (n, first) = if b == 0 {
                    let mut p = vec![0u8; abi::size::IMPORT_OBJECT_FROM_FD];
                    put_u32(&mut p, ux::IMP1_FD, fd as u32);
                    put_u32(&mut p, ux::IMP1_TYPE, ux::OBJECT_TYPE_RM);
                    put_u32(&mut p, ux::IMP1_H_DEVICE, dev);
                    put_u32(&mut p, ux::IMP1_H_PARENT, dev);
                    let st = self.env.control(
                        ctl,
                        client,
                        client,
                        ux::IMPORT_OBJECT_FROM_FD,
                        Some(&mut p),
                    );
                    expect_ok("IMPORT_OBJECT_FROM_FD", st);
                    let h = u32_at(&p, ux::IMP1_H_OBJECT);
                    self.handles.push(h);
                    (1, h)
                } else {
                    let mut p = vec![0u8; abi::size::IMPORT_OBJECTS_FROM_FD];
                    put_u32(&mut p, ux::IMPN_FD, fd as u32);
                    put_u32(&mut p, ux::IMPN_H_PARENT, dev);
                    put_u16(&mut p, ux::IMPN_NUM_OBJECTS, b as u16);
                    let st = self.env.control(
                        ctl,
                        client,
                        client,
                        ux::IMPORT_OBJECTS_FROM_FD,
                        Some(&mut p),
                    );
                    expect_ok("IMPORT_OBJECTS_FROM_FD", st);
                    let mut n = 0;
                    let mut first = 0;
                    for i in 0..b as usize {
                        // objects[i] in 0 (the driver picks): still 0 after
                        // the call for an empty slot.
                        let h = u32_at(&p, ux::IMPN_OBJECTS + 4 * i);
                        if h == 0 {
                            continue;
                        }
                        if n == 0 {
                            first = h;
                        }
                        n += 1;
                        self.handles.push(h);
                    }
                    (n, first)
                };
                if c != 0 {
                    self.kept.push(fd);
                } else {
                    close(fd);
                }
                (n, first, Vec::new())
            }
            P_ALLOC => {
                let (ctl, client, dev) = self.device(a);
                let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
                put_u64(&mut p, 64, b as u64 * MIB);
                let (st, h) = ok_or_die(
                    "peer alloc",
                    self.env.alloc(
                        ctl,
                        false,
                        false,
                        client,
                        dev,
                        0,
                        class::NV01_MEMORY_LOCAL_USER,
                        Some(&mut p),
                    ),
                );
                if st == status::NV_ERR_NO_MEMORY {
                    return (0, 0, Vec::new());
                }
                expect_ok("peer alloc", st);
                self.handles.push(h);
                (1, h, Vec::new())
            }
            P_FREE => {
                let Some(ctl) = self.ctl else {
                    return (0, 0, Vec::new());
                };
                let mut n = 0;
                for _ in 0..b {
                    if self.handles.is_empty() {
                        break;
                    }
                    let i = if a == u32::MAX {
                        self.rng.below(self.handles.len() as u64) as usize
                    } else {
                        (a as usize).min(self.handles.len() - 1)
                    };
                    let h = self.handles.remove(i);
                    expect_ok("peer free", self.env.free(ctl, self.client, 0, h));
                    n += 1;
                }
                (n, 0, Vec::new())
            }
            P_CLOSE_KEPT => {
                let n = self.kept.len() as u32;
                for fd in self.kept.drain(..) {
                    close(fd);
                }
                (n, 0, Vec::new())
            }
            P_CLOSE_FILE => {
                if let Some(fd) = self.ctl.take() {
                    close(fd);
                }
                self.devs.clear();
                self.handles.clear();
                self.client = 0;
                (0, 0, Vec::new())
            }
            P_SEND_FD => {
                let fd = self
                    .env
                    .open_way("nvidiactl", OPEN_WAYS[a as usize % 5], false);
                if b != 0 {
                    self.kept.push(fd);
                }
                (1, 0, vec![fd])
            }
            _ => die(&format!("peer: unknown request {op}")),
        }
    }
}

/// The peer's life: drop every inherited descriptor but stdio and `sock`,
/// then serve requests until P_EXIT or end of file.
pub(crate) fn peer_main(env: &Env, rng: Rng, sock: RawFd, way: OpenWay) -> i32 {
    // SAFETY: descriptor-table operations on our own (just forked) process.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
        if sock > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (sock - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (sock + 1) as u32, u32::MAX, 0u32);
    }
    let mut st = PeerState {
        env,
        rng,
        way,
        ctl: None,
        client: 0,
        devs: Default::default(),
        handles: Vec::new(),
        kept: Vec::new(),
    };
    loop {
        let mut m = [0u8; 24];
        let Some(fds) = recv_msg(sock, &mut m) else {
            return 0;
        };
        let op = u32_at(&m, 0);
        if op == P_EXIT {
            return 0;
        }
        st.rng = Rng(st.rng.0 ^ u64_at(&m, 16));
        let (n, h, out) = st.serve(op, u32_at(&m, 4), u32_at(&m, 8), u32_at(&m, 12), fds);
        let mut r = [0u8; 12];
        put_u32(&mut r, 4, n);
        put_u32(&mut r, 8, h);
        send_msg(sock, &r, &out);
        if op == P_SEND_FD && u32_at(&m, 8) == 0 {
            for fd in out {
                close(fd); // the sender closes its copy
            }
            send_msg(sock, &[0u8; 12], &[]); // and says so (see `call`)
        }
    }
}
