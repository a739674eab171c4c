//! Memory sharing (`Sharing::Memory`) and the overload rule: scenarios. The
//! property tests are in `properties_sharing`.

use super::*;

/// One GPU of `gib` GiB shared by memory, no cap.
fn shared(gib: u64, binding: Binding) -> SchedConfig {
    SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: gib * GIB,
        }],
        sharing: Sharing::Memory,
        slots_per_gpu: 0,
        binding,
        idle_timeout_ms: 500,
        ..SchedConfig::default()
    }
}

fn budget(id: TaskId, priority: u8, gib: u64, gpu: Option<u32>) -> TaskSpec {
    TaskSpec {
        gpu,
        mem_quota_bytes: Some(gib * GIB),
        ..spec(id, priority)
    }
}

fn running(h: &Harness) -> Vec<TaskId> {
    h.sched
        .tasks()
        .into_iter()
        .filter(|v| v.state == Running && !v.yielded)
        .map(|v| v.spec.id)
        .collect()
}

#[test]
fn tasks_run_together_while_their_budgets_fit_and_the_next_starts_when_one_exits() {
    let mut h = Harness::new(shared(8, Binding::AtArrival));
    for id in 1..=2 {
        let out = h.arrive(budget(id, 5, 3, Some(0)));
        assert_eq!(moves(&out), vec![(id, Pending, Running, "placed")]);
    }
    let out = h.arrive(budget(3, 5, 4, Some(0)));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 3, gpu: 0 }, Action::Freeze { id: 3 }]
    );
    h.settle(out);
    assert_eq!(h.state(3), Preempted);
    assert_eq!(h.sched.wait_reason(3), Some(WaitReason::Memory));
    assert_eq!(running(&h), vec![1, 2]);
    h.at_ms(10);
    h.alloc(1, 0, 3 * GIB);
    let out = h.exit(1, 0);
    assert!(out.actions.contains(&Action::Thaw { id: 3 }), "{out:?}");
    h.settle(out);
    assert_eq!(running(&h), vec![2, 3]);
    assert_eq!(h.sched.wait_reason(3), None);
}

#[test]
fn a_higher_priority_freezes_the_lower_ones_while_it_works_and_they_resume_after() {
    let mut h = Harness::new(shared(8, Binding::AtArrival));
    h.arrive(budget(1, 8, 3, Some(0)));
    h.arrive(budget(2, 8, 3, Some(0)));
    h.alloc(1, 0, 3 * GIB);
    h.alloc(2, 0, 2 * GIB);
    h.at_ms(5);
    let out = h.arrive(budget(3, 2, 1, Some(0)));
    assert_eq!(
        out.actions,
        vec![
            Action::Place { id: 3, gpu: 0 },
            Action::Freeze { id: 1 },
            Action::Freeze { id: 2 }
        ]
    );
    let out = h.settle(out);
    assert!(
        moves(&out).contains(&(1, Running, Preempted, "preempted_by_higher_priority")),
        "{out:?}"
    );
    assert_eq!(running(&h), vec![3]);
    assert_eq!(h.sched.wait_reason(2), Some(WaitReason::HigherPriority));
    // They keep their memory while frozen.
    assert_eq!(h.view(1).mem_bytes.get(&0), Some(&(3 * GIB)));
    h.at_ms(100);
    let out = {
        let o = h.sched.step(&Input::Idle {
            id: 3,
            ts_ns: 100 * MS,
        });
        h.settle(o)
    };
    assert_eq!(
        moves(&out),
        vec![
            (1, Preempted, Running, "resumed"),
            (2, Preempted, Running, "resumed")
        ]
    );
    assert_eq!(running(&h), vec![1, 2, 3], "the idle one keeps running too");
    h.at_ms(120);
    let out = h.active(3);
    assert_eq!(
        out.actions,
        vec![Action::Freeze { id: 1 }, Action::Freeze { id: 2 }],
        "working again, it freezes them again"
    );
    h.settle(out);
    assert_eq!(running(&h), vec![3]);
}

#[test]
fn equal_priorities_take_turns_only_when_a_cap_makes_them_wait() {
    // No cap: two equal priorities run side by side past many quanta.
    let mut h = Harness::new(shared(16, Binding::AtArrival));
    h.arrive(budget(1, 8, 1, Some(0)));
    h.arrive(budget(2, 8, 1, Some(0)));
    for ms in (50..2_000).step_by(50) {
        h.at_ms(ms);
        h.active(1);
        let out = h.active(2);
        assert!(out.actions.is_empty(), "at {ms} ms: {out:?}");
    }
    // A cap of 1: they rotate by the quantum (112 ms at priority 8).
    let mut h = Harness::new(SchedConfig {
        slots_per_gpu: 1,
        ..shared(16, Binding::AtArrival)
    });
    h.arrive(budget(1, 8, 1, Some(0)));
    let out = h.arrive(budget(2, 8, 1, Some(0)));
    h.settle(out);
    assert_eq!(h.sched.wait_reason(2), Some(WaitReason::SlotsHeld));
    h.at_ms(113);
    let out = {
        let o = h.active(1);
        h.settle(o)
    };
    assert!(
        moves(&out).contains(&(1, Running, Preempted, "quantum_expired")),
        "{out:?}"
    );
    assert_eq!(running(&h), vec![2]);
}

#[test]
fn memory_held_outside_any_task_is_not_available() {
    let mut h = Harness::new(shared(8, Binding::AtArrival));
    h.step(Input::OutsideMem {
        gpu: 0,
        bytes: 3 * GIB,
        ts_ns: 0,
    });
    h.arrive(budget(1, 5, 3, Some(0)));
    let out = {
        let o = h.arrive(budget(2, 5, 3, Some(0)));
        h.settle(o)
    };
    assert_eq!(moves(&out), vec![(2, Pending, Preempted, "queued")]);
    assert_eq!(h.sched.outside_mem(), vec![(0, 3 * GIB)]);
    h.at_ms(1);
    let out = {
        let o = h.step(Input::OutsideMem {
            gpu: 0,
            bytes: 0,
            ts_ns: MS,
        });
        h.settle(o)
    };
    assert_eq!(moves(&out), vec![(2, Preempted, Running, "resumed")]);
}

#[test]
fn without_a_budget_a_task_counts_what_it_holds_and_has_peaked_at() {
    let mut h = Harness::new(shared(8, Binding::AtArrival));
    h.arrive(spec(1, 5));
    h.alloc(1, 0, 6 * GIB);
    h.step(Input::MemFree {
        id: 1,
        gpu: 0,
        bytes: 4 * GIB,
        ts_ns: 0,
    });
    // 1 holds 2 GiB, peaked at 6: 2 GiB left. A 3 GiB budget waits, 2 runs.
    let out = {
        let o = h.arrive(budget(2, 5, 3, Some(0)));
        h.settle(o)
    };
    assert_eq!(moves(&out), vec![(2, Pending, Preempted, "queued")]);
    let out = h.arrive(budget(3, 5, 2, Some(0)));
    assert_eq!(moves(&out), vec![(3, Pending, Running, "placed")]);
}

#[test]
fn late_binding_keeps_a_task_that_does_not_fit_unbound_until_memory_is_free() {
    let mut h = Harness::new(shared(8, Binding::Late));
    let unpinned = |id, gib| budget(id, 5, gib, None);
    for id in 1..=2 {
        let out = h.arrive(unpinned(id, 3));
        assert_eq!(out.actions, vec![Action::Place { id, gpu: 0 }]);
    }
    assert_eq!(h.arrive(unpinned(3, 4)), Output::default());
    assert_eq!(h.sched.wait_reason(3), Some(WaitReason::Memory));
    assert_eq!(h.sched.queue()[0].reason, WaitReason::Memory);
    // A smaller one behind it fits and goes.
    let out = h.arrive(unpinned(4, 2));
    assert_eq!(out.actions, vec![Action::Place { id: 4, gpu: 0 }]);
    h.at_ms(1);
    h.exit(4, 0);
    let out = h.exit(1, 0);
    assert_eq!(out.actions, vec![Action::Place { id: 3, gpu: 0 }]);
}

/// The article's overload rule: 8 GPUs would need 8 sessions; one GPU of 100
/// units with `waiting` tasks waiting behind the one running, whose GPU
/// peaked at `peak_permille` thousandths, checked at `session_ms`.
fn overload_case(
    rule: Option<OverloadRule>,
    session_ms: u64,
    peak_permille: u64,
    waiting: u64,
) -> Output {
    let capacity = 1_000 * GIB;
    let mut h = Harness::new(SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: capacity,
        }],
        overload: rule,
        default_max_duration_ms: 3_600_000,
        ..SchedConfig::default()
    });
    h.arrive(spec(1, 5));
    h.alloc(1, 0, peak_permille * GIB);
    for id in 2..2 + waiting {
        {
            let o = h.arrive(spec(id, 5));
            h.settle(o)
        };
    }
    let mut all = Output::default();
    for ms in [session_ms / 2, session_ms] {
        h.at_ms(ms);
        for out in [h.active(1), h.tick()] {
            all.actions.extend(out.actions);
            all.transitions.extend(out.transitions);
        }
    }
    all
}

fn truncated(out: &Output) -> Option<EnforcementRecord> {
    out.actions.iter().find_map(|a| match a {
        Action::Enforce { id: 1, record } => Some(record.clone()),
        _ => None,
    })
}

#[test]
fn overload_rule_truncates_exactly_when_all_three_hold() {
    let rule = Some(OverloadRule::default());
    // The article's examples: 215 ms, 97.1 %, 10 waiting: truncated.
    let out = overload_case(rule, 215, 971, 10);
    let record = truncated(&out).expect("truncated");
    assert_eq!(
        record,
        EnforcementRecord::overloaded(&OverloadRule::default(), 215, 0, 971, 10)
    );
    assert!(out.actions.contains(&Action::Kill { id: 1 }), "{out:?}");
    // 180 ms, 96.2 %, 9 waiting: not.
    assert_eq!(truncated(&overload_case(rule, 180, 962, 9)), None);
    // Each threshold alone: 200 ms is not past 200; 94.9 % is under 95; 7 < 8.
    assert_eq!(truncated(&overload_case(rule, 200, 990, 10)), None);
    assert_eq!(
        truncated(&overload_case(rule, 201, 990, 10)).map(|r| r.data.actual_ms),
        Some(201)
    );
    assert_eq!(truncated(&overload_case(rule, 500, 949, 10)), None);
    assert!(truncated(&overload_case(rule, 500, 950, 10)).is_some());
    assert_eq!(truncated(&overload_case(rule, 500, 990, 7)), None);
    assert!(truncated(&overload_case(rule, 500, 990, 8)).is_some());
    // Off (the default): never.
    assert_eq!(truncated(&overload_case(None, 215, 971, 10)), None);
    assert_eq!(truncated(&overload_case(None, 10_000, 1_000, 50)), None);
}

#[test]
fn an_overloaded_session_ends_failed_with_its_own_reason() {
    let mut out = overload_case(Some(OverloadRule::default()), 215, 971, 10);
    assert!(truncated(&out).is_some());
    out.transitions.clear();
    let capacity = 100 * GIB;
    let mut h = Harness::new(SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: capacity,
        }],
        overload: Some(OverloadRule {
            min_waiting: 1,
            ..OverloadRule::default()
        }),
        default_hard_kill: false,
        ..SchedConfig::default()
    });
    h.arrive(spec(1, 5));
    h.alloc(1, 0, 96 * GIB);
    {
        let o = h.arrive(spec(2, 9));
        h.settle(o)
    };
    h.at_ms(250);
    let out = h.tick();
    assert!(
        out.actions.contains(&Action::Terminate { id: 1 }),
        "{out:?}"
    );
    let out = h.exit(1, 143);
    assert!(
        moves(&out).contains(&(1, Running, Failed, "overloaded")),
        "{out:?}"
    );
}

/// What the overload rule decided comes out the same from a fresh core fed
/// the same inputs and the configuration as an input log's header holds them
/// (JSON): a recording replays it exactly.
#[test]
fn the_overload_rule_replays_exactly_from_its_recorded_inputs() {
    let config = SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: 100 * GIB,
        }],
        sharing: Sharing::Memory,
        slots_per_gpu: 1,
        overload: Some(OverloadRule {
            min_waiting: 2,
            ..OverloadRule::default()
        }),
        ..SchedConfig::default()
    };
    let mut inputs = vec![Input::Arrive {
        spec: spec(1, 5),
        ts_ns: 0,
    }];
    inputs.push(Input::MemAlloc {
        id: 1,
        gpu: 0,
        bytes: 97 * GIB,
        ts_ns: MS,
    });
    for id in 2..5 {
        inputs.push(Input::Arrive {
            spec: spec(id, 9),
            ts_ns: 2 * MS,
        });
    }
    for ms in (10..400).step_by(10) {
        inputs.push(Input::Tick { ts_ns: ms * MS });
    }
    let run = |config: SchedConfig, inputs: &[Input]| -> Vec<Output> {
        let mut sched = Scheduler::new(config);
        let mut outs = Vec::new();
        for input in inputs {
            let out = sched.step(input);
            // A perfect actuator, recorded as the agent records it.
            for (id, action) in actuations(&out) {
                outs.push(sched.step(&Input::Confirmed {
                    id,
                    action,
                    ts_ns: input.ts_ns(),
                }));
            }
            outs.push(out);
        }
        outs
    };
    let recorded = run(config.clone(), &inputs);
    assert!(
        recorded.iter().flat_map(|o| &o.actions).any(
            |a| matches!(a, Action::Enforce { id: 1, record } if record.code == OVERLOADED_CODE)
        ),
        "the rule truncated task 1"
    );
    let header = serde_json::to_string(&config).unwrap();
    let lines: Vec<String> = inputs
        .iter()
        .map(|i| serde_json::to_string(i).unwrap())
        .collect();
    let config: SchedConfig = serde_json::from_str(&header).unwrap();
    let inputs: Vec<Input> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(run(config, &inputs), recorded);
}

/// Two GPUs of 16 GiB shared by memory under late binding, no cap.
fn two_shared() -> SchedConfig {
    n_shared(2)
}

/// `n` GPUs of 16 GiB shared by memory under late binding, no cap.
fn n_shared(n: u32) -> SchedConfig {
    SchedConfig {
        gpus: (0..n)
            .map(|index| GpuInfo {
                index,
                capacity_bytes: 16 * GIB,
            })
            .collect(),
        ..shared(16, Binding::Late)
    }
}

/// Late binding under memory sharing puts a task where no task of another
/// priority is (one of the two would freeze the other while it works), even
/// where more memory is free elsewhere: on GPU 0 an idle priority 3 (it freezes
/// nothing now, and the placement weight prefers GPU 0's free memory), on GPU 1
/// a priority 5 that works and holds more.
#[test]
fn late_binding_prefers_a_gpu_where_it_freezes_nobody_and_nobody_freezes_it() {
    let mut h = Harness::new(two_shared());
    h.arrive(budget(1, 3, 1, Some(0)));
    h.alloc(1, 0, GIB);
    h.arrive(budget(2, 5, 4, Some(1)));
    h.alloc(2, 1, 4 * GIB);
    h.at_ms(1_000);
    h.idle(1);
    h.active(2);
    let out = h.arrive(budget(3, 5, 2, None));
    assert_eq!(out.actions, vec![Action::Place { id: 3, gpu: 1 }]);
    // A priority 3 goes beside the idle priority 3, not over the 5s.
    let out = h.arrive(budget(4, 3, 2, None));
    assert_eq!(out.actions, vec![Action::Place { id: 4, gpu: 0 }]);
}

/// `budget` expecting to run for `expected_s`.
fn expecting(spec: TaskSpec, expected_s: u64) -> TaskSpec {
    TaskSpec {
        expected_runtime_ms: Some(expected_s * 1_000),
        ..spec
    }
}

/// Among GPUs where it conflicts with nobody and whose GPU time (busy time
/// plus the work expected there) is within its own expected work of the
/// least, the one that has held the least memory over time: GPU 0 held 8 GiB
/// for 10 s, GPU 1 1 GiB for 50 s (40 s more busy time, less memory held),
/// both are empty again, and the task expects to run for 60 s.
#[test]
fn late_binding_under_sharing_balances_memory_held_over_time() {
    let mut h = Harness::new(two_shared());
    h.arrive(budget(1, 5, 8, Some(0)));
    h.alloc(1, 0, 8 * GIB);
    h.arrive(budget(2, 5, 1, Some(1)));
    h.alloc(2, 1, GIB);
    h.at_ms(10_000);
    h.exit(1, 0);
    h.at_ms(50_000);
    h.exit(2, 0);
    let busy: Vec<(u32, u64)> = h.sched.busy_ns();
    assert_eq!(busy, vec![(0, 10_000 * MS), (1, 50_000 * MS)]);
    h.at_ms(60_000);
    let out = h.arrive(expecting(budget(3, 5, 2, None), 60));
    assert_eq!(out.actions, vec![Action::Place { id: 3, gpu: 1 }]);
    // One expecting 30 s would tip GPU 1 further than GPU 0 could catch up
    // with: it goes where less GPU time was given.
    let out = h.arrive(expecting(budget(4, 5, 2, None), 30));
    assert_eq!(out.actions, vec![Action::Place { id: 4, gpu: 0 }]);
}

/// GPU time first: GPU 0 runs a task that holds 1 GiB and expects to run for
/// 1 000 s, GPU 1 one that holds 8 GiB and expects 5 s. A task expecting 5 s
/// goes to GPU 1, where it holds more memory beside the other but the GPU is
/// busy for seconds, not minutes (the core before this rule balanced memory
/// first and chose GPU 0).
#[test]
fn late_binding_under_sharing_balances_gpu_time_before_memory() {
    let mut h = Harness::new(two_shared());
    h.arrive(expecting(budget(1, 5, 1, Some(0)), 1_000));
    h.alloc(1, 0, GIB);
    h.arrive(expecting(budget(2, 5, 8, Some(1)), 5));
    h.alloc(2, 1, 8 * GIB);
    h.at_ms(1_000);
    let out = h.arrive(expecting(budget(3, 5, 2, None), 5));
    assert_eq!(out.actions, vec![Action::Place { id: 3, gpu: 1 }]);
}

/// A task's progress is its share of its GPU: two tasks that ran together for
/// 10 s had 5 s each. GPU 0 runs two that expect 20 s each (15 s left each:
/// 40 s of GPU time with its 10 s busy), GPU 1 one that expects 36 s (26 s
/// left: 36 s). A task expecting 1 s goes to GPU 1; counted by time on the
/// GPU (10 s each, 30 s for GPU 0) it would go to GPU 0, which also holds less.
#[test]
fn late_binding_under_sharing_counts_progress_as_a_share_of_the_gpu() {
    let mut h = Harness::new(two_shared());
    for id in 1..=2 {
        h.arrive(expecting(budget(id, 5, 1, Some(0)), 20));
        h.alloc(id, 0, GIB);
    }
    h.arrive(expecting(budget(3, 5, 8, Some(1)), 36));
    h.alloc(3, 1, 8 * GIB);
    h.at_ms(10_000);
    let out = h.arrive(expecting(budget(4, 5, 1, None), 1));
    assert_eq!(out.actions, vec![Action::Place { id: 4, gpu: 1 }]);
}

/// With no GPU where it freezes nobody, late binding under memory sharing
/// puts a task where it freezes the fewest tasks that work (each of them
/// waits while it works): GPU 0 runs two priority 8s, GPU 1 one priority 5.
/// The core before chose where the displaced task ranks last (GPU 0, freezing
/// two).
#[test]
fn late_binding_under_sharing_displaces_the_fewest_working_tasks() {
    let mut h = Harness::new(two_shared());
    for id in 1..=2 {
        h.arrive(budget(id, 8, 1, Some(0)));
        h.alloc(id, 0, GIB);
    }
    h.arrive(budget(3, 5, 1, Some(1)));
    h.alloc(3, 1, GIB);
    h.at_ms(100);
    for id in 1..=3 {
        h.active(id);
    }
    let out = h.arrive(budget(4, 3, 1, None));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 4, gpu: 1 }, Action::Freeze { id: 3 }]
    );
}

/// The last empty GPU is kept for a priority that has no GPU of its own: GPU 0
/// runs a priority 5, GPU 1 a priority 8, GPUs 2 and 3 are empty. A priority 5
/// takes an empty GPU while two are; the next goes beside a priority 5 (the
/// core before this rule took the last empty GPU, which holds the least
/// memory); a priority 3 then gets the empty GPU and freezes nobody.
#[test]
fn late_binding_under_sharing_keeps_the_last_empty_gpu_for_another_priority() {
    let mut h = Harness::new(n_shared(4));
    h.arrive(expecting(budget(1, 5, 1, Some(0)), 100));
    h.alloc(1, 0, GIB);
    h.arrive(expecting(budget(2, 8, 1, Some(1)), 100));
    h.alloc(2, 1, GIB);
    h.at_ms(1_000);
    h.active(1);
    h.active(2);
    let out = h.arrive(expecting(budget(3, 5, 1, None), 200));
    let [Action::Place { id: 3, gpu: third }] = out.actions[..] else {
        panic!("{:?}", out.actions);
    };
    assert!(
        [2, 3].contains(&third),
        "an empty GPU while two are: {third}"
    );
    let out = h.arrive(expecting(budget(4, 5, 1, None), 200));
    let [Action::Place { id: 4, gpu: fourth }] = out.actions[..] else {
        panic!("{:?}", out.actions);
    };
    assert!(
        [0, third].contains(&fourth),
        "beside a priority 5, not on the last empty GPU: {fourth}"
    );
    let last = 5 - third;
    let out = h.arrive(expecting(budget(5, 3, 1, None), 200));
    assert_eq!(out.actions, vec![Action::Place { id: 5, gpu: last }]);
}
