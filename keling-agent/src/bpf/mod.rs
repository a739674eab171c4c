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
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{KProbe, Program, RawTracePoint, TracePoint, UProbe},
};
use keling_common::{
    DROP_COUNTERS, FD_SLOTS, FILE_UNRESOLVED, FdSlot, GLOBAL_CONFIG, MAP_CALL_COUNTS,
    MAP_CALLS_UNCOUNTED, MAP_DROPS, MAP_EVENTS, MAP_ORPHAN_SWEEP, MAP_PROC_FDS, MAP_SIM_FILES,
    MAP_TABLE_FULL_AT, MAP_TABLE_FULL_PID, MAP_TOTALS, MAP_TRACKED_PIDS, MAP_TRACKED_TIDS,
    MAP_UNDECODED, MAP_UNDECODED_PID, OrphanSweep, ProbeConfig, ProcFds, SimFileKey, TotalKey,
    Totals, TrackedProcess, nvidia, undecoded,
};

use self::{
    btf::Btf,
    programs::{
        Attach, DRIVER_ENTRY, DRIVER_RETURN, FLOOR_PROGRAMS, FLOOR_RAW_PROGRAMS, Feature,
        IOCTL_PROG_MAP, IOCTL_PROG_MAP_KPROBE, IOCTL_PROGRAMS, IoctlBackend, PROGRAMS, TEST_RETURN,
        WORK_PROG_MAP, WORK_PROG_MAP_KPROBE, WORK_PROGRAMS, driver_entry_symbols, kprobe_twin,
    },
    tracefs::TracepointFormat,
};
use crate::gpu::{
    env::{GpuArgs, IoctlBackendChoice, NvidiaFiles},
    stats::{CallCounts, GpuAccounting},
};

pub mod btf;
pub mod pin;
pub mod programs;
pub mod tracefs;

/// The compiled eBPF object (see keling-agent/build.rs: `cargo xtask build` passes it
/// in, a plain `cargo build` builds it; empty when this machine lacked nightly or
/// bpf-linker, which that build warned about).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/keling.bpf.o"));

/// The embedded eBPF object, if this build has one.
pub fn embedded_object() -> Option<&'static [u8]> {
    (!EBPF_OBJECT.is_empty()).then_some(EBPF_OBJECT)
}

/// The embedded object, once this process may load it (privileges checked, the
/// memlock limit raised); an error that says what to do otherwise.
fn loadable_object() -> anyhow::Result<&'static [u8]> {
    let Some(object) = embedded_object() else {
        bail!(
            "this keling binary was built without its eBPF programs (its build found no \
             nightly toolchain or bpf-linker, or AYA_BUILD_SKIP was set); build it with \
             `cargo xtask build` or run it with `cargo xtask run`"
        );
    };
    crate::os::check_privileges()?;
    crate::os::raise_memlock();
    Ok(object)
}

/// Test hook: programs named here (comma-separated) are treated as if this kernel
/// could not attach them, so the degraded paths can be tested on a kernel that has
/// every tracepoint.
pub const SKIP_PROGRAMS_ENV: &str = "KELING_SKIP_PROGRAMS";

/// Test hook: `PATH:SYMBOL` runs the driver-entry backend's exit path (its
/// kprobe-type programs) from a uretprobe on SYMBOL in the binary PATH, in place
/// of `sys_exit_ioctl` ([`IoctlBackend::TestReturnUprobe`]): how the tests run
/// that path on a machine whose kernel has no kprobes. The test workload calls
/// SYMBOL right after each ioctl with its return value.
pub const TEST_IOCTL_RETURN_ENV: &str = "KELING_TEST_IOCTL_RETURN";

/// What to load.
pub struct LoadOptions {
    /// Report fork/exec/exit of every process, not only tracked ones, and track
    /// every process that opens an NVIDIA device.
    pub system_wide: bool,
    /// Size of the event ring buffer (a power of two, multiple of the page size).
    pub ringbuf_bytes: u32,
    /// Where the NVIDIA device files are (`/dev`, or a simulator's mount).
    pub dev_dir: std::path::PathBuf,
    /// The driver's version, which selects the layouts that moved between
    /// branches (NVOS21's status, UVM's and the dma-buf export's).
    pub driver_version: nvidia::branch::Version,
    /// What makes a file an NVIDIA device here.
    pub nvidia_files: NvidiaFiles,
    /// Features whose programs must attach; the others are skipped with a warning
    /// when this kernel cannot attach them.
    pub required: &'static [Feature],
    /// 0: every context switch and plain NVIDIA call is an event (tracing). N: the
    /// kernel reports instead that a tracked process was active, at most once per
    /// tracked root per N ns (the scheduler needs nothing more).
    pub active_interval_ns: u32,
    /// Where NVIDIA ioctls are to be seen (`--ioctl-backend`).
    pub ioctl_backend: IoctlBackendChoice,
    /// Pin the GPU memory books' maps ([`pin::PINNED`]) in this directory, and
    /// load onto the ones pinned there already ([`pin::Pins`]).
    pub pin_dir: Option<std::path::PathBuf>,
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
            driver_version: {
                let v = gpu.driver_layout_version()?;
                crate::gpu::names::set_driver(v);
                v
            },
            nvidia_files: gpu.nvidia_files()?,
            required,
            active_interval_ns: 0,
            ioctl_backend: gpu.ioctl_backend,
            pin_dir: None,
        })
    }
}

impl LoadOptions {
    /// Whether there is an NVIDIA driver (real or simulated) to trace.
    pub fn has_gpu(&self) -> bool {
        self.driver_version != nvidia::branch::Version::NEWEST || !self.nvidia_files.sim.is_empty()
    }
}

/// The loaded, attached programs and their maps.
pub struct Probes {
    ebpf: Ebpf,
    /// Features with a program this kernel could not attach.
    pub degraded: BTreeSet<Feature>,
    /// Where NVIDIA ioctls are seen.
    pub ioctl_backend: IoctlBackend,
    nvidia_files: NvidiaFiles,
    /// The driver's version the probes were loaded for.
    driver_version: nvidia::branch::Version,
}

/// Offsets this kernel needs, from BTF and the tracepoints' format files.
fn probe_config(opts: &LoadOptions) -> anyhow::Result<ProbeConfig> {
    let tracefs = tracefs::ensure_mounted()?;
    let btf = Btf::from_sys_fs()?;
    let off = |s: &str, m: &str| {
        btf.member_offset(s, m)
            .with_context(|| format!("{s}.{m} in this kernel's BTF"))
    };
    // 6.13 and later count a file's references in a biased `file_ref_t f_ref`.
    let (file_ref_off, file_ref_biased) = match off("file", "f_ref") {
        Ok(o) => (o, 1),
        Err(_) => (off("file", "f_count")?, 0),
    };
    let layout = nvidia::branch::Layout::of(opts.driver_version);
    let exit = TracepointFormat::read(&tracefs, "sched", "sched_process_exit")?;
    let switch = TracepointFormat::read(&tracefs, "sched", "sched_switch")?;
    let exec = TracepointFormat::read(&tracefs, "sched", "sched_process_exec")?;
    // The syscall's saved user registers, for the driver-entry backend: x86-64's
    // `struct pt_regs` (di: the first argument; orig_ax: the syscall number).
    let (regs_arg0_off, regs_syscall_nr_off, ioctl_syscall_nr) =
        match (off("pt_regs", "di"), off("pt_regs", "orig_ax")) {
            (Ok(di), Ok(nr)) if cfg!(target_arch = "x86_64") => (di, nr, libc::SYS_ioctl as u32),
            _ => (0, 0, 0),
        };
    Ok(ProbeConfig {
        task_pid_off: off("task_struct", "pid")?,
        task_tgid_off: off("task_struct", "tgid")?,
        task_exit_code_off: off("task_struct", "exit_code")?,
        task_files_off: off("task_struct", "files")?,
        files_fdt_off: off("files_struct", "fdt")?,
        fdt_max_fds_off: off("fdtable", "max_fds")?,
        fdt_fd_off: off("fdtable", "fd")?,
        file_inode_off: off("file", "f_inode")?,
        file_ref_off,
        file_ref_biased,
        inode_rdev_off: off("inode", "i_rdev")?,
        inode_ino_off: off("inode", "i_ino")?,
        inode_sb_off: off("inode", "i_sb")?,
        sb_dev_off: off("super_block", "s_dev")?,
        uvm_major: opts.nvidia_files.uvm_major.unwrap_or(0),
        sim_files: (!opts.nvidia_files.sim.is_empty()) as u32,
        exit_group_dead_off: exit.offset("group_dead").unwrap_or(0),
        switch_prev_pid_off: switch.require("sched_switch", "prev_pid")?,
        switch_prev_state_off: switch.require("sched_switch", "prev_state")?,
        switch_next_pid_off: switch.require("sched_switch", "next_pid")?,
        exec_filename_off: exec.require("sched_process_exec", "filename")?,
        exec_old_pid_off: exec.require("sched_process_exec", "old_pid")?,
        system_wide: opts.system_wide as u32,
        nvos21_status_off: if opts.driver_version.major >= nvidia::NVOS21_PARAMS_SIZE_SINCE_MAJOR {
            nvidia::nvos21::STATUS as u32
        } else {
            nvidia::nvos21::STATUS_PRE_535 as u32
        },
        driver_major: opts.driver_version.major,
        wakeup_bytes: opts.ringbuf_bytes / 4,
        active_interval_ns: opts.active_interval_ns,
        task_runtime_off: off("task_struct", "se")? + off("sched_entity", "sum_exec_runtime")?,
        regs_arg0_off,
        regs_syscall_nr_off,
        ioctl_syscall_nr,
        uvm_free_status_off: layout.uvm_free_rm_status as u32,
        uvm_map_external_status_off: layout.uvm_map_external_rm_status as u32,
        uvm_semaphore_pool_status_off: layout.uvm_semaphore_pool_rm_status as u32,
        dmabuf_export_status_off: layout.dmabuf_export_status as u32,
    })
}

impl Probes {
    pub fn load(opts: &LoadOptions) -> anyhow::Result<Self> {
        let object = loadable_object()?;
        let config = probe_config(opts)?;
        log::debug!("probe config: {config:?}");
        let mut loader = EbpfLoader::new();
        loader
            .override_global(GLOBAL_CONFIG, &config, true)
            .map_max_entries(MAP_EVENTS, opts.ringbuf_bytes);
        if let Some(dir) = &opts.pin_dir {
            for &name in pin::PINNED {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader
            .load(object)
            .context("loading Keling's eBPF object into the kernel")?;
        // The simulated driver's files, before anything that reads them runs.
        {
            let mut sim: HashMap<_, SimFileKey, u32> =
                HashMap::try_from(ebpf.map_mut(MAP_SIM_FILES).context("SIM_FILES")?)?;
            for (id, device) in &opts.nvidia_files.sim {
                let key = SimFileKey {
                    dev: id.dev,
                    _reserved: 0,
                    ino: id.ino,
                };
                sim.insert(key, device, 0)?;
            }
        }
        let skip = std::env::var(SKIP_PROGRAMS_ENV).unwrap_or_default();
        let skip: BTreeSet<&str> = skip.split(',').filter(|s| !s.is_empty()).collect();
        // Everything this start can attach or tail-call, verified several at a time
        // (the ioctl tracepoints' two as well, though the driver-entry backend may
        // replace them: a few ms).
        let wanted = WORK_PROGRAMS
            .iter()
            .chain(IOCTL_PROGRAMS)
            .map(|&(_, name)| name)
            .chain(
                PROGRAMS
                    .iter()
                    .map(|p| p.name)
                    .filter(|n| !skip.contains(n)),
            );
        preload(&mut ebpf, wanted);
        // The deferred-work programs are reached only by tail call: load them and
        // put them in WORK_PROG before anything that can queue work is attached.
        let tail_called = WORK_PROGRAMS
            .iter()
            .map(|&(slot, name)| (WORK_PROG_MAP, slot, name))
            .chain(
                IOCTL_PROGRAMS
                    .iter()
                    .map(|&(slot, name)| (IOCTL_PROG_MAP, slot, name)),
            );
        for (map, slot, name) in tail_called {
            let fd = {
                let prog: &mut TracePoint = loaded(&mut ebpf, name)?.try_into()?;
                prog.fd()?.try_clone()?
            };
            set_slot(&mut ebpf, map, slot, &fd)?;
        }
        let ioctl_backend = ioctl_backend(&mut ebpf, opts, &config)?;
        let mut degraded = BTreeSet::new();
        for p in PROGRAMS {
            if ioctl_backend.replaces().contains(&p.name) {
                continue;
            }
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
        Ok(Self {
            ebpf,
            degraded,
            ioctl_backend,
            nvidia_files: opts.nvidia_files.clone(),
            driver_version: opts.driver_version,
        })
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

    /// Follows every process that execs into `comm` from now on (`keling trace
    /// --comm`): the exec probe tracks it, and its children from their fork.
    /// `comm` is cut to the kernel's 15 bytes.
    pub fn follow_comm(&mut self, comm: &str) -> anyhow::Result<()> {
        let mut key = [0u8; keling_common::COMM_LEN];
        let n = comm.len().min(keling_common::COMM_LEN - 1);
        key[..n].copy_from_slice(&comm.as_bytes()[..n]);
        let mut comms: HashMap<_, [u8; keling_common::COMM_LEN], u32> = HashMap::try_from(
            self.ebpf
                .map_mut(keling_common::MAP_TRACE_COMMS)
                .context("TRACE_COMMS")?,
        )?;
        comms.insert(key, 1, 0)?;
        Ok(())
    }

    /// How many processes the kernel still tracks (it removes them as they exit).
    pub fn tracked_processes(&self) -> anyhow::Result<usize> {
        let pids: HashMap<_, u32, TrackedProcess> =
            HashMap::try_from(self.ebpf.map(MAP_TRACKED_PIDS).context("TRACKED_PIDS")?)?;
        Ok(pids.keys().filter(|k| k.is_ok()).count())
    }

    /// Where the kernel's check of orphaned files stands (see the probes'
    /// orphans.rs): files with clients whose last known fd went while references
    /// Keling cannot see remained.
    pub fn orphan_sweep(&self) -> anyhow::Result<OrphanSweep> {
        let map: aya::maps::Array<_, OrphanSweep> =
            aya::maps::Array::try_from(self.ebpf.map(MAP_ORPHAN_SWEEP).context("ORPHAN_SWEEP")?)?;
        Ok(map.get(&0, 0)?)
    }

    /// Waits (up to `limit`) until every orphaned file has been checked once more,
    /// so that releases made by processes Keling does not watch are in the maps.
    pub async fn settle_orphans(&self, limit: std::time::Duration) -> anyhow::Result<()> {
        let start = self.orphan_sweep()?;
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let now = self.orphan_sweep()?;
            if now.occupied == 0 || now.checked >= start.checked + start.full_round() {
                // What the sweep found released is torn down as deferred work on
                // the CPU that found it: have every CPU switch so that it is done
                // before the caller reads the figures.
                tokio::task::spawn_blocking(crate::os::switch_on_every_cpu).await?;
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                log::debug!("{} orphaned files still held elsewhere", now.occupied);
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
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

/// The program `name` of the object.
fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} missing"))
}

/// The program `name`, loaded: by [`preload`], or here.
fn loaded<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut Program> {
    let prog = program(ebpf, name)?;
    load(prog, name)?;
    Ok(prog)
}

/// Loads (the kernel verifies) `prog` unless it is loaded already.
fn load(prog: &mut Program, name: &str) -> anyhow::Result<()> {
    if prog.fd().is_ok() {
        return Ok(());
    }
    match prog {
        Program::TracePoint(p) => p.load(),
        Program::RawTracePoint(p) => p.load(),
        Program::KProbe(p) => p.load(),
        Program::UProbe(p) => p.load(),
        _ => bail!("program {name} is of a type Keling does not load"),
    }
    .with_context(|| format!("verifier rejected {name}"))
}

/// Puts a loaded program in slot `slot` of the program array `map`.
fn set_slot(
    ebpf: &mut Ebpf,
    map: &str,
    slot: u32,
    fd: &aya::programs::ProgramFd,
) -> anyhow::Result<()> {
    let mut array = ProgramArray::try_from(
        ebpf.map_mut(map)
            .with_context(|| format!("{map} map missing"))?,
    )?;
    array.set(slot, fd, 0)?;
    Ok(())
}

/// Chooses where NVIDIA ioctls are seen, and for the driver-entry backend loads
/// its programs and attaches them. In `auto`, whatever stands in its way is said
/// once and the tracepoints are used; when it was asked for by name, that is an
/// error saying what is missing.
fn ioctl_backend(
    ebpf: &mut Ebpf,
    opts: &LoadOptions,
    config: &ProbeConfig,
) -> anyhow::Result<IoctlBackend> {
    if let Ok(target) = std::env::var(TEST_IOCTL_RETURN_ENV) {
        let (path, symbol) = target
            .rsplit_once(':')
            .with_context(|| format!("{TEST_IOCTL_RETURN_ENV}={target}: not PATH:SYMBOL"))?;
        load_driver_entry(ebpf)?;
        let prog: &mut UProbe = loaded(ebpf, TEST_RETURN)?.try_into()?;
        prog.attach(
            symbol,
            path,
            aya::programs::uprobe::UProbeScope::AllProcesses,
        )
        .with_context(|| format!("attaching {TEST_RETURN} to {target}"))?;
        log::warn!("NVIDIA ioctls: exits through the driver-entry backend from {target} (a test)");
        return Ok(IoctlBackend::TestReturnUprobe);
    }
    let forced = match opts.ioctl_backend {
        IoctlBackendChoice::Tracepoints => {
            log::info!("NVIDIA ioctls: seen at the ioctl syscall tracepoints (--ioctl-backend)");
            return Ok(IoctlBackend::Tracepoints);
        }
        IoctlBackendChoice::Auto => false,
        IoctlBackendChoice::DriverEntry => true,
    };
    // Asked for by name: the verifier's word first, whatever else is missing.
    let loaded = if forced {
        load_driver_entry(ebpf)?;
        "its programs load on this kernel, but it cannot attach: "
    } else {
        ""
    };
    let fallback = |why: String| -> anyhow::Result<IoctlBackend> {
        if forced {
            bail!(
                "--ioctl-backend driver-entry: {loaded}{why}; use --ioctl-backend tracepoints \
                 (or auto, which falls back to them)"
            );
        }
        log::info!("NVIDIA ioctls: seen at the ioctl syscall tracepoints: {why}");
        Ok(IoctlBackend::Tracepoints)
    };
    if !opts.nvidia_files.sim.is_empty() {
        return fallback(
            "the simulated driver's files are served by FUSE, so its calls never reach an \
             NVIDIA module"
                .into(),
        );
    }
    if config.regs_arg0_off == config.regs_syscall_nr_off {
        return fallback(
            "this kernel's BTF has no x86-64 `struct pt_regs` to find a call's fd in".into(),
        );
    }
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let symbols = match driver_entry_symbols(&kallsyms) {
        Ok(s) => s,
        Err(module) => {
            let hint = if module == "nvidia_uvm" {
                "; nvidia-uvm loads with the first CUDA program, or `nvidia-modprobe -u -c 0`"
            } else {
                ""
            };
            return fallback(format!(
                "no {module} module is loaded (its ioctl entry is not in /proc/kallsyms){hint}"
            ));
        }
    };
    if !forced && let Err(e) = load_driver_entry(ebpf) {
        return fallback(format!("{e:#}"));
    }
    let mut links = Vec::new();
    let mut attach_all = || -> anyhow::Result<()> {
        for name in [DRIVER_ENTRY, DRIVER_RETURN] {
            let prog: &mut KProbe = program(ebpf, name)?.try_into()?;
            for symbol in &symbols {
                let link = prog
                    .attach(*symbol, 0)
                    .with_context(|| format!("attaching {name} to {symbol}"))?;
                links.push((name, link));
            }
        }
        Ok(())
    };
    if let Err(e) = attach_all() {
        // None of it stays: half a backend beside the tracepoints would see some
        // calls twice.
        for (name, link) in links {
            if let Ok(p) = program(ebpf, name)
                && let Ok(p) = <&mut KProbe>::try_from(p)
            {
                let _ = p.detach(link);
            }
        }
        return fallback(format!("{e:#}"));
    }
    log::info!(
        "NVIDIA ioctls: seen at the driver's entry (kprobes on {}): no other ioctl is traced",
        symbols.join(", ")
    );
    Ok(IoctlBackend::DriverEntry)
}

/// Loads the driver-entry backend's programs: the kprobe-type twins of the
/// tail-called ones, into their arrays, and the entry and return programs.
fn load_driver_entry(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let twins = WORK_PROGRAMS
        .iter()
        .map(|&(slot, name)| (WORK_PROG_MAP_KPROBE, slot, name))
        .chain(
            IOCTL_PROGRAMS
                .iter()
                .map(|&(slot, name)| (IOCTL_PROG_MAP_KPROBE, slot, name)),
        );
    let twins: Vec<_> = twins
        .map(|(map, slot, name)| (map, slot, kprobe_twin(name)))
        .collect();
    preload(
        ebpf,
        twins
            .iter()
            .map(|(_, _, name)| name.as_str())
            .chain([DRIVER_ENTRY, DRIVER_RETURN]),
    );
    for (map, slot, name) in twins {
        let fd = {
            let prog: &mut KProbe = loaded(ebpf, &name)?.try_into()?;
            prog.fd()?.try_clone()?
        };
        set_slot(ebpf, map, slot, &fd)?;
    }
    for name in [DRIVER_ENTRY, DRIVER_RETURN] {
        loaded(ebpf, name)?;
    }
    Ok(())
}

/// Loads the programs named in `names` (those not loaded yet), several at a time.
///
/// The kernel verifies a program in the thread that loads it, and one after the
/// other that was most of a start: their loads, one at a time, took 3.4 of
/// `keling trace`'s 4.4 s on this project's 2-CPU machines (`RUST_LOG=debug` logs
/// each load's time, `strace -c` the `bpf` calls' share; loaded together, each
/// load's own time includes waiting for the CPU). A program that fails here is
/// left unloaded: the caller's own load of it says why, in the place that decides
/// what its failure means.
fn preload<'n>(ebpf: &mut Ebpf, names: impl IntoIterator<Item = &'n str>) {
    let names: BTreeSet<&str> = names.into_iter().collect();
    let queue: Vec<(&str, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(name, prog)| names.contains(name) && prog.fd().is_err())
        .collect();
    // One per CPU, and not so many that the verifiers' memory adds up on a big host.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(PRELOAD_THREADS)
        .min(queue.len());
    let queue = std::sync::Mutex::new(queue);
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some((name, prog)) = next() {
                    let started = std::time::Instant::now();
                    match load(prog, name) {
                        Ok(()) => log::debug!("program {name} loaded in {:?}", started.elapsed()),
                        Err(e) => log::debug!("program {name} did not load ahead: {e:#}"),
                    }
                }
            });
        }
    });
}

/// The most programs [`preload`] verifies at once.
const PRELOAD_THREADS: usize = 8;

/// Logs (debug) how long attaching a program (and loading it, if [`preload`] did
/// not) took.
struct Timing<'a>(&'a str, std::time::Instant);

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        log::debug!("program {} attached in {:?}", self.0, self.1.elapsed());
    }
}

/// The bench's floor: Keling's object loaded with only [`FLOOR_PROGRAMS`]
/// attached, two empty programs on the ioctl tracepoints, or with `raw_syscalls`
/// only [`FLOOR_RAW_PROGRAMS`], two on the raw syscall tracepoints (the same
/// loader, attachment and JIT as Keling's own programs). They stay attached while
/// the returned object lives.
pub fn attach_floor(raw_syscalls: bool) -> anyhow::Result<Ebpf> {
    let object = loadable_object()?;
    // The event ring is not used: its smallest size, one page.
    // SAFETY: sysconf has no preconditions.
    let page = u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(MAP_EVENTS, page)
        .load(object)
        .context("loading Keling's eBPF object into the kernel")?;
    let programs = if raw_syscalls {
        FLOOR_RAW_PROGRAMS
    } else {
        FLOOR_PROGRAMS
    };
    for p in programs {
        attach(&mut ebpf, p.name, p.attach)?;
    }
    Ok(ebpf)
}

/// Loads program `name` unless [`preload`] did, and attaches it.
fn attach(ebpf: &mut Ebpf, name: &str, attach: Attach) -> anyhow::Result<()> {
    let _timing = Timing(name, std::time::Instant::now());
    let prog = loaded(ebpf, name)?;
    match attach {
        Attach::Raw(tp) => {
            let p: &mut RawTracePoint = prog.try_into()?;
            p.attach(tp).with_context(|| format!("attaching {name}"))?;
        }
        Attach::Tracepoint(cat, tp) => {
            let p: &mut TracePoint = prog.try_into()?;
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
        let per_site: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map(MAP_TABLE_FULL_AT).context("TABLE_FULL_AT")?)?;
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
        for site in 0..keling_common::table_full::COUNT {
            acc.table_full_at.push(per_site.get(&site, 0)?.iter().sum());
        }
        acc.table_full_per_pid = self.table_full_pids()?;
        Ok(acc)
    }

    /// Per process, how often a table its books needed was full (its GPU memory
    /// figure may be wrong since). Empty, one syscall, on a host where none was.
    pub fn table_full_pids(&self) -> anyhow::Result<BTreeMap<u32, u64>> {
        let map: HashMap<_, u32, u64> = HashMap::try_from(
            self.ebpf
                .map(MAP_TABLE_FULL_PID)
                .context("TABLE_FULL_PID")?,
        )?;
        let mut out = BTreeMap::new();
        for entry in map.iter() {
            let (pid, n) = entry?;
            out.insert(pid, n);
        }
        Ok(out)
    }

    /// A sound lower bound of the video memory charged to the processes `pids`,
    /// from the kernel's own objects, for a task whose figure a full table made
    /// unsure ([`crate::sched::daemon::Daemon::judge_unsure`]): the bytes of every
    /// memory charged to one of them that is certainly still allocated, because
    /// the client of its (charged) handle is still the one it was made under and
    /// the open file that client was made on is still the same open file (its
    /// release, seen or not, frees it in the driver). A memory only export files
    /// hold counts while they do. What a full table hides (an allocation Keling
    /// never recorded) is not in it; what a full table inflates (a release Keling
    /// missed: a client its file had no room for, a contributor past the table)
    /// cannot be, so a quota may be enforced on it. Reads the whole `OBJECTS` and
    /// `MEMS` maps: call it rarely.
    pub fn sure_video_bytes(&self, pids: &BTreeSet<u32>) -> anyhow::Result<u64> {
        use keling_common::{
            ClientInfo, FileInfo, MAP_CLIENTS, MAP_FILES, MAP_MEMS, MAP_OBJECTS, MEM_HANDLES,
            MemInfo, NO_HANDLE, ObjectInfo, ObjectKey, mem_kind,
        };
        let objects: HashMap<_, ObjectKey, ObjectInfo> =
            HashMap::try_from(self.ebpf.map(MAP_OBJECTS).context("OBJECTS")?)?;
        let mems: HashMap<_, u64, MemInfo> =
            HashMap::try_from(self.ebpf.map(MAP_MEMS).context("MEMS")?)?;
        let clients: HashMap<_, u32, ClientInfo> =
            HashMap::try_from(self.ebpf.map(MAP_CLIENTS).context("CLIENTS")?)?;
        let files: HashMap<_, u64, FileInfo> =
            HashMap::try_from(self.ebpf.map(MAP_FILES).context("FILES")?)?;
        // Per client handle: the generation of its live instance, if its file lives.
        let mut live: BTreeMap<u32, Option<u32>> = BTreeMap::new();
        let mut client_live = |client: u32, gen_: u32| {
            let g = *live.entry(client).or_insert_with(|| {
                let c = clients.get(&client, 0).ok()?;
                let f = files.get(&c.file_id, 0).ok()?;
                (c.file_gen != 0 && f.gen_ as u32 == c.file_gen).then_some(c.gen_)
            });
            g == Some(gen_)
        };
        let mut sum = 0u64;
        for entry in objects.iter() {
            let (key, o) = entry?;
            if o.mem_id == 0
                && o.mem_kind == mem_kind::VIDEO
                && pids.contains(&o.owner_pid)
                && client_live(key.client, o.client_gen)
            {
                sum = sum.saturating_add(o.bytes);
            }
        }
        for entry in mems.iter() {
            let (_, m) = entry?;
            if m.kind != mem_kind::VIDEO || !pids.contains(&m.charged_pid) {
                continue;
            }
            let held = if m.charged == NO_HANDLE {
                m.export_refs > 0
            } else if (m.charged as usize) < MEM_HANDLES {
                let h = m.handles[m.charged as usize];
                let key = ObjectKey {
                    client: h.client,
                    handle: h.handle,
                };
                objects
                    .get(&key, 0)
                    .is_ok_and(|o| client_live(h.client, o.client_gen))
            } else {
                false
            };
            if held {
                sum = sum.saturating_add(m.bytes);
            }
        }
        Ok(sum)
    }

    /// Per (pid, GPU), how the driver branch's rule for its per-process figure
    /// (what NVML shows) differs from Keling's driver figure: memory under a
    /// client's device objects other than its first of that GPU left out up
    /// to 535 ([`crate::gpu::nvml::outside_first_device`]), the size of video
    /// NV01_MEMORY_HW_RESOURCES objects added up to 545
    /// ([`crate::gpu::nvml::hw_resources`]); nothing from 550 (without reading
    /// a map). Reads the whole `OBJECTS`, `MEMS` and `CLIENTS` maps up to 545:
    /// call it rarely.
    pub fn nvml_rule(&self) -> anyhow::Result<crate::gpu::nvml::RuleParts> {
        use keling_common::{
            ClientInfo, MAP_CLIENTS, MAP_MEMS, MAP_OBJECTS, MemInfo, ObjectInfo, ObjectKey,
        };
        use nvidia::branch::since;
        if self.driver_version >= since::PID_INFO_NO_HW_RESOURCES {
            return Ok(Default::default());
        }
        let objects: HashMap<_, ObjectKey, ObjectInfo> =
            HashMap::try_from(self.ebpf.map(MAP_OBJECTS).context("OBJECTS")?)?;
        let clients: HashMap<_, u32, ClientInfo> =
            HashMap::try_from(self.ebpf.map(MAP_CLIENTS).context("CLIENTS")?)?;
        let objects: BTreeMap<ObjectKey, ObjectInfo> = objects.iter().collect::<Result<_, _>>()?;
        let clients: BTreeMap<u32, ClientInfo> = clients.iter().collect::<Result<_, _>>()?;
        let every_device = self.driver_version >= since::PID_INFO_EVERY_DEVICE;
        let hw_resources = crate::gpu::nvml::hw_resources(&objects, &clients, every_device);
        if every_device {
            return Ok(crate::gpu::nvml::RuleParts {
                hw_resources,
                ..Default::default()
            });
        }
        let mems: HashMap<_, u64, MemInfo> =
            HashMap::try_from(self.ebpf.map(MAP_MEMS).context("MEMS")?)?;
        let mems: Vec<MemInfo> = mems
            .iter()
            .map(|e| e.map(|(_, m)| m))
            .collect::<Result<_, _>>()?;
        Ok(crate::gpu::nvml::RuleParts {
            outside: crate::gpu::nvml::outside_first_device(&objects, &mems, &clients),
            hw_resources,
        })
    }

    /// Processes whose full-table row (`TABLE_FULL_PID`) the kernel created since
    /// the last call, popped from `UNSURE_NEW` (one syscall when there are none),
    /// and how many it could not queue so far (`UNSURE_LOST`: when that grows,
    /// read [`Self::table_full_pids`] once).
    pub fn new_unsure_pids(&mut self) -> anyhow::Result<(Vec<u32>, u64)> {
        let mut queue: aya::maps::Queue<_, u32> = aya::maps::Queue::try_from(
            self.ebpf
                .map_mut(keling_common::MAP_UNSURE_NEW)
                .context("UNSURE_NEW")?,
        )?;
        let mut pids = Vec::new();
        // Bounded by the queue's size: the kernel may push while we pop.
        while pids.len() < keling_common::MAX_TRACKED_PIDS as usize {
            match queue.pop(0) {
                Ok(pid) => pids.push(pid),
                Err(aya::maps::MapError::ElementNotFound) => break,
                Err(e) => return Err(e.into()),
            }
        }
        let lost: Array<_, u64> = Array::try_from(
            self.ebpf
                .map(keling_common::MAP_UNSURE_LOST)
                .context("UNSURE_LOST")?,
        )?;
        Ok((pids, lost.get(&0, 0)?))
    }

    /// Removes an exited process's rows of full tables and undecoded calls
    /// (`TABLE_FULL_PID`, `UNDECODED_PID`), once they were read.
    pub fn forget_books(&mut self, pid: u32) -> anyhow::Result<()> {
        for name in [MAP_TABLE_FULL_PID, MAP_UNDECODED_PID] {
            let mut map: HashMap<_, u32, u64> =
                HashMap::try_from(self.ebpf.map_mut(name).context(name)?)?;
            match map.remove(&pid) {
                Ok(()) | Err(aya::maps::MapError::ElementNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The calls the followed processes made, by escape, UVM command and control,
    /// as the kernel counted them (apart from [`Self::gpu_accounting`], which the
    /// long-running agent reads often: this map can hold thousands of entries).
    pub fn call_counts(&self) -> anyhow::Result<CallCounts> {
        let counts: HashMap<_, u64, u64> =
            HashMap::try_from(self.ebpf.map(MAP_CALL_COUNTS).context("CALL_COUNTS")?)?;
        let uncounted: Array<_, u64> = Array::try_from(
            self.ebpf
                .map(MAP_CALLS_UNCOUNTED)
                .context("CALLS_UNCOUNTED")?,
        )?;
        let entries = counts.iter().collect::<Result<Vec<_>, _>>()?;
        Ok(CallCounts::from_kernel(entries, uncounted.get(&0, 0)?))
    }
}

impl Probes {
    /// Finds NVIDIA fds opened before the probes were loaded (in `pids`, or in every
    /// process when `None`) and lists them in the kernel's fd table, so that their
    /// closes, exec and exit are judged from now on; the probes learn which open
    /// file each is the first time they meet it. Objects created on them before
    /// now are unknown: frees of those are counted as undecoded (`unknown_object`).
    /// Returns the processes found.
    pub fn adopt_existing_fds(
        &mut self,
        pids: Option<&[u32]>,
        track: bool,
    ) -> anyhow::Result<BTreeSet<u32>> {
        let files = self.nvidia_files.clone();
        let all: Vec<u32> = match pids {
            Some(p) => p.to_vec(),
            None => crate::os::proc::pids()?
                .into_iter()
                .filter(|&p| p != std::process::id())
                .collect(),
        };
        let mut tables: BTreeMap<u32, ProcFds> = BTreeMap::new();
        let mut count = 0;
        for pid in all {
            for fd in crate::os::proc::fds(pid) {
                let Some(meta) = crate::os::proc::fd_metadata(pid, fd.fd) else {
                    continue;
                };
                let Some(device) = files.device_of(&meta) else {
                    continue;
                };
                let table = tables.entry(pid).or_insert(ProcFds {
                    slots: [FdSlot::default(); FD_SLOTS],
                });
                match table.slots.iter_mut().find(|s| s.file_id == 0) {
                    Some(slot) => {
                        *slot = FdSlot {
                            fd: fd.fd,
                            device,
                            file_id: FILE_UNRESOLVED,
                        };
                        count += 1;
                    }
                    None => log::warn!(
                        "process {pid} has more than {FD_SLOTS} NVIDIA fds; fd {} is not followed",
                        fd.fd
                    ),
                }
            }
        }
        let mut proc_fds: HashMap<_, u32, ProcFds> =
            HashMap::try_from(self.ebpf.map_mut(MAP_PROC_FDS).context("PROC_FDS")?)?;
        let found: BTreeSet<u32> = tables.keys().copied().collect();
        // A process listed already is in books kept across a restart (bpf::pin):
        // they know its files better than this scan.
        tables.retain(|pid, _| proc_fds.get(pid, 0).is_err());
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
                "adopted {count} NVIDIA fds of {} processes that had them before Keling started; \
                 memory they allocated before now is not in Keling's totals",
                found.len()
            );
        }
        Ok(found)
    }
}
