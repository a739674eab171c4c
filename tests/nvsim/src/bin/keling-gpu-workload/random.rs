//! The `random` scenario (the crate doc tells what it does).
use super::*;

pub(crate) fn random(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let mut r = Random {
        env,
        cli,
        main: Actor::new(env, Rng(cli.seed), ctl, 0x1000_0000),
        actors: 0,
        peer: None,
        exports: Vec::new(),
    };
    r.run(cp);
}

pub(crate) struct Random<'e> {
    env: &'e Env,
    cli: &'e Cli,
    main: Actor<'e>,
    /// Counter for per-actor handle ranges.
    actors: u32,
    /// The second process, once a step needs it.
    peer: Option<Peer>,
    /// Export files we still hold.
    exports: Vec<RawFd>,
}

impl<'e> Random<'e> {
    fn next_base(&mut self) -> u32 {
        self.actors += 1;
        0x1000_0000 + self.actors * 0x0001_0000
    }

    fn run(&mut self, cp: &mut Checkpoints) {
        let env = self.env;
        let ctl = self.main.ctl;
        // CUDA-like init: version check, card info, UVM.
        let mut v = vec![0u8; abi::size::RM_API_VERSION];
        put_u32(&mut v, 0, u32::from(b'2'));
        v[8..15].copy_from_slice(b"580.159");
        ok_or_die(
            "CHECK_VERSION_STR",
            env.rm(ctl, esc::CHECK_VERSION_STR, &mut v, false),
        );
        let mut ci = vec![0u8; abi::size::CARD_INFO_ENTRY * 32];
        ok_or_die("CARD_INFO", env.rm(ctl, esc::CARD_INFO, &mut ci, false));
        let uvm_fd = env.open("nvidia-uvm", false);
        let mut p = vec![0u8; uvm::INITIALIZE_SIZE];
        expect_ok(
            "UVM_INITIALIZE",
            env.uvm(
                uvm_fd,
                uvm::INITIALIZE,
                &mut p,
                Some(uvm::INITIALIZE_RM_STATUS),
            ),
        );
        let uvm_mm = env.open("nvidia-uvm", false);
        let mut p = vec![0u8; uvm::MM_INITIALIZE_SIZE];
        put_u32(&mut p, 0, uvm_fd as u32);
        expect_ok(
            "UVM_MM_INITIALIZE",
            env.uvm(
                uvm_mm,
                uvm::MM_INITIALIZE,
                &mut p,
                Some(uvm::MM_INITIALIZE_RM_STATUS),
            ),
        );
        let mut p = vec![0u8; uvm::PAGEABLE_MEM_ACCESS_SIZE];
        expect_ok(
            "UVM_PAGEABLE_MEM_ACCESS",
            env.uvm(
                uvm_fd,
                uvm::PAGEABLE_MEM_ACCESS,
                &mut p,
                Some(uvm::PAGEABLE_MEM_ACCESS_RM_STATUS),
            ),
        );
        let mut p = vec![0u8; uvm::CREATE_RANGE_GROUP_SIZE];
        expect_ok(
            "UVM_CREATE_RANGE_GROUP",
            env.uvm(
                uvm_fd,
                uvm::CREATE_RANGE_GROUP,
                &mut p,
                Some(uvm::CREATE_RANGE_GROUP_RM_STATUS),
            ),
        );
        self.main.uvm = Some(uvm_fd);
        self.main.setup_objects();
        self.main.startup_escapes();

        // (weight, op)
        const OPS: [(u64, u8); 25] = [
            (24, 0), // video alloc
            (6, 1),  // host alloc
            (16, 2), // free
            (5, 3),  // map/unmap
            (6, 4),  // control
            (4, 5),  // thread
            (4, 6),  // dup of the fd
            (3, 7),  // fork, leak through the inherited fd
            (2, 8),  // fork + exec, fd kept
            (2, 9),  // fork + exec, fd O_CLOEXEC
            (2, 10), // child killed by SIGKILL
            (2, 11), // second client, freed whole
            (2, 12), // free the main client and start over
            (5, 13), // share with the peer (export/import), owner frees
            (4, 14), // RM_DUP_OBJECT between two clients of this process
            (2, 15), // memory under a subdevice, subdevice freed
            (2, 16), // RM_ALLOC_MEMORY 0x40 / 0x3F on nvidiaN
            (4, 17), // VID_HEAP of each class
            (3, 18), // 0-byte classes, EGM
            (1, 19), // the startup escapes
            (6, 20), // open in one of the ways, work, let go
            (3, 21), // the peer frees, closes files, allocates
            (1, 22), // close our export files
            (3, 23), // release of a file whose memory the peer imported
            (0, 24), // (spare)
        ];
        let total: u64 = OPS.iter().map(|(w, _)| w).sum();
        for _ in 0..self.cli.steps {
            let mut r = self.main.rng.below(total);
            let mut op = 0;
            for (w, o) in OPS {
                if r < w {
                    op = o;
                    break;
                }
                r -= w;
            }
            if std::env::var_os("KELING_WORKLOAD_SHOW_OPS").is_some() {
                eprintln!("pid {} step {} op {op}", std::process::id(), cp.steps + 1);
            }
            match op {
                0 => self.main.alloc_random_video(),
                1 => self.main.alloc_host(),
                2 => self.main.free_random(),
                3 => self.main.map_unmap(),
                4 => self.main.control(),
                5 => self.thread(),
                6 => self.dup(),
                7 => self.fork_leak(),
                8 => self.fork_exec(false),
                9 => self.fork_exec(true),
                10 if self.cli.no_kills => self.main.alloc_random_video(),
                10 => self.kill_child(),
                11 => self.second_client(),
                12 => self.restart_client(),
                13 => self.share(),
                14 => self.dup_between_clients(),
                15 => self.main.subdevice_teardown(),
                16 => self.main.alloc_memory_video_class(),
                17 => self.main.vid_heap_class(),
                18 => self.main.zero_byte_classes(),
                19 => self.main.startup_escapes(),
                20 => self.open_session(),
                21 => self.peer_step(),
                22 => self.close_exports(),
                _ => self.release_shared_file(),
            }
            cp.step();
        }

        if self.main.rng.chance(30) {
            // exit without freeing anything: the release at exit tears down
            // (the peer goes first, so that every process is done)
            self.wind_down();
            cp.emit();
            return;
        }
        while let Some(a) = self.main.live.pop() {
            self.main.free_alloc(a);
        }
        let (c, ctl) = (self.main.client, self.main.ctl);
        expect_ok("free client", env.free(ctl, c, 0, c));
        self.wind_down();
        let mut p = [0u8; 8];
        ok_or_die(
            "UVM_DEINITIALIZE",
            sys_ioctl(uvm_fd, uvm::DEINITIALIZE, p.as_mut_ptr()),
        );
        for fd in self.main.gpu_fds.iter().flatten() {
            close(*fd);
        }
        close(uvm_mm);
        close(uvm_fd);
        close(ctl);
        cp.emit();
    }

    fn thread(&mut self) {
        let base = self.next_base();
        let env = self.env;
        let mut t = Actor::new(env, self.main.rng.fork(), self.main.ctl, base).join(
            self.main.client,
            self.main.device,
            self.main.gpu,
        );
        t.subdevice = self.main.subdevice;
        let n = 3 + self.main.rng.below(4) as u32;
        let main = &mut self.main;
        // The thread's calls do not overlap the main thread's: for concurrent
        // allocations and frees of one process, the order the driver applied them
        // in (which decides its peak) cannot be seen from outside it, so a peak
        // compared exactly needs them serialised. Keling's note on the issue
        // explains the bound for concurrent threads.
        let left = std::thread::scope(|s| {
            let h = s.spawn(move || {
                t.burst(n);
                t.live
            });
            h.join().unwrap_or_else(|_| die("thread panicked"))
        });
        main.burst(2);
        self.main.live.extend(left);
    }

    fn dup(&mut self) {
        // SAFETY: dup of our own open descriptor.
        let d = unsafe { libc::dup(self.main.ctl) };
        if d < 0 {
            die("dup");
        }
        let orig = self.main.ctl;
        self.main.ctl = d;
        let n = 1 + self.main.rng.below(2);
        for _ in 0..n {
            self.main.alloc_random_video();
        }
        self.main.control();
        self.main.ctl = orig;
        close(d);
    }

    fn fork_leak(&mut self) {
        let base = self.next_base();
        let env = self.env;
        let rng = self.main.rng.fork();
        let (ctl, c, dv, g, sd) = (
            self.main.ctl,
            self.main.client,
            self.main.device,
            self.main.gpu,
            self.main.subdevice,
        );
        let pid = fork_child(move || {
            let mut a = Actor::new(env, rng, ctl, base).join(c, dv, g);
            a.subdevice = sd;
            let n = 1 + a.rng.below(3);
            for _ in 0..n {
                a.alloc_random_video();
            }
            0 // exit without freeing
        });
        expect_exit0("fork-leak", wait(pid));
    }

    fn fork_exec(&mut self, cloexec: bool) {
        let base = self.next_base();
        let env = self.env;
        let seed = self.main.rng.next();
        // With O_CLOEXEC: a second open file with its own client and memory
        // that the parent closes after the child is done.
        let (fd, extra) = if cloexec {
            let fd = env.open("nvidiactl", true);
            let mut a = Actor::new(env, self.main.rng.fork(), fd, base + 0x8000);
            a.client_and_device(None);
            a.alloc_random_video();
            (fd, Some(a))
        } else {
            (self.main.ctl, None)
        };
        let (client, device, gpu) = match &extra {
            Some(a) => (a.client, a.device, a.gpu),
            None => (self.main.client, self.main.device, self.main.gpu),
        };
        let mut args = vec![
            env.exe.as_os_str().as_bytes().to_vec(),
            b"--dev-dir".to_vec(),
            env.dir.as_os_str().as_bytes().to_vec(),
        ];
        for (k, v) in [
            ("--seed", seed.to_string()),
            (
                "--exec-child",
                if cloexec { "cloexec" } else { "inherit" }.to_string(),
            ),
            ("--ctl-fd", fd.to_string()),
            ("--client", client.to_string()),
            ("--device", device.to_string()),
            ("--gpu", gpu.to_string()),
            ("--handle-base", base.to_string()),
        ] {
            args.push(k.as_bytes().to_vec());
            args.push(v.into_bytes());
        }
        let cargs: Vec<CString> = args
            .into_iter()
            .map(|a| CString::new(a).expect("no NUL"))
            .collect();
        let mut argv: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());
        let exe = c"/proc/self/exe";
        let pid = fork_child(|| {
            // SAFETY: `argv` is a NULL-terminated array of valid C strings
            // that outlive the call; execv only returns on failure.
            unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
            die(&format!("execv: errno {}", errno()));
        });
        expect_exit0("fork-exec", wait(pid));
        if let Some(a) = extra {
            if a.rng.clone().chance(50) {
                expect_ok("free cloexec client", env.free(fd, a.client, 0, a.client));
            }
            close(fd); // last close: the release tears the client down
        }
    }

    fn kill_child(&mut self) {
        let base = self.next_base();
        let env = self.env;
        let rng = self.main.rng.fork();
        let own_file = self.main.rng.chance(50);
        let (ctl, c, dv, g) = (
            self.main.ctl,
            self.main.client,
            self.main.device,
            self.main.gpu,
        );
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for two descriptors.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            die("pipe");
        }
        let pid = fork_child(move || {
            close(fds[0]);
            let mut a = if own_file {
                let fd = env.open("nvidiactl", false);
                let mut a = Actor::new(env, rng, fd, base);
                a.client_and_device(Some(g));
                a
            } else {
                Actor::new(env, rng, ctl, base).join(c, dv, g)
            };
            let mut told = false;
            for _ in 0..200_000 {
                let size = (1 + a.rng.below(8)) * MIB;
                if a.alloc_video(size, Via::Nvos21).is_some() && !told {
                    // SAFETY: writing one byte from a static buffer.
                    unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) };
                    told = true;
                }
                if a.rng.chance(70) {
                    a.free_random();
                }
            }
            0
        });
        close(fds[1]);
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into `b`.
        unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        close(fds[0]);
        std::thread::sleep(std::time::Duration::from_micros(self.main.rng.below(3000)));
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let st = wait(pid);
        let killed = libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGKILL;
        if !killed {
            expect_exit0("kill-child", st);
        }
    }

    fn second_client(&mut self) {
        let base = self.next_base();
        let mut a = Actor::new(self.env, self.main.rng.fork(), self.main.ctl, base);
        a.client_and_device(None);
        let n = 1 + a.rng.below(3);
        for _ in 0..n {
            a.alloc_random_video();
        }
        if a.rng.chance(50) {
            a.alloc_host();
        }
        expect_ok(
            "free second client",
            self.env.free(a.ctl, a.client, 0, a.client),
        );
        for fd in a.gpu_fds.iter().flatten() {
            close(*fd);
        }
    }

    /// The peer process, started on first use (its nvidiactl opened in a
    /// random way).
    fn peer(&mut self) -> &Peer {
        if self.peer.is_none() {
            let way = OPEN_WAYS[self.main.rng.below(OPEN_WAYS.len() as u64) as usize];
            let rng = self.main.rng.fork();
            self.peer = Some(Peer::start(self.env, rng, way));
        }
        self.peer.as_ref().expect("peer started")
    }

    /// A fresh export file (nvidiactl, O_CLOEXEC) opened in a random way.
    fn open_export_file(&mut self) -> RawFd {
        let way = OPEN_WAYS[self.main.rng.below(OPEN_WAYS.len() as u64) as usize];
        self.env.open_way("nvidiactl", way, true)
    }

    /// Hands export file `exp` (holding `batch` slots; 0: a single export)
    /// to the peer over SCM_RIGHTS; the peer imports on `gpu` and keeps the
    /// file or closes it; then we close our copy or keep it for later.
    fn peer_import(&mut self, exp: RawFd, batch: u32, gpu: u32) {
        let keep = self.main.rng.chance(40) as u32;
        let seed = self.main.rng.next();
        self.peer().call(P_IMPORT, gpu, batch, keep, seed, &[exp]);
        if self.main.rng.chance(50) {
            close(exp);
        } else {
            self.exports.push(exp);
        }
    }

    /// Memory of ours shared with the peer through export/import; then, often,
    /// we free our handles while the peer's references remain.
    fn share(&mut self) {
        let n = 1 + self.main.rng.below(3) as usize;
        let mut hs = self.main.pick_live(n);
        if hs.is_empty() {
            let size = (1 + self.main.rng.below(16)) * MIB;
            match self.main.alloc_video(size, Via::Nvos21) {
                Some(a) => hs.push(a.handle),
                None => return,
            }
        }
        let exp = self.open_export_file();
        let batch = self.main.export_to(exp, &hs);
        let gpu = self.main.gpu;
        self.peer_import(exp, batch, gpu);
        if self.main.rng.chance(50) {
            for a in self.main.take_live(&hs) {
                self.main.free_alloc(a);
            }
        }
    }

    /// A second client of this process (on our file or a new one) with
    /// references to our memory made by RM_DUP_OBJECT, and one of its own
    /// dup'd back into the main client; then either side goes first.
    fn dup_between_clients(&mut self) {
        let base = self.next_base();
        let own_file = self.main.rng.chance(50);
        let fd = if own_file {
            let way = OPEN_WAYS[self.main.rng.below(OPEN_WAYS.len() as u64) as usize];
            self.env.open_way("nvidiactl", way, true)
        } else {
            self.main.ctl
        };
        let mut a = Actor::new(self.env, self.main.rng.fork(), fd, base);
        a.client_and_device(Some(self.main.gpu));
        let n = 1 + self.main.rng.below(2) as usize;
        let src = self.main.pick_live(n);
        for h in &src {
            let d = a.dup_into(a.client, a.device, self.main.client, *h);
            a.live.push(Alloc {
                handle: d,
                video: false,
                gpu: a.gpu,
                uvm_base: None,
            });
        }
        let size = (1 + a.rng.below(8)) * MIB;
        if let Some(mine) = a.alloc_video(size, Via::Nvos21) {
            let (c, d) = (self.main.client, self.main.device);
            let back = self.main.dup_into(c, d, a.client, mine.handle);
            self.main.live.push(Alloc {
                handle: back,
                video: false,
                gpu: a.gpu,
                uvm_base: None,
            });
        }
        if self.main.rng.chance(50) {
            // the originals go first: the dups keep the memory
            for x in self.main.take_live(&src) {
                self.main.free_alloc(x);
            }
        }
        match self.main.rng.below(3) {
            0 => {
                while let Some(x) = a.live.pop() {
                    a.free_alloc(x);
                }
                expect_ok("free dup client", self.env.free(fd, a.client, 0, a.client));
            }
            1 => expect_ok("free dup client", self.env.free(fd, a.client, 0, a.client)),
            _ if own_file => {} // the release below tears it down
            _ => expect_ok("free dup client", self.env.free(fd, a.client, 0, a.client)),
        }
        for g in a.gpu_fds.iter().flatten() {
            close(*g);
        }
        if own_file {
            close(fd);
        }
    }

    /// A client on a new nvidiactl file whose memory the peer imports; then
    /// that file is closed (its release): the peer's references keep the
    /// memory and take the charge.
    fn release_shared_file(&mut self) {
        let base = self.next_base();
        let way = OPEN_WAYS[self.main.rng.below(OPEN_WAYS.len() as u64) as usize];
        let fd = self.env.open_way("nvidiactl", way, true);
        let mut a = Actor::new(self.env, self.main.rng.fork(), fd, base);
        a.client_and_device(None);
        for _ in 0..1 + a.rng.below(3) {
            let size = (1 + a.rng.below(8)) * MIB;
            a.alloc_video(size, Via::Nvos21);
        }
        let hs: Vec<u32> = a.live.iter().map(|x| x.handle).collect();
        if !hs.is_empty() {
            let exp = self.open_export_file();
            let batch = a.export_to(exp, &hs);
            let gpu = a.gpu;
            self.peer_import(exp, batch, gpu);
        }
        close(fd);
    }

    /// Opens nvidiactl in one of the ways a process gets a descriptor, works
    /// on it (a client, a device, memory), and lets it go (client freed, or
    /// only the release of the file at its last close).
    fn open_session(&mut self) {
        let base = self.next_base();
        let how = self.main.rng.below(12);
        let (fd, other) = match how {
            0..=4 => (
                self.env
                    .open_way("nvidiactl", OPEN_WAYS[how as usize], false),
                None,
            ),
            5..=9 => {
                let o = self.env.open_way("nvidiactl", OpenWay::Openat, false);
                let d = dup_way(o, DUP_WAYS[how as usize - 5]);
                if self.main.rng.chance(50) {
                    close(o);
                    (d, None)
                } else {
                    (d, Some(o))
                }
            }
            _ => {
                // from the peer over SCM_RIGHTS; it closes its copy or keeps it
                let way = self.main.rng.below(OPEN_WAYS.len() as u64) as u32;
                let keep = (how == 11) as u32;
                let seed = self.main.rng.next();
                let (_, _, fds) = self.peer().call(P_SEND_FD, way, keep, 0, seed, &[]);
                let &[fd] = fds.as_slice() else {
                    die("the peer sent no descriptor");
                };
                (fd, None)
            }
        };
        let mut a = Actor::new(self.env, self.main.rng.fork(), fd, base);
        a.client_and_device(None);
        for _ in 0..1 + a.rng.below(2) {
            a.alloc_random_video();
        }
        if a.rng.chance(30) {
            a.alloc_host();
        }
        if a.rng.chance(40) {
            expect_ok(
                "free session client",
                self.env.free(fd, a.client, 0, a.client),
            );
        }
        for g in a.gpu_fds.iter().flatten() {
            close(*g);
        }
        match other {
            Some(o) if self.main.rng.chance(50) => {
                close(o);
                close(fd);
            }
            Some(o) => {
                close(fd);
                close(o);
            }
            None => close(fd),
        }
    }

    /// The peer frees some of its handles, closes the files it kept, closes
    /// its nvidiactl file (a release), or allocates memory of its own.
    fn peer_step(&mut self) {
        let which = self.main.rng.below(4);
        let gpu = self.main.rng.below(self.env.gpus as u64) as u32;
        let mib = 1 + self.main.rng.below(8) as u32;
        let seed = self.main.rng.next();
        let p = self.peer();
        match which {
            0 => p.call(P_FREE, u32::MAX, 1 + (seed % 2) as u32, 0, seed, &[]),
            1 => p.call(P_CLOSE_KEPT, 0, 0, 0, seed, &[]),
            2 => p.call(P_CLOSE_FILE, 0, 0, 0, seed, &[]),
            _ => p.call(P_ALLOC, gpu, mib, 0, seed, &[]),
        };
    }

    /// Closes the export files we kept (their release drops their
    /// references).
    fn close_exports(&mut self) {
        for fd in self.exports.drain(..) {
            close(fd);
        }
    }

    /// Stops the peer (if any) and closes the export files we kept: every
    /// process involved is done before the last checkpoint.
    fn wind_down(&mut self) {
        self.close_exports();
        if let Some(p) = self.peer.take() {
            p.stop();
        }
    }

    fn restart_client(&mut self) {
        let live = std::mem::take(&mut self.main.live);
        if let Some(u) = self.main.uvm {
            for base in live.iter().filter_map(|a| a.uvm_base) {
                let mut p = vec![0u8; uvm::BASE_LENGTH_STATUS_SIZE];
                put_u64(&mut p, 0, base);
                expect_ok(
                    "UVM_FREE",
                    self.env.uvm(
                        u,
                        uvm::FREE,
                        &mut p,
                        Some(uvm::BASE_LENGTH_STATUS_RM_STATUS),
                    ),
                );
            }
        }
        let c = self.main.client;
        expect_ok("free main client", self.env.free(self.main.ctl, c, 0, c));
        self.main.handles.base = self.next_base();
        self.main.handles.n = 0;
        self.main.setup_objects();
    }
}
