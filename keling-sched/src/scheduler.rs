//! The state machine: [`Scheduler`] holds every task and turns each [`Input`] into an
//! [`Output`] (the actions to carry out, the transitions to log). It owns the clock
//! rule, feedback and escalation, the time rules (idle timeout, duration limits,
//! kill deadlines), memory pressure and quotas, and who holds the slots. The rules
//! are in the crate doc; the pieces it uses are in [`placement`](crate::placement),
//! [`victims`](crate::victims) and the private task record. Late binding (the
//! host-level queue and when a queued task is bound) is in its `binding`
//! submodule.

mod binding;
mod sharing;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind, EnforcementRecord};
use crate::config::{Binding, SchedConfig};
use crate::input::{Input, TaskSpec};
use crate::placement::{AllocHistory, best_gpu, placement_weight};
use crate::policy::{PREEMPTION_MIN_CANDIDATES, Policy};
use crate::reason::Reason;
use crate::state::{LOWEST_PRIORITY, TaskState, TaskView, Transition, WaitReason, is_legal};
use crate::task::{Actuation, Direction, Ending, Rank, Task};
use crate::victims::{EVICTION_MIN_REMAINING_MS, VictimCandidate, choose_victims};
use crate::{NS_PER_MS, TaskId, ms_to_ns};

/// One GPU's walk: the tasks admitted, and the others with what they wait for.
type Walk = (Vec<TaskId>, Vec<(TaskId, WaitReason)>);

/// What one [`Scheduler::step`] decided.
#[derive(Clone, Default, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// What the agent must do, in the order to do it.
    pub actions: Vec<Action>,
    /// The state changes to log, in order; their `event_id`s count up.
    pub transitions: Vec<Transition>,
}

/// The scheduler core. See the crate doc.
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: SchedConfig,
    capacity_bytes: BTreeMap<u32, u64>,
    /// The largest `ts_ns` seen.
    now_ns: u64,
    next_event_id: u64,
    next_queue_seq: u64,
    /// Every task not yet archived.
    tasks: BTreeMap<TaskId, Task>,
    archived: BTreeMap<TaskId, Task>,
    /// Per configured GPU, the last `ALLOC_SUCCESS_WINDOW_S` seconds.
    alloc_history: AllocHistory,
    policy: Policy,
    /// Late binding: the live unbound tasks, in the policy's order.
    queue: BTreeSet<(Rank, TaskId)>,
    /// Late binding: per GPU, how long it has had a task `Running`.
    busy_ns: BTreeMap<u32, u64>,
    /// Late binding under memory sharing: per GPU, memory held by tasks
    /// integrated over time (byte-nanoseconds).
    mem_byte_ns: BTreeMap<u32, u128>,
    /// Per GPU, memory held by processes outside any task ([`Input::OutsideMem`]).
    outside_bytes: BTreeMap<u32, u64>,
    /// The last reconciliation changed nothing (no action, no transition, no
    /// task's wait, yield or quantum): until an input changes what it reads,
    /// it would change nothing again ([`Scheduler::step`]).
    settled: bool,
    /// Late binding: the last walk of the queue bound nothing. Whether a
    /// queued task can be bound reads what the reconciliation reads (where it
    /// goes reads the clock too, but only matters when it can), so after a
    /// step that changed none of it, the walk would bind nothing again.
    bound_none: bool,
    /// The clock at the last reconciliation and the last walk of the queue:
    /// goav's guard reads the clock, so neither is skipped once a task has
    /// stopped being a preemption candidate since.
    reconciled_ns: u64,
    walked_ns: u64,
    /// Tests: reconcile on every step, to compare with skipping.
    #[cfg(test)]
    reconcile_always: bool,
}

impl Scheduler {
    /// A scheduler with no tasks, its clock at 0, under the agent's policy
    /// ([`Policy::Hybrid`]).
    pub fn new(config: SchedConfig) -> Self {
        Self::with_policy(config, Policy::Hybrid)
    }

    /// A scheduler with no tasks, its clock at 0, under `policy` (see "Policies"
    /// in the crate doc).
    pub fn with_policy(config: SchedConfig, policy: Policy) -> Self {
        let capacity_bytes = config
            .gpus
            .iter()
            .map(|g| (g.index, g.capacity_bytes))
            .collect();
        Scheduler {
            config,
            capacity_bytes,
            now_ns: 0,
            next_event_id: 1,
            next_queue_seq: 0,
            tasks: BTreeMap::new(),
            archived: BTreeMap::new(),
            alloc_history: AllocHistory::default(),
            policy,
            queue: BTreeSet::new(),
            busy_ns: BTreeMap::new(),
            mem_byte_ns: BTreeMap::new(),
            outside_bytes: BTreeMap::new(),
            settled: false,
            bound_none: false,
            reconciled_ns: 0,
            walked_ns: 0,
            #[cfg(test)]
            reconcile_always: false,
        }
    }

    /// Tests: a scheduler that reconciles on every step (the reference the
    /// skipping in [`Scheduler::step`] is checked against).
    #[cfg(test)]
    pub(crate) fn reconciling_always(mut self) -> Self {
        self.reconcile_always = true;
        self
    }

    /// The policy it schedules by.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    /// The core's clock: the largest `ts_ns` seen.
    #[cfg(test)]
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Handles one input: the only way the scheduler's state changes.
    pub fn step(&mut self, input: &Input) -> Output {
        let mut out = Output::default();
        let quiet = self.leaves_reconcile_alone(input);
        self.advance_clock(input.ts_ns());
        match input {
            Input::Arrive { spec, .. } => self.on_arrive(spec, &mut out),
            Input::Active { id, .. } => {
                let now = self.now_ns;
                if let Some(task) = self.live_task_mut(*id) {
                    task.wants_gpu = true;
                    task.last_active_ns = now;
                }
            }
            Input::Idle { id, .. } => {
                // A task held before exec has not started: it cannot be idle.
                if let Some(task) = self.live_task_mut(*id)
                    && !task.is_unbound()
                {
                    task.wants_gpu = false;
                }
            }
            Input::MemAlloc { id, gpu, bytes, .. } => {
                self.on_mem_alloc(*id, *gpu, *bytes, &mut out)
            }
            Input::MemFree { id, gpu, bytes, .. } => {
                if let Some(task) = self.live_task_mut(*id) {
                    let held = task.mem_bytes.entry(*gpu).or_insert(0);
                    *held = held.saturating_sub(*bytes);
                    if *held == 0 {
                        task.mem_bytes.remove(gpu);
                    }
                }
            }
            Input::AllocFailed { id, gpu, bytes, .. } => {
                self.on_alloc_failed(*id, *gpu, *bytes, &mut out)
            }
            Input::Exit { id, exit_code, .. } => self.on_exit(*id, *exit_code, &mut out),
            Input::Tick { .. } => self.archive_finished(&mut out),
            Input::Confirmed { id, action, .. } => self.on_confirmed(*id, *action, &mut out),
            Input::TimedOut { id, action, .. } => self.on_timed_out(*id, *action, &mut out),
            Input::MemUnsure { id, .. } => {
                if let Some(task) = self.live_task_mut(*id) {
                    task.mem_unsure = true;
                }
            }
            Input::OutsideMem { gpu, bytes, .. } => {
                if *bytes == 0 {
                    self.outside_bytes.remove(gpu);
                } else {
                    self.outside_bytes.insert(*gpu, *bytes);
                }
            }
            Input::MemSure { id, bytes, .. } => self.on_mem_sure(*id, *bytes, &mut out),
        }
        let timed = self.apply_time_rules(&mut out);
        #[cfg(test)]
        let quiet = quiet && !self.reconcile_always;
        let unchanged = self.settled && quiet && !timed;
        let walk_skipped = unchanged && self.bound_none && !self.guard_moved_since(self.walked_ns);
        let bound_now = if walk_skipped {
            BTreeSet::new()
        } else {
            let bound = self.bind_queued(&mut out);
            self.bound_none = bound.is_empty();
            self.walked_ns = self.now_ns;
            bound
        };
        // Most inputs (a running task's activity, a tick) change nothing the
        // reconciliation reads: after one that changed nothing, it would
        // change nothing again but start used-up quanta over, unless the
        // clock moved a task past its quantum while a peer waits, or past
        // goav's guard. The skip decides nothing: the property tests compare
        // it with reconciling on every step. A task that stopped being goav's
        // candidate since the last reconciliation stopped since any earlier
        // instant too, so a walk skipped on a scan from no later than that
        // answers for the reconciliation as well (one scan, not two).
        let guard_moved = || {
            !(walk_skipped && self.walked_ns <= self.reconciled_ns)
                && self.guard_moved_since(self.reconciled_ns)
        };
        let skip =
            unchanged && bound_now.is_empty() && !guard_moved() && self.only_quanta_start_over();
        if !skip {
            self.reconciled_ns = self.now_ns;
            // Tasks bound in this step rank first here only: the next
            // step's reconciliation may differ.
            self.settled = self.reconcile(&bound_now, &mut out) && bound_now.is_empty();
        }
        let before = out.actions.len();
        self.apply_overload_rule(&mut out);
        if out.actions.len() != before {
            self.settled = false;
        }
        out
    }

    /// Whether `input`, applied now, would leave everything the
    /// reconciliation reads as it is: a tick (it archives finished tasks,
    /// which take no part), activity from a task that wants the GPU already,
    /// idleness from one that does not (or is unbound), or either from a task
    /// that is not live.
    fn leaves_reconcile_alone(&self, input: &Input) -> bool {
        match input {
            Input::Tick { .. } => true,
            Input::Active { id, .. } => self
                .tasks
                .get(id)
                .is_none_or(|t| !t.is_live() || t.wants_gpu),
            Input::Idle { id, .. } => self
                .tasks
                .get(id)
                .is_none_or(|t| !t.is_live() || t.is_unbound() || !t.wants_gpu),
            _ => false,
        }
    }

    /// On a step that changed nothing the reconciliation reads but the
    /// clock: whether all the clock changes is quanta used up with no peer
    /// waiting for a turn, and if so starts them over as the reconciliation
    /// would ([`Scheduler::rotate_expired_quanta`]). Not when a bound task
    /// waits for a turn while a quantum is used up.
    fn only_quanta_start_over(&mut self) -> bool {
        if !self.policy.preemptive() {
            return true;
        }
        let memory = self.shares_memory();
        let used_up = |t: &Task| t.is_live() && t.quantum_used_up();
        let turn_wanted = self
            .tasks
            .values()
            .any(|t| t.is_live() && !t.is_unbound() && t.waits_for_turn(memory));
        if turn_wanted {
            return !self.tasks.values().any(used_up);
        }
        for t in self.tasks.values_mut().filter(|t| used_up(t)) {
            t.quantum_used_ns = 0;
        }
        true
    }

    /// Under goav, whether a live task has stopped being a preemption
    /// candidate ([`Task::preemption_candidate`]) between `since_ns` and now:
    /// the one way the clock changes what the guard decides.
    fn guard_moved_since(&self, since_ns: u64) -> bool {
        let now = self.now_ns;
        self.policy.guarded()
            && self.tasks.values().any(|t| {
                t.is_live() && t.preemption_candidate(since_ns) && !t.preemption_candidate(now)
            })
    }

    /// Whether any task is not archived yet. Only then does the passing of time
    /// change anything ([`Input::Tick`]'s quanta, idle timeouts, duration limits
    /// and escalations all belong to tasks), so a driver may tick less often
    /// while there are none.
    pub fn has_live_tasks(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// One task, archived ones included; `None` for an id never seen.
    pub fn task(&self, id: TaskId) -> Option<TaskView> {
        self.tasks
            .get(&id)
            .or_else(|| self.archived.get(&id))
            .map(Task::view)
    }

    /// Every task, archived ones included, sorted by id.
    pub fn tasks(&self) -> Vec<TaskView> {
        let mut views: Vec<TaskView> = self
            .tasks
            .values()
            .chain(self.archived.values())
            .map(Task::view)
            .collect();
        views.sort_by_key(|v| v.spec.id);
        views
    }

    /// Forgets archived tasks that finished before `finished_before_ns`, so a
    /// long-running agent's state stays bounded (the agent calls it with its
    /// retention window). Returns how many it forgot. Archived tasks take no part
    /// in any decision, so this changes no output of [`Scheduler::step`]; a
    /// forgotten id is simply unknown again (ids are never reused).
    pub fn prune_archived(&mut self, finished_before_ns: u64) -> usize {
        let before = self.archived.len();
        self.archived
            .retain(|_, t| t.finished_ns.is_none_or(|f| f >= finished_before_ns));
        before - self.archived.len()
    }

    /// Forgets the archived tasks that finished first until at most `max` are
    /// kept (a burst of short tasks then costs the agent a bounded archive,
    /// whatever the retention window). Ties go by id, the lower first. Returns how
    /// many it forgot; like [`Scheduler::prune_archived`], it changes no decision.
    pub fn prune_archived_to(&mut self, max: usize) -> usize {
        let excess = self.archived.len().saturating_sub(max);
        if excess == 0 {
            return 0;
        }
        let mut order: Vec<(u64, TaskId)> = self
            .archived
            .iter()
            .map(|(&id, t)| (t.finished_ns.unwrap_or(0), id))
            .collect();
        order.select_nth_unstable(excess - 1);
        for (_, id) in &order[..excess] {
            self.archived.remove(id);
        }
        excess
    }

    /// How many archived tasks are kept.
    pub fn archived_len(&self) -> usize {
        self.archived.len()
    }

    /// The tasks not yet archived (finished ones included until the next tick),
    /// sorted by id.
    pub fn live_tasks(&self) -> Vec<TaskView> {
        self.tasks.values().map(Task::view).collect()
    }

    /// Archived tasks, the last to finish first (ties: the higher id first): `n`
    /// of them after skipping `skip`.
    pub fn recent_archived(&self, skip: usize, n: usize) -> Vec<TaskView> {
        let mut order: Vec<(u64, TaskId, &Task)> = self
            .archived
            .iter()
            .map(|(&id, t)| (t.finished_ns.unwrap_or(0), id, t))
            .collect();
        order.sort_unstable_by_key(|&(finished, id, _)| std::cmp::Reverse((finished, id)));
        order
            .into_iter()
            .skip(skip)
            .take(n)
            .map(|(_, _, t)| t.view())
            .collect()
    }

    /// The placement weight of each configured GPU at `ts_ns` (normally the latest
    /// input's), sorted by index: higher is better. See "Placement" in the crate doc.
    pub fn placement_weights(&self, ts_ns: u64) -> Vec<(u32, f64)> {
        self.placement_weights_iter(ts_ns).collect()
    }

    fn placement_weights_iter(&self, ts_ns: u64) -> impl Iterator<Item = (u32, f64)> + '_ {
        let slots = self.config.slots();
        self.capacity_bytes.iter().map(move |(&gpu, &capacity)| {
            let (mut used, mut queue_ms) = (0u128, 0u128);
            for t in self.tasks.values().filter(|t| t.is_live()) {
                used += u128::from(t.mem_on(gpu));
                if t.gpu == Some(gpu) && t.wants_gpu {
                    queue_ms += u128::from(t.expected_work_ms(ts_ns));
                }
            }
            let success_rate = self.alloc_success_rate(gpu, ts_ns);
            let weight = placement_weight(capacity, used, queue_ms, slots, success_rate);
            (gpu, weight)
        })
    }

    /// Successful allocations over all attempts on `gpu` in the 300 s up to `ts_ns`;
    /// 1.0 with no attempts.
    pub fn alloc_success_rate(&self, gpu: u32, ts_ns: u64) -> f64 {
        self.alloc_history.success_rate(gpu, ts_ns)
    }

    fn live_task_mut(&mut self, id: TaskId) -> Option<&mut Task> {
        self.tasks.get_mut(&id).filter(|t| t.is_live())
    }

    /// Moves the clock to `ts_ns` (never back) and charges running tasks for the time.
    fn advance_clock(&mut self, ts_ns: u64) {
        if ts_ns <= self.now_ns {
            return;
        }
        let elapsed_ns = ts_ns - self.now_ns;
        let late = self.config.binding == Binding::Late;
        let mem_integral = late && self.shares_memory();
        let mut busy: Vec<u32> = Vec::new();
        // Memory sharing: how many tasks run at once on each GPU, to charge
        // each its share.
        let mut running: BTreeMap<u32, u64> = BTreeMap::new();
        if mem_integral {
            for task in self.tasks.values() {
                if task.state == TaskState::Running
                    && !task.yielded
                    && let Some(gpu) = task.gpu
                {
                    *running.entry(gpu).or_insert(0) += 1;
                }
            }
        }
        for task in self.tasks.values_mut() {
            if mem_integral && task.is_live() {
                for (&gpu, &bytes) in &task.mem_bytes {
                    if bytes > 0 {
                        let m = self.mem_byte_ns.entry(gpu).or_insert(0);
                        *m = m.saturating_add(u128::from(bytes) * u128::from(elapsed_ns));
                    }
                }
            }
            if task.state == TaskState::Running && !task.yielded {
                task.on_gpu_ns = task.on_gpu_ns.saturating_add(elapsed_ns);
                task.quantum_used_ns = task.quantum_used_ns.saturating_add(elapsed_ns);
                if late && let Some(gpu) = task.gpu {
                    busy.push(gpu);
                    if let Some(&n) = running.get(&gpu) {
                        task.share_ns = task.share_ns.saturating_add(elapsed_ns / n.max(1));
                    }
                }
            }
        }
        busy.sort_unstable();
        busy.dedup();
        for gpu in busy {
            let b = self.busy_ns.entry(gpu).or_insert(0);
            *b = b.saturating_add(elapsed_ns);
        }
        self.now_ns = ts_ns;
    }

    fn on_arrive(&mut self, spec: &TaskSpec, out: &mut Output) {
        if self.tasks.contains_key(&spec.id) || self.archived.contains_key(&spec.id) {
            return;
        }
        let mut spec = spec.clone();
        spec.priority = spec.priority.min(LOWEST_PRIORITY);
        // Late binding: an unpinned task waits unbound until it can run.
        // Otherwise the configured GPU with the highest placement weight; ties:
        // lowest index.
        let gpu = match (spec.gpu, self.config.binding) {
            (Some(gpu), _) => Some(gpu),
            (None, Binding::Late) => None,
            (None, Binding::AtArrival) => Some(best_gpu(self.placement_weights_iter(self.now_ns))),
        };
        let id = spec.id;
        let mut task = Task::arrived(spec, gpu, self.now_ns, self.next_queue_seq);
        task.sched_priority = self.policy.scheduled_priority(task.spec.priority);
        self.next_queue_seq += 1;
        let queue_key = (task.rank_under(self.policy), id);
        self.tasks.insert(id, task);
        match gpu {
            Some(gpu) => out.actions.push(Action::Place { id, gpu }),
            None => {
                self.queue.insert(queue_key);
            }
        }
    }

    fn record_alloc(&mut self, gpu: u32, success: bool) {
        if self.capacity_bytes.contains_key(&gpu) {
            self.alloc_history.record(gpu, self.now_ns, success);
        }
    }

    fn on_mem_alloc(&mut self, id: TaskId, gpu: u32, bytes: u64, out: &mut Output) {
        let now = self.now_ns;
        let kill_grace_ms = self.config.kill_grace_ms;
        let Some(task) = self.live_task_mut(id) else {
            return;
        };
        let held = task.mem_bytes.entry(gpu).or_insert(0);
        *held = held.saturating_add(bytes);
        let held = *held;
        let peak = task.mem_peak.entry(gpu).or_insert(0);
        *peak = (*peak).max(held);
        // A figure Keling knows may be wrong is no ground for ending a task.
        let over_quota = !task.mem_unsure
            && task
                .spec
                .mem_quota_bytes
                .is_some_and(|quota| task.total_mem() > u128::from(quota));
        if over_quota {
            begin_ending(id, task, Reason::OverQuota, false, now, kill_grace_ms, out);
        }
        self.record_alloc(gpu, true);
    }

    /// An unsure figure's sound lower bound: the quota is enforced on it (a sure
    /// figure is judged at each `MemAlloc` instead).
    fn on_mem_sure(&mut self, id: TaskId, bytes: u64, out: &mut Output) {
        let now = self.now_ns;
        let kill_grace_ms = self.config.kill_grace_ms;
        let Some(task) = self.live_task_mut(id) else {
            return;
        };
        if task.mem_unsure
            && task.ending.is_none()
            && task.spec.mem_quota_bytes.is_some_and(|quota| bytes > quota)
        {
            begin_ending(id, task, Reason::OverQuota, false, now, kill_grace_ms, out);
        }
    }

    fn on_alloc_failed(&mut self, id: TaskId, gpu: u32, bytes: u64, out: &mut Output) {
        let now = self.now_ns;
        let Some(requester) = self.tasks.get(&id).filter(|t| t.is_live()) else {
            return;
        };
        let requester_priority = requester.priority();
        let requester_ending = requester.ending.is_some();
        self.record_alloc(gpu, false);
        let Some(&capacity) = self.capacity_bytes.get(&gpu) else {
            return;
        };
        if requester_ending {
            return;
        }
        let live = || self.tasks.values().filter(|t| t.is_live());
        let used: u128 = live().map(|t| u128::from(t.mem_on(gpu))).sum();
        let releasing: u128 = live()
            .filter(|t| t.ending.is_some())
            .map(|t| u128::from(t.mem_on(gpu)))
            .sum();
        let free = u128::from(capacity).saturating_sub(used);
        let need = u128::from(bytes)
            .saturating_sub(free)
            .saturating_sub(releasing);
        let need = u64::try_from(need).unwrap_or(u64::MAX);
        if need == 0 {
            return;
        }
        // Every live lower priority holding memory here may be evicted: what a
        // task declares (its expected runtime) only decides, under goav, whom
        // to prefer, never whether the higher priority gets its memory.
        let candidates: Vec<(VictimCandidate, bool)> = self
            .tasks
            .iter()
            .filter(|&(&cid, t)| {
                cid != id
                    && t.is_live()
                    && t.ending.is_none()
                    && t.priority() > requester_priority
                    && t.mem_on(gpu) > 0
            })
            .map(|(&cid, t)| {
                let preferred = t
                    .expected_remaining_ms(now)
                    .is_none_or(|ms| ms > EVICTION_MIN_REMAINING_MS);
                let candidate = VictimCandidate {
                    id: cid,
                    priority: t.priority(),
                    bytes: t.mem_on(gpu),
                };
                (candidate, preferred)
            })
            .collect();
        let mut victims = Vec::new();
        if self.policy.guarded() {
            let preferred: Vec<VictimCandidate> = candidates
                .iter()
                .filter(|(_, preferred)| *preferred)
                .map(|(c, _)| c.clone())
                .collect();
            victims = choose_victims(&preferred, need);
        }
        if victims.is_empty() {
            let all: Vec<VictimCandidate> = candidates.into_iter().map(|(c, _)| c).collect();
            victims = choose_victims(&all, need);
        }
        let kill_grace_ms = self.config.kill_grace_ms;
        for victim in victims {
            if let Some(task) = self.tasks.get_mut(&victim) {
                begin_ending(
                    victim,
                    task,
                    Reason::EvictedForMemory,
                    false,
                    now,
                    kill_grace_ms,
                    out,
                );
            }
        }
    }

    fn on_exit(&mut self, id: TaskId, exit_code: i32, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let (to, reason) = match task.ending {
            Some(ending) => (TaskState::Failed, ending.reason),
            None if exit_code == 0 => (TaskState::Completed, Reason::Exited),
            None => (TaskState::Failed, Reason::ExitedWithError),
        };
        task.exit_code = Some(exit_code);
        task.finished_ns = Some(now);
        task.actuation = None;
        task.wants_gpu = false;
        // The driver frees a dead process's memory.
        task.mem_bytes.clear();
        let unbound = task.is_unbound();
        record_transition(&mut self.next_event_id, now, task, to, reason, out);
        if unbound {
            self.queue.retain(|&(_, queued)| queued != id);
        }
    }

    /// Tick: tasks that finished before this tick become Archived.
    fn archive_finished(&mut self, out: &mut Output) {
        let now = self.now_ns;
        let finished: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.state, TaskState::Completed | TaskState::Failed))
            .map(|(&id, _)| id)
            .collect();
        for id in finished {
            if let Some(mut task) = self.tasks.remove(&id) {
                record_transition(
                    &mut self.next_event_id,
                    now,
                    &mut task,
                    TaskState::Archived,
                    Reason::Archived,
                    out,
                );
                self.archived.insert(id, task);
            }
        }
    }

    fn on_confirmed(&mut self, id: TaskId, kind: ActionKind, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let Some(actuation) = task.actuation else {
            return;
        };
        match (actuation.direction, kind) {
            (Direction::Freeze, ActionKind::Freeze | ActionKind::Stop) => {
                task.actuation = None;
                record_transition(
                    &mut self.next_event_id,
                    now,
                    task,
                    TaskState::Preempted,
                    actuation.reason,
                    out,
                );
            }
            (Direction::Thaw, ActionKind::Thaw) => {
                task.actuation = None;
                resume(&mut self.next_event_id, now, task, actuation.reason, out);
            }
            _ => {}
        }
    }

    fn on_timed_out(&mut self, id: TaskId, kind: ActionKind, out: &mut Output) {
        let now = self.now_ns;
        let Some(task) = self.tasks.get_mut(&id).filter(|t| t.is_live()) else {
            return;
        };
        let Some(actuation) = task.actuation.as_mut() else {
            return;
        };
        match (actuation.direction, kind, actuation.escalated) {
            (Direction::Freeze, ActionKind::Freeze, false) => {
                actuation.escalated = true;
                out.actions.push(Action::Stop { id });
            }
            (Direction::Thaw, ActionKind::Thaw, false) => {
                actuation.escalated = true;
                out.actions.push(Action::Thaw { id });
            }
            (Direction::Thaw, ActionKind::Thaw, true) => {
                task.actuation = None;
                resume(
                    &mut self.next_event_id,
                    now,
                    task,
                    Reason::ThawUnconfirmed,
                    out,
                );
            }
            _ => {}
        }
    }

    /// Idle timeout, session duration limits and kill deadlines, at the
    /// current clock. Returns whether it changed anything the reconciliation
    /// reads (an action, or a task no longer wanting the GPU).
    fn apply_time_rules(&mut self, out: &mut Output) -> bool {
        let now = self.now_ns;
        let config = &self.config;
        let idle_timeout_ns = ms_to_ns(config.idle_timeout_ms);
        let actions_before = out.actions.len();
        let mut went_idle = false;
        for (&id, task) in self.tasks.iter_mut() {
            if !task.is_live() {
                continue;
            }
            if task.state == TaskState::Running
                && task.wants_gpu
                && now.saturating_sub(task.last_active_ns) >= idle_timeout_ns
            {
                task.wants_gpu = false;
                went_idle = true;
            }

            let limit_ms = task
                .spec
                .max_duration_ms
                .unwrap_or(config.default_max_duration_ms);
            let grace_ms = task.spec.grace_ms.unwrap_or(config.default_grace_ms);
            let elapsed_ns = task.elapsed_ns(now);
            let elapsed_ms = elapsed_ns / NS_PER_MS;
            if !task.duration_enforced && elapsed_ns >= ms_to_ns(limit_ms) {
                task.duration_enforced = true;
                task.warned = true;
                out.actions.push(Action::Enforce {
                    id,
                    record: EnforcementRecord::duration_exceeded(limit_ms, elapsed_ms),
                });
                let hard = task.spec.hard_kill.unwrap_or(config.default_hard_kill);
                begin_ending(
                    id,
                    task,
                    Reason::DurationLimit,
                    hard,
                    now,
                    config.kill_grace_ms,
                    out,
                );
            } else if !task.warned && elapsed_ns >= ms_to_ns(limit_ms.saturating_sub(grace_ms)) {
                task.warned = true;
                // elapsed_ns < limit here, so at least 1 ms remains.
                out.actions.push(Action::Warn {
                    id,
                    remaining_ms: limit_ms.saturating_sub(elapsed_ms),
                });
            }

            if let Some(ending) = task.ending.as_mut()
                && !ending.kill_sent
                && ending.kill_at_ns.is_some_and(|at| now >= at)
            {
                ending.kill_sent = true;
                out.actions.push(Action::Kill { id });
            }
        }
        went_idle || out.actions.len() != actions_before
    }

    /// Brings every GPU's slot holders in line with the ranking (crate doc).
    /// `bound_now`: the tasks late binding bound in this step.
    ///
    /// A task takes part on every GPU it uses: the one it is placed on and every
    /// GPU it holds memory on, whatever it was pinned to (a process placed on
    /// GPU 1 that works on GPU 0 competes there too). It runs only where it may
    /// hold a slot on each of them; where it must wait on one GPU it is ranked
    /// last on the others, so that it keeps nobody from a slot it cannot use.
    ///
    /// Returns whether it changed nothing: no action, no transition, and no
    /// task's wait, yield or quantum.
    fn reconcile(&mut self, bound_now: &BTreeSet<TaskId>, out: &mut Output) -> bool {
        let before = (out.actions.len(), out.transitions.len());
        // The live tasks of each GPU, gathered once: reconciling changes no
        // task's GPUs and ends no task, so the lists stay right throughout.
        let mut by_gpu: BTreeMap<u32, Vec<TaskId>> = BTreeMap::new();
        let mut several: BTreeSet<TaskId> = BTreeSet::new();
        for (&id, t) in self.tasks.iter().filter(|(_, t)| t.is_live()) {
            let gpus = t.gpus_used();
            if gpus.len() > 1 {
                several.insert(id);
            }
            for g in gpus {
                by_gpu.entry(g).or_default().push(id);
            }
        }
        if by_gpu.is_empty() {
            return true;
        }
        let (rotated, mut changed) = if self.policy.preemptive() {
            self.rotate_expired_quanta(&by_gpu)
        } else {
            (BTreeSet::new(), false)
        };
        // Rank and walk each GPU's ranking (the walk admits tasks while the
        // cap, the priorities and memory allow: "Sharing"); then settle the
        // tasks that use several GPUs. One runs only if it is admitted on
        // each of its GPUs; one that cannot is *blocked*: ranked last
        // everywhere (it could use none of its places, so it keeps nobody
        // from them), and the ranking is done again. A task is blocked when
        // the tasks that surely run on a GPU (tasks on one GPU, and tasks on
        // several that are admitted on each) leave it no room there; when
        // tasks on several GPUs only wait on each other, the one that ranks
        // last of them is blocked. The set only grows, so this ends (one
        // round when no task uses several GPUs, the usual case).
        let mut blocked: BTreeSet<TaskId> = BTreeSet::new();
        let mut ranked: BTreeMap<u32, Vec<TaskId>>;
        let mut walks: BTreeMap<u32, Walk>;
        loop {
            ranked = by_gpu
                .iter()
                .map(|(&g, ids)| (g, self.rank_gpu(g, ids, bound_now, &rotated, &blocked)))
                .collect();
            walks = ranked
                .iter()
                .map(|(&g, ids)| (g, self.walk(g, ids)))
                .collect();
            // Tasks not admitted on some GPU they use: all the others hold
            // everywhere. One walk per GPU, so a round costs the ranking.
            let beyond: BTreeSet<TaskId> = walks
                .values()
                .flat_map(|(_, wait)| wait.iter().map(|&(id, _)| id))
                .collect();
            let undecided: BTreeSet<TaskId> = several
                .iter()
                .copied()
                .filter(|id| !blocked.contains(id) && beyond.contains(id))
                .collect();
            if undecided.is_empty() {
                break;
            }
            let sure = |id: &TaskId| !several.contains(id) || !beyond.contains(id);
            let mut surely_blocked: BTreeSet<TaskId> = BTreeSet::new();
            for (&g, ids) in &ranked {
                let mut sure_ahead = self.admission(g);
                for id in ids {
                    let Some(t) = self.tasks.get(id) else {
                        continue;
                    };
                    if undecided.contains(id) && sure_ahead.check(t).is_err() {
                        surely_blocked.insert(*id);
                    }
                    if sure(id) && sure_ahead.check(t).is_ok() {
                        sure_ahead.admit(t);
                    }
                }
            }
            if surely_blocked.is_empty() {
                let policy = self.policy;
                let last = undecided
                    .iter()
                    .copied()
                    .max_by_key(|id| self.tasks.get(id).map(|t| (t.rank_under(policy), *id)));
                blocked.extend(last);
            } else {
                blocked.extend(surely_blocked);
            }
        }
        let waits: BTreeSet<TaskId> = walks
            .values()
            .flat_map(|(_, wait)| wait.iter().map(|&(id, _)| id))
            .collect();
        // What each waiting task waits for (the first GPU that keeps it).
        let mut reasons: BTreeMap<TaskId, WaitReason> = BTreeMap::new();
        for (_, wait) in walks.values() {
            for &(id, reason) in wait {
                reasons.entry(id).or_insert(reason);
            }
        }
        for (id, task) in &mut self.tasks {
            let wait = reasons.get(id).copied();
            changed |= task.wait != wait;
            task.wait = wait;
        }
        // Every GPU's freezes first: a task that uses several GPUs is thawed
        // only into room on each, and a yielded task that is active again
        // holds its place until its freeze lands, whichever GPU comes first.
        for (hold, wait) in walks.values() {
            changed |= self.vacate(hold, wait, &rotated, out);
        }
        // Then every GPU's holders that run already (arrived, or yielded)
        // take their places, before anyone is thawed into what is left.
        let holds: Vec<Vec<TaskId>> = walks
            .values()
            .map(|(hold, _)| {
                hold.iter()
                    .copied()
                    .filter(|id| !waits.contains(id))
                    .collect()
            })
            .collect();
        for hold in &holds {
            changed |= self.take_places(hold, out);
        }
        for hold in &holds {
            self.thaw_into_room(hold, out);
        }
        !changed && (out.actions.len(), out.transitions.len()) == before
    }

    /// One GPU's tasks in rank order (the first `slots` should hold them);
    /// `blocked` tasks (that use several GPUs and cannot run) last.
    fn rank_gpu(
        &self,
        gpu: u32,
        on_gpu: &[TaskId],
        bound_now: &BTreeSet<TaskId>,
        rotated: &BTreeSet<TaskId>,
        blocked: &BTreeSet<TaskId>,
    ) -> Vec<TaskId> {
        let policy = self.policy;
        let tiers = if bound_now.is_empty() && !policy.guarded() {
            BTreeMap::new()
        } else {
            self.tiers(on_gpu, bound_now, rotated)
        };
        let mut ranked: Vec<(u8, Rank, TaskId)> = on_gpu
            .iter()
            .filter_map(|&id| {
                let tier = if blocked.contains(&id) {
                    3
                } else {
                    tiers.get(&id).copied().unwrap_or(2)
                };
                self.tasks
                    .get(&id)
                    .map(|t| (tier, t.rank_under(policy), id))
            })
            .collect();
        debug_assert!(on_gpu.iter().all(|id| {
            self.tasks
                .get(id)
                .is_some_and(|t| t.is_live() && t.gpus_used().contains(&gpu))
        }));
        ranked.sort_unstable();
        ranked.into_iter().map(|(_, _, id)| id).collect()
    }

    /// Which tier of the ranking each task on a GPU is in when it is not the
    /// last (2): tier 0 for the tasks late binding bound here in this step (the
    /// host-level decision already found them a slot) and, under goav, for
    /// holders that are no preemption candidate (expected remaining time of
    /// 3 s or less) while a higher priority waits here and at least two
    /// candidates qualify (the guard's preference; with fewer, nobody is kept
    /// by it). Holders being frozen, or sent to the back of their priority's
    /// queue in this step, are in neither: they are leaving anyway.
    fn tiers(
        &self,
        on_gpu: &[TaskId],
        bound_now: &BTreeSet<TaskId>,
        rotated: &BTreeSet<TaskId>,
    ) -> BTreeMap<TaskId, u8> {
        let mut tiers: BTreeMap<TaskId, u8> = on_gpu
            .iter()
            .filter(|id| bound_now.contains(id))
            .map(|&id| (id, 0))
            .collect();
        if !self.policy.guarded() {
            return tiers;
        }
        let now = self.now_ns;
        let on_gpu = || {
            on_gpu
                .iter()
                .filter_map(|id| self.tasks.get(id).map(|t| (*id, t)))
        };
        let stable = |id: TaskId, t: &Task| {
            t.holds_slot_stably()
                && t.wants_gpu
                && !rotated.contains(&id)
                && !bound_now.contains(&id)
        };
        let candidate = |t: &Task| t.preemption_candidate(now);
        let best_waiting = on_gpu()
            .filter(|(id, t)| !t.holds_slot() && t.wants_gpu && !bound_now.contains(id))
            .map(|(_, t)| t.priority())
            .min();
        if let Some(waiting) = best_waiting {
            let threatened = on_gpu()
                .filter(|&(id, t)| stable(id, t) && candidate(t) && t.priority() > waiting)
                .count();
            // The guard is a preference: with enough candidates the victim is
            // one of them and the holders that expect to finish soon are kept;
            // with fewer, the higher priority preempts as under hybrid (a
            // declared runtime never keeps it waiting).
            if threatened >= PREEMPTION_MIN_CANDIDATES {
                for (id, t) in on_gpu() {
                    if stable(id, t) && !candidate(t) {
                        tiers.insert(id, 0);
                    }
                }
            }
        }
        tiers
    }

    /// Freezes whoever runs (or arrived running) on a GPU but should wait there:
    /// `should_hold` and `should_wait` are the GPU's walk (its tasks in rank
    /// order, split by what the walk admitted). Returns whether it made a
    /// task yield.
    fn vacate(
        &mut self,
        should_hold: &[TaskId],
        should_wait: &[(TaskId, WaitReason)],
        rotated: &BTreeSet<TaskId>,
        out: &mut Output,
    ) -> bool {
        let mut yielded = false;
        let best_holder_priority = should_hold
            .iter()
            .filter_map(|id| self.tasks.get(id))
            .map(Task::priority)
            .min();
        for &(id, why) in should_wait {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            if task.actuation.is_some() {
                continue;
            }
            if task.state == TaskState::Running && !task.wants_gpu {
                // Idle: it gives the slot up but keeps running, so that its next
                // call can show it wants the GPU again (it uses neither the GPU
                // nor a CPU now, so freezing it would gain nothing).
                yielded |= !task.yielded;
                task.yielded = true;
                continue;
            }
            let reason = match (task.state, why) {
                (TaskState::Pending, _) => Reason::Queued,
                (TaskState::Running, _) if rotated.contains(&id) => Reason::QuantumExpired,
                (TaskState::Running, WaitReason::HigherPriority) => {
                    Reason::PreemptedByHigherPriority
                }
                (TaskState::Running, WaitReason::Memory) => Reason::NoMemory,
                (TaskState::Running, _)
                    if best_holder_priority.is_some_and(|p| p < task.priority()) =>
                {
                    Reason::PreemptedByHigherPriority
                }
                (TaskState::Running, _) => Reason::RoundRobin,
                _ => continue,
            };
            // A yielded task that is active again runs (and may use the GPU)
            // until its freeze lands: it counts as a holder until then.
            task.yielded = false;
            task.actuation = Some(Actuation {
                direction: Direction::Freeze,
                reason,
                escalated: false,
            });
            out.actions.push(Action::Freeze { id });
        }
        yielded
    }

    /// The tasks the walk admitted on a GPU (`should_hold`, in rank order,
    /// none that waits on another GPU it uses) that run already take their
    /// places: a task that arrived running just keeps running, a yielded one
    /// takes its place back. Returns whether a yielded one did.
    fn take_places(&mut self, should_hold: &[TaskId], out: &mut Output) -> bool {
        let now = self.now_ns;
        let mut took_back = false;
        for &id in should_hold {
            if let Some(task) = self.tasks.get_mut(&id) {
                took_back |= task.yielded;
                task.yielded = false;
                if task.state == TaskState::Pending && task.actuation.is_none() {
                    resume(&mut self.next_event_id, now, task, Reason::Placed, out);
                }
            }
        }
        took_back
    }

    /// Thaws the frozen tasks among `should_hold` into room only (a free
    /// slot, and under memory sharing no holder still being frozen), on every
    /// GPU they use: freezes in flight are waited for.
    fn thaw_into_room(&mut self, should_hold: &[TaskId], out: &mut Output) {
        for &id in should_hold {
            let Some(task) = self.tasks.get(&id) else {
                continue;
            };
            if task.state != TaskState::Preempted || task.actuation.is_some() {
                continue;
            }
            let room = task.gpus_used().into_iter().all(|g| self.has_room(g, id));
            if !room {
                continue;
            }
            if let Some(task) = self.tasks.get_mut(&id) {
                task.actuation = Some(Actuation {
                    direction: Direction::Thaw,
                    reason: Reason::Resumed,
                    escalated: false,
                });
                out.actions.push(Action::Thaw { id });
            }
        }
    }

    /// Round robin: a running task whose quantum is used up goes to the back of its
    /// priority's queue if an active task of that priority waits on a GPU it
    /// uses; otherwise it starts a fresh quantum. Returns the tasks sent to the
    /// back, and whether any quantum started over. `by_gpu`: the live tasks of
    /// each GPU, taken in index order (a task on several GPUs is handled with
    /// the first).
    fn rotate_expired_quanta(
        &mut self,
        by_gpu: &BTreeMap<u32, Vec<TaskId>>,
    ) -> (BTreeSet<TaskId>, bool) {
        let mut rotated = BTreeSet::new();
        let mut started_over = false;
        let mut seen = BTreeSet::new();
        let memory = self.shares_memory();
        let waiting_priorities: BTreeMap<u32, BTreeSet<u8>> = by_gpu
            .iter()
            .map(|(&g, ids)| {
                let waiting = ids
                    .iter()
                    .filter_map(|id| self.tasks.get(id))
                    .filter(|t| t.waits_for_turn(memory))
                    .map(Task::priority)
                    .collect();
                (g, waiting)
            })
            .collect();
        for ids in by_gpu.values() {
            let mut expired: Vec<(Rank, TaskId)> = ids
                .iter()
                .filter(|id| seen.insert(**id))
                .filter_map(|id| self.tasks.get(id))
                .filter(|t| t.quantum_used_up())
                .map(|t| (t.rank(), t.spec.id))
                .collect();
            expired.sort_unstable();
            for (_, id) in expired {
                let seq = self.next_queue_seq;
                let Some(task) = self.tasks.get_mut(&id) else {
                    continue;
                };
                task.quantum_used_ns = 0;
                started_over = true;
                let peer_waits = task.gpus_used().iter().any(|g| {
                    waiting_priorities
                        .get(g)
                        .is_some_and(|p| p.contains(&task.priority()))
                });
                if task.wants_gpu && peer_waits {
                    task.queue_seq = seq;
                    self.next_queue_seq += 1;
                    rotated.insert(id);
                }
            }
        }
        (rotated, started_over)
    }
}

/// Pending or Preempted → Running.
fn resume(next_event_id: &mut u64, now_ns: u64, task: &mut Task, reason: Reason, out: &mut Output) {
    record_transition(next_event_id, now_ns, task, TaskState::Running, reason, out);
    task.started_ns.get_or_insert(now_ns);
    // The idle timeout counts running time only: it starts over.
    task.last_active_ns = now_ns;
}

/// Starts (or hurries) ending a task: `Kill` at once when `hard`, else `Terminate`
/// and a `Kill` deadline `kill_grace_ms` later. Never sends either twice.
fn begin_ending(
    id: TaskId,
    task: &mut Task,
    reason: Reason,
    hard: bool,
    now_ns: u64,
    kill_grace_ms: u64,
    out: &mut Output,
) {
    let ending = task.ending.get_or_insert(Ending {
        reason,
        terminate_sent: false,
        kill_sent: false,
        kill_at_ns: None,
    });
    if hard {
        if !ending.kill_sent {
            ending.kill_sent = true;
            out.actions.push(Action::Kill { id });
        }
    } else if !ending.terminate_sent && !ending.kill_sent {
        ending.terminate_sent = true;
        ending.kill_at_ns = Some(now_ns.saturating_add(ms_to_ns(kill_grace_ms)));
        out.actions.push(Action::Terminate { id });
    }
}

fn record_transition(
    next_event_id: &mut u64,
    now_ns: u64,
    task: &mut Task,
    to: TaskState,
    reason: Reason,
    out: &mut Output,
) {
    let from = task.state;
    debug_assert!(is_legal(from, to), "illegal transition {from:?} -> {to:?}");
    if !is_legal(from, to) {
        return;
    }
    task.state = to;
    let terminal = matches!(
        to,
        TaskState::Completed | TaskState::Failed | TaskState::Archived
    );
    out.transitions.push(Transition {
        event_id: *next_event_id,
        task: task.spec.id,
        name: task.spec.name.clone(),
        pid: task.spec.pid,
        gpu: task.gpu,
        priority: task.spec.priority,
        from,
        to,
        reason,
        timestamp_ns: now_ns,
        exit_code: if terminal { task.exit_code } else { None },
    });
    *next_event_id = next_event_id.saturating_add(1);
}
