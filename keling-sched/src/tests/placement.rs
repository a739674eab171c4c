//! Automatic placement through `step`: the weights, the GPU chosen, the
//! allocation success-rate window.

use super::*;

fn unpinned(id: TaskId, priority: u8) -> TaskSpec {
    TaskSpec {
        gpu: None,
        ..spec(id, priority)
    }
}

#[test]
fn placement_prefers_free_memory_short_queues_and_successful_allocations() {
    let mut h = Harness::new(SchedConfig {
        gpus: (0..3)
            .map(|index| GpuInfo {
                index,
                capacity_bytes: 10 * GIB,
            })
            .collect(),
        ..SchedConfig::default()
    });
    let out = h.arrive(TaskSpec {
        expected_runtime_ms: Some(60_000),
        ..unpinned(1, 5)
    });
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 1, gpu: 0 }],
        "tie: lowest index"
    );
    h.alloc(1, 0, 8 * GIB);
    let out = h.arrive(unpinned(2, 5));
    assert_eq!(out.actions, vec![Action::Place { id: 2, gpu: 1 }]);
    h.alloc(2, 1, GIB);
    h.alloc_failed(2, 1, 100 * GIB);

    let weights = h.sched.placement_weights(h.ts_ns);
    // GPU 0: 20% free, 60 s of expected work queued, every allocation succeeded.
    let gpu0 = 0.4 * 0.2 + 0.35 / (1.0 + 60.0) + 0.25;
    // GPU 1: 90% free, one 40 ms quantum queued, half the allocations failed.
    let gpu1 = 0.4 * 0.9 + 0.35 / (1.0 + 0.040) + 0.25 * 0.5;
    let expected = [(0, gpu0), (1, gpu1), (2, 1.0)];
    assert_eq!(weights.len(), 3);
    for ((gpu, weight), (want_gpu, want)) in weights.iter().zip(expected) {
        assert_eq!(*gpu, want_gpu);
        assert!(
            (weight - want).abs() < 1e-9,
            "GPU {gpu}: {weight} != {want}"
        );
    }
    assert_eq!(
        h.arrive(unpinned(3, 5)).actions[0],
        Action::Place { id: 3, gpu: 2 }
    );
    let out = h.arrive(TaskSpec {
        gpu: Some(7),
        ..spec(4, 5)
    });
    assert_eq!(
        out.actions,
        vec![Action::Place { id: 4, gpu: 7 }],
        "pinned wins"
    );
    assert_eq!(moves(&out), vec![(4, Pending, Running, "placed")]);
}

#[test]
fn with_no_gpus_configured_tasks_go_to_gpu_0() {
    let mut h = Harness::new(SchedConfig::default());
    assert_eq!(
        h.arrive(unpinned(1, 5)).actions,
        vec![Action::Place { id: 1, gpu: 0 }]
    );
    assert!(h.sched.placement_weights(0).is_empty());
}

#[test]
fn allocation_success_rate_covers_the_last_five_minutes() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(spec(1, 5));
    h.alloc_failed(1, 0, 1);
    assert_eq!(h.sched.alloc_success_rate(0, 0), 0.0);
    h.at_ms(1_000);
    h.alloc(1, 0, 1);
    assert_eq!(h.sched.alloc_success_rate(0, 299_999 * MS), 0.5);
    assert_eq!(h.sched.alloc_success_rate(0, 300_000 * MS), 1.0);
    assert_eq!(h.sched.alloc_success_rate(0, 301_000 * MS), 1.0, "no data");
    assert_eq!(h.sched.alloc_success_rate(5, 0), 1.0, "unknown GPU");
}
