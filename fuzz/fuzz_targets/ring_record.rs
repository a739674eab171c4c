//! One ring-buffer record as the agent's event loop hands it to the decoder:
//! `event::decode::decode` on the raw bytes, then what every consumer asks of an
//! event (its kind, header, whether it is a GPU event, its text).
#![no_main]
use keling_agent::event::decode::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = decode(data) {
        let _ = event.kind();
        let _ = event.is_gpu();
        let _ = event.header();
        let _ = format!("{event:?}");
    }
});
