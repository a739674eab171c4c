//! Loads Keling's eBPF programs into the kernel and owns them while they run.
//!
//! This module knows which programs exist ([`programs`]), what they attach to, and
//! what the kernel must provide for them (offsets from [`btf`] and [`tracefs`]); it
//! hands out the maps the rest of the agent needs and nothing else. Dropping
//! [`Probes`] detaches everything.
use std::collections::{BTreeMap, BTreeSet};

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

use self::{
    btf::Btf,
    programs::{Attach, Feature, PROGRAMS, RELEASE_PROG_MAP, RELEASE_PROGRAM},
    tracefs::TracepointFormat,
};
use crate::gpu::{env::GpuArgs, stats::GpuAccounting};

pub mod btf;
pub mod programs;
pub mod tracefs;

/// The compiled eBPF object (`cargo xtask build` puts it there; empty when the agent
/// was built with a plain `cargo build`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/keling.bpf.o"));

/// Test hook: programs named here (comma-separated) are treated as if this kernel
/// could not attach them, so the degraded paths can be tested on a kernel that has
/// every tracepoint.
pub const SKIP_PROGRAMS_ENV: &str = "KELING_SKIP_PROGRAMS";

/// What to load.
pub struct LoadOptions {
    /// Report fork/exec/exit of every process, not only tracked ones, and track
    /// every process that opens an NVIDIA device.
    pub system_wide: bool,
    /// Size of the event ring buffer (a power of two, multiple of the page size).
    pub ringbuf_bytes: u32,
    /// Where the NVIDIA device files are (`/dev`, or a simulator's mount).
    pub dev_dir: std::path::PathBuf,
    /// The driver's major version, which selects the NVOS21 layout.
    pub driver_major: u32,
    /// Features whose programs must attach; the others are skipped with a warning
    /// when this kernel cannot attach them.
    pub required: &'static [Feature],
}

impl LoadOptions {
    /// The options for a command that traces GPU processes with `gpu`'s settings.
    pub fn new(
        gpu: &GpuArgs,
        system_wide: bool,
        ringbuf_kib: u32,
        required: &'static [Feature],
    ) -> anyhow::Result<Self> {
        gpu.check_dev_dir()?;
        Ok(Self {
            system_wide,
            ringbuf_bytes: ringbuf_kib.saturating_mul(1024),
            dev_dir: gpu.dev_dir.clone(),
            driver_major: gpu.driver_major()?,
            required,
        })
    }
}

/// The loaded, attached programs and their maps.
pub struct Probes {
    ebpf: Ebpf,
    /// Features with a program this kernel could not attach.
    pub degraded: BTreeSet<Feature>,
}

/// Offsets this kernel needs, from BTF and the tracepoints' format files.
fn probe_config(opts: &LoadOptions) -> anyhow::Result<ProbeConfig> {
    let tracefs = tracefs::ensure_mounted()?;
    let btf = Btf::from_sys_fs()?;
    let task = |m: &str| {
        btf.member_offset("task_struct", m)
            .with_context(|| format!("task_struct.{m}"))
    };
    let exit = TracepointFormat::read(&tracefs, "sched", "sched_process_exit")?;
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
    let switch = TracepointFormat::read(&tracefs, "sched", "sched_switch")?;
    let exec = TracepointFormat::read(&tracefs, "sched", "sched_process_exec")?;
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
        crate::os::check_privileges()?;
        crate::os::raise_memlock();
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
                .program_mut(RELEASE_PROGRAM)
                .with_context(|| format!("program {RELEASE_PROGRAM} missing"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("verifier rejected {RELEASE_PROGRAM}"))?;
            let fd = prog.fd()?.try_clone()?;
            let mut array = ProgramArray::try_from(
                ebpf.map_mut(RELEASE_PROG_MAP)
                    .with_context(|| format!("{RELEASE_PROG_MAP} map missing"))?,
            )?;
            array.set(0, &fd, 0)?;
        }
        let skip = std::env::var(SKIP_PROGRAMS_ENV).unwrap_or_default();
        let skip: BTreeSet<&str> = skip.split(',').filter(|s| !s.is_empty()).collect();
        let mut degraded = BTreeSet::new();
        for p in PROGRAMS {
            let attached = if skip.contains(p.name) {
                Err(anyhow::anyhow!("skipped by {SKIP_PROGRAMS_ENV}"))
            } else {
                attach(&mut ebpf, p.name, p.attach)
            };
            if let Err(e) = attached {
                if opts.required.contains(&p.feature) {
                    return Err(e.context(format!(
                        "program {} is required for what was asked and cannot run here",
                        p.name
                    )));
                }
                log::warn!(
                    "program {} not attached ({e:#}); carrying on without it: {}",
                    p.name,
                    p.feature.lost()
                );
                degraded.insert(p.feature);
            }
        }
        Ok(Self { ebpf, degraded })
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
        let threads = crate::os::proc::tids(pid)?;
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

fn attach(ebpf: &mut Ebpf, name: &str, attach: Attach) -> anyhow::Result<()> {
    let prog = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing"))?;
    match attach {
        Attach::Raw(tp) => {
            let p: &mut RawTracePoint = prog.try_into()?;
            p.load()
                .with_context(|| format!("verifier rejected {name}"))?;
            p.attach(tp).with_context(|| format!("attaching {name}"))?;
        }
        Attach::Tracepoint(cat, tp) => {
            let p: &mut TracePoint = prog.try_into()?;
            p.load()
                .with_context(|| format!("verifier rejected {name}"))?;
            p.attach(cat, tp)
                .with_context(|| format!("attaching {name}"))?;
        }
    }
    Ok(())
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

/// The NVIDIA fds of process `pid` under `dev_dir`.
fn existing_fds(pid: u32, dev_dir: &std::path::Path) -> Vec<ExistingFd> {
    crate::os::proc::fds(pid)
        .into_iter()
        .filter_map(|f| {
            Some(ExistingFd {
                pid,
                fd: f.fd,
                device: crate::gpu::env::device_file_of(dev_dir, &f.target)?,
                cloexec: f.flags & libc::O_CLOEXEC as u32 != 0,
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
            None => crate::os::proc::pids()?
                .into_iter()
                .filter(|&p| p != std::process::id())
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
