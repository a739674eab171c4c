//! What the property tests generate, shared by `properties` and
//! `properties_sharing`: the operations ([`Op`]) and their strategies, the
//! configurations, and the input an operation becomes at a given time.

use proptest::prelude::*;

use super::*;

/// What the test asks for, turned into an input at the driver's clock.
#[derive(Clone, Debug)]
pub(super) enum Op {
    Arrive {
        id: TaskId,
        priority: u8,
        gpu: Option<u32>,
        quota_gib: Option<u64>,
        max_ms: Option<u64>,
        grace_ms: Option<u64>,
        hard_kill: Option<bool>,
        expected_ms: Option<u64>,
    },
    Active(TaskId),
    Idle(TaskId),
    Alloc(TaskId, u32, u64),
    Free(TaskId, u32, u64),
    AllocFailed(TaskId, u32, u64),
    Exit(TaskId, i32),
    Tick,
    /// Confirm the n-th actuation in flight (a Tick when there is none).
    Confirm(usize),
    /// Time out the n-th actuation in flight.
    TimeOut(usize),
    /// Feedback about anything.
    Stray(TaskId, ActionKind, bool),
    /// Memory held outside any task on a GPU (memory sharing's properties).
    Outside(u32, u64),
}

pub(super) fn arb_id() -> impl Strategy<Value = TaskId> {
    prop_oneof![10 => 0u64..8, 1 => Just(42u64)]
}

/// GPUs 0 and 1 are configured; 2 is not.
pub(super) fn arb_gpu() -> impl Strategy<Value = u32> {
    prop_oneof![10 => 0u32..2, 1 => Just(2u32)]
}

pub(super) fn arb_kind() -> impl Strategy<Value = ActionKind> {
    prop::sample::select(vec![
        ActionKind::Freeze,
        ActionKind::Thaw,
        ActionKind::Stop,
        ActionKind::Terminate,
        ActionKind::Kill,
        ActionKind::Place,
        ActionKind::Warn,
    ])
}

pub(super) fn arb_op(feedback: bool) -> BoxedStrategy<Op> {
    let arrive = (
        arb_id(),
        0u8..=17,
        prop::option::of(arb_gpu()),
        prop::option::of(1u64..12),
        prop::option::of(0u64..3_000),
        prop::option::of(0u64..1_000),
        prop::option::of(any::<bool>()),
        prop::option::of(0u64..10_000),
    )
        .prop_map(
            |(id, priority, gpu, quota_gib, max_ms, grace_ms, hard_kill, expected_ms)| Op::Arrive {
                id,
                priority,
                gpu,
                quota_gib,
                max_ms,
                grace_ms,
                hard_kill,
                expected_ms,
            },
        );
    let base = prop_oneof![
        3 => arrive,
        4 => arb_id().prop_map(Op::Active),
        1 => arb_id().prop_map(Op::Idle),
        2 => (arb_id(), arb_gpu(), 1u64..6).prop_map(|(id, gpu, gib)| Op::Alloc(id, gpu, gib * GIB)),
        1 => (arb_id(), arb_gpu(), 1u64..6).prop_map(|(id, gpu, gib)| Op::Free(id, gpu, gib * GIB)),
        1 => (arb_id(), arb_gpu(), 1u64..12).prop_map(|(id, gpu, gib)| Op::AllocFailed(id, gpu, gib * GIB)),
        1 => (arb_id(), -2i32..3).prop_map(|(id, code)| Op::Exit(id, code)),
        4 => Just(Op::Tick),
    ];
    if feedback {
        prop_oneof![
            12 => base,
            4 => any::<usize>().prop_map(Op::Confirm),
            1 => any::<usize>().prop_map(Op::TimeOut),
            1 => (arb_id(), arb_kind(), any::<bool>()).prop_map(|(id, kind, confirmed)| Op::Stray(id, kind, confirmed)),
        ]
        .boxed()
    } else {
        base.boxed()
    }
}

pub(super) fn random_config(slots: u32) -> SchedConfig {
    SchedConfig {
        slots_per_gpu: slots,
        idle_timeout_ms: 50,
        kill_grace_ms: 30,
        default_grace_ms: 100,
        ..config(2, slots)
    }
}

/// GPUs 0 and 1 of 16 GiB shared by memory, with `cap` (0: none).
pub(super) fn shared_config(cap: u32) -> SchedConfig {
    SchedConfig {
        sharing: Sharing::Memory,
        slots_per_gpu: cap,
        ..random_config(cap)
    }
}

/// The usual operations, with memory held outside tasks now and then.
pub(super) fn arb_shared_op(feedback: bool) -> BoxedStrategy<Op> {
    prop_oneof![
        20 => arb_op(feedback),
        1 => (0u32..3, 0u64..10).prop_map(|(gpu, gib)| Op::Outside(gpu, gib * GIB)),
    ]
    .boxed()
}

/// `op` as an input at `ts_ns`. `nth(n)` gives the `n`-th actuation in
/// flight (any `n`; `None` when there is none) as the task, the action a
/// confirmation names and the action a time-out names; `Confirm` and `TimeOut`
/// become a `Tick` when there is none.
pub(super) fn op_input(
    op: &Op,
    ts_ns: u64,
    nth: impl Fn(usize) -> Option<(TaskId, ActionKind, ActionKind)>,
) -> Input {
    match *op {
        Op::Arrive {
            id,
            priority,
            gpu,
            quota_gib,
            max_ms,
            grace_ms,
            hard_kill,
            expected_ms,
        } => Input::Arrive {
            spec: TaskSpec {
                gpu,
                mem_quota_bytes: quota_gib.map(|g| g * GIB),
                max_duration_ms: max_ms,
                grace_ms,
                hard_kill,
                expected_runtime_ms: expected_ms,
                ..spec(id, priority)
            },
            ts_ns,
        },
        Op::Active(id) => Input::Active { id, ts_ns },
        Op::Idle(id) => Input::Idle { id, ts_ns },
        Op::Alloc(id, gpu, bytes) => Input::MemAlloc {
            id,
            gpu,
            bytes,
            ts_ns,
        },
        Op::Free(id, gpu, bytes) => Input::MemFree {
            id,
            gpu,
            bytes,
            ts_ns,
        },
        Op::AllocFailed(id, gpu, bytes) => Input::AllocFailed {
            id,
            gpu,
            bytes,
            ts_ns,
        },
        Op::Exit(id, exit_code) => Input::Exit {
            id,
            exit_code,
            ts_ns,
        },
        Op::Tick => Input::Tick { ts_ns },
        Op::Confirm(n) => match nth(n) {
            Some((id, action, _)) => Input::Confirmed { id, action, ts_ns },
            None => Input::Tick { ts_ns },
        },
        Op::TimeOut(n) => match nth(n) {
            Some((id, _, action)) => Input::TimedOut { id, action, ts_ns },
            None => Input::Tick { ts_ns },
        },
        Op::Stray(id, action, true) => Input::Confirmed { id, action, ts_ns },
        Op::Stray(id, action, false) => Input::TimedOut { id, action, ts_ns },
        Op::Outside(gpu, bytes) => Input::OutsideMem { gpu, bytes, ts_ns },
    }
}
