//! `keling-nvsim sandbox DIR -- CMD [ARGS]`: run NVIDIA's real userspace
//! (libcuda, libnvidia-ml, nvidia-smi) against the simulated driver mounted at
//! DIR.
//!
//! CMD runs in a private mount namespace (nothing it mounts or creates there is
//! visible on the host, and everything is gone when its last process exits,
//! however it ends) where what NVIDIA's userspace looks at shows the simulator:
//!
//! | path | inside the sandbox |
//! |---|---|
//! | `/dev` | a tmpfs holding the host's `/dev` entries (bind mounts, so `/dev/null`, `/dev/pts`, `/dev/shm` are the host's) plus `nvidiactl`, `nvidia0..N-1`, `nvidia-uvm` bound from DIR (the FUSE inodes, so every open, ioctl and mmap reaches the simulator through the kernel); a node `mknod` creates lands in the tmpfs |
//! | `/sys/module` | the host's modules plus `nvidia/` (`initstate` = `live`, `version`) |
//! | `/sys/bus/pci/devices` | the host's entries plus one directory per simulated GPU at its bus id (`0000:18:00.0` on): `vendor`, `device`, `class`, `revision`, `subsystem_vendor`, `subsystem_device` and a 256-byte `config` header, what NVML reads there from 550 to find a GPU's PCI bus id (nvidia-smi's `Bus Id`, `gpu_bus_id`); left as the host's, with a warning, where the host has no such directory |
//! | `/proc/driver` | the host's entries plus `nvidia/` (`version` = DIR's, `params` with `ModifyDeviceFiles: 0`, `capabilities/mig/{config,monitor}`, `gpus/<bus>/information`) as the 535 driver writes them |
//! | libraries | `libcuda.so.1` and `libnvidia-ml.so.1` found by their sonames (`LD_LIBRARY_PATH`), `nvidia-smi` first on `PATH`, from the unpacked Debian packages (`cargo xtask setup`) |
//! | everything else | the host's: `/sys/kernel` (tracefs, BTF), cgroups, `/run`, `/tmp`, so `keling trace` and `keling run` work inside |
//!
//! The one thing faked outside the driver's ABI: libcuda and NVML `stat` the
//! device files and insist on character devices 195:N. FUSE serves regular
//! files only and this kernel has no CUSE, so a preload library
//! (`shim/chardev.c`, built by `build.rs`) rewrites the answer of the four
//! legacy stat entry points those libraries import, for exactly the
//! simulator's inodes. open, ioctl, mmap and close are untouched.
//!
//! The exit code is CMD's (the sandbox execs it); a CMD killed by a signal
//! leaves nothing behind on the host: no mount (they are all in the private
//! namespace) and no device node (`/dev` there is a tmpfs).
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::mount;

/// The Debian package version the sandbox expects (`cargo xtask setup` fetches it).
pub const NVIDIA_USERSPACE_VERSION: &str = "535.261.03";
/// Where the packages' libraries are inside the unpacked tree.
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu/nvidia/current";
/// Where `nvidia-smi` is inside the unpacked tree.
const SMI_DIR: &str = "usr/lib/nvidia/current";
/// The character-device major of `nvidiactl` and `nvidiaN`.
const NVIDIA_MAJOR: u32 = 195;
/// Minor of `nvidiactl`.
const CTL_MINOR: u32 = 255;
/// The major the sandbox gives `nvidia-uvm` (dynamic on a real host; this one
/// is listed in the sandbox's `/proc/driver/nvidia` nowhere else, and libcuda
/// reads `/proc/devices` only on failure paths).
const UVM_MAJOR: u32 = 510;
/// Where the shim lives inside the sandbox (in the private `/dev` tmpfs).
const SHIM_DIR: &str = "/dev/.keling-nvsim";

/// The stat shim, built by `build.rs` from `shim/chardev.c`.
static SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libchardev.so"));

/// The simulator's files as the sandbox presents them.
struct DeviceFile {
    name: String,
    dev: u64,
    ino: u64,
    major: u32,
    minor: u32,
}

/// The Debian versions `cargo xtask setup` unpacks (one per branch Debian has).
pub const NVIDIA_USERSPACE_VERSIONS: &[&str] = &["535.261.03", "550.163.01", "555.58.02"];

/// Which unpacked userspace judges a simulated driver of version `driver`
/// (`major.minor[.patch]`): the one of the same branch (major), else 535's.
pub fn userspace_version_for(driver: &str) -> &'static str {
    let major = driver.split('.').next().unwrap_or("");
    NVIDIA_USERSPACE_VERSIONS
        .iter()
        .find(|v| v.split('.').next() == Some(major))
        .copied()
        .unwrap_or(NVIDIA_USERSPACE_VERSION)
}

/// The unpacked NVIDIA userspace: `--nvidia`, `$KELING_NVIDIA_USERSPACE`, or
/// `target/nvidia-userspace/VERSION` next to this binary's `target/<profile>/`,
/// VERSION being the one of the mounted driver's branch ([`userspace_version_for`]).
pub fn find_userspace(given: Option<&Path>) -> Result<PathBuf> {
    find_userspace_of(given, NVIDIA_USERSPACE_VERSION)
}

fn find_userspace_of(given: Option<&Path>, version: &str) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match given {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let mut v = Vec::new();
            if let Some(p) = std::env::var_os("KELING_NVIDIA_USERSPACE") {
                v.push(PathBuf::from(p));
            }
            if let Ok(exe) = std::env::current_exe() {
                // target/<profile>/keling-nvsim -> target/nvidia-userspace/V
                if let Some(target) = exe.parent().and_then(Path::parent) {
                    v.push(target.join("nvidia-userspace").join(version));
                }
            }
            v
        }
    };
    for c in &candidates {
        if c.join(LIB_DIR).join("libcuda.so.1").exists() {
            return Ok(c.clone());
        }
    }
    bail!(
        "NVIDIA's userspace {version} is not unpacked (looked in {}): run \
         `cargo xtask setup`, which fetches Debian's libcuda1, libnvidia-ml1 and nvidia-smi into \
         target/nvidia-userspace/, or pass --nvidia DIR",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn device_files(dir: &Path) -> Result<Vec<DeviceFile>> {
    let mut names = vec![("nvidiactl".to_string(), NVIDIA_MAJOR, CTL_MINOR)];
    for i in 0.. {
        let n = format!("nvidia{i}");
        if !dir.join(&n).exists() {
            break;
        }
        names.push((n, NVIDIA_MAJOR, i));
    }
    names.push(("nvidia-uvm".to_string(), UVM_MAJOR, 0));
    names
        .into_iter()
        .map(|(name, major, minor)| {
            let m = fs::metadata(dir.join(&name))
                .with_context(|| format!("{} is not a keling-nvsim mount", dir.display()))?;
            Ok(DeviceFile {
                name,
                dev: m.dev(),
                ino: m.ino(),
                major,
                minor,
            })
        })
        .collect()
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn sys_mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let dst_c = cstr(dst)?;
    let fstype = fstype.map(|s| CString::new(s).expect("no NUL"));
    let data = data.map(|s| CString::new(s).expect("no NUL"));
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a valid NUL-terminated string that
    // outlives the call.
    let r = unsafe { libc::mount(p(&src), dst_c.as_ptr(), p(&fstype), flags, p(&data).cast()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Covers `target` with a tmpfs that holds bind mounts of everything `target`
/// held (except the names `shadowed`), so `add` can put new entries beside the
/// host's without touching the host's filesystem. Returns how many host entries
/// could not be carried over.
fn overlay_dir(target: &Path, shadowed: &dyn Fn(&OsStr) -> bool) -> Result<usize> {
    let old_c = cstr(target)?;
    // SAFETY: opening a path for reference only; the fd is owned below.
    let old = unsafe {
        libc::open(
            old_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if old < 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("open {}", target.display()));
    }
    // SAFETY: `old` is a descriptor we just opened.
    let old = unsafe { OwnedFd::from_raw_fd(old) };
    let entries: Vec<(OsString, fs::FileType)> = fs::read_dir(target)
        .with_context(|| format!("read {}", target.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name(), e.file_type().ok()?)))
        .collect();
    sys_mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some("mode=0755"),
    )
    .with_context(|| format!("mount a tmpfs over {}", target.display()))?;
    let via = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    let mut lost = 0;
    for (name, ft) in entries {
        if shadowed(&name) {
            continue;
        }
        let src = via.join(&name);
        let dst = target.join(&name);
        let ok = if ft.is_symlink() {
            fs::read_link(&src)
                .and_then(|to| std::os::unix::fs::symlink(to, &dst))
                .is_ok()
        } else {
            let made = if ft.is_dir() {
                fs::create_dir(&dst)
            } else {
                fs::File::create(&dst).map(drop)
            };
            made.is_ok()
                && sys_mount(Some(&src), &dst, None, libc::MS_BIND | libc::MS_REC, None).is_ok()
        };
        if !ok {
            log::debug!("sandbox: could not carry {} over", dst.display());
            lost += 1;
        }
    }
    Ok(lost)
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// PCI location of simulated GPU `i`, as `/proc/driver/nvidia/gpus/` names it.
fn pci_bus(i: u32) -> String {
    format!("0000:{:02x}:00.0", crate::abi::gpu_id::pci_bus(i))
}

/// `/proc/driver/nvidia/params` as the 535 driver prints it (nv-procfs.c), with
/// `ModifyDeviceFiles: 0` so libcuda opens the nodes that are there instead of
/// recreating them.
fn params_text() -> String {
    [
        ("ResmanDebugLevel", "4294967295"),
        ("RmLogonRC", "1"),
        ("ModifyDeviceFiles", "0"),
        ("DeviceFileUID", "0"),
        ("DeviceFileGID", "0"),
        ("DeviceFileMode", "438"),
        ("InitializeSystemMemoryAllocations", "1"),
        ("UsePageAttributeTable", "4294967295"),
        ("EnableMSI", "1"),
        ("EnablePCIeGen3", "0"),
        ("MemoryPoolSize", "0"),
        ("KMallocHeapMaxSize", "0"),
        ("VMallocHeapMaxSize", "0"),
        ("IgnoreMMIOCheck", "0"),
        ("TCEBypassMode", "0"),
        ("EnableStreamMemOPs", "0"),
        ("EnableUserNUMAManagement", "1"),
        ("NvLinkDisable", "0"),
        ("RmProfilingAdminOnly", "1"),
        ("PreserveVideoMemoryAllocations", "0"),
        ("EnableS0ixPowerManagement", "0"),
        ("S0ixPowerManagementVideoMemoryThreshold", "256"),
        ("DynamicPowerManagement", "3"),
        ("DynamicPowerManagementVideoMemoryThreshold", "200"),
        ("RegisterPCIDriver", "1"),
        ("EnablePCIERelaxedOrderingMode", "0"),
        ("EnableResizableBar", "0"),
        ("EnableGpuFirmware", "18"),
        ("EnableGpuFirmwareLogs", "2"),
        ("EnableDbgBreakpoint", "0"),
        ("OpenRmEnableUnsupportedGpus", "0"),
        ("DmaRemapPeerMmio", "1"),
        ("RegistryDwords", "\"\""),
        ("RegistryDwordsPerDevice", "\"\""),
        ("RmMsg", "\"\""),
        ("GpuBlacklist", "\"\""),
        ("TemporaryFilePath", "\"\""),
        ("ExcludedGpus", "\"\""),
    ]
    .iter()
    .map(|(k, v)| format!("{k}: {v}\n"))
    .collect()
}

/// The mounted driver's version (`major.minor[.patch]`, from DIR/version), or
/// an empty string.
fn mounted_version(dir: &Path) -> String {
    fs::read_to_string(dir.join("version"))
        .unwrap_or_default()
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .unwrap_or("")
        .to_string()
}

/// Fills the sandbox's `/proc/driver/nvidia` and `/sys/module/nvidia`.
fn driver_files(dir: &Path, gpus: u32) -> Result<()> {
    let version = fs::read_to_string(dir.join("version")).unwrap_or_default();
    let short = version
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .unwrap_or(NVIDIA_USERSPACE_VERSION)
        .to_string();
    let proc = Path::new("/proc/driver/nvidia");
    write(&proc.join("version"), &version)?;
    write(&proc.join("params"), &params_text())?;
    write(&proc.join("registry"), "Binary: \"\"\n")?;
    // nv-procfs.c: capability files say which minor of /dev/nvidia-caps they are.
    write(
        &proc.join("capabilities/mig/config"),
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
    )?;
    write(
        &proc.join("capabilities/mig/monitor"),
        "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
    )?;
    for i in 0..gpus {
        let bus = pci_bus(i);
        write(
            &proc.join("gpus").join(&bus).join("information"),
            &format!(
                "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{}\n\
                 Video BIOS: \t 96.00.00.00.00\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n\
                 DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {i}\n\
                 GPU Excluded:\t No\n",
                crate::abi::gpu_id::NAME,
                crate::abi::gpu_id::uuid_text(i)
            ),
        )?;
    }
    let module = Path::new("/sys/module/nvidia");
    write(&module.join("initstate"), "live\n")?;
    write(&module.join("version"), &format!("{short}\n"))?;
    write(&module.join("refcnt"), "1\n")?;
    Ok(())
}

/// Where the kernel lists PCI functions (sysfs).
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// The standard PCI configuration header (type 0, the first 64 bytes; the rest
/// of the 256 zero, no capabilities) of the simulated GPU, as sysfs' `config`
/// gives it to a reader: vendor@0, device@2, command@4 (memory space and bus
/// master), revision@8, class code@9 (prog-if, subclass, class: 3D
/// controller 0x030200), subsystem vendor@0x2c, subsystem@0x2e.
fn pci_config() -> Vec<u8> {
    use crate::abi::gpu_id;
    let mut c = vec![0u8; 256];
    c[0..2].copy_from_slice(&gpu_id::PCI_VENDOR.to_le_bytes());
    c[2..4].copy_from_slice(&gpu_id::PCI_DEVICE.to_le_bytes());
    c[4..6].copy_from_slice(&0x0006u16.to_le_bytes());
    c[8] = crate::controls::PCI_REVISION as u8;
    c[9..12].copy_from_slice(&[0x00, 0x02, 0x03]);
    c[0x2c..0x2e].copy_from_slice(&gpu_id::PCI_VENDOR.to_le_bytes());
    c[0x2e..0x30].copy_from_slice(&crate::controls::PCI_SUBSYSTEM.to_le_bytes());
    c
}

/// One directory per simulated GPU in the sandbox's `/sys/bus/pci/devices`
/// (a tmpfs there), holding the files NVML reads, in sysfs' format.
fn pci_files(pci: &Path, gpus: u32) -> Result<()> {
    use crate::abi::gpu_id;
    for i in 0..gpus {
        let d = pci.join(pci_bus(i));
        for (name, text) in [
            ("vendor", format!("{:#06x}\n", gpu_id::PCI_VENDOR)),
            ("device", format!("{:#06x}\n", gpu_id::PCI_DEVICE)),
            ("class", "0x030200\n".to_string()),
            (
                "revision",
                format!("{:#04x}\n", crate::controls::PCI_REVISION),
            ),
            ("subsystem_vendor", format!("{:#06x}\n", gpu_id::PCI_VENDOR)),
            (
                "subsystem_device",
                format!("{:#06x}\n", crate::controls::PCI_SUBSYSTEM),
            ),
            ("numa_node", "-1\n".to_string()),
        ] {
            write(&d.join(name), &text)?;
        }
        fs::write(d.join("config"), pci_config())
            .with_context(|| format!("write {}", d.join("config").display()))?;
    }
    Ok(())
}

/// `$name` with `first` put in front (colon-separated).
fn prepend(name: &str, first: &Path) -> OsString {
    let mut v = first.as_os_str().to_owned();
    if let Some(old) = std::env::var_os(name).filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Sets up the sandbox and execs `cmd`: returns only on failure.
pub fn run(
    dir: &Path,
    nvidia: Option<&Path>,
    cmd: &[OsString],
) -> Result<std::convert::Infallible> {
    let dir = mount::absolute(dir);
    match mount::mounted_fstype(&dir) {
        Some(t) if t.starts_with("fuse") && !mount::server_gone(&dir) => {}
        Some(t) if t.starts_with("fuse") => bail!(
            "{d} is a stale FUSE mount (its keling-nvsim died): `keling-nvsim umount {d}` and mount again",
            d = dir.display()
        ),
        _ => bail!(
            "{d} is not a live keling-nvsim mount: start one with `keling-nvsim mount {d}`",
            d = dir.display()
        ),
    }
    let Some((prog, _)) = cmd.split_first() else {
        bail!("no command given: keling-nvsim sandbox DIR -- CMD [ARGS]");
    };
    let files = device_files(&dir)?;
    let gpus = files.len() as u32 - 2;
    let driver = mounted_version(&dir);
    let userspace = find_userspace_of(nvidia, userspace_version_for(&driver))?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the sandbox needs root (a private mount namespace and tmpfs mounts)");
    }

    // SAFETY: unshare affects only this process, which is single-threaded
    // here (clap and the checks above start no thread).
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error()).context("unshare(CLONE_NEWNS)");
    }
    // Nothing mounted from here on may propagate back to the host.
    sys_mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .context("make / private in the new mount namespace")?;

    let ours: Vec<OsString> = files.iter().map(|f| OsString::from(&f.name)).collect();
    let mut lost = overlay_dir(Path::new("/dev"), &|n| {
        // Host nodes of the same names (a stray /dev/nvidiactl) are shadowed.
        ours.iter().any(|o| o == n) || n.as_bytes().starts_with(b"nvidia")
    })?;
    for f in &files {
        let dst = Path::new("/dev").join(&f.name);
        fs::File::create(&dst).with_context(|| format!("create {}", dst.display()))?;
        sys_mount(Some(&dir.join(&f.name)), &dst, None, libc::MS_BIND, None)
            .with_context(|| format!("bind {} to {}", f.name, dst.display()))?;
    }
    lost += overlay_dir(Path::new("/sys/module"), &|n| n == "nvidia")?;
    let pci = Path::new(PCI_DEVICES);
    if pci.is_dir() {
        let buses: Vec<OsString> = (0..gpus).map(|i| OsString::from(pci_bus(i))).collect();
        lost += overlay_dir(pci, &|n| buses.iter().any(|b| b == n))?;
        pci_files(pci, gpus)?;
    } else {
        log::warn!(
            "sandbox: no {PCI_DEVICES} here: NVML 550 and later cannot tell the simulated GPUs' PCI bus ids (nvidia-smi says \"Not Found\")"
        );
    }
    lost += overlay_dir(Path::new("/proc/driver"), &|n| n == "nvidia")?;
    if lost > 0 {
        log::warn!(
            "sandbox: {lost} host entries of /dev, /sys/module, {PCI_DEVICES} or /proc/driver are missing inside"
        );
    }
    driver_files(&dir, gpus)?;

    let shim = Path::new(SHIM_DIR).join("libchardev.so");
    write(&shim, "")?;
    fs::write(&shim, SHIM).context("write the stat shim")?;
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o755))?;
    let fakes: Vec<String> = files
        .iter()
        .map(|f| format!("{}:{}={}:{}", f.dev, f.ino, f.major, f.minor))
        .collect();

    let mut c = std::process::Command::new(prog);
    c.args(&cmd[1..])
        .env("LD_PRELOAD", prepend_list("LD_PRELOAD", &shim))
        .env("KELING_NVSIM_CHARDEVS", fakes.join(","))
        .env(
            "LD_LIBRARY_PATH",
            prepend("LD_LIBRARY_PATH", &userspace.join(LIB_DIR)),
        )
        .env("PATH", prepend("PATH", &userspace.join(SMI_DIR)))
        .env("KELING_NVSIM_DIR", &dir);
    use std::os::unix::process::CommandExt;
    let e = c.exec();
    Err(e).with_context(|| format!("exec {}", prog.to_string_lossy()))
}

/// `LD_PRELOAD` with `first` in front (space-separated, as ld.so reads it).
fn prepend_list(name: &str, first: &Path) -> OsString {
    let mut v = first.as_os_str().to_owned();
    if let Some(old) = std::env::var_os(name).filter(|o| !o.is_empty()) {
        v.push(" ");
        v.push(old);
    }
    v
}
