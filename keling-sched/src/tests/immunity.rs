//! Nothing a task declares makes it immune: a task pinned to one GPU competes on
//! every GPU it holds memory on (issue: a priority-15 job pinned with `--gpu 1`
//! that worked on GPU 0 was never frozen for a priority-3 job there).

use super::*;

fn pinned(id: TaskId, priority: u8, gpu: u32) -> TaskSpec {
    TaskSpec {
        gpu: Some(gpu),
        ..spec(id, priority)
    }
}

#[test]
fn a_task_pinned_elsewhere_is_preempted_on_the_gpu_it_works_on() {
    let mut h = Harness::new(config(2, 1));
    // 1: priority 15, pinned to GPU 1, allocates on GPU 0.
    let out = h.arrive(pinned(1, 15, 1));
    h.settle(out);
    let out = h.alloc(1, 0, 2 * GIB);
    h.settle(out);
    assert_eq!(h.state(1), Running);
    // 2: priority 3 on GPU 0: 1 is frozen although it was placed on GPU 1.
    h.at_ms(1);
    let out = h.arrive(pinned(2, 3, 0));
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 2, gpu: 0 }, Action::Freeze { id: 1 }]
    );
    let out = h.settle(out);
    assert!(
        moves(&out).contains(&(1, Running, Preempted, "preempted_by_higher_priority")),
        "{out:?}"
    );
    assert_eq!(h.state(2), Running);
    // 2 exits: 1 runs again on both.
    h.at_ms(2);
    let out = h.exit(2, 0);
    assert!(out.actions.contains(&Action::Thaw { id: 1 }), "{out:?}");
    h.settle(out);
    assert_eq!(h.state(1), Running);
}

#[test]
fn memory_freed_on_the_other_gpu_ends_the_competition_there() {
    let mut h = Harness::new(config(2, 1));
    let out = h.arrive(pinned(1, 15, 1));
    h.settle(out);
    h.alloc(1, 0, GIB);
    h.step(Input::MemFree {
        id: 1,
        gpu: 0,
        bytes: GIB,
        ts_ns: 0,
    });
    // 1 holds nothing on GPU 0 any more: a priority-3 task there leaves it be.
    let out = h.arrive(pinned(2, 3, 0));
    assert_eq!(out.actions, vec![Action::Place { id: 2, gpu: 0 }]);
}

#[test]
fn a_task_on_two_gpus_waits_for_both_and_keeps_nobody_from_a_slot_it_cannot_use() {
    let mut h = Harness::new(config(2, 1));
    // 3 (priority 2) holds GPU 0; 1 (priority 5) is placed on 1 and holds
    // memory on 0 too; 2 (priority 6) wants GPU 1.
    let out = h.arrive(pinned(3, 2, 0));
    h.settle(out);
    let out = h.arrive(pinned(1, 5, 1));
    h.settle(out);
    let out = h.alloc(1, 0, GIB);
    let out = h.settle(out);
    assert_eq!(h.state(1), Preempted, "{out:?}");
    // 1 cannot run (GPU 0 is 3's), so 2 gets GPU 1 although 1 outranks it.
    let out = h.arrive(pinned(2, 6, 1));
    h.settle(out);
    assert_eq!(h.state(2), Running);
    assert_eq!(h.state(1), Preempted);
    // 3 exits: 1 now fits on GPU 0, outranks 2 on GPU 1, and runs.
    h.at_ms(1);
    let out = h.exit(3, 0);
    h.settle(out);
    assert_eq!(h.state(1), Running);
    assert_eq!(h.state(2), Preempted);
}
