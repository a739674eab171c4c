//! Where the NVIDIA devices are and which driver serves them.
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

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
}

/// A driver version as `major.minor[.patch]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverVersion {
    pub text: String,
    pub major: u32,
}

impl DriverVersion {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let major = text
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("driver version {text:?} is not like 580.159"))?;
        Ok(Self {
            text: text.to_owned(),
            major,
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
        for path in [
            self.dev_dir.join("version"),
            PathBuf::from("/proc/driver/nvidia/version"),
        ] {
            if let Ok(text) = std::fs::read_to_string(&path) {
                return DriverVersion::from_proc_text(&text)
                    .with_context(|| format!("{}", path.display()))
                    .map(Some);
            }
        }
        Ok(None)
    }

    /// The driver major version for the probes; without any driver the newest
    /// layout is assumed (there is nothing to decode anyway).
    pub fn driver_major(&self) -> anyhow::Result<u32> {
        let v = self.driver_version()?;
        match &v {
            Some(v) => log::info!(
                "NVIDIA driver {} (device files in {})",
                v.text,
                self.dev_dir.display()
            ),
            None => log::info!(
                "no NVIDIA driver found ({} has no nvidiactl and /proc/driver/nvidia/version is absent); \
                 GPU tracing is armed for when one appears",
                self.dev_dir.display()
            ),
        }
        Ok(v.map_or(u32::MAX, |v| v.major))
    }

    pub fn check_dev_dir(&self) -> anyhow::Result<()> {
        if !self.dev_dir.is_dir() {
            bail!("--dev-dir {}: no such directory", self.dev_dir.display());
        }
        if !self.dev_dir.is_absolute() {
            bail!("--dev-dir must be an absolute path (the probes match absolute paths)");
        }
        Ok(())
    }
}

/// Whether `path` is in `dir` as one of the NVIDIA device files.
pub fn is_device_path(dir: &Path, path: &Path) -> bool {
    path.parent() == Some(dir)
        && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n == "nvidiactl"
                || n == "nvidia-uvm"
                || n.strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
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
        assert!(DriverVersion::parse("abc").is_err());
        assert!(DriverVersion::from_proc_text("nothing here").is_err());
    }

    #[test]
    fn recognises_device_paths() {
        let dir = Path::new("/dev");
        assert!(is_device_path(dir, Path::new("/dev/nvidiactl")));
        assert!(is_device_path(dir, Path::new("/dev/nvidia0")));
        assert!(is_device_path(dir, Path::new("/dev/nvidia17")));
        assert!(is_device_path(dir, Path::new("/dev/nvidia-uvm")));
        assert!(!is_device_path(dir, Path::new("/dev/nvidia-uvm-tools")));
        assert!(!is_device_path(dir, Path::new("/dev/nvidia")));
        assert!(!is_device_path(dir, Path::new("/tmp/nvidia0")));
    }
}
