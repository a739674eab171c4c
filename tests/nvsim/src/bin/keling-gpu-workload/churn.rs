//! The `churn` scenario.
use super::*;

/// `churn`: `busy`'s loop (a control and a 2 ms sleep per iteration) on
/// `--use-gpu`, where each iteration, drawn from `--seed`, allocates (15%) 1 ..=
/// `--alloc-mib` MiB of video memory (a refusal for want of memory is skipped) or
/// frees (10%) one block it holds; nothing while `--pause-file` exists. It exits
/// holding what it holds (the release at exit frees it).
pub(crate) fn churn(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or_else(|| {
        std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().and_then(|g| g.trim().parse().ok()))
            .unwrap_or(0)
    });
    let mut rng = Rng(cli.seed);
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, gpu);
    let mut held: Vec<u32> = Vec::new();
    for i in 1..=cli.iterations {
        let paused = cli.pause_file.as_ref().is_some_and(|f| f.exists());
        let roll = rng.below(100);
        if !paused && roll < 15 {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, (1 + rng.below(cli.alloc_mib.max(1))) * MIB);
            let (st, h) = ok_or_die(
                "alloc",
                env.alloc(
                    ctl,
                    false,
                    false,
                    c,
                    d,
                    0,
                    class::NV01_MEMORY_LOCAL_USER,
                    Some(&mut p),
                ),
            );
            match st {
                status::NV_OK => held.push(h),
                status::NV_ERR_NO_MEMORY => {}
                st => die(&format!("alloc: status {st:#x}")),
            }
        } else if !paused && roll < 25 && !held.is_empty() {
            let h = held.swap_remove(rng.below(held.len() as u64) as usize);
            expect_ok("free", env.free(ctl, c, d, h));
        }
        let mut n = [0u8; 4];
        env.control(ctl, c, d, 0x0080_0280, Some(&mut n));
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(p) = &cli.progress
            && (i.is_multiple_of(5) || i == cli.iterations)
        {
            let _ = std::fs::write(p, i.to_string());
        }
    }
}
