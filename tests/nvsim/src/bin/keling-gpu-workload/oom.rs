//! The `oom` scenario.
use super::*;

/// Allocate 512 MiB chunks until NV_ERR_NO_MEMORY, free one, allocate again.
pub(crate) fn oom(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let (c, d) = env.session(ctl, 0);
    let chunk = 512 * MIB;
    let alloc = || {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, chunk);
        ok_or_die(
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
        )
    };
    let mut handles = Vec::new();
    loop {
        let (st, h) = alloc();
        if st == status::NV_ERR_NO_MEMORY {
            break;
        }
        expect_ok("alloc", st);
        handles.push(h);
        cp.step();
        if handles.len() > 1 << 20 {
            die("never ran out of memory");
        }
    }
    cp.step();
    let Some(first) = handles.first().copied() else {
        die("no allocation succeeded at all");
    };
    expect_ok("free", env.free(ctl, c, d, first));
    cp.step();
    let (st, _) = alloc();
    expect_ok("allocation after a free", st);
    cp.step();
    cp.emit();
}
