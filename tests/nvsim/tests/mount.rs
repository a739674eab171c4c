//! Root integration tests: mount the simulator in a temp dir, talk to it with
//! real ioctl(2) calls and the workload generator, and check the ground truth.
//! Skipped (with `skipping: <reason>`) when not root or without /dev/fuse.
//! Every mount is undone by a Drop guard, even when an assertion fails.

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NVSIM: &str = env!("CARGO_BIN_EXE_keling-nvsim");
const WORKLOAD: &str = env!("CARGO_BIN_EXE_keling-gpu-workload");
const MIB: u64 = 1 << 20;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    None
}

macro_rules! require_root {
    () => {
        if let Some(r) = skip_reason() {
            println!("skipping: {r}");
            return;
        }
    };
}

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "keling-nvsim-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

fn lazy_umount(dir: &Path) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// A running `keling-nvsim mount --foreground`; Drop stops it and makes sure
/// nothing stays mounted.
struct Sim {
    child: Option<Child>,
    dir: PathBuf,
}

impl Sim {
    fn start(tag: &str, extra: &[&str]) -> Sim {
        let dir = temp_dir(tag);
        Self::start_at(dir, extra).unwrap()
    }

    fn start_at(dir: PathBuf, extra: &[&str]) -> Result<Sim, String> {
        let mut child = Command::new(NVSIM)
            .arg("mount")
            .arg(&dir)
            .arg("--foreground")
            .args(extra)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // keep draining stderr so the server never blocks on it
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut sim = Sim {
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.starts_with("nvsim: mounted ") => return Ok(sim),
                Ok(l) => seen.push(l),
                Err(_) => {
                    let status = sim.child.as_mut().unwrap().try_wait().ok().flatten();
                    drop(sim);
                    return Err(format!("no mount line (exit {status:?}): {seen:?}"));
                }
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.path("nvsim-state.json")).unwrap())
            .unwrap()
    }

    /// The state once `done` holds of it: FUSE sends a file's RELEASE after
    /// `close` returns (asynchronously), so what a close ends is seen a moment
    /// later. Gives up after 5 s and returns the last state (the caller's
    /// assertions then fail on it).
    fn state_once(&self, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.state();
            if done(&s) || Instant::now() >= deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn proc_gpu(&self, pid: u32, gpu: u64) -> Option<serde_json::Value> {
        Self::proc_gpu_of(&self.state(), pid, gpu)
    }

    /// One process's figures on one GPU in a simulator state.
    fn proc_gpu_of(s: &serde_json::Value, pid: u32, gpu: u64) -> Option<serde_json::Value> {
        let p = s["processes"]
            .as_array()?
            .iter()
            .find(|p| p["pid"] == pid)?
            .clone();
        p["gpus"]
            .as_array()?
            .iter()
            .find(|g| g["gpu"] == gpu)
            .cloned()
    }

    /// SIGTERM, wait; returns the exit status.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop();
        if is_mounted(&self.dir) {
            lazy_umount(&self.dir);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn w32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn w64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
fn r32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn r64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

fn ioctl(fd: i32, cmd: u32, arg: *mut u8) -> i32 {
    // SAFETY: `arg` points at a live buffer of the size encoded in `cmd`.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg) };
    if r < 0 {
        -std::io::Error::last_os_error().raw_os_error().unwrap()
    } else {
        r
    }
}

/// O_CLOEXEC: a process another test spawns meanwhile must not inherit the
/// file and delay its release.
fn open(p: &Path) -> i32 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open {}", p.display());
    fd
}

/// NVOS21 (32 bytes): hRoot@0 hObjectParent@4 hObjectNew@8 hClass@12
/// pAllocParms@16 paramsSize@24 status@28.
fn rm_alloc(
    fd: i32,
    root: u32,
    parent: u32,
    new: u32,
    class: u32,
    params: &mut [u8],
) -> (u32, u32) {
    let mut b = [0u8; 32];
    w32(&mut b, 0, root);
    w32(&mut b, 4, parent);
    w32(&mut b, 8, new);
    w32(&mut b, 12, class);
    if !params.is_empty() {
        w64(&mut b, 16, params.as_mut_ptr() as u64);
        w32(&mut b, 24, params.len() as u32);
    }
    w32(&mut b, 28, 0xffff_ffff);
    assert_eq!(ioctl(fd, 0xC020_462B, b.as_mut_ptr()), 0);
    (r32(&b, 28), r32(&b, 8))
}

#[test]
fn real_ioctls_reach_the_simulator() {
    require_root!();
    let sim = Sim::start("ioctl", &["--gpus", "2", "--mem-per-gpu", "1073741824"]);
    let me = std::process::id();
    let names: Vec<String> = std::fs::read_dir(&sim.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for n in [
        "nvidiactl",
        "nvidia0",
        "nvidia1",
        "nvidia-uvm",
        "version",
        "nvsim-state.json",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
    }
    let version = std::fs::read_to_string(sim.path("version")).unwrap();
    assert!(
        version.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159  ")
    );

    let fd = open(&sim.path("nvidiactl"));
    let (st, client) = rm_alloc(fd, 0, 0, 0, 0x41, &mut []);
    assert_eq!(st, 0);
    assert_ne!(client, 0);
    let mut dp = [0u8; 56];
    w32(&mut dp, 0, 1); // deviceId
    let (st, dev) = rm_alloc(fd, client, client, 0xd0, 0x80, &mut dp);
    assert_eq!((st, dev), (0, 0xd0));
    let mut mp = [0u8; 128];
    w64(&mut mp, 64, 3 * MIB + 5);
    let (st, mem) = rm_alloc(fd, client, dev, 0, 0x40, &mut mp);
    assert_eq!(st, 0);
    assert_ne!(mem, 0);
    assert_eq!(
        r64(&mp, 64),
        4 * MIB,
        "real size written back through pAllocParms"
    );

    // a bad pAllocParms is EFAULT
    let mut b = [0u8; 32];
    w32(&mut b, 0, client);
    w32(&mut b, 4, dev);
    w32(&mut b, 12, 0x40);
    w64(&mut b, 16, 0x10);
    assert_eq!(ioctl(fd, 0xC020_462B, b.as_mut_ptr()), -libc::EFAULT);
    // a wrong size is EINVAL
    let mut b = [0u8; 40];
    assert_eq!(ioctl(fd, 0xC028_462B, b.as_mut_ptr()), -libc::EINVAL);
    // UVM_INITIALIZE: params through the plain arg pointer
    let ufd = open(&sim.path("nvidia-uvm"));
    let mut up = [0u8; 16];
    w32(&mut up, 8, 0xffff_ffff);
    assert_eq!(ioctl(ufd, 0x3000_0001, up.as_mut_ptr()), 0);
    assert_eq!(r32(&up, 8), 0);

    let s = sim.state();
    assert_eq!(s["gpus"][1]["used_bytes"], 4 * MIB);
    assert_eq!(s["gpus"][1]["capacity_bytes"], 1u64 << 30);
    let c = s["clients"].as_array().unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["handle"], client);
    assert_eq!(c[0]["creator_pid"], me);
    assert_eq!(c[0]["objects"], 2);
    let g = sim.proc_gpu(me, 1).unwrap();
    assert_eq!(
        (g["bytes"].as_u64(), g["allocs"].as_u64()),
        (Some(4 * MIB), Some(1))
    );
    assert_eq!(s["ioctls"]["total"], 6);
    assert_eq!(s["ioctls"]["failed"], 2);

    // the last close of the file tears the client down
    // SAFETY: closing descriptors we opened.
    unsafe {
        libc::close(fd);
        libc::close(ufd);
    }
    // The kernel sends RELEASE after close returns (asynchronously): wait
    // for the simulator to have it, then check what it did.
    sim.state_once(|s| s["clients"].as_array().is_some_and(Vec::is_empty));
    let g = sim.proc_gpu(me, 1).unwrap();
    assert_eq!(
        (
            g["bytes"].as_u64(),
            g["peak_bytes"].as_u64(),
            g["frees"].as_u64()
        ),
        (Some(0), Some(4 * MIB), Some(1))
    );
    assert_eq!(sim.state()["clients"].as_array().unwrap().len(), 0);
}

fn workload(sim: &Sim, args: &[&str]) -> std::process::Output {
    Command::new(WORKLOAD)
        .arg("--dev-dir")
        .arg(&sim.dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn workload_scenarios_keep_the_truth_consistent() {
    require_root!();
    let sim = Sim::start("workload", &["--gpus", "2", "--mem-per-gpu", "4294967296"]);
    for scenario in ["basic", "hostile", "oom", "share"] {
        let out = workload(&sim, &["--scenario", scenario]);
        assert!(
            out.status.success(),
            "{scenario}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    for seed in 1..=6 {
        let out = workload(&sim, &["--seed", &seed.to_string(), "--steps", "50"]);
        assert!(
            out.status.success(),
            "seed {seed}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    // everything exited: nothing held anywhere; every allocation was freed
    // (by whoever was charged with it last)
    let s = sim.state();
    for g in s["gpus"].as_array().unwrap() {
        assert_eq!(
            (
                g["used_bytes"].as_u64(),
                g["host_bytes"].as_u64(),
                g["egm_bytes"].as_u64()
            ),
            (Some(0), Some(0), Some(0))
        );
    }
    assert!(s["clients"].as_array().unwrap().is_empty());
    assert!(s["memories"].as_array().unwrap().is_empty());
    let procs = s["processes"].as_array().unwrap();
    assert!(procs.len() > 8, "children show up as processes");
    let mut last = 0;
    let (mut allocs, mut frees) = (0, 0);
    for p in procs {
        let pid = p["pid"].as_u64().unwrap();
        assert!(pid > last, "sorted by pid");
        last = pid;
        for g in p["gpus"].as_array().unwrap() {
            for k in ["bytes", "host_bytes", "egm_bytes", "driver_video_bytes"] {
                assert_eq!(g[k], 0, "{k}");
            }
            allocs += g["allocs"].as_u64().unwrap();
            frees += g["frees"].as_u64().unwrap();
            assert!(g["peak_bytes"].as_u64() <= Some(4 << 30));
        }
    }
    assert_eq!(allocs, frees);
}

/// The `share` scenario, checkpoint by checkpoint, as its module doc says:
/// (A bytes, A driver figure, B bytes, B driver figure, GPU used) in MiB.
#[test]
fn share_scenario_moves_charges_as_documented() {
    require_root!();
    let sim = Sim::start("share", &["--gpus", "1"]);
    let mut child = Command::new(WORKLOAD)
        .arg("--dev-dir")
        .arg(&sim.dir)
        .args([
            "--scenario",
            "share",
            "--checkpoints",
            "--checkpoint-every",
            "1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let a = child.id() as u64;
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let want: [(u64, u64, u64, u64, u64); 10] = [
        (12, 12, 0, 0, 12),
        (12, 12, 0, 0, 12),
        (12, 12, 0, 0, 12),
        (12, 12, 2, 2, 14),
        (8, 8, 6, 6, 14),
        (8, 8, 6, 6, 14),
        (0, 0, 14, 14, 14),
        (0, 0, 14, 10, 14),
        (0, 0, 10, 10, 10),
        (0, 0, 10, 10, 10),
    ];
    let mut b_pid = None;
    for (i, w) in want.iter().enumerate() {
        let l = lines.next().unwrap().unwrap();
        assert_eq!(l, format!("checkpoint {}", i + 1));
        let s = sim.state();
        let mut got = (
            0,
            0,
            0,
            0,
            s["gpus"][0]["used_bytes"].as_u64().unwrap() / MIB,
        );
        for p in s["processes"].as_array().unwrap() {
            let g = &p["gpus"][0];
            let (bytes, drv) = (
                g["bytes"].as_u64().unwrap() / MIB,
                g["driver_video_bytes"].as_u64().unwrap() / MIB,
            );
            if p["pid"] == a {
                (got.0, got.1) = (bytes, drv);
            } else {
                b_pid = Some(p["pid"].as_u64().unwrap());
                (got.2, got.3) = (bytes, drv);
            }
            assert_eq!(
                g["host_bytes"].as_u64(),
                Some(if p["pid"] == a { MIB } else { 0 })
            );
        }
        assert_eq!(got, *w, "at checkpoint {}", i + 1);
        use std::io::Write;
        writeln!(stdin, "go").unwrap();
    }
    assert!(lines.next().is_none());
    assert!(child.wait().unwrap().success());
    // Their files' RELEASEs come after they exit (asynchronously).
    sim.state_once(|s| s["memories"].as_array().is_some_and(Vec::is_empty));
    let ga = sim.proc_gpu(a as u32, 0).unwrap();
    let gb = sim.proc_gpu(b_pid.unwrap() as u32, 0).unwrap();
    let f = |g: &serde_json::Value| {
        ["bytes", "peak_bytes", "allocs", "frees"].map(|k| g[k].as_u64().unwrap())
    };
    assert_eq!(f(&ga), [0, 12 * MIB, 3, 1], "A frees only its host memory");
    assert_eq!(f(&gb), [0, 14 * MIB, 1, 3], "B frees mA2, mA1 and its own");
    assert!(sim.state()["memories"].as_array().unwrap().is_empty());
}

#[test]
fn checkpoints_show_live_memory() {
    require_root!();
    let sim = Sim::start("checkpoints", &[]);
    let mut child = Command::new(WORKLOAD)
        .arg("--dev-dir")
        .arg(&sim.dir)
        .args([
            "--scenario",
            "basic",
            "--checkpoints",
            "--checkpoint-every",
            "1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // steps: device, alloc 3 MiB, alloc 5 MiB, free the first; then the end
    let want = [0, 4 * MIB, 10 * MIB, 6 * MIB, 6 * MIB];
    for (i, w) in want.iter().enumerate() {
        let l = lines.next().unwrap().unwrap();
        assert_eq!(l, format!("checkpoint {}", i + 1));
        let bytes = sim
            .proc_gpu(pid, 0)
            .map(|g| g["bytes"].as_u64().unwrap())
            .unwrap_or(0);
        assert_eq!(bytes, *w, "at checkpoint {}", i + 1);
        use std::io::Write;
        writeln!(stdin, "go").unwrap();
    }
    assert!(lines.next().is_none());
    assert!(child.wait().unwrap().success());
    let g = sim.proc_gpu(pid, 0).unwrap();
    assert_eq!(
        g["bytes"], 0,
        "exit without freeing: torn down by the release"
    );
    assert_eq!(g["peak_bytes"], 10 * MIB);
    assert_eq!(
        (g["allocs"].as_u64(), g["frees"].as_u64()),
        (Some(2), Some(2))
    );
}

#[test]
fn legacy_driver_layouts() {
    require_root!();
    let sim = Sim::start(
        "legacy",
        &[
            "--driver-version",
            "530.30.02",
            "--mem-per-gpu",
            "2147483648",
        ],
    );
    for args in [
        vec!["--scenario", "basic"],
        vec!["--scenario", "hostile"],
        vec!["--seed", "3"],
    ] {
        let out = workload(&sim, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The workloads' files' RELEASEs come after they exit (asynchronously).
    let s = sim.state_once(|s| s["clients"].as_array().is_some_and(Vec::is_empty));
    assert!(s["clients"].as_array().unwrap().is_empty());
}

#[test]
fn stale_mount_is_reported_and_forced_away() {
    require_root!();
    let mut sim = Sim::start("stale", &[]);
    let dir = sim.dir.clone();
    // crash the server: the mount stays, dead
    let mut child = sim.child.take().unwrap();
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(is_mounted(&dir));
    let out = Command::new(NVSIM)
        .arg("mount")
        .arg(&dir)
        .arg("--foreground")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("umount -l"), "{err}");
    // --force takes it over
    let mut again = Sim::start_at(dir.clone(), &["--force"]).unwrap();
    assert!(
        std::fs::read_to_string(again.path("version"))
            .unwrap()
            .contains("580.159")
    );
    let st = again.stop().unwrap();
    assert!(st.success(), "clean exit on SIGTERM: {st:?}");
    assert!(!is_mounted(&dir), "unmounted on SIGTERM");
    drop(again);
    drop(sim);
    assert!(!is_mounted(&dir));
}

#[test]
fn umount_command_and_daemon_mode() {
    require_root!();
    let dir = temp_dir("daemon");
    // the parent returns once the mount is live; the daemon serves on
    let out = Command::new(NVSIM).arg("mount").arg(&dir).output().unwrap();
    let guard = Sim {
        child: None,
        dir: dir.clone(),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("nvsim: mounted "));
    assert!(is_mounted(&dir));
    assert!(guard.state()["gpus"].as_array().unwrap().len() == 2);
    let out = Command::new(NVSIM)
        .arg("umount")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&dir));
    drop(guard);
}

/// RM_CONTROL (NVOS54, 32 bytes) with `params`; returns the status @28.
fn rm_control(fd: i32, client: u32, obj: u32, cmd: u32, params: &mut [u8]) -> u32 {
    let mut b = [0u8; 32];
    w32(&mut b, 0, client);
    w32(&mut b, 4, obj);
    w32(&mut b, 8, cmd);
    w64(&mut b, 16, params.as_mut_ptr() as u64);
    w32(&mut b, 24, params.len() as u32);
    w32(&mut b, 28, 0xffff_ffff);
    assert_eq!(ioctl(fd, 0xC020_462A, b.as_mut_ptr()), 0);
    r32(&b, 28)
}

#[test]
fn export_and_import_resolve_the_named_descriptor() {
    require_root!();
    let sim = Sim::start("export", &["--gpus", "1"]);
    let me = std::process::id();
    let ctl = open(&sim.path("nvidiactl"));
    let (_, ca) = rm_alloc(ctl, 0, 0, 0, 0x41, &mut []);
    let mut dp = [0u8; 56];
    let (_, da) = rm_alloc(ctl, ca, ca, 0, 0x80, &mut dp);
    let mut mp = [0u8; 128];
    w64(&mut mp, 64, 6 * MIB);
    let (st, mem) = rm_alloc(ctl, ca, da, 0, 0x40, &mut mp);
    assert_eq!(st, 0);
    // EXPORT_OBJECT_TO_FD (24): type@0 hDevice@4 hObject@12 fd@16
    let export = |fd: i32| {
        let mut p = [0u8; 24];
        w32(&mut p, 0, 1);
        w32(&mut p, 4, da);
        w32(&mut p, 12, mem);
        w32(&mut p, 16, fd as u32);
        rm_control(ctl, ca, ca, 0x3d05, &mut p)
    };
    // descriptors that are not an nvidiactl file of this simulator
    let null = open(Path::new("/dev/null"));
    let uvm = open(&sim.path("nvidia-uvm"));
    assert_eq!(export(null), 0x3B, "/dev/null");
    assert_eq!(export(uvm), 0x3B, "nvidia-uvm");
    assert_eq!(export(9999), 0x3B, "not open");
    // the export file
    let exp = open(&sim.path("nvidiactl"));
    assert_eq!(export(exp), 0);
    assert_eq!(export(exp), 0x63, "already holds an object");
    // a second client on another file imports it, through a dup'd fd number
    let ctl2 = open(&sim.path("nvidiactl"));
    let (_, cb) = rm_alloc(ctl2, 0, 0, 0, 0x41, &mut []);
    let (_, db) = rm_alloc(ctl2, cb, cb, 0, 0x80, &mut dp);
    // SAFETY: dup of our own descriptor.
    let exp_dup = unsafe { libc::fcntl(exp, libc::F_DUPFD_CLOEXEC, 0) };
    let mut ip = [0u8; 20];
    w32(&mut ip, 0, exp_dup as u32);
    w32(&mut ip, 4, 1);
    w32(&mut ip, 12, db);
    assert_eq!(rm_control(ctl2, cb, cb, 0x3d06, &mut ip), 0);
    let imported = r32(&ip, 16);
    assert_ne!(imported, 0);
    let s = sim.state();
    assert_eq!(s["gpus"][0]["used_bytes"], 6 * MIB);
    let mems = s["memories"].as_array().unwrap();
    assert_eq!(mems.len(), 1);
    assert_eq!(
        (mems[0]["handles"].as_u64(), mems[0]["export_refs"].as_u64()),
        (Some(2), Some(1))
    );
    // the exporter's file goes: the import keeps the memory, still ours
    let clients = |s: &serde_json::Value| s["clients"].as_array().map_or(0, Vec::len);
    let before = clients(&sim.state());
    // SAFETY: closing descriptors we opened.
    unsafe { libc::close(ctl) };
    let s = sim.state_once(|s| clients(s) < before);
    let g = Sim::proc_gpu_of(&s, me, 0).unwrap();
    assert_eq!(
        (g["bytes"].as_u64(), g["frees"].as_u64()),
        (Some(6 * MIB), Some(0))
    );
    assert_eq!(g["driver_video_bytes"], 6 * MIB);
    // the importer's file goes: the export file still holds it
    let before = clients(&s);
    // SAFETY: as above.
    unsafe { libc::close(ctl2) };
    let s = sim.state_once(|s| clients(s) < before);
    assert_eq!(s["gpus"][0]["used_bytes"], 6 * MIB);
    assert_eq!(
        Sim::proc_gpu_of(&s, me, 0).unwrap()["driver_video_bytes"],
        0
    );
    // closing one of the two descriptors of the export file is not its release
    // SAFETY: as above.
    unsafe { libc::close(exp) };
    assert_eq!(sim.state()["gpus"][0]["used_bytes"], 6 * MIB);
    // SAFETY: as above.
    unsafe {
        libc::close(exp_dup);
        libc::close(null);
        libc::close(uvm);
    }
    // the export file's last descriptor goes: its release frees the memory
    let s = sim.state_once(|s| s["memories"].as_array().is_some_and(Vec::is_empty));
    assert_eq!(s["gpus"][0]["used_bytes"], 0);
    assert!(s["memories"].as_array().unwrap().is_empty());
    let g = sim.proc_gpu(me, 0).unwrap();
    assert_eq!(
        (g["allocs"].as_u64(), g["frees"].as_u64()),
        (Some(1), Some(1))
    );
}
