//! Prometheus `/metrics` of `keling run`: what the agent knows, as prometheus-client
//! metric families in the text exposition format 0.0.4, served by [`http`].
//!
//! Families (all prefixed `keling_`):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `process_gpu_memory_bytes` | gauge | pid, comm, task, slurm_job, user, gpu, memory (`video`, `host`) |
//! | `process_gpu_memory_peak_bytes` | gauge | pid, comm, task, slurm_job, user, gpu, memory |
//! | `process_gpu_allocations_total` | counter | pid, comm, task, slurm_job, user, gpu |
//! | `process_gpu_frees_total` | counter | pid, comm, task, slurm_job, user, gpu |
//! | `process_undecoded_ioctls_total` | counter | pid, comm, task, slurm_job, user |
//! | `process_gpu_memory_unsure` | gauge | pid, comm, task, slurm_job, user (1: a kernel table its books needed was full, its figures may be wrong and no quota is enforced on them; only such processes) |
//! | `table_full_total` | counter | table (each of `keling_common::table_full::NAMES`) |
//! | `gpu_capacity_bytes` | gauge | gpu (GPUs whose capacity is known) |
//! | `gpu_memory_bytes`, `gpu_memory_peak_bytes` | gauge | gpu, memory |
//! | `ringbuf_events_total`, `ringbuf_dropped_events_total`, `ringbuf_undecodable_events_total` | counter | |
//! | `tasks` | gauge | state (every state, 0 included) |
//! | `decision_latency_seconds`, `decision_latency_all_actions_seconds` | histogram | stage, action / stage |
//! | `decision_timeout_seconds` | gauge | model |
//! | `decisions_total`, `decisions_late_total` | counter | |
//!
//! The GPU figures are the kernel's exact accounting (the maps `keling status` and
//! `keling trace` read); `task` is the Keling task the process belongs to ("" for none),
//! `slurm_job` the Slurm job step of that task (`12.batch`, `12.0`; "" for none),
//! `user` the process's real user (its name, or the uid when it has none).
//!
//! # Bounded labels
//! A process stays on the endpoint while it lives and for a grace period after it exits
//! (`--metrics-grace-s`), then leaves it, unless the driver still holds memory charged to
//! it (a child or another process keeps its file open): that memory is real and stays
//! visible while it lasts, bounded by the kernel's accounting table. So a host that runs
//! thousands of short jobs shows only the recent ones.
//!
//! Pure shaping: the run loop gathers the figures ([`Sources`]); this module reads `/proc`
//! only through `os::proc`, for the labels of processes it has not seen before and, at
//! most once a second, whether they still live.
use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::Arc,
};

use keling_sched::GpuInfo;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use crate::{
    control::StatusReply,
    gpu::stats::{GpuAccounting, GpuDeviceStats, gpu_stats},
    latency::{LatencyRecorder, Selection, prom::LatencyFamilies},
};

pub mod http;

/// How often, at most, the liveness of the processes shown is checked, ns.
const LIVENESS_EVERY_NS: u64 = 1_000_000_000;
/// A scrape within this long of the last one gets the same text, ns (so that no
/// client can make the run loop render more than 10 times a second).
pub const CACHE_NS: u64 = 100_000_000;
/// Every task state, so that `keling_tasks` always has each one.
const STATES: [&str; 6] = [
    "PENDING",
    "RUNNING",
    "PREEMPTED",
    "COMPLETED",
    "FAILED",
    "ARCHIVED",
];

/// What the run loop hands over for one rendering.
pub struct Sources<'a> {
    /// The kernel's accounting; `None` when the maps could not be read.
    pub accounting: Option<&'a GpuAccounting>,
    pub capacities: &'a [GpuInfo],
    /// Events the agent decoded, lost (ring buffer full), could not decode.
    pub events: u64,
    pub drops: u64,
    pub decode_errors: u64,
    pub status: &'a StatusReply,
    pub latency: &'a LatencyRecorder,
    /// The task a process belongs to.
    pub task_of: &'a dyn Fn(u32) -> Option<u64>,
    /// The Slurm job step (`JOB.STEP`) of the task a process belongs to.
    pub slurm_of: &'a dyn Fn(u32) -> Option<String>,
    /// `CLOCK_MONOTONIC` now.
    pub now_ns: u64,
}

/// What the endpoint remembers of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Known {
    comm: String,
    user: String,
    start_ticks: Option<u64>,
    /// When it was found gone.
    gone_ns: Option<u64>,
}

/// The labels of the processes on the endpoint, with the grace rule of the module doc.
#[derive(Debug, Default)]
pub struct ProcessTable {
    known: HashMap<u32, Known>,
    grace_ns: u64,
    last_liveness_ns: Option<u64>,
}

impl ProcessTable {
    pub fn new(grace_ns: u64) -> Self {
        Self {
            grace_ns,
            ..Self::default()
        }
    }

    /// Learns the processes in `pids` (the accounting's), checks (at most once a second)
    /// whether those it knows still live, and forgets those no longer in `pids`.
    pub fn refresh(&mut self, pids: &[u32], now_ns: u64) {
        self.known.retain(|pid, _| pids.binary_search(pid).is_ok());
        for &pid in pids {
            self.known.entry(pid).or_insert_with(|| {
                let facts = crate::os::proc::ProcessFacts::of_pid(pid);
                let start_ticks = crate::os::proc::start_ticks(pid);
                let user = facts.uid.map_or_else(String::new, |uid| {
                    crate::os::users::name_of_uid(uid).unwrap_or_else(|| uid.to_string())
                });
                Known {
                    comm: facts.comm,
                    user,
                    start_ticks,
                    gone_ns: start_ticks.is_none().then_some(now_ns),
                }
            });
        }
        let due = self
            .last_liveness_ns
            .is_none_or(|l| now_ns.saturating_sub(l) >= LIVENESS_EVERY_NS);
        if due {
            self.last_liveness_ns = Some(now_ns);
            for (&pid, k) in self.known.iter_mut().filter(|(_, k)| k.gone_ns.is_none()) {
                if crate::os::proc::start_ticks(pid) != k.start_ticks {
                    k.gone_ns = Some(now_ns);
                }
            }
        }
    }

    /// Marks `pid` gone now (its exit event), if it is known and not gone yet.
    pub fn exited(&mut self, pid: u32, now_ns: u64) {
        if let Some(k) = self.known.get_mut(&pid) {
            k.gone_ns.get_or_insert(now_ns);
        }
    }

    /// Whether `pid` is shown: alive, gone for less than the grace period, or still
    /// holding memory (`holds`).
    fn shown(&self, pid: u32, holds: bool, now_ns: u64) -> Option<&Known> {
        let k = self.known.get(&pid)?;
        let within = k
            .gone_ns
            .is_none_or(|g| now_ns.saturating_sub(g) < self.grace_ns);
        (within || holds).then_some(k)
    }
}

/// One process's series.
#[derive(Clone, Debug, PartialEq)]
struct ProcessSeries {
    labels: Vec<(&'static str, String)>,
    gpus: Vec<GpuDeviceStats>,
    undecoded: u64,
    table_full: u64,
}

/// Everything one scrape shows, owned (a prometheus-client collector must be).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    processes: Vec<ProcessSeries>,
    devices: Vec<GpuDeviceStats>,
    capacities: Vec<(u32, u64)>,
    events: u64,
    drops: u64,
    decode_errors: u64,
    /// Per `table_full` site: how often that kernel table was full.
    table_full_at: Vec<u64>,
    tasks_by_state: BTreeMap<String, u64>,
    latency: LatencyFamilies,
}

/// The endpoint's state between scrapes: the process labels and the last text.
pub struct Metrics {
    pub table: ProcessTable,
    cache: Option<(u64, Arc<String>)>,
}

impl Metrics {
    pub fn new(grace_ns: u64) -> Self {
        Self {
            table: ProcessTable::new(grace_ns),
            cache: None,
        }
    }

    /// The last text, if rendered less than [`CACHE_NS`] before `now_ns`.
    pub fn cached(&self, now_ns: u64) -> Option<Arc<String>> {
        self.cache
            .as_ref()
            .filter(|(at, _)| now_ns.saturating_sub(*at) < CACHE_NS)
            .map(|(_, text)| text.clone())
    }

    /// Renders the exposition from `src` (and keeps it for [`Self::cached`]).
    pub fn render(&mut self, src: &Sources) -> Arc<String> {
        let snapshot = self.snapshot(src);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(snapshot));
        let text = Arc::new(crate::latency::prom::render(&registry));
        self.cache = Some((src.now_ns, text.clone()));
        text
    }

    fn snapshot(&mut self, src: &Sources) -> Snapshot {
        let mut snap = Snapshot {
            capacities: src
                .capacities
                .iter()
                .map(|g| (g.index, g.capacity_bytes))
                .collect(),
            events: src.events,
            drops: src.drops,
            decode_errors: src.decode_errors,
            latency: LatencyFamilies::of(src.latency, &Selection::default()),
            tasks_by_state: tasks_by_state(src.status),
            ..Snapshot::default()
        };
        let Some(acc) = src.accounting else {
            return snap;
        };
        let (procs, devices) = gpu_stats(acc);
        snap.devices = devices;
        snap.table_full_at = acc.table_full_at.clone();
        let pids: Vec<u32> = procs.keys().copied().collect();
        self.table.refresh(&pids, src.now_ns);
        for (pid, p) in procs {
            let holds = p.gpu_mem_bytes > 0 || p.gpu_host_bytes > 0;
            let Some(k) = self.table.shown(pid, holds, src.now_ns) else {
                continue;
            };
            let labels = vec![
                ("pid", pid.to_string()),
                ("comm", k.comm.clone()),
                (
                    "task",
                    (src.task_of)(pid).map_or_else(String::new, |t| t.to_string()),
                ),
                ("slurm_job", (src.slurm_of)(pid).unwrap_or_default()),
                ("user", k.user.clone()),
            ];
            snap.processes.push(ProcessSeries {
                labels,
                gpus: p.gpus,
                undecoded: p.undecoded,
                table_full: p.table_full,
            });
        }
        snap
    }
}

/// `keling_tasks`: the tasks in each state (every state, 0 included). A status
/// lists only the archived tasks that finished last: the rest are counted too.
fn tasks_by_state(status: &StatusReply) -> BTreeMap<String, u64> {
    let mut by_state: BTreeMap<String, u64> = STATES.iter().map(|s| ((*s).to_owned(), 0)).collect();
    for t in &status.tasks {
        *by_state.entry(t.state.clone()).or_default() += 1;
    }
    let archive = &status.archive;
    *by_state.entry("ARCHIVED".into()).or_default() +=
        archive.kept.saturating_sub(archive.listed) as u64;
    by_state
}

type Labels = Vec<(&'static str, String)>;

fn with(labels: &Labels, more: &[(&'static str, String)]) -> Labels {
    let mut l = labels.clone();
    l.extend_from_slice(more);
    l
}

/// One family of gauges or counters, `series` (labels, value).
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    series: &[(Labels, u64)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in series {
        let mut e = m.encode_family(labels)?;
        match ty {
            MetricType::Counter => e.encode_counter::<NoLabelSet, _, u64>(v, None)?,
            _ => e.encode_gauge(v)?,
        }
    }
    Ok(())
}

fn scalar(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    m.encode_counter::<NoLabelSet, _, u64>(&v, None)
}

impl Snapshot {
    fn encode_into(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let (mut mem, mut peak, mut allocs, mut frees, mut undecoded, mut unsure) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for p in &self.processes {
            for g in &p.gpus {
                let gl = with(&p.labels, &[("gpu", g.gpu.to_string())]);
                let video = with(&gl, &[("memory", "video".into())]);
                let host = with(&gl, &[("memory", "host".into())]);
                mem.push((video.clone(), g.bytes));
                mem.push((host.clone(), g.host_bytes));
                peak.push((video, g.peak_bytes));
                peak.push((host, g.peak_host_bytes));
                allocs.push((gl.clone(), g.allocs));
                frees.push((gl, g.frees));
            }
            undecoded.push((p.labels.clone(), p.undecoded));
            if p.table_full > 0 {
                unsure.push((p.labels.clone(), 1));
            }
        }
        use MetricType::{Counter, Gauge};
        family(
            enc,
            "keling_process_gpu_memory_bytes",
            "GPU memory charged to a process that the driver holds now, per GPU: video memory or pinned host memory.",
            Gauge,
            &mem,
        )?;
        family(
            enc,
            "keling_process_gpu_memory_peak_bytes",
            "The most GPU memory a process has held at once, per GPU and kind.",
            Gauge,
            &peak,
        )?;
        family(
            enc,
            "keling_process_gpu_allocations",
            "GPU memory allocations a process made, per GPU.",
            Counter,
            &allocs,
        )?;
        family(
            enc,
            "keling_process_gpu_frees",
            "GPU memory frees attributed to a process, per GPU.",
            Counter,
            &frees,
        )?;
        family(
            enc,
            "keling_process_undecoded_ioctls",
            "NVIDIA ioctls of a process that could not be decoded with certainty (counted, never guessed).",
            Counter,
            &undecoded,
        )?;
        family(
            enc,
            "keling_process_gpu_memory_unsure",
            "1 for a process whose GPU memory figures may be wrong: a kernel table Keling needed for its books was full. No quota is enforced on such a figure.",
            Gauge,
            &unsure,
        )?;
        let sites: Vec<(Labels, u64)> = keling_common::table_full::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    vec![("table", (*name).to_owned())],
                    self.table_full_at.get(i).copied().unwrap_or(0),
                )
            })
            .collect();
        family(
            enc,
            "keling_table_full",
            "Times a fixed kernel table of Keling's was full, by table (fd_table: an fd past a process's table, watched by the orphan sweep, no loss; the others: the books of the process may be wrong).",
            Counter,
            &sites,
        )?;
        let gpu = |g: u32| vec![("gpu", g.to_string())];
        family(
            enc,
            "keling_gpu_capacity_bytes",
            "A GPU's memory capacity (from --gpu-capacity, the config or NVML).",
            Gauge,
            &self
                .capacities
                .iter()
                .map(|&(g, c)| (gpu(g), c))
                .collect::<Vec<_>>(),
        )?;
        let (mut used, mut used_peak) = (vec![], vec![]);
        for d in &self.devices {
            used.push((with(&gpu(d.gpu), &[("memory", "video".into())]), d.bytes));
            used.push((
                with(&gpu(d.gpu), &[("memory", "host".into())]),
                d.host_bytes,
            ));
            used_peak.push((
                with(&gpu(d.gpu), &[("memory", "video".into())]),
                d.peak_bytes,
            ));
            used_peak.push((
                with(&gpu(d.gpu), &[("memory", "host".into())]),
                d.peak_host_bytes,
            ));
        }
        family(
            enc,
            "keling_gpu_memory_bytes",
            "GPU memory held now on a GPU, all processes: video memory or pinned host memory.",
            Gauge,
            &used,
        )?;
        family(
            enc,
            "keling_gpu_memory_peak_bytes",
            "The most GPU memory held at once on a GPU, per kind.",
            Gauge,
            &used_peak,
        )?;
        scalar(
            enc,
            "keling_ringbuf_events",
            "Events the agent received from the kernel's ring buffer.",
            self.events,
        )?;
        scalar(
            enc,
            "keling_ringbuf_dropped_events",
            "Events lost because the kernel's ring buffer was full (the exact totals stay exact).",
            self.drops,
        )?;
        scalar(
            enc,
            "keling_ringbuf_undecodable_events",
            "Ring-buffer records the agent could not decode.",
            self.decode_errors,
        )?;
        family(
            enc,
            "keling_tasks",
            "Keling tasks per state.",
            Gauge,
            &self
                .tasks_by_state
                .iter()
                .map(|(s, &n)| (vec![("state", s.clone())], n))
                .collect::<Vec<_>>(),
        )?;
        self.latency.encode_into(enc)
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        self.encode_into(&mut encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `keling_tasks` counts the archived tasks a status does not list.
    #[test]
    fn tasks_by_state_counts_the_archive_a_status_does_not_list() {
        let task = |id: u64, state: &str| {
            serde_json::from_value(serde_json::json!({
                "id": id, "pid": 100, "name": "t", "priority": 8, "class": "Background",
                "state": state, "gpu": 0, "mem_bytes": 0, "mem_bytes_per_gpu": {},
                "on_gpu_ms": 0, "elapsed_ms": 0, "wants_gpu": false, "in_flight": null,
                "cgroup": null
            }))
            .unwrap()
        };
        let status = StatusReply {
            caller_uid: None,
            tasks: vec![task(1, "RUNNING"), task(2, "ARCHIVED"), task(3, "ARCHIVED")],
            latency: crate::latency::LatencyRecorder::new(crate::latency::ModelKind::Adaptive)
                .status(),
            stages_by_action: BTreeMap::new(),
            placement: crate::control::PlacementStatus {
                weights: Vec::new(),
                load_balance_error: 0.0,
            },
            archive: crate::control::ArchiveSummary {
                kept: 2000,
                listed: 2,
                ..Default::default()
            },
            gpus: Vec::new(),
        };
        let by_state = tasks_by_state(&status);
        assert_eq!(by_state["RUNNING"], 1);
        assert_eq!(by_state["ARCHIVED"], 2000);
        assert_eq!(by_state["PENDING"], 0);
        assert_eq!(by_state.len(), STATES.len());
    }

    #[test]
    fn table_keeps_exited_processes_for_the_grace_period_only() {
        let mut t = ProcessTable::new(5_000_000_000);
        let me = std::process::id();
        // A pid that does not exist (above pid_max) is gone from the start.
        let ghost = 4_194_305;
        t.refresh(&[me, ghost], 0);
        assert!(t.shown(me, false, 0).is_some());
        assert!(!t.shown(me, false, 0).unwrap().comm.is_empty());
        assert!(
            t.shown(ghost, false, 1_000_000_000).is_some(),
            "within grace"
        );
        assert!(
            t.shown(ghost, false, 6_000_000_000).is_none(),
            "after grace"
        );
        assert!(
            t.shown(ghost, true, 6_000_000_000).is_some(),
            "still holding memory"
        );
        // An exit event starts the grace period at once.
        t.exited(me, 10_000_000_000);
        assert!(t.shown(me, false, 14_000_000_000).is_some());
        assert!(t.shown(me, false, 15_000_000_000).is_none());
        // A pid that leaves the accounting is forgotten.
        t.refresh(&[me], 20_000_000_000);
        assert!(t.shown(ghost, true, 20_000_000_000).is_none());
    }
}
