//! A task whose GPU memory figure a full kernel table made unsure (issue 32):
//! its quota is not enforced on that figure (a release Keling missed may have
//! inflated it), but on a sound lower bound of its memory the caller measures
//! from the kernel's objects (`Probes::sure_video_bytes`) whenever the unsure
//! figure is over the quota. So a task cannot escape its quota by filling its
//! own tables on purpose, and is never ended on memory it may no longer hold.
use std::collections::BTreeSet;

use keling_sched::{Input, TaskId};

use super::{Cause, Daemon};

impl Daemon {
    /// Live tasks not being ended whose figure is unsure and over their quota,
    /// with their figure (all GPUs) and their processes: the ones to judge on a
    /// sound lower bound.
    pub fn unsure_over_quota(&self) -> Vec<(TaskId, u128, BTreeSet<u32>)> {
        self.members
            .tasks()
            .filter_map(|(id, _)| {
                let t = self.sched.task(id)?;
                let quota = t.spec.mem_quota_bytes?;
                let held: u128 = t.mem_bytes.values().map(|&b| u128::from(b)).sum();
                (t.mem_unsure
                    && t.ending_reason.is_none()
                    && t.finished_ns.is_none()
                    && held > u128::from(quota))
                .then(|| (id, held, self.members.pids_of(id)))
            })
            .collect()
    }

    /// `bytes`: a sound lower bound of task `id`'s video memory, all GPUs
    /// together; the core ends the task if it is over its quota.
    pub fn judge_unsure(&mut self, id: TaskId, bytes: u64) {
        let received_ns = self.host.now_ns();
        let input = Input::MemSure {
            id,
            bytes,
            ts_ns: received_ns,
        };
        self.step(&input, Cause::of(&input, received_ns));
        if self
            .sched
            .task(id)
            .is_some_and(|t| t.ending_reason.is_some())
        {
            log::warn!(
                "task {id}: its GPU memory figure is unsure (a kernel table was full), but \
                 {bytes} bytes of it are certainly still allocated, over its quota: ending it"
            );
        }
    }
}
