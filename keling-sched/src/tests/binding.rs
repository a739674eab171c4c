//! Late binding: the host-level queue, binding when a GPU can run a task, the
//! tie-break among free GPUs, the goav guard, and property tests that after
//! every step no GPU has a free slot while a queued task may run there, that
//! no task is bound to a GPU it may not use, and that a bound task keeps its GPU.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn late(gpus: u32, slots: u32) -> SchedConfig {
    SchedConfig {
        binding: Binding::Late,
        ..config(gpus, slots)
    }
}

fn late_harness(config: SchedConfig, policy: Policy) -> Harness {
    Harness {
        sched: Scheduler::with_policy(config, policy),
        ts_ns: 0,
    }
}

fn unpinned(id: TaskId, priority: u8) -> TaskSpec {
    TaskSpec {
        gpu: None,
        ..spec(id, priority)
    }
}

fn expecting(id: TaskId, priority: u8, expected_ms: u64) -> TaskSpec {
    TaskSpec {
        expected_runtime_ms: Some(expected_ms),
        ..unpinned(id, priority)
    }
}

fn placed(out: &Output) -> Vec<(TaskId, u32)> {
    out.actions
        .iter()
        .filter_map(|a| match *a {
            Action::Place { id, gpu } => Some((id, gpu)),
            _ => None,
        })
        .collect()
}

fn queue_ids(h: &Harness) -> Vec<TaskId> {
    h.sched.queue().iter().map(|q| q.id).collect()
}

/// Two GPUs held; three more jobs wait unbound, in order; the first GPU to free
/// takes the oldest, and a bound job keeps its GPU.
#[test]
fn queued_jobs_wait_unbound_and_the_first_free_gpu_takes_the_oldest() {
    let mut h = late_harness(late(2, 1), Policy::Hybrid);
    let a = h.arrive(unpinned(1, 5));
    let b = h.arrive(unpinned(2, 5));
    let (gpu_a, gpu_b) = (placed(&a)[0].1, placed(&b)[0].1);
    assert_ne!(gpu_a, gpu_b, "the second job goes to the free GPU");
    assert_eq!(moves(&b), vec![(2, Pending, Running, "placed")]);
    for id in 3..=5 {
        h.at_ms(id);
        let out = h.arrive(unpinned(id, 5));
        assert_eq!(out, Output::default(), "queued: nothing to do yet");
        let view = h.view(id);
        assert_eq!(
            (view.state, view.gpu, view.in_flight),
            (Pending, None, None)
        );
    }
    let queue = h.sched.queue();
    assert_eq!(
        queue
            .iter()
            .map(|q| (q.id, q.position, q.ahead, q.reason))
            .collect::<Vec<_>>(),
        vec![
            (3, 1, 0, WaitReason::SlotsHeld),
            (4, 2, 1, WaitReason::SlotsHeld),
            (5, 3, 2, WaitReason::SlotsHeld),
        ]
    );
    assert_eq!(h.sched.queued(4), Some(queue[1]));
    assert_eq!(h.sched.queued(1), None, "bound");
    // Held before exec, a queued job cannot be idle.
    h.idle(3);
    assert!(h.view(3).wants_gpu);

    h.at_ms(100);
    let out = h.exit(2, 0);
    assert_eq!(out.actions, vec![Action::Place { id: 3, gpu: gpu_b }]);
    assert_eq!(
        moves(&out),
        vec![
            (2, Running, Completed, "exited"),
            (3, Pending, Running, "placed")
        ]
    );
    assert_eq!(out.transitions[1].gpu, Some(gpu_b));
    assert_eq!(h.view(3).started_ns, Some(100 * MS));
    assert_eq!(queue_ids(&h), vec![4, 5]);
    // A queued job that leaves leaves the queue.
    h.exit(4, 0);
    assert_eq!(queue_ids(&h), vec![5]);
    assert_eq!(h.state(4), Completed);
    assert_eq!(h.view(4).gpu, None);
    assert_eq!(h.view(1).gpu, Some(gpu_a), "running jobs keep their GPU");
}

#[test]
fn the_queue_is_in_priority_then_arrival_order() {
    let mut h = late_harness(late(1, 1), Policy::Hybrid);
    h.arrive(unpinned(1, 3));
    for (id, priority) in [(2, 9), (3, 5), (4, 9), (5, 5)] {
        h.arrive(unpinned(id, priority));
    }
    assert_eq!(queue_ids(&h), vec![3, 5, 2, 4]);
    let out = h.exit(1, 0);
    assert_eq!(placed(&out), vec![(3, 0)]);
    // Under FIFO everyone has the same priority: arrival order.
    let mut h = late_harness(late(1, 1), Policy::Fifo);
    h.arrive(unpinned(1, 3));
    for (id, priority) in [(2, 9), (3, 0), (4, 5)] {
        h.arrive(unpinned(id, priority));
    }
    assert_eq!(queue_ids(&h), vec![2, 3, 4]);
}

/// A higher priority does not wait for a slot: it is bound at once where the job
/// it displaces ranks last, and that job is frozen there.
#[test]
fn a_queued_higher_priority_job_is_bound_at_once_over_the_lowest_holder() {
    let mut h = late_harness(late(2, 1), Policy::Hybrid);
    h.arrive(unpinned(1, 10));
    h.arrive(unpinned(2, 12));
    let gpu_of_2 = h.view(2).gpu.unwrap();
    h.at_ms(5);
    let out = h.arrive(unpinned(3, 1));
    assert_eq!(
        out.actions,
        vec![
            Action::Place {
                id: 3,
                gpu: gpu_of_2
            },
            Action::Freeze { id: 2 }
        ]
    );
    assert_eq!(moves(&out), vec![(3, Pending, Running, "placed")]);
    let out = h.settle(out);
    assert_eq!(
        moves(&out)[1],
        (2, Running, Preempted, "preempted_by_higher_priority")
    );
    // When 3 leaves, its GPU goes back to 2 (bound there), not to a queued job
    // of lower priority.
    h.arrive(unpinned(4, 14));
    let out = h.exit(3, 0);
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
    assert_eq!(queue_ids(&h), vec![4]);
}

/// Equal priorities do not rotate with queued jobs: a bound job is never frozen
/// for a job that could go anywhere, so it does not pile up on one GPU.
#[test]
fn equal_priorities_rotate_only_among_bound_jobs() {
    let mut h = late_harness(late(1, 1), Policy::Hybrid);
    h.arrive(unpinned(1, 7));
    h.arrive(unpinned(2, 7));
    for ms in (10..=1_000).step_by(10) {
        h.at_ms(ms);
        h.active(1);
        assert!(h.tick().actions.is_empty(), "at {ms} ms");
    }
    assert_eq!((h.state(1), h.state(2)), (Running, Pending));
    // A job pinned to the GPU is bound there at arrival: it rotates.
    let out = h.arrive(spec(3, 7));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 3, gpu: 0 }, Action::Freeze { id: 3 }]
    );
    h.settle(out);
    h.at_ms(1_100);
    let out = h.active(1);
    assert_eq!(
        out.actions,
        vec![Action::Freeze { id: 1 }],
        "quantum expired"
    );
    let out = h.settle(out);
    assert_eq!(moves(&out)[0], (1, Running, Preempted, "quantum_expired"));
    // The freed slot goes to who comes first in priority, then arrival: the
    // queued 2 arrived before the pinned 3.
    assert_eq!(moves(&out)[1], (2, Pending, Running, "placed"));
    assert_eq!((h.view(2).gpu, h.state(3)), (Some(0), Preempted));
}

#[test]
fn an_idle_holder_yields_to_a_queued_job() {
    let mut h = late_harness(late(1, 1), Policy::Hybrid);
    h.arrive(unpinned(1, 2));
    h.arrive(unpinned(2, 9));
    assert_eq!(queue_ids(&h), vec![2]);
    h.at_ms(10);
    let out = h.idle(1);
    // 1 yields its slot without being frozen: frozen, it could not show that it
    // wants the GPU again.
    assert_eq!(out.actions, vec![Action::Place { id: 2, gpu: 0 }]);
    let out = h.settle(out);
    assert_eq!(moves(&out), vec![(2, Pending, Running, "placed")]);
    assert_eq!((h.state(1), h.view(1).yielded), (Running, true));
    // Active again, it ranks before 2 (priority 2 against 9): it takes the slot
    // back and 2 is frozen.
    h.at_ms(20);
    let out = h.active(1);
    assert_eq!(out.actions, vec![Action::Freeze { id: 2 }]);
    let out = h.settle(out);
    assert_eq!(
        moves(&out),
        vec![(2, Running, Preempted, "preempted_by_higher_priority")]
    );
    assert_eq!((h.state(1), h.view(1).yielded), (Running, false));
}

/// A job pinned to a GPU is bound there at arrival (it is running as it is, as
/// an adopted process is) and waits for that GPU only.
#[test]
fn a_pinned_job_waits_for_its_gpu_only() {
    let mut h = late_harness(late(2, 1), Policy::Hybrid);
    h.arrive(spec(1, 5));
    let out = h.arrive(spec(2, 5));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 2 }],
        "GPU 1 is free, but 2 may use GPU 0 only"
    );
    h.settle(out);
    assert_eq!(h.state(2), Preempted);
    // The pinned job, bound to GPU 0 and earlier, comes before a later queued one.
    let out = h.arrive(unpinned(3, 5));
    assert_eq!(placed(&out), vec![(3, 1)], "the free GPU");
    h.arrive(unpinned(4, 5));
    let out = h.exit(1, 0);
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
    assert_eq!(queue_ids(&h), vec![4]);
}

#[test]
fn a_queued_job_past_its_session_limit_is_killed_unbound() {
    let mut h = late_harness(late(1, 1), Policy::Hybrid);
    h.arrive(unpinned(1, 5));
    h.arrive(TaskSpec {
        max_duration_ms: Some(1_000),
        grace_ms: Some(0),
        ..unpinned(2, 5)
    });
    h.at_ms(1_000);
    let out = h.tick();
    assert!(matches!(out.actions[0], Action::Enforce { id: 2, .. }));
    assert_eq!(out.actions[1], Action::Kill { id: 2 });
    assert_eq!(h.sched.queued(2).unwrap().reason, WaitReason::Ending);
    // It is not bound when a GPU frees while it is being killed.
    let out = h.exit(1, 0);
    assert!(placed(&out).is_empty(), "{out:?}");
    let out = h.exit(2, 137);
    assert_eq!(moves(&out), vec![(2, Pending, Failed, "duration_limit")]);
    assert_eq!(out.transitions[0].gpu, None);
    assert!(h.sched.queue().is_empty());
}

/// Ties between equally good free GPUs go by least busy time, then by a seeded
/// hash: never to the lowest index.
#[test]
fn ties_go_to_the_least_busy_gpu_then_by_the_seed_not_by_index() {
    let first_gpu = |seed: u64, id: TaskId| {
        let mut h = late_harness(
            SchedConfig {
                placement_seed: seed,
                ..late(4, 1)
            },
            Policy::Hybrid,
        );
        placed(&h.arrive(unpinned(id, 5)))[0].1
    };
    let by_seed: BTreeSet<u32> = (0..32).map(|seed| first_gpu(seed, 1)).collect();
    assert_eq!(by_seed, (0..4).collect(), "every GPU, by the seed");
    let by_task: BTreeSet<u32> = (1..32).map(|id| first_gpu(0, id)).collect();
    assert_eq!(by_task, (0..4).collect(), "every GPU, by the task");
    assert_eq!(first_gpu(9, 1), first_gpu(9, 1), "deterministic");

    // GPU g runs a job for (g + 1) s, then all are free again with equal
    // weights: the least busy GPU (0) takes the next job, then GPU 1.
    let mut h = late_harness(late(4, 1), Policy::Hybrid);
    let mut on = BTreeMap::new();
    for id in 1..=4 {
        let gpu = placed(&h.arrive(unpinned(id, 5)))[0].1;
        on.insert(gpu, id);
    }
    for (gpu, id) in &on {
        h.at_ms(u64::from(gpu + 1) * 1_000);
        h.exit(*id, 0);
    }
    assert_eq!(
        h.sched.busy_ns(),
        (0..4)
            .map(|g| (g, u64::from(g + 1) * 1_000 * MS))
            .collect::<Vec<_>>()
    );
    assert_eq!(placed(&h.arrive(unpinned(10, 5))), vec![(10, 0)]);
    assert_eq!(placed(&h.arrive(unpinned(11, 5))), vec![(11, 1)]);
}

#[test]
fn free_gpus_go_by_weight_first() {
    let mut h = late_harness(late(3, 2), Policy::Hybrid);
    let out = h.arrive(expecting(1, 5, 60_000));
    let g = placed(&out)[0].1;
    h.alloc(1, g, 12 * GIB);
    // GPU g still has a free slot, but the others have more free memory and no
    // queue: the next job goes to one of them.
    let out = h.arrive(unpinned(2, 5));
    assert_ne!(placed(&out)[0].1, g);
}

/// The guard as a preference: with two candidates the one that ranks last is
/// preempted and a job about to finish is kept; with fewer, the higher priority
/// preempts as under hybrid, whatever the holders declared.
#[test]
fn goav_prefers_candidates_but_never_keeps_a_higher_priority_waiting() {
    let long = 600_000;
    let mut h = late_harness(late(2, 1), Policy::Goav);
    h.arrive(expecting(1, 10, long));
    h.arrive(expecting(2, 1, long));
    let out = h.arrive(expecting(3, 1, long));
    assert_eq!(
        placed(&out),
        vec![(3, h.view(1).gpu.unwrap())],
        "one candidate (1): it is preempted all the same"
    );

    let mut h = late_harness(late(2, 1), Policy::Goav);
    h.arrive(expecting(1, 10, long));
    h.arrive(expecting(2, 12, long));
    let out = h.arrive(expecting(3, 1, long));
    let gpu_of_2 = h.view(2).gpu.unwrap();
    assert_eq!(
        out.actions,
        vec![
            Action::Place {
                id: 3,
                gpu: gpu_of_2
            },
            Action::Freeze { id: 2 }
        ],
        "two candidates: the one that ranks last is preempted"
    );

    // Both lower holders claim to finish within 3 s (one claims 1 ms): no
    // candidate at all, and the newcomer still displaces the one ranking last.
    for policy in [Policy::Goav, Policy::Hybrid] {
        let mut h = late_harness(late(2, 1), policy);
        h.arrive(expecting(1, 10, 1));
        h.arrive(expecting(2, 12, 2_000));
        let out = h.arrive(expecting(3, 1, long));
        let gpu_of_2 = h.view(2).gpu.unwrap();
        assert_eq!(
            out.actions,
            vec![
                Action::Place {
                    id: 3,
                    gpu: gpu_of_2
                },
                Action::Freeze { id: 2 }
            ],
            "{policy:?}: a declared runtime buys no immunity"
        );
    }

    // Three GPUs: two candidates elsewhere, so the job that expects to finish
    // in 2 s is kept although it ranks last.
    let mut h = late_harness(late(3, 1), Policy::Goav);
    h.arrive(expecting(1, 10, long));
    h.arrive(expecting(2, 11, long));
    h.arrive(expecting(4, 14, 2_000));
    let out = h.arrive(expecting(5, 1, long));
    let gpu_of_2 = h.view(2).gpu.unwrap();
    assert_eq!(
        out.actions,
        vec![
            Action::Place {
                id: 5,
                gpu: gpu_of_2
            },
            Action::Freeze { id: 2 }
        ],
        "candidates 1 and 2 qualify: 2 ranks last among them; 4 is kept"
    );
}

/// With several slots on one GPU the guard also works between bound jobs, at
/// arrival: with two candidates the one that ranks last goes, and a job that
/// expects to finish within 3 s is kept even though it ranks last; with one
/// candidate the higher priority preempts as under hybrid.
#[test]
fn goav_keeps_non_candidates_only_when_two_candidates_qualify_at_arrival() {
    let goav = |slots| Harness {
        sched: Scheduler::with_policy(config(1, slots), Policy::Goav),
        ts_ns: 0,
    };
    let pinned = |id, priority, expected| TaskSpec {
        expected_runtime_ms: Some(expected),
        ..spec(id, priority)
    };
    let mut h = goav(1);
    h.arrive(pinned(1, 10, 600_000));
    let out = h.arrive(pinned(2, 1, 600_000));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 1 }],
        "one candidate: the higher priority preempts it, as under hybrid"
    );
    // 1, 2 and 4 hold the three slots; priority 1 arrives with only 1 and 4
    // as candidates.
    let mut h = goav(3);
    h.arrive(pinned(1, 10, 600_000));
    h.arrive(pinned(2, 14, 2_000));
    h.arrive(pinned(4, 12, 600_000));
    let out = h.arrive(pinned(5, 1, 600_000));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 5, gpu: 0 }, Action::Freeze { id: 4 }],
        "4 ranks last among the candidates; 2 (14, 2 s left) is kept"
    );
}

#[test]
fn at_arrival_is_the_default_and_never_queues() {
    let mut h = Harness::new(config(2, 1));
    assert_eq!(h.sched.config().binding, Binding::AtArrival);
    for id in 1..=4 {
        let out = h.arrive(unpinned(id, 5));
        assert_eq!(placed(&out).len(), 1);
    }
    assert!(h.sched.queue().is_empty());
    assert!(h.sched.busy_ns().is_empty());
}

// ---------------------------------------------------------------- properties

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        id: TaskId,
        priority: u8,
        gpu: Option<u32>,
        expected_ms: Option<u64>,
        max_ms: Option<u64>,
    },
    Active(TaskId),
    Idle(TaskId),
    Alloc(TaskId, u32),
    AllocFailed(TaskId, u32),
    Exit(TaskId),
    Tick,
    /// Confirm the n-th actuation in flight.
    Confirm(usize),
    /// Time the n-th actuation in flight out.
    TimeOut(usize),
}

fn arb_op() -> impl Strategy<Value = Op> {
    let arrive = (
        0u64..10,
        0u8..=15,
        // Mostly unpinned; GPUs 0-2 are configured, 3 is not.
        prop_oneof![6 => Just(None), 2 => (0u32..4).prop_map(Some)],
        prop::option::of(0u64..8_000),
        prop::option::of(200u64..4_000),
    )
        .prop_map(|(id, priority, gpu, expected_ms, max_ms)| Op::Arrive {
            id,
            priority,
            gpu,
            expected_ms,
            max_ms,
        });
    prop_oneof![
        4 => arrive,
        3 => (0u64..10).prop_map(Op::Active),
        1 => (0u64..10).prop_map(Op::Idle),
        1 => (0u64..10, 0u32..3).prop_map(|(id, g)| Op::Alloc(id, g)),
        1 => (0u64..10, 0u32..3).prop_map(|(id, g)| Op::AllocFailed(id, g)),
        2 => (0u64..10).prop_map(Op::Exit),
        3 => Just(Op::Tick),
        4 => any::<usize>().prop_map(Op::Confirm),
        1 => any::<usize>().prop_map(Op::TimeOut),
    ]
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::EVERY.to_vec())
}

/// Feeds inputs to a late-binding core and checks after every step what late
/// binding promises.
struct LateDriver {
    sched: Scheduler,
    ts_ns: u64,
    in_flight: BTreeMap<TaskId, (ActionKind, u32)>,
    /// The GPU each task was bound to, once bound.
    bound: BTreeMap<TaskId, u32>,
    pins: BTreeMap<TaskId, Option<u32>>,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
}

impl LateDriver {
    fn new(config: SchedConfig, policy: Policy) -> Self {
        LateDriver {
            sched: Scheduler::with_policy(config, policy),
            ts_ns: 0,
            in_flight: BTreeMap::new(),
            bound: BTreeMap::new(),
            pins: BTreeMap::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn nth_in_flight(&self, n: usize) -> Option<(TaskId, ActionKind, u32)> {
        let len = self.in_flight.len();
        (len > 0).then(|| {
            let (&id, &(kind, timeouts)) = self.in_flight.iter().nth(n % len).expect("n < len");
            (id, kind, timeouts)
        })
    }

    fn apply(&mut self, op: &Op, advance_ms: u64) {
        self.ts_ns += advance_ms * MS;
        let ts_ns = self.ts_ns;
        let input = match *op {
            Op::Arrive {
                id,
                priority,
                gpu,
                expected_ms,
                max_ms,
            } => Input::Arrive {
                spec: TaskSpec {
                    gpu,
                    expected_runtime_ms: expected_ms,
                    max_duration_ms: max_ms,
                    grace_ms: Some(50),
                    ..spec(id, priority)
                },
                ts_ns,
            },
            Op::Active(id) => Input::Active { id, ts_ns },
            Op::Idle(id) => Input::Idle { id, ts_ns },
            Op::Alloc(id, gpu) => Input::MemAlloc {
                id,
                gpu,
                bytes: 2 * GIB,
                ts_ns,
            },
            Op::AllocFailed(id, gpu) => Input::AllocFailed {
                id,
                gpu,
                bytes: 20 * GIB,
                ts_ns,
            },
            Op::Exit(id) => Input::Exit {
                id,
                exit_code: 0,
                ts_ns,
            },
            Op::Tick => Input::Tick { ts_ns },
            Op::Confirm(n) => match self.nth_in_flight(n) {
                Some((id, ActionKind::Freeze, t)) if t > 0 => Input::Confirmed {
                    id,
                    action: ActionKind::Stop,
                    ts_ns,
                },
                Some((id, action, _)) => Input::Confirmed { id, action, ts_ns },
                None => Input::Tick { ts_ns },
            },
            Op::TimeOut(n) => match self.nth_in_flight(n) {
                Some((id, action, _)) => Input::TimedOut { id, action, ts_ns },
                None => Input::Tick { ts_ns },
            },
        };
        self.feed(input);
    }

    fn feed(&mut self, input: Input) {
        if let Input::Arrive { spec, .. } = &input
            && self.sched.task(spec.id).is_none()
        {
            self.pins.insert(spec.id, spec.gpu);
        }
        let out = self.sched.step(&input);
        for action in &out.actions {
            if let Action::Place { id, gpu } = *action {
                assert!(
                    self.bound.insert(id, gpu).is_none(),
                    "task {id} placed twice"
                );
                match self.pins[&id] {
                    Some(pin) => assert_eq!(gpu, pin, "task {id} bound off its pin"),
                    None => assert!(
                        gpu < 3,
                        "task {id} bound to GPU {gpu}, which it may not use"
                    ),
                }
            }
        }
        // What is in flight, as the core shows it (the protocol of feedback is
        // checked by the at-arrival properties; here it only drives the ops).
        self.in_flight = self
            .sched
            .tasks()
            .iter()
            .filter_map(|v| {
                let f = match v.in_flight? {
                    ActionKind::Stop => (ActionKind::Freeze, 1),
                    kind => (kind, 0),
                };
                Some((v.spec.id, f))
            })
            .collect();
        self.check();
        self.inputs.push(input);
        self.outputs.push(out);
    }

    /// What holds after every step, actuations in flight or not.
    fn check(&self) {
        let slots = self.sched.config().slots();
        let views = self.sched.tasks();
        for v in &views {
            match self.bound.get(&v.spec.id) {
                Some(&g) => assert_eq!(v.gpu, Some(g), "task {} keeps its GPU", v.spec.id),
                None => {
                    assert_eq!(v.gpu, None, "task {} has a GPU without Place", v.spec.id);
                    assert!(
                        matches!(v.state, Pending | Completed | Failed | Archived),
                        "unbound task {} is {:?}",
                        v.spec.id,
                        v.state
                    );
                }
            }
        }
        let queue = self.sched.queue();
        let queued: BTreeSet<TaskId> = queue.iter().map(|q| q.id).collect();
        for v in views
            .iter()
            .filter(|v| v.state.is_live() && v.gpu.is_none())
        {
            assert!(
                queued.contains(&v.spec.id),
                "unbound {} not queued",
                v.spec.id
            );
        }
        let waiting = queue.iter().any(|q| q.reason != WaitReason::Ending);
        if !waiting {
            return;
        }
        // No free slot on a GPU a queued task may use: every slot is taken by
        // a task that runs, is about to (thaw in flight), or still runs until
        // its freeze is confirmed.
        // A task that uses several GPUs is thawed only when every one of them
        // has room: its slot here stays reserved while a freeze it waits for
        // is in flight on another of them.
        let uses = super::properties::uses;
        let freezing_on = |gpu: u32| {
            views.iter().any(|v| {
                v.state.is_live()
                    && uses(v).contains(&gpu)
                    && matches!(v.in_flight, Some(ActionKind::Freeze | ActionKind::Stop))
            })
        };
        let reserved = |v: &TaskView, gpu: u32| {
            v.state == Preempted
                && v.in_flight.is_none()
                && uses(v).len() > 1
                && uses(v).iter().any(|&g| g != gpu && freezing_on(g))
        };
        for gpu in 0..3 {
            let occupants = views
                .iter()
                .filter(|v| v.state.is_live() && uses(v).contains(&gpu))
                .filter(|v| v.state == Running || v.in_flight.is_some() || reserved(v, gpu))
                .count();
            assert!(
                occupants >= slots,
                "GPU {gpu} has {occupants} of {slots} slots taken while {:?} waits",
                queue
            );
        }
    }

    fn settle(&mut self) {
        for _ in 0..16 {
            let due: Vec<(TaskId, ActionKind)> = self
                .in_flight
                .iter()
                .map(|(&id, &(kind, timeouts))| {
                    let kind = if kind == ActionKind::Freeze && timeouts > 0 {
                        ActionKind::Stop
                    } else {
                        kind
                    };
                    (id, kind)
                })
                .collect();
            if due.is_empty() {
                return;
            }
            for (id, action) in due {
                let ts_ns = self.ts_ns;
                self.feed(Input::Confirmed { id, action, ts_ns });
            }
        }
        panic!("actuations never settle: {:?}", self.in_flight);
    }
}

/// Once actuations are confirmed, under the hybrid policy: no task that holds a
/// slot on a GPU a queued task may use is idle, or of lower priority than it.
fn check_settled_hybrid(sched: &Scheduler) {
    let views = sched.tasks();
    for q in sched.queue() {
        if q.reason == WaitReason::Ending {
            continue;
        }
        let queued = sched.task(q.id).expect("known");
        for v in views
            .iter()
            .filter(|v| v.state == Running && !v.yielded && v.gpu.is_some_and(|g| g < 3))
        {
            assert!(
                v.wants_gpu && v.spec.priority <= queued.spec.priority,
                "task {} (priority {}, wants {}) runs on GPU {:?} while {} (priority {}) waits",
                v.spec.id,
                v.spec.priority,
                v.wants_gpu,
                v.gpu,
                q.id,
                queued.spec.priority
            );
        }
    }
}

fn random_late(slots: u32, seed: u64) -> SchedConfig {
    SchedConfig {
        idle_timeout_ms: 50,
        kill_grace_ms: 30,
        default_grace_ms: 100,
        placement_seed: seed,
        ..late(3, slots)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// After every step, whatever the actuator does (confirmations in any
    /// order, time-outs): no GPU has a free slot while a queued task could run
    /// there, no task is bound to a GPU it may not use or placed twice, and a
    /// bound task keeps its GPU.
    #[test]
    fn prop_no_free_slot_while_a_queued_task_may_run_there(
        ops in prop::collection::vec((arb_op(), 0u64..=40), 1..200),
        slots in 1u32..=2,
        policy in arb_policy(),
        seed in any::<u64>(),
    ) {
        let mut driver = LateDriver::new(random_late(slots, seed), policy);
        for (op, advance_ms) in &ops {
            driver.apply(op, *advance_ms);
        }
    }

    /// With a perfect actuator, the hybrid policy under late binding still puts
    /// priority first: no lower priority and no idle task runs while a queued
    /// task waits.
    #[test]
    fn prop_late_binding_keeps_priorities(
        ops in prop::collection::vec((arb_op(), 0u64..=40), 1..150),
        slots in 1u32..=2,
    ) {
        let mut driver = LateDriver::new(random_late(slots, 1), Policy::Hybrid);
        for (op, advance_ms) in &ops {
            if matches!(op, Op::Confirm(_) | Op::TimeOut(_)) {
                continue;
            }
            driver.apply(op, *advance_ms);
            driver.settle();
            check_settled_hybrid(&driver.sched);
        }
    }

    /// The same inputs give the same outputs under late binding too, also
    /// through the JSON of an input log, for every policy.
    #[test]
    fn prop_late_binding_replays_exactly(
        ops in prop::collection::vec((arb_op(), 0u64..=40), 1..150),
        slots in 1u32..=2,
        policy in arb_policy(),
        seed in any::<u64>(),
    ) {
        let mut driver = LateDriver::new(random_late(slots, seed), policy);
        for (op, advance_ms) in &ops {
            driver.apply(op, *advance_ms);
        }
        let jsonl: String = driver
            .inputs
            .iter()
            .map(|i| serde_json::to_string(i).unwrap() + "\n")
            .collect();
        let config: SchedConfig =
            serde_json::from_str(&serde_json::to_string(&random_late(slots, seed)).unwrap()).unwrap();
        let mut sched = Scheduler::with_policy(config, policy);
        let outputs: Vec<Output> = jsonl
            .lines()
            .map(|l| sched.step(&serde_json::from_str(l).unwrap()))
            .collect();
        prop_assert_eq!(&outputs, &driver.outputs);
        prop_assert_eq!(sched.tasks(), driver.sched.tasks());
        prop_assert_eq!(sched.queue(), driver.sched.queue());
    }
}
