//! Late binding ([`Binding::Late`]): the host-level queue of unbound tasks, when
//! one of them can run and on which GPU ("Binding" in the crate doc), and what a
//! queued task shows ([`QueuedView`]). Nothing here runs under
//! [`Binding::AtArrival`]: its queue is always empty.
//!
//! A queued task `u` can run on a GPU `g` it may use when fewer than
//! `slots_per_gpu` of the tasks bound to `g` *keep* their claim against it:
//! - holders it may not displace: every holder under FIFO; holders that want the
//!   GPU with a priority equal to or higher than `u`'s (late binding never
//!   rotates a holder out for an unbound task: equal priorities rotate among the
//!   tasks bound to a GPU); under goav, lower-priority holders that are no
//!   preemption candidate, but only while at least two candidates qualify over
//!   all the GPUs `u` may use (the guard prefers whom to displace; it never
//!   makes `u` wait);
//! - holders being frozen: the slot is handed over when the freeze is
//!   confirmed, to whoever ranks first then;
//! - tasks waiting there (frozen, or arrived pinned and not yet decided) that
//!   rank before `u`.
//!
//! The rest of the holders (idle ones, and lower priorities) are displaceable.
//! Among the GPUs where `u` can run, a GPU with a free slot (room without
//! displacing anyone) is preferred: [`choose_free_gpu`] picks by weight, then
//! least busy time, then the seeded hash. Otherwise `u` goes where the task it
//! displaces ranks last. A task that cannot run anywhere stops the binding for
//! this step: whoever ranks after it cannot run either (every claim against it
//! is one against them).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

use super::{Output, Scheduler, resume};
use crate::action::Action;
use crate::config::Binding;
use crate::placement::{FreeGpu, choose_free_gpu};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::state::{QueuedView, TaskState, WaitReason};
use crate::task::{Rank, Task};
use crate::{PREEMPTION_MIN_CANDIDATES, TaskId};

/// What one GPU has for a queued task.
#[derive(Debug, Default)]
struct Room {
    /// Claims the task cannot take away (see the module doc).
    kept: usize,
    /// Ranks of the holders it may displace because they are idle.
    idle: Vec<Rank>,
    /// Ranks of the holders it may displace by priority.
    lower: Vec<Rank>,
    /// Under goav, ranks of the lower-priority holders that are no preemption
    /// candidate: displaceable only while fewer than two candidates qualify.
    guarded: Vec<Rank>,
}

impl Scheduler {
    /// The GPUs an unbound task may be bound to: the configured ones, or GPU 0
    /// when none is (as placement at arrival).
    pub(super) fn eligible_gpus(&self) -> Vec<u32> {
        if self.capacity_bytes.is_empty() {
            vec![0]
        } else {
            self.capacity_bytes.keys().copied().collect()
        }
    }

    /// Binds every queued task that can run now, in the queue's order, and
    /// returns them. Each becomes `Running` at once (reason `placed`) after its
    /// `Place`: the agent starts it on that GPU.
    pub(super) fn bind_queued(&mut self, out: &mut Output) -> BTreeSet<TaskId> {
        let mut bound = BTreeSet::new();
        if self.queue.is_empty() {
            return bound;
        }
        // Walk the queue from its head; binding removes a task from it, so the
        // walk resumes after the last key seen.
        let mut after: Option<(Rank, TaskId)> = None;
        loop {
            let next = match after {
                None => self.queue.iter().next(),
                Some(key) => self.queue.range((Excluded(key), Unbounded)).next(),
            };
            let Some(&key) = next else {
                break;
            };
            after = Some(key);
            let id = key.1;
            let Some(task) = self.tasks.get(&id) else {
                continue;
            };
            if task.ending.is_some() {
                continue;
            }
            // Memory sharing: a task that already holds memory (on GPUs it
            // would use too) may be kept by those alone.
            let holds_memory = self.shares_memory() && task.total_mem() > 0;
            match self.binding_for(task) {
                Ok(gpu) => {
                    self.bind(id, gpu, out);
                    bound.insert(id);
                }
                // Memory sharing: a smaller task after it may fit.
                Err(WaitReason::Memory) => {}
                Err(_) if holds_memory => {}
                Err(_) => break,
            }
        }
        bound
    }

    fn bind(&mut self, id: TaskId, gpu: u32, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        task.gpu = Some(gpu);
        // Its expected runtime starts now: held before exec, it had not started.
        task.expected_from_ns = now;
        let key = (task.rank_under(self.policy), id);
        out.actions.push(Action::Place { id, gpu });
        resume(&mut self.next_event_id, now, task, Reason::Placed, out);
        // A queued task's rank does not change: it wants the GPU (held, it
        // cannot be idle) and only running tasks move in their queue.
        if !self.queue.remove(&key) {
            self.queue.retain(|&(_, queued)| queued != id);
        }
    }

    /// Where the unbound `u` can run now, or why it cannot.
    fn binding_for(&self, u: &Task) -> Result<u32, WaitReason> {
        debug_assert_eq!(self.config.binding, Binding::Late);
        // With a cap of 1 a GPU runs one task whatever memory it has: what
        // follows is exactly that.
        if self.shares_memory() && self.config.cap() > 1 {
            return self.binding_for_shared(u);
        }
        let slots = self.config.slots();
        let policy = self.policy;
        let now = self.now_ns;
        let u_rank = u.rank_under(policy);
        let mut rooms: BTreeMap<u32, Room> = self
            .eligible_gpus()
            .into_iter()
            .map(|g| (g, Room::default()))
            .collect();
        // A task has a claim on every GPU it uses: where it is placed and
        // wherever it holds memory.
        let claims = self
            .tasks
            .values()
            .filter(|t| t.is_live())
            .flat_map(|t| t.gpus_used().into_iter().map(move |g| (g, t)));
        for (g, t) in claims {
            let Some(room) = rooms.get_mut(&g) else {
                continue;
            };
            let candidate = || !policy.guarded() || t.preemption_candidate(now);
            if t.state == TaskState::Running && !t.yielded && t.actuation.is_none() {
                if policy == Policy::Fifo {
                    room.kept += 1;
                } else if !t.wants_gpu {
                    room.idle.push(t.rank_under(policy));
                } else if t.priority() > u.priority() && candidate() {
                    room.lower.push(t.rank_under(policy));
                } else if t.priority() > u.priority() {
                    room.guarded.push(t.rank_under(policy));
                } else {
                    room.kept += 1;
                }
            } else if t.holds_slot() || t.actuation.is_some() {
                // Being thawed (it runs next), or being frozen (it runs until
                // the freeze is confirmed).
                room.kept += 1;
            } else if t.rank_under(policy) < u_rank && t.gpus_used().len() == 1 {
                // A waiting task that uses several GPUs keeps no claim: it may
                // be waiting for another of them, and is ranked last here then
                // (the next step ranks it again if it is not).
                room.kept += 1;
            }
        }
        // The goav guard is a preference, never a reason to wait: with at
        // least two candidates over the GPUs `u` may use, the holders that
        // expect to finish soon are kept; with fewer, they are displaceable
        // like any lower priority.
        let candidates: usize = rooms.values().map(|r| r.lower.len()).sum();
        for room in rooms.values_mut() {
            let guarded = std::mem::take(&mut room.guarded);
            if candidates >= PREEMPTION_MIN_CANDIDATES {
                room.kept += guarded.len();
            } else {
                room.lower.extend(guarded);
            }
        }
        let free: Vec<u32> = rooms
            .iter()
            .filter(|(_, r)| r.kept + r.idle.len() + r.lower.len() < slots)
            .map(|(&g, _)| g)
            .collect();
        if !free.is_empty() {
            return Ok(self.best_free_gpu(u.spec.id, &free));
        }
        // Displace: where the task it displaces ranks last.
        rooms
            .iter()
            .filter(|(_, r)| r.kept < slots)
            .filter_map(|(&g, r)| r.idle.iter().chain(&r.lower).max().map(|&rank| (rank, g)))
            .max()
            .map(|(_, g)| g)
            .ok_or(WaitReason::SlotsHeld)
    }

    /// Among `free` (not empty), the GPU late binding puts `task` on.
    pub(super) fn best_free_gpu(&self, task: TaskId, free: &[u32]) -> u32 {
        let weights: BTreeMap<u32, f64> = self.placement_weights_iter(self.now_ns).collect();
        let gpus: Vec<FreeGpu> = free
            .iter()
            .map(|&gpu| FreeGpu {
                gpu,
                weight: weights.get(&gpu).copied().unwrap_or(0.0),
                busy_ns: self.busy_ns.get(&gpu).copied().unwrap_or(0),
            })
            .collect();
        choose_free_gpu(&gpus, self.config.placement_seed, task).unwrap_or(free[0])
    }

    /// The host-level queue of late binding, in order: every live task waiting
    /// unbound, its position and why it waits. Empty under
    /// [`Binding::AtArrival`].
    pub fn queue(&self) -> Vec<QueuedView> {
        self.queue
            .iter()
            .enumerate()
            .filter_map(|(ahead, &(_, id))| self.queued_at(ahead, id))
            .collect()
    }

    /// One queued task's place in [`Scheduler::queue`]; `None` for a task that
    /// is not waiting unbound.
    pub fn queued(&self, id: TaskId) -> Option<QueuedView> {
        let ahead = self.queue.iter().position(|&(_, q)| q == id)?;
        self.queued_at(ahead, id)
    }

    /// The view of queued task `id`, `ahead` places from the front.
    fn queued_at(&self, ahead: usize, id: TaskId) -> Option<QueuedView> {
        let task = self.tasks.get(&id)?;
        let reason = if task.ending.is_some() {
            WaitReason::Ending
        } else {
            // Every task that could run was bound by the last step.
            self.binding_for(task)
                .err()
                .unwrap_or(WaitReason::SlotsHeld)
        };
        Some(QueuedView {
            id,
            position: ahead + 1,
            ahead,
            reason,
        })
    }

    /// Late binding: per GPU, how long it has had a task `Running` (the
    /// tie-break after the weight), sorted by index; empty under
    /// [`Binding::AtArrival`], which does not keep it.
    pub fn busy_ns(&self) -> Vec<(u32, u64)> {
        self.busy_ns.iter().map(|(&g, &ns)| (g, ns)).collect()
    }
}
