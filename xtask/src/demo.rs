//! `cargo xtask run` on a host without an NVIDIA GPU: the same agent, against
//! keling-nvsim (the simulated driver), with a CUDA-like demo workload started every
//! few seconds so there is something to see.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};

/// A mounted simulator, unmounted (SIGTERM by pid, `umount -l` as a fallback) on drop.
struct Simulator {
    child: Child,
    dir: PathBuf,
}

impl Simulator {
    fn mount(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(bin)
            .arg("mount")
            .arg(dir)
            .args([
                "--gpus",
                "2",
                "--mem-per-gpu",
                "17179869184",
                "--foreground",
                "--force",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .context("start keling-nvsim")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let sim = Simulator {
            child,
            dir: dir.to_path_buf(),
        };
        for line in lines.by_ref() {
            let line = line?;
            eprintln!("{line}");
            if line.starts_with("nvsim: mounted") {
                std::thread::spawn(move || lines.for_each(drop));
                return Ok(sim);
            }
        }
        bail!("keling-nvsim exited before mounting {}", dir.display())
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == self.dir.to_str())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

extern "C" fn ignore(_: libc::c_int) {}

pub fn run_with_simulated_driver(bin_dir: &Path, args: &[String]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!(
            "the demo mounts a FUSE filesystem and loads eBPF: run it as root (sudo -E cargo xtask run)"
        );
    }
    eprintln!(
        "xtask: no NVIDIA GPU on this host (/dev/nvidiactl is absent), so the agent runs against \
         keling-nvsim, the simulated driver, with a demo GPU workload every 3 s. Ctrl-C stops it all."
    );
    // Ctrl-C reaches the whole foreground group; xtask itself must live on to clean
    // up. A handler (not SIG_IGN) is reset by exec, so the children still get it.
    // SAFETY: installing a handler that does nothing.
    unsafe { libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t) };
    let dev = crate::root().join("target/nvsim-demo/dev");
    let sim = Simulator::mount(&bin_dir.join("keling-nvsim"), &dev)?;
    let stop = Arc::new(AtomicBool::new(false));
    let demo = {
        let (stop, workload, dev) = (
            stop.clone(),
            bin_dir.join("keling-gpu-workload"),
            dev.clone(),
        );
        std::thread::spawn(move || {
            let mut seed = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = Command::new(&workload)
                    .arg("--dev-dir")
                    .arg(&dev)
                    .args(["--seed", &seed.to_string(), "--steps", "25"])
                    .stdout(Stdio::null())
                    .status();
                seed += 1;
                for _ in 0..30 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })
    };
    let mut keling_args = args.to_vec();
    keling_args.push("--dev-dir".into());
    keling_args.push(dev.to_string_lossy().into_owned());
    if !args.iter().any(|a| a.starts_with("--status-interval")) {
        keling_args.extend(["--status-interval".to_string(), "3".to_string()]);
    }
    let status = Command::new(bin_dir.join("keling"))
        .args(&keling_args)
        .status()
        .context("start keling")?;
    stop.store(true, Ordering::Relaxed);
    let _ = demo.join();
    drop(sim);
    std::process::exit(status.code().unwrap_or(1));
}
