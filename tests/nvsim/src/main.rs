//! # keling-nvsim: a simulated NVIDIA driver over FUSE
//!
//! Keling's tracer decodes the ioctls that processes make on fds opened from
//! `<dir>/nvidiactl`, `<dir>/nvidiaN` and `<dir>/nvidia-uvm`. On machines
//! without a GPU, `keling-nvsim mount DIR` provides those files, answers the
//! ioctls at the ABI level of the real driver (facts in
//! `docs/nvidia-abi.md`), and keeps the ground truth the tracer's
//! numbers are compared with in `DIR/nvsim-state.json`.
//! `keling-gpu-workload` (`src/bin/keling-gpu-workload/`, a module per scenario) is a CUDA-like
//! process that drives it.
//!
//! ```text
//! keling-nvsim mount DIR [--gpus N] [--mem-per-gpu BYTES] [--driver-version V]
//!                        [--foreground] [--force]
//! keling-nvsim umount DIR
//! keling-nvsim sandbox DIR [--nvidia DIR] -- CMD [ARGS]
//! ```
//! `sandbox` runs CMD where NVIDIA's real userspace sees the simulator (see
//! `src/sandbox.rs`).
//! `mount` prints `nvsim: mounted DIR (N GPUs, B bytes each, driver V)` on
//! stderr once the mount is live and serves until SIGTERM/SIGINT/SIGHUP, then
//! unmounts and exits 0. Without `--foreground` it forks: the parent exits 0
//! once the mount is live; stop the server with `keling-nvsim umount DIR`
//! (or SIGTERM to its pid). A mount left by a crashed (SIGKILLed) server is
//! reported, and removed with `--force` or `umount -l DIR`.
//!
//! ## Files
//! `nvidiactl`, `nvidia0`..`nvidia{N-1}`, `nvidia-uvm` (regular files, mode
//! 0666), `version` (`/proc/driver/nvidia/version` format) and
//! `nvsim-state.json` (0444, generated from the current state on every open
//! and on every read at offset 0):
//! ```json
//! {"driver_version":"580.159",
//!  "gpus":[{"index":0,"capacity_bytes":N,"used_bytes":N,"host_bytes":N,
//!           "egm_bytes":N}],
//!  "processes":[{"pid":1234,"gpus":[{"gpu":0,"bytes":N,"peak_bytes":N,
//!                "host_bytes":N,"egm_bytes":N,"driver_video_bytes":N,
//!                "allocs":N,"frees":N}]}],
//!  "clients":[{"handle":N,"fh":N,"creator_pid":N,"objects":N}],
//!  "ioctls":{"total":N,"failed":N},
//!  "uvm_ranges":N,
//!  "memories":[{"id":N,"gpu":N,"class":N,"kind":"video","bytes":N,
//!               "charged_pid":N,"driver_pid":N,"handles":N,"export_refs":N}]}
//! ```
//! The accounting follows `docs/gpu-accounting.md` (memories, handles,
//! references, charges, teardown order); the driver module doc
//! (`src/driver.rs`) restates it. Every memory is counted once however many
//! handles and export references it has.
//! * `gpus[]`: `used_bytes` video bytes of the live memories on that GPU (what
//!   NV_ERR_NO_MEMORY is decided on), `host_bytes` host memory attributed to it
//!   (RM_ALLOC_MEMORY on `nvidiaN`: that GPU; otherwise the GPU of the device
//!   ancestor), `egm_bytes` extended GPU memory (class 0x42).
//! * `processes[].gpus[]`, the per-caller figure: `bytes` / `host_bytes` /
//!   `egm_bytes` are the bytes of the live video / host / EGM memories charged
//!   to that process (tgid). A memory is charged to the process whose ioctl
//!   created it; when the charged handle goes while other handles remain
//!   (RM_DUP_OBJECT dups, imports), the charge moves to the creator of the
//!   oldest surviving handle; while only export files keep it, it stays; an
//!   import made then takes it. When the last reference goes the bytes are
//!   freed from whoever is charged. `peak_bytes`: the maximum `bytes` at the
//!   end of any ioctl or release (a charge moving in can raise it).
//!   `driver_video_bytes`, the driver figure (NVML's `usedGpuMemory`): video
//!   bytes of the live memories whose charged handle lies in a client this
//!   process created (a forked child allocating through its parent's client
//!   counts for the parent here, for the child in `bytes`). `allocs` /
//!   `frees`: memories holding bytes (video, host or EGM, more than 0) created
//!   by / freed while charged to that process; 0-byte memories, dups, imports
//!   and moving charges are not counted; a teardown counts one free per memory
//!   it frees. An entry appears the first time one of its figures becomes
//!   non-zero and stays listed after the process exits. Sorted by pid and GPU.
//! * `clients`: live RM clients; `fh` is the FUSE file handle of the open
//!   file they were created through; `objects` excludes the client itself.
//! * `ioctls.total`: every ioctl on a device file; `failed`: those that
//!   returned an errno or wrote a non-zero RM/UVM status.
//! * `uvm_ranges` (extra): UVM external ranges currently created.
//! * `memories` (extra): every live memory in creation order, 0-byte ones
//!   included: its class (for VID_HEAP the class chosen), `kind` (`video`,
//!   `host`, `egm`, `none`), `bytes`, the process charged, the process whose
//!   driver figure holds it (`null`: nobody), its live handles and the
//!   export-file slots holding it.
//!
//! ## What is simulated
//! * RM escapes with the exact `_IOC_SIZE` checks of `RmValidateIoctl`
//!   (-EINVAL on mismatch or unknown escape), nvidiactl-only vs nvidiaN-only
//!   escapes, `XFER_CMD` indirection, and the direction bits ignored like the
//!   real driver (params the kernel did not copy are read/written at `arg`).
//! * RM_ALLOC (NVOS21 32 B / NVOS64 48 B; before driver 535 NVOS21 has no
//!   paramsSize with status@24 and NVOS64 is 40 B with flags@32, status@36)
//!   of every class of the ABI tables: video 0x40 (size@64 rounded to 2 MiB,
//!   written back), host 0x3E (size@64 rounded to 4 KiB, written back) and
//!   0x71 (limit@24 + 1, as written), EGM 0x42 (size@64 rounded like video; no
//!   capacity limit), 0-byte memories 0xC2 (24-byte params, memSize@0 written
//!   with the whole heap), 0xF8 (48-byte params, only under a subdevice), 0xFD
//!   (40-byte params before 550, 80 from 550 on), 0xF9, 0xFB, 0xE0, 0x50A0,
//!   0x70 (params not read).
//! * RM_ALLOC_MEMORY (NVOS02 on nvidiaN): 0x3E / 0x71 allocate limit + 1 host
//!   bytes (limit not written back); 0x40 makes a 0-byte object and writes
//!   limit = the GPU's whole capacity - 1; 0x3F writes limit 0xFFFFFFFF.
//! * RM_VID_HEAP_CONTROL: ALLOC_SIZE (2) classified as the driver does
//!   (flags@52 & 0x80000: virtual 0x50A0, 0 bytes; else attr2@144 bit 24 on
//!   drivers 550 and later: EGM 0x42; else attr@56 bits 26:25 == 0: video
//!   0x40; else host 0x3E), size@88 rounded and written back, hMemory@44 out;
//!   ALLOC_SIZE_RANGE (14) the same without the EGM bit, size@80;
//!   ALLOC_OS_DESCRIPTOR (27): host, hMemory@40, limit@72 + 1 bytes; FREE (3).
//! * RM_DUP_OBJECT (NVOS55): a new handle in hClient under hParent (hObject 0:
//!   the driver picks and writes it back). The source client must have been
//!   created by the calling process (else NV_ERR_INVALID_CLIENT); it may be on
//!   another open file. A memory dup is a reference (no bytes; its parent
//!   needs a device on the memory's GPU). Devices, subdevices and other
//!   objects are accepted and duplicated as plain objects of the same class
//!   (a device keeps its GPU) with nothing under them.
//! * RM_CONTROL on the client: EXPORT_OBJECT_TO_FD 0x3d05, EXPORT_OBJECTS_TO_FD
//!   0x3d0b, IMPORT_OBJECT_FROM_FD 0x3d06, IMPORT_OBJECTS_FROM_FD 0x3d0c, as
//!   in the driver's `osapi.c`: the `fd` must be an nvidiactl file of the
//!   calling process (NV_ERR_INVALID_PARAMETER otherwise); its object table is
//!   made by the first export (one slot for 0x3d05, maxObjects for 0x3d0b;
//!   NV_ERR_STATE_IN_USE if 0x3d05 finds one), slots index.. are overwritten
//!   (0 empties a slot), index + numObjects past the table is
//!   NV_ERR_OUT_OF_RANGE; a batch's objects must be on the GPU of its hDevice.
//!   Only memory can be exported (NV_ERR_NOT_SUPPORTED for other objects). An
//!   import dups the slot's memory into the caller's client (any process);
//!   a batch import is all or nothing, objectTypes = 1 for 0x40 / 0x3F / 0xC2
//!   / 0x42, 2 for 0x3E / 0x71, 3 for 0xF8, 4 for 0xFD, 0 for other classes
//!   and for empty slots. Export references last until the export file is
//!   released. paramsSize must be exact (NV_ERR_INVALID_ARGUMENT); FINN
//!   params and these commands on another object: NV_ERR_NOT_SUPPORTED. Any
//!   other control: status 0 on a valid client/object, nothing read.
//! * RM_FREE (object subtree, whole client), RM_MAP/UNMAP_MEMORY(_DMA)
//!   (status 0 when the memory handle exists), RM_ALLOC_CONTEXT_DMA2 (status
//!   0, no object), RM_SHARE (NOT_SUPPORTED), CARD_INFO (one valid entry per
//!   GPU), CHECK_VERSION_STR (recognized). The escapes CUDA sends at start
//!   answer success and allocate nothing: ALLOC_OS_EVENT / FREE_OS_EVENT
//!   (16 B, status@12 = 0), SYS_PARAMS (8 B, left as is), NUMA_INFO (any
//!   size, zero-filled), WAIT_OPEN_COMPLETE (8 B, rc and adapterStatus 0;
//!   -EINVAL before 550), RM_UPDATE_DEVICE_MAPPING_INFO (NVOS56, status@32 =
//!   0).
//! * The object tree client -> device -> subdevice / memory / VA space /
//!   TSG -> context share, channel -> compute/copy; driver-picked handles
//!   `0xc1d00000 + counter` written back; duplicate handles; per-GPU capacity
//!   with NV_ERR_NO_MEMORY. Freeing a device or subdevice frees everything
//!   under it, memory included.
//! * Clients belong to the open file (FUSE fh): an ioctl naming a client of
//!   another open file gets NV_ERR_INVALID_CLIENT, and the release of the
//!   open file (its last close) tears down all its clients and drops the
//!   references its export table holds, as one teardown.
//! * nvidia-uvm: INITIALIZE, DEINITIALIZE, range groups, REGISTER_GPU(_VASPACE),
//!   REGISTER_CHANNEL, CREATE_EXTERNAL_RANGE, MAP_EXTERNAL_ALLOCATION, FREE,
//!   PAGEABLE_MEM_ACCESS, MM_INITIALIZE, ... with rmStatus written where the
//!   layout is known; ranges are tracked but do not change byte accounting.
//!
//! ## Status codes (`src/common/sdk/nvidia/inc/nvstatuscodes.h`)
//! NV_OK 0; NV_ERR_INSERT_DUPLICATE_NAME 0x19 (handle in use);
//! NV_ERR_INVALID_ADDRESS 0x1E (UVM FREE of an unknown range);
//! NV_ERR_INVALID_ARGUMENT 0x1F (deviceId out of range, size 0, missing
//! params, a wrong paramsSize for an export/import control);
//! NV_ERR_INVALID_CLASS 0x22; NV_ERR_INVALID_CLIENT 0x23 (unknown client, a
//! client of another open file, a DUP source client of another process);
//! NV_ERR_INVALID_LIMIT 0x2E (limit+1 overflows); NV_ERR_INVALID_OBJECT_HANDLE
//! 0x33 (control/map on an unknown object); NV_ERR_INVALID_OBJECT_PARENT 0x36;
//! NV_ERR_INVALID_PARAMETER 0x3B (export/import: fd not an nvidiactl file of
//! the caller, no or wrong table, bad type/flags);
//! NV_ERR_NO_MEMORY 0x51; NV_ERR_NOT_SUPPORTED 0x56 (RM_SHARE, FINN params,
//! other VID_HEAP functions, exporting a non-memory object, a DUP of a
//! client); NV_ERR_OBJECT_NOT_FOUND 0x57 (free/dup/export of an unknown
//! handle, as resserv's `clientGetResourceRef`); NV_ERR_OUT_OF_RANGE 0x5B and
//! NV_ERR_STATE_IN_USE 0x63 (export tables);
//! NV_ERR_UVM_ADDRESS_IN_USE 0x68 (overlapping UVM external range).
//!
//! ## What is not simulated
//! * mmap of the device files, `cudaMallocManaged` faults, the semantics of
//!   other control commands (their params are never read or written),
//!   FINN-serialized alloc params (NV_ERR_NOT_SUPPORTED for memory classes),
//!   RM_SHARE, events, MPS, privilege checks (0xC2 is privileged in the real
//!   driver), per-class parent rules beyond "has a device ancestor" (device:
//!   parent is the client; subdevice: parent is a device; 0xF8: parent is a
//!   subdevice). Export metadata is not kept; the object table's device is
//!   kept as its GPU only.
//! * paramsSize of NVOS21/NVOS64 is not checked; the class's struct size is
//!   read from pAllocParms.
//! * An unreadable/unwritable pointer inside the params (pAllocParms, control
//!   params, XFER ptr, UVM arg) fails the ioctl with EFAULT and changes
//!   nothing (the real driver returns EFAULT or NV_ERR_INVALID_ADDRESS
//!   depending on the path). For XFER the inner escape is applied before the
//!   copy back to `ptr`, as in the real driver.
//!
//! ## What a FUSE server cannot model (and what it does instead)
//! * A FUSE request carries the fh of the ioctl's own file only, never the
//!   open file behind a descriptor number named inside the params. For the
//!   export/import controls the server resolves the named descriptor itself
//!   (`pidfd_open` + `pidfd_getfd` on the caller, then its own
//!   `_IOW('K', 1, 16)` ioctl on that copy from a helper thread, which the
//!   kernel delivers with the fh of the same open file; see `src/fuse.rs`).
//!   This needs ptrace rights over the caller (root, or same user without a
//!   Yama restriction); without them the descriptor counts as not an
//!   nvidiactl file. The server holds an extra reference to that open file
//!   for the moment it resolves it: a release the caller's racing close
//!   would cause happens when the server drops its copy instead. A tracer
//!   watching every ioctl sees that private ioctl (type 'K', not an RM
//!   escape) made by the simulator on the file.
//! * REGISTER_FD is not followed (it could be, the same way):
//!   RM_ALLOC_MEMORY on nvidiaN accepts any existing client, where the real
//!   driver checks the nvidiactl file registered through REGISTER_FD.
//! * Process identity: FUSE gives the calling thread's id in the server's pid
//!   namespace; the tgid is read from `/proc/<tid>/status`. RM_DUP_OBJECT's
//!   "same process" check and every figure use that tgid.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use keling_nvsim::driver::{Config, Driver};
use keling_nvsim::fuse::{Server, Stop};
use keling_nvsim::mount::{self, MountGuard};

#[derive(Parser)]
#[command(name = "keling-nvsim", about = "A simulated NVIDIA driver over FUSE")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount the simulated device files at DIR and serve until SIGTERM/SIGINT.
    Mount {
        dir: PathBuf,
        /// Number of simulated GPUs.
        #[arg(long, default_value_t = 2)]
        gpus: u32,
        /// Video memory per GPU, in bytes.
        #[arg(long, default_value_t = 80 << 30)]
        mem_per_gpu: u64,
        /// Driver version to report and whose struct layouts to use.
        #[arg(long, default_value = "580.159")]
        driver_version: String,
        /// Stay in the foreground (otherwise fork once the mount is live).
        #[arg(long)]
        foreground: bool,
        /// Lazily unmount a FUSE mount already at DIR (a crashed run) first.
        #[arg(long)]
        force: bool,
    },
    /// Unmount DIR.
    Umount { dir: PathBuf },
    /// Run CMD where NVIDIA's real userspace (libcuda, NVML, nvidia-smi) sees the
    /// simulated driver mounted at DIR: a private mount namespace with DIR's files
    /// as /dev/nvidia*, /sys/module/nvidia and /proc/driver/nvidia as the 535
    /// driver has them, and the unpacked Debian libraries found by their sonames.
    /// The one thing faked outside the ABI: stat(2) of the device files says
    /// "character device 195:N" (a preload shim). Exits with CMD's code; leaves
    /// nothing mounted and no node on the host. Needs root.
    Sandbox {
        /// A live `keling-nvsim mount` directory.
        dir: PathBuf,
        /// The unpacked packages (default: $KELING_NVIDIA_USERSPACE, else
        /// target/nvidia-userspace/535.261.03, which `cargo xtask setup` fills).
        #[arg(long, value_name = "DIR")]
        nvidia: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<std::ffi::OsString>,
    },
}

/// Writes to stderr, ignoring errors (a closed pipe must not kill us).
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Mount {
            dir,
            gpus,
            mem_per_gpu,
            driver_version,
            foreground,
            force,
        } => cmd_mount(&dir, gpus, mem_per_gpu, driver_version, foreground, force),
        Cmd::Umount { dir } => cmd_umount(&dir),
        Cmd::Sandbox { dir, nvidia, cmd } => {
            keling_nvsim::sandbox::run(&dir, nvidia.as_deref(), &cmd).map(|never| match never {})
        }
    };
    if let Err(e) = r {
        say(&format!("nvsim: error: {e:#}"));
        std::process::exit(1);
    }
}

fn cmd_umount(dir: &Path) -> Result<()> {
    let dir = mount::absolute(dir);
    match mount::mounted_fstype(&dir) {
        None => bail!("{} is not a mount point", dir.display()),
        Some(t) if !t.starts_with("fuse") => {
            bail!("{} is a {t} mount, not a FUSE mount", dir.display())
        }
        Some(_) => {}
    }
    if let Err(e) = mount::umount(&dir, 0) {
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e).with_context(|| format!("umount {}", dir.display()));
        }
        mount::umount(&dir, libc::MNT_DETACH)
            .with_context(|| format!("umount -l {}", dir.display()))?;
    }
    say(&format!("nvsim: unmounted {}", dir.display()));
    Ok(())
}

fn cmd_mount(
    dir: &Path,
    gpus: u32,
    mem_per_gpu: u64,
    driver_version: String,
    foreground: bool,
    force: bool,
) -> Result<()> {
    if gpus == 0 || gpus > 248 {
        bail!("--gpus must be 1..=248");
    }
    if keling_nvsim::abi::version_major(&driver_version).is_none() {
        bail!("--driver-version {driver_version:?} does not start with a number");
    }
    let shown = dir.display().to_string();
    let dir = mount::absolute(dir);
    if let Some(fstype) = mount::mounted_fstype(&dir) {
        if !fstype.starts_with("fuse") {
            bail!("{} is already a {fstype} mount point", dir.display());
        }
        if !force {
            // statfs always reaches the server (stat may be answered from
            // the attribute cache); a dead one gives ENOTCONN.
            let stale = mount::server_gone(&dir);
            let what = if stale {
                "a stale FUSE mount left by a crashed server"
            } else {
                "already a live FUSE mount (another keling-nvsim?)"
            };
            bail!(
                "{d} is {what}: unmount it with `umount -l {d}` \
                 (or `keling-nvsim umount {d}`), or pass --force",
                d = dir.display()
            );
        }
        say(&format!(
            "nvsim: --force: lazily unmounting the FUSE mount at {}",
            dir.display()
        ));
        mount::umount(&dir, libc::MNT_DETACH).context("umount -l")?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing (modprobe fuse?)");
    }

    // Without --foreground: fork now (single-threaded), the child serves and
    // tells the parent through a pipe once the mount is live.
    let mut ready_pipe: Option<i32> = None;
    if !foreground {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the process is single-threaded here; the child only
        // continues the normal program.
        match unsafe { libc::fork() } {
            -1 => bail!("fork: {}", std::io::Error::last_os_error()),
            0 => {
                // SAFETY: closing our copy of the read end; setsid detaches
                // from the terminal's process group.
                unsafe {
                    libc::close(fds[0]);
                    libc::setsid();
                }
                ready_pipe = Some(fds[1]);
            }
            _child => {
                // SAFETY: closing our copy of the write end.
                unsafe { libc::close(fds[1]) };
                let mut b = [0u8; 1];
                // SAFETY: reading one byte into `b`.
                let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
                std::process::exit(if n == 1 { 0 } else { 1 });
            }
        }
    }

    let sigfd = mount::signal_fd().context("signalfd")?;
    let dev =
        mount::mount_fuse(&dir).with_context(|| format!("mounting FUSE at {}", dir.display()))?;
    let _guard = MountGuard::new(dir.clone());
    let driver = Driver::new(Config {
        gpus,
        mem_per_gpu,
        driver_version: driver_version.clone(),
    });
    let mut server = Server::new(dev, driver);
    server.set_own_dev(mount::mounted_dev(&dir));
    let line = format!(
        "nvsim: mounted {shown} ({gpus} GPUs, {mem_per_gpu} bytes each, driver {driver_version})"
    );
    use std::os::fd::AsRawFd;
    let stop = server
        .run(sigfd.as_raw_fd(), || {
            say(&line);
            if let Some(w) = ready_pipe.take() {
                // Daemon: let go of the caller's stdio (so a caller waiting
                // for EOF on our stderr does not hang), then tell the parent.
                // SAFETY: plain fd operations on descriptors we own; the
                // buffer is a static byte string.
                unsafe {
                    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                    if null >= 0 {
                        libc::dup2(null, 0);
                        libc::dup2(null, 1);
                        libc::dup2(null, 2);
                        libc::close(null);
                    }
                    libc::write(w, b"1".as_ptr().cast(), 1);
                    libc::close(w);
                }
            }
        })
        .context("serving FUSE requests")?;
    match stop {
        Stop::Signal => log::info!("signal: unmounting {}", dir.display()),
        Stop::Unmounted => log::info!("{} was unmounted", dir.display()),
    }
    Ok(())
}
