//! What would have happened under another policy or config: the recorded inputs
//! that say what the tasks did (arrivals, activity, memory, exits, ticks) go
//! through a core with the other policy and config, and a perfect actuator stands
//! in for the agent.
//!
//! The recording's own feedback (`Confirmed`, `TimedOut`) answered the recorded
//! decisions, not these, so it is dropped: every `Freeze`, `Thaw` and `Stop` is
//! confirmed [`WhatIfOptions::actuation_ns`] after it is decided, a `Kill` ends
//! the task that much later with exit code 137 (SIGKILL) and a `Terminate` with
//! 143 (SIGTERM). The tasks' behaviour is open loop: a task exits when it exited
//! in the recording (unless this policy ended it first), however long it was
//! frozen. That is the limit of a what-if on a recording; the synthetic workload
//! ([`super::synthetic`]) is closed loop instead.
use std::collections::VecDeque;

use keling_sched::{Action, ActionKind, Input, Output, Policy, SchedConfig, Scheduler};
use serde::Serialize;

use super::{Metrics, Summary};

/// Exit code of a task the perfect actuator killed (128 + SIGKILL).
pub const KILLED_EXIT_CODE: i32 = 137;
/// Exit code of a task the perfect actuator terminated (128 + SIGTERM).
pub const TERMINATED_EXIT_CODE: i32 = 143;

/// How the perfect actuator behaves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WhatIfOptions {
    /// Delay from a decision to its confirmation, or to the end of a task it
    /// kills.
    pub actuation_ns: u64,
    /// Let the core place every task (clear the GPU the recorded specs name; the
    /// agent's `launch` writes the GPU it chose into the spec).
    pub unpin: bool,
}

impl Default for WhatIfOptions {
    fn default() -> Self {
        WhatIfOptions {
            actuation_ns: 1_000_000,
            unpin: false,
        }
    }
}

/// The result of a what-if replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIf {
    pub policy: Policy,
    pub options: WhatIfOptions,
    /// Recorded inputs used (feedback left out).
    pub recorded_inputs: u64,
    /// Inputs the perfect actuator added.
    pub feedback_inputs: u64,
    pub summary: Summary,
}

/// Feedback the perfect actuator owes the core for `out`, due at `due_ns`.
pub fn feedback(out: &Output, due_ns: u64, queue: &mut VecDeque<Input>) {
    for a in &out.actions {
        let input = match *a {
            Action::Freeze { id } => Input::Confirmed {
                id,
                action: ActionKind::Freeze,
                ts_ns: due_ns,
            },
            Action::Thaw { id } => Input::Confirmed {
                id,
                action: ActionKind::Thaw,
                ts_ns: due_ns,
            },
            Action::Stop { id } => Input::Confirmed {
                id,
                action: ActionKind::Stop,
                ts_ns: due_ns,
            },
            Action::Kill { id } => Input::Exit {
                id,
                exit_code: KILLED_EXIT_CODE,
                ts_ns: due_ns,
            },
            Action::Terminate { id } => Input::Exit {
                id,
                exit_code: TERMINATED_EXIT_CODE,
                ts_ns: due_ns,
            },
            _ => continue,
        };
        queue.push_back(input);
    }
}

/// Runs the recorded `inputs` through a core with `config` and `policy`.
pub fn replay(
    inputs: impl IntoIterator<Item = anyhow::Result<Input>>,
    config: SchedConfig,
    policy: Policy,
    options: WhatIfOptions,
) -> anyhow::Result<WhatIf> {
    let mut metrics = Metrics::for_config(&config, policy);
    let mut sched = Scheduler::with_policy(config, policy);
    // Feedback is due in the order it was owed: every delay is the same and the
    // core's clock never goes back.
    let mut owed: VecDeque<Input> = VecDeque::new();
    let (mut recorded, mut added) = (0u64, 0u64);
    let mut now_ns = 0u64;
    let step = |input: Input,
                sched: &mut Scheduler,
                metrics: &mut Metrics,
                owed: &mut VecDeque<Input>,
                now_ns: &mut u64| {
        *now_ns = (*now_ns).max(input.ts_ns());
        let out = sched.step(&input);
        metrics.observe(&input, &out);
        feedback(&out, now_ns.saturating_add(options.actuation_ns), owed);
    };
    for input in inputs {
        let mut input = input?;
        match &mut input {
            Input::Confirmed { .. } | Input::TimedOut { .. } => continue,
            Input::Arrive { spec, .. } if options.unpin => spec.gpu = None,
            _ => {}
        }
        while owed.front().is_some_and(|f| f.ts_ns() <= input.ts_ns()) {
            let f = owed.pop_front().expect("front exists");
            added += 1;
            step(f, &mut sched, &mut metrics, &mut owed, &mut now_ns);
        }
        recorded += 1;
        step(input, &mut sched, &mut metrics, &mut owed, &mut now_ns);
    }
    while let Some(f) = owed.pop_front() {
        added += 1;
        step(f, &mut sched, &mut metrics, &mut owed, &mut now_ns);
    }
    Ok(WhatIf {
        policy,
        options,
        recorded_inputs: recorded,
        feedback_inputs: added,
        summary: metrics.finish().0,
    })
}

#[cfg(test)]
mod tests {
    use keling_sched::{GpuInfo, TaskSpec};

    use super::*;

    const MS: u64 = 1_000_000;

    fn spec(id: u64, priority: u8) -> TaskSpec {
        TaskSpec {
            id,
            pid: id as u32,
            name: format!("t{id}"),
            priority,
            gpu: Some(0),
            mem_quota_bytes: None,
            max_duration_ms: None,
            grace_ms: None,
            hard_kill: None,
            expected_runtime_ms: None,
        }
    }

    /// A low-priority task runs from 0 to 1000 ms; a high-priority one arrives at
    /// 100 ms and leaves at 300 ms. Under the hybrid policy the high one waits
    /// nothing; under FIFO it waits until the low one leaves (open loop: at
    /// 1000 ms, as recorded).
    #[test]
    fn fifo_makes_the_high_priority_task_wait_for_the_low_one() {
        let config = SchedConfig {
            gpus: vec![GpuInfo {
                index: 0,
                capacity_bytes: 1 << 34,
            }],
            idle_timeout_ms: 10_000,
            ..SchedConfig::default()
        };
        let recorded = [
            Input::Arrive {
                spec: spec(1, 12),
                ts_ns: 0,
            },
            Input::Arrive {
                spec: spec(2, 1),
                ts_ns: 100 * MS,
            },
            // The recording's feedback: dropped.
            Input::Confirmed {
                id: 1,
                action: ActionKind::Freeze,
                ts_ns: 101 * MS,
            },
            Input::Exit {
                id: 2,
                exit_code: 0,
                ts_ns: 300 * MS,
            },
            Input::Exit {
                id: 1,
                exit_code: 0,
                ts_ns: 1_000 * MS,
            },
            Input::Tick { ts_ns: 1_100 * MS },
        ];
        let run = |policy| {
            replay(
                recorded.iter().cloned().map(Ok),
                config.clone(),
                policy,
                WhatIfOptions::default(),
            )
            .unwrap()
        };
        let delay = |w: &WhatIf, task: u64| {
            w.summary
                .per_task
                .iter()
                .find(|d| d.task == task)
                .unwrap()
                .queueing_delay_ms
        };
        let hybrid = run(Policy::Hybrid);
        assert_eq!(hybrid.recorded_inputs, 5);
        assert_eq!(delay(&hybrid, 2), 0.0);
        // Frozen at 101 ms (confirmed 1 ms after the decision), thawed at 301 ms.
        assert_eq!(delay(&hybrid, 1), 200.0);
        assert_eq!(hybrid.summary.preemptions, 1);

        let fifo = run(Policy::Fifo);
        // Queued at once; the freeze is confirmed at 101 ms. Task 2 "exits" at
        // 300 ms while still frozen (open loop), so it waited 200 ms.
        assert_eq!(delay(&fifo, 2), 200.0);
        assert_eq!(delay(&fifo, 1), 0.0);
        assert_eq!(fifo.summary.preemptions, 0);
    }

    #[test]
    fn kills_end_tasks_and_unpin_lets_the_core_place() {
        let config = SchedConfig {
            gpus: (0..2)
                .map(|index| GpuInfo {
                    index,
                    capacity_bytes: 1 << 34,
                })
                .collect(),
            ..SchedConfig::default()
        };
        let mut short = spec(1, 3);
        short.max_duration_ms = Some(50);
        short.grace_ms = Some(0);
        let recorded = vec![
            Input::Arrive {
                spec: short,
                ts_ns: 0,
            },
            Input::Arrive {
                spec: spec(2, 3),
                ts_ns: 0,
            },
            Input::Tick { ts_ns: 60 * MS },
            Input::Tick { ts_ns: 70 * MS },
        ];
        let w = replay(
            recorded.into_iter().map(Ok),
            config,
            Policy::Hybrid,
            WhatIfOptions {
                unpin: true,
                ..WhatIfOptions::default()
            },
        )
        .unwrap();
        assert_eq!(w.summary.endings, [("duration_limit".to_owned(), 1)].into());
        let gpus: Vec<Option<u32>> = w.summary.per_task.iter().map(|d| d.gpu).collect();
        assert_eq!(gpus, [Some(0), Some(1)], "unpinned: spread by the weights");
    }
}
