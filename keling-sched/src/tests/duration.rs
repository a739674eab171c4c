//! Session duration limits: the warning, the 4003 record, kill or terminate.

use super::*;

fn limited(id: TaskId, max_ms: u64, grace_ms: u64, hard_kill: Option<bool>) -> TaskSpec {
    TaskSpec {
        max_duration_ms: Some(max_ms),
        grace_ms: Some(grace_ms),
        hard_kill,
        ..spec(id, 5)
    }
}

/// Ticks every 10 ms up to `until_ms`; the non-empty action lists by time.
fn tick_until(h: &mut Harness, until_ms: u64) -> Vec<(u64, Vec<Action>)> {
    let mut seen = Vec::new();
    let start = h.ts_ns / MS + 10;
    for ms in (start..=until_ms).step_by(10) {
        h.at_ms(ms);
        let out = h.tick();
        if !out.actions.is_empty() {
            seen.push((ms, out.actions));
        }
    }
    seen
}

#[test]
fn duration_limit_warns_once_then_kills_with_the_4003_record() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(limited(1, 1_000, 300, None));
    assert_eq!(
        tick_until(&mut h, 1_500),
        vec![
            (
                700,
                vec![Action::Warn {
                    id: 1,
                    remaining_ms: 300
                }]
            ),
            (
                1_000,
                vec![
                    Action::Enforce {
                        id: 1,
                        record: EnforcementRecord::duration_exceeded(1_000, 1_000),
                    },
                    Action::Kill { id: 1 },
                ]
            ),
        ]
    );
    let out = h.exit(1, 137);
    assert_eq!(moves(&out), vec![(1, Running, Failed, "duration_limit")]);
}

#[test]
fn duration_limit_without_hard_kill_terminates_then_kills_after_grace() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(limited(1, 1_000, 0, Some(false)));
    assert_eq!(
        tick_until(&mut h, 6_100),
        vec![
            (
                1_000,
                vec![
                    Action::Enforce {
                        id: 1,
                        record: EnforcementRecord::duration_exceeded(1_000, 1_000),
                    },
                    Action::Terminate { id: 1 },
                ]
            ),
            (6_000, vec![Action::Kill { id: 1 }]),
        ]
    );
}

#[test]
fn duration_limit_past_before_the_warning_was_seen_skips_the_warning() {
    let mut h = Harness::new(config(1, 1));
    h.arrive(limited(1, 100, 50, None));
    h.at_ms(150);
    assert_eq!(
        h.tick().actions,
        vec![
            Action::Enforce {
                id: 1,
                record: EnforcementRecord::duration_exceeded(100, 150),
            },
            Action::Kill { id: 1 },
        ]
    );
}

#[test]
fn duration_counts_wall_time_including_time_frozen() {
    let mut h = Harness::new(SchedConfig {
        idle_timeout_ms: 10_000,
        ..config(1, 1)
    });
    h.arrive(limited(1, 1_000, 0, None));
    let out = h.arrive(spec(2, 0));
    h.settle(out);
    assert_eq!(h.state(1), Preempted);
    let seen = tick_until(&mut h, 1_000);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, 1_000);
    assert_eq!(h.view(1).on_gpu_ns, 0);
}
