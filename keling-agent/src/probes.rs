//! Loads Keling's eBPF programs into the kernel and owns them while they run.
//!
//! This module knows which programs exist, what they attach to, and what the
//! kernel must provide for them; it hands out the maps the rest of the agent needs
//! and nothing else. Dropping [`Probes`] detaches everything.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::PathBuf,
};

use anyhow::{Context, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{RawTracePoint, TracePoint},
};
use keling_common::{
    DEV_PREFIX_LEN, DROP_COUNTERS, GLOBAL_CONFIG, MAP_DROPS, MAP_EVENTS, MAP_TOTALS,
    MAP_TRACKED_PIDS, MAP_TRACKED_TIDS, MAP_UNDECODED, MAP_UNDECODED_PID, ProbeConfig, TotalKey,
    Totals, TrackedProcess, nvidia, undecoded,
};

use crate::{btf::Btf, sys};

/// The compiled eBPF object (`cargo xtask build` puts it there; empty when the agent
/// was built with a plain `cargo build`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/keling.bpf.o"));

/// What to load.
pub struct LoadOptions {
    /// Report fork/exec/exit of every process, not only tracked ones, and track
    /// every process that opens an NVIDIA device.
    pub system_wide: bool,
    /// Size of the event ring buffer (a power of two, multiple of the page size).
    pub ringbuf_bytes: u32,
    /// Where the NVIDIA device files are (`/dev`, or a simulator's mount).
    pub dev_dir: PathBuf,
    /// The driver's major version, which selects the NVOS21 layout.
    pub driver_major: u32,
}

/// The loaded, attached programs and their maps.
pub struct Probes {
    ebpf: Ebpf,
}

/// (program name, kind): the raw tracepoint gets the fork arguments as
/// `task_struct` pointers, the others are classic tracepoints.
const PROGRAMS: &[(&str, Attach)] = &[
    ("sched_process_fork", Attach::Raw("sched_process_fork")),
    (
        "sched_process_exec",
        Attach::Tracepoint("sched", "sched_process_exec"),
    ),
    (
        "sched_process_exit",
        Attach::Tracepoint("sched", "sched_process_exit"),
    ),
    ("sched_switch", Attach::Tracepoint("sched", "sched_switch")),
    (
        "sys_enter_openat",
        Attach::Tracepoint("syscalls", "sys_enter_openat"),
    ),
    (
        "sys_exit_openat",
        Attach::Tracepoint("syscalls", "sys_exit_openat"),
    ),
    (
        "sys_enter_close",
        Attach::Tracepoint("syscalls", "sys_enter_close"),
    ),
    (
        "sys_enter_close_range",
        Attach::Tracepoint("syscalls", "sys_enter_close_range"),
    ),
    (
        "sys_enter_dup",
        Attach::Tracepoint("syscalls", "sys_enter_dup"),
    ),
    (
        "sys_exit_dup",
        Attach::Tracepoint("syscalls", "sys_exit_dup"),
    ),
    (
        "sys_enter_dup2",
        Attach::Tracepoint("syscalls", "sys_enter_dup2"),
    ),
    (
        "sys_exit_dup2",
        Attach::Tracepoint("syscalls", "sys_exit_dup2"),
    ),
    (
        "sys_enter_dup3",
        Attach::Tracepoint("syscalls", "sys_enter_dup3"),
    ),
    (
        "sys_exit_dup3",
        Attach::Tracepoint("syscalls", "sys_exit_dup3"),
    ),
    (
        "sys_enter_fcntl",
        Attach::Tracepoint("syscalls", "sys_enter_fcntl"),
    ),
    (
        "sys_exit_fcntl",
        Attach::Tracepoint("syscalls", "sys_exit_fcntl"),
    ),
    (
        "sys_enter_ioctl",
        Attach::Tracepoint("syscalls", "sys_enter_ioctl"),
    ),
    (
        "sys_exit_ioctl",
        Attach::Tracepoint("syscalls", "sys_exit_ioctl"),
    ),
];

enum Attach {
    Raw(&'static str),
    Tracepoint(&'static str, &'static str),
}

/// Offsets this kernel needs, from BTF and the tracepoints' format files.
fn probe_config(opts: &LoadOptions) -> anyhow::Result<ProbeConfig> {
    let tracefs = sys::ensure_tracefs()?;
    let btf = Btf::from_sys_fs()?;
    let task = |m: &str| {
        btf.member_offset("task_struct", m)
            .with_context(|| format!("task_struct.{m}"))
    };
    let exit = sys::TracepointFormat::read(&tracefs, "sched", "sched_process_exit")?;
    let prefix = opts.dev_dir.join("nvidia");
    let prefix = prefix.as_os_str().as_encoded_bytes();
    if prefix.len() >= DEV_PREFIX_LEN {
        bail!(
            "--dev-dir {} is too long: the probes match device paths of at most {} bytes",
            opts.dev_dir.display(),
            DEV_PREFIX_LEN - 10
        );
    }
    let mut dev_prefix = [0u8; DEV_PREFIX_LEN];
    dev_prefix[..prefix.len()].copy_from_slice(prefix);
    let dev_prefix_len = prefix.len() as u32;
    let switch = sys::TracepointFormat::read(&tracefs, "sched", "sched_switch")?;
    let exec = sys::TracepointFormat::read(&tracefs, "sched", "sched_process_exec")?;
    Ok(ProbeConfig {
        task_pid_off: task("pid")?,
        task_tgid_off: task("tgid")?,
        task_exit_code_off: task("exit_code")?,
        exit_group_dead_off: exit.offset("group_dead").unwrap_or(0),
        switch_prev_pid_off: switch.require("sched_switch", "prev_pid")?,
        switch_prev_state_off: switch.require("sched_switch", "prev_state")?,
        switch_next_pid_off: switch.require("sched_switch", "next_pid")?,
        exec_filename_off: exec.require("sched_process_exec", "filename")?,
        exec_old_pid_off: exec.require("sched_process_exec", "old_pid")?,
        system_wide: opts.system_wide as u32,
        nvos21_status_off: if opts.driver_major >= nvidia::NVOS21_PARAMS_SIZE_SINCE_MAJOR {
            nvidia::nvos21::STATUS as u32
        } else {
            nvidia::nvos21::STATUS_PRE_535 as u32
        },
        dev_prefix_len,
        dev_prefix,
    })
}

impl Probes {
    pub fn load(opts: &LoadOptions) -> anyhow::Result<Self> {
        if EBPF_OBJECT.is_empty() {
            bail!(
                "this keling binary was built without its eBPF programs (a plain `cargo build`); \
                 build it with `cargo xtask build` or run it with `cargo xtask run`"
            );
        }
        sys::check_privileges()?;
        sys::raise_memlock();
        let config = probe_config(opts)?;
        log::debug!("probe config: {config:?}");
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_CONFIG, &config, true)
            .map_max_entries(MAP_EVENTS, opts.ringbuf_bytes)
            .load(EBPF_OBJECT)
            .context("loading Keling's eBPF object into the kernel")?;
        // The file-release program is reached only by tail call: load it and put
        // it in RELEASE_PROG before anything that can close a file is attached.
        {
            let prog: &mut TracePoint = ebpf
                .program_mut("release_files")
                .context("program release_files missing")?
                .try_into()?;
            prog.load().context("verifier rejected release_files")?;
            let fd = prog.fd()?.try_clone()?;
            let mut array = ProgramArray::try_from(
                ebpf.map_mut("RELEASE_PROG")
                    .context("RELEASE_PROG map missing")?,
            )?;
            array.set(0, &fd, 0)?;
        }
        for (name, attach) in PROGRAMS {
            let prog = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing"))?;
            let what = match attach {
                Attach::Raw(tp) => {
                    let p: &mut RawTracePoint = prog.try_into()?;
                    p.load()
                        .with_context(|| format!("verifier rejected {name}"))?;
                    p.attach(tp).map(drop)
                }
                Attach::Tracepoint(cat, tp) => {
                    let p: &mut TracePoint = prog.try_into()?;
                    p.load()
                        .with_context(|| format!("verifier rejected {name}"))?;
                    p.attach(cat, tp).map(drop)
                }
            };
            what.with_context(|| format!("attaching {name}"))?;
        }
        Ok(Self { ebpf })
    }

    /// Takes the event ring buffer (once) for the reader task.
    pub fn take_events(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(MAP_EVENTS)
            .context("EVENTS map already taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Tracks `pid` and every thread it has now; its future children are tracked by
    /// the kernel from their fork. `root` is the process the user asked for.
    pub fn track(&mut self, pid: u32, root: u32) -> anyhow::Result<()> {
        let mut pids: HashMap<_, u32, TrackedProcess> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_TRACKED_PIDS)
                .context("TRACKED_PIDS")?,
        )?;
        pids.insert(
            pid,
            TrackedProcess {
                root_pid: root,
                flags: 0,
            },
            0,
        )?;
        // Listed after the pid is in the map: a thread created from now on is added
        // by the fork probe, so none falls between the two.
        let threads = threads_of(pid)?;
        let mut tids: HashMap<_, u32, u32> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_TRACKED_TIDS)
                .context("TRACKED_TIDS")?,
        )?;
        for tid in threads {
            tids.insert(tid, pid, 0)?;
        }
        Ok(())
    }

    /// How many processes the kernel still tracks (it removes them as they exit).
    pub fn tracked_processes(&self) -> anyhow::Result<usize> {
        let pids: HashMap<_, u32, TrackedProcess> =
            HashMap::try_from(self.ebpf.map(MAP_TRACKED_PIDS).context("TRACKED_PIDS")?)?;
        Ok(pids.keys().filter(|k| k.is_ok()).count())
    }

    /// Events lost because the ring buffer was full, per CPU.
    pub fn drops_per_cpu(&self) -> anyhow::Result<Vec<u64>> {
        let drops: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(MAP_DROPS).context("DROPS")?)?;
        let mut per_cpu: Vec<u64> = Vec::new();
        for reason in 0..DROP_COUNTERS {
            let values = drops.get(&reason, 0)?;
            if per_cpu.len() < values.len() {
                per_cpu.resize(values.len(), 0);
            }
            for (cpu, v) in values.iter().enumerate() {
                per_cpu[cpu] += v;
            }
        }
        Ok(per_cpu)
    }
}

/// Exact GPU figures read from the kernel's maps.
#[derive(Clone, Debug, Default)]
pub struct GpuAccounting {
    /// (pid, gpu) -> totals; gpu [`ALL_GPUS`] is the process total, pid 0 the device.
    pub totals: BTreeMap<(u32, u32), Totals>,
    /// Undecoded or faulted calls per process.
    pub undecoded_per_pid: BTreeMap<u32, u64>,
    /// Undecoded calls per reason (see `keling_common::undecoded`).
    pub undecoded_per_reason: Vec<u64>,
}

impl Probes {
    /// A consistent-enough snapshot of the GPU accounting maps (each entry is read
    /// atomically; entries may move between two reads while ioctls are running).
    pub fn gpu_accounting(&self) -> anyhow::Result<GpuAccounting> {
        let totals: HashMap<_, TotalKey, Totals> =
            HashMap::try_from(self.ebpf.map(MAP_TOTALS).context("TOTALS")?)?;
        let undecoded_pid: HashMap<_, u32, u64> =
            HashMap::try_from(self.ebpf.map(MAP_UNDECODED_PID).context("UNDECODED_PID")?)?;
        let per_reason: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(MAP_UNDECODED).context("UNDECODED")?)?;
        let mut acc = GpuAccounting::default();
        for entry in totals.iter() {
            let (k, v) = entry?;
            acc.totals.insert((k.pid, k.gpu), v);
        }
        for entry in undecoded_pid.iter() {
            let (pid, n) = entry?;
            acc.undecoded_per_pid.insert(pid, n);
        }
        for reason in 0..undecoded::COUNT {
            acc.undecoded_per_reason
                .push(per_reason.get(&reason, 0)?.iter().sum());
        }
        Ok(acc)
    }
}

/// Thread ids of a live process, from /proc.
fn threads_of(pid: u32) -> anyhow::Result<BTreeSet<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = fs::read_dir(&dir).with_context(|| format!("no process {pid} ({dir})"))?;
    Ok(entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}
