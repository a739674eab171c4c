//! Exits and archiving, and inputs the core must shrug off: unknown ids, duplicate
//! arrivals, timestamps going backwards, out-of-range priorities.

use super::*;

#[test]
fn exits_complete_or_fail_then_archive_on_the_next_tick() {
    let mut h = Harness::new(config(1, 2));
    h.arrive(spec(1, 5));
    h.arrive(spec(2, 5));
    let out = h.exit(1, 0);
    assert_eq!(moves(&out), vec![(1, Running, Completed, "exited")]);
    assert_eq!(out.transitions[0].exit_code, Some(0));
    let out = h.exit(2, 3);
    assert_eq!(moves(&out), vec![(2, Running, Failed, "exited_with_error")]);
    assert_eq!(h.exit(2, 0), Output::default(), "exits once");
    h.at_ms(10);
    let out = h.tick();
    assert_eq!(
        moves(&out),
        vec![
            (1, Completed, Archived, "archived"),
            (2, Failed, Archived, "archived")
        ]
    );
    assert_eq!(out.transitions[1].exit_code, Some(3));
    assert_eq!(
        out.transitions[1].event_id, 6,
        "2 placed, 2 exits, 2 archived"
    );
    assert_eq!(h.view(2).finished_ns, Some(0));
    assert_eq!(h.sched.tasks().len(), 2, "archived tasks stay visible");
    assert_eq!(h.tick(), Output::default());
}

#[test]
fn unknown_ids_and_duplicate_arrivals_are_ignored() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 5));
    h.at_ms(1);
    let ts_ns = h.ts_ns;
    let id = 99;
    for input in [
        Input::Active { id, ts_ns },
        Input::Idle { id, ts_ns },
        Input::MemAlloc {
            id,
            gpu: 0,
            bytes: 1,
            ts_ns,
        },
        Input::MemFree {
            id,
            gpu: 0,
            bytes: 1,
            ts_ns,
        },
        Input::AllocFailed {
            id,
            gpu: 0,
            bytes: u64::MAX,
            ts_ns,
        },
        Input::Exit {
            id,
            exit_code: 1,
            ts_ns,
        },
        Input::Confirmed {
            id,
            action: ActionKind::Freeze,
            ts_ns,
        },
        Input::TimedOut {
            id,
            action: ActionKind::Thaw,
            ts_ns,
        },
        Input::Arrive {
            spec: spec(1, 0),
            ts_ns,
        },
    ] {
        assert_eq!(h.step(input.clone()), Output::default(), "{input:?}");
    }
    assert_eq!(h.view(1).spec.priority, 5);
    assert_eq!(h.sched.alloc_success_rate(0, ts_ns), 1.0);
    assert!(h.sched.task(99).is_none());
}

#[test]
fn timestamps_going_backwards_do_not_rewind_the_clock() {
    let mut h = Harness::new(config(1, 1));
    h.at_ms(100);
    h.arrive(spec(1, 5));
    h.at_ms(50);
    h.tick();
    assert_eq!(h.sched.now_ns(), 100 * MS);
    assert_eq!(h.view(1).on_gpu_ns, 0);
    h.at_ms(200);
    h.tick();
    assert_eq!(h.view(1).on_gpu_ns, 100 * MS);
}

#[test]
fn priorities_above_15_are_treated_as_15() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 200));
    let view = h.view(1);
    assert_eq!(
        (view.spec.priority, view.class, view.quantum_ms),
        (15, Class::Background, 200)
    );
}

#[test]
fn archived_tasks_are_forgotten_after_the_retention_window() {
    let mut h = Harness::new(config(1, 2));
    h.arrive(spec(1, 5));
    h.arrive(spec(2, 5));
    h.at_ms(10);
    h.exit(1, 0);
    h.at_ms(20);
    h.exit(2, 0);
    h.arrive(spec(3, 5));
    h.at_ms(30);
    h.tick();
    assert_eq!(
        h.sched.prune_archived(15 * MS),
        1,
        "task 1 finished at 10 ms"
    );
    assert!(h.sched.task(1).is_none());
    assert_eq!(h.view(2).state, Archived);
    assert_eq!(h.sched.prune_archived(15 * MS), 0);
    // Live tasks are never forgotten, whatever the window.
    assert_eq!(h.sched.prune_archived(u64::MAX), 1);
    assert_eq!(h.sched.tasks().len(), 1);
    assert_eq!(h.view(3).state, Running);
    // Forgetting changes no decision: the next step is as it would have been.
    assert_eq!(h.tick(), Output::default());
}

#[test]
fn the_archive_is_capped_by_count_keeping_the_last_to_finish() {
    let mut h = Harness::new(config(1, 8));
    for id in 1..=7 {
        h.arrive(spec(id, 5));
    }
    // Task 1 finishes last; 4 and 5 together.
    for (ms, id) in [(10, 2), (20, 3), (30, 4), (30, 5), (40, 6), (50, 1)] {
        h.at_ms(ms);
        h.exit(id, 0);
    }
    h.at_ms(60);
    h.tick();
    assert_eq!(h.sched.archived_len(), 6);
    let order = |views: Vec<TaskView>| views.iter().map(|v| v.spec.id).collect::<Vec<_>>();
    assert_eq!(
        order(h.sched.recent_archived(0, 10)),
        vec![1, 6, 5, 4, 3, 2]
    );
    assert_eq!(order(h.sched.recent_archived(2, 2)), vec![5, 4]);
    assert_eq!(order(h.sched.recent_archived(9, 2)), Vec::<TaskId>::new());
    assert_eq!(h.sched.prune_archived_to(6), 0);
    assert_eq!(h.sched.prune_archived_to(3), 3, "2, 3 and 4 finished first");
    assert_eq!(order(h.sched.recent_archived(0, 10)), vec![1, 6, 5]);
    assert!(h.sched.task(4).is_none());
    // Live tasks are never counted nor forgotten.
    assert_eq!(h.sched.prune_archived_to(0), 3);
    assert_eq!(h.sched.archived_len(), 0);
    assert_eq!(order(h.sched.live_tasks()), vec![7]);
    assert_eq!(h.view(7).state, Running);
    assert_eq!(h.tick(), Output::default());
}
