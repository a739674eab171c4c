//! An HdrHistogram interval log as `keling histo export|tune FILE` reads it:
//! `latency::intervals::read`, then the decision series `tune` replays.
#![no_main]
use keling_agent::latency::intervals::read;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(log) = read(data) {
        let _ = log.series();
    }
});
