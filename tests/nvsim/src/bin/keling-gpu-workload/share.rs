//! The `share` scenario (the crate doc tells its steps).
use super::*;

/// The `share` scenario (see the module doc for what it does and holds).
pub(crate) fn share(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open_way("nvidiactl", OpenWay::Openat, false);
    let (c, d) = env.session(ctl, 0);
    env.subdevice(ctl, c, d);
    let alloc = |cls: u32, size: u64| {
        let mut p = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
        put_u64(&mut p, 64, size);
        let (st, h) = ok_or_die(
            "alloc",
            env.alloc(ctl, false, false, c, d, 0, cls, Some(&mut p)),
        );
        expect_ok("alloc", st);
        h
    };
    // 1. mA1 8 MiB, mA2 4 MiB (video), hA 1 MiB (host)
    let ma1 = alloc(class::NV01_MEMORY_LOCAL_USER, 8 * MIB);
    let ma2 = alloc(class::NV01_MEMORY_LOCAL_USER, 4 * MIB);
    let ha = alloc(class::NV01_MEMORY_SYSTEM, MIB);
    cp.step();
    // 2. a second file (raw open(2)) and client; RM_DUP_OBJECT of mA1 into it
    let ctl2 = env.open_way("nvidiactl", OpenWay::RawOpen, false);
    let c2 = env.root_client(ctl2, "client 2");
    let d2 = env.device(ctl2, c2, 0, "device 2");
    let mut b = vec![0u8; abi::size::NVOS55];
    put_u32(&mut b, abi::nvos55::H_CLIENT, c2);
    put_u32(&mut b, abi::nvos55::H_PARENT, d2);
    put_u32(&mut b, abi::nvos55::H_CLIENT_SRC, c);
    put_u32(&mut b, abi::nvos55::H_OBJECT_SRC, ma1);
    ok_or_die(
        "RM_DUP_OBJECT",
        env.rm(ctl2, esc::RM_DUP_OBJECT, &mut b, false),
    );
    expect_ok("RM_DUP_OBJECT", u32_at(&b, abi::nvos55::STATUS));
    cp.step();
    // 3. export mA2 alone to exp1, [mA1, hA] to exp2; both to B; close ours
    let exp1 = env.open_way("nvidiactl", OpenWay::Openat, true);
    let exp2 = env.open_way("nvidiactl", OpenWay::Openat, true);
    let mut p = vec![0u8; abi::size::EXPORT_OBJECT_TO_FD];
    put_u32(&mut p, ux::EXP1_TYPE, ux::OBJECT_TYPE_RM);
    put_u32(&mut p, ux::EXP1_H_DEVICE, d);
    put_u32(&mut p, ux::EXP1_H_PARENT, d);
    put_u32(&mut p, ux::EXP1_H_OBJECT, ma2);
    put_u32(&mut p, ux::EXP1_FD, exp1 as u32);
    expect_ok(
        "EXPORT_OBJECT_TO_FD",
        env.control(ctl, c, c, ux::EXPORT_OBJECT_TO_FD, Some(&mut p)),
    );
    let mut p = vec![0u8; abi::size::EXPORT_OBJECTS_TO_FD];
    put_u32(&mut p, ux::EXPN_FD, exp2 as u32);
    put_u32(&mut p, ux::EXPN_H_DEVICE, d);
    put_u16(&mut p, ux::EXPN_MAX_OBJECTS, 2);
    put_u32(&mut p, ux::EXPN_OBJECTS, ma1);
    put_u32(&mut p, ux::EXPN_OBJECTS + 4, ha);
    put_u16(&mut p, ux::EXPN_NUM_OBJECTS, 2);
    expect_ok(
        "EXPORT_OBJECTS_TO_FD",
        env.control(ctl, c, c, ux::EXPORT_OBJECTS_TO_FD, Some(&mut p)),
    );
    let peer = Peer::start(env, Rng(9), OpenWay::Openat2);
    cp.step();
    // 4. B (openat2) imports exp1 (keeps it) and exp2 (closes it), and
    //    allocates 2 MiB of its own; we close our copies of both
    peer.call(P_IMPORT, 0, 0, 1, 0, &[exp1]);
    peer.call(P_IMPORT, 0, 2, 0, 0, &[exp2]);
    close(exp1);
    close(exp2);
    let (n, _, _) = peer.call(P_ALLOC, 0, 2, 0, 0, &[]);
    if n != 1 {
        die("the peer could not allocate 2 MiB");
    }
    cp.step();
    // 5. we free mA2: B's import takes the charge
    expect_ok("free mA2", env.free(ctl, c, d, ma2));
    cp.step();
    // 6. we free mA1 in our first client: our dup (older than B's) keeps it ours
    expect_ok("free mA1", env.free(ctl, c, d, ma1));
    cp.step();
    // 7. we close the second file: its client (with the dup) goes, B takes mA1
    close(ctl2);
    cp.step();
    // 8. B frees its import of mA2: only exp1 (B's copy) keeps it
    peer.call(P_FREE, 0, 1, 0, 0, &[]);
    cp.step();
    // 9. B closes exp1: mA2 is freed, from B
    peer.call(P_CLOSE_KEPT, 0, 0, 0, 0, &[]);
    cp.step();
    cp.emit();
    peer.stop();
}
