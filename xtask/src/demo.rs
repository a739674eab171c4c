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

/// The simulated machine of the demo: GPUs and the memory of each.
pub(crate) const DEMO_GPUS: u32 = 2;
pub(crate) const DEMO_MEM_PER_GPU: u64 = 16 << 30;

/// A mounted simulator, unmounted (SIGTERM by pid, `umount -l` as a fallback) on drop.
pub(crate) struct Simulator {
    child: Child,
    pub(crate) dir: PathBuf,
}

impl Simulator {
    pub(crate) fn mount(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        Self::mount_with(bin, dir, DEMO_GPUS, DEMO_MEM_PER_GPU)
    }

    /// Mounts `gpus` simulated GPUs of `mem_per_gpu` bytes each at `dir`.
    pub(crate) fn mount_with(
        bin: &Path,
        dir: &Path,
        gpus: u32,
        mem_per_gpu: u64,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut child = Command::new(bin)
            .arg("mount")
            .arg(dir)
            .args([
                "--gpus",
                &gpus.to_string(),
                "--mem-per-gpu",
                &mem_per_gpu.to_string(),
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
         keling-nvsim, the simulated driver. Demo: a background task (priority 10) works on GPU 0; \
         every 8 s an interactive task (priority 3) arrives, the background task is frozen until it \
         exits, then resumes. Watch the task lines below. Ctrl-C stops it all."
    );
    // Ctrl-C reaches the whole foreground group; xtask itself must live on to clean
    // up. A handler (not SIG_IGN) is reset by exec, so the children still get it.
    // SAFETY: installing a handler that does nothing.
    unsafe { libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t) };
    let base = crate::root().join("target/nvsim-demo");
    let dev = base.join("dev");
    let socket = base.join("keling.sock");
    let sim = Simulator::mount(&bin_dir.join("keling-nvsim"), &dev)?;
    let stop = Arc::new(AtomicBool::new(false));
    let demo = {
        let (stop, bin_dir, dev, socket) = (
            stop.clone(),
            bin_dir.to_path_buf(),
            dev.clone(),
            socket.clone(),
        );
        std::thread::spawn(move || demo_tasks(&stop, &bin_dir, &dev, &socket))
    };
    let mut keling_args = args.to_vec();
    keling_args.push("--dev-dir".into());
    keling_args.push(dev.to_string_lossy().into_owned());
    // The simulated GPUs' capacities (NVML would say on a GPU host).
    for gpu in 0..DEMO_GPUS {
        keling_args.push("--gpu-capacity".into());
        keling_args.push(format!("{gpu}={DEMO_MEM_PER_GPU}"));
    }
    keling_args.push("--socket".into());
    keling_args.push(socket.to_string_lossy().into_owned());
    if !args.iter().any(|a| a.starts_with("--status-interval")) {
        keling_args.extend(["--status-interval".to_string(), "5".to_string()]);
    }
    let mut agent = Command::new(bin_dir.join("keling"))
        .args(&keling_args)
        .spawn()
        .context("start keling")?;
    let agent_pid = agent.id();
    let status = agent.wait()?;
    stop.store(true, Ordering::Relaxed);
    let _ = demo.join();
    end_demo_tasks(agent_pid);
    drop(sim);
    std::process::exit(status.code().unwrap_or(1));
}

/// Where the cgroup v2 hierarchy is mounted.
pub(crate) fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mountpoint = left.split(' ').nth(4)?;
        (right.split(' ').next()? == "cgroup2").then(|| PathBuf::from(mountpoint))
    })
}

/// The demo's tasks outlive the agent (launched tasks are not killed when it
/// stops): end them, through the cgroups that agent made (`task-<pid>-<id>`).
pub(crate) fn end_demo_tasks(agent_pid: u32) {
    let Some(cgroup2) = cgroup2_mount() else {
        return;
    };
    let prefix = format!("task-{agent_pid}-");
    for e in std::fs::read_dir(cgroup2.join("keling"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let dir = e.path();
        let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        for _ in 0..100 {
            if std::fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `keling launch` of the demo's GPU workload.
fn launch(
    bin_dir: &Path,
    socket: &Path,
    dev: &Path,
    priority: &str,
    iterations: &str,
) -> std::io::Result<Child> {
    Command::new(bin_dir.join("keling"))
        .arg("launch")
        .arg("--socket")
        .arg(socket)
        .args(["--priority", priority, "--gpu", "0", "--"])
        .arg(bin_dir.join("keling-gpu-workload"))
        .arg("--dev-dir")
        .arg(dev)
        .args([
            "--scenario",
            "busy",
            "--alloc-mib",
            "256",
            "--iterations",
            iterations,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
}

fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The demo: one long background task, and an interactive one every 8 s.
fn demo_tasks(stop: &AtomicBool, bin_dir: &Path, dev: &Path, socket: &Path) {
    while !socket.exists() {
        if !sleep_unless(stop, Duration::from_millis(100)) {
            return;
        }
    }
    let mut children: Vec<Child> = Vec::new();
    match launch(bin_dir, socket, dev, "10", "10000000") {
        Ok(c) => children.push(c),
        Err(e) => eprintln!("xtask: demo: {e}"),
    }
    while sleep_unless(stop, Duration::from_secs(8)) {
        match launch(bin_dir, socket, dev, "3", "600") {
            Ok(c) => children.push(c),
            Err(e) => eprintln!("xtask: demo: {e}"),
        }
        children.retain_mut(|c| c.try_wait().ok().flatten().is_none());
    }
    // The agent is stopping: its tasks end with it; reap the launchers.
    for mut c in children {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
    }
}
