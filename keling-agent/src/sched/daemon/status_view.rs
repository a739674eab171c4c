//! What `keling status` shows, rendered from the daemon's state and never
//! changing it: [`StatusView`] borrows what it reads (the core, the latency
//! figures, the members, the histories, the archive's counts and the clock).
use std::collections::BTreeMap;

use keling_sched::{Scheduler, TaskId};

use super::{DaemonSettings, Finished};
use crate::{
    control::{
        ArchiveSummary, PlacementStatus, STATUS_ARCHIVED_MAX, StatusPage, StatusReply, TaskHistory,
        TaskStatus,
    },
    latency::{LatencyRecorder, Stage},
    sched::{
        history::{self, Histories},
        host::Host,
        members::Members,
    },
};

/// The daemon's state as a status reads it.
pub(super) struct StatusView<'a> {
    pub sched: &'a Scheduler,
    pub latency: &'a LatencyRecorder,
    pub host: &'a dyn Host,
    pub members: &'a Members,
    pub histories: &'a Histories,
    pub settings: &'a DaemonSettings,
    pub finished: &'a Finished,
}

impl StatusView<'_> {
    /// What `keling status` shows to `caller` (its tasks marked as its own).
    pub fn status_for(&self, caller: Option<u32>) -> StatusReply {
        self.status_page(caller, StatusPage::default())
    }

    /// What `keling status` shows to `caller` (its tasks marked as its own):
    /// every live task, and the archived ones of `page` (those that finished
    /// last, after skipping `page.skip`; at most [`STATUS_ARCHIVED_MAX`]), all
    /// sorted by id. Its size and the time it takes are bounded by the live tasks
    /// and the archive's cap, whatever ran before.
    pub fn status_page(&self, caller: Option<u32>, page: StatusPage) -> StatusReply {
        let now = self.host.now_ns();
        let views = self.sched.live_tasks();
        let archived = self
            .sched
            .recent_archived(page.skip, page.archived.min(STATUS_ARCHIVED_MAX));
        let kept = self.sched.archived_len();
        let archive = ArchiveSummary {
            kept,
            listed: archived.len(),
            skipped: page.skip.min(kept),
            max_kept: self.settings.archive_max,
            retention_s: self.settings.archive_retention_ns / 1_000_000_000,
            completed: self.finished.completed,
            failed: self.finished.failed,
            forgotten: self.finished.forgotten,
        };
        let mut tasks: Vec<TaskStatus> = views
            .iter()
            .chain(&archived)
            .map(|t| self.task_status(&views, t, caller, now))
            .collect();
        // By id, as before the archive was paged.
        tasks.sort_unstable_by_key(|t| t.id);
        // Per stage, for the actions that are confirmed (what `cargo xtask bench` shows).
        let stages_by_action = ["freeze", "thaw"]
            .into_iter()
            .map(|action| {
                let per = Stage::ALL
                    .iter()
                    .filter_map(|&stage| {
                        let p = self.latency.percentiles(stage, Some(action))?;
                        Some((stage.as_str().to_owned(), p))
                    })
                    .collect();
                (action.to_owned(), per)
            })
            .collect();
        let weights = self.sched.placement_weights(now);
        let mut used: BTreeMap<u32, f64> = weights.iter().map(|&(g, _)| (g, 0.0)).collect();
        // Archived tasks hold no memory.
        for t in &views {
            for (g, b) in &t.mem_bytes {
                *used.entry(*g).or_default() += *b as f64;
            }
        }
        let used: Vec<f64> = used.into_values().collect();
        StatusReply {
            caller_uid: caller,
            tasks,
            latency: self.latency.status(),
            stages_by_action,
            placement: PlacementStatus {
                weights,
                load_balance_error: keling_sched::load_balance_error(&used),
            },
            archive,
            gpus: crate::sched::sharing::gpu_memory(self.sched),
        }
    }

    /// One task as `keling status` shows it to `caller`.
    fn task_status(
        &self,
        views: &[keling_sched::TaskView],
        t: &keling_sched::TaskView,
        caller: Option<u32>,
        now: u64,
    ) -> TaskStatus {
        let rt = self.members.get(t.spec.id);
        let history = self.histories.get(t.spec.id);
        let uid = rt.map(|r| r.uid).or(history.and_then(|h| h.uid));
        let end = t.finished_ns.unwrap_or(now);
        TaskStatus {
            id: t.spec.id,
            pid: t.spec.pid,
            name: bounded_name(&t.spec.name),
            priority: t.spec.priority,
            class: t.class,
            state: t.state.as_str().to_owned(),
            gpu: t.gpu,
            mem_bytes: t.mem_bytes.values().sum(),
            mem_bytes_per_gpu: t.mem_bytes.clone(),
            mem_unsure: t.mem_unsure,
            on_gpu_ms: t.on_gpu_ms,
            elapsed_ms: end.saturating_sub(t.arrived_ns) / 1_000_000,
            wants_gpu: t.wants_gpu,
            yielded: t.yielded,
            in_flight: t.in_flight,
            cgroup: rt
                .and_then(|r| r.cgroup.as_ref())
                .map(|c| c.to_string_lossy().into_owned()),
            uid,
            slurm: rt.and_then(|r| r.slurm),
            mem_quota_bytes: t.spec.mem_quota_bytes,
            mine: caller.is_some() && uid == caller,
            state_for_ms: now.saturating_sub(history.map_or(t.arrived_ns, |h| h.state_since_ns))
                / 1_000_000,
            waiting: history::waiting(views, t, history, now),
            queued: self.sched.queued(t.spec.id),
            wait_reason: self.sched.wait_reason(t.spec.id),
            pinned_gpu: t.spec.gpu,
            ending_reason: t.ending_reason,
            exit_code: t.exit_code,
        }
    }

    /// `keling status TASK`: the task now, its transitions and its decisions.
    pub fn history(&self, id: TaskId, caller: u32) -> Option<TaskHistory> {
        let view = self.sched.task(id)?;
        let views = self.sched.live_tasks();
        let task = self.task_status(&views, &view, Some(caller), self.host.now_ns());
        let h = self.histories.get(id);
        Some(TaskHistory {
            task,
            arrived_ns: view.arrived_ns,
            transitions: h.map_or_else(Vec::new, |h| h.transitions.iter().cloned().collect()),
            decisions: h.map_or_else(Vec::new, |h| h.decisions.iter().cloned().collect()),
            transitions_dropped: h.map_or(0, |h| h.transitions_dropped),
            decisions_dropped: h.map_or(0, |h| h.decisions_dropped),
        })
    }
}

/// The most bytes of a task's name a status shows (a launch's argv[0] may be
/// as long as the request): a reply's size stays bounded by its task count.
const NAME_MAX_SHOWN: usize = 255;

/// `name`, cut at [`NAME_MAX_SHOWN`] bytes (on a character boundary).
fn bounded_name(name: &str) -> String {
    let mut end = name.len().min(NAME_MAX_SHOWN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_shows_at_most_255_bytes_of_a_name() {
        assert_eq!(bounded_name("train"), "train");
        let long = "é".repeat(1000);
        let shown = bounded_name(&long);
        assert_eq!(
            shown.len(),
            254,
            "cut before the character that would pass 255"
        );
        assert!(long.starts_with(&shown));
    }
}
