//! Property tests: the policy once actuations settle (1), fair round robin (2),
//! duration limits on time (3), eviction of the minimal set through `step` (4),
//! legal, consistent transitions (5), determinism and replay through JSON (6), and
//! no panic on arbitrary inputs.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::strategies::{Op, arb_kind, arb_op, op_input, random_config};
use super::*;
use crate::victims::tests::brute_force_victims;

#[derive(Clone, Copy, Debug)]
struct InFlight {
    kind: ActionKind,
    timeouts: u32,
}

/// Feeds inputs and checks every output against the protocol in the crate doc,
/// keeping its own record of task states and actuations in flight.
pub(super) struct Driver {
    pub(super) sched: Scheduler,
    ts_ns: u64,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
    states: BTreeMap<TaskId, TaskState>,
    in_flight: BTreeMap<TaskId, InFlight>,
    last_event_id: u64,
}

impl Driver {
    pub(super) fn new(config: SchedConfig) -> Self {
        Driver {
            sched: Scheduler::new(config),
            ts_ns: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            states: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            last_event_id: 0,
        }
    }

    fn nth_in_flight(&self, n: usize) -> Option<(TaskId, InFlight)> {
        if self.in_flight.is_empty() {
            return None;
        }
        self.in_flight
            .iter()
            .nth(n % self.in_flight.len())
            .map(|(&id, &f)| (id, f))
    }

    fn confirmation_kind(f: InFlight) -> ActionKind {
        if f.kind == ActionKind::Freeze && f.timeouts > 0 {
            ActionKind::Stop
        } else {
            f.kind
        }
    }

    pub(super) fn apply(&mut self, op: &Op, advance_ms: u64) {
        self.ts_ns += advance_ms * MS;
        let ts_ns = self.ts_ns;
        let input = op_input(op, ts_ns, |n| {
            self.nth_in_flight(n)
                .map(|(id, f)| (id, Self::confirmation_kind(f), f.kind))
        });
        self.feed(input);
    }

    fn feed(&mut self, input: Input) -> Output {
        let arriving = match &input {
            Input::Arrive { spec, .. } if self.sched.task(spec.id).is_none() => Some(spec.id),
            _ => None,
        };
        let was_live = input
            .task()
            .and_then(|id| self.sched.task(id))
            .is_some_and(|v| v.state.is_live());
        let out = self.sched.step(&input);
        if let Some(id) = arriving {
            self.states.insert(id, Pending);
        }

        // What the protocol says the input did to the actuation in flight.
        let mut stop_expected = None;
        let mut retry_expected = None;
        match input {
            Input::Confirmed { id, action, .. } => {
                if let Some(f) = self.in_flight.get(&id)
                    && matches!(
                        (f.kind, action),
                        (ActionKind::Freeze, ActionKind::Freeze | ActionKind::Stop)
                            | (ActionKind::Thaw, ActionKind::Thaw)
                    )
                {
                    self.in_flight.remove(&id);
                }
            }
            Input::TimedOut { id, action, .. } => {
                if let Some(f) = self.in_flight.get_mut(&id)
                    && f.kind == action
                {
                    f.timeouts += 1;
                    match (f.kind, f.timeouts) {
                        (ActionKind::Freeze, 1) => stop_expected = Some(id),
                        (ActionKind::Thaw, 1) => retry_expected = Some(id),
                        (ActionKind::Thaw, _) => {
                            self.in_flight.remove(&id);
                        }
                        _ => {}
                    }
                }
            }
            Input::Exit { id, .. } if was_live => {
                self.in_flight.remove(&id);
            }
            _ => {}
        }

        let (mut stops, mut retries, mut places) = (0, 0, 0);
        for action in &out.actions {
            match *action {
                Action::Freeze { id } => {
                    assert!(
                        !self.in_flight.contains_key(&id),
                        "Freeze for {id} while {:?} is in flight",
                        self.in_flight[&id]
                    );
                    let state = self.sched.task(id).map(|v| v.state);
                    assert!(
                        matches!(state, Some(Running | Pending)),
                        "Freeze for {id} in {state:?}"
                    );
                    self.in_flight.insert(
                        id,
                        InFlight {
                            kind: ActionKind::Freeze,
                            timeouts: 0,
                        },
                    );
                }
                Action::Thaw { id } if retry_expected == Some(id) && retries == 0 => {
                    retries += 1;
                }
                Action::Thaw { id } => {
                    assert!(
                        !self.in_flight.contains_key(&id),
                        "Thaw for {id} while {:?} is in flight",
                        self.in_flight[&id]
                    );
                    let view = self.sched.task(id).expect("known task");
                    assert_eq!(view.state, Preempted, "Thaw for {id}");
                    // Only into a free slot on every GPU it uses: whoever is
                    // still being frozen holds one.
                    let views = self.sched.tasks();
                    let (gpu, holders) = uses(&view)
                        .into_iter()
                        .map(|g| {
                            let holders = views
                                .iter()
                                .filter(|v| v.state.is_live() && uses(v).contains(&g))
                                .filter(|v| {
                                    (v.state == Running && !v.yielded)
                                        || v.in_flight == Some(ActionKind::Thaw)
                                })
                                .count();
                            (g, holders)
                        })
                        .max_by_key(|&(_, h)| h)
                        .unwrap_or((0, 0));
                    assert!(
                        holders <= self.sched.config().cap(),
                        "Thaw for {id} overfills GPU {gpu}: {holders} holders"
                    );
                    self.in_flight.insert(
                        id,
                        InFlight {
                            kind: ActionKind::Thaw,
                            timeouts: 0,
                        },
                    );
                }
                Action::Stop { id } => {
                    assert_eq!(stop_expected, Some(id), "unexpected Stop for {id}");
                    stops += 1;
                }
                Action::Place { id, .. } => {
                    assert_eq!(arriving, Some(id), "Place for {id} outside its arrival");
                    places += 1;
                }
                _ => {}
            }
        }
        assert_eq!(
            stops,
            usize::from(stop_expected.is_some()),
            "freeze escalation"
        );
        assert_eq!(retries, usize::from(retry_expected.is_some()), "thaw retry");
        assert_eq!(
            places,
            usize::from(arriving.is_some()),
            "one Place per task"
        );

        for t in &out.transitions {
            assert_eq!(t.event_id, self.last_event_id + 1, "event ids");
            self.last_event_id = t.event_id;
            assert!(is_legal(t.from, t.to), "illegal {}", t.state_transition());
            assert_eq!(
                self.states.get(&t.task),
                Some(&t.from),
                "task {} {} does not start from its state",
                t.task,
                t.state_transition()
            );
            assert_eq!(
                t.exit_code.is_some(),
                matches!(t.to, Completed | Failed | Archived),
                "exit code on {}",
                t.state_transition()
            );
            assert_eq!(t.timestamp_ns, self.sched.now_ns());
            self.states.insert(t.task, t.to);
        }

        for (&id, &state) in &self.states {
            let view = self.sched.task(id).expect("known task");
            assert_eq!(view.state, state, "task {id}");
            let in_flight = view.in_flight.map(|k| {
                if k == ActionKind::Stop {
                    ActionKind::Freeze
                } else {
                    k
                }
            });
            assert_eq!(
                in_flight,
                self.in_flight.get(&id).map(|f| f.kind),
                "task {id}"
            );
        }
        self.inputs.push(input);
        self.outputs.push(out.clone());
        out
    }

    /// The perfect actuator: confirms everything in flight, now, until nothing is.
    pub(super) fn settle(&mut self) {
        for _ in 0..16 {
            let pending: Vec<(TaskId, ActionKind)> = self
                .in_flight
                .iter()
                .map(|(&id, &f)| (id, Self::confirmation_kind(f)))
                .collect();
            if pending.is_empty() {
                return;
            }
            for (id, action) in pending {
                let ts_ns = self.ts_ns;
                self.feed(Input::Confirmed { id, action, ts_ns });
            }
        }
        panic!("actuations never settle: {:?}", self.in_flight);
    }
}

/// The GPUs a task uses: the one it is placed on and every GPU it holds memory
/// on (none while unbound).
pub(super) fn uses(v: &TaskView) -> BTreeSet<u32> {
    let Some(home) = v.gpu else {
        return BTreeSet::new();
    };
    let mut gpus: BTreeSet<u32> = v
        .mem_bytes
        .iter()
        .filter(|&(_, &b)| b > 0)
        .map(|(&g, _)| g)
        .collect();
    gpus.insert(home);
    gpus
}

/// With no actuation in flight: every task has been decided, no GPU runs more
/// tasks than slots (counting every task that uses it, wherever it was placed)
/// or leaves a slot empty while a task that uses only it waits, and no task runs
/// while an active task of higher priority that uses only that GPU waits (nor an
/// idle one while an active one waits). A waiting task that uses several GPUs
/// waits for one of them that is full.
fn check_settled_policy(sched: &Scheduler) {
    let slots = sched.config().slots();
    let live: Vec<TaskView> = sched
        .tasks()
        .into_iter()
        .filter(|v| v.state.is_live())
        .collect();
    let gpus: BTreeSet<u32> = live.iter().flat_map(uses).collect();
    let running_on = |gpu: u32| -> Vec<&TaskView> {
        live.iter()
            .filter(|v| uses(v).contains(&gpu))
            .filter(|v| v.state == Running && !v.yielded)
            .collect()
    };
    for &gpu in &gpus {
        let on_gpu: Vec<&TaskView> = live.iter().filter(|v| uses(v).contains(&gpu)).collect();
        for v in &on_gpu {
            assert_eq!(v.in_flight, None, "task {}", v.spec.id);
            assert_ne!(v.state, Pending, "task {} never decided", v.spec.id);
        }
        for v in &on_gpu {
            if v.yielded {
                assert_eq!(v.state, Running, "task {} yielded", v.spec.id);
                assert!(!v.wants_gpu, "task {} yielded but wants the GPU", v.spec.id);
            }
        }
        // The slot holders: yielded tasks run, idle, without one.
        let running = running_on(gpu);
        let waiting: Vec<&TaskView> = on_gpu
            .iter()
            .copied()
            .filter(|v| v.state == Preempted && uses(v).len() == 1)
            .collect();
        assert!(
            running.len() <= slots,
            "GPU {gpu} runs {} tasks",
            running.len()
        );
        if !waiting.is_empty() {
            assert_eq!(
                running.len(),
                slots,
                "GPU {gpu} leaves a slot empty while tasks wait"
            );
        }
        for high in waiting.iter().filter(|v| v.wants_gpu) {
            for low in &running {
                assert!(
                    low.wants_gpu,
                    "idle task {} holds a slot on GPU {gpu} while active task {} waits",
                    low.spec.id, high.spec.id
                );
                assert!(
                    low.spec.priority <= high.spec.priority,
                    "task {} (priority {}) runs while task {} (priority {}) waits on GPU {gpu}",
                    low.spec.id,
                    low.spec.priority,
                    high.spec.id,
                    high.spec.priority
                );
            }
        }
    }
    for v in live
        .iter()
        .filter(|v| v.state == Preempted && uses(v).len() > 1)
    {
        assert!(
            uses(v).iter().any(|&g| running_on(g).len() == slots),
            "task {} waits although every GPU it uses ({:?}) has a free slot",
            v.spec.id,
            uses(v)
        );
    }
}

/// Most minus least on-GPU time over all tasks.
fn on_gpu_spread_ns(sched: &Scheduler) -> u64 {
    let shares: Vec<u64> = sched.tasks().iter().map(|v| v.on_gpu_ns).collect();
    let max = shares.iter().max().copied().unwrap_or(0);
    let min = shares.iter().min().copied().unwrap_or(0);
    max - min
}

fn arb_spec_any() -> impl Strategy<Value = TaskSpec> {
    (
        0u64..4,
        any::<u8>(),
        prop::option::of(prop_oneof![0u32..3, any::<u32>()]),
        prop::option::of(any::<u64>()),
        prop::option::of(prop_oneof![0u64..100, any::<u64>()]),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(id, priority, gpu, quota, max_ms, grace_ms, hard_kill, expected)| TaskSpec {
                gpu,
                mem_quota_bytes: quota,
                max_duration_ms: max_ms,
                grace_ms,
                hard_kill,
                expected_runtime_ms: expected,
                ..spec(id, priority)
            },
        )
}

fn arb_input_any() -> impl Strategy<Value = Input> {
    let id = || 0u64..4;
    let ts = || prop_oneof![0u64..10_000_000_000, any::<u64>()];
    let gpu = || prop_oneof![0u32..3, any::<u32>()];
    let bytes = || prop_oneof![0u64..(32 * GIB), any::<u64>()];
    prop_oneof![
        (arb_spec_any(), ts()).prop_map(|(spec, ts_ns)| Input::Arrive { spec, ts_ns }),
        (id(), ts()).prop_map(|(id, ts_ns)| Input::Active { id, ts_ns }),
        (id(), ts()).prop_map(|(id, ts_ns)| Input::Idle { id, ts_ns }),
        (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::MemAlloc {
            id,
            gpu,
            bytes,
            ts_ns
        }),
        (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::MemFree {
            id,
            gpu,
            bytes,
            ts_ns
        }),
        (id(), gpu(), bytes(), ts()).prop_map(|(id, gpu, bytes, ts_ns)| Input::AllocFailed {
            id,
            gpu,
            bytes,
            ts_ns
        }),
        (id(), any::<i32>(), ts()).prop_map(|(id, exit_code, ts_ns)| Input::Exit {
            id,
            exit_code,
            ts_ns
        }),
        ts().prop_map(|ts_ns| Input::Tick { ts_ns }),
        (id(), arb_kind(), ts()).prop_map(|(id, action, ts_ns)| Input::Confirmed {
            id,
            action,
            ts_ns
        }),
        (id(), arb_kind(), ts()).prop_map(|(id, action, ts_ns)| Input::TimedOut {
            id,
            action,
            ts_ns
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Property 1: once the actuations in flight are confirmed, no task runs
    /// while a higher-priority task that wants the same GPU waits.
    #[test]
    fn prop_no_task_runs_while_a_higher_priority_task_waits(
        ops in prop::collection::vec((arb_op(false), 0u64..=15), 1..150),
        slots in 1u32..=3,
    ) {
        let mut driver = Driver::new(random_config(slots));
        for (op, advance_ms) in &ops {
            driver.apply(op, *advance_ms);
            driver.settle();
            check_settled_policy(&driver.sched);
        }
    }

    /// Property 5: every transition is legal, starts from the task's state, and
    /// event ids count up from 1; actuations are never contradicted in flight and
    /// time-outs escalate as documented (the Driver checks all of it per step).
    #[test]
    fn prop_transitions_are_legal_and_consistent(
        ops in prop::collection::vec((arb_op(true), 0u64..=15), 1..250),
        slots in 1u32..=3,
    ) {
        let mut driver = Driver::new(random_config(slots));
        for (op, advance_ms) in &ops {
            driver.apply(op, *advance_ms);
        }
        let ids: Vec<u64> = driver.outputs.iter().flat_map(|o| &o.transitions).map(|t| t.event_id).collect();
        prop_assert_eq!(ids, (1..=driver.last_event_id).collect::<Vec<u64>>());
    }

    /// Property 6: the same inputs give the same outputs, also after a trip
    /// through the JSON lines `keling replay` reads.
    #[test]
    fn prop_same_inputs_give_same_outputs(
        ops in prop::collection::vec((arb_op(true), 0u64..=15), 1..250),
        slots in 1u32..=3,
    ) {
        let mut driver = Driver::new(random_config(slots));
        for (op, advance_ms) in &ops {
            driver.apply(op, *advance_ms);
        }
        let replay = |inputs: &[Input]| {
            let mut sched = Scheduler::new(random_config(slots));
            let outputs: Vec<Output> = inputs.iter().map(|i| sched.step(i)).collect();
            (outputs, sched.tasks())
        };
        let (outputs, tasks) = replay(&driver.inputs);
        prop_assert_eq!(&outputs, &driver.outputs);
        prop_assert_eq!(&tasks, &driver.sched.tasks());
        let jsonl: String = driver
            .inputs
            .iter()
            .map(|i| serde_json::to_string(i).unwrap() + "\n")
            .collect();
        let parsed: Vec<Input> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        prop_assert_eq!(&parsed, &driver.inputs);
        prop_assert_eq!(&replay(&parsed).0, &driver.outputs);
    }

    /// Property 4, through `step`: AllocFailed terminates exactly the brute-force
    /// minimum over the candidates the rules allow: every lower priority holding
    /// memory there under hybrid; under goav, those expecting more than 3 s
    /// first, and all of them when those cannot cover the need.
    #[test]
    fn prop_eviction_terminates_the_brute_force_minimum(
        tasks in prop::collection::vec((0u8..=15, 0u64..12, prop::option::of(0u64..10_000)), 1..10),
        requester in any::<prop::sample::Index>(),
        want_units in 1u64..48,
        now_ms in 0u64..6_000,
        goav in any::<bool>(),
    ) {
        const UNIT: u64 = 1 << 20;
        const CAPACITY_UNITS: u64 = 40;
        let policy = if goav { Policy::Goav } else { Policy::Hybrid };
        let mut sched = Scheduler::with_policy(SchedConfig {
            gpus: vec![GpuInfo { index: 0, capacity_bytes: CAPACITY_UNITS * UNIT }],
            slots_per_gpu: 16,
            ..SchedConfig::default()
        }, policy);
        for (i, &(priority, units, expected)) in tasks.iter().enumerate() {
            let id = i as TaskId;
            sched.step(&Input::Arrive {
                spec: TaskSpec { expected_runtime_ms: expected, ..spec(id, priority) },
                ts_ns: 0,
            });
            if units > 0 {
                sched.step(&Input::MemAlloc { id, gpu: 0, bytes: units * UNIT, ts_ns: 0 });
            }
        }
        let ts_ns = now_ms * MS;
        sched.step(&Input::Tick { ts_ns });
        let requester = requester.index(tasks.len());
        let out = sched.step(&Input::AllocFailed {
            id: requester as TaskId,
            gpu: 0,
            bytes: want_units * UNIT,
            ts_ns,
        });

        let used: u64 = tasks.iter().map(|t| t.1).sum();
        let need_units = want_units.saturating_sub(CAPACITY_UNITS.saturating_sub(used));
        let lower = |preferred_only: bool| -> Vec<VictimCandidate> {
            tasks
                .iter()
                .enumerate()
                .filter(|&(i, &(priority, units, expected))| {
                    i != requester
                        && priority > tasks[requester].0
                        && units > 0
                        && (!preferred_only
                            || expected.is_none_or(|e| e.saturating_sub(now_ms) > 3_000))
                })
                .map(|(i, &(priority, units, _))| VictimCandidate { id: i as TaskId, priority, bytes: units })
                .collect()
        };
        let mut expected = if goav {
            brute_force_victims(&lower(true), need_units)
        } else {
            Vec::new()
        };
        if expected.is_empty() {
            expected = brute_force_victims(&lower(false), need_units);
        }
        prop_assert_eq!(terminated(&out), expected);
    }

    /// Nothing in `step` panics, whatever the input; event ids still count up.
    #[test]
    fn prop_step_never_panics_on_arbitrary_inputs(
        inputs in prop::collection::vec(arb_input_any(), 1..120),
        slots in 0u32..3,
    ) {
        let mut sched = Scheduler::new(SchedConfig { kill_grace_ms: u64::MAX, ..random_config(slots) });
        let mut last_event_id = 0;
        for input in &inputs {
            let out = sched.step(input);
            for t in &out.transitions {
                prop_assert_eq!(t.event_id, last_event_id + 1);
                prop_assert!(is_legal(t.from, t.to));
                last_event_id = t.event_id;
            }
            let _ = sched.placement_weights(input.ts_ns());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Property 2: equal-priority, always-active tasks get equal GPU time to within
    /// one quantum (checked after every tick, so also over a long run), and the
    /// slots never idle. The actuator confirms at once.
    #[test]
    fn prop_round_robin_gives_equal_shares_within_one_quantum(
        tasks in 2u64..=5,
        priority in 0u8..=15,
        slots in 1u32..=2,
        run_ms in 1_000u64..3_000,
    ) {
        let quantum_ns = quantum_ms(priority) * MS;
        let mut driver = Driver::new(config(1, slots));
        for id in 0..tasks {
            driver.feed(Input::Arrive { spec: spec(id, priority), ts_ns: 0 });
        }
        driver.settle();
        for ms in 1..=run_ms {
            driver.ts_ns = ms * MS;
            let ts_ns = driver.ts_ns;
            let running: Vec<TaskId> = driver.sched.tasks().iter().filter(|v| v.state == Running).map(|v| v.spec.id).collect();
            for id in running {
                driver.feed(Input::Active { id, ts_ns });
            }
            driver.feed(Input::Tick { ts_ns });
            driver.settle();
            let spread = on_gpu_spread_ns(&driver.sched);
            prop_assert!(spread <= quantum_ns, "at {} ms: spread {} ns", ms, spread);
        }
        let total: u64 = driver.sched.tasks().iter().map(|v| v.on_gpu_ns).sum();
        prop_assert_eq!(total, u64::from(slots) * run_ms * MS);
    }

    /// Property 2 with a slow actuator: every Freeze/Thaw is confirmed one 1 ms
    /// tick later, so a turn lasts a quantum plus that latency, and shares stay
    /// within one quantum plus one tick at all times. One slot: with more, turns
    /// on different slots drift apart and the spread reaches about two quanta
    /// for a moment (it does not grow with time).
    #[test]
    fn prop_round_robin_with_one_tick_actuation_latency(
        tasks in 2u64..=5,
        priority in 0u8..=15,
        run_ms in 1_000u64..3_000,
    ) {
        let bound_ns = (quantum_ms(priority) + 1) * MS;
        let mut driver = Driver::new(config(1, 1));
        for id in 0..tasks {
            driver.feed(Input::Arrive { spec: spec(id, priority), ts_ns: 0 });
        }
        for ms in 1..=run_ms {
            driver.ts_ns = ms * MS;
            let ts_ns = driver.ts_ns;
            let due: Vec<(TaskId, ActionKind)> = driver
                .in_flight
                .iter()
                .map(|(&id, &f)| (id, Driver::confirmation_kind(f)))
                .collect();
            for (id, action) in due {
                driver.feed(Input::Confirmed { id, action, ts_ns });
            }
            let running: Vec<TaskId> = driver.sched.tasks().iter().filter(|v| v.state == Running).map(|v| v.spec.id).collect();
            for id in running {
                driver.feed(Input::Active { id, ts_ns });
            }
            driver.feed(Input::Tick { ts_ns });
            let spread = on_gpu_spread_ns(&driver.sched);
            prop_assert!(spread <= bound_ns, "at {} ms: spread {} ns", ms, spread);
        }
    }

    /// Property 3: a duration limit fires at the first input at or past the
    /// deadline (so within one tick), with the right record and action, and never
    /// early; the warning likewise at the warning point.
    #[test]
    fn prop_duration_limits_fire_within_one_tick(
        plans in prop::collection::vec(
            (0u64..1_500, 0u64..2_500, 0u64..3_000, any::<bool>(), prop::option::of(0u64..4_000)),
            1..6,
        ),
        // Whole-ms gaps land exactly on deadlines often; ns gaps fall in between.
        gaps_ns in prop_oneof![
            prop::collection::vec((1u64..=10).prop_map(|ms| ms * MS), 300..600),
            prop::collection::vec(1u64..=10 * MS, 300..600),
        ],
    ) {
        const TICK_NS: u64 = 10 * MS;
        const KILL_GRACE_MS: u64 = 20;
        #[derive(Default, Clone)]
        struct Seen {
            arrived_ns: Option<u64>,
            exited: bool,
            warn: Option<(u64, u64)>,
            enforce_ns: Option<u64>,
            terminate_ns: Option<u64>,
            kill_ns: Option<u64>,
        }
        let mut sched = Scheduler::new(SchedConfig {
            kill_grace_ms: KILL_GRACE_MS,
            ..config(1, 8)
        });
        let mut seen = vec![Seen::default(); plans.len()];
        let mut ts_ns = 0;
        for gap in gaps_ns {
            ts_ns += gap;
            let mut inputs = Vec::new();
            for (i, &(arrive_ms, limit_ms, grace_ms, hard, exit_after_ms)) in plans.iter().enumerate() {
                if seen[i].arrived_ns.is_none() && arrive_ms * MS <= ts_ns {
                    seen[i].arrived_ns = Some(ts_ns);
                    inputs.push(Input::Arrive {
                        spec: TaskSpec {
                            max_duration_ms: Some(limit_ms),
                            grace_ms: Some(grace_ms),
                            hard_kill: Some(hard),
                            ..spec(i as TaskId, 5)
                        },
                        ts_ns,
                    });
                } else if let (Some(arrived), Some(after)) = (seen[i].arrived_ns, exit_after_ms)
                    && !seen[i].exited
                    && arrived + after * MS <= ts_ns
                {
                    seen[i].exited = true;
                    inputs.push(Input::Exit { id: i as TaskId, exit_code: 0, ts_ns });
                }
            }
            inputs.push(Input::Tick { ts_ns });
            for input in inputs {
                let out = sched.step(&input);
                for (k, action) in out.actions.iter().enumerate() {
                    let id = action.task() as usize;
                    let (_, limit_ms, _, hard, _) = plans[id];
                    let arrived = seen[id].arrived_ns.unwrap();
                    match action {
                        Action::Enforce { record, .. } => {
                            prop_assert!(seen[id].enforce_ns.is_none(), "enforced twice");
                            seen[id].enforce_ns = Some(ts_ns);
                            prop_assert_eq!(
                                record,
                                &EnforcementRecord::duration_exceeded(limit_ms, (ts_ns - arrived) / MS)
                            );
                            let follow = if hard { Action::Kill { id: id as TaskId } } else { Action::Terminate { id: id as TaskId } };
                            prop_assert_eq!(out.actions.get(k + 1), Some(&follow));
                        }
                        Action::Warn { remaining_ms, .. } => {
                            prop_assert!(seen[id].warn.is_none(), "warned twice");
                            seen[id].warn = Some((ts_ns, *remaining_ms));
                        }
                        Action::Terminate { .. } => seen[id].terminate_ns = Some(ts_ns),
                        Action::Kill { .. } => {
                            prop_assert!(seen[id].kill_ns.is_none(), "killed twice");
                            seen[id].kill_ns = Some(ts_ns);
                        }
                        _ => {}
                    }
                }
                // Whoever is still alive past a deadline has been dealt with.
                for (i, &(_, limit_ms, grace_ms, _, _)) in plans.iter().enumerate() {
                    let Some(arrived) = seen[i].arrived_ns else { continue };
                    let live = sched.task(i as TaskId).is_some_and(|v| v.state.is_live());
                    if !live {
                        continue;
                    }
                    let deadline = arrived + limit_ms * MS;
                    let warn_point = arrived + limit_ms.saturating_sub(grace_ms) * MS;
                    if ts_ns >= deadline {
                        prop_assert!(seen[i].enforce_ns.is_some(), "task {} not enforced at {}", i, ts_ns);
                    } else if ts_ns >= warn_point {
                        prop_assert!(seen[i].warn.is_some(), "task {} not warned at {}", i, ts_ns);
                    }
                    if let Some(terminated) = seen[i].terminate_ns
                        && ts_ns >= terminated + KILL_GRACE_MS * MS
                    {
                        prop_assert!(seen[i].kill_ns.is_some(), "task {} not killed after grace", i);
                    }
                }
            }
        }
        for (i, &(_, limit_ms, grace_ms, _, _)) in plans.iter().enumerate() {
            let Some(arrived) = seen[i].arrived_ns else { continue };
            let deadline = arrived + limit_ms * MS;
            if let Some(enforced) = seen[i].enforce_ns {
                prop_assert!(enforced >= deadline, "task {} enforced early", i);
                prop_assert!(enforced - deadline <= TICK_NS, "task {} enforced late", i);
            }
            if let Some((warned, remaining_ms)) = seen[i].warn {
                let warn_point = arrived + limit_ms.saturating_sub(grace_ms) * MS;
                prop_assert!(warned >= warn_point && warned < deadline, "task {} warned off-window", i);
                prop_assert!(warned - warn_point <= TICK_NS, "task {} warned late", i);
                prop_assert_eq!(remaining_ms, limit_ms - (warned - arrived) / MS);
            }
            if let (Some(terminated), Some(killed)) = (seen[i].terminate_ns, seen[i].kill_ns) {
                let due = terminated + KILL_GRACE_MS * MS;
                prop_assert!(killed >= due && killed - due <= TICK_NS, "task {} kill at {} due {}", i, killed, due);
            }
        }
    }
}
