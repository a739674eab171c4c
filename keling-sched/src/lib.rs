//! The scheduler core: a pure, deterministic state machine that decides which GPU
//! tasks run, which wait and which must end.
//!
//! This crate owns the scheduling policy and nothing else. It has no clock, no I/O,
//! no randomness but a seeded hash (late binding's last tie-break, a pure function
//! of the config's seed), and never depends on hash-map order: [`Scheduler::step`] takes one
//! timestamped [`Input`] and returns an [`Output`], the [`Action`]s the agent must
//! carry out and the task state [`Transition`]s to log. The same inputs always give
//! the same outputs, which is what lets `keling replay` re-run a recorded session
//! exactly and compare policies offline. It must not touch cgroups, signals, NVML or
//! files: the agent around it does.
//!
//! # Protocol
//!
//! ```text
//!  kernel events ─► agent ── Input ──► Scheduler::step ── Output ──► agent ─► cgroups, signals
//!                     ▲                                                 │
//!                     └────────── Confirmed / TimedOut (feedback) ◄─────┘
//! ```
//!
//! Every input carries `ts_ns`, the kernel timestamp (CLOCK_MONOTONIC, ns) of what it
//! reports. The core's clock is the largest `ts_ns` seen so far: an input stamped
//! earlier is handled at that clock, so time never runs backwards. Every rule that
//! depends on time (quantum, idle timeout, duration limit, kill deadline) is checked
//! on every input; `Tick` exists so they fire even when nothing else happens.
//!
//! Most inputs change no decision: a task that runs shows activity again, a tick
//! passes. After a step whose reconciliation of the GPUs changed nothing, a step
//! that changes nothing it reads skips it, and the walk of the late-binding queue
//! after one that bound nothing (the clock alone is checked for what it can
//! change: a quantum used up, goav's guard). Skipping decides nothing: a property
//! test (`prop_skipping_a_reconciliation_that_would_change_nothing_changes_nothing`)
//! compares every output, task view and wait reason with a core that reconciles on
//! every step, under every policy, binding and sharing.
//!
//! ## Inputs: agent → core
//!
//! | Input | The agent sends it when | The core |
//! |---|---|---|
//! | `Arrive` | a task (a GPU process or process tree) is launched or adopted; it is running as it is (under late binding, one without a GPU is held before exec instead: "Binding") | places it (`Place`), then lets it run or freezes it; under late binding queues one without a GPU, unbound |
//! | `Active` | the trace saw the task use the GPU or the CPU; or something outside the trace knows a frozen task has work (a request for a frozen server) | marks the task as wanting the GPU |
//! | `Idle` | the task is known to be idle (optional hint) | marks it as not wanting the GPU |
//! | `MemAlloc` / `MemFree` | the driver granted / released bytes (exact, from the kernel) | updates the task's memory, checks its quota |
//! | `AllocFailed` | the driver answered NO_MEMORY | applies the memory-pressure rule |
//! | `Exit` | the task's process (tree) is gone | ends the task: Completed or Failed |
//! | `Tick` | on every tick of its own timer (the agent chooses the period), whether or not anything happened | archives finished tasks; time rules |
//! | `Confirmed` | an action was seen to take effect (`frozen 1` in `cgroup.events`, process state `T`, ...) | completes the state change the action started |
//! | `TimedOut` | an action was not confirmed by the timeout model's deadline | escalates (below) |
//! | `OutsideMem` | it learns how much memory processes in no task hold on a GPU | replaces that GPU's figure (memory sharing admits against capacity less it) |
//! | `MemUnsure` | a table the kernel needed for the task's GPU memory books was full: its figure may be wrong | marks the figure unsure (`TaskView::mem_unsure`): its quota is no longer enforced on it, only on `MemSure` |
//! | `MemSure` | for an unsure figure: a sound lower bound of the task's video memory (all GPUs), which no full table can inflate | ends the task (`over_quota`) if it is over its quota |
//!
//! Inputs naming a task the core does not know are ignored, and so is an `Arrive`
//! for an id it already knows (ids are never reused). Nothing in `step` panics.
//!
//! ## Actions: core → agent
//!
//! Actions in one [`Output`] are listed in the order they should be carried out.
//!
//! | Action | The agent | Feedback the core expects |
//! |---|---|---|
//! | `Place { id, gpu }` | binds the task to `gpu` (`CUDA_VISIBLE_DEVICES` for tasks it launches); once per task: at arrival, or under late binding when a queued task can run (the agent then lets the task it held go on to exec) | none |
//! | `Freeze { id }` | writes 1 to the task's `cgroup.freeze` (SIGSTOP for processes Keling did not launch) | `Confirmed { Freeze }` or `TimedOut { Freeze }` |
//! | `Stop { id }` | sends SIGSTOP to the task's processes: escalation of a freeze that timed out | `Confirmed { Stop }` (a late `Confirmed { Freeze }` counts too) |
//! | `Thaw { id }` | undoes whatever stopped the task: `cgroup.freeze` 0 and SIGCONT | `Confirmed { Thaw }` or `TimedOut { Thaw }` |
//! | `Terminate { id }` | sends SIGTERM | `Exit` (a Kill follows after `kill_grace_ms`) |
//! | `Kill { id }` | sends SIGKILL (or writes `cgroup.kill`) | `Exit` |
//! | `Warn { id, remaining_ms }` | tells the task's owner its session ends in `remaining_ms` | none |
//! | `Enforce { id, record }` | logs/reports the record (4003: duration limit; 4004: overload rule); always followed in the same output by the `Kill` or `Terminate` it justifies, unless one was already sent | none |
//!
//! ## Who confirms what
//!
//! Task states are facts, not intentions. A task being frozen stays `Running` until
//! the agent confirms the freeze, and keeps its slot until then; a task being
//! thawed stays `Preempted` until the thaw is confirmed, but holds its slot already.
//! [`TaskView::in_flight`] shows the actuation in flight. At most one actuation is in
//! flight per task and it is never contradicted: if the core changes its mind while a
//! freeze is in flight, it waits for the confirmation and then thaws. Feedback for an
//! action that is not in flight (late, duplicate, wrong kind) is ignored.
//!
//! Escalation when the timeout model says an action is late:
//! - `TimedOut { Freeze }` → `Stop` (SIGSTOP cannot be ignored). The freeze stays in
//!   flight until `Confirmed { Stop }` or `Confirmed { Freeze }`; `TimedOut { Stop }`
//!   is ignored (a task stuck in the kernel stops when it leaves it).
//! - `TimedOut { Thaw }` → `Thaw` again, once. If that one times out too, the core
//!   assumes the task runs (`Preempted → Running`, reason `thaw_unconfirmed`): a thaw
//!   only removes a restriction, and waiting forever would hold the slot forever.
//! - `TimedOut` of any other action is ignored: `Terminate` is followed by `Kill`
//!   on the kill deadline anyway, and a task ends only on `Exit`.
//!
//! # Policy
//!
//! ## States
//!
//! ```text
//!            ┌───────────────► COMPLETED ─┐
//!  PENDING ──┼──► RUNNING ◄──► PREEMPTED  ├──► ARCHIVED
//!            └───────────────► FAILED ────┘
//! ```
//! (see [`is_legal`] for the exact list). A task arrives `Pending` and is placed on a
//! GPU at once (under late binding, one without a GPU stays `Pending`, unbound,
//! until it is bound: then `Pending → Running`, reason `placed`; see "Binding").
//! If it ranks among the tasks that should hold that GPU's slots it
//! becomes `Running` in the same step (reason `placed`; it is already running, so no
//! action is needed); otherwise it is frozen and becomes `Preempted` when the freeze
//! is confirmed (reason `queued`). `Running → Preempted` reasons:
//! `quantum_expired`, `preempted_by_higher_priority`, `round_robin` (an
//! equal-priority task is ahead in the rotation; `idle` only in older logs, see
//! "Who holds the slots"); `Preempted → Running`: `resumed`.
//! `Exit` makes a task `Completed` (exit code 0, reason `exited`) or `Failed`
//! (non-zero: `exited_with_error`; or any exit after Keling started ending it: the
//! first enforcement's reason, `duration_limit`, `evicted_for_memory` or
//! `over_quota`). Finished tasks become `Archived` on the next `Tick` (reason
//! `archived`), so a reader sees the final state and exit code for one tick first.
//! Each reason is a [`Reason`] variant; the log writes it in snake_case, as here.
//!
//! ## Who holds the slots
//!
//! Each GPU runs at most `slots_per_gpu` tasks at once. A task *uses* the GPU it is
//! placed on and every GPU it holds memory on, whatever it was pinned to: a process
//! placed on GPU 1 that allocates on GPU 0 competes for GPU 0's slots too, so a pin
//! never shelters it from a higher priority working there. After every input, the
//! live tasks that use a GPU are ranked by
//! 1. wanting the GPU first (idle tasks never hold a slot against active ones),
//! 2. priority (0 first),
//! 3. position in the round-robin queue of that priority,
//! 4. id,
//!
//! and the first `slots_per_gpu` should hold the slots. A task that uses several
//! GPUs holds its slots only if it is among the first on each of them. One that
//! cannot is *blocked* and ranked last everywhere (it could use none of its slots,
//! so it keeps nobody from them): when tasks that surely hold a GPU (tasks on one
//! GPU, and tasks on several that are first on each) fill its slots there, or,
//! when tasks on several GPUs only wait on each other, the one of them that ranks
//! last; then the ranking is done again (with one GPU per task, the usual case,
//! once). Tasks outside that set that
//! run and want the GPU are frozen at once (a higher-priority task preempts
//! immediately); idle ones outside it *yield*: they give up the slot but keep
//! running, unfrozen ([`TaskView::yielded`]), since they use neither the GPU nor a
//! CPU and, frozen, could never show that they want the GPU again. Tasks in the set
//! that are frozen are thawed as soon as a slot is free, that is when the freezes in
//! flight are confirmed; a yielded task in it takes its slot back. The one exception to "never more than the slots": a task
//! that arrives and ranks among the holders is already running, so it becomes
//! `Running` at once, and the task it displaces runs too until its freeze lands.
//! Once the actuations in flight are confirmed the scheduler is work-conserving:
//! while there are at least as many tasks as slots every slot is held, by idle tasks
//! if nobody active waits, and no task runs while an active task of higher priority
//! waits on its GPU.
//!
//! **Wanting the GPU.** `Active` makes a task want the GPU; `Idle`, or
//! `idle_timeout_ms` of running without an `Active`, makes it idle. A newly arrived
//! task wants the GPU (it is starting and has never had the chance to show
//! activity). A frozen task cannot show activity, so it keeps what it had when frozen
//! and the idle timeout only counts while it runs (it restarts when the task
//! resumes). A task is never frozen for being idle, so a frozen task wants the GPU
//! unless an `Idle` hint said otherwise while it was frozen. A yielded task
//! that is active again ranks like any other: among the holders it takes its slot
//! back (the holder it displaces is frozen), outside them it is frozen with the
//! reason a running task would get; its first calls reach the GPU before the
//! freeze lands, as an arriving task's do.
//!
//! **Round robin.** A task's quantum ([`quantum_ms`]) is used only while it is
//! `Running`. When it is used up and an active task of the same priority on the same
//! GPU waits, the task goes to the back of its priority's queue (and is frozen with
//! reason `quantum_expired`); if nobody of its priority waits it starts a fresh
//! quantum. A task preempted by a higher priority keeps its queue position and what
//! is left of its quantum.
//!
//! ## Sharing by memory
//!
//! [`SchedConfig::sharing`] says how the tasks on one GPU share it. Under
//! [`Sharing::Slots`] (the core's default, so that configurations and input logs
//! written before it existed replay as recorded) everything above holds: the first
//! `slots_per_gpu` of the ranking hold the GPU. Under [`Sharing::Memory`] (the
//! agent's default) the ranking is *walked* and a task is admitted unless
//! - a cap is reached: `slots_per_gpu` tasks are admitted already (0: no cap;
//!   wait reason `slots_held`);
//! - it wants the GPU and an admitted task that wants it has a higher priority, or
//!   one ranked before it waits for memory (`higher_priority`): a higher priority
//!   that works freezes the lower ones, which keep their memory;
//! - its memory does not fit (`memory`): what it may still take (its budget,
//!   `mem_quota_bytes`, on the GPU it is placed on; else the most it has held
//!   there; less what it holds) added to what every live task holds on the GPU and
//!   what the admitted tasks may still take exceeds the capacity less the memory
//!   held outside any task ([`Input::OutsideMem`]). The first task admitted on a
//!   GPU always fits: waiting would not free the memory that frozen tasks keep, and
//!   a higher priority that needs it gets it by eviction when its allocation fails
//!   ("Memory pressure").
//!
//! The walk goes on past a task that does not fit (a smaller one may); a running
//! task that is not admitted is frozen with reason `no_memory`,
//! `preempted_by_higher_priority`, `quantum_expired` or `round_robin`. A frozen
//! task is thawed once it is admitted and no task holding its GPU is still being
//! frozen. Equal priorities run side by side and take turns by quantum only while
//! a cap makes one of them wait. Under late binding a queued task is bound where it
//! runs beside every holder, else where it fits beside the holders it may not
//! displace (it displaces lower priorities, which keep their memory); never where
//! a higher priority that wants the GPU waits. A task that waits only for memory
//! does not stop the queue's walk. With a cap of 1 the outputs are exactly those of
//! [`Sharing::Slots`] with one slot. [`Scheduler::wait_reason`] says what a waiting
//! task waits for.
//!
//! ## Overload rule
//!
//! With [`SchedConfig::overload`] set (off by default), after every input a running
//! task is truncated when at once it has run more than `min_session_ms` since it
//! arrived (its wait included), the memory in use on its GPU (tasks and outside)
//! peaked during its session at `mem_peak_pct` % of capacity or more, and at least
//! `min_waiting` tasks wait for that GPU (bound there, wanting it, not running; and
//! every task queued unbound). The core emits `Enforce` with the 4004 record
//! ([`EnforcementRecord::overloaded`]: the session, the peak in thousandths of
//! capacity, the waiting count and the thresholds), then `Kill` (`hard_kill`) or
//! `Terminate`; the task ends `Failed`, reason `overloaded`.
//!
//! ## Memory pressure
//!
//! On `AllocFailed { id, gpu, bytes }` the requester needs `bytes` minus the GPU's
//! free bytes (capacity minus the memory all live tasks hold there), minus the memory
//! of tasks already being ended (it is on its way back, so repeated failures while
//! victims exit do not evict more). Candidates are live tasks of strictly lower
//! priority that hold memory on that GPU (wherever they were placed or pinned) and
//! are not already being ended. Nothing a task declares takes it out of this set:
//! under `goav` the set is first sought among the candidates that expect more than
//! 3 s of remaining time (`expected_runtime_ms` minus elapsed wall time; unknown
//! counts as more), and among all of them when those cannot cover the need. The
//! evicted set is the smallest that covers the need:
//! fewest tasks, then fewest bytes, then lowest priorities, then lowest ids (see
//! [`choose_victims`]). If no set covers it, nobody is evicted: that would not make
//! the allocation succeed. A GPU missing from the config has no known capacity and
//! evicts nobody. Eviction is `Terminate`, then `Kill` after `kill_grace_ms` if the
//! task has not exited. A `MemAlloc` that takes a task's memory on all GPUs together
//! strictly over `mem_quota_bytes` ends it the same way (reason `over_quota`),
//! unless its figure is unsure (`MemUnsure`): no decision is taken on a figure Keling
//! knows may be wrong; such a task is judged on the sound lower bound the agent
//! sends (`MemSure`) instead, which ends it the same way when over its quota. A task
//! that Keling is already ending evicts nobody.
//!
//! ## Session duration limits
//!
//! Elapsed time counts from arrival, in wall time, frozen time included (the limit is
//! on the session, not on GPU time). At `limit - grace` the core emits `Warn` once; at
//! the limit it emits `Enforce` with the 4003 record (`allowed_ms` = the limit,
//! `actual_ms` = elapsed at that input) and `Kill` (`hard_kill`, the default) or
//! `Terminate` followed by `Kill` after `kill_grace_ms`. Because time rules run on
//! every input and the agent ticks periodically, it fires within one tick of the
//! deadline. If the first input past the warning point is already past the limit
//! (or `grace_ms` is 0), no `Warn` is sent: the `Enforce` says it all. The limit is
//! enforced even on a task already being ended for another reason.
//!
//! ## Placement
//!
//! A task with `gpu: Some(g)` goes to `g` (even one missing from the config, which is
//! then scheduled with `slots_per_gpu` slots and unknown capacity). Otherwise the core
//! picks the configured GPU with the highest weight
//!
//! `W = 0.4 × (1 − used/capacity) + 0.35 × 1/(1 + expected_queue_s) + 0.25 × success_rate`
//!
//! The design articles' formula (docs/design.md) mixes a load term (memory used, lower is better) with two
//! goodness terms (higher is better); Keling turns the load term into free memory so
//! that higher W is better throughout. `expected_queue_s` is the expected remaining
//! work of the tasks on that GPU that want it (expected runtime left, or what is left
//! of their quantum when the runtime is unknown), divided by the slots.
//! `success_rate` is successful allocations over all attempts on that GPU in the last
//! 300 s (kept in 1 s buckets), 1.0 with no data. Ties go to the lowest index. With no
//! GPUs configured, tasks go to GPU 0. That is placement at arrival
//! ([`Binding::AtArrival`]); late binding chooses among the GPUs that can run the
//! task now, and breaks ties otherwise (below).
//!
//! ## Binding
//!
//! [`SchedConfig::binding`] says when a task without a GPU in its spec is bound to
//! one. [`Binding::AtArrival`] (the default, and what the agent's daemon speaks
//! today) is "Placement" above: bound at once, by W, running as it is, frozen there
//! if it must wait. Everything in this section is [`Binding::Late`]; an `Arrive`
//! with `gpu: Some(g)` is bound to `g` at arrival under both (it is running as it
//! is: an adopted process, or a launch given a GPU), and waits for `g` only.
//!
//! **Queued, unbound.** Under late binding an `Arrive` with `gpu: None` means: the
//! agent launched the task and holds it before exec; it runs nothing and uses no
//! GPU. The core puts it in one host-level queue, in the policy's rank order
//! (priority, then arrival; arrival alone under `fifo` and `rr`), and answers
//! nothing. A queued task is `Pending` with `gpu: None` and nothing in flight in
//! its [`TaskView`]; [`Scheduler::queue`] and [`Scheduler::queued`] give its
//! position ([`QueuedView`]: 1 for the next, `ahead` = tasks before it) and why it
//! waits ([`WaitReason`]: `slots_held`, `ending`). `Idle` for a
//! queued task is ignored (it has not started); its session limit runs from
//! arrival as for any task (the wait is part of the session), and an `Exit` ends
//! it unbound (`Pending → Completed | Failed`, `gpu` null).
//!
//! **Bound when it can run.** After every input (after the time rules, before the
//! slots are reconciled) the queue is walked in order and each task that can run
//! on a GPU it may use (the configured ones; GPU 0 when none is) is bound there:
//! `Place { id, gpu }`, then `Pending → Running` (reason `placed`) in the same
//! output, at that input's clock. The walk stops at the first task that cannot
//! run: nobody after it can. A task can run on a GPU when fewer than
//! `slots_per_gpu` of the tasks bound there keep their claim against it:
//! - holders it may not displace: every holder under `fifo`; holders that want
//!   the GPU with an equal or higher priority (an unbound task never rotates a
//!   holder out: equal priorities take turns only among the tasks bound to a
//!   GPU, so work does not pile up on one GPU); under `goav`, what the guard
//!   keeps (below);
//! - tasks with an actuation in flight: being thawed (they run next) or being
//!   frozen (they run until the freeze is confirmed; the slot is then handed to
//!   whoever ranks first);
//! - tasks waiting on that GPU (frozen there, or arrived there running) that
//!   rank before it.
//!
//! The other holders (idle ones, and lower priorities) are displaced: if the task
//! takes one of their slots, an idle holder yields (it keeps running, without the
//! slot), a lower priority's `Freeze` follows in the same output (reason
//! `preempted_by_higher_priority` when it lands) and it runs until then, as a task
//! displaced by an arrival does. Yielded tasks hold no slot.
//!
//! **Which GPU.** A GPU with a free slot (room without displacing anyone) comes
//! first: the highest W; among weights within [`PLACEMENT_WEIGHT_TIE`], the least
//! busy time (time with a task `Running` there, counted on the core's clock since
//! it started; [`Scheduler::busy_ns`]); among those, the smallest hash of
//! [`SchedConfig::placement_seed`], the task and the GPU. Never the index: the
//! seed is the core's only source of randomness, and the same seed gives the same
//! choices, so replays reproduce them. Without a free slot, the GPU whose
//! displaced task ranks last. Under [`Sharing::Memory`] the GPUs where a task
//! fits beside every holder are compared otherwise: if some have no live task
//! of another priority (not being ended; one of the two would freeze the other
//! while it works), only those: the ones whose GPU time (busy time plus the
//! work the tasks there are expected still to need, each task's progress
//! counted as its share of the GPU) is within the task's own expected work of
//! the least; among those one that runs the task's priority already rather
//! than the last empty GPU (kept for a priority with no GPU of its own); then
//! the least memory held there over time plus what the
//! tasks there, it included, may hold for [`MEM_HORIZON_S`]; then the least GPU
//! time, then the hash. If none has, as above (W first). Without a GPU where it
//! fits beside every holder, the one where it freezes the fewest working tasks,
//! then where the task it displaces ranks last.
//!
//! **After binding** a task keeps its GPU (a CUDA context does not move): quanta,
//! idleness, preemption among the tasks of a GPU, memory pressure and quotas
//! apply to it as to any task. Its expected runtime counts from binding, not
//! from arrival (held before exec, it had not started).
//!
//! **Work-conserving.** After every input, whatever is in flight, no GPU a queued
//! task (not being ended) may use has a free slot: each slot is held by a task
//! that runs, is being thawed, or runs until its freeze is confirmed. Under
//! `hybrid`, once actuations are confirmed, no task runs on such a GPU while a
//! queued task of higher priority waits, and no idle task holds a slot while one
//! waits (`tests/binding.rs` checks both after every step).
//!
//! **What the agent does under late binding.** Hold a launched task without a GPU
//! before exec and send `Arrive` with `gpu: None`; on `Place { id, gpu }` set
//! `CUDA_VISIBLE_DEVICES` (and the task's cgroup/GPU record) and release the exec;
//! tell a waiting launcher its [`Scheduler::queued`] position. Adopted processes
//! and launches given a GPU arrive with their GPU, as before.
//!
//! ## Policies
//!
//! Everything above is [`Policy::Hybrid`], the agent's policy and what
//! [`Scheduler::new`] gives. [`Scheduler::with_policy`] gives the design articles'
//! guarded variant of it and two textbook policies for `keling replay` to compare
//! it with; they change only how the slot holders are chosen, not placement,
//! feedback, quotas or duration limits:
//!
//! | policy | priority a task is scheduled with | slot holders, in rank order | preemption |
//! |---|---|---|---|
//! | `hybrid` | its own | wanting the GPU, priority, round-robin position, id | higher priority at once; equal priorities by quantum; idle tasks yield; memory pressure evicts lower priorities |
//! | `fifo` | [`EQUAL_PRIORITY`] for all | arrival order, id (wanting the GPU or not) | none: a holder keeps its slot until it exits; nobody is evicted for memory |
//! | `rr` | [`EQUAL_PRIORITY`] for all | wanting the GPU, round-robin position, id | equal turns of 100 ms ([`quantum_ms`] of [`EQUAL_PRIORITY`]); idle tasks yield; nobody is evicted for memory |
//! | `goav` | its own | as `hybrid`, except what the guard keeps (below) | as `hybrid`, but a higher priority preempts only through the guard |
//!
//! **The goav guard** (the design articles' rule, as a preference). A holder of
//! lower priority is a preemption *candidate* if it wants the GPU, is not being
//! frozen or sent to the back of its queue, and expects more than
//! [`PREEMPTION_MIN_REMAINING_MS`] (3 s) of remaining time (unknown counts as
//! more). When at least [`PREEMPTION_MIN_CANDIDATES`] (2) candidates qualify among
//! the GPUs a waiting higher priority may use (its own GPU for a bound task, every
//! GPU for a queued one under late binding), the victim is the candidate that
//! ranks last and the holders that are no candidate keep their slots. With fewer
//! candidates the higher priority preempts as under `hybrid`: the articles'
//! guard would have kept it waiting, but an expected runtime is the task
//! owner's claim, and no claim may make a task immune to a higher priority
//! (with `--expected-runtime-ms 1` it would have). In the ranking, the first
//! tier holds the tasks late binding bound in this input and, when the guard
//! prefers, the holders that are no candidate. Idle holders still yield, equal
//! priorities still rotate, and memory pressure prefers candidates the same way
//! (see "Memory pressure").
//!
//! Transitions and views show the priority each task asked for under every
//! policy.
//!
//! ## Small decisions
//!
//! Priorities above 15 are treated as 15; `slots_per_gpu` 0 is treated as 1.
//! Archived tasks are kept so that [`Scheduler::task`] can still answer for them.
//!
//! # Crate layout
//!
//! | Module | Owns |
//! |---|---|
//! | [`input`] | what the agent tells the core: [`Input`], [`TaskSpec`] |
//! | [`action`] | what the core tells the agent: [`Action`], [`ActionKind`], the 4003 [`EnforcementRecord`] |
//! | [`state`] | task states and what is shown of them: [`TaskState`], [`is_legal`], [`Transition`], [`TaskView`], [`QueuedView`], [`WaitReason`], [`Class`], [`quantum_ms`] |
//! | [`reason`] | why a task changed state: [`Reason`] |
//! | [`config`] | [`SchedConfig`], [`GpuInfo`], [`Binding`] |
//! | [`placement`] | the placement weight, the allocation success-rate window, late binding's tie-break, [`load_balance_error`] |
//! | [`victims`] | which tasks memory pressure evicts: [`choose_victims`] |
//! | [`policy`] | the agent's [`Policy`], the guarded one, and the two `keling replay` compares them with |
//! | [`scheduler`] | the state machine: [`Scheduler`], [`Output`]; its `binding` submodule, late binding's queue |
//!
//! Everything the agent needs is re-exported here. The crate has no dependency that
//! can do I/O, and a test (`tests/purity.rs`) fails if one is added or if the sources
//! name the clock, the file system, the network, processes or threads.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod action;
pub mod config;
pub mod input;
pub mod placement;
pub mod policy;
pub mod reason;
pub mod scheduler;
pub mod state;
pub mod victims;

mod task;
#[cfg(test)]
mod tests;

pub use action::{
    Action, ActionKind, DURATION_EXCEEDED_CODE, EnforcementData, EnforcementRecord,
    OVERLOADED_CODE, OverloadData,
};
pub use config::{
    Binding, DEFAULT_GRACE_MS, DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_KILL_GRACE_MS,
    DEFAULT_MAX_DURATION_MS, DEFAULT_OVERLOAD_MEM_PEAK_PCT, DEFAULT_OVERLOAD_MIN_WAITING,
    DEFAULT_OVERLOAD_SESSION_MS, GpuInfo, OverloadRule, SchedConfig, Sharing,
};
pub use input::{Input, TaskSpec};
pub use placement::{
    ALLOC_SUCCESS_WINDOW_S, MEM_HORIZON_S, PLACEMENT_ALLOC_SUCCESS_WEIGHT,
    PLACEMENT_FREE_MEMORY_WEIGHT, PLACEMENT_QUEUE_WEIGHT, PLACEMENT_WEIGHT_TIE, load_balance_error,
};
pub use policy::{EQUAL_PRIORITY, PREEMPTION_MIN_CANDIDATES, PREEMPTION_MIN_REMAINING_MS, Policy};
pub use reason::Reason;
pub use scheduler::{Output, Scheduler};
pub use state::{
    Class, LOWEST_PRIORITY, QueuedView, TaskState, TaskView, Transition, WaitReason, class_of,
    is_legal, quantum_ms,
};
pub use victims::{
    EVICTION_MIN_REMAINING_MS, EXACT_VICTIM_SEARCH_MAX_CANDIDATES, VictimCandidate, choose_victims,
};

/// A task's id, chosen by the agent; never reused.
pub type TaskId = u64;

/// The revision of the core's decision rules: raised whenever the same inputs
/// under the same config and policy lead to other decisions (a new placement
/// rule, another tie-break). Input logs record it, so that an exact replay of a
/// log recorded under other rules says so rather than calling the difference
/// a bug. 1: the rules as of the last empty GPU kept under memory sharing (logs
/// written before have no revision). The agent's test
/// `the_cores_decisions_are_pinned_to_its_rules_revision` pins the decisions on
/// a few synthetic workloads beside it.
pub const RULES_REVISION: u32 = 1;

pub(crate) const NS_PER_MS: u64 = 1_000_000;
pub(crate) const NS_PER_S: u64 = 1_000_000_000;

pub(crate) fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(NS_PER_MS)
}
