//! The `basic` scenario.
use super::*;

/// Client, device on GPU 0; 3 MiB and 5 MiB; free the first; exit holding
/// the second.
pub(crate) fn basic(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, 0);
    cp.step();
    let mut h = [0u32; 2];
    for (i, size) in [3 * MIB, 5 * MIB].into_iter().enumerate() {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, size);
        let (st, hh) = ok_or_die(
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
        expect_ok("alloc", st);
        h[i] = hh;
        cp.step();
    }
    expect_ok("free", env.free(ctl, c, d, h[0]));
    cp.step();
    cp.emit();
}
