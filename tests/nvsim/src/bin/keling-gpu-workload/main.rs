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
    /// compute: two NV01_MEMORY_HW_RESOURCES (0xB1) objects under the
    /// device, this size each in MiB: one of video location, which the
    /// driver's per-process figure counts up to 545 (and nothing else counts),
    /// one of host (PCI) location, which no figure counts.
    #[arg(long, default_value_t = 0)]
    hw_resources_mib: u64,
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

// One module per scenario (named as its `--scenario`), and the machinery they
// share: an actor on one client (`actor`), the ways to open and pass a device fd
// (`open`), the peer process (`peer`), fork / exec / wait (`process`).
mod actor;
mod basic;
mod busy;
mod churn;
mod compute;
mod fd;
mod hostile;
mod many;
mod oom;
mod open;
mod pass;
mod peer;
mod process;
mod random;
mod share;
mod uvm_status;

use actor::*;
use basic::*;
use busy::*;
use churn::*;
use compute::*;
use fd::*;
use hostile::*;
use many::*;
use oom::*;
use open::*;
use pass::*;
use peer::*;
use process::*;
use random::*;
use share::*;
use uvm_status::*;

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
        "random" => random(&env, &cli, &mut cp),
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
