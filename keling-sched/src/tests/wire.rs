//! The JSON of what `step` returns, byte for byte as the core wrote it before it
//! became its own crate: the scheduling log and `keling replay` depend on it. The
//! per-type pins (each `Input`, each `Action`, `Transition`, `TaskView`) are beside
//! the types.

use super::*;

#[test]
fn outputs_of_a_run_serialize_exactly_as_before() {
    let mut sched = Scheduler::new(SchedConfig {
        gpus: vec![GpuInfo {
            index: 0,
            capacity_bytes: 1 << 34,
        }],
        ..SchedConfig::default()
    });
    let spec = TaskSpec {
        id: 7,
        pid: 1234,
        name: "train \"x\"".to_string(),
        priority: 3,
        gpu: Some(0),
        mem_quota_bytes: Some(1 << 30),
        max_duration_ms: None,
        grace_ms: Some(500),
        hard_kill: Some(false),
        expected_runtime_ms: Some(60_000),
    };
    let steps = [
        (
            Input::Arrive { spec, ts_ns: 1_000 },
            r#"{"actions":[{"Place":{"id":7,"gpu":0}}],"transitions":[{"event_id":1,"task":7,"name":"train \"x\"","pid":1234,"gpu":0,"priority":3,"from":"Pending","to":"Running","reason":"placed","timestamp_ns":1000,"exit_code":null}]}"#,
        ),
        (
            Input::MemAlloc {
                id: 7,
                gpu: 0,
                bytes: 2 << 30,
                ts_ns: 2_000,
            },
            r#"{"actions":[{"Terminate":{"id":7}}],"transitions":[]}"#,
        ),
        (
            Input::Exit {
                id: 7,
                exit_code: 0,
                ts_ns: 3_000,
            },
            r#"{"actions":[],"transitions":[{"event_id":2,"task":7,"name":"train \"x\"","pid":1234,"gpu":0,"priority":3,"from":"Running","to":"Failed","reason":"over_quota","timestamp_ns":3000,"exit_code":0}]}"#,
        ),
    ];
    for (input, json) in steps {
        let out = sched.step(&input);
        assert_eq!(serde_json::to_string(&out).unwrap(), json, "{input:?}");
        assert_eq!(serde_json::from_str::<Output>(json).unwrap(), out);
    }
}
