//! Memory pressure (eviction of the smallest covering set) and memory quotas.

use super::*;

/// GPU 0 of 16 GiB holding 15 GiB: 1 GiB free. Task 1 (priority 1) holds 1 GiB;
/// 2 (8) 6 GiB, 3 (9) 3 GiB, 4 (10) 3 GiB, 5 (3) 2 GiB.
fn crowded_gpu() -> Harness {
    let mut h = Harness::new(config(1, 8));
    for (id, priority, gib) in [(1, 1, 1), (2, 8, 6), (3, 9, 3), (4, 10, 3), (5, 3, 2)] {
        h.arrive(spec(id, priority));
        h.alloc(id, 0, gib * GIB);
    }
    h
}

#[test]
fn memory_pressure_evicts_the_smallest_covering_set_then_kills_after_grace() {
    let mut h = crowded_gpu();
    h.at_ms(1);
    // Needs 8 GiB, 1 free: 7 more. No single task covers 7; of the pairs that
    // do (2+3, 2+4: 9 GiB; 2+5: 8 GiB), 2+5 frees the fewest bytes.
    let out = h.alloc_failed(1, 0, 8 * GIB);
    assert_eq!(
        out.actions,
        vec![Action::Terminate { id: 2 }, Action::Terminate { id: 5 }]
    );
    h.at_ms(5_000);
    assert_eq!(h.tick(), Output::default());
    h.at_ms(5_001);
    assert_eq!(
        h.tick().actions,
        vec![Action::Kill { id: 2 }, Action::Kill { id: 5 }]
    );
    h.at_ms(5_002);
    let out = h.exit(2, 137);
    assert_eq!(
        moves(&out),
        vec![(2, Running, Failed, "evicted_for_memory")]
    );
    assert_eq!(out.transitions[0].exit_code, Some(137));
    assert!(h.view(2).mem_bytes.is_empty());
}

#[test]
fn memory_on_its_way_back_from_victims_is_not_evicted_for_twice() {
    let mut h = crowded_gpu();
    assert_eq!(terminated(&h.alloc_failed(1, 0, 8 * GIB)), vec![2, 5]);
    assert_eq!(h.alloc_failed(1, 0, 8 * GIB), Output::default());
    // One GiB more than is on its way back: tasks 3 and 4 both hold 3 GiB, so
    // the lower priority (4, priority 10) goes.
    assert_eq!(terminated(&h.alloc_failed(1, 0, 10 * GIB)), vec![4]);
}

#[test]
fn memory_pressure_with_enough_free_memory_evicts_nobody() {
    let mut h = crowded_gpu();
    assert_eq!(h.alloc_failed(1, 0, GIB), Output::default());
    assert_eq!(
        h.alloc_failed(1, 3, 100 * GIB),
        Output::default(),
        "unknown GPU"
    );
}

/// Equal and higher priorities are never evicted; a lower priority is, whatever
/// runtime it declared (issue: `--expected-runtime-ms 1` bought immunity). Under
/// goav the guard prefers victims that expect more than 3 s, and falls back to
/// the others when those cannot free enough.
#[test]
fn memory_pressure_spares_higher_priorities_and_no_declared_runtime() {
    let with_runtime = |id, priority, ms| TaskSpec {
        expected_runtime_ms: Some(ms),
        ..spec(id, priority)
    };
    let setup = |policy| {
        let mut h = Harness {
            sched: Scheduler::with_policy(config(1, 8), policy),
            ts_ns: 0,
        };
        for (task, gib) in [
            (spec(1, 5), 0),
            (spec(2, 5), 8),                 // equal priority
            (spec(3, 2), 4),                 // higher priority
            (with_runtime(4, 9, 4_000), 2),  // 2.5 s left at 1.5 s
            (with_runtime(5, 9, 10_000), 1), // 8.5 s left
        ] {
            let id = task.id;
            h.arrive(task);
            if gib > 0 {
                h.alloc(id, 0, gib * GIB);
            }
        }
        h.at_ms(1_500);
        h
    };
    // 1 GiB free. Needs 2 more: 4 (2 GiB) alone covers it, under hybrid.
    let mut h = setup(Policy::Hybrid);
    assert_eq!(terminated(&h.alloc_failed(1, 0, 3 * GIB)), vec![4]);
    // Needs 4 more: 4 and 5 hold 3 together, and 2 and 3 are not lower.
    let mut h = setup(Policy::Hybrid);
    assert_eq!(h.alloc_failed(1, 0, 5 * GIB), Output::default());

    // goav: 1 more is covered by 5 (8.5 s left), preferred to 4 (2.5 s).
    let mut h = setup(Policy::Goav);
    assert_eq!(terminated(&h.alloc_failed(1, 0, 2 * GIB)), vec![5]);
    // 2 more: 5 alone cannot, so the guard gives way and 4 goes.
    let mut h = setup(Policy::Goav);
    assert_eq!(terminated(&h.alloc_failed(1, 0, 3 * GIB)), vec![4]);

    // A claim of 1 ms, long overrun, under every preemptive policy.
    for policy in [Policy::Hybrid, Policy::Goav] {
        let mut h = Harness {
            sched: Scheduler::with_policy(config(1, 8), policy),
            ts_ns: 0,
        };
        h.arrive(with_runtime(1, 15, 1));
        h.alloc(1, 0, 12 * GIB);
        h.arrive(spec(2, 3));
        h.at_ms(40_000);
        assert_eq!(
            terminated(&h.alloc_failed(2, 0, 8 * GIB)),
            vec![1],
            "{policy:?}"
        );
    }
}

#[test]
fn allocation_over_quota_terminates_then_kills() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(TaskSpec {
        mem_quota_bytes: Some(4 * GIB),
        ..spec(1, 5)
    });
    assert_eq!(h.alloc(1, 0, 3 * GIB), Output::default());
    assert_eq!(h.alloc(1, 1, GIB), Output::default(), "exactly at quota");
    assert_eq!(h.alloc(1, 0, 1).actions, vec![Action::Terminate { id: 1 }]);
    assert_eq!(h.alloc(1, 0, GIB), Output::default(), "never twice");
    h.at_ms(5_000);
    assert_eq!(h.tick().actions, vec![Action::Kill { id: 1 }]);
    let out = h.exit(1, 0);
    assert_eq!(moves(&out), vec![(1, Running, Failed, "over_quota")]);
}

/// Issue 32: once the kernel says a table it needed for the task's books was full
/// (`MemUnsure`), the figure may be wrong (a ghost of memory released unseen), and
/// an allocation that takes it over the quota ends nothing; the figure still
/// counts, and the view says it is unsure.
#[test]
fn an_unsure_figure_is_not_held_against_the_quota() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(TaskSpec {
        mem_quota_bytes: Some(4 * GIB),
        ..spec(1, 5)
    });
    assert_eq!(h.alloc(1, 0, 3 * GIB), Output::default());
    assert!(!h.view(1).mem_unsure);
    let ts_ns = h.ts_ns;
    assert_eq!(h.step(Input::MemUnsure { id: 1, ts_ns }), Output::default());
    assert_eq!(
        h.alloc(1, 0, 2 * GIB),
        Output::default(),
        "over, but unsure"
    );
    let view = h.view(1);
    assert!(view.mem_unsure);
    assert_eq!(view.mem_bytes[&0], 5 * GIB);
    assert_eq!(view.ending_reason, None);
}

/// Issue 32 (quota bypass): an unsure figure is judged on the sound lower bound
/// the agent sends (`MemSure`): under the quota nothing happens, over it the task
/// is ended as over quota (once); a `MemSure` for a sure figure changes nothing
/// (its own `MemAlloc`s judge it).
#[test]
fn an_unsure_figure_is_judged_on_its_sound_lower_bound() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(TaskSpec {
        mem_quota_bytes: Some(4 * GIB),
        ..spec(1, 5)
    });
    let ts_ns = h.ts_ns;
    let sure = |bytes| Input::MemSure {
        id: 1,
        bytes,
        ts_ns,
    };
    assert_eq!(h.step(sure(5 * GIB)), Output::default(), "a sure figure");
    assert_eq!(h.step(Input::MemUnsure { id: 1, ts_ns }), Output::default());
    assert_eq!(h.alloc(1, 0, 6 * GIB), Output::default(), "unsure");
    assert_eq!(h.step(sure(4 * GIB)), Output::default(), "exactly at quota");
    assert_eq!(
        h.step(sure(4 * GIB + 1)).actions,
        vec![Action::Terminate { id: 1 }]
    );
    assert_eq!(h.step(sure(5 * GIB)), Output::default(), "never twice");
    assert_eq!(h.view(1).ending_reason, Some(Reason::OverQuota));
}
