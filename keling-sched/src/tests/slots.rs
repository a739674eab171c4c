//! Who holds the slots: placement into a slot, preemption by priority, round robin,
//! idleness, and the feedback protocol (confirmations, time-outs, escalation).

use super::*;

#[test]
fn state_transition_is_uppercase_with_an_arrow() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 9));
    let out = h.arrive(spec(2, 1));
    let out = h.settle(out);
    assert_eq!(
        out.transitions[0].state_transition(),
        "PENDING\u{2192}RUNNING"
    );
    assert_eq!(out.transitions[1].state_transition(), "RUNNING→PREEMPTED");
}

#[test]
fn first_task_is_placed_and_runs_at_once() {
    let mut h = Harness::new(config(1, 1));
    let out = h.arrive(spec(1, 5));
    assert_eq!(out.actions, vec![Action::Place { id: 1, gpu: 0 }]);
    assert_eq!(moves(&out), vec![(1, Pending, Running, "placed")]);
    assert_eq!(out.transitions[0].event_id, 1);
    assert_eq!(h.view(1).started_ns, Some(0));
}

#[test]
fn arrival_without_a_free_slot_is_frozen_and_queued_on_confirmation() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 5));
    let out = h.arrive(spec(2, 5));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 2 }]
    );
    assert!(out.transitions.is_empty());
    assert_eq!(h.state(2), Pending);
    assert_eq!(h.view(2).in_flight, Some(ActionKind::Freeze));
    let out = h.confirm(2, ActionKind::Freeze);
    assert_eq!(moves(&out), vec![(2, Pending, Preempted, "queued")]);
    assert!(out.actions.is_empty());
    assert_eq!(h.view(2).in_flight, None);
}

#[test]
fn higher_priority_arrival_preempts_at_once_and_the_victim_stops_on_confirmation() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 9));
    h.at_ms(5);
    let out = h.arrive(spec(2, 1));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 1 }]
    );
    assert_eq!(moves(&out), vec![(2, Pending, Running, "placed")]);
    // Still running until the freeze is seen to land.
    assert_eq!(h.state(1), Running);
    h.at_ms(7);
    let out = h.confirm(1, ActionKind::Freeze);
    assert_eq!(
        moves(&out),
        vec![(1, Running, Preempted, "preempted_by_higher_priority")]
    );
    assert_eq!(out.transitions[0].timestamp_ns, 7 * MS);
    assert_eq!(h.view(1).on_gpu_ns, 7 * MS);
}

/// An idle task gives its slot to a waiting one without being frozen (frozen, it
/// could never show that it wants the GPU again), and takes it back the moment
/// it is active again if it ranks first.
#[test]
fn an_idle_task_yields_unfrozen_and_takes_its_slot_back_when_active() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 1));
    let out = h.arrive(spec(2, 8));
    h.settle(out);
    h.at_ms(10);
    // An idle task does not hold its slot against an active one.
    let out = h.idle(1);
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
    assert_eq!(moves(&out), vec![]);
    assert_eq!((h.state(1), h.view(1).yielded), (Running, true));
    let out = h.confirm(2, ActionKind::Thaw);
    assert_eq!(moves(&out), vec![(2, Preempted, Running, "resumed")]);
    h.at_ms(20);
    // Yielded, it is not on the GPU: its on-GPU time stopped at 10 ms.
    assert_eq!(h.tick(), Output::default());
    assert_eq!(h.view(1).on_gpu_ns, 10 * MS);

    let out = h.active(1);
    assert_eq!(out.actions, vec![Action::Freeze { id: 2 }]);
    assert_eq!((h.state(1), h.view(1).yielded), (Running, false));
    let out = h.confirm(2, ActionKind::Freeze);
    assert_eq!(
        moves(&out),
        vec![(2, Running, Preempted, "preempted_by_higher_priority")]
    );
    assert_eq!(out.actions, vec![], "1 runs already: nothing to thaw");
}

/// A yielded task that is active again but ranks after the holder is frozen,
/// with the reason a running task gets.
#[test]
fn a_yielded_task_active_again_behind_a_higher_priority_is_frozen() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 8));
    h.at_ms(10);
    let out = h.idle(1);
    assert_eq!(out, Output::default(), "nobody waits: it keeps the slot");
    let out = h.arrive(spec(2, 2));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }],
        "2 arrives running; idle 1 yields, unfrozen"
    );
    assert_eq!(moves(&out), vec![(2, Pending, Running, "placed")]);
    assert!(h.view(1).yielded);
    h.at_ms(20);
    let out = h.active(1);
    assert_eq!(out.actions, vec![Action::Freeze { id: 1 }]);
    let out = h.confirm(1, ActionKind::Freeze);
    assert_eq!(
        moves(&out),
        vec![(1, Running, Preempted, "preempted_by_higher_priority")]
    );
    assert!(!h.view(1).yielded);
}

#[test]
fn equal_priorities_rotate_by_quantum_to_the_back_of_the_queue() {
    let mut h = Harness::new(config(1, 1));
    for id in 1..=3 {
        let out = h.arrive(spec(id, 7)); // quantum 100 ms
        h.settle(out);
    }
    let mut starts = Vec::new();
    let mut stops = Vec::new();
    for ms in (10..=400).step_by(10) {
        h.at_ms(ms);
        let running: Vec<TaskId> = h
            .sched
            .tasks()
            .iter()
            .filter(|v| v.state == Running)
            .map(|v| v.spec.id)
            .collect();
        let mut out = Output::default();
        for id in running {
            let active = h.active(id);
            let active = h.settle(active);
            out.transitions.extend(active.transitions);
        }
        let tick = h.tick();
        out.transitions.extend(h.settle(tick).transitions);
        for (id, from, to, reason) in moves(&out) {
            match (from, to) {
                (_, Running) => starts.push((ms, id)),
                (Running, Preempted) => stops.push((ms, id, reason.to_string())),
                _ => {}
            }
        }
    }
    assert_eq!(starts, vec![(100, 2), (200, 3), (300, 1), (400, 2)]);
    let expired = |ms, id| (ms, id, "quantum_expired".to_string());
    assert_eq!(
        stops,
        vec![
            expired(100, 1),
            expired(200, 2),
            expired(300, 3),
            expired(400, 1)
        ]
    );
}

#[test]
fn a_task_alone_keeps_running_past_its_quantum() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 0)); // quantum 5 ms
    for ms in 1..=100 {
        h.at_ms(ms);
        assert_eq!(h.active(1), Output::default());
        assert_eq!(h.tick(), Output::default());
    }
    assert_eq!(h.state(1), Running);
    assert_eq!(h.view(1).on_gpu_ms, 100);
}

#[test]
fn lower_priority_task_resumes_when_the_higher_one_exits() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 8));
    let out = h.arrive(spec(2, 2));
    h.settle(out);
    h.at_ms(30);
    let out = h.exit(2, 0);
    assert_eq!(moves(&out), vec![(2, Running, Completed, "exited")]);
    assert_eq!(out.actions, vec![Action::Thaw { id: 1 }]);
    let out = h.confirm(1, ActionKind::Thaw);
    assert_eq!(moves(&out), vec![(1, Preempted, Running, "resumed")]);
}

#[test]
fn idle_tasks_keep_their_slots_when_nobody_waits() {
    let mut h = Harness::new(config(1, 2));
    h.arrive(spec(1, 3));
    h.arrive(spec(2, 9));
    assert_eq!(h.idle(1), Output::default());
    h.at_ms(10_000);
    assert_eq!(h.tick(), Output::default());
    assert_eq!((h.state(1), h.state(2)), (Running, Running));
    assert!(!h.view(2).wants_gpu, "idle after idle_timeout_ms");
}

#[test]
fn idleness_is_inferred_after_the_idle_timeout_and_frees_the_slot() {
    let mut h = Harness::new(config(1, 1)); // idle_timeout_ms 500
    h.arrive(spec(1, 2));
    let out = h.arrive(spec(2, 9));
    h.settle(out);
    h.at_ms(499);
    assert_eq!(h.tick(), Output::default());
    h.at_ms(500);
    let out = h.tick();
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
    assert!(h.view(1).yielded);
    let out = h.settle(out);
    assert_eq!(moves(&out), vec![(2, Preempted, Running, "resumed")]);
    // Task 2 waited frozen for 500 ms but its idle timeout starts when it resumes.
    assert!(h.view(2).wants_gpu);
    h.at_ms(999);
    assert_eq!(h.tick(), Output::default());
    h.at_ms(1000);
    // Now both are idle: the higher priority gets the slot back, and neither
    // is frozen.
    assert_eq!(h.tick(), Output::default());
    assert_eq!((h.view(1).yielded, h.view(2).yielded), (false, true));
    assert_eq!((h.state(1), h.state(2)), (Running, Running));
}

#[test]
fn active_input_restarts_the_idle_timeout() {
    let mut h = Harness::new(config(1, 1)); // idle_timeout_ms 500
    h.arrive(spec(1, 2));
    let out = h.arrive(spec(2, 9));
    h.settle(out);
    h.at_ms(400);
    h.active(1);
    h.at_ms(899);
    assert_eq!(h.tick(), Output::default(), "active 499 ms ago");
    assert!(h.view(1).wants_gpu);
    h.at_ms(900);
    assert_eq!(h.tick().actions, vec![Action::Thaw { id: 2 }]);
    assert!(!h.view(1).wants_gpu);
    assert!(h.view(1).yielded);
}

#[test]
fn a_freeze_in_flight_is_never_contradicted_by_a_thaw() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 8));
    let out = h.arrive(spec(2, 2));
    assert_eq!(out.actions[1], Action::Freeze { id: 1 });
    // The preemptor leaves before the freeze lands: task 1 should run again, but
    // not while its freeze is in flight.
    let out = h.exit(2, 0);
    assert!(out.actions.is_empty(), "{:?}", out.actions);
    assert_eq!(h.state(1), Running);
    let out = h.confirm(1, ActionKind::Freeze);
    assert_eq!(out.actions, vec![Action::Thaw { id: 1 }]);
    assert_eq!(h.state(1), Preempted);
    let out = h.confirm(1, ActionKind::Thaw);
    assert_eq!(moves(&out), vec![(1, Preempted, Running, "resumed")]);
}

#[test]
fn freeze_timeout_escalates_to_stop_once() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 8));
    h.arrive(spec(2, 2));
    assert_eq!(
        h.timed_out(1, ActionKind::Freeze).actions,
        vec![Action::Stop { id: 1 }]
    );
    assert_eq!(h.view(1).in_flight, Some(ActionKind::Stop));
    assert_eq!(h.timed_out(1, ActionKind::Freeze), Output::default());
    assert_eq!(h.timed_out(1, ActionKind::Stop), Output::default());
    assert_eq!(h.state(1), Running);
    let out = h.confirm(1, ActionKind::Stop);
    assert_eq!(
        moves(&out),
        vec![(1, Running, Preempted, "preempted_by_higher_priority")]
    );
    // A late confirmation of the original freeze is stale and ignored.
    assert_eq!(h.confirm(1, ActionKind::Freeze), Output::default());
}

#[test]
fn thaw_timeout_retries_once_then_assumes_the_task_runs() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 8));
    let out = h.arrive(spec(2, 2));
    h.settle(out);
    assert_eq!(h.exit(2, 0).actions, vec![Action::Thaw { id: 1 }]);
    assert_eq!(
        h.timed_out(1, ActionKind::Thaw).actions,
        vec![Action::Thaw { id: 1 }]
    );
    assert_eq!(h.state(1), Preempted);
    let out = h.timed_out(1, ActionKind::Thaw);
    assert!(out.actions.is_empty());
    assert_eq!(
        moves(&out),
        vec![(1, Preempted, Running, "thaw_unconfirmed")]
    );
    assert_eq!(h.view(1).in_flight, None);
}

/// The agent ticks its clock slowly while no task lives: a tick then must change
/// nothing, however late it comes.
#[test]
fn the_clock_matters_only_while_a_task_lives() {
    let mut h = Harness::new(config(1, 1));
    assert!(!h.sched.has_live_tasks());
    h.arrive(spec(1, 5));
    assert!(h.sched.has_live_tasks());
    h.at_ms(10);
    h.exit(1, 0);
    // Finished, and archived by the next tick.
    assert!(h.sched.has_live_tasks());
    h.at_ms(20);
    h.tick();
    assert!(!h.sched.has_live_tasks());
    for ms in [30, 10_000, 100_000_000] {
        h.at_ms(ms);
        let out = h.tick();
        assert!(
            out.actions.is_empty() && out.transitions.is_empty(),
            "{out:?}"
        );
    }
}
