//! `keling-gpu-workload`: drives the simulated driver like a CUDA process.
//!
//! ```text
//! keling-gpu-workload --dev-dir DIR --seed S [--steps N] [--checkpoints]
//!                     [--checkpoint-every K]
//!                     [--scenario random|basic|hostile|oom|share|busy|churn|
//!                                 pass-server|pass-client|pass-holder|many-fds|
//!                                 many-clients|fd-flood|fd-hoard [--fds N]]
//!                     [--socket PATH]
//! ```
//! It only makes real syscalls on the device files (open, openat2, ioctl, dup,
//! close, close_range, fork, exec, exit, unix-socket descriptor passing),
//! which the tracer watches. Everything is decided by the seed; what depends
//! on timing is marked (the progress of the child killed by SIGKILL, the
//! interleaving of the concurrent thread and the values of driver-picked
//! handles). With `--checkpoints` it prints `checkpoint <n>` on stdout after
//! every K steps and at the end (before exiting), and waits for one line on
//! stdin before going on; it prints nothing else on stdout. Every process it
//! involves is quiescent at a checkpoint: children are waited for, and the
//! peer process (below) only acts on a request and answers when done.
//! Unexpected driver answers are reported on stderr with exit code 2. With
//! `KELING_WORKLOAD_SHOW_OPS` set, `random` says each step's op on stderr
//! (`pid P step N op K`, K as in its table of ops), to find what a failing
//! checkpoint's steps did.
//!
//! ## `random`
//! CUDA-like start (CHECK_VERSION_STR, CARD_INFO, UVM INITIALIZE /
//! MM_INITIALIZE / PAGEABLE_MEM_ACCESS / range group, client, device,
//! subdevice, VA space, TSG, channel, compute, the startup escapes
//! ALLOC_OS_EVENT / SYS_PARAMS / NUMA_INFO / WAIT_OPEN_COMPLETE (550+) /
//! UPDATE_DEVICE_MAPPING_INFO / FREE_OS_EVENT), then `--steps` steps drawn by
//! weight:
//! * video allocations (NVOS21, NVOS64, through XFER_CMD, VID_HEAP), some
//!   under the subdevice and mapped through UVM; host allocations
//!   (RM_ALLOC_MEMORY 0x3E/0x71 on nvidiaN, RM_ALLOC 0x3E); frees (RM_FREE,
//!   VID_HEAP FREE); map/unmap; controls;
//! * a thread on the same client; work through a dup of the fd; a forked
//!   child that allocates through the inherited fd and exits holding it;
//!   fork + exec with the fd kept (or O_CLOEXEC and a file of its own); a
//!   child killed by SIGKILL mid-work; a second client freed whole; the main
//!   client freed and set up again;
//! * sharing with a **peer**: a second process, forked on first use and
//!   driven over a SOCK_SEQPACKET socketpair, that closes every inherited
//!   descriptor (close_range) and opens its own nvidiactl (one of the open
//!   ways below) with its own client. Our memory is exported
//!   (EXPORT_OBJECT_TO_FD or a batch EXPORT_OBJECTS_TO_FD, sometimes with an
//!   empty slot) to a fresh nvidiactl export file, which is passed to the
//!   peer with SCM_RIGHTS; the peer imports it (IMPORT_OBJECT_FROM_FD or
//!   IMPORT_OBJECTS_FROM_FD) under a device on the memory's GPU and keeps or
//!   closes the file; we close our copy or keep it; then often we free our
//!   handles while the peer's references remain (the charge moves to it);
//! * a client on a new file whose memory the peer imports, then the release
//!   of that file (its memory lives on in the peer, charged to it);
//! * the peer frees some of its handles, closes the files it kept, closes
//!   its nvidiactl file (a release) or allocates memory of its own; we close
//!   the export files we kept;
//! * RM_DUP_OBJECT between two clients of this process (the second on our
//!   file or a new one), both ways, then the originals or the dups go first;
//! * memory (video, host, an 0xF8 fabric range) under a fresh subdevice, one
//!   of them dup'd under the device sometimes, then the subdevice freed;
//! * RM_ALLOC_MEMORY of 0x40 / 0x3F on nvidiaN (0 bytes; the limit written
//!   back is checked against CARD_INFO's fb_size); VID_HEAP ALLOC_SIZE of
//!   each class (virtual, EGM, video, host), ALLOC_SIZE_RANGE,
//!   ALLOC_OS_DESCRIPTOR; RM_ALLOC of the 0-byte classes 0xC2, 0xF8, 0xFD
//!   (version-sized params), 0xF9, 0xFB, 0xE0, 0x50A0, 0x70 and of EGM 0x42;
//!   the startup escapes again;
//! * a session on nvidiactl opened in one of the ways a process gets a
//!   descriptor: openat with an absolute path (glibc's open), the raw open(2)
//!   syscall, openat2, a relative path after chdir into the device directory,
//!   a symlink in a temporary directory, a dup / dup2 / dup3(O_CLOEXEC) /
//!   fcntl(F_DUPFD) / fcntl(F_DUPFD_CLOEXEC) of such a descriptor (the
//!   original closed first, or kept and closed before or after), or a
//!   descriptor the peer opened and sent with SCM_RIGHTS and then closed
//!   (waited for: our close is then the last one) or kept; a client, a device,
//!   memory, and then the client freed or only the file released.
//!
//! At the end, 70% of runs free everything and close every fd, 30% exit
//! holding it all (the release at exit tears it down); in both cases the
//! export files we kept are closed and the peer is told to exit (without
//! freeing: its file's release tears its client down) and waited for before
//! the last checkpoint.
//!
//! ## `basic`, `hostile`, `oom`, `busy`, `churn`, `pass-server`, `pass-client`, `pass-holder`,
//! `many-fds`, `many-clients`
//! As documented on their functions; other tests depend on their exact
//! behaviour.
//!
//! ## `share`
//! A short, deterministic version of the sharing operations, one step per
//! checkpoint (`--checkpoint-every 1`), on GPU 0. Processes: **A**, this
//! process, and **B**, the peer (forked at step 3, nvidiactl opened with
//! openat2).
//! 1. A opens nvidiactl (openat): client, device, subdevice; video mA1 8 MiB
//!    and mA2 4 MiB, host hA 1 MiB (RM_ALLOC 0x40 / 0x3E).
//! 2. A opens a second nvidiactl file with the raw open(2) syscall: client 2,
//!    device; RM_DUP_OBJECT of mA1 into client 2.
//! 3. A exports mA2 to export file exp1 (EXPORT_OBJECT_TO_FD) and [mA1, hA] to
//!    exp2 (EXPORT_OBJECTS_TO_FD, 2 slots); B is started.
//! 4. A sends exp1 and exp2 to B (SCM_RIGHTS) and closes its copies; B opens
//!    its nvidiactl, imports mA2 from exp1 (keeps exp1) and [mA1, hA] from
//!    exp2 (closes exp2: its release drops its references), and allocates
//!    mB 2 MiB.
//! 5. A frees mA2: B's import takes the charge (4 MiB to B).
//! 6. A frees mA1 in its first client: its dup in client 2 (older than B's
//!    import) keeps the charge with A.
//! 7. A closes the second file: client 2 and the dup go; B takes mA1 (8 MiB).
//! 8. B frees its import of mA2: only exp1 keeps it, still charged to B, in
//!    nobody's driver figure.
//! 9. B closes exp1: mA2 is freed (a free for B).
//!
//! At the end (checkpoint 10, both alive; MiB on GPU 0): A holds client 1
//! with its device, subdevice and hA (host 1, charged to A); bytes 0, peak
//! 12, host 1, driver 0, allocs 3, frees 0. B holds its client with the
//! imports of mA1 (8, charged to B) and hA (charged to A) and mB (2); bytes
//! 10, peak 14, host 0, driver 10, allocs 1, frees 1. GPU 0: used 10 and
//! host 1. Then B exits (mA1 and mB freed from B, its hA handle goes) and A
//! exits (hA freed from A): A ends with frees 1, B with frees 3.

use std::ffi::CString;
use std::io::{BufRead, Write};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use keling_nvsim::abi::le::{put_u16, put_u32, put_u64, u32_at, u64_at};
use keling_nvsim::abi::{self, class, esc, status, unix_ctrl as ux, uvm};

const MIB: u64 = 1 << 20;

#[derive(Parser, Clone)]
#[command(
    name = "keling-gpu-workload",
    about = "CUDA-like load for keling-nvsim"
)]
struct Cli {
    /// Directory with nvidiactl, nvidiaN, nvidia-uvm (the nvsim mount).
    #[arg(long)]
    dev_dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Steps of the random scenario.
    #[arg(long, default_value_t = 40)]
    steps: u32,
    /// Print `checkpoint <n>` and wait for a line on stdin every K steps.
    #[arg(long)]
    checkpoints: bool,
    #[arg(long, default_value_t = 10)]
    checkpoint_every: u32,
    /// random (default), basic, hostile, oom, share, busy, churn, compute, pass-server,
    /// pass-client, pass-holder, many-fds, many-clients, fd-flood, fd-hoard.
    #[arg(long, default_value = "random")]
    scenario: String,
    /// random: draw no "child killed by SIGKILL mid-work" step (a kill can land
    /// between an ioctl's return and `keling_test_ioctl_returned`).
    #[arg(long)]
    no_kills: bool,
    // Internal: continuing as an exec'd child.
    #[arg(long, hide = true)]
    exec_child: Option<String>,
    #[arg(long, hide = true, default_value_t = -1)]
    ctl_fd: i32,
    #[arg(long, hide = true, default_value_t = 0)]
    client: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    device: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    gpu: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    handle_base: u32,
    /// busy: iterations of GPU work (an RM_CONTROL and a 2 ms sleep each).
    #[arg(long, default_value_t = 500)]
    iterations: u64,
    /// busy: RM_CONTROLs per iteration, back to back.
    #[arg(long, default_value_t = 1)]
    calls_per_iteration: u64,
    /// busy: video memory to hold while working, in MiB (retried every 20 ms
    /// while the driver says NV_ERR_NO_MEMORY).
    #[arg(long, default_value_t = 0)]
    alloc_mib: u64,
    /// busy: the GPU to use (default: the first of CUDA_VISIBLE_DEVICES, else 0).
    #[arg(long)]
    use_gpu: Option<u32>,
    /// compute: a second device object of the same GPU in the same client,
    /// with this much video memory under it, in MiB (the driver's per-process
    /// figure counts it from 545 only).
    #[arg(long, default_value_t = 0)]
    second_device_mib: u64,
    /// busy: write the iterations done so far to this file as it goes.
    #[arg(long)]
    progress: Option<PathBuf>,
    /// pass-server / pass-client: the unix socket the nvidiactl fd travels over.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// churn: while this file exists, allocate and free nothing (only controls),
    /// so the memory figures hold still for a checkpoint.
    #[arg(long)]
    pause_file: Option<PathBuf>,
    /// busy: before its allocation, this many more clients on its nvidiactl file,
    /// each with a device and 1 MiB (past 7, more than Keling's table of an open
    /// file's clients holds).
    #[arg(long, default_value_t = 0)]
    clients: u32,
    /// fd-flood: how many nvidiactl fds to open, each with 1 MiB; fd-hoard: how
    /// many to open with nothing on them.
    #[arg(long, default_value_t = 100)]
    fds: u32,
}

// ----- process-wide helpers ----------------------------------------------

/// Set in forked children: leave with `_exit` so nothing of the parent's
/// state (stdio buffers, atexit) runs twice.
static FORKED: AtomicBool = AtomicBool::new(false);

fn leave(code: i32) -> ! {
    if FORKED.load(Ordering::Relaxed) {
        // SAFETY: _exit has no preconditions.
        unsafe { libc::_exit(code) }
    }
    std::process::exit(code)
}

fn die(msg: &str) -> ! {
    let _ = writeln!(
        std::io::stderr(),
        "keling-gpu-workload[{}]: {msg}",
        std::process::id()
    );
    leave(2)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

type Errno = i32;

fn sys_ioctl(fd: RawFd, cmd: u32, arg: *mut u8) -> Result<(), Errno> {
    // SAFETY: `arg` is either a pointer into a live buffer owned by the caller
    // that is large enough for `cmd`, or a deliberately bad address (hostile
    // scenario) that the driver must reject without our process touching it.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg) };
    let e = if r < 0 { errno() } else { 0 };
    keling_test_ioctl_returned(if r < 0 { -i64::from(e) } else { i64::from(r) });
    if r < 0 { Err(e) } else { Ok(()) }
}

/// Called right after each ioctl returns, in the same thread, with what the
/// kernel returned (`-errno` on failure); returns it. Keling's tests attach a
/// uretprobe here to stand in for the driver-entry backend's kretprobe on the
/// driver's ioctl, which this machine cannot attach (keling-agent's
/// `KELING_TEST_IOCTL_RETURN`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn keling_test_ioctl_returned(ret: i64) -> i64 {
    std::hint::black_box(ret)
}

fn open_dev(path: &Path, cloexec: bool) -> RawFd {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL in path");
    let flags = libc::O_RDWR | if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        die(&format!("open {}: errno {}", path.display(), errno()));
    }
    fd
}

fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this program opened.
    unsafe { libc::close(fd) };
}

/// splitmix64.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// A random allocation size in 1 KiB ..= 512 MiB: powers of two, exact
/// multiples of 2 MiB and odd sizes.
fn random_size(rng: &mut Rng) -> u64 {
    let base = 1u64 << (10 + rng.below(20)); // 1 KiB .. 512 MiB
    let s = match rng.below(4) {
        0 => base,
        1 => (base / (2 * MIB)).max(1) * 2 * MIB,
        2 => base + rng.below(base),
        _ => (1024 + rng.below(base)) | 1,
    };
    s.clamp(1024, 512 * MIB)
}

// ----- the ABI, spoken with explicit offsets -------------------------------

/// How an allocation is requested.
#[derive(Clone, Copy, Debug)]
enum Via {
    Nvos21,
    Nvos64,
    Xfer21,
    Xfer64,
    VidHeap,
}

const VIAS: [Via; 5] = [
    Via::Nvos21,
    Via::Nvos64,
    Via::Xfer21,
    Via::Xfer64,
    Via::VidHeap,
];

#[derive(Clone)]
struct Env {
    dir: PathBuf,
    legacy: bool,
    /// Driver major version (from `DIR/version`).
    major: u32,
    /// The full version, which keys the layouts that moved between branches.
    version: abi::Version,
    gpus: u32,
    exe: PathBuf,
}

impl Env {
    fn discover(dir: &Path) -> Env {
        let version = std::fs::read_to_string(dir.join("version")).unwrap_or_default();
        // "NVRM version: ... x86_64  580.159  Release Build ..."
        let v = version
            .split_whitespace()
            .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
            .unwrap_or("580.0");
        let major = abi::version_major(v).unwrap_or(580);
        let legacy = major < abi::PARAMS_SIZE_SINCE;
        let mut gpus = 0;
        while dir.join(format!("nvidia{gpus}")).exists() {
            gpus += 1;
        }
        if gpus == 0 {
            die(&format!("no {}/nvidia0", dir.display()));
        }
        let exe = std::fs::read_link("/proc/self/exe")
            .unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        Env {
            dir: dir.to_path_buf(),
            legacy,
            major,
            version: abi::Version::of(v),
            gpus,
            exe,
        }
    }

    fn open(&self, name: &str, cloexec: bool) -> RawFd {
        open_dev(&self.dir.join(name), cloexec)
    }

    /// RM_ALLOC of a root client on `ctl` (the driver picks the handle); `what`
    /// names it if the driver refuses.
    fn root_client(&self, ctl: RawFd, what: &str) -> u32 {
        let (st, c) = ok_or_die(
            what,
            self.alloc(ctl, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
        );
        expect_ok(what, st);
        c
    }

    /// RM_ALLOC of the device of `gpu` under `client` (NV0080 params: the device
    /// number, the rest zero).
    fn device(&self, ctl: RawFd, client: u32, gpu: u32, what: &str) -> u32 {
        let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
        put_u32(&mut dp, 0, gpu);
        let (st, d) = ok_or_die(
            what,
            self.alloc(
                ctl,
                false,
                false,
                client,
                client,
                0,
                class::NV01_DEVICE_0,
                Some(&mut dp),
            ),
        );
        expect_ok(what, st);
        d
    }

    /// RM_ALLOC of subdevice 0 under `device` (zeroed NV2080 params).
    fn subdevice(&self, ctl: RawFd, client: u32, device: u32) -> u32 {
        let mut sp = vec![0u8; abi::size::NV2080_ALLOC];
        let (st, sub) = ok_or_die(
            "subdevice",
            self.alloc(
                ctl,
                false,
                false,
                client,
                device,
                0,
                class::NV20_SUBDEVICE_0,
                Some(&mut sp),
            ),
        );
        expect_ok("subdevice", st);
        sub
    }

    /// How every fixed scenario starts on its nvidiactl file `ctl`: a root client
    /// and the device of `gpu` under it. Returns (client, device).
    fn session(&self, ctl: RawFd, gpu: u32) -> (u32, u32) {
        let c = self.root_client(ctl, "client");
        (c, self.device(ctl, c, gpu, "device"))
    }

    /// One RM escape with params `p`, directly or through XFER_CMD.
    fn rm(&self, fd: RawFd, nr: u8, p: &mut [u8], xfer: bool) -> Result<(), Errno> {
        if xfer {
            let mut x = [0u8; 16];
            put_u32(&mut x, 0, nr as u32);
            put_u32(&mut x, 4, p.len() as u32);
            put_u64(&mut x, 8, p.as_mut_ptr() as u64);
            sys_ioctl(fd, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr())
        } else {
            sys_ioctl(fd, abi::iowr(nr, p.len()), p.as_mut_ptr())
        }
    }

    /// RM_ALLOC through NVOS21 or NVOS64 (legacy layouts before 535).
    /// Returns (status, handle).
    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &self,
        fd: RawFd,
        nvos64: bool,
        xfer: bool,
        root: u32,
        parent: u32,
        new: u32,
        cls: u32,
        params: Option<&mut [u8]>,
    ) -> Result<(u32, u32), Errno> {
        let (ptr, psize) = match params {
            Some(p) => (p.as_mut_ptr() as u64, p.len() as u32),
            None => (0, 0),
        };
        let (len, status_off, psize_off) = match (nvos64, self.legacy) {
            (false, false) => (32, 28, Some(24)),
            (false, true) => (32, 24, None),
            (true, false) => (48, 40, Some(32)),
            (true, true) => (40, 36, None),
        };
        let mut b = vec![0u8; len];
        put_u32(&mut b, 0, root);
        put_u32(&mut b, 4, parent);
        put_u32(&mut b, 8, new);
        put_u32(&mut b, 12, cls);
        put_u64(&mut b, 16, ptr);
        if let Some(o) = psize_off {
            put_u32(&mut b, o, psize);
        }
        self.rm(fd, esc::RM_ALLOC, &mut b, xfer)?;
        Ok((u32_at(&b, status_off), u32_at(&b, 8)))
    }

    /// `bytes` of video memory (NV01_MEMORY_LOCAL_USER) under device `d` of client
    /// `c` on `fd`, by plain RM_ALLOC; dies unless the driver says OK. Its handle.
    fn alloc_local(&self, fd: RawFd, c: u32, d: u32, bytes: u64) -> u32 {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, bytes);
        let (st, h) = ok_or_die(
            "alloc",
            self.alloc(
                fd,
                false,
                false,
                c,
                d,
                0,
                class::NV01_MEMORY_LOCAL_USER,
                Some(&mut p),
            ),
        );
        expect_ok("alloc", st);
        h
    }

    fn free(&self, fd: RawFd, root: u32, parent: u32, obj: u32) -> u32 {
        let mut b = [0u8; 16];
        put_u32(&mut b, 0, root);
        put_u32(&mut b, 4, parent);
        put_u32(&mut b, 8, obj);
        if let Err(e) = self.rm(fd, esc::RM_FREE, &mut b, false) {
            die(&format!("RM_FREE: errno {e}"));
        }
        u32_at(&b, 12)
    }

    fn control(
        &self,
        fd: RawFd,
        client: u32,
        obj: u32,
        cmd: u32,
        params: Option<&mut [u8]>,
    ) -> u32 {
        let mut b = [0u8; 32];
        put_u32(&mut b, 0, client);
        put_u32(&mut b, 4, obj);
        put_u32(&mut b, 8, cmd);
        if let Some(p) = params {
            put_u64(&mut b, 16, p.as_mut_ptr() as u64);
            put_u32(&mut b, 24, p.len() as u32);
        }
        if let Err(e) = self.rm(fd, esc::RM_CONTROL, &mut b, false) {
            die(&format!("RM_CONTROL: errno {e}"));
        }
        u32_at(&b, 28)
    }

    /// A UVM command with params `p` (arg = pointer); returns the rmStatus at
    /// `status_off` when given.
    fn uvm(&self, fd: RawFd, cmd: u32, p: &mut [u8], status_off: Option<usize>) -> u32 {
        if let Some(o) = status_off {
            put_u32(p, o, 0xffff_ffff);
        }
        if let Err(e) = sys_ioctl(fd, cmd, p.as_mut_ptr()) {
            die(&format!("UVM {cmd:#x}: errno {e}"));
        }
        status_off.map(|o| u32_at(p, o)).unwrap_or(0)
    }
}

fn expect_ok(what: &str, st: u32) {
    if st != status::NV_OK {
        die(&format!("{what}: status {st:#x}"));
    }
}

fn ok_or_die<T>(what: &str, r: Result<T, Errno>) -> T {
    r.unwrap_or_else(|e| die(&format!("{what}: errno {e}")))
}

// ----- an actor: a thread of work on one client ---------------------------

#[derive(Clone, Copy, Debug)]
struct Alloc {
    handle: u32,
    /// Video memory (VID_HEAP FREE is used for some of these).
    video: bool,
    /// The GPU of the memory (RM_ALLOC_MEMORY: the nvidiaN file's).
    gpu: u32,
    /// UVM external range base, if mapped through nvidia-uvm.
    uvm_base: Option<u64>,
}

/// Object handles a caller chooses: `base + n`, distinct per actor.
struct Handles {
    base: u32,
    n: u32,
}

impl Handles {
    fn pick(&mut self, rng: &mut Rng) -> u32 {
        if rng.chance(50) {
            0
        } else {
            self.n += 1;
            self.base + self.n
        }
    }
}

struct Actor<'e> {
    env: &'e Env,
    rng: Rng,
    ctl: RawFd,
    client: u32,
    device: u32,
    subdevice: u32,
    gpu: u32,
    handles: Handles,
    live: Vec<Alloc>,
    /// nvidia-uvm fd and the next fake VA for external ranges.
    uvm: Option<RawFd>,
    next_va: u64,
    /// nvidiaN fds for RM_ALLOC_MEMORY, opened on demand.
    gpu_fds: Vec<Option<RawFd>>,
}

impl<'e> Actor<'e> {
    fn new(env: &'e Env, rng: Rng, ctl: RawFd, handle_base: u32) -> Self {
        Actor {
            env,
            rng,
            ctl,
            client: 0,
            device: 0,
            subdevice: 0,
            gpu: 0,
            handles: Handles {
                base: handle_base,
                n: 0,
            },
            live: Vec::new(),
            uvm: None,
            next_va: 0x7e00_0000_0000 + ((handle_base as u64) << 20),
            gpu_fds: vec![None; env.gpus as usize],
        }
    }

    /// Joins an existing client/device (threads, forked and exec'd children).
    fn join(mut self, client: u32, device: u32, gpu: u32) -> Self {
        self.client = client;
        self.device = device;
        self.gpu = gpu;
        self
    }

    fn new_client(&mut self) -> u32 {
        let chosen = if self.rng.chance(50) {
            0x6000_0000 | ((std::process::id() & 0xf_ffff) << 8) | (self.rng.below(256) as u32)
        } else {
            0
        };
        let (mut st, mut h) = ok_or_die(
            "client",
            self.env.alloc(
                self.ctl,
                false,
                false,
                0,
                0,
                chosen,
                class::NV01_ROOT_CLIENT,
                None,
            ),
        );
        if st == status::NV_ERR_INSERT_DUPLICATE_NAME && chosen != 0 {
            (st, h) = ok_or_die(
                "client",
                self.env.alloc(
                    self.ctl,
                    false,
                    false,
                    0,
                    0,
                    0,
                    class::NV01_ROOT_CLIENT,
                    None,
                ),
            );
        }
        expect_ok("client alloc", st);
        h
    }

    fn obj(&mut self, parent: u32, cls: u32, params: Option<&mut [u8]>) -> u32 {
        let new = self.handles.pick(&mut self.rng);
        let nvos64 = self.rng.chance(30);
        let (st, h) = ok_or_die(
            "RM_ALLOC",
            self.env.alloc(
                self.ctl,
                nvos64,
                false,
                self.client,
                parent,
                new,
                cls,
                params,
            ),
        );
        expect_ok(&format!("alloc class {cls:#x}"), st);
        if new != 0 && h != new {
            die("a chosen handle was not kept");
        }
        h
    }

    /// A new client on this actor's file and the device of `gpu` under it (None:
    /// a GPU drawn from the actor's rng, after the client's draws).
    fn client_and_device(&mut self, gpu: Option<u32>) {
        self.client = self.new_client();
        self.gpu = match gpu {
            Some(g) => g,
            None => self.rng.below(self.env.gpus as u64) as u32,
        };
        let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
        put_u32(&mut dp, 0, self.gpu);
        self.device = self.obj(self.client, class::NV01_DEVICE_0, Some(&mut dp));
    }

    /// Client, device on a random GPU, subdevice, VA space, TSG, context
    /// share, Hopper channel and compute object.
    fn setup_objects(&mut self) {
        self.client_and_device(None);
        let mut sp = vec![0u8; abi::size::NV2080_ALLOC];
        self.subdevice = self.obj(self.device, class::NV20_SUBDEVICE_0, Some(&mut sp));
        let vas = self.obj(self.device, class::FERMI_VASPACE_A, None);
        let mut tp = vec![0u8; abi::size::TSG_ALLOC];
        put_u32(&mut tp, 8, vas);
        put_u32(&mut tp, 12, 1);
        let tsg = self.obj(self.device, class::KEPLER_CHANNEL_GROUP_A, Some(&mut tp));
        let ctx = self.obj(tsg, class::FERMI_CONTEXT_SHARE_A, None);
        let mut cp = vec![0u8; abi::size::CHANNEL_ALLOC];
        put_u64(&mut cp, 16, 1024);
        put_u32(&mut cp, 24, ctx);
        put_u32(&mut cp, 28, vas);
        put_u32(&mut cp, 128, 1);
        let ch = self.obj(tsg, class::HOPPER_CHANNEL_GPFIFO_A, Some(&mut cp));
        self.obj(ch, class::HOPPER_COMPUTE_A, None);
        if self.rng.chance(50) {
            self.obj(ch, class::HOPPER_DMA_COPY_A, None);
        }
        if let Some(u) = self.uvm {
            let mut p = vec![0u8; uvm::REGISTER_GPU_SIZE];
            put_u32(&mut p, 24, self.ctl as u32);
            put_u32(&mut p, 28, self.client);
            expect_ok(
                "UVM_REGISTER_GPU",
                self.env.uvm(
                    u,
                    uvm::REGISTER_GPU,
                    &mut p,
                    Some(uvm::REGISTER_GPU_RM_STATUS),
                ),
            );
            let mut p = vec![0u8; uvm::REGISTER_GPU_VASPACE_SIZE];
            put_u32(&mut p, 16, self.ctl as u32);
            put_u32(&mut p, 20, self.client);
            put_u32(&mut p, 24, vas);
            expect_ok(
                "UVM_REGISTER_GPU_VASPACE",
                self.env.uvm(
                    u,
                    uvm::REGISTER_GPU_VASPACE,
                    &mut p,
                    Some(uvm::REGISTER_GPU_VASPACE_RM_STATUS),
                ),
            );
            let mut p = vec![0u8; uvm::REGISTER_CHANNEL_SIZE];
            put_u32(&mut p, 16, self.ctl as u32);
            put_u32(&mut p, 20, self.client);
            put_u32(&mut p, 24, ch);
            expect_ok(
                "UVM_REGISTER_CHANNEL",
                self.env.uvm(
                    u,
                    uvm::REGISTER_CHANNEL,
                    &mut p,
                    Some(uvm::REGISTER_CHANNEL_RM_STATUS),
                ),
            );
        }
    }

    /// One video allocation; None on NV_ERR_NO_MEMORY.
    fn alloc_video(&mut self, size: u64, via: Via) -> Option<Alloc> {
        let new = self.handles.pick(&mut self.rng);
        let parent = if self.rng.chance(20) && self.subdevice != 0 {
            self.subdevice
        } else {
            self.device
        };
        let (st, h, real) = match via {
            Via::VidHeap => {
                let mut b = vec![0u8; abi::size::NVOS32];
                put_u32(&mut b, 0, self.client);
                put_u32(&mut b, 4, self.device);
                put_u32(&mut b, 8, abi::nvos32::FUNCTION_ALLOC_SIZE);
                put_u32(&mut b, 44, new);
                put_u64(&mut b, 88, size);
                ok_or_die(
                    "VID_HEAP ALLOC_SIZE",
                    self.env
                        .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
                );
                (u32_at(&b, 20), u32_at(&b, 44), u64_at(&b, 88))
            }
            _ => {
                let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
                put_u64(&mut p, 64, size);
                let nvos64 = matches!(via, Via::Nvos64 | Via::Xfer64);
                let xfer = matches!(via, Via::Xfer21 | Via::Xfer64);
                // The 0-byte classes (0xC2, 0xF8, ...) have their own step
                // (`zero_byte_classes`).
                let cls = class::NV01_MEMORY_LOCAL_USER;
                let (st, h) = ok_or_die(
                    "RM_ALLOC memory",
                    self.env.alloc(
                        self.ctl,
                        nvos64,
                        xfer,
                        self.client,
                        parent,
                        new,
                        cls,
                        Some(&mut p),
                    ),
                );
                (st, h, u64_at(&p, 64))
            }
        };
        if st == status::NV_ERR_NO_MEMORY {
            return None;
        }
        expect_ok(&format!("video alloc {size} via {via:?}"), st);
        if real < size {
            die(&format!("driver wrote back {real} < requested {size}"));
        }
        let mut a = Alloc {
            handle: h,
            video: true,
            gpu: self.gpu,
            uvm_base: None,
        };
        if let Some(u) = self.uvm
            && self.rng.chance(40)
        {
            let base = self.next_va;
            self.next_va += real.next_multiple_of(1 << 30);
            let mut p = vec![0u8; uvm::BASE_LENGTH_STATUS_SIZE];
            put_u64(&mut p, 0, base);
            put_u64(&mut p, 8, real);
            expect_ok(
                "UVM_CREATE_EXTERNAL_RANGE",
                self.env.uvm(
                    u,
                    uvm::CREATE_EXTERNAL_RANGE,
                    &mut p,
                    Some(uvm::BASE_LENGTH_STATUS_RM_STATUS),
                ),
            );
            // UVM_MAP_EXTERNAL_ALLOCATION: base@0, length@8, the rest is
            // version-dependent; a buffer as large as the 256-GPU layout.
            let mut p = vec![0u8; 9264];
            put_u64(&mut p, 0, base);
            put_u64(&mut p, 8, real);
            self.env.uvm(u, uvm::MAP_EXTERNAL_ALLOCATION, &mut p, None);
            a.uvm_base = Some(base);
        }
        self.live.push(a);
        Some(a)
    }

    fn alloc_random_video(&mut self) {
        let size = random_size(&mut self.rng);
        let via = VIAS[self.rng.below(VIAS.len() as u64) as usize];
        self.alloc_video(size, via);
    }

    /// Host memory: RM_ALLOC_MEMORY on nvidiaN, or RM_ALLOC class 0x3E.
    fn alloc_host(&mut self) {
        let size = 4096 + self.rng.below(64 * MIB);
        let new = self.handles.pick(&mut self.rng);
        if self.rng.chance(60) {
            let g = self.rng.below(self.env.gpus as u64) as usize;
            let fd = self.gpu_fd(g);
            let mut b = vec![0u8; abi::size::NVOS02_WITH_FD];
            put_u32(&mut b, 0, self.client);
            put_u32(&mut b, 4, self.device);
            put_u32(&mut b, 8, new);
            let cls = if self.rng.chance(50) {
                class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
            } else {
                class::NV01_MEMORY_SYSTEM
            };
            put_u32(&mut b, 12, cls);
            put_u64(&mut b, 24, 0x7d00_0000_0000);
            put_u64(&mut b, 32, size - 1);
            put_u32(&mut b, 48, u32::MAX);
            ok_or_die(
                "RM_ALLOC_MEMORY",
                self.env.rm(fd, esc::RM_ALLOC_MEMORY, &mut b, false),
            );
            expect_ok("RM_ALLOC_MEMORY", u32_at(&b, 40));
            self.live.push(Alloc {
                handle: u32_at(&b, 8),
                video: false,
                gpu: g as u32,
                uvm_base: None,
            });
        } else {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, size);
            let xfer = self.rng.chance(30);
            let (st, h) = ok_or_die(
                "RM_ALLOC 0x3E",
                self.env.alloc(
                    self.ctl,
                    false,
                    xfer,
                    self.client,
                    self.device,
                    new,
                    class::NV01_MEMORY_SYSTEM,
                    Some(&mut p),
                ),
            );
            expect_ok("host alloc", st);
            self.live.push(Alloc {
                handle: h,
                video: false,
                gpu: self.gpu,
                uvm_base: None,
            });
        }
    }

    /// The nvidiaN fd of this actor (opened and registered on first use).
    fn gpu_fd(&mut self, g: usize) -> RawFd {
        if let Some(fd) = self.gpu_fds[g] {
            return fd;
        }
        let fd = self.env.open(&format!("nvidia{g}"), false);
        let mut r = [0u8; 4];
        put_u32(&mut r, 0, self.ctl as u32);
        ok_or_die(
            "REGISTER_FD",
            self.env.rm(fd, esc::REGISTER_FD, &mut r, false),
        );
        self.gpu_fds[g] = Some(fd);
        fd
    }

    fn free_alloc(&mut self, a: Alloc) {
        if let (Some(u), Some(base)) = (self.uvm, a.uvm_base) {
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
        let st = if a.video && self.rng.chance(30) {
            let mut b = vec![0u8; abi::size::NVOS32];
            put_u32(&mut b, 0, self.client);
            put_u32(&mut b, 4, self.device);
            put_u32(&mut b, 8, abi::nvos32::FUNCTION_FREE);
            put_u32(&mut b, 44, a.handle);
            ok_or_die(
                "VID_HEAP FREE",
                self.env
                    .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
            );
            u32_at(&b, 20)
        } else {
            self.env.free(self.ctl, self.client, self.device, a.handle)
        };
        expect_ok("free", st);
    }

    fn free_random(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let i = self.rng.below(self.live.len() as u64) as usize;
        let a = self.live.swap_remove(i);
        self.free_alloc(a);
    }

    fn map_unmap(&mut self) {
        let Some(&a) = self
            .live
            .get(self.rng.below(self.live.len().max(1) as u64) as usize)
        else {
            return;
        };
        let mut m = vec![0u8; abi::size::NVOS33_WITH_FD];
        put_u32(&mut m, 0, self.client);
        put_u32(&mut m, 4, self.device);
        put_u32(&mut m, 8, a.handle);
        put_u64(&mut m, 24, 4096);
        put_u32(&mut m, 48, self.ctl as u32);
        ok_or_die(
            "RM_MAP_MEMORY",
            self.env.rm(self.ctl, esc::RM_MAP_MEMORY, &mut m, false),
        );
        expect_ok("RM_MAP_MEMORY", u32_at(&m, 40));
        let mut u = vec![0u8; abi::size::NVOS34];
        put_u32(&mut u, 0, self.client);
        put_u32(&mut u, 4, self.device);
        put_u32(&mut u, 8, a.handle);
        put_u64(&mut u, 16, u64_at(&m, 32));
        ok_or_die(
            "RM_UNMAP_MEMORY",
            self.env.rm(self.ctl, esc::RM_UNMAP_MEMORY, &mut u, false),
        );
        expect_ok("RM_UNMAP_MEMORY", u32_at(&u, 24));
    }

    fn control(&mut self) {
        let obj = match self.rng.below(3) {
            0 => self.client,
            1 => self.device,
            _ => self.subdevice,
        };
        let cmd = 0x2080_0100 | self.rng.below(0x100) as u32;
        let st = if self.rng.chance(50) {
            self.env.control(self.ctl, self.client, obj, cmd, None)
        } else {
            let mut p = vec![0u8; 8 + self.rng.below(256) as usize];
            self.env
                .control(self.ctl, self.client, obj, cmd, Some(&mut p))
        };
        // Random commands and sizes: the driver answers, refuses the command
        // (NV_ERR_NOT_SUPPORTED), the params' size (INVALID_PARAM_STRUCT) or
        // their contents; none of it changes what anyone holds, which is what
        // the tracer is checked on. The status is not the point.
        let _ = st;
    }

    /// NVOS32 with hRoot, hObjectParent (the device) and the function.
    fn nvos32(&self, function: u32) -> Vec<u8> {
        let mut b = vec![0u8; abi::size::NVOS32];
        put_u32(&mut b, 0, self.client);
        put_u32(&mut b, 4, self.device);
        put_u32(&mut b, 8, function);
        b
    }

    /// Video memory size of GPU `g`, from CARD_INFO (fb_size@48 of each
    /// 72-byte entry).
    fn fb_size(&self, g: u32) -> u64 {
        let mut ci = vec![0u8; abi::size::CARD_INFO_ENTRY * self.env.gpus as usize];
        ok_or_die(
            "CARD_INFO",
            self.env.rm(self.ctl, esc::CARD_INFO, &mut ci, false),
        );
        u64_at(&ci, g as usize * abi::size::CARD_INFO_ENTRY + 48)
    }

    /// The escapes every CUDA process sends at start; none allocates.
    fn startup_escapes(&mut self) {
        use abi::os_event;
        let gfd = self.gpu_fd(self.gpu as usize);
        let mut ev = vec![0u8; abi::size::OS_EVENT];
        put_u32(&mut ev, os_event::H_CLIENT, self.client);
        put_u32(&mut ev, os_event::H_DEVICE, self.device);
        put_u32(&mut ev, os_event::FD, gfd as u32);
        put_u32(&mut ev, os_event::STATUS, u32::MAX);
        ok_or_die(
            "ALLOC_OS_EVENT",
            self.env.rm(self.ctl, esc::ALLOC_OS_EVENT, &mut ev, false),
        );
        expect_ok("ALLOC_OS_EVENT", u32_at(&ev, os_event::STATUS));
        let mut sp = vec![0u8; abi::size::SYS_PARAMS];
        put_u64(&mut sp, 0, 128 * MIB);
        ok_or_die(
            "SYS_PARAMS",
            self.env.rm(self.ctl, esc::SYS_PARAMS, &mut sp, false),
        );
        let mut numa = vec![0xffu8; 536];
        ok_or_die(
            "NUMA_INFO",
            self.env.rm(gfd, esc::NUMA_INFO, &mut numa, false),
        );
        if self.env.major >= abi::wait_open_complete::SINCE {
            let mut w = vec![0xffu8; abi::size::WAIT_OPEN_COMPLETE];
            ok_or_die(
                "WAIT_OPEN_COMPLETE",
                self.env.rm(gfd, esc::WAIT_OPEN_COMPLETE, &mut w, false),
            );
            expect_ok("WAIT_OPEN_COMPLETE rc", u32_at(&w, 0));
        }
        let mut u = vec![0u8; abi::size::NVOS56];
        put_u32(&mut u, abi::nvos56::H_CLIENT, self.client);
        put_u32(&mut u, abi::nvos56::H_DEVICE, self.device);
        put_u32(
            &mut u,
            abi::nvos56::H_MEMORY,
            self.live.first().map(|a| a.handle).unwrap_or(0),
        );
        put_u64(&mut u, abi::nvos56::P_OLD_CPU_ADDRESS, 0x7c00_0000_0000);
        put_u64(&mut u, abi::nvos56::P_NEW_CPU_ADDRESS, 0x7c00_0010_0000);
        ok_or_die(
            "UPDATE_DEVICE_MAPPING_INFO",
            self.env
                .rm(self.ctl, esc::RM_UPDATE_DEVICE_MAPPING_INFO, &mut u, false),
        );
        expect_ok(
            "UPDATE_DEVICE_MAPPING_INFO",
            u32_at(&u, abi::nvos56::STATUS),
        );
        put_u32(&mut ev, os_event::STATUS, u32::MAX);
        ok_or_die(
            "FREE_OS_EVENT",
            self.env.rm(self.ctl, esc::FREE_OS_EVENT, &mut ev, false),
        );
        expect_ok("FREE_OS_EVENT", u32_at(&ev, os_event::STATUS));
    }

    /// RM_ALLOC_MEMORY of class 0x40 (limit = the whole heap - 1 written
    /// back) or 0x3F (limit 0xFFFFFFFF) on nvidiaN: 0-byte objects.
    fn alloc_memory_video_class(&mut self) {
        let g = self.rng.below(self.env.gpus as u64) as u32;
        let fd = self.gpu_fd(g as usize);
        let privileged = self.rng.chance(30);
        let cls = if privileged {
            class::NV01_MEMORY_LOCAL_PRIVILEGED
        } else {
            class::NV01_MEMORY_LOCAL_USER
        };
        let mut b = vec![0u8; abi::size::NVOS02_WITH_FD];
        put_u32(&mut b, 0, self.client);
        put_u32(&mut b, 4, self.device);
        put_u32(&mut b, 8, self.handles.pick(&mut self.rng));
        put_u32(&mut b, 12, cls);
        put_u64(&mut b, 32, random_size(&mut self.rng) - 1);
        put_u32(&mut b, 48, u32::MAX);
        ok_or_die(
            "RM_ALLOC_MEMORY video",
            self.env.rm(fd, esc::RM_ALLOC_MEMORY, &mut b, false),
        );
        expect_ok("RM_ALLOC_MEMORY video", u32_at(&b, 40));
        let want = if privileged {
            0xFFFF_FFFF
        } else {
            self.fb_size(g) - 1
        };
        if u64_at(&b, 32) != want {
            die(&format!(
                "RM_ALLOC_MEMORY {cls:#x}: limit {:#x}, expected {want:#x}",
                u64_at(&b, 32)
            ));
        }
        self.live.push(Alloc {
            handle: u32_at(&b, 8),
            video: false,
            gpu: g,
            uvm_base: None,
        });
    }

    /// VID_HEAP_CONTROL of each class: virtual, EGM, video, host,
    /// ALLOC_SIZE_RANGE, ALLOC_OS_DESCRIPTOR.
    fn vid_heap_class(&mut self) {
        use abi::nvos32 as v;
        let which = self.rng.below(6);
        let size = random_size(&mut self.rng);
        let h = self.handles.pick(&mut self.rng);
        let (mut b, h_off, size_off) = match which {
            0..=3 => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_SIZE);
                match which {
                    0 => put_u32(&mut b, v::ALLOC_FLAGS, v::FLAGS_VIRTUAL),
                    1 => put_u32(&mut b, v::ATTR2, v::ATTR2_USE_EGM),
                    2 => put_u32(&mut b, v::ATTR, 0),
                    _ => {
                        let loc = 1 + self.rng.below(3) as u32;
                        put_u32(&mut b, v::ATTR, loc << v::ATTR_LOCATION_SHIFT);
                    }
                }
                (b, v::H_MEMORY, Some(v::SIZE))
            }
            4 => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_SIZE_RANGE);
                match self.rng.below(3) {
                    0 => put_u32(&mut b, v::ALLOC_FLAGS, v::FLAGS_VIRTUAL),
                    1 => put_u32(&mut b, v::ATTR, 2 << v::ATTR_LOCATION_SHIFT),
                    _ => put_u32(&mut b, v::ATTR2, v::ATTR2_USE_EGM), // ignored: video
                }
                (b, v::H_MEMORY, Some(v::RANGE_SIZE))
            }
            _ => {
                let mut b = self.nvos32(v::FUNCTION_ALLOC_OS_DESCRIPTOR);
                put_u64(&mut b, v::OS_DESC_LIMIT, size.min(64 * MIB) - 1);
                (b, v::OS_DESC_H_MEMORY, None)
            }
        };
        put_u32(&mut b, h_off, h);
        if let Some(o) = size_off {
            put_u64(&mut b, o, size);
        }
        ok_or_die(
            "VID_HEAP",
            self.env
                .rm(self.ctl, esc::RM_VID_HEAP_CONTROL, &mut b, false),
        );
        let st = u32_at(&b, v::STATUS);
        if st == status::NV_ERR_NO_MEMORY {
            return;
        }
        expect_ok(&format!("VID_HEAP class step {which}"), st);
        if let Some(o) = size_off
            && u64_at(&b, o) < size
        {
            die("VID_HEAP wrote back a smaller size");
        }
        self.live.push(Alloc {
            handle: u32_at(&b, h_off),
            video: matches!(which, 2 | 4),
            gpu: self.gpu,
            uvm_base: None,
        });
    }

    /// The classes that never hold bytes, and EGM through RM_ALLOC.
    fn zero_byte_classes(&mut self) {
        let which = self.rng.below(9);
        let new = self.handles.pick(&mut self.rng);
        let mut parent = self.device;
        let (cls, mut params): (u32, Option<Vec<u8>>) = match which {
            0 => {
                let mut p = vec![0u8; abi::size::PHYS_MEM_PARAMS];
                put_u64(&mut p, abi::phys_mem::PAGE_SIZE, 2 * MIB);
                (class::NV01_MEMORY_LOCAL_PHYSICAL, Some(p))
            }
            1 => {
                parent = self.subdevice;
                let mut p = vec![0u8; abi::size::FABRIC_PARAMS];
                put_u64(&mut p, abi::fabric::ALLOC_SIZE, 512 * MIB);
                put_u64(&mut p, abi::fabric::PAGE_SIZE, 512 * MIB);
                let vid = self.live.iter().find(|a| a.video).map(|a| a.handle);
                put_u32(&mut p, abi::fabric::MAP_H_VIDMEM, vid.unwrap_or(0));
                (class::NV_MEMORY_FABRIC, Some(p))
            }
            2 => {
                let (len, off) = if self.env.major >= abi::multicast::SINCE {
                    (abi::size::MULTICAST_PARAMS, abi::multicast::ALLOC_SIZE)
                } else {
                    (
                        abi::size::MULTICAST_PARAMS_LEGACY,
                        abi::multicast::ALLOC_SIZE_LEGACY,
                    )
                };
                let mut p = vec![0u8; len];
                put_u64(&mut p, off, 512 * MIB);
                (class::NV_MEMORY_MULTICAST_FABRIC, Some(p))
            }
            3 => (class::NV_MEMORY_FABRIC_IMPORT_V2, None),
            4 => (class::NV_MEMORY_FABRIC_IMPORTED_REF, None),
            5 => (class::NV_MEMORY_EXPORT, None),
            6 => (class::NV50_MEMORY_VIRTUAL, None),
            7 => (class::NV01_MEMORY_VIRTUAL, None),
            _ => {
                let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
                put_u64(&mut p, 64, random_size(&mut self.rng));
                (class::NV_MEMORY_EXTENDED_USER, Some(p))
            }
        };
        let nvos64 = self.rng.chance(30);
        let (st, h) = ok_or_die(
            "RM_ALLOC 0-byte class",
            self.env.alloc(
                self.ctl,
                nvos64,
                false,
                self.client,
                parent,
                new,
                cls,
                params.as_deref_mut(),
            ),
        );
        expect_ok(&format!("alloc class {cls:#x}"), st);
        if cls == class::NV01_MEMORY_LOCAL_PHYSICAL
            && params.as_ref().map(|p| u64_at(p, 0)) != Some(self.fb_size(self.gpu))
        {
            die("0xC2: memSize is not the whole heap");
        }
        self.live.push(Alloc {
            handle: h,
            video: false,
            gpu: self.gpu,
            uvm_base: None,
        });
    }

    /// A fresh subdevice with memory under it (video, host, a fabric range),
    /// one of them dup'd elsewhere first sometimes; then the subdevice is
    /// freed, which frees what is under it.
    fn subdevice_teardown(&mut self) {
        let mut sp = vec![0u8; abi::size::NV2080_ALLOC];
        let sd = self.obj(self.device, class::NV20_SUBDEVICE_0, Some(&mut sp));
        let mut under = Vec::new();
        for i in 0..1 + self.rng.below(3) {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, (1 + self.rng.below(16)) * MIB);
            let cls = if i == 2 {
                class::NV01_MEMORY_SYSTEM
            } else {
                class::NV01_MEMORY_LOCAL_USER
            };
            let (st, h) = ok_or_die(
                "alloc under subdevice",
                self.env.alloc(
                    self.ctl,
                    false,
                    false,
                    self.client,
                    sd,
                    0,
                    cls,
                    Some(&mut p),
                ),
            );
            if st == status::NV_ERR_NO_MEMORY {
                continue;
            }
            expect_ok("alloc under subdevice", st);
            under.push(h);
        }
        let mut fp = vec![0u8; abi::size::FABRIC_PARAMS];
        put_u64(&mut fp, abi::fabric::ALLOC_SIZE, 64 * MIB);
        let (st, _) = ok_or_die(
            "fabric under subdevice",
            self.env.alloc(
                self.ctl,
                false,
                false,
                self.client,
                sd,
                0,
                class::NV_MEMORY_FABRIC,
                Some(&mut fp),
            ),
        );
        expect_ok("fabric under subdevice", st);
        if let Some(&h) = under.first()
            && self.rng.chance(40)
        {
            // a reference under the device survives the teardown
            let d = self.dup_into(self.client, self.device, self.client, h);
            self.live.push(Alloc {
                handle: d,
                video: false,
                gpu: self.gpu,
                uvm_base: None,
            });
        }
        expect_ok(
            "free subdevice",
            self.env.free(self.ctl, self.client, self.device, sd),
        );
    }

    /// RM_DUP_OBJECT of `src` of `src_client` into `client` under `parent`
    /// through this actor's fd; returns the new handle.
    fn dup_into(&mut self, client: u32, parent: u32, src_client: u32, src: u32) -> u32 {
        use abi::nvos55;
        let new = self.handles.pick(&mut self.rng);
        let mut b = vec![0u8; abi::size::NVOS55];
        put_u32(&mut b, nvos55::H_CLIENT, client);
        put_u32(&mut b, nvos55::H_PARENT, parent);
        put_u32(&mut b, nvos55::H_OBJECT, new);
        put_u32(&mut b, nvos55::H_CLIENT_SRC, src_client);
        put_u32(&mut b, nvos55::H_OBJECT_SRC, src);
        put_u32(&mut b, nvos55::STATUS, u32::MAX);
        ok_or_die(
            "RM_DUP_OBJECT",
            self.env.rm(self.ctl, esc::RM_DUP_OBJECT, &mut b, false),
        );
        expect_ok("RM_DUP_OBJECT", u32_at(&b, nvos55::STATUS));
        let h = u32_at(&b, nvos55::H_OBJECT);
        if new != 0 && h != new {
            die("RM_DUP_OBJECT did not keep the chosen handle");
        }
        h
    }

    /// Exports `handles` (memory of this actor, all on this actor's GPU) to
    /// the nvidiactl file `exp`: one EXPORT_OBJECT_TO_FD, or a batch with an
    /// empty slot sometimes. Returns the batch size (0: single).
    fn export_to(&mut self, exp: RawFd, handles: &[u32]) -> u32 {
        if handles.len() == 1 && self.rng.chance(50) {
            let mut p = vec![0u8; abi::size::EXPORT_OBJECT_TO_FD];
            put_u32(&mut p, ux::EXP1_TYPE, ux::OBJECT_TYPE_RM);
            put_u32(&mut p, ux::EXP1_H_DEVICE, self.device);
            put_u32(&mut p, ux::EXP1_H_PARENT, self.device);
            put_u32(&mut p, ux::EXP1_H_OBJECT, handles[0]);
            put_u32(&mut p, ux::EXP1_FD, exp as u32);
            let st = self.env.control(
                self.ctl,
                self.client,
                self.client,
                ux::EXPORT_OBJECT_TO_FD,
                Some(&mut p),
            );
            expect_ok("EXPORT_OBJECT_TO_FD", st);
            return 0;
        }
        let mut objs: Vec<u32> = handles.to_vec();
        if self.rng.chance(30) {
            let at = self.rng.below(objs.len() as u64 + 1) as usize;
            objs.insert(at, 0);
        }
        let mut p = vec![0u8; abi::size::EXPORT_OBJECTS_TO_FD];
        put_u32(&mut p, ux::EXPN_FD, exp as u32);
        put_u32(&mut p, ux::EXPN_H_DEVICE, self.device);
        put_u16(&mut p, ux::EXPN_MAX_OBJECTS, objs.len() as u16);
        p[ux::EXPN_METADATA..ux::EXPN_METADATA + 8].copy_from_slice(b"keling\0\0");
        for (i, h) in objs.iter().enumerate() {
            put_u32(&mut p, ux::EXPN_OBJECTS + 4 * i, *h);
        }
        put_u16(&mut p, ux::EXPN_NUM_OBJECTS, objs.len() as u16);
        let st = self.env.control(
            self.ctl,
            self.client,
            self.client,
            ux::EXPORT_OBJECTS_TO_FD,
            Some(&mut p),
        );
        expect_ok("EXPORT_OBJECTS_TO_FD", st);
        objs.len() as u32
    }

    /// Removes and returns the live allocations with these handles.
    fn take_live(&mut self, handles: &[u32]) -> Vec<Alloc> {
        let (out, keep): (Vec<Alloc>, Vec<Alloc>) = self
            .live
            .drain(..)
            .partition(|a| handles.contains(&a.handle));
        self.live = keep;
        out
    }

    /// Up to `n` distinct live allocations on this actor's GPU, at random.
    fn pick_live(&mut self, n: usize) -> Vec<u32> {
        let mut c: Vec<u32> = self
            .live
            .iter()
            .filter(|a| a.gpu == self.gpu)
            .map(|a| a.handle)
            .collect();
        let mut out = Vec::new();
        while out.len() < n && !c.is_empty() {
            let i = self.rng.below(c.len() as u64) as usize;
            out.push(c.swap_remove(i));
        }
        out
    }

    /// A small burst of allocs/frees/controls (threads and children).
    fn burst(&mut self, n: u32) {
        for _ in 0..n {
            match self.rng.below(4) {
                0 | 1 => self.alloc_random_video(),
                2 => self.free_random(),
                _ => self.control(),
            }
        }
    }
}

// ----- fork / exec / wait ------------------------------------------------

fn flush_stdout() {
    let _ = std::io::stdout().flush();
}

/// Forks; the child runs `f` and `_exit`s with its result.
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    flush_stdout();
    // SAFETY: no other thread of ours runs at this point (threads are joined
    // before any fork), so the child may run ordinary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die(&format!("fork: errno {}", errno()));
    }
    if pid == 0 {
        FORKED.store(true, Ordering::Relaxed);
        let code = f();
        leave(code);
    }
    pid
}

/// Waits for `pid`; returns the raw wait status.
fn wait(pid: libc::pid_t) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: `st` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return st;
        }
        if r < 0 && errno() != libc::EINTR {
            die(&format!("waitpid {pid}: errno {}", errno()));
        }
    }
}

fn expect_exit0(what: &str, st: i32) {
    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
        die(&format!("{what} child ended with wait status {st:#x}"));
    }
}

// ----- every way a process gets a device fd ----------------------------------

/// How a device file is opened by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenWay {
    /// openat(AT_FDCWD, absolute path): what glibc's open() does.
    Openat,
    /// The raw open(2) system call.
    RawOpen,
    /// openat2(2).
    Openat2,
    /// chdir into the device directory, a relative path, chdir back.
    Relative,
    /// Through a symlink in a fresh temporary directory.
    Symlink,
}

const OPEN_WAYS: [OpenWay; 5] = [
    OpenWay::Openat,
    OpenWay::RawOpen,
    OpenWay::Openat2,
    OpenWay::Relative,
    OpenWay::Symlink,
];

/// How a second descriptor of an open file is made.
#[derive(Clone, Copy, Debug)]
enum DupWay {
    Dup,
    Dup2,
    Dup3Cloexec,
    FcntlDupfd,
    FcntlDupfdCloexec,
}

const DUP_WAYS: [DupWay; 5] = [
    DupWay::Dup,
    DupWay::Dup2,
    DupWay::Dup3Cloexec,
    DupWay::FcntlDupfd,
    DupWay::FcntlDupfdCloexec,
];

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

impl Env {
    /// Opens `name` of the device directory `way`.
    fn open_way(&self, name: &str, way: OpenWay, cloexec: bool) -> RawFd {
        static LINKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let path = self.dir.join(name);
        let flags = libc::O_RDWR | if cloexec { libc::O_CLOEXEC } else { 0 };
        let fd = match way {
            OpenWay::Openat => openat(&path, flags),
            OpenWay::RawOpen => {
                let c = cpath(&path);
                // SAFETY: a valid NUL-terminated path; the descriptor is ours.
                unsafe { libc::syscall(libc::SYS_open, c.as_ptr(), flags, 0) as RawFd }
            }
            OpenWay::Openat2 => {
                let c = cpath(&path);
                let how = OpenHow {
                    flags: flags as u64,
                    mode: 0,
                    resolve: 0,
                };
                // SAFETY: a valid path and open_how of the size passed.
                unsafe {
                    libc::syscall(
                        libc::SYS_openat2,
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        &how as *const OpenHow,
                        std::mem::size_of::<OpenHow>(),
                    ) as RawFd
                }
            }
            OpenWay::Relative => {
                // No other thread of ours runs here (threads are joined), so
                // changing the working directory for a moment is safe.
                let here = openat(
                    Path::new("."),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                let dir = cpath(&self.dir);
                // SAFETY: a valid NUL-terminated path.
                if here < 0 || unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                    die(&format!("chdir {}: errno {}", self.dir.display(), errno()));
                }
                let fd = openat(Path::new(name), flags);
                let e = std::io::Error::last_os_error();
                // SAFETY: returning to the directory we came from, by fd.
                unsafe { libc::fchdir(here) };
                close(here);
                if fd < 0 {
                    die(&format!(
                        "open {name} relative to {}: {e}",
                        self.dir.display()
                    ));
                }
                fd
            }
            OpenWay::Symlink => {
                let n = LINKS.fetch_add(1, Ordering::Relaxed);
                let tmp =
                    std::env::temp_dir().join(format!("keling-wl-{}-{n}", std::process::id()));
                let link = tmp.join(name);
                let made = std::fs::create_dir_all(&tmp)
                    .and_then(|_| std::os::unix::fs::symlink(&path, &link));
                if let Err(e) = made {
                    die(&format!("symlink {}: {e}", link.display()));
                }
                let fd = openat(&link, flags);
                let e = std::io::Error::last_os_error();
                let _ = std::fs::remove_file(&link);
                let _ = std::fs::remove_dir(&tmp);
                if fd < 0 {
                    die(&format!("open {}: {e}", link.display()));
                }
                fd
            }
        };
        if fd < 0 {
            die(&format!(
                "open {} ({way:?}): errno {}",
                path.display(),
                errno()
            ));
        }
        fd
    }
}

/// openat(AT_FDCWD, path, flags).
fn openat(path: &Path, flags: i32) -> RawFd {
    let c = cpath(path);
    // SAFETY: a valid NUL-terminated path; the descriptor is ours.
    unsafe { libc::openat(libc::AT_FDCWD, c.as_ptr(), flags) }
}

/// The lowest free descriptor number from `from` on.
fn free_fd_from(from: RawFd) -> RawFd {
    let mut n = from;
    // SAFETY: F_GETFD only inspects our descriptor table.
    while unsafe { libc::fcntl(n, libc::F_GETFD) } >= 0 {
        n += 1;
    }
    n
}

/// A second descriptor of `fd`'s open file, made `way`.
fn dup_way(fd: RawFd, way: DupWay) -> RawFd {
    // SAFETY: descriptor-table operations on our own descriptors.
    let d = unsafe {
        match way {
            DupWay::Dup => libc::dup(fd),
            DupWay::Dup2 => libc::dup2(fd, free_fd_from(200)),
            DupWay::Dup3Cloexec => libc::dup3(fd, free_fd_from(300), libc::O_CLOEXEC),
            DupWay::FcntlDupfd => libc::fcntl(fd, libc::F_DUPFD, 100),
            DupWay::FcntlDupfdCloexec => libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100),
        }
    };
    if d < 0 {
        die(&format!("{way:?} of {fd}: errno {}", errno()));
    }
    d
}

/// Sends `data` with descriptors `fds` (SCM_RIGHTS) on a unix socket.
fn send_msg(sock: RawFd, data: &[u8], fds: &[RawFd]) {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_* only compute sizes and offsets inside `cbuf`, which is
    // large enough and 8-aligned; `msg` points at live buffers for sendmsg.
    let r = unsafe {
        let space = libc::CMSG_SPACE(payload as u32) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
        libc::sendmsg(sock, &msg, 0)
    };
    if r != data.len() as isize {
        die(&format!("sendmsg: errno {}", errno()));
    }
}

/// Receives one message into `data` and the descriptors it carries; None
/// at end of file.
fn recv_msg(sock: RawFd, data: &mut [u8]) -> Option<Vec<RawFd>> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: as in send_msg; the kernel fills `cbuf` with at most `space`
    // bytes and the CMSG_* walk stays inside it.
    let r = unsafe {
        let space = libc::CMSG_SPACE(8 * 4) as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let r = loop {
            let r = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r >= 0 || errno() != libc::EINTR {
                break r;
            }
        };
        if r > 0 {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                    let p: *const RawFd = libc::CMSG_DATA(c).cast();
                    for i in 0..n {
                        fds.push(std::ptr::read_unaligned(p.add(i)));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        r
    };
    match r {
        0 => None,
        r if r < 0 => die(&format!("recvmsg: errno {}", errno())),
        _ => Some(fds),
    }
}

// ----- the peer: a second process with its own client --------------------------

/// Peer requests: op@0 a@4 b@8 c@12 seed@16 (24 bytes); replies: status@0
/// n@4 handle@8 (12 bytes), with descriptors where said.
const P_IMPORT: u32 = 1;
const P_ALLOC: u32 = 2;
const P_FREE: u32 = 3;
const P_CLOSE_KEPT: u32 = 4;
const P_CLOSE_FILE: u32 = 5;
const P_SEND_FD: u32 = 6;
const P_EXIT: u32 = 7;

/// A forked process, driven over a socketpair, that holds its own client on
/// its own nvidiactl file. It only acts on a request and answers when done,
/// so it is quiescent whenever the main process reaches a checkpoint.
struct Peer {
    pid: libc::pid_t,
    sock: RawFd,
}

impl Peer {
    fn start(env: &Env, rng: Rng, way: OpenWay) -> Peer {
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
    fn call(
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
    fn stop(self) {
        let mut m = [0u8; 24];
        put_u32(&mut m, 0, P_EXIT);
        send_msg(self.sock, &m, &[]);
        expect_exit0("peer", wait(self.pid));
        close(self.sock);
    }
}

struct PeerState<'e> {
    env: &'e Env,
    rng: Rng,
    way: OpenWay,
    ctl: Option<RawFd>,
    client: u32,
    /// GPU -> device handle.
    devs: std::collections::BTreeMap<u32, u32>,
    /// Handles held (imports and own allocations), in creation order.
    handles: Vec<u32>,
    /// Descriptors kept (export files, files it sent).
    kept: Vec<RawFd>,
}

impl PeerState<'_> {
    /// (ctl, client, device on `gpu`), made on first use.
    fn device(&mut self, gpu: u32) -> (RawFd, u32, u32) {
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
    fn serve(
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
fn peer_main(env: &Env, rng: Rng, sock: RawFd, way: OpenWay) -> i32 {
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

// ----- checkpoints ---------------------------------------------------------

struct Checkpoints {
    on: bool,
    every: u32,
    steps: u32,
    n: u32,
}

impl Checkpoints {
    fn emit(&mut self) {
        if !self.on {
            return;
        }
        self.n += 1;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "checkpoint {}", self.n);
        let _ = out.flush();
        drop(out);
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    }
    fn step(&mut self) {
        self.steps += 1;
        if self.every > 0 && self.steps.is_multiple_of(self.every) {
            self.emit();
        }
    }
}

// ----- scenarios -------------------------------------------------------------

struct Random<'e> {
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

/// The `share` scenario (see the module doc for what it does and holds).
fn share(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open_way("nvidiactl", OpenWay::Openat, false);
    let (c, d) = env.session(ctl, 0);
    env.subdevice(ctl, c, d);
    let alloc = |cls: u32, size: u64| {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, size);
        let (st, h) = ok_or_die(
            "alloc",
            env.alloc(ctl, false, false, c, d, 0, cls, Some(&mut p)),
        );
        expect_ok("alloc", st);
        h
    };
    // 1. mA1 8 MiB, mA2 4 MiB (video), hA 1 MiB (host)
    let ma1 = alloc(class::NV01_MEMORY_LOCAL_USER, 8 * MIB);
    let ma2 = alloc(class::NV01_MEMORY_LOCAL_USER, 4 * MIB);
    let ha = alloc(class::NV01_MEMORY_SYSTEM, MIB);
    cp.step();
    // 2. a second file (raw open(2)) and client; RM_DUP_OBJECT of mA1 into it
    let ctl2 = env.open_way("nvidiactl", OpenWay::RawOpen, false);
    let c2 = env.root_client(ctl2, "client 2");
    let d2 = env.device(ctl2, c2, 0, "device 2");
    let mut b = vec![0u8; abi::size::NVOS55];
    put_u32(&mut b, abi::nvos55::H_CLIENT, c2);
    put_u32(&mut b, abi::nvos55::H_PARENT, d2);
    put_u32(&mut b, abi::nvos55::H_CLIENT_SRC, c);
    put_u32(&mut b, abi::nvos55::H_OBJECT_SRC, ma1);
    ok_or_die(
        "RM_DUP_OBJECT",
        env.rm(ctl2, esc::RM_DUP_OBJECT, &mut b, false),
    );
    expect_ok("RM_DUP_OBJECT", u32_at(&b, abi::nvos55::STATUS));
    cp.step();
    // 3. export mA2 alone to exp1, [mA1, hA] to exp2; both to B; close ours
    let exp1 = env.open_way("nvidiactl", OpenWay::Openat, true);
    let exp2 = env.open_way("nvidiactl", OpenWay::Openat, true);
    let mut p = vec![0u8; abi::size::EXPORT_OBJECT_TO_FD];
    put_u32(&mut p, ux::EXP1_TYPE, ux::OBJECT_TYPE_RM);
    put_u32(&mut p, ux::EXP1_H_DEVICE, d);
    put_u32(&mut p, ux::EXP1_H_PARENT, d);
    put_u32(&mut p, ux::EXP1_H_OBJECT, ma2);
    put_u32(&mut p, ux::EXP1_FD, exp1 as u32);
    expect_ok(
        "EXPORT_OBJECT_TO_FD",
        env.control(ctl, c, c, ux::EXPORT_OBJECT_TO_FD, Some(&mut p)),
    );
    let mut p = vec![0u8; abi::size::EXPORT_OBJECTS_TO_FD];
    put_u32(&mut p, ux::EXPN_FD, exp2 as u32);
    put_u32(&mut p, ux::EXPN_H_DEVICE, d);
    put_u16(&mut p, ux::EXPN_MAX_OBJECTS, 2);
    put_u32(&mut p, ux::EXPN_OBJECTS, ma1);
    put_u32(&mut p, ux::EXPN_OBJECTS + 4, ha);
    put_u16(&mut p, ux::EXPN_NUM_OBJECTS, 2);
    expect_ok(
        "EXPORT_OBJECTS_TO_FD",
        env.control(ctl, c, c, ux::EXPORT_OBJECTS_TO_FD, Some(&mut p)),
    );
    let peer = Peer::start(env, Rng(9), OpenWay::Openat2);
    cp.step();
    // 4. B (openat2) imports exp1 (keeps it) and exp2 (closes it), and
    //    allocates 2 MiB of its own; we close our copies of both
    peer.call(P_IMPORT, 0, 0, 1, 0, &[exp1]);
    peer.call(P_IMPORT, 0, 2, 0, 0, &[exp2]);
    close(exp1);
    close(exp2);
    let (n, _, _) = peer.call(P_ALLOC, 0, 2, 0, 0, &[]);
    if n != 1 {
        die("the peer could not allocate 2 MiB");
    }
    cp.step();
    // 5. we free mA2: B's import takes the charge
    expect_ok("free mA2", env.free(ctl, c, d, ma2));
    cp.step();
    // 6. we free mA1 in our first client: our dup (older than B's) keeps it ours
    expect_ok("free mA1", env.free(ctl, c, d, ma1));
    cp.step();
    // 7. we close the second file: its client (with the dup) goes, B takes mA1
    close(ctl2);
    cp.step();
    // 8. B frees its import of mA2: only exp1 (B's copy) keeps it
    peer.call(P_FREE, 0, 1, 0, 0, &[]);
    cp.step();
    // 9. B closes exp1: mA2 is freed, from B
    peer.call(P_CLOSE_KEPT, 0, 0, 0, 0, &[]);
    cp.step();
    cp.emit();
    peer.stop();
}

/// Continuing after exec as a child of the random scenario.
fn exec_child(cli: &Cli, env: &Env) -> i32 {
    let mut rng = Rng(cli.seed);
    // SAFETY: F_GETFD only inspects our descriptor table.
    let valid = unsafe { libc::fcntl(cli.ctl_fd, libc::F_GETFD) } >= 0;
    let mode = cli.exec_child.as_deref().unwrap_or("");
    let mut a = match mode {
        "inherit" => {
            if !valid {
                die(&format!("fd {} was not kept across exec", cli.ctl_fd));
            }
            Actor::new(env, rng.fork(), cli.ctl_fd, cli.handle_base)
                .join(cli.client, cli.device, cli.gpu)
        }
        "cloexec" => {
            if valid {
                die(&format!("O_CLOEXEC fd {} survived exec", cli.ctl_fd));
            }
            let fd = env.open("nvidiactl", false);
            let mut a = Actor::new(env, rng.fork(), fd, cli.handle_base);
            a.client_and_device(Some(cli.gpu));
            a
        }
        _ => die(&format!("unknown --exec-child {mode}")),
    };
    let n = 1 + a.rng.below(3);
    for _ in 0..n {
        a.alloc_random_video();
    }
    0 // exit without freeing
}

/// Client, device on GPU 0; 3 MiB and 5 MiB; free the first; exit holding
/// the second.
fn basic(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, 0);
    cp.step();
    let mut h = [0u32; 2];
    for (i, size) in [3 * MIB, 5 * MIB].into_iter().enumerate() {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, size);
        let (st, hh) = ok_or_die(
            "alloc",
            env.alloc(
                ctl,
                false,
                false,
                c,
                d,
                0,
                class::NV01_MEMORY_LOCAL_USER,
                Some(&mut p),
            ),
        );
        expect_ok("alloc", st);
        h[i] = hh;
        cp.step();
    }
    expect_ok("free", env.free(ctl, c, d, h[0]));
    cp.step();
    cp.emit();
}

fn expect_errno(what: &str, r: Result<(), Errno>, want: Errno) {
    match r {
        Err(e) if e == want => {}
        other => die(&format!("{what}: expected errno {want}, got {other:?}")),
    }
}

fn expect_status(what: &str, got: u32, want: u32) {
    if got != want {
        die(&format!("{what}: expected status {want:#x}, got {got:#x}"));
    }
}

/// Bad pointers, wrong sizes, unknown escapes, foreign handles, a flood of
/// controls; then one valid 1 MiB allocation.
fn hostile(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let gpu0 = env.open("nvidia0", false);
    let uvm_fd = env.open("nvidia-uvm", false);
    let (c, d) = env.session(ctl, 0);
    // Device params for the refused device allocations further down.
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    cp.step();

    // Bad pAllocParms: EFAULT.
    let bad = [
        0x10u64,
        0xdead_0000_0000,
        u64::MAX - 7,
        0x8000_0000_0000_0000,
    ];
    for (i, &p) in bad.iter().enumerate() {
        let nvos64 = i % 2 == 1;
        let len = match (nvos64, env.legacy) {
            (false, _) => 32,
            (true, false) => 48,
            (true, true) => 40,
        };
        let mut b = vec![0u8; len];
        put_u32(&mut b, 0, c);
        put_u32(&mut b, 4, d);
        put_u32(&mut b, 12, class::NV01_MEMORY_LOCAL_USER);
        put_u64(&mut b, 16, p);
        expect_errno(
            "bad pAllocParms",
            env.rm(ctl, esc::RM_ALLOC, &mut b, false),
            libc::EFAULT,
        );
        let mut b = vec![0u8; 32];
        put_u32(&mut b, 0, c);
        put_u32(&mut b, 4, c);
        put_u32(&mut b, 12, class::NV01_DEVICE_0);
        put_u64(&mut b, 16, p);
        expect_errno(
            "bad device params",
            env.rm(ctl, esc::RM_ALLOC, &mut b, false),
            libc::EFAULT,
        );
    }
    // Bad XFER ptr, oversize, nested, unknown inner escape.
    for (cmd, size, ptr, want) in [
        (esc::RM_ALLOC as u32, 32u32, 0x10u64, libc::EFAULT),
        (esc::RM_ALLOC as u32, 1 << 20, 0x10, libc::EINVAL),
        (esc::IOCTL_XFER_CMD as u32, 16, 0x10, libc::EFAULT),
        (0xC020_462B, 32, 0x10, libc::EFAULT),
    ] {
        let mut x = [0u8; 16];
        put_u32(&mut x, 0, cmd);
        put_u32(&mut x, 4, size);
        put_u64(&mut x, 8, ptr);
        expect_errno(
            "bad XFER",
            sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
            want,
        );
    }
    let mut inner = [0u8; 16];
    let mut x = [0u8; 16];
    put_u32(&mut x, 0, esc::IOCTL_XFER_CMD as u32);
    put_u32(&mut x, 4, 16);
    put_u64(&mut x, 8, inner.as_mut_ptr() as u64);
    expect_errno(
        "nested XFER",
        sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
        libc::EINVAL,
    );
    put_u32(&mut x, 0, 0x99);
    expect_errno(
        "XFER unknown",
        sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
        libc::EINVAL,
    );
    // Bad UVM args and commands.
    for cmd in [
        uvm::INITIALIZE,
        uvm::FREE,
        uvm::CREATE_EXTERNAL_RANGE,
        uvm::REGISTER_GPU,
    ] {
        expect_errno(
            "bad UVM arg",
            sys_ioctl(uvm_fd, cmd, 0x10 as *mut u8),
            libc::EFAULT,
        );
    }
    let mut junk = [0u8; 64];
    expect_errno(
        "unknown UVM cmd",
        sys_ioctl(uvm_fd, 0x3000_0077, junk.as_mut_ptr()),
        libc::EINVAL,
    );
    expect_errno(
        "RM escape on uvm",
        sys_ioctl(uvm_fd, abi::iowr(esc::RM_ALLOC, 32), junk.as_mut_ptr()),
        libc::EINVAL,
    );
    // Wrong sizes in the command encoding, unknown escapes, wrong file.
    let mut big = vec![0u8; 256];
    let wrong_alloc = if env.legacy { 48 } else { 40 };
    for (nr, size) in [
        (esc::RM_ALLOC, wrong_alloc),
        (esc::RM_ALLOC, 8),
        (esc::RM_FREE, 8),
        (esc::RM_CONTROL, 0),
        (esc::RM_VID_HEAP_CONTROL, 180),
        (esc::IOCTL_XFER_CMD, 24),
        (0x99, 32),
        (0x01, 16),
        (0xFF, 8),
        (esc::RM_ALLOC_MEMORY, 56),
    ] {
        expect_errno(
            "malformed escape",
            sys_ioctl(ctl, abi::iowr(nr, size), big.as_mut_ptr()),
            libc::EINVAL,
        );
    }
    expect_errno(
        "RM_ALLOC on nvidia0",
        sys_ioctl(gpu0, abi::iowr(esc::RM_ALLOC, 32), big.as_mut_ptr()),
        libc::EINVAL,
    );
    // _IOC_DIR NONE with a bad arg: the driver reads at arg and faults.
    expect_errno(
        "dir NONE bad arg",
        sys_ioctl(ctl, 0x0020_462B, 0x10 as *mut u8),
        libc::EFAULT,
    );
    // Bad handles: statuses, not errnos.
    expect_status(
        "free unknown",
        env.free(ctl, c, d, 0x0bad_0bad),
        status::NV_ERR_OBJECT_NOT_FOUND,
    );
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            0x0bad_0bad,
            0,
            class::NV20_SUBDEVICE_0,
            None,
        ),
    );
    expect_status("unknown parent", st, status::NV_ERR_INVALID_OBJECT_PARENT);
    let (st, _) = ok_or_die("alloc", env.alloc(ctl, false, false, c, d, 0, 0xBEEF, None));
    expect_status("unknown class", st, status::NV_ERR_INVALID_CLASS);
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            d,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_status("duplicate", st, status::NV_ERR_INSERT_DUPLICATE_NAME);
    let other = env.open("nvidiactl", false);
    let c2 = env.root_client(other, "client2");
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c2,
            c2,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_status("foreign client", st, status::NV_ERR_INVALID_CLIENT);
    close(other);
    let mut gp = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
    put_u64(&mut gp, 64, MIB);
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            d,
            0,
            class::NV01_MEMORY_LOCAL_USER,
            None,
        ),
    );
    expect_status("null params", st, status::NV_ERR_INVALID_ARGUMENT);
    cp.step();
    // A flood of controls.
    for i in 0..10_000u32 {
        let obj = if i % 2 == 0 { c } else { d };
        // NV2080 commands with no params sent to the client and the device:
        // the driver refuses each, for its size (a command it knows) or for
        // not being in those classes' tables.
        let st = env.control(ctl, c, obj, 0x2080_0001 + (i & 0xffff), None);
        if st != status::NV_ERR_NOT_SUPPORTED && st != status::NV_ERR_INVALID_ARGUMENT {
            die(&format!("control flood: status {st:#x}"));
        }
        if i % 1000 == 999 {
            cp.step();
        }
    }
    // Finally a valid 1 MiB allocation (kept until exit).
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            d,
            0,
            class::NV01_MEMORY_LOCAL_USER,
            Some(&mut gp),
        ),
    );
    expect_ok("valid alloc", st);
    if u64_at(&gp, 64) < MIB {
        die("size not written back");
    }
    cp.step();
    cp.emit();
}

/// Allocate 512 MiB chunks until NV_ERR_NO_MEMORY, free one, allocate again.
fn oom(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, 0);
    let chunk = 512 * MIB;
    let alloc = || {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, chunk);
        ok_or_die(
            "alloc",
            env.alloc(
                ctl,
                false,
                false,
                c,
                d,
                0,
                class::NV01_MEMORY_LOCAL_USER,
                Some(&mut p),
            ),
        )
    };
    let mut handles = Vec::new();
    loop {
        let (st, h) = alloc();
        if st == status::NV_ERR_NO_MEMORY {
            break;
        }
        expect_ok("alloc", st);
        handles.push(h);
        cp.step();
        if handles.len() > 1 << 20 {
            die("never ran out of memory");
        }
    }
    cp.step();
    let Some(first) = handles.first().copied() else {
        die("no allocation succeeded at all");
    };
    expect_ok("free", env.free(ctl, c, d, first));
    cp.step();
    let (st, _) = alloc();
    expect_ok("allocation after a free", st);
    cp.step();
    cp.emit();
}

/// A task that keeps a GPU busy: the scheduler tests watch its progress stop
/// while Keling has it frozen.
/// compute: what a CUDA process holds once its context exists, as far as
/// the driver sees it: a client, the device of `--use-gpu` (default 0) with a
/// subdevice, `--alloc-mib` of video memory, a VA space, a channel group with a
/// context share and a Hopper channel carrying a compute object (what
/// GPU_GET_PIDS lists by class). Sends one control no driver defines and
/// prints `unknown_control_status 0x..`, then `ready <pid>`, and holds until
/// stdin closes or sends a line.
fn compute(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or(0);
    let ctl = env.open("nvidiactl", false);
    let obj = |root: u32, parent: u32, cls: u32, params: Option<&mut [u8]>, what: &str| {
        let (st, h) = ok_or_die(
            what,
            env.alloc(ctl, false, false, root, parent, 0, cls, params),
        );
        expect_ok(what, st);
        h
    };
    let (c, d) = env.session(ctl, gpu);
    let sub = env.subdevice(ctl, c, d);
    if cli.alloc_mib > 0 {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, cli.alloc_mib * MIB);
        obj(
            c,
            d,
            class::NV01_MEMORY_LOCAL_USER,
            Some(&mut p),
            "video memory",
        );
    }
    if cli.second_device_mib > 0 {
        let d2 = env.device(ctl, c, gpu, "second device");
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, cli.second_device_mib * MIB);
        obj(
            c,
            d2,
            class::NV01_MEMORY_LOCAL_USER,
            Some(&mut p),
            "video memory under the second device",
        );
    }
    let vas = obj(c, d, class::FERMI_VASPACE_A, None, "VA space");
    let mut tp = vec![0u8; abi::size::TSG_ALLOC];
    put_u32(&mut tp, 8, vas);
    put_u32(&mut tp, 12, 1);
    let tsg = obj(
        c,
        d,
        class::KEPLER_CHANNEL_GROUP_A,
        Some(&mut tp),
        "channel group",
    );
    let ctx = obj(c, tsg, class::FERMI_CONTEXT_SHARE_A, None, "context share");
    let mut chp = vec![0u8; abi::size::CHANNEL_ALLOC];
    put_u64(&mut chp, 16, 1024);
    put_u32(&mut chp, 24, ctx);
    put_u32(&mut chp, 28, vas);
    put_u32(&mut chp, 128, 1);
    let ch = obj(
        c,
        tsg,
        class::HOPPER_CHANNEL_GPFIFO_A,
        Some(&mut chp),
        "channel",
    );
    obj(c, ch, class::HOPPER_COMPUTE_A, None, "compute object");
    let mut junk = [0u8; 16];
    let st = env.control(ctl, c, sub, 0x2080_ff7e, Some(&mut junk));
    println!("unknown_control_status {st:#x}");
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn busy(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or_else(|| {
        std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().and_then(|g| g.trim().parse().ok()))
            .unwrap_or(0)
    });
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, gpu);
    for _ in 0..cli.clients {
        let (c, d) = env.session(ctl, gpu);
        env.alloc_local(ctl, c, d, MIB);
    }
    if cli.alloc_mib > 0 {
        loop {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, cli.alloc_mib * MIB);
            let (st, _) = ok_or_die(
                "alloc",
                env.alloc(
                    ctl,
                    false,
                    false,
                    c,
                    d,
                    0,
                    class::NV01_MEMORY_LOCAL_USER,
                    Some(&mut p),
                ),
            );
            if st == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    for i in 1..=cli.iterations {
        for _ in 0..cli.calls_per_iteration.max(1) {
            // NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES: a control the driver
            // answers (a refused one counts as a failed call, which the agent
            // is sent apart from the activity signals).
            let mut n = [0u8; 4];
            env.control(ctl, c, d, 0x0080_0280, Some(&mut n));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(p) = &cli.progress
            && (i.is_multiple_of(5) || i == cli.iterations)
        {
            let _ = std::fs::write(p, i.to_string());
        }
    }
}

/// `churn`: `busy`'s loop (a control and a 2 ms sleep per iteration) on
/// `--use-gpu`, where each iteration, drawn from `--seed`, allocates (15%) 1 ..=
/// `--alloc-mib` MiB of video memory (a refusal for want of memory is skipped) or
/// frees (10%) one block it holds; nothing while `--pause-file` exists. It exits
/// holding what it holds (the release at exit frees it).
fn churn(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or_else(|| {
        std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().and_then(|g| g.trim().parse().ok()))
            .unwrap_or(0)
    });
    let mut rng = Rng(cli.seed);
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, gpu);
    let mut held: Vec<u32> = Vec::new();
    for i in 1..=cli.iterations {
        let paused = cli.pause_file.as_ref().is_some_and(|f| f.exists());
        let roll = rng.below(100);
        if !paused && roll < 15 {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, (1 + rng.below(cli.alloc_mib.max(1))) * MIB);
            let (st, h) = ok_or_die(
                "alloc",
                env.alloc(
                    ctl,
                    false,
                    false,
                    c,
                    d,
                    0,
                    class::NV01_MEMORY_LOCAL_USER,
                    Some(&mut p),
                ),
            );
            match st {
                status::NV_OK => held.push(h),
                status::NV_ERR_NO_MEMORY => {}
                st => die(&format!("alloc: status {st:#x}")),
            }
        } else if !paused && roll < 25 && !held.is_empty() {
            let h = held.swap_remove(rng.below(held.len() as u64) as usize);
            expect_ok("free", env.free(ctl, c, d, h));
        }
        let mut n = [0u8; 4];
        env.control(ctl, c, d, 0x0080_0280, Some(&mut n));
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(p) = &cli.progress
            && (i.is_multiple_of(5) || i == cli.iterations)
        {
            let _ = std::fs::write(p, i.to_string());
        }
    }
}

/// A client, a device on GPU 0 and 4 + 6 MiB of video memory on an nvidiactl fd,
/// which then goes to whoever connects to `--socket` (SCM_RIGHTS) with the four
/// handles; our own fd is closed at once, so the file lives on only in the other
/// process. Checkpoints: 1 allocated, 2 fd sent and closed, 3 the other side hung up.
fn pass_server(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-server needs --socket"));
    let ctl = env.open("nvidiactl", true);
    let (c, d) = env.session(ctl, 0);
    let mut handles = [c, d, 0, 0];
    for (i, size) in [4 * MIB, 6 * MIB].into_iter().enumerate() {
        handles[2 + i] = env.alloc_local(ctl, c, d, size);
    }
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .unwrap_or_else(|e| die(&format!("bind {}: {e}", path.display())));
    cp.emit();
    let (mut stream, _) = listener
        .accept()
        .unwrap_or_else(|e| die(&format!("accept: {e}")));
    let mut data = [0u8; 16];
    for (i, h) in handles.iter().enumerate() {
        put_u32(&mut data, 4 * i, *h);
    }
    send_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &data, &[ctl]);
    close(ctl);
    cp.emit();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut rest);
    cp.emit();
}

/// The other side of pass-server, in a process of its own: receives the nvidiactl fd
/// and the handles, frees the first 4 MiB allocation, allocates 2 MiB of its own under
/// the received device, moves the file to a dup of the fd and closes both, which
/// releases the file. Checkpoints: 1 received, 2 freed and allocated, 3 closed.
fn pass_client(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-client needs --socket"));
    let stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| die(&format!("connect {}: {e}", path.display())));
    let mut data = [0u8; 16];
    let fds = recv_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &mut data)
        .unwrap_or_else(|| die("no fd from pass-server"));
    let [ctl] = fds[..] else {
        die(&format!("expected one fd, got {fds:?}"))
    };
    let [c, d, h1] = [0, 4, 8].map(|o| u32_at(&data, o));
    cp.emit();
    expect_ok("free", env.free(ctl, c, d, h1));
    env.alloc_local(ctl, c, d, 2 * MIB);
    cp.emit();
    // SAFETY: dup of an fd we own.
    let copy = unsafe { libc::dup(ctl) };
    if copy < 0 {
        die("dup");
    }
    close(ctl);
    close(copy);
    cp.emit();
    drop(stream);
}

/// The other side of pass-server, second kind: receives the fd and holds it without
/// ever using it, then closes it (the last reference: the file is released here).
/// Checkpoints: 1 received, 2 closed.
fn pass_holder(cli: &Cli, cp: &mut Checkpoints) {
    let path = cli
        .socket
        .as_ref()
        .unwrap_or_else(|| die("pass-holder needs --socket"));
    let stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| die(&format!("connect {}: {e}", path.display())));
    let mut data = [0u8; 16];
    let fds = recv_msg(std::os::fd::AsRawFd::as_raw_fd(&stream), &mut data)
        .unwrap_or_else(|| die("no fd from pass-server"));
    cp.emit();
    for fd in fds {
        close(fd);
    }
    cp.emit();
    drop(stream);
}

/// The UVM calls whose layout moved between branches, each with an answer that
/// is not NV_OK where the driver has one: UVM_MAP_EXTERNAL_ALLOCATION into no
/// range (NV_ERR_INVALID_ADDRESS), UVM_ALLOC_SEMAPHORE_POOL (NV_OK) and UVM_FREE
/// of no range (NV_ERR_INVALID_ADDRESS), in buffers of the branch's size with
/// every other byte 0xff (a status read at another branch's offset is then
/// 0xffffffff). Prints `uvm_status NAME 0x..` per call, read where the branch's
/// driver writes it.
fn uvm_status(env: &Env) {
    let u = env.open("nvidia-uvm", false);
    let mut p = vec![0u8; uvm::INITIALIZE_SIZE];
    expect_ok(
        "UVM_INITIALIZE",
        env.uvm(u, uvm::INITIALIZE, &mut p, Some(uvm::INITIALIZE_RM_STATUS)),
    );
    let v = env.version;
    for (name, cmd, (len, status)) in [
        (
            "UVM_MAP_EXTERNAL_ALLOCATION",
            uvm::MAP_EXTERNAL_ALLOCATION,
            abi::branch::uvm_map_external(v),
        ),
        (
            "UVM_ALLOC_SEMAPHORE_POOL",
            uvm::ALLOC_SEMAPHORE_POOL,
            abi::branch::uvm_semaphore_pool(v),
        ),
        ("UVM_FREE", uvm::FREE, abi::branch::uvm_free(v)),
    ] {
        let mut p = vec![0xffu8; len];
        put_u64(&mut p, 0, 7 << 40);
        put_u64(&mut p, 8, 1 << 21);
        let st = env.uvm(u, cmd, &mut p, Some(status));
        println!("uvm_status {name} {st:#x}");
        let want = if cmd == uvm::ALLOC_SEMAPHORE_POOL {
            status::NV_OK
        } else {
            status::NV_ERR_INVALID_ADDRESS
        };
        if st != want {
            die(&format!("{name}: status {st:#x}, expected {want:#x}"));
        }
    }
}

/// More NVIDIA fds than Keling's per-process table holds (40 against 32, opened
/// with openat): on each a client, a device and 1 MiB of video memory.
/// Checkpoints: 1 all allocated; 2 the 29th to 34th fds closed (releasing their
/// files: four held by Keling's table, two beyond it); then it exits holding the
/// rest, six beyond the table among them (their release at exit tears them down).
fn many_fds(env: &Env, cp: &mut Checkpoints) {
    let mut fds = Vec::new();
    for _ in 0..40 {
        let ctl = env.open("nvidiactl", false);
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
        fds.push(ctl);
    }
    cp.emit();
    for fd in fds.drain(28..34) {
        close(fd);
    }
    cp.emit();
}

/// One nvidiactl file that outlives many clients: 20 sessions made and freed on
/// it one after another (more than an open file's table of clients holds at
/// once), then 3 kept, with 1 MiB each (checkpoint 1); then the file is closed,
/// which frees those 3 (checkpoint 2).
fn many_clients(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    for _ in 0..20 {
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
        expect_ok("free client", env.free(ctl, c, 0, c));
    }
    for _ in 0..3 {
        let (c, d) = env.session(ctl, 0);
        env.alloc_local(ctl, c, d, MIB);
    }
    cp.emit();
    close(ctl);
    cp.emit();
}

/// A child opens `--fds` nvidiactl fds (openat), on each a client, a device and
/// 1 MiB of video memory on GPU 0 (checkpoint 1, the child's); then the child
/// exits holding them all, so every file is released by its exit, and the parent,
/// which never had them, waits for it (checkpoint 2) and exits after.
fn fd_flood(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let fds = cli.fds;
    let on = cp.on;
    let child = fork_child(|| {
        for _ in 0..fds {
            let ctl = env.open("nvidiactl", false);
            let (c, d) = env.session(ctl, 0);
            env.alloc_local(ctl, c, d, MIB);
        }
        let mut own = Checkpoints {
            on,
            every: 0,
            steps: 0,
            n: 0,
        };
        own.emit();
        0
    });
    expect_exit0("fd-flood child", wait(child));
    cp.n = 1;
    cp.emit();
}

/// `fd-hoard`: opens `--fds` nvidiactl fds and makes no call on them (what any
/// user of the host may do: the device is mode 0666), then a checkpoint, and
/// exits holding them.
fn fd_hoard(env: &Env, cli: &Cli, cp: &mut Checkpoints) {
    let fds: Vec<RawFd> = (0..cli.fds).map(|_| env.open("nvidiactl", false)).collect();
    cp.emit();
    drop(fds);
}

fn main() {
    let cli = Cli::parse();
    let env = Env::discover(&cli.dev_dir);
    if cli.exec_child.is_some() {
        leave(exec_child(&cli, &env));
    }
    let mut cp = Checkpoints {
        on: cli.checkpoints,
        every: cli.checkpoint_every,
        steps: 0,
        n: 0,
    };
    match cli.scenario.as_str() {
        "random" => {
            let ctl = env.open("nvidiactl", false);
            let mut r = Random {
                env: &env,
                cli: &cli,
                main: Actor::new(&env, Rng(cli.seed), ctl, 0x1000_0000),
                actors: 0,
                peer: None,
                exports: Vec::new(),
            };
            r.run(&mut cp);
        }
        "basic" => basic(&env, &mut cp),
        "hostile" => hostile(&env, &mut cp),
        "oom" => oom(&env, &mut cp),
        "share" => share(&env, &mut cp),
        "busy" => busy(&env, &cli),
        "churn" => churn(&env, &cli),
        "compute" => compute(&env, &cli),
        "pass-server" => pass_server(&env, &cli, &mut cp),
        "pass-client" => pass_client(&env, &cli, &mut cp),
        "pass-holder" => pass_holder(&cli, &mut cp),
        "many-fds" => many_fds(&env, &mut cp),
        "uvm-status" => uvm_status(&env),
        "many-clients" => many_clients(&env, &mut cp),
        "fd-flood" => fd_flood(&env, &cli, &mut cp),
        "fd-hoard" => fd_hoard(&env, &cli, &mut cp),
        other => die(&format!("unknown scenario {other:?}")),
    }
}
