//! A scheduling log as `keling replay --sched-log` and `keling report` read it:
//! `read_sched_log` (one JSON line a line), then the decisions an exact replay
//! compares and each transition's states.
#![no_main]
use keling_agent::{
    replay::{exact, log::read_sched_log, figures::Metrics},
    log_format::SchedLine,
};
use libfuzzer_sys::fuzz_target;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let path = scratch::write("sched_log", data);
    let Ok(lines) = read_sched_log(&path) else {
        return;
    };
    let recorded = exact::recorded_decisions(&lines);
    let _ = exact::Comparison::of(&recorded, &recorded);
    // The replay metrics `keling report` builds from the transitions.
    let mut metrics = Metrics::new([0, 1]);
    for line in &lines {
        if let SchedLine::Transition(t) = line {
            let _ = t.states();
            metrics.observe_line(t);
        }
    }
    let _ = metrics.finish();
});
