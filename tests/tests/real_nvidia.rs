//! NVIDIA's own userspace as the judge: real libcuda, libnvidia-ml and nvidia-smi
//! (Debian's 535.261.03, unpacked by `cargo xtask setup`) run against the
//! simulated driver in `keling-nvsim sandbox`, traced by Keling with real eBPF.
//! What they report about the GPUs and the processes was computed by NVIDIA's
//! code, not ours; the simulator's counts of what it received are a second
//! independent view of what Keling saw.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use keling_tests::{
    ChildGuard, Fixture, Nvsim, cuda_probe_bin, gpu_workload_bin, keling_bin, nvidia_userspace_of,
    sandbox,
};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// What the simulated GPUs are given: an H200's 141 GiB.
const MEM_PER_GPU: u64 = 141 << 30;

/// A driver branch judged by NVIDIA's own userspace: the Debian version unpacked
/// by `cargo xtask setup` (the simulated driver reports the same version, so the
/// sandbox takes that branch's libraries) and what its libcuda says.
struct Branch {
    version: &'static str,
    /// cuDriverGetVersion: the CUDA version the branch provides.
    cuda: u64,
    /// Whether the driver's per-process figure (GET_PID_INFO, so NVML's)
    /// counts the memory under every device object of a client on the GPU
    /// (from 545), or only under its first (535).
    pid_info_every_device: bool,
    /// Whether its userspace is unpacked (records a skip if not).
    unpacked: fn(&str) -> bool,
}

const B535: Branch = Branch {
    version: "535.261.03",
    unpacked: |test| nvidia_userspace_of(test, "535.261.03").is_some(),
    cuda: 12020,
    pid_info_every_device: false,
};
const B550: Branch = Branch {
    version: "550.163.01",
    unpacked: |test| nvidia_userspace_of(test, "550.163.01").is_some(),
    cuda: 12040,
    pid_info_every_device: true,
};
const B555: Branch = Branch {
    version: "555.58.02",
    unpacked: |test| nvidia_userspace_of(test, "555.58.02").is_some(),
    cuda: 12050,
    pid_info_every_device: true,
};

/// Root, FUSE, NVIDIA's userspace unpacked, and the simulator as NVIDIA's 535
/// userspace expects it: two GPUs of `MEM_PER_GPU`.
fn fixture(test: &'static str) -> Option<Fixture> {
    fixture_of(test, &B535)
}

/// The same for `b`'s userspace and a simulated driver of its version.
fn fixture_of(test: &'static str, b: &Branch) -> Option<Fixture> {
    let version = b.version;
    Fixture::needs(test)
        .check(b.unpacked)
        .sim(&[
            "--gpus",
            "2",
            "--mem-per-gpu",
            &MEM_PER_GPU.to_string(),
            "--driver-version",
            version,
        ])
        .ready()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Runs `cmd` in the sandbox and returns its stdout; fails the test with
/// its stderr when it exits non-zero.
fn in_sandbox(sim: &Nvsim, cmd: &[&str]) -> String {
    let out = sandbox(sim, cmd)
        .output()
        .expect("run keling-nvsim sandbox");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} in the sandbox: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Reads the JSON lines of a trace file (a trace still running may have
/// half a line at the end: it is left out).
fn trace_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// (escape nr, UVM command, control command) -> calls, from the simulator's
/// `received` entry of `pid`.
type Counts = (BTreeMap<u64, u64>, BTreeMap<u64, u64>, BTreeMap<u64, u64>);

fn hex_map(v: &Value) -> BTreeMap<u64, u64> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| {
            let k = u64::from_str_radix(k.trim_start_matches("0x"), 16)
                .unwrap_or_else(|e| panic!("key {k}: {e}"));
            (k, n.as_u64().expect("count"))
        })
        .collect()
}

fn simulator_counts(state: &Value, pid: u64) -> Counts {
    let r = state["received"]
        .as_array()
        .expect("received")
        .iter()
        .find(|r| r["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("the simulator received nothing from pid {pid}"));
    (
        hex_map(&r["rm_escapes"]),
        hex_map(&r["uvm"]),
        hex_map(&r["controls"]),
    )
}

/// The same counts from Keling's trace summary.
fn keling_counts(summary: &Value) -> Counts {
    let by_number = |v: &Value| -> BTreeMap<u64, u64> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(_, e)| {
                (
                    e["nr"].as_u64().expect("nr"),
                    e["calls"].as_u64().expect("calls"),
                )
            })
            .collect()
    };
    (
        by_number(&summary["escapes"]),
        by_number(&summary["uvm_commands"]),
        hex_map(
            &summary["controls"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, e)| (k.clone(), e["calls"].clone()))
                .collect(),
        ),
    )
}

#[test]
fn cuda_driver_api_succeeds_under_keling_trace_with_every_call_decoded() {
    cuda_driver_api_under_keling_trace(
        "cuda_driver_api_succeeds_under_keling_trace_with_every_call_decoded",
        &B535,
    );
}

#[test]
fn cuda_driver_api_of_550_succeeds_under_keling_trace_with_every_call_decoded() {
    cuda_driver_api_under_keling_trace(
        "cuda_driver_api_of_550_succeeds_under_keling_trace_with_every_call_decoded",
        &B550,
    );
}

#[test]
fn cuda_driver_api_of_555_succeeds_under_keling_trace_with_every_call_decoded() {
    cuda_driver_api_under_keling_trace(
        "cuda_driver_api_of_555_succeeds_under_keling_trace_with_every_call_decoded",
        &B555,
    );
}

/// Real libcuda of branch `b` under `keling trace` against the simulated driver
/// of the same version: every CUDA call succeeds with the simulated GPUs' facts,
/// nothing is left undecoded and Keling's per-kind counts are the simulator's.
fn cuda_driver_api_under_keling_trace(test: &'static str, b: &Branch) {
    let Some(fx) = fixture_of(test, b) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let out = dir.join("trace.jsonl");
    let keling = s(&keling_bin());
    let probe = s(&cuda_probe_bin());
    let stdout = in_sandbox(
        sim,
        &[
            &keling,
            "trace",
            "--format",
            "jsonl",
            "--output",
            &s(&out),
            "--",
            &probe,
        ],
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("the probe printed no JSON: {stdout}"));
    let probe: Value = serde_json::from_str(line).expect("probe JSON");
    assert_eq!(probe["ok"], true, "a CUDA call failed: {probe}");
    assert_eq!(probe["count"], 2, "{probe}");
    // cuDriverGetVersion: the CUDA version the branch provides (12.2 for 535).
    assert_eq!(probe["driver_version"], b.cuda, "{probe}");
    for (i, d) in probe["devices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["name"], "NVIDIA H200", "{d}");
        assert_eq!(d["total_mem"].as_u64(), Some(MEM_PER_GPU), "{d}");
        assert_eq!(
            d["pci_bus_id"],
            format!("0000:{:02X}:00.0", 0x18 + i),
            "{d}"
        );
        let a = &d["attributes"];
        assert_eq!(
            (
                &a["compute_capability_major"],
                &a["compute_capability_minor"]
            ),
            (&Value::from(9), &Value::from(0)),
            "{d}"
        );
        assert_eq!(a["multiprocessor_count"], 132, "{d}");
        assert_eq!(a["pci_bus_id"], 0x18 + i, "{d}");
    }

    let lines = trace_lines(&out);
    let summary = lines.last().expect("trace output");
    assert_eq!(summary["type"], "summary", "{summary}");
    assert_eq!(summary["decode_errors"], 0, "{summary}");
    let undecoded = summary["undecoded"].as_object().expect("undecoded");
    assert!(
        undecoded.values().all(|v| v == 0),
        "Keling left calls of real libcuda undecoded: {undecoded:?}"
    );
    let pid = probe["pid"].as_u64().unwrap();
    let theirs = simulator_counts(&sim.state(), pid);
    let ours = keling_counts(summary);
    assert!(!theirs.2.is_empty(), "libcuda sent no control?");
    assert_eq!(ours.0, theirs.0, "RM escapes: Keling vs the simulator");
    assert_eq!(ours.1, theirs.1, "UVM commands: Keling vs the simulator");
    assert_eq!(ours.2, theirs.2, "RM controls: Keling vs the simulator");
}

/// nvidia-smi's answer to one query, as CSV rows without units.
fn smi_query(sim: &Nvsim, what: &str) -> Vec<Vec<String>> {
    in_sandbox(
        sim,
        &[
            "nvidia-smi",
            &format!("--query-{what}"),
            "--format=csv,noheader,nounits",
        ],
    )
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(|l| l.split(',').map(|f| f.trim().to_string()).collect())
    .collect()
}

#[test]
fn nvidia_smi_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps() {
    smi_and_keling_agree(
        "nvidia_smi_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps",
        &B535,
    );
}

#[test]
fn nvidia_smi_550_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps() {
    smi_and_keling_agree(
        "nvidia_smi_550_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps",
        &B550,
    );
}

#[test]
fn nvidia_smi_555_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps() {
    smi_and_keling_agree(
        "nvidia_smi_555_and_keling_agree_with_the_simulator_on_gpus_and_compute_apps",
        &B555,
    );
}

/// nvidia-smi and NVML of branch `b` against the simulated driver of the same
/// version, with a workload traced by Keling: the GPUs, their memory and the
/// compute app as the simulator has them, and real NVML's per-process figure
/// equal to Keling's by the branch's rule. The workload's client has a second
/// device object of its GPU with 100 MiB under it, and a video and a host
/// NV01_MEMORY_HW_RESOURCES object of 50 MiB each under its first: the exact
/// figures hold 400 MiB in every branch, NVML 350 MiB on 535 (the first device
/// object only, and the video HW_RESOURCES size) and 400 MiB from 550 (no
/// HW_RESOURCES).
fn smi_and_keling_agree(test: &'static str, b: &Branch) {
    let Some(fx) = fixture_of(test, b) else {
        return;
    };
    let sim = fx.sim();
    let dir = &fx.dir;
    let out = dir.join("trace.jsonl");
    // A process holding 300 MiB on GPU 1 with a compute object, traced by Keling
    // inside the sandbox, where Keling's NVML check uses the real libnvidia-ml.
    let keling = s(&keling_bin());
    let gwl = s(&gpu_workload_bin());
    let mut child = sandbox(
        sim,
        &[
            &keling,
            "trace",
            "--format",
            "jsonl",
            "--output",
            &s(&out),
            "--",
            &gwl,
            "--dev-dir",
            "/dev",
            "--scenario",
            "compute",
            "--use-gpu",
            "1",
            "--alloc-mib",
            "300",
            "--second-device-mib",
            "100",
            "--hw-resources-mib",
            "50",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the traced workload");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let guard = ChildGuard(child);
    let mut pid = None;
    let mut unknown = None;
    let mut line = String::new();
    while pid.is_none() && stdout.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some(v) = line.trim().strip_prefix("unknown_control_status ") {
            unknown = Some(v.to_string());
        }
        if let Some(v) = line.trim().strip_prefix("ready ") {
            pid = v.parse::<u64>().ok();
        }
        line.clear();
    }
    let pid = pid.expect("the workload never said ready");
    // A control no driver defines: the driver's refusal, NV_ERR_NOT_SUPPORTED.
    assert_eq!(unknown.as_deref(), Some("0x56"));

    let state = sim.state();
    let truth = state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .expect("the simulator knows the workload")["gpus"][0]
        .clone();
    assert_eq!(truth["gpu"], 1);
    assert_eq!(truth["bytes"].as_u64(), Some(400 * MIB));
    assert_eq!(truth["driver_video_bytes"].as_u64(), Some(400 * MIB));
    let nvml_mib = if b.pid_info_every_device {
        400
    } else {
        300 + 50
    };
    assert_eq!(
        truth["pid_info_video_bytes"].as_u64(),
        Some(nvml_mib * MIB),
        "{truth}"
    );

    let listed = in_sandbox(sim, &["nvidia-smi", "-L"]);
    let gpus: Vec<&str> = listed.lines().filter(|l| l.starts_with("GPU ")).collect();
    assert_eq!(gpus.len(), 2, "{listed}");
    assert!(
        gpus[0].starts_with("GPU 0: NVIDIA H200 (UUID: GPU-"),
        "{listed}"
    );

    let rows = smi_query(sim, "gpu=index,name,memory.total,memory.used");
    assert_eq!(rows.len(), 2, "{rows:?}");
    let used_truth: Vec<u64> = state["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["used_bytes"].as_u64().unwrap())
        .collect();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], i.to_string(), "{rows:?}");
        assert_eq!(r[1], "NVIDIA H200", "{rows:?}");
        assert_eq!(r[2], (MEM_PER_GPU / MIB).to_string(), "{rows:?}");
        assert_eq!(r[3], (used_truth[i] / MIB).to_string(), "{rows:?}");
    }

    let apps = smi_query(sim, "compute-apps=pid,used_memory,gpu_bus_id,gpu_uuid");
    let gpu1_uuid = gpus[1]
        .split("UUID: ")
        .nth(1)
        .and_then(|u| u.strip_suffix(')'))
        .unwrap_or_else(|| panic!("GPU 1's UUID in {listed}"));
    // From 550 NVML finds the bus id in /sys/bus/pci/devices (the sandbox's).
    let bus_id = "00000000:19:00.0";
    assert_eq!(
        apps,
        vec![vec![
            pid.to_string(),
            nvml_mib.to_string(),
            bus_id.to_string(),
            gpu1_uuid.to_string(),
        ]],
        "nvidia-smi's compute apps"
    );
    let full = in_sandbox(sim, &["nvidia-smi", "-q"]);
    assert!(
        full.contains("NVIDIA H200") && full.contains("Attached GPUs"),
        "{full}"
    );
    let bus_ids: Vec<&str> = full
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Bus Id"))
        .map(|v| v.trim_start_matches([' ', ':']))
        .collect();
    assert_eq!(bus_ids, ["00000000:18:00.0", bus_id], "{full}");

    // Keling's NVML cross-check (every 5 s) inside the sandbox: the real
    // libnvidia-ml's figure for the workload equals Keling's figure by the
    // branch's rule; Keling's driver figure holds both device objects' memory.
    let deadline = Instant::now() + Duration::from_secs(20);
    let check = loop {
        if let Some(c) = trace_lines(&out)
            .into_iter()
            .filter(|l| l["type"] == "nvml_check")
            .find(|l| {
                l["processes"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["pid"].as_u64() == Some(pid)))
            })
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no nvml_check naming the workload within 20 s: {:?}",
            trace_lines(&out)
                .iter()
                .filter(|l| l["type"] == "nvml_check")
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mine: Vec<&Value> = check["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(pid))
        .collect();
    assert_eq!(mine.len(), 1, "{check}");
    assert_eq!(mine[0]["gpu"], 1, "{check}");
    assert_eq!(
        mine[0]["nvml_bytes"].as_u64(),
        Some(nvml_mib * MIB),
        "{check}"
    );
    assert_eq!(
        mine[0]["keling_nvml_rule_bytes"].as_u64(),
        Some(nvml_mib * MIB),
        "{check}"
    );
    assert_eq!(
        mine[0]["keling_driver_bytes"].as_u64(),
        Some(400 * MIB),
        "{check}"
    );
    assert_eq!(mine[0]["diff_bytes"], 0, "{check}");

    writeln!(stdin, "done").unwrap();
    drop(stdin);
    let mut child = guard;
    let status = child.0.wait().expect("wait for the trace");
    assert!(status.success(), "keling trace: {status}");
    let summary = trace_lines(&out).pop().expect("trace output");
    assert_eq!(summary["type"], "summary");
    assert!(
        summary["undecoded"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v == 0),
        "{summary}"
    );
}

/// The mount points of this (the host's) mount namespace.
fn host_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(|l| l.split(' ').nth(4).unwrap_or("").to_string())
        .collect()
}

#[test]
fn the_sandbox_returns_its_commands_code_and_leaves_nothing_behind_a_sigkill() {
    let Some(fx) =
        fixture("the_sandbox_returns_its_commands_code_and_leaves_nothing_behind_a_sigkill")
    else {
        return;
    };
    let sim = fx.sim();
    let before = host_mounts();
    let host_nodes = |paths: &[&str]| -> Vec<bool> {
        paths
            .iter()
            .map(|p| std::fs::symlink_metadata(p).is_ok())
            .collect()
    };
    let watched = ["/dev/nvidia-stray", "/dev/nvidiactl", "/dev/nvidia0"];
    let nodes_before = host_nodes(&watched);
    let status = sandbox(sim, &["sh", "-c", "exit 7"]).status().unwrap();
    assert_eq!(status.code(), Some(7));
    // Inside: the simulator's files are character devices to NVIDIA's libraries
    // only (the shim); a node made there lands in the sandbox's own /dev.
    let mut child = sandbox(
        sim,
        &[
            "sh",
            "-c",
            "mknod /dev/nvidia-stray c 195 254 && test -e /sys/module/nvidia/initstate \
             && grep -q 'ModifyDeviceFiles: 0' /proc/driver/nvidia/params && echo up && exec sleep 60",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut up = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut up)
        .unwrap();
    assert_eq!(up.trim(), "up");
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), None, "killed by a signal");
    assert_eq!(host_mounts(), before, "mounts changed on the host");
    assert_eq!(
        host_nodes(&watched),
        nodes_before,
        "{watched:?} on the host"
    );
    // nvidia-smi as root inside makes no node on the host either.
    let _ = Command::new(keling_tests::nvsim_bin())
        .args(["sandbox", sim.dev_dir(), "--", "nvidia-smi", "-L"])
        .output()
        .unwrap();
    assert_eq!(
        host_nodes(&watched),
        nodes_before,
        "{watched:?} on the host"
    );
    assert_eq!(host_mounts(), before, "mounts changed on the host");
}

#[test]
fn a_device_node_with_no_driver_behind_it_is_named_as_such() {
    let Some(fx) = Fixture::new("a_device_node_with_no_driver_behind_it_is_named_as_such") else {
        return;
    };
    if Path::new("/proc/driver/nvidia/version").exists() {
        keling_tests::skip(
            fx.name,
            "this host has an NVIDIA driver: a node here would not be dead",
        );
        return;
    }
    // What libcuda run as root on a host without the driver leaves: 195:255.
    let dir = &fx.dir;
    let node = dir.join("nvidiactl");
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: mknod with a valid path; the node is removed below.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, 255)) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    let out = Command::new(keling_bin())
        .args(["trace", "--dev-dir", dir.to_str().unwrap(), "--", "true"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("is a device node with no NVIDIA driver behind it (open: "),
        "{said}"
    );
}

/// Where NVIDIA's kernel modules are loaded and kprobes attach: the driver-entry
/// backend (`--ioctl-backend driver-entry`) sees what the ioctl tracepoints see
/// for a real CUDA program (the driver-API probe on the host's own libcuda and
/// GPUs), every call decoded by both. Elsewhere (this project's CI machines have
/// neither) it says why it skips; the GPU check (`cargo xtask gpu-check`) runs
/// its PyTorch job under both backends too.
#[test]
fn the_driver_entry_backend_sees_what_the_tracepoints_see() {
    let test = "the_driver_entry_backend_sees_what_the_tracepoints_see";
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    if !kallsyms
        .lines()
        .any(|l| l.contains(" nvidia_unlocked_ioctl") && l.ends_with("[nvidia]"))
    {
        keling_tests::skip(test, "no nvidia module");
        return;
    }
    let Some(fx) = Fixture::needs(test).ready() else {
        return;
    };
    let probe = s(&cuda_probe_bin());
    // cuInit loads nvidia-uvm, which the driver entry needs when Keling starts.
    let warm = Command::new(&probe).output().expect("run the CUDA probe");
    assert!(
        warm.status.success(),
        "the CUDA probe failed untraced: {warm:?}"
    );
    let mut seen = Vec::new();
    for backend in ["driver-entry", "tracepoints"] {
        let out = fx.dir.join(format!("{backend}.jsonl"));
        let run = Command::new(keling_bin())
            .args([
                "trace",
                "--ioctl-backend",
                backend,
                "--format",
                "jsonl",
                "--output",
            ])
            .arg(&out)
            .args(["--", &probe])
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "keling trace --ioctl-backend {backend}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let lines = trace_lines(&out);
        let summary = lines.last().expect("trace output").clone();
        assert_eq!(summary["ioctl_backend"], backend, "{summary}");
        assert!(
            summary["undecoded"]
                .as_object()
                .expect("undecoded")
                .values()
                .all(|v| v == 0),
            "{backend}: {}",
            summary["undecoded"]
        );
        let (escapes, uvm, controls) = keling_counts(&summary);
        assert!(!escapes.is_empty(), "{backend} saw no NVIDIA call");
        let kinds = |m: &BTreeMap<u64, u64>| m.keys().copied().collect::<Vec<u64>>();
        seen.push((kinds(&escapes), kinds(&uvm), kinds(&controls)));
    }
    assert_eq!(
        seen[0], seen[1],
        "the escapes, UVM commands and controls the driver entry saw, then the tracepoints"
    );
}
