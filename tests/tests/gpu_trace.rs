//! GPU tracing against the simulated driver: real eBPF probes, real ioctls on a
//! FUSE-served nvidiactl / nvidiaN / nvidia-uvm, and the simulator's ground truth.
use std::{
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use keling_tests::{
    ChildGuard, Fixture, Nvsim, converge, gpu_workload_bin, keling_figures, tempdir, trace,
    truth_figures,
};
use serde_json::Value;

fn gwl() -> String {
    gpu_workload_bin().to_string_lossy().into_owned()
}

/// Seeds the tests have not seen before: a fresh base every run, printed so a
/// failure can be replayed with KELING_SEED_BASE.
fn seed_base() -> u64 {
    let base = std::env::var("KELING_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_000
        });
    eprintln!("seed base {base} (rerun with KELING_SEED_BASE={base})");
    base
}

#[test]
fn basic_scenario_decodes_every_call_exactly() {
    let Some(fx) = Fixture::gpu(
        "basic_scenario_decodes_every_call_exactly",
        &["--gpus", "2"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let t = trace(
        &["--dev-dir", sim.dev_dir()],
        &[&gwl(), "--dev-dir", sim.dev_dir(), "--scenario", "basic"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let allocs: Vec<&Value> = t.of_type("gpu_alloc").collect();
    // 3 MiB and 5 MiB requested; the driver rounds to 2 MiB pages and writes the real
    // size back, which Keling reads at syscall exit.
    let sizes: Vec<u64> = allocs
        .iter()
        .map(|a| a["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4 << 20, 6 << 20], "{allocs:?}");
    assert!(
        allocs
            .iter()
            .all(|a| a["gpu"] == 0 && a["class"] == 0x40 && a["kind"] == "video_memory")
    );
    let frees: Vec<&Value> = t
        .of_type("gpu_free")
        .filter(|f| f["bytes"].as_u64() != Some(0))
        .collect();
    assert_eq!(frees.len(), 1);
    assert_eq!(frees[0]["bytes"], 4 << 20);
    assert_eq!(frees[0]["handle"], allocs[0]["handle"]);
    // Exit without freeing: the driver frees the client when its file is released.
    let teardown: Vec<&Value> = t.of_type("gpu_teardown").collect();
    assert_eq!(teardown.len(), 1, "{teardown:?}");
    assert_eq!(teardown[0]["reason"], "file_released");
    assert_eq!(teardown[0]["bytes"], 6 << 20);
    // The object tree: client -> device on GPU 0.
    let objects: Vec<&Value> = t.of_type("gpu_object").collect();
    assert!(objects.iter().any(|o| o["kind"] == "client"));
    let device = objects
        .iter()
        .find(|o| o["kind"] == "device")
        .expect("device object");
    assert_eq!(device["gpu"], 0);
    assert_eq!(device["parent"], device["client"]);
    let opens: Vec<&Value> = t.of_type("gpu_open").collect();
    assert!(opens.iter().any(|o| o["device"] == "nvidiactl"));
    let p = t.root();
    assert_eq!(p["gpu_mem_bytes"], 0);
    assert_eq!(p["gpu_mem_peak_bytes"], 10 << 20);
    assert_eq!(p["gpu_allocs"], 2);
    assert_eq!(p["gpu_frees"], 2);
    assert_eq!(p["undecoded"], 0);
    converge(sim, &keling_figures(t.summary()), Duration::from_secs(3)).unwrap();
}

/// `gpu_snapshot` lines of a running `keling trace --format jsonl --output FILE`,
/// asked for with SIGUSR1 and read back from FILE by their sequence number.
struct Snapshots {
    keling: i32,
    path: std::path::PathBuf,
    out: Option<std::fs::File>,
    pending: String,
    seq: u64,
}

impl Snapshots {
    fn new(keling: i32, path: &std::path::Path) -> Snapshots {
        Snapshots {
            keling,
            path: path.to_owned(),
            out: None,
            pending: String::new(),
            seq: 0,
        }
    }

    /// Asks for the next snapshot and waits for it.
    fn take(&mut self) -> Value {
        self.seq += 1;
        // SAFETY: signalling our own child by pid: "write a gpu_snapshot now".
        unsafe { libc::kill(self.keling, libc::SIGUSR1) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.out.is_none() {
                self.out = std::fs::File::options().read(true).open(&self.path).ok();
            }
            if let Some(f) = self.out.as_mut() {
                f.read_to_string(&mut self.pending).unwrap();
            }
            let seq = self.seq;
            let found = self
                .pending
                .lines()
                .filter(|l| l.contains("\"gpu_snapshot\""))
                .find_map(|l| {
                    let v: Value = serde_json::from_str(l).ok()?;
                    (v["seq"] == seq).then_some(v)
                });
            if let Some(v) = found {
                // Keep only what follows the snapshot line.
                let cut = self.pending.rfind("\"gpu_snapshot\"").unwrap();
                let end = self.pending[cut..]
                    .find('\n')
                    .map_or(self.pending.len(), |e| cut + e + 1);
                self.pending.drain(..end);
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "no gpu_snapshot {seq} from keling"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Runs `count` random workloads (seeds from `base`) in one traced shell loop; at
/// every checkpoint of every workload and at the end, Keling's per-process,
/// per-GPU figures (bytes, peak, host bytes, allocs, frees) must equal the
/// simulator's ground truth exactly, with nothing undecoded.
/// The two long random-workload tests run one at a time: each alone keeps the
/// machine as busy as the other tests beside it expect (the uretprobe of
/// `driver_entry_exit_path_matches_ground_truth` also slows every process of the
/// workload binary, its own or not).
static RANDOM_WORKLOADS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How [`random_workloads`] runs: the workloads' extra arguments, and the
/// environment of `keling trace`.
#[derive(Default)]
struct RandomRun<'a> {
    workload_args: &'a str,
    keling_env: Vec<(&'a str, String)>,
}

fn random_workloads(sim: &Nvsim, base: u64, count: u64, steps: u32) -> Value {
    random_workloads_with(sim, base, count, steps, RandomRun::default())
}

fn random_workloads_with(sim: &Nvsim, base: u64, count: u64, steps: u32, run: RandomRun) -> Value {
    let _one_at_a_time = RANDOM_WORKLOADS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let out_path = dir.join("trace.jsonl");
    let script = format!(
        "for s in $(seq {base} {last}); do {wl} --dev-dir {dev} --seed $s --steps {steps} {extra} \
         --checkpoints --checkpoint-every 10 || {{ echo \"workload seed $s failed\" >&2; exit 1; }}; done",
        extra = run.workload_args,
        last = base + count - 1,
        wl = gwl(),
        dev = sim.dev_dir(),
    );
    let mut keling = ChildGuard(
        Command::new(keling_tests::keling_bin())
            .args([
                "trace",
                "--dev-dir",
                sim.dev_dir(),
                "--format",
                "jsonl",
                "--output",
            ])
            .arg(&out_path)
            .args(["--", "sh", "-c", &script])
            .envs(run.keling_env)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut snapshots = Snapshots::new(keling.0.id() as i32, &out_path);
    let mut to_workload = keling.0.stdin.take().unwrap();
    let from_workload = BufReader::new(keling.0.stdout.take().unwrap());
    let (mut workload, mut checkpoints) = (base - 1, 0u64);
    for line in from_workload.lines() {
        let line = line.unwrap();
        let Some(n) = line.strip_prefix("checkpoint ") else {
            panic!("unexpected workload output {line:?}");
        };
        if n == "1" {
            workload += 1;
        }
        // The workload waits at the checkpoint, so both sides must settle on
        // the same figures: the simulator gets file releases from FUSE after
        // the close returned, and Keling finds a release where it does not
        // look by its rate-limited orphan sweep. Both are re-read until they
        // agree, for at most 3 s.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let snapshot = snapshots.take();
            match converge(sim, &keling_figures(&snapshot), Duration::from_millis(200)) {
                Ok(()) => break,
                Err(_) if Instant::now() < deadline => continue,
                Err(diff) => panic!(
                    "seed {workload}, checkpoint {n}: {diff}\n(the trace is kept: {})",
                    out_path.display()
                ),
            }
        }
        checkpoints += 1;
        to_workload.write_all(b"\n").unwrap();
    }
    let status = keling.0.wait().unwrap();
    assert!(status.success(), "traced loop failed: {status:?}");
    let mut text = String::new();
    let mut f = std::fs::File::open(&out_path).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut text).unwrap();
    let summary: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(
        workload,
        base + count - 1,
        "every workload reached its checkpoints"
    );
    assert!(
        checkpoints >= count,
        "{checkpoints} checkpoints for {count} workloads"
    );
    converge(sim, &keling_figures(&summary), Duration::from_secs(3))
        .unwrap_or_else(|d| panic!("final: {d}"));
    let undecoded: u64 = summary["undecoded"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        undecoded,
        0,
        "supported calls were not decoded: {} (the trace is kept: {})",
        summary["undecoded"],
        out_path.display()
    );
    assert_eq!(summary["drops"], 0);
    assert_eq!(
        summary["decode_errors"], 0,
        "the probes wrote records the contract does not define"
    );
    let _ = std::fs::remove_dir_all(&dir);
    summary
}

#[test]
fn two_hundred_random_workloads_match_ground_truth() {
    // 6 GiB per GPU: large random allocations sometimes hit NV_ERR_NO_MEMORY.
    let Some(fx) = Fixture::gpu(
        "two_hundred_random_workloads_match_ground_truth",
        &["--gpus", "2", "--mem-per-gpu", "6442450944"],
    ) else {
        return;
    };
    let count = std::env::var("KELING_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let summary = random_workloads(fx.sim(), seed_base(), count, 30);
    // The workloads used every path: XFER, threads, forks, execs, kills.
    let procs = summary["processes"].as_array().unwrap();
    assert!(
        procs.len() as u64 > count,
        "forked children were traced too"
    );
}

/// The driver-entry backend's exit path (its kprobe-type handler and work
/// programs, in their own program arrays) keeps the accounting exact through
/// allocations, frees, XFER, dups, exports and imports, forks, execs and file
/// releases. This kernel cannot attach kprobes, so the same exit code runs from
/// a uretprobe on a function the workload calls right after each ioctl returns,
/// with its return value (`KELING_TEST_IOCTL_RETURN`); the entry is the
/// tracepoint's (the same code as the driver entry's after it found the file).
/// The workloads kill no child mid-work: a kill between an ioctl's return and
/// that call would lose an exit the real kretprobe cannot lose.
#[test]
fn driver_entry_exit_path_matches_ground_truth() {
    let Some(fx) = Fixture::gpu(
        "driver_entry_exit_path_matches_ground_truth",
        &["--gpus", "2", "--mem-per-gpu", "6442450944"],
    ) else {
        return;
    };
    let target = format!("{}:keling_test_ioctl_returned", gwl());
    let summary = random_workloads_with(
        fx.sim(),
        seed_base(),
        40,
        30,
        RandomRun {
            workload_args: "--no-kills",
            keling_env: vec![("KELING_TEST_IOCTL_RETURN", target)],
        },
    );
    assert_eq!(summary["ioctl_backend"], "test-return-uprobe");
    // The workloads made each kind of call that has a handler program; with
    // sys_exit_ioctl not attached, only that path can have counted their effects.
    let escapes = &summary["escapes"];
    for name in [
        "RM_ALLOC",
        "RM_VID_HEAP_CONTROL",
        "RM_FREE",
        "RM_DUP_OBJECT",
        "RM_CONTROL",
    ] {
        assert!(
            escapes[name]["calls"].as_u64().unwrap_or(0) > 0,
            "no {name} in {escapes}"
        );
    }
}

/// With the driver-entry backend asked for by name, on a machine where it cannot
/// attach, `keling trace` stops before running anything and says why; its
/// programs (the entry, the return and the kprobe-type twins of every handler
/// and work program) were loaded first, so the verifier accepted them here.
/// `auto` takes the tracepoints and says so in the summary.
#[test]
fn driver_entry_backend_loads_and_says_why_it_cannot_attach() {
    let Some(fx) = Fixture::gpu(
        "driver_entry_backend_loads_and_says_why_it_cannot_attach",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = tempdir();
    let marker = dir.join("ran");
    let out = Command::new(keling_tests::keling_bin())
        .args([
            "trace",
            "--dev-dir",
            sim.dev_dir(),
            "--ioctl-backend",
            "driver-entry",
        ])
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--ioctl-backend driver-entry: its programs load on this kernel")
            && stderr.contains("simulated driver"),
        "{stderr}"
    );
    assert!(
        !marker.exists(),
        "the command ran although tracing could not start"
    );
    let t = trace(
        &["--dev-dir", sim.dev_dir()],
        &[&gwl(), "--dev-dir", sim.dev_dir(), "--scenario", "basic"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    assert_eq!(t.summary()["ioctl_backend"], "tracepoints");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pre_535_layout_is_decoded() {
    // Its own simulators: the second starts from a clean state.
    let Some(_fx) = Fixture::needs("pre_535_layout_is_decoded").fuse().ready() else {
        return;
    };
    let sim = Nvsim::mount(&["--gpus", "2", "--driver-version", "530.30.02"]);
    let t = trace(
        &["--dev-dir", sim.dev_dir()],
        &[&gwl(), "--dev-dir", sim.dev_dir(), "--scenario", "basic"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    assert!(
        t.stderr.contains("530.30.02"),
        "driver version read from DIR/version: {}",
        t.stderr
    );
    let sizes: Vec<u64> = t
        .of_type("gpu_alloc")
        .map(|a| a["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4 << 20, 6 << 20]);
    converge(&sim, &keling_figures(t.summary()), Duration::from_secs(3)).unwrap();
    drop(sim);
    let sim = Nvsim::mount(&["--gpus", "2", "--driver-version", "530.30.02"]);
    random_workloads(&sim, seed_base(), 10, 30);
}

#[test]
fn hostile_process_cannot_corrupt_the_accounting() {
    let Some(fx) = Fixture::gpu(
        "hostile_process_cannot_corrupt_the_accounting",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let t = trace(
        &["--dev-dir", sim.dev_dir()],
        &[&gwl(), "--dev-dir", sim.dev_dir(), "--scenario", "hostile"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let s = t.summary();
    // Bad pointers and wrong sizes were counted, not guessed...
    let und = &s["undecoded"];
    assert!(und["fault"].as_u64().unwrap() > 0, "{und}");
    assert!(
        und["unknown_layout"].as_u64().unwrap() + und["unknown_escape"].as_u64().unwrap() > 0,
        "{und}"
    );
    assert!(t.root()["undecoded"].as_u64().unwrap() > 0);
    // ...the 10000-control flood lost nothing...
    assert_eq!(s["drops"], 0);
    assert!(t.of_type("gpu_ioctl").count() >= 10_000);
    // ...and the totals are exact, including the valid 1 MiB allocation at the end.
    assert!(
        t.of_type("gpu_alloc")
            .any(|a| a["bytes"].as_u64().unwrap() >= 1 << 20)
    );
    converge(sim, &keling_figures(s), Duration::from_secs(3)).unwrap();
}

#[test]
fn out_of_memory_allocations_are_not_counted() {
    let Some(fx) = Fixture::gpu(
        "out_of_memory_allocations_are_not_counted",
        &["--gpus", "1", "--mem-per-gpu", "1073741824"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let t = trace(
        &["--dev-dir", sim.dev_dir()],
        &[&gwl(), "--dev-dir", sim.dev_dir(), "--scenario", "oom"],
    );
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    let no_memory: Vec<&Value> = t
        .of_type("gpu_ioctl")
        .filter(|i| i["status"] == 0x51)
        .collect();
    assert!(!no_memory.is_empty(), "the scenario hit NV_ERR_NO_MEMORY");
    let p = t.root();
    assert!(p["gpu_mem_peak_bytes"].as_u64().unwrap() <= 1 << 30, "{p}");
    converge(sim, &keling_figures(t.summary()), Duration::from_secs(3)).unwrap();
}

#[test]
fn gpu_events_appear_in_the_text_timeline() {
    let Some(fx) = Fixture::gpu("gpu_events_appear_in_the_text_timeline", &["--gpus", "1"]) else {
        return;
    };
    let sim = fx.sim();
    let out = Command::new(keling_tests::keling_bin())
        .args([
            "trace",
            "--dev-dir",
            sim.dev_dir(),
            "--",
            &gwl(),
            "--dev-dir",
            sim.dev_dir(),
            "--scenario",
            "basic",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("gpu alloc 4194304 bytes video_memory on gpu0"),
        "{text}"
    );
    assert!(text.contains("gpu teardown of client"), "{text}");
    assert!(text.contains("GPU PEAK"), "{text}");
}

/// Never leave a mount behind: the guard's unmount works even if the test panics.
#[test]
fn simulator_unmounts_when_dropped() {
    let Some(_fx) = Fixture::needs("simulator_unmounts_when_dropped")
        .fuse()
        .ready()
    else {
        return;
    };
    let dir = {
        let sim = Nvsim::mount(&["--gpus", "1"]);
        assert!(sim.dir.join("nvidiactl").exists());
        sim.dir.clone()
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.lines().any(|l| l.split(' ').nth(1) == dir.to_str()),
        "still mounted"
    );
}

/// `--pid` on a process that opened the devices before Keling started: its fds
/// are adopted from /proc, so what it allocates from then on, its closes and the
/// release of its files are followed; frees of objects made before are counted as
/// `unknown_object`, never subtracted from anything.
#[test]
fn attach_adopts_fds_opened_before_keling() {
    let Some(fx) = Fixture::gpu("attach_adopts_fds_opened_before_keling", &["--gpus", "2"]) else {
        return;
    };
    let sim = fx.sim();
    let seed = seed_base();
    let mut wl = ChildGuard(
        Command::new(gwl())
            .args([
                "--dev-dir",
                sim.dev_dir(),
                "--seed",
                &seed.to_string(),
                "--steps",
                "30",
                "--checkpoints",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = wl.0.id() as u64;
    let mut to_wl = wl.0.stdin.take().unwrap();
    let mut from_wl = BufReader::new(wl.0.stdout.take().unwrap()).lines();
    assert_eq!(from_wl.next().unwrap().unwrap(), "checkpoint 1");
    let before = keling_tests::truth_figures(&sim.state());
    // Index of `allocs` in the figures.
    const ALLOCS: usize = 5;
    let allocs_before: u64 = before
        .iter()
        .filter(|(k, _)| k.0 == pid)
        .map(|(_, f)| f[ALLOCS])
        .sum();
    let dir = &fx.dir;
    let out_path = dir.join("trace.jsonl");
    let mut keling = ChildGuard(
        Command::new(keling_tests::keling_bin())
            .args([
                "trace",
                "--dev-dir",
                sim.dev_dir(),
                "--format",
                "jsonl",
                "--output",
            ])
            .arg(&out_path)
            .args(["--pid", &pid.to_string()])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut log = BufReader::new(keling.0.stderr.take().unwrap()).lines();
    // Both lines come before the trace starts, in either order.
    let (mut adopted, mut attached) = (None, false);
    for l in log.by_ref().map_while(Result::ok) {
        if l.contains("adopted") {
            adopted = Some(l);
        } else if l.contains("tracing process") {
            attached = true;
        }
        if adopted.is_some() && attached {
            break;
        }
    }
    let adopted = adopted.expect("keling adopted the fds");
    assert!(attached, "keling attached");
    assert!(adopted.contains("of 1 processes"), "{adopted}");
    std::thread::spawn(move || log.for_each(drop));
    // Let the workload run to its end.
    to_wl.write_all(b"\n").unwrap();
    for line in from_wl.by_ref() {
        assert!(line.unwrap().starts_with("checkpoint"));
        to_wl.write_all(b"\n").unwrap();
    }
    assert!(wl.0.wait().unwrap().success());
    assert!(keling.0.wait().unwrap().success());
    let text = std::fs::read_to_string(&out_path).unwrap();
    let summary: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let after = {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let s = sim.state();
            if s["clients"].as_array().unwrap().is_empty() || Instant::now() > deadline {
                break keling_tests::truth_figures(&s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let ours = keling_figures(&summary);
    let allocs_after: u64 = after
        .iter()
        .filter(|(k, _)| k.0 == pid)
        .map(|(_, f)| f[ALLOCS])
        .sum();
    let our_allocs: u64 = ours
        .iter()
        .filter(|(k, _)| k.0 == pid)
        .map(|(_, f)| f[ALLOCS])
        .sum();
    assert_eq!(
        our_allocs,
        allocs_after - allocs_before,
        "allocations made after attaching"
    );
    // Nothing held at the end on either side: post-attach memory was all freed or
    // torn down with the adopted files.
    assert!(ours.values().all(|f| f[0] == 0 && f[2] == 0), "{ours:?}");
    // Children forked after attaching are exact, with two openly reported
    // exceptions. A child that allocates under a device object made before Keling
    // attached has those bytes counted with the GPU unknown (`gpu` null), so its
    // peak is split in two: the true peak lies between the larger part and their
    // sum. A child that imports memory allocated before Keling attached cannot be
    // charged for it (Keling never knew its size): it counts `unknown_object`, and
    // only its final holdings are compared.
    let sum = |figs: &keling_tests::GpuFigures, p: u64, i: usize| -> u64 {
        figs.iter()
            .filter(|(k, _)| k.0 == p)
            .map(|(_, f)| f[i])
            .sum()
    };
    let max = |figs: &keling_tests::GpuFigures, p: u64, i: usize| -> u64 {
        figs.iter()
            .filter(|(k, _)| k.0 == p)
            .map(|(_, f)| f[i])
            .max()
            .unwrap_or(0)
    };
    let undecoded_of = |p: u64| {
        summary["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["pid"] == p)
            .map_or(0, |e| e["undecoded"].as_u64().unwrap())
    };
    let children: std::collections::BTreeSet<u64> =
        ours.keys().map(|k| k.0).filter(|&p| p != pid).collect();
    let mut exact = 0;
    for child in children {
        // bytes, host bytes, EGM, driver figure: nothing held at the end.
        for i in [0, 2, 3, 4] {
            assert_eq!(
                sum(&ours, child, i),
                sum(&after, child, i),
                "child {child}, figure {i}"
            );
        }
        if undecoded_of(child) > 0 {
            continue;
        }
        let (lo, hi) = (max(&ours, child, 1), sum(&ours, child, 1));
        let truth = max(&after, child, 1);
        assert!(
            lo <= truth && truth <= hi,
            "child {child}: true peak {truth}, Keling's parts {lo}..{hi}"
        );
        for i in [5, 6] {
            assert_eq!(
                sum(&ours, child, i),
                sum(&after, child, i),
                "child {child}, figure {i}"
            );
        }
        exact += 1;
    }
    eprintln!("{exact} children compared in full");
}

/// The totals live in kernel maps, not in the event stream: with a small ring buffer
/// that nobody drains during a 10 000-ioctl flood (the tracer is stopped with
/// SIGSTOP meanwhile), events are lost (and counted) but the per-process figures
/// still equal the ground truth.
#[test]
fn totals_stay_exact_when_the_ring_buffer_drops_events() {
    let Some(fx) = Fixture::gpu(
        "totals_stay_exact_when_the_ring_buffer_drops_events",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let (out_path, go, done) = (dir.join("trace.jsonl"), dir.join("go"), dir.join("done"));
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.01; done; {wl} --dev-dir {dev} --scenario hostile; touch {done}",
        go = go.display(),
        done = done.display(),
        wl = gwl(),
        dev = sim.dev_dir(),
    );
    let mut keling = ChildGuard(
        Command::new(keling_tests::keling_bin())
            .args(["trace", "--dev-dir", sim.dev_dir(), "--ringbuf-kib", "4"])
            .args(["--format", "jsonl", "--output"])
            .arg(&out_path)
            .args(["--", "sh", "-c", &script])
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let keling_pid = keling.0.id() as i32;
    // The trace is running once the shell's exec is written out.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&out_path).is_ok_and(|t| t.contains("\"exec\"")) {
        assert!(Instant::now() < deadline, "the trace did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Nobody drains the ring buffer while the flood runs.
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(keling_pid, libc::SIGSTOP) };
    std::fs::write(&go, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done.exists() {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(keling_pid, libc::SIGCONT) };
            panic!("the flood did not finish");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::kill(keling_pid, libc::SIGCONT) };
    assert!(keling.0.wait().unwrap().success());
    let lines = trace_lines(&out_path);
    let s = lines.last().unwrap();
    assert_eq!(s["type"], "summary");
    assert!(
        s["drops"].as_u64().unwrap() > 0,
        "the undrained ring buffer overflowed: {}",
        s["drops"]
    );
    assert!(
        lines
            .iter()
            .any(|d| d["type"] == "drops" && d["total"].as_u64().unwrap() > 0)
    );
    converge(sim, &keling_figures(s), Duration::from_secs(3)).unwrap();
}

/// A process in a private mount namespace mounts its own (fake) driver over the
/// very path Keling watches (the real mount is lazily unmounted in that namespace
/// only) and makes GPU calls on it, while a real process uses the
/// real files at the same path. Keling knows NVIDIA files by the identity of their
/// inode, not by their name: the fake calls are invisible (no events, no figures,
/// nothing undecoded) and the real process's figures equal the real driver's truth.
#[test]
fn a_device_forged_in_a_private_mount_namespace_is_not_counted() {
    let Some(fx) = Fixture::gpu(
        "a_device_forged_in_a_private_mount_namespace_is_not_counted",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let (forger_sh, log, fake_state, fake_pid) = (
        dir.join("forger.sh"),
        dir.join("fake.log"),
        dir.join("fake-state.json"),
        dir.join("fake.pid"),
    );
    let forger = format!(
        "{nvsim} mount {dev} --gpus 1 --foreground --force 2>{log} & sim=$!; \
         until grep -q 'nvsim: mounted' {log}; do kill -0 $sim || exit 9; sleep 0.05; done; \
         sh -c 'echo $$ > {pidf}; exec {wl} --dev-dir {dev} --scenario basic'; rc=$?; \
         cp {dev}/nvsim-state.json {fake_state}; kill $sim; wait $sim; exit $rc",
        nvsim = keling_tests::nvsim_bin().display(),
        dev = sim.dev_dir(),
        log = log.display(),
        pidf = fake_pid.display(),
        wl = gwl(),
        fake_state = fake_state.display(),
    );
    std::fs::write(&forger_sh, forger).unwrap();
    let script = format!(
        "{wl} --dev-dir {dev} --scenario basic & real=$!; \
         unshare --mount --propagation private sh {forger} || exit 1; wait $real",
        wl = gwl(),
        dev = sim.dev_dir(),
        forger = forger_sh.display(),
    );
    let t = trace(&["--dev-dir", sim.dev_dir()], &["sh", "-c", &script]);
    assert_eq!(t.exit_code, 0, "keling: {}", t.stderr);
    // The forged driver really served the forger's calls...
    let fake: Value = serde_json::from_str(&std::fs::read_to_string(&fake_state).unwrap())
        .expect("the fake driver's state");
    let forger_pid: u64 = std::fs::read_to_string(&fake_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fake_figures = keling_tests::truth_figures(&fake);
    assert!(
        fake_figures
            .iter()
            .any(|((pid, _), f)| *pid == forger_pid && f[5] == 2),
        "the forger allocated twice on its fake driver: {fake_figures:?}"
    );
    // Both drivers started fresh and hand out handles from the same base, so the
    // forged replies named the real process's own client and memory handles...
    assert!(
        t.of_type("gpu_object")
            .any(|o| o["kind"] == "client" && o["handle"] == 0xc1d0_0000u32),
        "the real process's client has the first handle a fresh driver gives"
    );
    // ...and Keling saw none of them.
    let gpu_kinds = [
        "gpu_open",
        "gpu_alloc",
        "gpu_free",
        "gpu_object",
        "gpu_teardown",
        "gpu_ioctl",
    ];
    for kind in gpu_kinds {
        assert!(
            t.of_type(kind).all(|e| e["pid"] != forger_pid),
            "{kind} event from the forger"
        );
    }
    let p = t.process(forger_pid);
    assert_eq!(p["gpu_allocs"], 0, "{p}");
    assert_eq!(p["gpu_mem_peak_bytes"], 0, "{p}");
    assert_eq!(p["undecoded"], 0, "{p}");
    // The real process, at the same path at the same time, is exact.
    assert!(t.of_type("gpu_alloc").count() >= 2);
    converge(sim, &keling_figures(t.summary()), Duration::from_secs(3)).unwrap();
}

/// `keling trace --format jsonl --output OUT` of keling-gpu-workload (`--dev-dir`
/// the simulator's, then `args`), with the workload's stdin and stdout piped.
struct TracedWorkload {
    keling: ChildGuard,
    snapshots: Snapshots,
    to_wl: std::process::ChildStdin,
    from_wl: std::sync::mpsc::Receiver<String>,
}

impl TracedWorkload {
    fn start(sim: &Nvsim, out_path: &std::path::Path, args: &[&str]) -> TracedWorkload {
        let mut keling = ChildGuard(
            Command::new(keling_tests::keling_bin())
                .args(["trace", "--dev-dir", sim.dev_dir(), "--format", "jsonl"])
                .arg("--output")
                .arg(out_path)
                .args(["--", &gwl(), "--dev-dir", sim.dev_dir()])
                .args(args)
                .process_group(0)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        TracedWorkload {
            snapshots: Snapshots::new(keling.0.id() as i32, out_path),
            to_wl: keling.0.stdin.take().unwrap(),
            from_wl: lines_of(keling.0.stdout.take().unwrap()),
            keling,
        }
    }
}

/// Every line of a JSON-lines trace.
fn trace_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The lines a child writes, read on a thread so that a test waits for them with a
/// deadline instead of forever.
fn lines_of(out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Takes snapshots until Keling's figures equal the simulator's (or `limit` passes):
/// a release made by a process Keling does not watch is found by the kernel-side
/// sweep of orphaned files within milliseconds, not at once.
fn settled_snapshot(sim: &Nvsim, snapshots: &mut Snapshots, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let s = snapshots.take();
        match converge(sim, &keling_figures(&s), Duration::from_millis(50)) {
            Ok(()) => return s,
            Err(d) if Instant::now() > deadline => panic!("{what}: {d}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `keling trace -- keling-gpu-workload --scenario pass-server` and a second
/// workload, `receiver`, started outside the trace, both talking over one socket.
struct PassFd {
    dir: std::path::PathBuf,
    out_path: std::path::PathBuf,
    keling: ChildGuard,
    receiver: ChildGuard,
    receiver_pid: u64,
    server_pid: u64,
    snapshots: Snapshots,
    to_server: std::process::ChildStdin,
    from_server: std::sync::mpsc::Receiver<String>,
    to_receiver: std::process::ChildStdin,
    from_receiver: std::sync::mpsc::Receiver<String>,
}

fn expect_checkpoint(lines: &std::sync::mpsc::Receiver<String>, n: u32) {
    let line = lines
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no checkpoint {n}: {e}"));
    assert_eq!(line, format!("checkpoint {n}"));
}

impl PassFd {
    /// Starts both; returns once the server holds 4 + 6 MiB (checked against the
    /// simulator) and the receiver is connected and waiting.
    fn start(sim: &Nvsim, receiver: &str) -> PassFd {
        let dir = tempdir();
        let (out_path, socket) = (dir.join("trace.jsonl"), dir.join("pass.sock"));
        let side = |scenario: &str| {
            vec![
                gwl(),
                "--dev-dir".into(),
                sim.dev_dir().into(),
                "--scenario".into(),
                scenario.into(),
                "--socket".into(),
                socket.to_string_lossy().into_owned(),
                "--checkpoints".into(),
            ]
        };
        let socket_arg = socket.to_string_lossy().into_owned();
        let TracedWorkload {
            keling,
            mut snapshots,
            to_wl: to_server,
            from_wl: from_server,
        } = TracedWorkload::start(
            sim,
            &out_path,
            &[
                "--scenario",
                "pass-server",
                "--socket",
                &socket_arg,
                "--checkpoints",
            ],
        );
        expect_checkpoint(&from_server, 1);
        let s = settled_snapshot(sim, &mut snapshots, "allocated by the traced server");
        let server_pid = s["processes"][0]["pid"].as_u64().unwrap();
        let args = side(receiver);
        let mut rx = ChildGuard(
            Command::new(&args[0])
                .args(&args[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let to_receiver = rx.0.stdin.take().unwrap();
        let from_receiver = lines_of(rx.0.stdout.take().unwrap());
        PassFd {
            dir,
            out_path,
            receiver_pid: rx.0.id() as u64,
            keling,
            receiver: rx,
            server_pid,
            snapshots,
            to_server,
            from_server,
            to_receiver,
            from_receiver,
        }
    }

    fn server_step(&mut self, expect: u32) {
        self.to_server.write_all(b"\n").unwrap();
        expect_checkpoint(&self.from_server, expect);
    }

    fn receiver_step(&mut self, expect: u32) {
        self.to_receiver.write_all(b"\n").unwrap();
        expect_checkpoint(&self.from_receiver, expect);
    }

    /// Lets both finish; returns the trace's lines.
    fn finish(mut self, sim: &Nvsim) -> Vec<Value> {
        self.to_receiver.write_all(b"\n").unwrap();
        assert!(self.receiver.0.wait().unwrap().success());
        expect_checkpoint(&self.from_server, 3);
        self.to_server.write_all(b"\n").unwrap();
        assert!(self.keling.0.wait().unwrap().success());
        let lines = trace_lines(&self.out_path);
        converge(
            sim,
            &keling_figures(lines.last().unwrap()),
            Duration::from_secs(3),
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
        lines
    }
}

fn held(s: &Value, pid: u64) -> u64 {
    s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map_or(0, |p| p["gpu_mem_bytes"].as_u64().unwrap())
}

/// An nvidiactl fd goes over a unix socket from a traced process to a process
/// outside the trace, which frees the sender's memory through it, allocates its own,
/// moves the file to a dup'd fd and closes that: the last close, made outside the
/// trace, releases the file. Keling's figures equal the driver's at every step, and
/// the receiver, which used the file, is followed there: the release is its own.
#[test]
fn an_fd_passed_to_an_unrelated_process_is_followed_there() {
    let Some(fx) = Fixture::gpu(
        "an_fd_passed_to_an_unrelated_process_is_followed_there",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut p = PassFd::start(sim, "pass-client");
    // The server sends the file and closes its own fd; the receiver has it.
    p.server_step(2);
    expect_checkpoint(&p.from_receiver, 1);
    settled_snapshot(sim, &mut p.snapshots, "the file lives only in the receiver");
    // The server waits for the receiver to hang up.
    p.to_server.write_all(b"\n").unwrap();
    p.receiver_step(2);
    let s = settled_snapshot(sim, &mut p.snapshots, "the receiver freed and allocated");
    assert_eq!(held(&s, p.server_pid), 6 << 20, "{s}");
    assert_eq!(held(&s, p.receiver_pid), 2 << 20, "{s}");
    p.receiver_step(3);
    let s = settled_snapshot(sim, &mut p.snapshots, "the receiver's last close");
    assert_eq!(held(&s, p.server_pid), 0, "{s}");
    assert_eq!(held(&s, p.receiver_pid), 0, "{s}");
    let receiver = p.receiver_pid;
    let lines = p.finish(sim);
    let teardown = lines
        .iter()
        .find(|t| t["type"] == "gpu_teardown" && t["reason"] == "file_released")
        .expect("the file's release was seen");
    assert_eq!(teardown["pid"], receiver, "{teardown}");
}

/// The same, but the receiver never uses the fd: Keling never learns it has it.
/// When the receiver closes it, the file is released where Keling does not look;
/// the kernel-side sweep of orphaned files finds it, and the release is reported
/// with pid 0.
#[test]
fn a_file_released_outside_the_trace_is_found() {
    let Some(fx) = Fixture::gpu(
        "a_file_released_outside_the_trace_is_found",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let mut p = PassFd::start(sim, "pass-holder");
    p.server_step(2);
    expect_checkpoint(&p.from_receiver, 1);
    let s = settled_snapshot(sim, &mut p.snapshots, "the file lives only in the receiver");
    assert_eq!(held(&s, p.server_pid), 10 << 20, "{s}");
    p.to_server.write_all(b"\n").unwrap();
    p.receiver_step(2);
    let s = settled_snapshot(sim, &mut p.snapshots, "the receiver closed it");
    assert_eq!(held(&s, p.server_pid), 0, "{s}");
    let lines = p.finish(sim);
    let teardown = lines
        .iter()
        .find(|t| t["type"] == "gpu_teardown" && t["reason"] == "file_released")
        .expect("the file's release was seen");
    assert_eq!(teardown["pid"], 0, "{teardown}");
    assert_eq!(teardown["bytes"], 10 << 20, "{teardown}");
}

/// More NVIDIA fds than Keling's per-process table holds (40 against 32): the
/// overflow is counted where it happened (`table_full_at.fd_table`), never
/// silently, and the figures stay exact (accounting is by file): every call on
/// the extra fds is decoded, and the release of their files, by close or at exit,
/// is found by the orphan sweep, which watches them from their first fd past the
/// table. So nothing is held against the process (`undecoded` stays 0).
#[test]
fn more_fds_than_the_table_holds_are_counted_and_stay_exact() {
    let Some(fx) = Fixture::gpu(
        "more_fds_than_the_table_holds_are_counted_and_stay_exact",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let out_path = dir.join("trace.jsonl");
    let TracedWorkload {
        mut keling,
        mut snapshots,
        mut to_wl,
        from_wl,
    } = TracedWorkload::start(sim, &out_path, &["--scenario", "many-fds", "--checkpoints"]);
    expect_checkpoint(&from_wl, 1);
    // (The driver rounds each 1 MiB up to its page size: the simulator says how much.)
    let s = settled_snapshot(sim, &mut snapshots, "40 files with 1 MiB each");
    let p = &s["processes"][0];
    let pid = p["pid"].as_u64().unwrap();
    let each = held(&s, pid) / 40;
    assert!(each >= 1 << 20 && held(&s, pid) == 40 * each, "{s}");
    assert_eq!(
        p["undecoded"].as_u64().unwrap_or(0),
        0,
        "the fds past the table are watched, not lost: {p}"
    );
    to_wl.write_all(b"\n").unwrap();
    expect_checkpoint(&from_wl, 2);
    let s = settled_snapshot(sim, &mut snapshots, "six files closed, two past the table");
    assert_eq!(held(&s, pid), 34 * each, "{s}");
    to_wl.write_all(b"\n").unwrap();
    assert!(keling.0.wait().unwrap().success());
    let lines = trace_lines(&out_path);
    let summary = lines.last().unwrap();
    converge(sim, &keling_figures(summary), Duration::from_secs(3)).unwrap();
    assert_eq!(held(summary, pid), 0, "{summary}");
    let releases = lines
        .iter()
        .filter(|t| t["type"] == "gpu_teardown" && t["reason"] == "file_released")
        .count();
    assert_eq!(releases, 40, "every file's release was seen");
    assert!(
        summary["table_full_at"]["fd_table"].as_u64().unwrap_or(0) >= 8,
        "the summary says which table was full: {}",
        summary["table_full_at"]
    );
}

/// One open file that outlives many clients (20 made and freed, then 3 kept):
/// more than an open file's table of clients holds at once (8) over its life, but
/// never more alive. Nothing is counted as a full table, and the file's release
/// tears down exactly the 3 it still has.
#[test]
fn a_file_that_outlives_many_clients_keeps_room_for_new_ones() {
    let Some(fx) = Fixture::gpu(
        "a_file_that_outlives_many_clients_keeps_room_for_new_ones",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let out_path = fx.dir.join("trace.jsonl");
    let TracedWorkload {
        mut keling,
        mut snapshots,
        mut to_wl,
        from_wl,
    } = TracedWorkload::start(
        sim,
        &out_path,
        &["--scenario", "many-clients", "--checkpoints"],
    );
    expect_checkpoint(&from_wl, 1);
    let s = settled_snapshot(sim, &mut snapshots, "3 clients kept after 20 freed");
    let p = &s["processes"][0];
    let pid = p["pid"].as_u64().unwrap();
    assert!(held(&s, pid) >= 3 << 20, "{s}");
    assert_eq!(p["undecoded"].as_u64().unwrap_or(0), 0, "{p}");
    to_wl.write_all(b"\n").unwrap();
    expect_checkpoint(&from_wl, 2);
    let s = settled_snapshot(sim, &mut snapshots, "the file closed");
    assert_eq!(held(&s, pid), 0, "{s}");
    to_wl.write_all(b"\n").unwrap();
    assert!(keling.0.wait().unwrap().success());
    let lines = trace_lines(&out_path);
    let summary = lines.last().unwrap();
    converge(sim, &keling_figures(summary), Duration::from_secs(3)).unwrap();
    assert_eq!(
        summary["undecoded"]["table_full"], 0,
        "{}",
        summary["table_full_at"]
    );
    let released: Vec<&Value> = lines
        .iter()
        .filter(|t| t["type"] == "gpu_teardown" && t["reason"] == "file_released")
        .collect();
    assert_eq!(
        released.len(),
        3,
        "the 3 live clients, no freed one: {released:?}"
    );
}

/// Issue 32, defect 3: a process exits holding far more NVIDIA fds than Keling's
/// per-process table (and its table of orphaned files) holds: 120 nvidiactl files,
/// each with a client and 1 MiB on GPU 0 (a forked child; its parent, traced too,
/// lives on). Every file's release is found, and Keling's per-process and per-GPU
/// figures come back to exactly the simulator's, 0: no memory stays charged to the
/// dead process.
#[test]
fn a_process_exiting_with_a_hundred_and_twenty_nvidia_fds_leaves_no_ghost() {
    let Some(fx) = Fixture::gpu(
        "a_process_exiting_with_a_hundred_and_twenty_nvidia_fds_leaves_no_ghost",
        &["--gpus", "1"],
    ) else {
        return;
    };
    let sim = fx.sim();
    let out_path = fx.dir.join("trace.jsonl");
    let TracedWorkload {
        mut keling,
        mut snapshots,
        mut to_wl,
        from_wl,
    } = TracedWorkload::start(
        sim,
        &out_path,
        &["--scenario", "fd-flood", "--fds", "120", "--checkpoints"],
    );
    expect_checkpoint(&from_wl, 1);
    let s = settled_snapshot(sim, &mut snapshots, "120 files with 1 MiB each");
    let child = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .find(|&pid| held(&s, pid) > 0)
        .unwrap_or_else(|| panic!("the child holds memory: {s}"));
    let each = held(&s, child) / 120;
    assert!(each >= 1 << 20 && held(&s, child) == 120 * each, "{s}");
    to_wl.write_all(b"\n").unwrap();
    expect_checkpoint(&from_wl, 2);
    // The child is gone: Keling's figures equal the simulator's (settled_snapshot
    // waits for that, up to 3 s), and the simulator holds nothing for anyone.
    let s = settled_snapshot(sim, &mut snapshots, "the child exited holding 120 files");
    let truth = truth_figures(&sim.state());
    assert!(truth.values().all(|f| f[0] == 0 && f[4] == 0), "{truth:?}");
    assert_eq!(held(&s, child), 0, "{s}");
    for g in s["gpus"].as_array().into_iter().flatten() {
        assert_eq!(g["bytes"], 0, "GPU total after the exit: {g}");
    }
    to_wl.write_all(b"\n").unwrap();
    assert!(keling.0.wait().unwrap().success());
    let releases = trace_lines(&out_path)
        .iter()
        .filter(|t| t["type"] == "gpu_teardown" && t["reason"] == "file_released")
        .count();
    assert_eq!(releases, 120, "every file's release was seen");
}

/// The UVM calls whose layout moved between driver branches (MAP_EXTERNAL_ALLOCATION
/// and ALLOC_SEMAPHORE_POOL at 550.40.53, FREE at 590): for a simulated driver of
/// each branch, the status Keling reports for each is the one the driver wrote
/// where that branch has it (the workload checks it read the same there).
#[test]
fn uvm_statuses_are_read_where_each_branch_writes_them() {
    for version in ["535.261.03", "550.163.01", "590.44.01"] {
        let Some(fx) = Fixture::gpu(
            "uvm_statuses_are_read_where_each_branch_writes_them",
            &["--gpus", "1", "--driver-version", version],
        ) else {
            return;
        };
        let sim = fx.sim();
        let t = trace(
            &["--dev-dir", sim.dev_dir()],
            &[
                &gwl(),
                "--dev-dir",
                sim.dev_dir(),
                "--scenario",
                "uvm-status",
            ],
        );
        assert_eq!(t.exit_code, 0, "{version}: keling: {}", t.stderr);
        let status_of = |call: &str| -> Vec<u64> {
            t.of_type("gpu_ioctl")
                .filter(|e| e["call"] == call)
                .map(|e| e["status"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(
            status_of("UVM_MAP_EXTERNAL_ALLOCATION"),
            [0x1e],
            "{version}"
        );
        assert_eq!(status_of("UVM_ALLOC_SEMAPHORE_POOL"), [0], "{version}");
        assert_eq!(status_of("UVM_FREE"), [0x1e], "{version}");
        assert_eq!(
            t.summary()["undecoded"]
                .as_object()
                .map(|u| u.values().all(|v| v == 0)),
            Some(true),
            "{version}: {}",
            t.summary()
        );
    }
}
