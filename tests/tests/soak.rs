//! A short `cargo xtask soak` (30 s, 3 checkpoints, a fixed seed) on the binaries
//! under test: at each checkpoint the agent's `/metrics` and `keling status` agree
//! with the simulated driver's ground truth and no task cgroup is frozen unless its
//! task is PREEMPTED. The long run is `sudo cargo xtask soak --minutes 30`.
use std::process::Command;

use keling_tests::{can_load_ebpf, can_use_fuse, keling_bin, skip};

#[test]
fn a_short_soak_agrees_with_the_simulator_at_every_checkpoint() {
    let test = "a_short_soak_agrees_with_the_simulator_at_every_checkpoint";
    if !can_load_ebpf(test) || !can_use_fuse(test) {
        return;
    }
    let bin_dir = keling_bin().parent().expect("bin dir").to_path_buf();
    // `cargo xtask test` runs from target/<profile>/xtask, next to the binaries.
    let xtask = bin_dir.join("xtask");
    if !xtask.exists() {
        skip(
            test,
            &format!(
                "{} is missing: run it with `cargo xtask test`",
                xtask.display()
            ),
        );
        return;
    }
    let out = Command::new(&xtask)
        .args(["soak", "--minutes", "0.5", "--checkpoint-s", "10"])
        .args(["--seed", "7", "--bin-dir"])
        .arg(&bin_dir)
        .output()
        .expect("run xtask soak");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "soak failed:\n{stderr}\n{stdout}");
    let passed = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("soak: passed ")?
                .split(' ')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no `soak: passed N checkpoints` line:\n{stderr}"));
    // 3 unless settling took 10 s or more.
    assert!(passed >= 2, "{passed} checkpoints:\n{stderr}");
    // Something was compared: the table's `compared` column is not all 0.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(": ok (") && !l.contains(" 0 (pid, GPU) compared")),
        "no checkpoint compared a process:\n{stderr}"
    );
}
