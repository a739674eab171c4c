//! The `compute` scenario (also the work of `busy` and `churn`).
use super::*;

/// A task that keeps a GPU busy: the scheduler tests watch its progress stop
/// while Keling has it frozen.
/// compute: what a CUDA process holds once its context exists, as far as
/// the driver sees it: a client, the device of `--use-gpu` (default 0) with a
/// subdevice, `--alloc-mib` of video memory (and `--second-device-mib` under
/// a second device object of the same GPU; `--hw-resources-mib`: a video and
/// a host NV01_MEMORY_HW_RESOURCES object of that size), a VA space, a channel group with a
/// context share and a Hopper channel carrying a compute object (what
/// GPU_GET_PIDS lists by class). Sends one control no driver defines and
/// prints `unknown_control_status 0x..`, then `ready <pid>`, and holds until
/// stdin closes or sends a line.
pub(crate) fn compute(env: &Env, cli: &Cli) {
    let gpu = cli.use_gpu.unwrap_or(0);
    let ctl = env.open("nvidiactl", false);
    let obj = |root: u32, parent: u32, cls: u32, params: Option<&mut [u8]>, what: &str| {
        let (st, h) = ok_or_die(
            what,
            env.alloc(ctl, false, false, root, parent, 0, cls, params),
        );
        expect_ok(what, st);
        h
    };
    let (c, d) = env.session(ctl, gpu);
    let sub = env.subdevice(ctl, c, d);
    if cli.alloc_mib > 0 {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, cli.alloc_mib * MIB);
        obj(
            c,
            d,
            class::NV01_MEMORY_LOCAL_USER,
            Some(&mut p),
            "video memory",
        );
    }
    if cli.second_device_mib > 0 {
        let d2 = env.device(ctl, c, gpu, "second device");
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, cli.second_device_mib * MIB);
        obj(
            c,
            d2,
            class::NV01_MEMORY_LOCAL_USER,
            Some(&mut p),
            "video memory under the second device",
        );
    }
    if cli.hw_resources_mib > 0 {
        // NVOS32 location in attr bits 26:25: 0 video, 2 PCI (host).
        for (location, what) in [(0u32, "video HW resources"), (2, "host HW resources")] {
            let mut p = vec![0u8; abi::hw_resources::SIZE_OF];
            put_u32(
                &mut p,
                abi::hw_resources::ATTR,
                location << abi::nvos32::ATTR_LOCATION_SHIFT,
            );
            put_u64(&mut p, abi::hw_resources::SIZE, cli.hw_resources_mib * MIB);
            obj(c, d, class::NV01_MEMORY_HW_RESOURCES, Some(&mut p), what);
        }
    }
    let vas = obj(c, d, class::FERMI_VASPACE_A, None, "VA space");
    let mut tp = vec![0u8; abi::size::TSG_ALLOC];
    put_u32(&mut tp, 8, vas);
    put_u32(&mut tp, 12, 1);
    let tsg = obj(
        c,
        d,
        class::KEPLER_CHANNEL_GROUP_A,
        Some(&mut tp),
        "channel group",
    );
    let ctx = obj(c, tsg, class::FERMI_CONTEXT_SHARE_A, None, "context share");
    let mut chp = vec![0u8; abi::size::CHANNEL_ALLOC];
    put_u64(&mut chp, 16, 1024);
    put_u32(&mut chp, 24, ctx);
    put_u32(&mut chp, 28, vas);
    put_u32(&mut chp, 128, 1);
    let ch = obj(
        c,
        tsg,
        class::HOPPER_CHANNEL_GPFIFO_A,
        Some(&mut chp),
        "channel",
    );
    obj(c, ch, class::HOPPER_COMPUTE_A, None, "compute object");
    let mut junk = [0u8; 16];
    let st = env.control(ctl, c, sub, 0x2080_ff7e, Some(&mut junk));
    println!("unknown_control_status {st:#x}");
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}
