//! What the agent tells the core: the timestamped [`Input`]s, and the [`TaskSpec`]
//! of a task that arrives. See "Inputs" in the crate doc for when each is sent.
//!
//! The serde form of these types is the format of recorded input logs (one JSON
//! [`Input`] a line, which `keling replay` reads back): it must not change.

use serde::{Deserialize, Serialize};

use crate::TaskId;
use crate::action::ActionKind;

/// What the agent knows about a task when it arrives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task's id; ids are never reused.
    pub id: TaskId,
    /// The task's (leader) process.
    pub pid: u32,
    /// A name for logs.
    pub name: String,
    /// 0..=15, 0 highest.
    pub priority: u8,
    /// The GPU to run on; `None`: place automatically.
    pub gpu: Option<u32>,
    /// Most GPU memory the task may hold, all GPUs together.
    pub mem_quota_bytes: Option<u64>,
    /// Session duration limit; `None`: the config's default.
    pub max_duration_ms: Option<u64>,
    /// Warning window before the limit; `None`: the config's default.
    pub grace_ms: Option<u64>,
    /// Kill at the limit (true) or terminate with grace (false); `None`: the default.
    pub hard_kill: Option<bool>,
    /// How long the task expects to run in total, in wall time.
    pub expected_runtime_ms: Option<u64>,
}

/// One timestamped fact from the agent. See the crate doc for the protocol.
///
/// Every variant carries `ts_ns`, the kernel timestamp (CLOCK_MONOTONIC, ns) of what
/// it reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// A task was launched or adopted; it is running as it is.
    Arrive {
        /// What is known about it.
        spec: TaskSpec,
        /// When.
        ts_ns: u64,
    },
    /// The trace saw the task use the GPU or the CPU.
    Active {
        /// The task.
        id: TaskId,
        /// When.
        ts_ns: u64,
    },
    /// Explicit idle hint (idleness is also inferred after `idle_timeout_ms`).
    Idle {
        /// The task.
        id: TaskId,
        /// When.
        ts_ns: u64,
    },
    /// A successful allocation (exact, from the kernel).
    MemAlloc {
        /// The task.
        id: TaskId,
        /// The GPU index.
        gpu: u32,
        /// How much was granted.
        bytes: u64,
        /// When.
        ts_ns: u64,
    },
    /// Memory released (exact, from the kernel).
    MemFree {
        /// The task.
        id: TaskId,
        /// The GPU index.
        gpu: u32,
        /// How much was released.
        bytes: u64,
        /// When.
        ts_ns: u64,
    },
    /// The driver said NO_MEMORY for `bytes`: memory pressure.
    AllocFailed {
        /// The task that asked.
        id: TaskId,
        /// The GPU index.
        gpu: u32,
        /// How much it asked for.
        bytes: u64,
        /// When.
        ts_ns: u64,
    },
    /// The task's process (tree) is gone.
    Exit {
        /// The task.
        id: TaskId,
        /// 0: success.
        exit_code: i32,
        /// When.
        ts_ns: u64,
    },
    /// Time passed: sent periodically whether or not anything happened.
    Tick {
        /// When.
        ts_ns: u64,
    },
    /// The actuator saw the action take effect.
    Confirmed {
        /// The task.
        id: TaskId,
        /// The kind of action seen to take effect.
        action: ActionKind,
        /// When.
        ts_ns: u64,
    },
    /// A table the kernel needed for the task's GPU memory books was full: its
    /// memory figure may be wrong from now on (memory released and never seen
    /// go, or memory never seen come), so no quota decision is taken on it.
    MemUnsure {
        /// The task.
        id: TaskId,
        /// When the agent learnt it.
        ts_ns: u64,
    },
    /// GPU memory held on `gpu` by processes outside any task (the driver's
    /// view of processes Keling does not schedule): the figure now, replacing
    /// the last one. Memory sharing admits tasks against the capacity less
    /// this.
    OutsideMem {
        /// The GPU index.
        gpu: u32,
        /// Bytes held there by processes in no task.
        bytes: u64,
        /// When.
        ts_ns: u64,
    },
    /// For a task whose figure is unsure ([`Input::MemUnsure`]): a sound lower
    /// bound of its video memory on all GPUs together, which no full table can
    /// have inflated (the agent counts only memory certainly still allocated). Its
    /// quota is enforced on it.
    MemSure {
        /// The task.
        id: TaskId,
        /// Video memory, all GPUs together.
        bytes: u64,
        /// When the agent measured it.
        ts_ns: u64,
    },
    /// The action was not confirmed within the timeout model's deadline.
    TimedOut {
        /// The task.
        id: TaskId,
        /// The kind of action that timed out.
        action: ActionKind,
        /// When.
        ts_ns: u64,
    },
}

impl Input {
    /// The input's timestamp.
    pub fn ts_ns(&self) -> u64 {
        match self {
            Input::Arrive { ts_ns, .. }
            | Input::Active { ts_ns, .. }
            | Input::Idle { ts_ns, .. }
            | Input::MemAlloc { ts_ns, .. }
            | Input::MemFree { ts_ns, .. }
            | Input::AllocFailed { ts_ns, .. }
            | Input::Exit { ts_ns, .. }
            | Input::Tick { ts_ns }
            | Input::Confirmed { ts_ns, .. }
            | Input::MemUnsure { ts_ns, .. }
            | Input::OutsideMem { ts_ns, .. }
            | Input::MemSure { ts_ns, .. }
            | Input::TimedOut { ts_ns, .. } => *ts_ns,
        }
    }

    /// The task the input is about; `None` for `Tick`.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            Input::Arrive { spec, .. } => Some(spec.id),
            Input::Active { id, .. }
            | Input::Idle { id, .. }
            | Input::MemAlloc { id, .. }
            | Input::MemFree { id, .. }
            | Input::AllocFailed { id, .. }
            | Input::Exit { id, .. }
            | Input::Confirmed { id, .. }
            | Input::MemUnsure { id, .. }
            | Input::MemSure { id, .. }
            | Input::TimedOut { id, .. } => Some(*id),
            Input::Tick { .. } | Input::OutsideMem { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant(spec: TaskSpec) -> Vec<Input> {
        vec![
            Input::Arrive { spec, ts_ns: 1 },
            Input::Active { id: 7, ts_ns: 2 },
            Input::Idle { id: 7, ts_ns: 3 },
            Input::MemAlloc {
                id: 7,
                gpu: 1,
                bytes: 4096,
                ts_ns: 4,
            },
            Input::MemFree {
                id: 7,
                gpu: 1,
                bytes: 4096,
                ts_ns: 5,
            },
            Input::AllocFailed {
                id: 7,
                gpu: 1,
                bytes: 8192,
                ts_ns: 6,
            },
            Input::Exit {
                id: 7,
                exit_code: -9,
                ts_ns: 7,
            },
            Input::Tick { ts_ns: 8 },
            Input::Confirmed {
                id: 7,
                action: ActionKind::Freeze,
                ts_ns: 9,
            },
            Input::TimedOut {
                id: 7,
                action: ActionKind::Stop,
                ts_ns: u64::MAX,
            },
            Input::MemUnsure { id: 7, ts_ns: 11 },
            Input::OutsideMem {
                gpu: 1,
                bytes: 512,
                ts_ns: 12,
            },
            Input::MemSure {
                id: 7,
                bytes: 4096,
                ts_ns: 13,
            },
        ]
    }

    fn a_spec() -> TaskSpec {
        TaskSpec {
            id: 7,
            pid: 1234,
            name: "train \"x\"".to_string(),
            priority: 3,
            gpu: Some(1),
            mem_quota_bytes: Some(1 << 30),
            max_duration_ms: None,
            grace_ms: Some(500),
            hard_kill: Some(false),
            expected_runtime_ms: Some(60_000),
        }
    }

    /// The recorded input logs' format, byte for byte, as written before the core
    /// became its own crate.
    #[test]
    fn every_input_variant_serializes_exactly_as_recorded_logs_have_it() {
        let expected = [
            r#"{"Arrive":{"spec":{"id":7,"pid":1234,"name":"train \"x\"","priority":3,"gpu":1,"mem_quota_bytes":1073741824,"max_duration_ms":null,"grace_ms":500,"hard_kill":false,"expected_runtime_ms":60000},"ts_ns":1}}"#,
            r#"{"Active":{"id":7,"ts_ns":2}}"#,
            r#"{"Idle":{"id":7,"ts_ns":3}}"#,
            r#"{"MemAlloc":{"id":7,"gpu":1,"bytes":4096,"ts_ns":4}}"#,
            r#"{"MemFree":{"id":7,"gpu":1,"bytes":4096,"ts_ns":5}}"#,
            r#"{"AllocFailed":{"id":7,"gpu":1,"bytes":8192,"ts_ns":6}}"#,
            r#"{"Exit":{"id":7,"exit_code":-9,"ts_ns":7}}"#,
            r#"{"Tick":{"ts_ns":8}}"#,
            r#"{"Confirmed":{"id":7,"action":"Freeze","ts_ns":9}}"#,
            r#"{"TimedOut":{"id":7,"action":"Stop","ts_ns":18446744073709551615}}"#,
            r#"{"MemUnsure":{"id":7,"ts_ns":11}}"#,
            r#"{"OutsideMem":{"gpu":1,"bytes":512,"ts_ns":12}}"#,
            r#"{"MemSure":{"id":7,"bytes":4096,"ts_ns":13}}"#,
        ];
        let inputs = every_variant(a_spec());
        assert_eq!(inputs.len(), expected.len());
        for (input, json) in inputs.iter().zip(expected) {
            assert_eq!(serde_json::to_string(input).unwrap(), json);
            assert_eq!(&serde_json::from_str::<Input>(json).unwrap(), input);
        }
    }

    #[test]
    fn ts_ns_and_task_name_every_variants_fields() {
        for (i, input) in every_variant(a_spec()).iter().enumerate() {
            let want_ts = if i == 9 { u64::MAX } else { i as u64 + 1 };
            assert_eq!(input.ts_ns(), want_ts, "{input:?}");
            let want_task = if matches!(input, Input::Tick { .. } | Input::OutsideMem { .. }) {
                None
            } else {
                Some(7)
            };
            assert_eq!(input.task(), want_task, "{input:?}");
        }
    }
}
