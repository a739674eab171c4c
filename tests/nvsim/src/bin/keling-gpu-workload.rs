//! `keling-gpu-workload`: drives the simulated driver like a CUDA process.
//!
//! ```text
//! keling-gpu-workload --dev-dir DIR --seed S [--steps N] [--checkpoints]
//!                     [--checkpoint-every K] [--scenario random|basic|hostile|oom]
//! ```
//! It only makes real syscalls on the device files (open, ioctl, dup, close,
//! fork, exec, exit), which the tracer watches. Everything is decided by the
//! seed; what depends on timing is marked (the progress of the child killed by
//! SIGKILL, the interleaving of the concurrent thread and the values of
//! driver-picked handles). With `--checkpoints` it prints `checkpoint <n>`
//! on stdout after every K steps and at the end (before exiting), and waits for
//! one line on stdin before going on; it prints nothing else on stdout.
//! Unexpected driver answers are reported on stderr with exit code 2.

use std::ffi::CString;
use std::io::{BufRead, Write};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use keling_nvsim::abi::le::{put_u32, put_u64, u32_at, u64_at};
use keling_nvsim::abi::{self, class, esc, status, uvm};

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
    /// random (default), basic, hostile, oom.
    #[arg(long, default_value = "random")]
    scenario: String,
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
    /// busy: video memory to hold while working, in MiB (retried every 20 ms
    /// while the driver says NV_ERR_NO_MEMORY).
    #[arg(long, default_value_t = 0)]
    alloc_mib: u64,
    /// busy: the GPU to use (default: the first of CUDA_VISIBLE_DEVICES, else 0).
    #[arg(long)]
    use_gpu: Option<u32>,
    /// busy: write the iterations done so far to this file as it goes.
    #[arg(long)]
    progress: Option<PathBuf>,
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
    if r < 0 { Err(errno()) } else { Ok(()) }
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
        let legacy = abi::version_major(v).unwrap_or(580) < abi::PARAMS_SIZE_SINCE;
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
            gpus,
            exe,
        }
    }

    fn open(&self, name: &str, cloexec: bool) -> RawFd {
        open_dev(&self.dir.join(name), cloexec)
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
    video: bool,
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

    /// Client, device on a random GPU, subdevice, VA space, TSG, context
    /// share, Hopper channel and compute object.
    fn setup_objects(&mut self) {
        self.client = self.new_client();
        self.gpu = self.rng.below(self.env.gpus as u64) as u32;
        let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
        put_u32(&mut dp, 0, self.gpu);
        self.device = self.obj(self.client, class::NV01_DEVICE_0, Some(&mut dp));
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
                // Only 0x40: the ABI facts give no parameter layout for
                // NV01_MEMORY_LOCAL_PHYSICAL (0xC2), so Keling reports those as
                // undecoded rather than guess, and a random workload must not
                // depend on a guess either.
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
            let fd = match self.gpu_fds[g] {
                Some(fd) => fd,
                None => {
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
            };
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
                uvm_base: None,
            });
        }
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
        expect_ok("RM_CONTROL", st);
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

        // (weight, op)
        const OPS: [(u64, u8); 13] = [
            (30, 0), // video alloc
            (8, 1),  // host alloc
            (20, 2), // free
            (6, 3),  // map/unmap
            (8, 4),  // control
            (5, 5),  // thread
            (5, 6),  // dup
            (4, 7),  // fork, leak through the inherited fd
            (3, 8),  // fork + exec, fd kept
            (3, 9),  // fork + exec, fd O_CLOEXEC
            (3, 10), // child killed by SIGKILL
            (3, 11), // second client, freed whole
            (2, 12), // free the main client and start over
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
                10 => self.kill_child(),
                11 => self.second_client(),
                _ => self.restart_client(),
            }
            cp.step();
        }

        if self.main.rng.chance(30) {
            // exit without freeing anything: the release at exit tears down
            cp.emit();
            return;
        }
        while let Some(a) = self.main.live.pop() {
            self.main.free_alloc(a);
        }
        let (c, ctl) = (self.main.client, self.main.ctl);
        expect_ok("free client", env.free(ctl, c, 0, c));
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
            a.client = a.new_client();
            a.gpu = a.rng.below(env.gpus as u64) as u32;
            let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
            put_u32(&mut dp, 0, a.gpu);
            a.device = a.obj(a.client, class::NV01_DEVICE_0, Some(&mut dp));
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
                a.client = a.new_client();
                a.gpu = g;
                let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
                put_u32(&mut dp, 0, g);
                a.device = a.obj(a.client, class::NV01_DEVICE_0, Some(&mut dp));
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
        a.client = a.new_client();
        a.gpu = a.rng.below(self.env.gpus as u64) as u32;
        let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
        put_u32(&mut dp, 0, a.gpu);
        a.device = a.obj(a.client, class::NV01_DEVICE_0, Some(&mut dp));
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
            a.client = a.new_client();
            a.gpu = cli.gpu;
            let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
            put_u32(&mut dp, 0, cli.gpu);
            a.device = a.obj(a.client, class::NV01_DEVICE_0, Some(&mut dp));
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
    let (st, c) = ok_or_die(
        "client",
        env.alloc(ctl, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
    );
    expect_ok("client", st);
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    let (st, d) = ok_or_die(
        "device",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_ok("device", st);
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
    let (st, c) = ok_or_die(
        "client",
        env.alloc(ctl, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
    );
    expect_ok("client", st);
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    let (st, d) = ok_or_die(
        "device",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_ok("device", st);
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
    let (st, c2) = ok_or_die(
        "client2",
        env.alloc(other, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
    );
    expect_ok("client2", st);
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
        expect_ok(
            "control flood",
            env.control(ctl, c, obj, 0x2080_0000 | (i & 0xffff), None),
        );
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
    let (st, c) = ok_or_die(
        "client",
        env.alloc(ctl, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
    );
    expect_ok("client", st);
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    let (st, d) = ok_or_die(
        "device",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_ok("device", st);
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
fn busy(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or_else(|| {
        std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().and_then(|g| g.trim().parse().ok()))
            .unwrap_or(0)
    });
    let ctl = env.open("nvidiactl", false);
    let (st, c) = ok_or_die(
        "client",
        env.alloc(ctl, false, false, 0, 0, 0, class::NV01_ROOT_CLIENT, None),
    );
    expect_ok("client", st);
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    put_u32(&mut dp, 0, gpu);
    let (st, d) = ok_or_die(
        "device",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_ok("device", st);
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
        env.control(ctl, c, d, 0x0080_0101, None);
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(p) = &cli.progress
            && (i.is_multiple_of(5) || i == cli.iterations)
        {
            let _ = std::fs::write(p, i.to_string());
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
        "random" => {
            let ctl = env.open("nvidiactl", false);
            let mut r = Random {
                env: &env,
                cli: &cli,
                main: Actor::new(&env, Rng(cli.seed), ctl, 0x1000_0000),
                actors: 0,
            };
            r.run(&mut cp);
        }
        "basic" => basic(&env, &mut cp),
        "hostile" => hostile(&env, &mut cp),
        "oom" => oom(&env, &mut cp),
        "busy" => busy(&env, &cli),
        other => die(&format!("unknown scenario {other:?}")),
    }
}
