//! The agent's config file (`/etc/keling/config.toml`) as `keling run --config`
//! reads it: `Config::parse` (TOML, then the checks and the access policy), then
//! the rule matching every process goes through.
#![no_main]
use keling_agent::{os::proc::ProcessFacts, sched::config::Config};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Ok(config) => {
            for facts in [
                ProcessFacts::default(),
                ProcessFacts {
                    comm: "python3".into(),
                    uid: Some(1000),
                    cgroup: Some("/user.slice/user-1000.slice".into()),
                    exe: Some("/usr/bin/python3".into()),
                    gid: Some(1000),
                    groups: vec![1000, 27],
                },
            ] {
                let _ = config.settings_for(&facts);
            }
        }
        // An error names a line of the text.
        Err((line, what)) => {
            assert!(
                line >= 1 && line <= text.lines().count().max(1) + 1,
                "line {line} of {what}"
            );
        }
    }
});
