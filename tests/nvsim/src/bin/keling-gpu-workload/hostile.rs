//! The `hostile` scenario.
use super::*;

pub(crate) fn expect_errno(what: &str, r: Result<(), Errno>, want: Errno) {
    match r {
        Err(e) if e == want => {}
        other => die(&format!("{what}: expected errno {want}, got {other:?}")),
    }
}

pub(crate) fn expect_status(what: &str, got: u32, want: u32) {
    if got != want {
        die(&format!("{what}: expected status {want:#x}, got {got:#x}"));
    }
}

/// Bad pointers, wrong sizes, unknown escapes, foreign handles, a flood of
/// controls; then one valid 1 MiB allocation.
pub(crate) fn hostile(env: &Env, cp: &mut Checkpoints) {
    let ctl = env.open("nvidiactl", false);
    let gpu0 = env.open("nvidia0", false);
    let uvm_fd = env.open("nvidia-uvm", false);
    let (c, d) = env.session(ctl, 0);
    // Device params for the refused device allocations further down.
    let mut dp = vec![0u8; abi::size::NV0080_ALLOC];
    cp.step();

    // Bad pAllocParms: EFAULT.
    let bad = [
        0x10u64,
        0xdead_0000_0000,
        u64::MAX - 7,
        0x8000_0000_0000_0000,
    ];
    for (i, &p) in bad.iter().enumerate() {
        let nvos64 = i % 2 == 1;
        let len = match (nvos64, env.legacy) {
            (false, _) => 32,
            (true, false) => 48,
            (true, true) => 40,
        };
        let mut b = vec![0u8; len];
        put_u32(&mut b, 0, c);
        put_u32(&mut b, 4, d);
        put_u32(&mut b, 12, class::NV01_MEMORY_LOCAL_USER);
        put_u64(&mut b, 16, p);
        expect_errno(
            "bad pAllocParms",
            env.rm(ctl, esc::RM_ALLOC, &mut b, false),
            libc::EFAULT,
        );
        let mut b = vec![0u8; 32];
        put_u32(&mut b, 0, c);
        put_u32(&mut b, 4, c);
        put_u32(&mut b, 12, class::NV01_DEVICE_0);
        put_u64(&mut b, 16, p);
        expect_errno(
            "bad device params",
            env.rm(ctl, esc::RM_ALLOC, &mut b, false),
            libc::EFAULT,
        );
    }
    // Bad XFER ptr, oversize, nested, unknown inner escape.
    for (cmd, size, ptr, want) in [
        (esc::RM_ALLOC as u32, 32u32, 0x10u64, libc::EFAULT),
        (esc::RM_ALLOC as u32, 1 << 20, 0x10, libc::EINVAL),
        (esc::IOCTL_XFER_CMD as u32, 16, 0x10, libc::EFAULT),
        (0xC020_462B, 32, 0x10, libc::EFAULT),
    ] {
        let mut x = [0u8; 16];
        put_u32(&mut x, 0, cmd);
        put_u32(&mut x, 4, size);
        put_u64(&mut x, 8, ptr);
        expect_errno(
            "bad XFER",
            sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
            want,
        );
    }
    let mut inner = [0u8; 16];
    let mut x = [0u8; 16];
    put_u32(&mut x, 0, esc::IOCTL_XFER_CMD as u32);
    put_u32(&mut x, 4, 16);
    put_u64(&mut x, 8, inner.as_mut_ptr() as u64);
    expect_errno(
        "nested XFER",
        sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
        libc::EINVAL,
    );
    put_u32(&mut x, 0, 0x99);
    expect_errno(
        "XFER unknown",
        sys_ioctl(ctl, abi::iowr(esc::IOCTL_XFER_CMD, 16), x.as_mut_ptr()),
        libc::EINVAL,
    );
    // Bad UVM args and commands.
    for cmd in [
        uvm::INITIALIZE,
        uvm::FREE,
        uvm::CREATE_EXTERNAL_RANGE,
        uvm::REGISTER_GPU,
    ] {
        expect_errno(
            "bad UVM arg",
            sys_ioctl(uvm_fd, cmd, 0x10 as *mut u8),
            libc::EFAULT,
        );
    }
    let mut junk = [0u8; 64];
    expect_errno(
        "unknown UVM cmd",
        sys_ioctl(uvm_fd, 0x3000_0077, junk.as_mut_ptr()),
        libc::EINVAL,
    );
    expect_errno(
        "RM escape on uvm",
        sys_ioctl(uvm_fd, abi::iowr(esc::RM_ALLOC, 32), junk.as_mut_ptr()),
        libc::EINVAL,
    );
    // Wrong sizes in the command encoding, unknown escapes, wrong file.
    let mut big = vec![0u8; 256];
    let wrong_alloc = if env.legacy { 48 } else { 40 };
    for (nr, size) in [
        (esc::RM_ALLOC, wrong_alloc),
        (esc::RM_ALLOC, 8),
        (esc::RM_FREE, 8),
        (esc::RM_CONTROL, 0),
        (esc::RM_VID_HEAP_CONTROL, 180),
        (esc::IOCTL_XFER_CMD, 24),
        (0x99, 32),
        (0x01, 16),
        (0xFF, 8),
        (esc::RM_ALLOC_MEMORY, 56),
    ] {
        expect_errno(
            "malformed escape",
            sys_ioctl(ctl, abi::iowr(nr, size), big.as_mut_ptr()),
            libc::EINVAL,
        );
    }
    expect_errno(
        "RM_ALLOC on nvidia0",
        sys_ioctl(gpu0, abi::iowr(esc::RM_ALLOC, 32), big.as_mut_ptr()),
        libc::EINVAL,
    );
    // _IOC_DIR NONE with a bad arg: the driver reads at arg and faults.
    expect_errno(
        "dir NONE bad arg",
        sys_ioctl(ctl, 0x0020_462B, 0x10 as *mut u8),
        libc::EFAULT,
    );
    // Bad handles: statuses, not errnos.
    expect_status(
        "free unknown",
        env.free(ctl, c, d, 0x0bad_0bad),
        status::NV_ERR_OBJECT_NOT_FOUND,
    );
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            0x0bad_0bad,
            0,
            class::NV20_SUBDEVICE_0,
            None,
        ),
    );
    expect_status("unknown parent", st, status::NV_ERR_INVALID_OBJECT_PARENT);
    let (st, _) = ok_or_die("alloc", env.alloc(ctl, false, false, c, d, 0, 0xBEEF, None));
    expect_status("unknown class", st, status::NV_ERR_INVALID_CLASS);
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c,
            c,
            d,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_status("duplicate", st, status::NV_ERR_INSERT_DUPLICATE_NAME);
    let other = env.open("nvidiactl", false);
    let c2 = env.root_client(other, "client2");
    let (st, _) = ok_or_die(
        "alloc",
        env.alloc(
            ctl,
            false,
            false,
            c2,
            c2,
            0,
            class::NV01_DEVICE_0,
            Some(&mut dp),
        ),
    );
    expect_status("foreign client", st, status::NV_ERR_INVALID_CLIENT);
    close(other);
    let mut gp = vec![0u8; abi::size::MEMORY_ALLOCATION_PARAMS];
    put_u64(&mut gp, 64, MIB);
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
            None,
        ),
    );
    expect_status("null params", st, status::NV_ERR_INVALID_ARGUMENT);
    cp.step();
    // A flood of controls.
    for i in 0..10_000u32 {
        let obj = if i % 2 == 0 { c } else { d };
        // NV2080 commands with no params sent to the client and the device:
        // the driver refuses each, for its size (a command it knows) or for
        // not being in those classes' tables.
        let st = env.control(ctl, c, obj, 0x2080_0001 + (i & 0xffff), None);
        if st != status::NV_ERR_NOT_SUPPORTED && st != status::NV_ERR_INVALID_ARGUMENT {
            die(&format!("control flood: status {st:#x}"));
        }
        if i % 1000 == 999 {
            cp.step();
        }
    }
    // Finally a valid 1 MiB allocation (kept until exit).
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
            Some(&mut gp),
        ),
    );
    expect_ok("valid alloc", st);
    if u64_at(&gp, 64) < MIB {
        die("size not written back");
    }
    cp.step();
    cp.emit();
}
