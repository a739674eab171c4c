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
    DEV_PREFIX_LEN, DROP_COUNTERS, FD_SLOTS, FdSlot, FileInfo, GLOBAL_CONFIG, MAP_DROPS,
    MAP_EVENTS, MAP_FILES, MAP_PROC_FDS, MAP_TOTALS, MAP_TRACKED_PIDS, MAP_TRACKED_TIDS,
    MAP_UNDECODED, MAP_UNDECODED_PID, ProbeConfig, ProcFds, TotalKey, Totals, TrackedProcess,
    nvidia, undecoded,
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
        wakeup_bytes: opts.ringbuf_bytes / 4,
        _reserved: 0,
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

/// An NVIDIA fd a process had open before the probes were loaded.
struct ExistingFd {
    pid: u32,
    fd: i32,
    device: u32,
    cloexec: bool,
}

/// kcmp(2): whether two fds (in two processes) are the same open file description.
fn same_file(a: &ExistingFd, b: &ExistingFd) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects; bad pids or fds give an error.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            a.pid as libc::c_long,
            b.pid as libc::c_long,
            KCMP_FILE,
            a.fd as libc::c_long,
            b.fd as libc::c_long,
        )
    };
    r == 0
}

/// The NVIDIA fds of process `pid` under `dev_dir`, from /proc.
fn existing_fds(pid: u32, dev_dir: &std::path::Path) -> Vec<ExistingFd> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: i32 = e.file_name().to_str()?.parse().ok()?;
        let target = fs::read_link(e.path()).ok()?;
        let device = crate::gpu_env::device_file_of(dev_dir, &target)?;
        let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(0);
        Some(ExistingFd {
            pid,
            fd,
            device,
            cloexec: flags & libc::O_CLOEXEC as u32 != 0,
        })
    })
    .collect()
}

impl Probes {
    /// Finds NVIDIA fds opened before the probes were loaded (in `pids`, or in every
    /// process when `None`) and enters them in the kernel's fd and file maps, so
    /// their closes and the release of their files are followed from now on.
    /// Objects created on them before now are unknown: frees of those are counted
    /// as undecoded (`unknown_object`). Returns the processes found.
    pub fn adopt_existing_fds(
        &mut self,
        dev_dir: &std::path::Path,
        pids: Option<&[u32]>,
        track: bool,
    ) -> anyhow::Result<BTreeSet<u32>> {
        let all: Vec<u32> = match pids {
            Some(p) => p.to_vec(),
            None => fs::read_dir("/proc")?
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&p: &u32| p != std::process::id())
                .collect(),
        };
        let fds: Vec<ExistingFd> = all.iter().flat_map(|&p| existing_fds(p, dev_dir)).collect();
        // Group fds by open file description.
        let mut file_of: Vec<usize> = Vec::with_capacity(fds.len());
        let mut files: Vec<usize> = Vec::new(); // index of each file's first fd
        for (i, fd) in fds.iter().enumerate() {
            match files.iter().position(|&first| same_file(&fds[first], fd)) {
                Some(f) => file_of.push(f),
                None => {
                    files.push(i);
                    file_of.push(files.len() - 1);
                }
            }
        }
        // Ids from the top half, which the kernel's counter never reaches.
        let id = |f: usize| (1u64 << 63) | (std::process::id() as u64) << 20 | f as u64;
        let mut file_map: HashMap<_, u64, FileInfo> =
            HashMap::try_from(self.ebpf.map_mut(MAP_FILES).context("FILES")?)?;
        for (f, &first) in files.iter().enumerate() {
            let refs = file_of.iter().filter(|&&x| x == f).count() as u32;
            let info = FileInfo {
                refs,
                device: fds[first].device,
                opener_pid: fds[first].pid,
                ..Default::default()
            };
            file_map.insert(id(f), info, 0)?;
        }
        let mut found = BTreeSet::new();
        let mut proc_fds: HashMap<_, u32, ProcFds> =
            HashMap::try_from(self.ebpf.map_mut(MAP_PROC_FDS).context("PROC_FDS")?)?;
        let mut tables: BTreeMap<u32, ProcFds> = BTreeMap::new();
        for (i, fd) in fds.iter().enumerate() {
            let table = tables.entry(fd.pid).or_insert(ProcFds {
                slots: [FdSlot::default(); FD_SLOTS],
            });
            if let Some(slot) = table.slots.iter_mut().find(|s| s.file_id == 0) {
                *slot = FdSlot {
                    fd: fd.fd,
                    device: fd.device,
                    file_id: id(file_of[i]),
                    cloexec: fd.cloexec as u32,
                    _reserved: 0,
                };
            } else {
                log::warn!(
                    "process {} has more than {FD_SLOTS} NVIDIA fds; fd {} is not followed",
                    fd.pid,
                    fd.fd
                );
            }
            found.insert(fd.pid);
        }
        for (pid, table) in &tables {
            proc_fds.insert(pid, table, 0)?;
        }
        if track {
            for &pid in &found {
                self.track(pid, pid)?;
            }
        }
        if !found.is_empty() {
            log::info!(
                "adopted {} NVIDIA fds ({} open files) of {} processes that had them before Keling started; \
                 memory they allocated before now is not in Keling's totals",
                fds.len(),
                files.len(),
                found.len()
            );
        }
        Ok(found)
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
