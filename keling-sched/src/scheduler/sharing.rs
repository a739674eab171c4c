//! Who may run at once on one GPU ("Sharing" in the crate doc): the walk down a
//! GPU's ranking that admits tasks while a cap, the priorities and, under
//! [`Sharing::Memory`], memory allow ([`Admission`]); late binding's test of
//! whether a queued task can run on a GPU under memory sharing; what a waiting
//! task waits for; the overload rule.
//!
//! Under [`Sharing::Slots`] the walk admits the first `slots_per_gpu` tasks of
//! the ranking, whatever they hold: exactly what the core did before memory
//! sharing, so that recorded logs replay as they were recorded.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Output, Scheduler, begin_ending};
use crate::action::{Action, EnforcementRecord};
use crate::config::Sharing;
use crate::placement::{MEM_HORIZON_S, tie_hash};
use crate::policy::Policy;
use crate::reason::Reason;
use crate::state::{TaskState, WaitReason};
use crate::task::{Rank, Task};
use crate::{NS_PER_MS, NS_PER_S, TaskId};

/// What one GPU offers a task queued unbound, under memory sharing.
enum Offer {
    /// It runs there beside every holder.
    Free,
    /// It runs there beside the holders it may not displace: how many that
    /// want the GPU it freezes, and the one it displaces that ranks last, if
    /// any.
    Displacing(usize, Option<Rank>),
    /// It cannot run there now.
    No(WaitReason),
}

/// Memory sharing, late binding: how many empty GPUs a task leaves empty when
/// a GPU already running its priority is within the work tolerance too. A task
/// whose priority has no GPU of its own needs an empty one not to freeze
/// others: without one, a session of a higher priority froze a lower one for
/// its whole run (the transcode mix, 24 h, seeds 1-20: mean queueing 236 ms
/// median, 4 seeds at most 42.3 ms; keeping one: 20 ms, 11 seeds; two kept:
/// worse on seeds 1-8). Keeping it whatever the work gave 0 at every seed but
/// slowed every session down beside more others (docs/replay.md).
const KEEP_EMPTY: usize = 1;

/// How good a GPU is to displace holders on, higher better: fewer tasks that
/// work frozen, then the displaced task that ranks last.
type DisplaceKey = (Reverse<usize>, Option<Rank>);

/// One walk down a GPU's ranking: what the tasks admitted so far take.
#[derive(Clone, Debug)]
pub(super) struct Admission {
    gpu: u32,
    memory: bool,
    cap: usize,
    count: usize,
    /// The GPU's capacity less the memory held outside any task; `None` when
    /// its capacity is unknown (then memory never keeps a task waiting).
    avail: Option<u128>,
    /// What every live task holds on the GPU (frozen or waiting tasks keep
    /// their memory), plus what the tasks admitted so far may still take.
    used: u128,
    /// The best priority among the admitted tasks that want the GPU.
    best_active: Option<u8>,
}

impl Admission {
    /// Why `t` may not run beside the tasks admitted so far, if it may not.
    /// The first task admitted on a GPU always fits: waiting would not make
    /// memory appear (frozen tasks keep theirs), and a higher priority that
    /// needs memory gets it by eviction when its allocation fails.
    pub(super) fn check(&self, t: &Task) -> Result<(), WaitReason> {
        self.check_room(t)?;
        if self.memory && t.wants_gpu && self.best_active.is_some_and(|p| p < t.priority()) {
            return Err(WaitReason::HigherPriority);
        }
        Ok(())
    }

    /// [`Admission::check`] without the priorities: is there room.
    pub(super) fn check_room(&self, t: &Task) -> Result<(), WaitReason> {
        if self.count >= self.cap {
            return Err(WaitReason::SlotsHeld);
        }
        if self.memory && self.count > 0 {
            let extra = u128::from(t.mem_extra_on(self.gpu));
            if extra > 0 && self.avail.is_some_and(|avail| self.used + extra > avail) {
                return Err(WaitReason::Memory);
            }
        }
        Ok(())
    }

    /// A task that wants the GPU waits for memory: no lower priority may
    /// take what it waits for, so they wait behind it (equal priorities may
    /// still run beside it if they fit).
    pub(super) fn note_waiting(&mut self, t: &Task, reason: WaitReason) {
        if self.memory && t.wants_gpu && reason == WaitReason::Memory {
            let p = t.priority();
            self.best_active = Some(self.best_active.map_or(p, |b| b.min(p)));
        }
    }

    /// Counts `t` as running here.
    pub(super) fn admit(&mut self, t: &Task) {
        self.count += 1;
        if self.memory {
            self.used += u128::from(t.mem_extra_on(self.gpu));
            if t.wants_gpu {
                let p = t.priority();
                self.best_active = Some(self.best_active.map_or(p, |b| b.min(p)));
            }
        }
    }
}

impl Scheduler {
    /// Whether tasks share GPUs by memory.
    pub(super) fn shares_memory(&self) -> bool {
        self.config.sharing == Sharing::Memory
    }

    /// An empty walk of `gpu`.
    pub(super) fn admission(&self, gpu: u32) -> Admission {
        let memory = self.shares_memory();
        let (avail, used) = if memory {
            let avail = self.capacity_bytes.get(&gpu).map(|&capacity| {
                u128::from(capacity).saturating_sub(u128::from(self.outside_on(gpu)))
            });
            let used = self
                .tasks
                .values()
                .filter(|t| t.is_live())
                .map(|t| u128::from(t.mem_on(gpu)))
                .sum();
            (avail, used)
        } else {
            (None, 0)
        };
        Admission {
            gpu,
            memory,
            cap: self.config.cap(),
            count: 0,
            avail,
            used,
            best_active: None,
        }
    }

    /// Memory held on `gpu` by processes outside any task, as last reported.
    pub(super) fn outside_on(&self, gpu: u32) -> u64 {
        self.outside_bytes.get(&gpu).copied().unwrap_or(0)
    }

    /// Walks `gpu`'s tasks in rank order: the ones that should run there, and
    /// the others with what they wait for.
    pub(super) fn walk(
        &self,
        gpu: u32,
        ranked: &[TaskId],
    ) -> (Vec<TaskId>, Vec<(TaskId, WaitReason)>) {
        let mut admission = self.admission(gpu);
        let (mut hold, mut wait) = (Vec::new(), Vec::new());
        for &id in ranked {
            let Some(t) = self.tasks.get(&id) else {
                continue;
            };
            match admission.check(t) {
                Ok(()) => {
                    admission.admit(t);
                    hold.push(id);
                }
                Err(reason) => {
                    admission.note_waiting(t, reason);
                    wait.push((id, reason));
                }
            }
        }
        (hold, wait)
    }

    /// Whether the task `id`, admitted by the walk, can be thawed on `gpu`
    /// now: the tasks that hold it (those being frozen still run until the
    /// freeze lands) leave room under the cap, and, under memory sharing,
    /// none of them is being frozen (the walk admitted `id` beside the tasks
    /// that stay; the ones leaving may still take memory until they stop).
    pub(super) fn has_room(&self, gpu: u32, id: TaskId) -> bool {
        let memory = self.shares_memory();
        let mut holders = 0;
        for h in self.tasks.values().filter(|h| {
            h.spec.id != id && h.is_live() && h.holds_slot() && h.gpus_used().contains(&gpu)
        }) {
            if memory && !h.holds_slot_stably() {
                return false;
            }
            holders += 1;
        }
        holders < self.config.cap()
    }

    /// Memory sharing, late binding: what GPU `gpu` offers the unbound `u`.
    fn offer(&self, gpu: u32, u: &Task) -> Offer {
        let policy = self.policy;
        let mut all = self.admission(gpu);
        let mut kept = self.admission(gpu);
        let mut holders: Vec<&Task> = self
            .tasks
            .values()
            .filter(|t| t.is_live() && t.gpus_used().contains(&gpu))
            .filter(|t| t.holds_slot() || t.actuation.is_some())
            .collect();
        holders.sort_by_key(|t| (t.rank_under(policy), t.spec.id));
        let (mut last_displaced, mut lower): (Option<Rank>, usize) = (None, 0);
        for t in holders {
            all.admit(t);
            let running = policy != Policy::Fifo
                && t.state == TaskState::Running
                && !t.yielded
                && t.actuation.is_none();
            // A lower priority that wants the GPU is frozen for `u`; an idle
            // holder yields its place when a cap needs it.
            let is_lower = running && t.wants_gpu && t.priority() > u.priority();
            if is_lower || (running && !t.wants_gpu) {
                lower += usize::from(is_lower);
                let rank = t.rank_under(policy);
                last_displaced = Some(last_displaced.map_or(rank, |r| r.max(rank)));
            } else {
                kept.admit(t);
            }
        }
        // A higher priority that wants this GPU waits here: `u` may not take
        // what it waits for.
        let higher_waits = self.tasks.values().any(|w| {
            w.is_live()
                && !w.is_unbound()
                && w.ending.is_none()
                && w.wants_gpu
                && !w.holds_slot()
                && w.actuation.is_none()
                && w.priority() < u.priority()
                && w.gpus_used() == [gpu]
        });
        if higher_waits {
            return Offer::No(WaitReason::HigherPriority);
        }
        if lower == 0 && all.check(u).is_ok() {
            return Offer::Free;
        }
        match kept.check(u) {
            Ok(()) => Offer::Displacing(lower, last_displaced),
            Err(reason) => Offer::No(reason),
        }
    }

    /// Memory sharing, late binding: where the unbound `u` can run now, or why
    /// it cannot. A GPU where it runs beside every holder comes first (it
    /// displaces nobody); otherwise one where it fits beside the holders it
    /// may not displace (holders that want the GPU at its priority or higher,
    /// every holder under FIFO, and any with an actuation in flight), where
    /// it freezes the fewest tasks that work (each waits while it works), then
    /// where the task it displaces ranks last. Displaced tasks keep their memory.
    /// Never a GPU where a higher priority that wants it waits; and a task
    /// that holds memory already (on GPUs it will use too) only where each of
    /// those GPUs would take it as well.
    pub(super) fn binding_for_shared(&self, u: &Task) -> Result<u32, WaitReason> {
        let mut free: Vec<u32> = Vec::new();
        // Where it freezes the fewest tasks that work; among those, where
        // the one it displaces ranks last.
        let mut displace: Option<(DisplaceKey, u32)> = None;
        let mut why: Option<WaitReason> = None;
        // The nearest reason: memory (a smaller task could run), then a cap,
        // then a higher priority.
        let mut note = |reason: WaitReason| {
            let order = |r: WaitReason| match r {
                WaitReason::Memory => 0,
                WaitReason::SlotsHeld => 1,
                _ => 2,
            };
            if why.is_none_or(|w| order(reason) < order(w)) {
                why = Some(reason);
            }
        };
        let elsewhere: Vec<u32> = u
            .mem_bytes
            .iter()
            .filter(|&(_, &b)| b > 0)
            .map(|(&g, _)| g)
            .collect();
        for gpu in self.eligible_gpus() {
            let refused =
                elsewhere
                    .iter()
                    .filter(|&&h| h != gpu)
                    .find_map(|&h| match self.offer(h, u) {
                        Offer::No(reason) => Some(reason),
                        _ => None,
                    });
            if let Some(reason) = refused {
                note(reason);
                continue;
            }
            match self.offer(gpu, u) {
                Offer::Free => free.push(gpu),
                Offer::Displacing(frozen, rank) => {
                    let key = (Reverse(frozen), rank);
                    if displace.is_none_or(|(k, _)| key > k) {
                        displace = Some((key, gpu));
                    }
                }
                Offer::No(reason) => note(reason),
            }
        }
        if !free.is_empty() {
            return Ok(self.best_shared_gpu(u, &free));
        }
        displace
            .map(|(_, gpu)| gpu)
            .ok_or(why.unwrap_or(WaitReason::SlotsHeld))
    }

    /// Memory sharing, late binding: how many tasks on `gpu` have a priority
    /// other than `u`'s, so that one of the two would freeze the other while
    /// it works (the live tasks bound there or holding memory there, not being
    /// ended).
    pub(super) fn conflicts(&self, gpu: u32, u: &Task) -> usize {
        self.others_on(gpu, u)
            .filter(|t| t.priority() != u.priority())
            .count()
    }

    /// Memory sharing, late binding: among `free` (not empty), the GPU `u`
    /// goes to. Where it conflicts with nobody ([`Scheduler::conflicts`] is
    /// 0), if there is such a GPU, it balances the GPU time each GPU gives and
    /// then the memory each holds:
    /// - its projected work ([`Scheduler::projected_work_ns`]: busy time so
    ///   far plus what the tasks there are expected still to need) at most
    ///   `u`'s own expected remaining work above the least (closer than one
    ///   task's work is a tie: `u` itself would turn it around);
    /// - among those, one that runs `u`'s priority already rather than the
    ///   last empty GPU ([`KEEP_EMPTY`]);
    /// - then the least memory held there over time so far plus what
    ///   the tasks there, `u` included, may hold for [`MEM_HORIZON_S`] more
    ///   (so that arrivals close together do not all go to the GPU that is
    ///   behind);
    /// - then the least projected work, then the seeded hash.
    ///
    /// Otherwise as sharing by slots ([`Scheduler::best_free_gpu`]: the
    /// placement weight first, whose free-memory term keeps it off GPUs whose
    /// memory is held, by long jobs it would freeze among others).
    pub(super) fn best_shared_gpu(&self, u: &Task, free: &[u32]) -> u32 {
        let calm: Vec<u32> = free
            .iter()
            .copied()
            .filter(|&gpu| self.conflicts(gpu, u) == 0)
            .collect();
        if calm.is_empty() {
            return self.best_free_gpu(u.spec.id, free);
        }
        let horizon_ns = u128::from(MEM_HORIZON_S) * u128::from(NS_PER_S);
        let keys: Vec<(u32, u128, u128)> = calm
            .iter()
            .map(|&gpu| {
                let committed: u128 = self
                    .others_on(gpu, u)
                    .map(|t| u128::from(t.mem_demand_on(gpu)))
                    .sum::<u128>()
                    + u128::from(u.mem_demand_on(gpu));
                let mem = self
                    .mem_byte_ns
                    .get(&gpu)
                    .copied()
                    .unwrap_or(0)
                    .saturating_add(committed.saturating_mul(horizon_ns));
                (gpu, self.projected_work_ns(gpu, u), mem)
            })
            .collect();
        let least = keys.iter().map(|&(_, work, _)| work).min().unwrap_or(0);
        let within = least.saturating_add(u128::from(u.remaining_work_ns()));
        let mut keys: Vec<(u32, u128, u128)> = keys
            .into_iter()
            .filter(|&(_, work, _)| work <= within)
            .collect();
        // The last empty GPU is kept for a priority with no GPU of its own
        // where a GPU that runs `u`'s priority already does as well.
        let occupied = self.occupied_gpus(u);
        let empties = self
            .eligible_gpus()
            .into_iter()
            .filter(|g| !occupied.contains(g))
            .count();
        if empties <= KEEP_EMPTY && keys.iter().any(|(gpu, _, _)| occupied.contains(gpu)) {
            keys.retain(|(gpu, _, _)| occupied.contains(gpu));
        }
        keys.iter()
            .map(|&(gpu, work, mem)| {
                let key = (
                    mem,
                    work,
                    tie_hash(self.config.placement_seed, u.spec.id, gpu),
                    gpu,
                );
                (key, gpu)
            })
            .min()
            .map_or(calm[0], |(_, gpu)| gpu)
    }

    /// The live tasks but `u` and those being ended.
    fn others<'a>(&'a self, u: &'a Task) -> impl Iterator<Item = &'a Task> + 'a {
        self.tasks
            .values()
            .filter(move |t| t.spec.id != u.spec.id && t.is_live() && t.ending.is_none())
    }

    /// [`Scheduler::others`] on `gpu` (bound there or holding memory there).
    fn others_on<'a>(&'a self, gpu: u32, u: &'a Task) -> impl Iterator<Item = &'a Task> + 'a {
        self.others(u).filter(move |t| t.gpus_used().contains(&gpu))
    }

    /// The GPUs where [`Scheduler::others`] are, in one pass over the tasks.
    fn occupied_gpus(&self, u: &Task) -> BTreeSet<u32> {
        self.others(u).flat_map(|t| t.gpus_used()).collect()
    }

    /// Memory sharing, late binding: the GPU time `gpu` has given (its busy
    /// time) plus what the tasks there but `u` are expected still to need
    /// ([`Task::remaining_work_ns`]); under processor sharing, the time it
    /// stays busy if nothing more arrives.
    fn projected_work_ns(&self, gpu: u32, u: &Task) -> u128 {
        let busy = u128::from(self.busy_ns.get(&gpu).copied().unwrap_or(0));
        self.others_on(gpu, u)
            .map(|t| u128::from(t.remaining_work_ns()))
            .fold(busy, u128::saturating_add)
    }

    /// Why task `id` waits, if it does: unbound in the queue (as
    /// [`Scheduler::queued`] says), or bound to a GPU that does not run it now
    /// (as the last input's reconciliation found: a cap, memory or a higher
    /// priority). `None` for a task that runs or may run now, has finished, or
    /// is unknown.
    pub fn wait_reason(&self, id: TaskId) -> Option<WaitReason> {
        let t = self.tasks.get(&id).filter(|t| t.is_live())?;
        if t.is_unbound() {
            return self.queued(id).map(|q| q.reason);
        }
        if t.holds_slot() {
            return None;
        }
        t.wait
    }

    /// What task `id` may still take on `gpu` beyond what it holds.
    #[cfg(test)]
    pub(crate) fn mem_extra(&self, id: TaskId, gpu: u32) -> u64 {
        self.tasks.get(&id).map_or(0, |t| t.mem_extra_on(gpu))
    }

    /// Memory held outside any task on each GPU it was told of, sorted by
    /// index.
    pub fn outside_mem(&self) -> Vec<(u32, u64)> {
        self.outside_bytes.iter().map(|(&g, &b)| (g, b)).collect()
    }

    /// The overload rule, when on: truncates every running session that has
    /// run past its threshold on a GPU whose memory peak (during the session)
    /// reached its threshold while enough tasks wait for that GPU. The tasks
    /// that wait for a GPU: the ones bound there that want it and do not run,
    /// and every task queued unbound (it waits for whichever GPU frees first).
    pub(super) fn apply_overload_rule(&mut self, out: &mut Output) {
        let Some(rule) = self.config.overload else {
            return;
        };
        let now = self.now_ns;
        let in_use: Vec<(u32, u64)> = self
            .capacity_bytes
            .keys()
            .map(|&g| {
                let tasks = self
                    .tasks
                    .values()
                    .filter(|t| t.is_live())
                    .fold(0u64, |sum, t| sum.saturating_add(t.mem_on(g)));
                (g, tasks.saturating_add(self.outside_on(g)))
            })
            .collect();
        for t in self.tasks.values_mut().filter(|t| t.is_live()) {
            if let Some(&(_, used)) = in_use.iter().find(|(g, _)| Some(*g) == t.gpu) {
                t.gpu_peak_bytes = t.gpu_peak_bytes.max(used);
            }
        }
        let queued = self
            .queue
            .iter()
            .filter(|(_, id)| self.tasks.get(id).is_some_and(|t| t.ending.is_none()))
            .count();
        let mut truncate: Vec<(TaskId, EnforcementRecord)> = Vec::new();
        for (&id, t) in &self.tasks {
            let Some(gpu) = t.gpu else {
                continue;
            };
            let Some(&capacity) = self.capacity_bytes.get(&gpu) else {
                continue;
            };
            if !t.is_live()
                || t.ending.is_some()
                || t.state != TaskState::Running
                || t.yielded
                || capacity == 0
            {
                continue;
            }
            let session_ms = t.elapsed_ns(now) / NS_PER_MS;
            let peak_over = u128::from(t.gpu_peak_bytes) * 100
                >= u128::from(capacity) * u128::from(rule.mem_peak_pct);
            if session_ms <= rule.min_session_ms || !peak_over {
                continue;
            }
            let waiting = queued
                + self
                    .tasks
                    .values()
                    .filter(|w| {
                        w.is_live()
                            && w.gpu.is_some()
                            && w.gpus_used().contains(&gpu)
                            && w.ending.is_none()
                            && w.wants_gpu
                            && !w.holds_slot()
                    })
                    .count();
            let waiting = u32::try_from(waiting).unwrap_or(u32::MAX);
            if waiting < rule.min_waiting {
                continue;
            }
            let peak_permille =
                u32::try_from(u128::from(t.gpu_peak_bytes) * 1000 / u128::from(capacity))
                    .unwrap_or(u32::MAX);
            truncate.push((
                id,
                EnforcementRecord::overloaded(&rule, session_ms, gpu, peak_permille, waiting),
            ));
        }
        let kill_grace_ms = self.config.kill_grace_ms;
        let default_hard = self.config.default_hard_kill;
        for (id, record) in truncate {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            out.actions.push(Action::Enforce { id, record });
            let hard = task.spec.hard_kill.unwrap_or(default_hard);
            begin_ending(id, task, Reason::Overloaded, hard, now, kill_grace_ms, out);
        }
    }
}
