//! The `busy` scenario.
use super::*;

pub(crate) fn busy(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or_else(|| {
        std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').next().and_then(|g| g.trim().parse().ok()))
            .unwrap_or(0)
    });
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, gpu);
    for _ in 0..cli.clients {
        let (c, d) = env.session(ctl, gpu);
        env.alloc_local(ctl, c, d, MIB);
    }
    if cli.alloc_mib > 0 {
        loop {
            let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
            put_u64(&mut p, 64, cli.alloc_mib * MIB);
            let (st, _) = ok_or_die(
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
            if st == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    for i in 1..=cli.iterations {
        for _ in 0..cli.calls_per_iteration.max(1) {
            // NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES: a control the driver
            // answers (a refused one counts as a failed call, which the agent
            // is sent apart from the activity signals).
            let mut n = [0u8; 4];
            env.control(ctl, c, d, 0x0080_0280, Some(&mut n));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        if let Some(p) = &cli.progress
            && (i.is_multiple_of(5) || i == cli.iterations)
        {
            let _ = std::fs::write(p, i.to_string());
        }
    }
}
