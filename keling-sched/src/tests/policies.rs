//! The policies `keling replay` compares the agent's with: FIFO (no preemption,
//! arrival order) and round robin (equal priorities for everyone). The hybrid
//! policy is what every other test module checks.

use super::*;

fn harness(policy: Policy, slots: u32) -> Harness {
    Harness {
        sched: Scheduler::with_policy(config(1, slots), policy),
        ts_ns: 0,
    }
}

#[test]
fn new_is_the_hybrid_policy() {
    assert_eq!(Scheduler::new(config(1, 1)).policy(), Policy::Hybrid);
    assert_eq!(
        Scheduler::with_policy(config(1, 1), Policy::Fifo).policy(),
        Policy::Fifo
    );
}

#[test]
fn fifo_never_preempts_a_holder_for_a_higher_priority() {
    let mut h = harness(Policy::Fifo, 1);
    h.arrive(spec(1, 12));
    h.at_ms(5);
    let out = h.arrive(spec(2, 0));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 2 }],
        "the newcomer waits, whatever its priority"
    );
    let out = h.confirm(2, ActionKind::Freeze);
    assert_eq!(moves(&out), vec![(2, Pending, Preempted, "queued")]);
    assert_eq!(
        out.transitions[0].priority, 0,
        "transitions show its own priority"
    );
    // Long past any quantum, idle: the holder keeps the slot.
    h.at_ms(10_000);
    let out = h.idle(1);
    assert!(out.actions.is_empty(), "{out:?}");
    h.at_ms(20_000);
    assert_eq!(h.tick(), Output::default());
    assert_eq!(h.state(1), Running);
    // It leaves: the next in arrival order gets the slot.
    let out = h.exit(1, 0);
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }]);
}

#[test]
fn fifo_serves_in_arrival_order_not_priority() {
    let mut h = harness(Policy::Fifo, 1);
    h.arrive(spec(1, 5));
    for (id, priority) in [(2, 15), (3, 0)] {
        let out = h.arrive(spec(id, priority));
        h.settle(out);
    }
    let out = h.exit(1, 0);
    assert_eq!(out.actions, vec![Action::Thaw { id: 2 }], "2 came first");
    let out = h.settle(out);
    assert_eq!(
        moves(&out),
        vec![
            (1, Running, Completed, "exited"),
            (2, Preempted, Running, "resumed")
        ]
    );
}

#[test]
fn fifo_and_rr_evict_nobody_for_memory() {
    for policy in [Policy::Fifo, Policy::RoundRobin] {
        let mut h = harness(policy, 2);
        h.arrive(spec(1, 12));
        h.alloc(1, 0, 12 * GIB);
        h.arrive(spec(2, 0));
        let out = h.alloc_failed(2, 0, 8 * GIB);
        assert!(terminated(&out).is_empty(), "{policy}: {out:?}");
    }
    let mut h = harness(Policy::Hybrid, 2);
    h.arrive(spec(1, 12));
    h.alloc(1, 0, 12 * GIB);
    h.arrive(spec(2, 0));
    let out = h.alloc_failed(2, 0, 8 * GIB);
    assert_eq!(terminated(&out), vec![1], "the hybrid policy evicts");
}

#[test]
fn rr_ignores_priorities_and_rotates_every_100_ms() {
    let mut h = harness(Policy::RoundRobin, 1);
    h.arrive(spec(1, 12));
    h.at_ms(5);
    let out = h.arrive(spec(2, 0));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 2 }],
        "no preemption by priority"
    );
    h.settle(out);
    // Priority 12 would have a 162 ms quantum; under rr everyone has 100 ms.
    h.at_ms(99);
    h.active(1);
    assert!(h.tick().actions.is_empty());
    h.at_ms(100);
    let out = h.active(1);
    assert_eq!(out.actions, vec![Action::Freeze { id: 1 }]);
    let out = h.settle(out);
    assert_eq!(
        moves(&out),
        vec![
            (1, Running, Preempted, "quantum_expired"),
            (2, Preempted, Running, "resumed")
        ]
    );
    assert_eq!(
        h.view(2).quantum_ms,
        5,
        "views show the task's own priority"
    );
}

#[test]
fn every_policy_replays_identically() {
    for policy in Policy::ALL {
        let run = || {
            let mut h = harness(policy, 2);
            let mut outs = Vec::new();
            for id in 1..=6 {
                h.at_ms(id * 7);
                let out = h.arrive(spec(id, (id * 5 % 16) as u8));
                outs.push(h.settle(out));
            }
            for ms in (50..2_000).step_by(10) {
                h.at_ms(ms);
                for id in 1..=6 {
                    if h.state(id) == Running {
                        h.active(id);
                    }
                }
                let out = h.tick();
                outs.push(h.settle(out));
            }
            outs
        };
        assert_eq!(run(), run(), "{policy}");
    }
}
