//! Restart without loss: what a launched task leaves for the next agent (its
//! record, [`crate::sched::records`]), how an agent that starts takes such tasks
//! back, and how a launch's client attaches to its task again.
//!
//! A record is written when the task is placed (its command released) and
//! removed when it ends. An agent that starts reads them before it serves
//! anyone; each is checked against the kernel ([`Host::readopt`]: the recorded
//! root process, with its start time, still in its cgroup, a task cgroup
//! directly under the instance's root); a record that fails is reported and
//! removed, and its task, if any of it runs, is left alone (thawed, as every
//! leftover is at start). A task taken back arrives in the core again with its
//! recorded spec (id, owner, priority, GPU, quota, limits) and whatever GPU
//! memory the kernel's books (kept across the restart when the maps are pinned:
//! `bpf::pin`) hold for its processes; its figure is marked unsure (`MemUnsure`):
//! what it allocated or freed while no agent ran was not seen, and no quota is
//! enforced on a figure that may be wrong. The core then decides as for any
//! arrival: nothing stays frozen that it does not hold frozen (the fail-safe or
//! the stopping agent thawed everything, and the start thaws leftovers).
use std::{collections::BTreeMap, path::PathBuf};

use keling_sched::{Input, TaskId};

use keling_common::Totals;

use super::Daemon;
use crate::{
    bpf::{Probes, pin::Pins},
    control::{
        Accepted, AttachRequest, ErrorKind, Reply, ReplyError,
        server::{Peer, Replier},
    },
    instance::Instance,
    sched::{
        members::TaskRuntime,
        records::{self, Found, TaskRecord},
    },
};

/// The records an earlier run of this instance left (see
/// [`records::read_all`]): read before the probes load, since whether the
/// kernel's books are kept depends on them.
pub fn read_records(instance: &Instance) -> Found {
    match crate::sched::cgroup::cgroup2_mount() {
        Ok(mount) => records::read_all(&instance.task_dir(), &mount.join(instance.cgroup_name())),
        Err(_) => Found::default(),
    }
}

/// Whether a task of `found` still runs (its recorded root process, same start
/// time, still in its cgroup): only then are the kernel's books of the last run
/// worth keeping.
pub fn any_alive(found: &Found) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(mount) = crate::sched::cgroup::cgroup2_mount() else {
        return false;
    };
    found.records.iter().any(|r| {
        r.cgroup.strip_prefix(&mount).is_ok_and(|rel| {
            let mut path = b"/".to_vec();
            path.extend_from_slice(rel.as_os_str().as_bytes());
            r.check_alive(&path).is_ok()
        })
    })
}

/// The pins of the GPU memory books for this run ([`Pins`]): kept from the last
/// run when there are tasks to take back (`keep`). `None` (said why) when
/// bpffs cannot hold them: the agent runs, and a restart loses the books.
pub fn pins(instance: &Instance, keep: bool) -> Option<Pins> {
    let object = crate::bpf::embedded_object()?;
    match Pins::prepare(&instance.bpf_dir(), object, keep) {
        Ok(p) => Some(p),
        Err(e) => {
            log::warn!(
                "the GPU memory books are not pinned ({e:#}): a task that outlives this agent \
                 is taken back by the next one with no memory figure"
            );
            None
        }
    }
}

/// At start, before the first request: takes back the tasks of `found` (see
/// [`Daemon::take_back`]), with their memory from the kernel's books, and
/// keeps records from now on. Says what it did.
pub fn take_back_at_start(
    daemon: &mut Daemon,
    probes: &mut Probes,
    instance: &Instance,
    found: Found,
    pins: Option<&Pins>,
) {
    daemon.keep_records(instance.task_dir());
    if found.records.is_empty() && found.refused.is_empty() {
        return;
    }
    let totals = match probes.gpu_accounting() {
        Ok(acc) => acc.totals,
        Err(e) => {
            log::warn!("the kernel's GPU memory books cannot be read ({e:#})");
            BTreeMap::new()
        }
    };
    let books = match pins {
        Some(p) if p.reused => "their GPU memory from the books kept in the kernel",
        _ => "no GPU memory figure (the books were not kept)",
    };
    let taken = daemon.take_back(
        found,
        &|pids| video_bytes(&totals, pids),
        &mut |pid, root| probes.track(pid, root),
    );
    for (record, why) in &taken.dropped {
        log::warn!("record {record} of an earlier run dropped: {why}");
    }
    if !taken.tasks.is_empty() {
        log::warn!(
            "took back {} task(s) an earlier agent launched ({:?}) with {books}; what they \
             allocated or freed while no agent ran was not seen: their memory figures are marked \
             unsure (quotas not enforced on them)",
            taken.tasks.len(),
            taken.tasks
        );
    }
}

/// At a stop (every task thawed): the books' pins go unless a launched task
/// runs on, as its record says (it stays for the next agent, which keeps the
/// books too).
pub fn at_stop(instance: &Instance, pins: Option<&Pins>) {
    let Some(p) = pins else {
        return;
    };
    let left = std::fs::read_dir(instance.task_dir())
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("task-"))
        })
        .unwrap_or(false);
    if !left {
        p.remove();
    }
}

/// The video memory per GPU the kernel's books (`TOTALS`) hold for `pids`.
pub fn video_bytes(totals: &BTreeMap<(u32, u32), Totals>, pids: &[u32]) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for (&(pid, gpu), t) in totals {
        if pid != 0 && gpu < keling_common::NO_GPU && pids.contains(&pid) {
            *out.entry(gpu).or_default() += t.bytes;
        }
    }
    out
}

/// What [`Daemon::take_back`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TakenBack {
    /// The tasks taken back, by id.
    pub tasks: Vec<TaskId>,
    /// Records refused or stale: (record, why). Each was removed.
    pub dropped: Vec<(String, String)>,
}

impl Daemon {
    /// Keeps a record of each launched task in `dir` (the instance's task
    /// directory), for the next agent.
    pub fn keep_records(&mut self, dir: PathBuf) {
        self.records = Some(dir);
    }

    /// Writes launched task `id`'s record (it was placed): spec as the core holds
    /// it (on the GPU it runs on), root process, cgroup and owner. A failure is
    /// said, once per task: that task would not survive a restart.
    pub(super) fn record_task(&mut self, id: TaskId) {
        let Some(dir) = &self.records else {
            return;
        };
        let (Some(t), Some(view)) = (self.members.get(id), self.sched.task(id)) else {
            return;
        };
        let Some(cgroup) = t.cgroup.clone() else {
            return; // adopted, not launched: its process is found again anyway
        };
        let Some(start_ticks) = self.host.start_ticks(t.pid) else {
            return; // gone already: its end is on its way
        };
        let mut spec = view.spec.clone();
        spec.gpu = view.gpu.or(spec.gpu);
        let rec = TaskRecord {
            version: records::VERSION,
            spec,
            start_ticks,
            cgroup,
            uid: t.uid,
            slurm: t.slurm,
        };
        if let Err(e) = records::write(dir, &rec) {
            log::warn!(
                "task {id}: cannot write its record in {} ({e:#}): an agent restarted while it \
                 runs will not take it back",
                dir.display()
            );
        }
    }

    /// Task `id` ended: its record goes.
    pub(super) fn unrecord(&mut self, id: TaskId) {
        if let Some(dir) = &self.records {
            records::remove(dir, id);
        }
    }

    /// Takes back the tasks an earlier agent launched that still run (`found`:
    /// the records read at start; see the module's doc). `memory`: the GPU
    /// video memory the kernel's books hold per GPU for a set of processes;
    /// `track`: makes the probes follow a process of a task (pid, task root).
    /// Run once, before the first request is served.
    pub fn take_back(
        &mut self,
        found: Found,
        memory: &dyn Fn(&[u32]) -> BTreeMap<u32, u64>,
        track: &mut dyn FnMut(u32, u32) -> anyhow::Result<()>,
    ) -> TakenBack {
        let mut out = TakenBack {
            dropped: found.refused,
            ..TakenBack::default()
        };
        for rec in found.records {
            let id = rec.spec.id;
            let pid = rec.spec.pid;
            let started = self
                .host
                .readopt(id, pid, rec.start_ticks, &rec.cgroup)
                .and_then(|s| {
                    if self.members.get(id).is_some() || self.sched.task(id).is_some() {
                        anyhow::bail!("task {id} exists already");
                    }
                    Ok(s)
                });
            let started = match started {
                Ok(s) => s,
                Err(e) => {
                    if let Some(dir) = &self.records {
                        records::remove(dir, id);
                    }
                    out.dropped.push((format!("task-{id}"), format!("{e:#}")));
                    continue;
                }
            };
            let mut spec = rec.spec;
            let known: Vec<u32> = self.sched.config().gpus.iter().map(|g| g.index).collect();
            if let Some(g) = spec.gpu.filter(|g| !known.is_empty() && !known.contains(g)) {
                log::warn!(
                    "task {id}: its record names GPU {g}, which this agent does not know \
                     (GPUs {known:?}): placed anew"
                );
                spec.gpu = None;
            }
            self.next_id = self.next_id.max(id + 1);
            self.members.insert(
                id,
                TaskRuntime {
                    pid,
                    actuator: started.actuator,
                    cgroup: Some(started.cgroup),
                    uid: rec.uid,
                    our_child: false,
                    conn: None,
                    last_active_ns: 0,
                    exit_seen: None,
                    exited_ns: None,
                    slurm: rec.slurm,
                },
                None,
            );
            self.histories.owner(id, rec.uid);
            let procs = self.host.members(id);
            for &p in &procs {
                if let Err(e) = track(p, pid) {
                    log::warn!("task {id}: the probes cannot follow pid {p}: {e:#}");
                }
            }
            let now = self.host.now_ns();
            log::info!(
                "task {id} (pid {pid}, {}, uid {}, priority {}) taken back from an earlier agent \
                 ({} process(es) in {})",
                spec.name,
                rec.uid,
                spec.priority,
                procs.len(),
                rec.cgroup.display()
            );
            self.step_now(&Input::Arrive { spec, ts_ns: now });
            for (gpu, bytes) in memory(&procs) {
                if bytes > 0 {
                    self.step_now(&Input::MemAlloc {
                        id,
                        gpu,
                        bytes,
                        ts_ns: now,
                    });
                }
            }
            // Whatever it did while no agent ran was not seen.
            self.step_now(&Input::MemUnsure { id, ts_ns: now });
            out.tasks.push(id);
        }
        self.members.reconcile(&*self.host);
        out
    }

    /// `{"attach": ...}`: a launch's client whose agent went away reconnects to
    /// its task, now this agent's. Only the task's owner (or root) may; the task
    /// must be the launched one it names (id and root pid). It hears `accepted`
    /// again, then the notices and the exit code, as a launch's client.
    pub(super) fn attach(
        &mut self,
        req: &AttachRequest,
        peer: &Peer,
        conn: u64,
        reply: &Replier,
    ) -> Result<(), ReplyError> {
        let Some(t) = self.members.get(req.task).filter(|t| t.launched()) else {
            // Ended under this agent before its client came back: the archive
            // knows how (its owner only).
            let view = self.sched.task(req.task);
            let owner = self.histories.get(req.task).and_then(|h| h.uid);
            if let Some(code) = view
                .as_ref()
                .filter(|v| v.spec.pid == req.pid)
                .and_then(|v| v.exit_code)
                && (owner == Some(peer.creds.uid) || peer.creds.uid == 0)
            {
                reply.send(Reply::Accepted(Accepted {
                    task: req.task,
                    gpu: view.as_ref().and_then(|v| v.gpu),
                    pid: req.pid,
                }));
                reply.send(Reply::ExitCode(code));
                return Ok(());
            }
            return Err(ReplyError::new(
                ErrorKind::NotFound,
                format!(
                    "no running launched task {} here: it ended while no agent ran (its exit \
                     status is not known), or this agent did not take it back",
                    req.task
                ),
            ));
        };
        if peer.creds.uid != t.uid && peer.creds.uid != 0 {
            return Err(ReplyError::new(
                ErrorKind::NotPermitted,
                format!(
                    "task {} belongs to uid {}: only its owner may attach to it",
                    req.task, t.uid
                ),
            ));
        }
        if t.pid != req.pid {
            return Err(ReplyError::new(
                ErrorKind::NotFound,
                format!(
                    "task {} is pid {}, not {}: not the task this client launched",
                    req.task, t.pid, req.pid
                ),
            ));
        }
        if self.clients.has(req.task) {
            return Err(ReplyError::new(
                ErrorKind::Refused,
                format!(
                    "task {} has its launch client attached already: only one client follows a \
                     task",
                    req.task
                ),
            ));
        }
        let (id, pid) = (req.task, t.pid);
        let gpu = self.sched.task(id).and_then(|v| v.gpu);
        if let Some(old) = self.members.get(id).and_then(|t| t.conn) {
            self.conn_task.remove(&old); // its client is gone
        }
        self.members.set_conn(id, conn);
        self.conn_task.insert(conn, id);
        self.clients.attach(
            reply.clone(),
            Accepted { task: id, gpu, pid },
            req.notify_preempt,
        );
        log::info!(
            "task {id}: its launch client (uid {}, pid {:?}) attached again",
            peer.creds.uid,
            peer.pid
        );
        Ok(())
    }
}
