//! `{"slurm_attach": ...}`: a Slurm job step's task, handed over by the SPANK plugin
//! from inside that task before it execs (see `crate::slurm`).
//!
//! Only root may ask, and only for its own process (SO_PEERCRED's pid): the
//! plugin runs as root in the task (`task_init_privileged`), so the process is
//! alive and waiting on its answer while it is moved into a cgroup of its own.
//! Everything else comes from the job (owner, GPU, budget, priority) and is
//! checked as a launch is: the owner's access rules decide the priority it may
//! have and cap its quota, and its GPU must be one of this agent's. From then on
//! it is a task like a launched one (frozen through its cgroup, its memory
//! counted, its quota enforced); what `keling launch` would print about it goes
//! to the standard error the plugin passed (the job's output file).
use std::os::fd::OwnedFd;

use keling_sched::{Input, TaskSpec};

use super::Daemon;
use crate::{
    control::{
        Accepted, ErrorKind, Reply, ReplyError, SlurmAttachRequest,
        server::{Peer, Replier},
    },
    os::users::Credentials,
    sched::{launch, members::TaskRuntime},
};

/// The most GPUs an attach may name (Slurm's GPU list of one node).
const MAX_GPUS: usize = 64;
/// The most supplementary groups an attach may name (Linux's NGROUPS_MAX).
const MAX_GROUPS: usize = 65_536;

/// Checks what an attach asks for before anything is done about it.
pub(super) fn check(req: &SlurmAttachRequest, peer: &Peer, fds: usize) -> Result<(), ReplyError> {
    if peer.creds.uid != 0 {
        return Err(ReplyError::new(
            ErrorKind::NotPermitted,
            format!(
                "uid {} may not attach a process: only root (the Slurm plugin in slurmstepd) may",
                peer.creds.uid
            ),
        ));
    }
    if peer.pid.is_none_or(|p| p <= 0 || p as u32 != req.pid) {
        return Err(ReplyError::new(
            ErrorKind::NotPermitted,
            format!(
                "pid {} is not the caller's (the caller is pid {:?}): a process attaches only itself",
                req.pid, peer.pid
            ),
        ));
    }
    if req.groups.len() > MAX_GROUPS {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            format!(
                "an attach names at most {MAX_GROUPS} supplementary groups (it named {})",
                req.groups.len()
            ),
        ));
    }
    if req.gpus.is_empty() || req.gpus.len() > MAX_GPUS {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            format!(
                "an attach names 1 to {MAX_GPUS} GPUs of the job's allocation (it named {})",
                req.gpus.len()
            ),
        ));
    }
    if let Some(p) = req.priority
        && p > launch::MAX_PRIORITY
    {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            format!(
                "priority {p} is out of range: priorities are 0 (highest) to {}",
                launch::MAX_PRIORITY
            ),
        ));
    }
    if req.mem_budget_bytes == Some(0) {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            "a memory budget of 0 bytes: a job with shards has at least one (1 GiB)",
        ));
    }
    if fds > 1 {
        return Err(ReplyError::new(
            ErrorKind::Invalid,
            format!("an attach passes at most one fd (the task's standard error), not {fds}"),
        ));
    }
    Ok(())
}

impl Daemon {
    /// Whether `pid` is a process of a Slurm job step's task (for what Slurm is
    /// told of memory outside its jobs: `crate::slurm::node`).
    pub fn in_slurm_task(&self, pid: u32) -> bool {
        self.members
            .task_of(pid)
            .and_then(|id| self.members.get(id))
            .is_some_and(|t| t.slurm.is_some())
    }

    /// The Slurm job step of the task `pid` belongs to (`/metrics` labels).
    pub fn slurm_of(&self, pid: u32) -> Option<crate::control::SlurmRef> {
        self.members
            .task_of(pid)
            .and_then(|id| self.members.get(id))
            .and_then(|t| t.slurm)
    }

    /// Makes the caller's process a task (see the module doc). Its answer is
    /// `accepted` once the process is in its cgroup and tracked.
    pub(super) fn slurm_attach(
        &mut self,
        req: &SlurmAttachRequest,
        fds: Vec<OwnedFd>,
        peer: &Peer,
        reply: &Replier,
        track: &mut dyn FnMut(u32) -> anyhow::Result<()>,
    ) -> Result<(), ReplyError> {
        check(req, peer, fds.len())?;
        check_cgroup(self.host.facts(req.pid).cgroup.as_deref(), req.slurm.job)?;
        let gpu = req.gpus[0];
        launch::check_gpu_exists(gpu, &self.sched)?;
        let owner = Credentials {
            uid: req.uid,
            gid: req.gid,
            groups: req.groups.clone(),
        };
        let (priority, mem_quota_bytes) = self
            .config
            .access_policy
            .launch_terms(
                &owner,
                req.priority,
                None,
                self.settings.default_priority,
                req.mem_budget_bytes,
            )
            .map_err(|why| ReplyError::new(ErrorKind::Refused, why))?;
        let id = self.next_id;
        let started = self
            .host
            .attach(id, req.pid, track)
            .map_err(|e| ReplyError::new(ErrorKind::StartFailed, format!("{e:#}")))?;
        self.next_id += 1;
        let pid = started.pid;
        // With its standard error: what Keling tells it goes there, and Slurm
        // hears why before the signal that ends it (`crate::slurm::job`).
        let (out, actuator) = match fds.into_iter().next() {
            Some(stderr) => {
                let (out, actuator) =
                    crate::slurm::job::output(stderr, req.slurm, started.actuator);
                (Some(out), actuator)
            }
            None => (None, started.actuator),
        };
        self.members.insert(
            id,
            TaskRuntime {
                pid,
                actuator,
                cgroup: Some(started.cgroup),
                uid: req.uid,
                our_child: false,
                conn: None,
                last_active_ns: 0,
                exit_seen: None,
                exited_ns: None,
                slurm: Some(req.slurm),
            },
            None,
        );
        self.histories.owner(id, req.uid);
        let accepted = Accepted {
            task: id,
            gpu: Some(gpu),
            pid,
        };
        if let Some(out) = out {
            self.clients.add(out, accepted.clone(), req.notify_preempt);
            // It is executing already as far as its notices go.
            self.clients.exec_outcome(id, Ok(()));
            self.clients.settle(id);
        }
        reply.send(Reply::Accepted(accepted));
        log::info!(
            "task {id}: pid {pid}, Slurm job step {} task {} of uid {} on GPU {gpu}, priority \
             {priority}, budget {}",
            req.slurm.step_label(),
            req.slurm.task,
            req.uid,
            mem_quota_bytes.map_or("none".into(), |b| format!("{b} bytes")),
        );
        self.step_now(&Input::Arrive {
            spec: TaskSpec {
                id,
                pid,
                name: format!("slurm-{}", req.slurm.step_label()),
                priority,
                gpu: Some(gpu),
                mem_quota_bytes,
                // Slurm enforces the job's own time limit.
                max_duration_ms: Some(u64::MAX),
                grace_ms: None,
                hard_kill: None,
                expected_runtime_ms: None,
            },
            ts_ns: self.host.now_ns(),
        });
        Ok(())
    }
}

/// Where the task's process is (`cgroup`, its cgroup v2 path) must not be a
/// cgroup Slurm made for job `job`'s steps (its cgroup/v2 plugin:
/// `.../job_<id>/step_<s>/user/task_<n>`). Taking the task into Keling's own
/// cgroup would take it out of Slurm's: out of what proctrack/cgroup signals
/// (scancel, the time limit, the step's end) and of what task/cgroup
/// constrains (the GPUs it may open, its memory). So the agent does not take
/// it on, and says why; the plugin lets the job run without Keling (or
/// refuses it, with `refuse_without_agent`). With proctrack/linuxproc and
/// task/none, the setup Slurm runs with on these machines, the task is in
/// slurmd's cgroup, which is not Slurm's to track by.
pub(super) fn check_cgroup(cgroup: Option<&str>, job: u32) -> Result<(), ReplyError> {
    let Some(path) = cgroup else {
        return Ok(());
    };
    let job_dir = format!("job_{job}");
    let mut parts = path.split('/').skip_while(|p| *p != job_dir);
    if parts.next().is_some() && parts.next().is_some_and(|p| p.starts_with("step_")) {
        return Err(ReplyError::new(
            ErrorKind::Unsupported,
            format!(
                "the task is in Slurm's own cgroup {path} (its cgroup plugins track, signal and \
                 constrain it there); Keling would have to take it out of it, so it does not take \
                 the task on"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::SlurmRef;

    /// A task in Slurm's own step cgroup (cgroup/v2 plugin) is not taken out
    /// of it; one in slurmd's cgroup (proctrack/linuxproc) or elsewhere is
    /// taken on, as is one in another job's cgroup that merely names a step.
    #[test]
    fn a_task_in_slurms_own_step_cgroup_is_left_there() {
        for path in [
            "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0",
            "/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0",
            "/slurm/job_7/step_interactive",
        ] {
            let e = check_cgroup(Some(path), 7).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Unsupported);
            assert!(e.message.contains(path), "{e}");
        }
        for path in [
            "/system.slice/slurmd.service",
            "/",
            "/system.slice/slurmstepd.scope/job_70/step_0/user/task_0",
            "/user.slice/job_7",
        ] {
            assert!(check_cgroup(Some(path), 7).is_ok(), "{path}");
        }
        assert!(check_cgroup(None, 7).is_ok());
    }

    fn req() -> SlurmAttachRequest {
        SlurmAttachRequest {
            pid: 4242,
            uid: 1000,
            gid: 1000,
            slurm: SlurmRef {
                job: 7,
                step: 0,
                task: 0,
            },
            gpus: vec![0],
            mem_budget_bytes: Some(2 << 30),
            priority: Some(3),
            notify_preempt: false,
            groups: vec![100, 500],
        }
    }

    fn peer(uid: u32, pid: i32) -> Peer {
        Peer {
            creds: Credentials {
                uid,
                gid: uid,
                groups: Vec::new(),
            },
            pid: Some(pid),
        }
    }

    #[test]
    fn only_root_attaches_and_only_itself() {
        assert!(check(&req(), &peer(0, 4242), 1).is_ok());
        let e = check(&req(), &peer(1000, 4242), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotPermitted);
        let e = check(&req(), &peer(0, 4243), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotPermitted);
        assert!(e.message.contains("attaches only itself"), "{e}");
    }

    #[test]
    fn what_the_job_says_is_checked() {
        let mut r = req();
        r.priority = Some(16);
        assert_eq!(
            check(&r, &peer(0, 4242), 1).unwrap_err().kind,
            ErrorKind::Invalid
        );
        let mut r = req();
        r.gpus.clear();
        assert_eq!(
            check(&r, &peer(0, 4242), 1).unwrap_err().kind,
            ErrorKind::Invalid
        );
        let mut r = req();
        r.mem_budget_bytes = Some(0);
        assert_eq!(
            check(&r, &peer(0, 4242), 1).unwrap_err().kind,
            ErrorKind::Invalid
        );
        assert_eq!(
            check(&req(), &peer(0, 4242), 2).unwrap_err().kind,
            ErrorKind::Invalid
        );
        let mut r = req();
        r.groups = vec![7; MAX_GROUPS + 1];
        assert_eq!(
            check(&r, &peer(0, 4242), 1).unwrap_err().kind,
            ErrorKind::Invalid
        );
    }
}
