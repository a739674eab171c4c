//! Where the NVIDIA devices are and which driver serves them.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use keling_common::nvidia::branch::Version;

/// Options shared by every command that traces GPU processes.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuArgs {
    /// Directory holding the NVIDIA device files (`nvidiactl`, `nvidiaN`,
    /// `nvidia-uvm`): `/dev` on a GPU host, the mount point of `keling-nvsim`
    /// in tests and demos.
    #[arg(long, default_value = "/dev", value_name = "DIR")]
    pub dev_dir: PathBuf,
    /// The driver's version (e.g. 580.159), which selects the ioctl layouts.
    /// Default: read from /proc/driver/nvidia/version, or DIR/version for the
    /// simulated driver.
    #[arg(long, value_name = "VERSION")]
    pub driver_version: Option<String>,
    /// Where NVIDIA ioctls are seen. `driver-entry`: at the NVIDIA modules' own
    /// ioctl entry (a kprobe and a kretprobe on nvidia.ko's and nvidia-uvm.ko's
    /// `unlocked_ioctl`), so no other ioctl on the host pays anything for
    /// tracing; needs a kernel with kprobes and both modules loaded when Keling
    /// starts. `tracepoints`: at the ioctl syscall tracepoints, which works on
    /// every kernel and for the simulated driver, but every ioctl of every
    /// process pays the tracepoints' cost (a few hundred ns). `auto` takes
    /// driver-entry when it can attach and says why when it cannot.
    #[arg(long, value_enum, default_value_t = IoctlBackendChoice::Auto, value_name = "BACKEND")]
    pub ioctl_backend: IoctlBackendChoice,
}

/// `--ioctl-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoctlBackendChoice {
    Auto,
    DriverEntry,
    Tracepoints,
}

/// A driver version as `major.minor[.patch]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverVersion {
    pub text: String,
    pub major: u32,
    /// major.minor.patch, which keys the layouts that moved between branches.
    pub version: Version,
}

impl DriverVersion {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let bad = || format!("driver version {text:?} is not like 580.159 or 550.54.14");
        let mut parts = text.split('.');
        let major: u32 = parts
            .next()
            .and_then(|m| m.parse().ok())
            .with_context(bad)?;
        // Minor and patch: digits only ("07" is 7); absent ones are 0.
        let mut next = || -> anyhow::Result<u32> {
            match parts.next() {
                None => Ok(0),
                Some(p)
                    if !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    Ok(p.parse()?)
                }
                Some(_) => bail!(bad()),
            }
        };
        let (minor, patch) = (next()?, next()?);
        if parts.next().is_some() {
            bail!(bad());
        }
        Ok(Self {
            text: text.to_owned(),
            major,
            version: Version::new(major, minor, patch),
        })
    }

    /// Finds the version in the text of /proc/driver/nvidia/version ("NVRM version:
    /// NVIDIA UNIX Open Kernel Module for x86_64  580.159  Release Build ...").
    pub fn from_proc_text(text: &str) -> anyhow::Result<Self> {
        let line = text
            .lines()
            .find(|l| l.starts_with("NVRM version:"))
            .context("no NVRM version line")?;
        let token = line
            .split_whitespace()
            .find(|t| {
                let mut parts = t.split('.');
                parts.clone().count() >= 2
                    && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            })
            .context("no version number in the NVRM version line")?;
        Self::parse(token)
    }
}

impl GpuArgs {
    /// The driver version in force: the flag, else the simulator's `DIR/version`
    /// file, else the kernel module's.
    pub fn driver_version(&self) -> anyhow::Result<Option<DriverVersion>> {
        if let Some(v) = &self.driver_version {
            return DriverVersion::parse(v).map(Some);
        }
        let dir_file = self.dev_dir.join("version");
        let found = std::fs::read_to_string(&dir_file)
            .ok()
            .map(|text| (dir_file, text))
            .or_else(crate::os::proc::nvidia_driver_version_text);
        match found {
            Some((path, text)) => DriverVersion::from_proc_text(&text)
                .with_context(|| format!("{}", path.display()))
                .map(Some),
            None => Ok(None),
        }
    }

    /// The driver version for the probes (which selects the layouts that moved
    /// between branches); without any driver the newest layout is assumed (there
    /// is nothing to decode anyway). Says which driver it found (see [`driver_found`]).
    pub fn driver_layout_version(&self) -> anyhow::Result<Version> {
        let v = self.driver_version()?;
        let dir = self.dev_dir.display();
        let text = v.as_ref().map_or("of unknown version", |v| v.text.as_str());
        match driver_found(&self.dev_dir) {
            DriverFound::Kernel => {
                log::info!("NVIDIA driver {text}: the kernel module (device files in {dir})")
            }
            DriverFound::Simulated => log::info!(
                "NVIDIA driver {text}: simulated (keling-nvsim's files in {dir}, regular files)"
            ),
            DriverFound::DeadNode(why) => log::warn!(
                "{dir}/nvidiactl is a device node with no NVIDIA driver behind it ({why}); it is \
                 likely left by libcuda run as root on a host without the driver: remove it if no \
                 driver is expected. GPU tracing is armed for when one appears"
            ),
            DriverFound::Absent => log::info!(
                "no NVIDIA driver found ({dir} has no nvidiactl and /proc/driver/nvidia/version is \
                 absent); GPU tracing is armed for when one appears"
            ),
        }
        Ok(v.map_or(Version::NEWEST, |v| v.version))
    }

    pub fn check_dev_dir(&self) -> anyhow::Result<()> {
        if !self.dev_dir.is_dir() {
            bail!("--dev-dir {}: no such directory", self.dev_dir.display());
        }
        Ok(())
    }

    /// How NVIDIA files are recognised here: real devices by their device number,
    /// and the regular files of a simulated driver under `--dev-dir` by their
    /// identity now (a file that only has a device's name elsewhere is not one).
    pub fn nvidia_files(&self) -> anyhow::Result<NvidiaFiles> {
        let mut files = NvidiaFiles {
            uvm_major: crate::os::proc::char_major("nvidia-uvm"),
            sim: BTreeMap::new(),
        };
        let entries = std::fs::read_dir(&self.dev_dir)
            .with_context(|| format!("read --dev-dir {}", self.dev_dir.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(device) = device_file_of(&self.dev_dir, &path) else {
                continue;
            };
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.file_type().is_file() {
                files.sim.insert(FileIdentity::of(&meta), device);
            }
        }
        if !files.sim.is_empty() {
            log::info!(
                "{} has {} simulated NVIDIA device files: recognised by their inode",
                self.dev_dir.display(),
                files.sim.len()
            );
        }
        Ok(files)
    }
}

/// What serves `DIR/nvidiactl`.
#[derive(Debug, PartialEq, Eq)]
pub enum DriverFound {
    /// A character device that opens, and the module's
    /// `/proc/driver/nvidia/version` is there.
    Kernel,
    /// A regular file: keling-nvsim's simulated driver.
    Simulated,
    /// A character device with no driver behind it (why, in words). libcuda run
    /// as root on a host without the driver makes one (195:255).
    DeadNode(String),
    /// No `nvidiactl`.
    Absent,
}

/// Tells a driver from a dead node by opening `DIR/nvidiactl` (a node whose
/// driver is not loaded gives ENXIO or ENODEV) and reading the module's
/// version file. Opening the control device has no effect on the driver.
pub fn driver_found(dev_dir: &Path) -> DriverFound {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let ctl = dev_dir.join("nvidiactl");
    let Ok(meta) = std::fs::symlink_metadata(&ctl) else {
        return DriverFound::Absent;
    };
    if meta.file_type().is_file() {
        return DriverFound::Simulated;
    }
    if !meta.file_type().is_char_device() {
        return DriverFound::DeadNode("not a character device".into());
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&ctl);
    match (opened, crate::os::proc::nvidia_driver_version_text()) {
        (Ok(_), Some(_)) => DriverFound::Kernel,
        (Err(e), _) => DriverFound::DeadNode(format!("open: {e}")),
        (Ok(_), None) => DriverFound::DeadNode("/proc/driver/nvidia/version is absent".into()),
    }
}

/// A file's identity as the kernel sees it: its filesystem's device number
/// (kernel encoding, `MAJOR << 20 | MINOR`) and inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileIdentity {
    pub dev: u32,
    pub ino: u64,
}

impl FileIdentity {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: kernel_dev(meta.dev()),
            ino: meta.ino(),
        }
    }
}

/// A `dev_t` from stat(2) in the kernel's internal encoding.
pub fn kernel_dev(dev: u64) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (major << 20) | (minor & 0xf_ffff)
}

/// What makes a file an NVIDIA device (the same rule the probes apply).
#[derive(Clone, Debug, Default)]
pub struct NvidiaFiles {
    /// The `nvidia-uvm` character major, when the module is loaded.
    pub uvm_major: Option<u32>,
    /// Simulated-driver files: identity -> device code.
    pub sim: BTreeMap<FileIdentity, u32>,
}

impl NvidiaFiles {
    /// Which NVIDIA device the file with these metadata is, if any.
    pub fn device_of(&self, meta: &std::fs::Metadata) -> Option<u32> {
        use keling_common::{device_file, nvidia};
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if meta.file_type().is_char_device() {
            let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
            if major == nvidia::NV_MAJOR {
                return match minor {
                    nvidia::NV_CTL_MINOR => Some(device_file::CTL),
                    m if m <= device_file::MAX_GPU => Some(m),
                    _ => None,
                };
            }
            return (Some(major) == self.uvm_major && minor == 0).then_some(device_file::UVM);
        }
        self.sim.get(&FileIdentity::of(meta)).copied()
    }
}

/// Which NVIDIA device file `path` is (a `device_file` code), if it is one in `dir`:
/// the same rule the open probe applies in the kernel.
pub fn device_file_of(dir: &Path, path: &Path) -> Option<u32> {
    use keling_common::device_file;
    if path.parent() != Some(dir) {
        return None;
    }
    match path.file_name()?.to_str()? {
        "nvidiactl" => Some(device_file::CTL),
        "nvidia-uvm" => Some(device_file::UVM),
        n => {
            let digits = n.strip_prefix("nvidia")?;
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            digits.parse().ok().filter(|&v| v <= 247)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_version_text() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159  Release Build  (dvs-builder@U22)  Mon Jan 1\nGCC version:  gcc version 12.2.0\n";
        let v = DriverVersion::from_proc_text(text).unwrap();
        assert_eq!((v.text.as_str(), v.major), ("580.159", 580));
        assert_eq!(DriverVersion::parse("530.30.02").unwrap().major, 530);
        assert_eq!(v.version, Version::new(580, 159, 0));
        // The patch matters: 550.40.07's UVM layout is not 550.40.53's.
        assert_eq!(
            DriverVersion::parse("550.40.07").unwrap().version,
            Version::new(550, 40, 7)
        );
        assert_eq!(
            DriverVersion::parse("555").unwrap().version,
            Version::new(555, 0, 0)
        );
        for bad in ["580.", "580.1x", "580.1.2.3", "580.-1", "580.9999999999"] {
            assert!(DriverVersion::parse(bad).is_err(), "{bad}");
        }
        assert!(DriverVersion::parse("abc").is_err());
        assert!(DriverVersion::from_proc_text("nothing here").is_err());
    }

    #[test]
    fn tells_a_simulated_driver_and_no_driver_apart() {
        let dir = std::env::temp_dir().join(format!("keling-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(driver_found(&dir), DriverFound::Absent);
        std::fs::write(dir.join("nvidiactl"), b"").unwrap();
        assert_eq!(driver_found(&dir), DriverFound::Simulated);
        std::fs::remove_file(dir.join("nvidiactl")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.join("nvidiactl")).unwrap();
        assert!(matches!(driver_found(&dir), DriverFound::DeadNode(_)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn recognises_device_paths() {
        use keling_common::device_file;
        let dir = Path::new("/dev");
        let of = |p: &str| device_file_of(dir, Path::new(p));
        assert_eq!(of("/dev/nvidiactl"), Some(device_file::CTL));
        assert_eq!(of("/dev/nvidia0"), Some(0));
        assert_eq!(of("/dev/nvidia17"), Some(17));
        assert_eq!(of("/dev/nvidia-uvm"), Some(device_file::UVM));
        assert_eq!(of("/dev/nvidia-uvm-tools"), None);
        assert_eq!(of("/dev/nvidia"), None);
        assert_eq!(of("/dev/nvidia248"), None);
        assert_eq!(of("/tmp/nvidia0"), None);
    }
}
