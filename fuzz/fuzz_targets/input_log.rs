//! An input log as `keling replay INPUT_LOG` reads it: `InputLogReader` (its
//! header line, then one scheduler input a line), replayed through the core
//! with the header's config and policy, as an exact replay does.
#![no_main]
use keling_agent::{
    defaults,
    replay::{exact, log::InputLogReader},
};
use keling_sched::{Policy, SchedConfig};
use libfuzzer_sys::fuzz_target;

#[path = "scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let path = scratch::write("input_log", data);
    let Ok(reader) = InputLogReader::open(&path) else {
        return;
    };
    let header = reader.header.clone();
    let policy = header.as_ref().map_or(Policy::Hybrid, |h| h.policy);
    let config = header.map_or_else(
        || SchedConfig {
            slots_per_gpu: defaults::SLOTS_PER_GPU,
            idle_timeout_ms: defaults::IDLE_TIMEOUT_MS,
            default_max_duration_ms: defaults::MAX_DURATION_MS,
            default_grace_ms: defaults::GRACE_PERIOD_MS,
            default_hard_kill: true,
            ..SchedConfig::default()
        },
        |h| h.config,
    );
    let _ = exact::replay(reader, config, policy, None);
});
