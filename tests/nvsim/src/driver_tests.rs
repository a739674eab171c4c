//! Byte-level tests of the driver state machine. Requests are built with the
//! offsets of docs/nvidia-abi.md written out as literals here (not with the
//! constants of `abi.rs`), so a wrong constant there is caught.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Fake caller memory: disjoint regions at fixed addresses.
#[derive(Default)]
struct FakeMem {
    regions: RefCell<BTreeMap<u64, Vec<u8>>>,
    next: RefCell<u64>,
}

impl FakeMem {
    fn new() -> Self {
        FakeMem {
            regions: RefCell::default(),
            next: RefCell::new(0x7f00_0000_0000),
        }
    }
    /// Places `data` in the fake address space; returns its address.
    fn place(&self, data: &[u8]) -> u64 {
        let mut n = self.next.borrow_mut();
        let addr = *n;
        *n += 0x10000;
        self.regions.borrow_mut().insert(addr, data.to_vec());
        addr
    }
    fn get(&self, addr: u64) -> Vec<u8> {
        self.regions.borrow()[&addr].clone()
    }
}

impl UserMem for FakeMem {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let r = self.regions.borrow();
        let (base, v) = r.range(..=addr).next_back()?;
        let off = (addr - base) as usize;
        v.get(off..off.checked_add(len)?).map(|s| s.to_vec())
    }
    fn write(&self, addr: u64, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        let mut r = self.regions.borrow_mut();
        let Some((base, v)) = r.range_mut(..=addr).next_back() else {
            return false;
        };
        let off = (addr - *base) as usize;
        match v.get_mut(off..off + data.len()) {
            Some(s) => {
                s.copy_from_slice(data);
                true
            }
            None => false,
        }
    }
}

fn r32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn r64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
fn w32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn w64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// `_IOWR('F', nr, size)` spelled out.
fn iowr(nr: u32, size: u32) -> u32 {
    0xC000_0000 | (size << 16) | 0x4600 | nr
}

const CTL_FH: u64 = 10;
const GPU0_FH: u64 = 11;
const GPU1_FH: u64 = 12;
const UVM_FH: u64 = 13;
const PID: u32 = 4242;

fn drv(gpus: u32, mem: u64, version: &str) -> Driver {
    Driver::new(Config {
        gpus,
        mem_per_gpu: mem,
        driver_version: version.into(),
    })
}

fn kind(fh: u64) -> FileKind {
    match fh {
        GPU0_FH => FileKind::Gpu(0),
        GPU1_FH => FileKind::Gpu(1),
        UVM_FH => FileKind::Uvm,
        _ => FileKind::Ctl,
    }
}

/// An `_IOWR` ioctl the way FUSE delivers it: params copied in and out.
fn call(d: &mut Driver, m: &FakeMem, fh: u64, pid: u32, cmd: u32, p: &mut [u8]) -> Result<(), i32> {
    let out = d.ioctl(fh, kind(fh), pid, cmd, 0, p, p.len(), m)?;
    assert_eq!(
        out.len(),
        p.len(),
        "an _IOWR escape copies the whole struct back"
    );
    p.copy_from_slice(&out);
    Ok(())
}

/// NVOS21 (>= 535): hRoot@0 hObjectParent@4 hObjectNew@8 hClass@12
/// pAllocParms@16 paramsSize@24 status@28.
fn nvos21(root: u32, parent: u32, new: u32, class: u32, params: u64, psize: u32) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    w32(&mut b, 0, root);
    w32(&mut b, 4, parent);
    w32(&mut b, 8, new);
    w32(&mut b, 12, class);
    w64(&mut b, 16, params);
    w32(&mut b, 24, psize);
    w32(&mut b, 28, 0xffff_ffff); // status is output only
    b
}

/// RM_ALLOC via NVOS21; returns (status, handle).
#[allow(clippy::too_many_arguments)]
fn alloc21(
    d: &mut Driver,
    m: &FakeMem,
    fh: u64,
    pid: u32,
    root: u32,
    parent: u32,
    new: u32,
    class: u32,
    params: u64,
    psize: u32,
) -> (u32, u32) {
    let mut b = nvos21(root, parent, new, class, params, psize);
    call(d, m, fh, pid, 0xC020_462B, &mut b).expect("RM_ALLOC ioctl succeeds");
    (r32(&b, 28), r32(&b, 8))
}

fn client(d: &mut Driver, m: &FakeMem, fh: u64, pid: u32, new: u32) -> u32 {
    let (st, h) = alloc21(d, m, fh, pid, 0, 0, new, 0x41, 0, 0);
    assert_eq!(st, 0);
    h
}

/// NV0080_ALLOC_PARAMETERS (56 bytes) with deviceId@0.
fn device(
    d: &mut Driver,
    m: &FakeMem,
    fh: u64,
    pid: u32,
    cl: u32,
    new: u32,
    gpu: u32,
) -> (u32, u32) {
    let mut p = vec![0u8; 56];
    w32(&mut p, 0, gpu);
    let a = m.place(&p);
    alloc21(d, m, fh, pid, cl, cl, new, 0x80, a, 56)
}

/// NV_MEMORY_ALLOCATION_PARAMS (128 bytes), size@64. Returns (status, handle,
/// size read back at @64 of the caller's struct).
#[allow(clippy::too_many_arguments)]
fn memalloc(
    d: &mut Driver,
    m: &FakeMem,
    fh: u64,
    pid: u32,
    cl: u32,
    parent: u32,
    new: u32,
    class: u32,
    size: u64,
) -> (u32, u32, u64) {
    let mut p = vec![0u8; 128];
    w64(&mut p, 64, size);
    let a = m.place(&p);
    let (st, h) = alloc21(d, m, fh, pid, cl, parent, new, class, a, 128);
    (st, h, r64(&m.get(a), 64))
}

/// NVOS00: hRoot@0 hObjectParent@4 hObjectOld@8 status@12.
fn free(d: &mut Driver, m: &FakeMem, fh: u64, root: u32, parent: u32, old: u32) -> u32 {
    let mut b = vec![0u8; 16];
    w32(&mut b, 0, root);
    w32(&mut b, 4, parent);
    w32(&mut b, 8, old);
    call(d, m, fh, PID, 0xC010_4629, &mut b).unwrap();
    r32(&b, 12)
}

fn setup(d: &mut Driver, m: &FakeMem, gpu: u32) -> (u32, u32) {
    let cl = client(d, m, CTL_FH, PID, 0);
    let (st, dev) = device(d, m, CTL_FH, PID, cl, 0xd0, gpu);
    assert_eq!(st, 0);
    (cl, dev)
}

#[test]
fn command_encoding_matches_abi_table() {
    assert_eq!(abi::iowr(0x2B, 32), 0xC020_462B);
    assert_eq!(abi::iowr(0x2B, 48), 0xC030_462B);
    assert_eq!(abi::iowr(0x27, 56), 0xC038_4627);
    assert_eq!(abi::iowr(0x29, 16), 0xC010_4629);
    assert_eq!(abi::iowr(0x2A, 32), 0xC020_462A);
    assert_eq!(abi::iowr(0x4A, 184), 0xC0B8_464A);
    assert_eq!(abi::iowr(0x4E, 56), 0xC038_464E);
    assert_eq!(abi::iowr(0x4F, 32), 0xC020_464F);
    assert_eq!(abi::iowr(0x34, 28), 0xC01C_4634);
    assert_eq!(abi::iowr(0x35, 24), 0xC018_4635);
    assert_eq!(abi::iowr(0x54, 56), 0xC038_4654);
    assert_eq!(abi::iowr(0x57, 64), 0xC040_4657);
    assert_eq!(abi::iowr(0x58, 48), 0xC030_4658);
    assert_eq!(abi::iowr(201, 4), 0xC004_46C9);
    assert_eq!(iowr(0x2B, 32), abi::iowr(0x2B, 32));
}

#[test]
fn client_handles_driver_picked_and_chosen() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0, 0x41, 0, 0);
    assert_eq!(
        (st, h),
        (0, 0xc1d0_0000),
        "hObjectNew 0: driver picks and writes it back @8"
    );
    let (st, h2) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0xcafe_0001, 0x41, 0, 0);
    assert_eq!((st, h2), (0, 0xcafe_0001), "chosen handle kept");
    // NV01_ROOT 0x0 and NV01_ROOT_NON_PRIV 0x1 are clients too
    let (st, h3) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0, 0x0, 0, 0);
    assert_eq!(st, 0);
    assert_eq!(h3, 0xc1d0_0001);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0x77, 0x1, 0, 0);
    assert_eq!(st, 0);
    // objects: driver-picked handles are unique across everything
    let (st, dev) = device(&mut d, &m, CTL_FH, PID, h, 0, 0);
    assert_eq!(st, 0);
    assert_eq!(dev, 0xc1d0_0002);
    let (st, sub) = alloc21(&mut d, &m, CTL_FH, PID, h, dev, 0x5b, 0x2080, 0, 0);
    assert_eq!((st, sub), (0, 0x5b));
    assert_eq!(d.object_class(h, 0x5b), Some(0x2080));
}

#[test]
fn duplicate_handles() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let cl = client(&mut d, &m, CTL_FH, PID, 0x1000);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0x1000, 0x41, 0, 0);
    assert_eq!(
        st, 0x19,
        "NV_ERR_INSERT_DUPLICATE_NAME for a used client handle"
    );
    let (st, _) = device(&mut d, &m, CTL_FH, PID, cl, 0x2000, 0);
    assert_eq!(st, 0);
    let (st, _) = device(&mut d, &m, CTL_FH, PID, cl, 0x2000, 1);
    assert_eq!(st, 0x19);
    let (st, _) = device(&mut d, &m, CTL_FH, PID, cl, 0x1000, 1);
    assert_eq!(st, 0x19, "an object may not reuse its client's handle");
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, 0x2000, 0x2000, 0x40, MIB);
    assert_eq!(st, 0x19);
    assert_eq!(d.gpu_used(0), 0, "nothing allocated on a failed alloc");
    // a driver-picked handle skips a handle a client chose
    let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0xc1d0_0000, 0x41, 0, 0);
    assert_eq!((st, h), (0, 0xc1d0_0000));
    let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, 0, 0, 0, 0x41, 0, 0);
    assert_eq!((st, h), (0, 0xc1d0_0001));
}

#[test]
fn device_params_and_parents() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let cl = client(&mut d, &m, CTL_FH, PID, 0);
    let (st, _) = device(&mut d, &m, CTL_FH, PID, cl, 0x10, 2);
    assert_eq!(st, 0x1F, "deviceId out of range: NV_ERR_INVALID_ARGUMENT");
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, cl, 0x10, 0x80, 0, 0);
    assert_eq!(st, 0x1F, "device needs its params");
    let (st, dev) = device(&mut d, &m, CTL_FH, PID, cl, 0x10, 1);
    assert_eq!((st, dev), (0, 0x10));
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, 0x999, 0, 0x2080, 0, 0);
    assert_eq!(st, 0x36, "unknown parent: NV_ERR_INVALID_OBJECT_PARENT");
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, cl, 0, 0x2080, 0, 0);
    assert_eq!(st, 0x36, "subdevice under the client");
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, cl, 0, 0x40, 0, 0);
    assert_eq!(st, 0x36, "memory needs a device ancestor");
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, 0x10, 0, 0x1234, 0, 0);
    assert_eq!(st, 0x22, "unknown class: NV_ERR_INVALID_CLASS");
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, 0xdead, 0x10, 0, 0x2080, 0, 0);
    assert_eq!(st, 0x23, "unknown client: NV_ERR_INVALID_CLIENT");
    // the whole Hopper object tree
    let (st, vas) = alloc21(&mut d, &m, CTL_FH, PID, cl, 0x10, 0, 0x90F1, 0, 0);
    assert_eq!(st, 0);
    let (st, tsg) = alloc21(&mut d, &m, CTL_FH, PID, cl, 0x10, 0, 0xA06C, 0, 0);
    assert_eq!(st, 0);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, tsg, 0, 0x9067, 0, 0);
    assert_eq!(st, 0);
    let (st, ch) = alloc21(&mut d, &m, CTL_FH, PID, cl, tsg, 0, 0xC86F, 0, 0);
    assert_eq!(st, 0);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, ch, 0, 0xCBC0, 0, 0);
    assert_eq!(st, 0);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, ch, 0, 0xC8B5, 0, 0);
    assert_eq!(st, 0);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, 0x10, 0, 0x50A0, 0, 0);
    assert_eq!(st, 0);
    assert_ne!(vas, 0);
    assert_eq!(d.client_objects(cl), Some(8));
    assert_eq!(d.gpu_used(1), 0, "no object above holds bytes");
}

#[test]
fn rounding_and_write_back() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 1);
    let (st, _, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 3 * MIB);
    assert_eq!(
        (st, real),
        (0, 4 * MIB),
        "video rounds up to 2 MiB, written back @64"
    );
    let (st, _, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 2 * MIB);
    assert_eq!((st, real), (0, 2 * MIB), "exact multiple unchanged");
    let (st, _, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x3E, 5000);
    assert_eq!((st, real), (0, 8192), "host memory rounds to 4 KiB");
    let (st, _, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 0);
    assert_eq!((st, real), (0x1F, 0), "size 0 is invalid and not written");
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, u64::MAX);
    assert_eq!(st, 0x1F);
    assert_eq!(d.gpu_used(1), 6 * MIB);
    assert_eq!(d.gpu_host(1), 8192);
    assert_eq!(d.gpu_used(0), 0);
    let pg = d.proc_gpu(PID, 1).unwrap();
    assert_eq!(
        (pg.bytes, pg.host_bytes, pg.allocs, pg.frees),
        (6 * MIB, 8192, 3, 0)
    );
    // the rest of the 128-byte struct is untouched
    let mut p = vec![0xABu8; 128];
    w64(&mut p, 64, 1);
    let a = m.place(&p);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, a, 128);
    assert_eq!(st, 0);
    let back = m.get(a);
    assert_eq!(r64(&back, 64), 2 * MIB);
    assert!(back[..64].iter().chain(&back[72..]).all(|&x| x == 0xAB));
    // memory under a subdevice counts against the device's GPU
    let (st, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x2080, 0, 0);
    assert_eq!(st, 0);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0x40, MIB);
    assert_eq!(st, 0);
    assert_eq!(d.gpu_used(1), 10 * MIB);
}

#[test]
fn capacity_and_no_memory() {
    let m = FakeMem::new();
    let mut d = drv(2, 10 * MIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (st, h1, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 7 * MIB);
    assert_eq!(st, 0);
    let (st, _, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0x77, 0x40, 3 * MIB);
    assert_eq!(st, 0x51, "8 + 4 MiB > 10 MiB: NV_ERR_NO_MEMORY");
    assert_eq!(real, 3 * MIB, "size not written back on failure");
    assert_eq!(d.object_class(cl, 0x77), None);
    assert_eq!(d.gpu_used(0), 8 * MIB);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 2 * MIB);
    assert_eq!(st, 0, "exactly full is fine");
    assert_eq!(d.gpu_used(0), 10 * MIB);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x3E, 64 * MIB);
    assert_eq!(st, 0, "host memory does not count against the GPU");
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!((pg.allocs, pg.frees), (3, 0));
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, h1), 0);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 7 * MIB);
    assert_eq!(st, 0, "room again after a free");
}

/// Found by `cargo xtask fuzz --target nvsim_ioctl`: sizes whose sum passes
/// u64 overflowed the GPU's totals (a panic with overflow checks, wrapped
/// totals without). They are refused with NV_ERR_NO_MEMORY.
#[test]
fn sizes_past_a_u64_in_total_are_refused() {
    let m = FakeMem::new();
    let mut d = drv(1, 10 * MIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, MIB);
    assert_eq!(st, 0);
    let huge = !(64 * MIB - 1);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0x77, 0x40, huge);
    assert_eq!(st, 0x51, "video: 1 MiB + almost 2^64 is past the capacity");
    assert_eq!(d.gpu_used(0), 2 * MIB);
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x3E, 1 << 63);
    assert_eq!(st, 0, "host memory does not count against the GPU");
    let (st, _, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0x78, 0x3E, 1 << 63);
    assert_eq!(st, 0x51, "host: 2^63 twice is past a u64");
    assert_eq!(d.object_class(cl, 0x78), None);
}

#[test]
fn subtree_and_client_free() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (_, dev1) = device(&mut d, &m, CTL_FH, PID, cl, 0xd1, 1);
    let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x2080, 0, 0);
    let (st, m1, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 4 * MIB);
    assert_eq!(st, 0);
    memalloc(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0x40, 6 * MIB);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev1, 0, 0x40, 2 * MIB);
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, m1), 0);
    assert_eq!(
        free(&mut d, &m, CTL_FH, cl, dev, m1),
        0x57,
        "gone: NV_ERR_OBJECT_NOT_FOUND"
    );
    assert_eq!(d.gpu_used(0), 6 * MIB);
    // freeing the device frees the subdevice and the memory under it
    assert_eq!(free(&mut d, &m, CTL_FH, cl, cl, dev), 0);
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(d.object_class(cl, sub), None);
    assert_eq!(d.client_objects(cl), Some(2), "dev1 + its memory remain");
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!(
        (pg.bytes, pg.peak_bytes, pg.allocs, pg.frees),
        (0, 10 * MIB, 2, 2)
    );
    // hObjectOld == hRoot frees the client and everything under it
    assert_eq!(free(&mut d, &m, CTL_FH, cl, 0, cl), 0);
    assert!(!d.has_client(cl));
    assert_eq!(d.gpu_used(1), 0);
    assert_eq!(d.proc_gpu(PID, 1).unwrap().frees, 1);
    assert_eq!(free(&mut d, &m, CTL_FH, cl, 0, cl), 0x23, "client gone");
}

#[test]
fn release_tears_down_only_that_file() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let other_fh = 99;
    let (cl, dev) = setup(&mut d, &m, 0);
    let cl2 = client(&mut d, &m, CTL_FH, PID, 0);
    let (_, dev2) = device(&mut d, &m, CTL_FH, PID, cl2, 0, 0);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 4 * MIB);
    memalloc(&mut d, &m, CTL_FH, PID, cl2, dev2, 0, 0x40, 4 * MIB);
    let cl3 = client(&mut d, &m, other_fh, 77, 0);
    let (_, dev3) = device(&mut d, &m, other_fh, 77, cl3, 0, 0);
    memalloc(&mut d, &m, other_fh, 77, cl3, dev3, 0, 0x40, 2 * MIB);
    // a client is only usable through the file it was created on
    let (st, _, _) = memalloc(&mut d, &m, other_fh, 77, cl, dev, 0, 0x40, 2 * MIB);
    assert_eq!(st, 0x23, "foreign client: NV_ERR_INVALID_CLIENT");
    assert_eq!(free(&mut d, &m, other_fh, cl, 0, cl), 0x23);
    assert_eq!(d.gpu_used(0), 10 * MIB);
    d.release(CTL_FH);
    assert!(!d.has_client(cl) && !d.has_client(cl2) && d.has_client(cl3));
    assert_eq!(d.gpu_used(0), 2 * MIB);
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!(
        (pg.bytes, pg.peak_bytes, pg.allocs, pg.frees),
        (0, 8 * MIB, 2, 2)
    );
    d.release(other_fh);
    assert_eq!(d.gpu_used(0), 0);
    let s = d.state();
    assert!(s.clients.is_empty());
    assert_eq!(s.processes.len(), 2, "processes stay in the list");
}

#[test]
fn attribution_follows_the_allocating_pid() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let parent = 100;
    let child = 200;
    // parent creates the client; a forked child allocates through the same file
    let cl = client(&mut d, &m, CTL_FH, parent, 0);
    let (_, dev) = device(&mut d, &m, CTL_FH, parent, cl, 0, 1);
    memalloc(&mut d, &m, CTL_FH, parent, cl, dev, 0, 0x40, 2 * MIB);
    let (st, cm, _) = memalloc(&mut d, &m, CTL_FH, child, cl, dev, 0, 0x40, 6 * MIB);
    assert_eq!(st, 0);
    memalloc(&mut d, &m, CTL_FH, child, cl, dev, 0, 0x40, 2 * MIB);
    assert_eq!(d.proc_gpu(child, 1).unwrap().bytes, 8 * MIB);
    assert_eq!(d.proc_gpu(parent, 1).unwrap().bytes, 2 * MIB);
    // the parent frees one of the child's allocations: still the child's bytes
    let mut b = vec![0u8; 16];
    w32(&mut b, 0, cl);
    w32(&mut b, 8, cm);
    call(&mut d, &m, CTL_FH, parent, 0xC010_4629, &mut b).unwrap();
    assert_eq!(r32(&b, 12), 0);
    let c = d.proc_gpu(child, 1).unwrap();
    assert_eq!(
        (c.bytes, c.peak_bytes, c.allocs, c.frees),
        (2 * MIB, 8 * MIB, 2, 1)
    );
    assert_eq!(d.proc_gpu(parent, 1).unwrap().frees, 0);
    // the child has exited; the parent's last close tears everything down
    d.release(CTL_FH);
    let c = d.proc_gpu(child, 1).unwrap();
    assert_eq!(
        (c.bytes, c.peak_bytes, c.allocs, c.frees),
        (0, 8 * MIB, 2, 2)
    );
    let p = d.proc_gpu(parent, 1).unwrap();
    assert_eq!(
        (p.bytes, p.peak_bytes, p.allocs, p.frees),
        (0, 2 * MIB, 1, 1)
    );
    assert_eq!(d.proc_gpu(parent, 0), None);
}

#[test]
fn peak_tracking() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (_, a, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 10 * MIB);
    let (_, b, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 20 * MIB);
    free(&mut d, &m, CTL_FH, cl, dev, a);
    free(&mut d, &m, CTL_FH, cl, dev, b);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 16 * MIB);
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!((pg.bytes, pg.peak_bytes), (16 * MIB, 30 * MIB));
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 16 * MIB);
    assert_eq!(d.proc_gpu(PID, 0).unwrap().peak_bytes, 32 * MIB);
}

#[test]
fn legacy_nvos21_and_nvos64_layouts() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "530.30.02");
    assert!(d.legacy_layouts());
    // pre-535 NVOS21: pAllocParms@16, status@24, no paramsSize
    let mut b = vec![0u8; 32];
    w32(&mut b, 12, 0x41);
    w32(&mut b, 24, 0xffff_ffff);
    w32(&mut b, 28, 0x5555_5555);
    call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b).unwrap();
    assert_eq!(r32(&b, 24), 0, "legacy status @24");
    assert_eq!(r32(&b, 28), 0x5555_5555, "bytes 28..32 untouched");
    let cl = r32(&b, 8);
    assert_eq!(cl, 0xc1d0_0000);
    let mut dp = vec![0u8; 56];
    w32(&mut dp, 0, 0);
    let dpa = m.place(&dp);
    let mut b = vec![0u8; 32];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, cl);
    w32(&mut b, 8, 0xd0);
    w32(&mut b, 12, 0x80);
    w64(&mut b, 16, dpa);
    w32(&mut b, 24, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b).unwrap();
    assert_eq!(r32(&b, 24), 0);
    // pre-535 NVOS64 is 40 bytes: pRightsRequested@24 flags@32 status@36
    let mut mp = vec![0u8; 128];
    w64(&mut mp, 64, 5 * MIB);
    let mpa = m.place(&mp);
    let mut b = vec![0u8; 40];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, 0xd0);
    w32(&mut b, 12, 0x40);
    w64(&mut b, 16, mpa);
    w32(&mut b, 36, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC028_462B, &mut b).unwrap();
    assert_eq!(r32(&b, 36), 0);
    assert_ne!(r32(&b, 8), 0);
    assert_eq!(r64(&m.get(mpa), 64), 6 * MIB);
    // the 48-byte NVOS64 does not exist before 535
    let mut b = vec![0u8; 48];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC030_462B, &mut b),
        Err(libc::EINVAL)
    );
    assert_eq!(d.gpu_used(0), 6 * MIB);
}

#[test]
fn nvos64_layout() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 1);
    let mut mp = vec![0u8; 128];
    w64(&mut mp, 64, 1000);
    let mpa = m.place(&mp);
    // NVOS64: ..pAllocParms@16 pRightsRequested@24 paramsSize@32 flags@36 status@40
    let mut b = vec![0u8; 48];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 8, 0);
    w32(&mut b, 12, 0x40);
    w64(&mut b, 16, mpa);
    w32(&mut b, 32, 128);
    w32(&mut b, 40, 0xffff_ffff);
    w32(&mut b, 44, 0x1234_5678);
    call(&mut d, &m, CTL_FH, PID, 0xC030_462B, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0, "status @40");
    assert_eq!(r32(&b, 44), 0x1234_5678, "padding untouched");
    let h = r32(&b, 8);
    assert_ne!(h, 0);
    assert_eq!(r64(&m.get(mpa), 64), 2 * MIB);
    assert_eq!(d.gpu_used(1), 2 * MIB);
    // FINN-serialized params (flags & 1) are not decoded
    w32(&mut b, 8, 0);
    w32(&mut b, 36, 1);
    call(&mut d, &m, CTL_FH, PID, 0xC030_462B, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0x56);
    // the 40-byte layout is gone from 535 on
    let mut b = vec![0u8; 40];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC028_462B, &mut b),
        Err(libc::EINVAL)
    );
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, h), 0);
}

#[test]
fn xfer_wraps_an_escape() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let mut mp = vec![0u8; 128];
    w64(&mut mp, 64, 3 * MIB);
    let mpa = m.place(&mp);
    let inner = nvos21(cl, dev, 0, 0x40, mpa, 128);
    let ia = m.place(&inner);
    // XFER: {u32 cmd@0; u32 size@4; u64 ptr@8}, cmd = the escape's nr
    let mut x = vec![0u8; 16];
    w32(&mut x, 0, 0x2B);
    w32(&mut x, 4, 32);
    w64(&mut x, 8, ia);
    let before = x.clone();
    call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x).unwrap();
    assert_eq!(x, before, "the XFER struct itself comes back unchanged");
    let back = m.get(ia);
    assert_eq!(r32(&back, 28), 0, "inner status written at ptr");
    let h = r32(&back, 8);
    assert_ne!(h, 0, "inner handle written at ptr");
    assert_eq!(r64(&m.get(mpa), 64), 4 * MIB);
    assert_eq!(d.gpu_used(0), 4 * MIB);
    // XFER of RM_FREE
    let mut f = vec![0u8; 16];
    w32(&mut f, 0, cl);
    w32(&mut f, 8, h);
    let fa = m.place(&f);
    let mut x = vec![0u8; 16];
    w32(&mut x, 0, 0x29);
    w32(&mut x, 4, 16);
    w64(&mut x, 8, fa);
    call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x).unwrap();
    assert_eq!(r32(&m.get(fa), 12), 0);
    assert_eq!(d.gpu_used(0), 0);
    // bad ptr: EFAULT; size mismatch of the inner escape: EINVAL; nesting: EINVAL
    w32(&mut x, 0, 0x2B);
    w32(&mut x, 4, 32);
    w64(&mut x, 8, 0x10);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x),
        Err(libc::EFAULT)
    );
    w64(&mut x, 8, ia);
    w32(&mut x, 4, 24);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x),
        Err(libc::EINVAL)
    );
    w32(&mut x, 0, 211);
    w32(&mut x, 4, 16);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x),
        Err(libc::EINVAL)
    );
    w32(&mut x, 0, 0xC020_462B);
    w32(&mut x, 4, 32);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC010_46D3, &mut x),
        Err(libc::EINVAL),
        "cmd is a nr, not a full command"
    );
    // the XFER struct must be exactly 16 bytes
    let mut x24 = vec![0u8; 24];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC018_46D3, &mut x24),
        Err(libc::EINVAL)
    );
}

#[test]
fn bad_pointers_fault_and_change_nothing() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let objs = d.client_objects(cl);
    let mut b = nvos21(cl, dev, 0, 0x40, 0xdead_0000, 128);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT)
    );
    let mut b = nvos21(cl, cl, 0, 0x80, 0x8, 56);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT)
    );
    // a struct that ends early is unreadable too
    let short = m.place(&[0u8; 100]);
    let mut b = nvos21(cl, dev, 0, 0x40, short, 128);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT)
    );
    // null params for memory: a status, not a fault
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 0, 0);
    assert_eq!(st, 0x1F);
    assert_eq!(d.client_objects(cl), objs);
    assert_eq!(d.gpu_used(0), 0);
    assert!(d.proc_gpu(PID, 0).is_none());
}

#[test]
fn malformed_requests_are_einval() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, _) = setup(&mut d, &m, 0);
    let mut b = vec![0u8; 36];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, iowr(0x2B, 36), &mut b),
        Err(libc::EINVAL)
    );
    let mut b = vec![0u8; 8];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, iowr(0x29, 8), &mut b),
        Err(libc::EINVAL)
    );
    let mut b = vec![0u8; 32];
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, iowr(0x99, 32), &mut b),
        Err(libc::EINVAL),
        "unknown escape"
    );
    // RM_ALLOC only on nvidiactl; RM_ALLOC_MEMORY only on nvidiaN
    let mut b = nvos21(0, 0, 0, 0x41, 0, 0);
    assert_eq!(
        call(&mut d, &m, GPU0_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EINVAL)
    );
    let mut b = vec![0u8; 56];
    w32(&mut b, 0, cl);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC038_4627, &mut b),
        Err(libc::EINVAL)
    );
    let s = d.state();
    assert_eq!(s.ioctls.total, 2 + 5);
    assert_eq!(s.ioctls.failed, 5);
}

#[test]
fn rm_alloc_memory_on_nvidia_n() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    // NVOS02 + fd: hRoot@0 hObjectParent@4 hObjectNew@8 hClass@12 flags@16
    // pMemory@24 limit@32 status@40 fd@48
    let mut b = vec![0u8; 56];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 8, 0);
    w32(&mut b, 12, 0x71);
    w64(&mut b, 24, 0x7000_0000);
    w64(&mut b, 32, 10_000 - 1);
    w32(&mut b, 40, 0xffff_ffff);
    w32(&mut b, 48, 7);
    call(&mut d, &m, GPU1_FH, PID, 0xC038_4627, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0);
    let h = r32(&b, 8);
    assert_ne!(h, 0);
    assert_eq!(r64(&b, 32), 10_000 - 1, "limit left as it was");
    assert_eq!(r32(&b, 48), 7, "fd untouched");
    assert_eq!(
        d.gpu_host(1),
        10_000,
        "limit + 1 bytes, attributed to the GPU of the nvidiaN file"
    );
    assert_eq!(d.gpu_host(0), 0);
    assert_eq!(d.proc_gpu(PID, 1).unwrap().host_bytes, 10_000);
    // class 0x3E works too, limit not written back; 0x50A0 is not accepted here
    w32(&mut b, 8, 0);
    w32(&mut b, 12, 0x3E);
    w64(&mut b, 32, 4095);
    call(&mut d, &m, GPU0_FH, PID, 0xC038_4627, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0);
    assert_eq!(r64(&b, 32), 4095);
    assert_eq!(d.gpu_host(0), 4096);
    w32(&mut b, 8, 0);
    w32(&mut b, 12, 0x50A0);
    call(&mut d, &m, GPU0_FH, PID, 0xC038_4627, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0x22);
    // freed by RM_FREE on nvidiactl
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, h), 0);
    assert_eq!(d.gpu_host(1), 0);
    let pg = d.proc_gpu(PID, 1).unwrap();
    assert_eq!((pg.host_bytes, pg.allocs, pg.frees), (0, 1, 1));
    // class 0x71 via RM_ALLOC: limit@24 + 1 bytes, as written (no rounding)
    let mut op = vec![0u8; 40];
    w64(&mut op, 16, 0x7000_0000);
    w64(&mut op, 24, 8190);
    let opa = m.place(&op);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x71, opa, 40);
    assert_eq!(st, 0);
    assert_eq!(d.gpu_host(0), 4096 + 8191);
}

#[test]
fn vid_heap_control() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 1);
    // NVOS32: hRoot@0 hObjectParent@4 function@8 status@20 total@24 free@32
    // owner@40 hMemory@44 type@48 flags@52 size@88
    let mut b = vec![0u8; 184];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 8, 2);
    w32(&mut b, 20, 0xffff_ffff);
    w32(&mut b, 44, 0);
    w64(&mut b, 88, 5 * MIB + 1);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!(r32(&b, 20), 0);
    let h = r32(&b, 44);
    assert_ne!(h, 0, "hMemory 0: driver picks");
    assert_eq!(r64(&b, 88), 6 * MIB, "size rounded and written back");
    assert_eq!(r64(&b, 24), 80 * GIB);
    assert_eq!(r64(&b, 32), 80 * GIB - 6 * MIB);
    assert_eq!(d.gpu_used(1), 6 * MIB);
    assert_eq!(d.object_class(cl, h), Some(0x40));
    // chosen handle, then FREE (function 3, hMemory@44)
    w32(&mut b, 44, 0x4d);
    w64(&mut b, 88, 2 * MIB);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!((r32(&b, 20), r32(&b, 44)), (0, 0x4d));
    let mut f = vec![0u8; 184];
    w32(&mut f, 0, cl);
    w32(&mut f, 4, dev);
    w32(&mut f, 8, 3);
    w32(&mut f, 44, h);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut f).unwrap();
    assert_eq!(r32(&f, 20), 0);
    assert_eq!(d.gpu_used(1), 2 * MIB);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut f).unwrap();
    assert_eq!(r32(&f, 20), 0x57);
    // too big
    w32(&mut b, 44, 0);
    w64(&mut b, 88, 80 * GIB);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!(r32(&b, 20), 0x51);
    let pg = d.proc_gpu(PID, 1).unwrap();
    assert_eq!(
        (pg.bytes, pg.peak_bytes, pg.allocs, pg.frees),
        (2 * MIB, 8 * MIB, 2, 1)
    );
}

#[test]
fn control_map_dup_share() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, MIB);
    // NVOS54: hClient@0 hObject@4 cmd@8 flags@12 params@16 paramsSize@24 status@28
    let mut c = vec![0u8; 32];
    w32(&mut c, 0, cl);
    w32(&mut c, 4, dev);
    // A command no driver defines (category 0xff of NV2080): the driver's
    // own refusal, never a silent success with the buffer untouched.
    w32(&mut c, 8, 0x2080_ff7e);
    w32(&mut c, 28, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC020_462A, &mut c).unwrap();
    assert_eq!(r32(&c, 28), 0x56, "unknown cmd: NV_ERR_NOT_SUPPORTED");
    w32(&mut c, 4, 0x4040);
    call(&mut d, &m, CTL_FH, PID, 0xC020_462A, &mut c).unwrap();
    assert_eq!(
        r32(&c, 28),
        0x33,
        "unknown object: NV_ERR_INVALID_OBJECT_HANDLE"
    );
    // NVOS33 + fd: hClient@0 hDevice@4 hMemory@8 status@40
    let mut mm = vec![0u8; 56];
    w32(&mut mm, 0, cl);
    w32(&mut mm, 4, dev);
    w32(&mut mm, 8, mh);
    w32(&mut mm, 40, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC038_464E, &mut mm).unwrap();
    assert_eq!(r32(&mm, 40), 0);
    w32(&mut mm, 8, 0x4040);
    call(&mut d, &m, CTL_FH, PID, 0xC038_464E, &mut mm).unwrap();
    assert_ne!(r32(&mm, 40), 0);
    // NVOS34: hClient@0 hDevice@4 hMemory@8 pLinearAddress@16 status@24
    let mut um = vec![0u8; 32];
    w32(&mut um, 0, cl);
    w32(&mut um, 4, dev);
    w32(&mut um, 8, mh);
    w32(&mut um, 24, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC020_464F, &mut um).unwrap();
    assert_eq!(r32(&um, 24), 0);
    // DUP_OBJECT of nothing: no client 0; SHARE: not supported; the status
    // is the last field
    let mut dup = vec![0u8; 28];
    call(&mut d, &m, CTL_FH, PID, 0xC01C_4634, &mut dup).unwrap();
    assert_eq!(r32(&dup, 24), 0x23);
    let mut sh = vec![0u8; 24];
    call(&mut d, &m, CTL_FH, PID, 0xC018_4635, &mut sh).unwrap();
    assert_eq!(r32(&sh, 20), 0x56);
    // CARD_INFO on nvidiactl: one 72-byte entry per GPU
    let mut ci = vec![0xffu8; 72 * 4];
    call(&mut d, &m, CTL_FH, PID, iowr(200, 72 * 4), &mut ci).unwrap();
    assert_eq!((r32(&ci, 0), r32(&ci, 72), r32(&ci, 144)), (1, 1, 0));
    assert_eq!(r32(&ci, 72 + 56), 1, "minor_number");
    assert_eq!(r64(&ci, 72 + 48), 80 * GIB, "fb_size");
}

#[test]
fn direction_bits_are_ignored_like_the_real_driver() {
    // _IOC_DIR NONE: the kernel copies nothing, the driver reads/writes at arg.
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let b = nvos21(0, 0, 0, 0x41, 0, 0);
    let a = m.place(&b);
    let cmd = 0x0020_462B; // dir NONE, size 32, 'F', 0x2B
    let out = d
        .ioctl(CTL_FH, FileKind::Ctl, PID, cmd, a, &[], 0, &m)
        .unwrap();
    assert!(out.is_empty());
    let back = m.get(a);
    assert_eq!((r32(&back, 28), r32(&back, 8)), (0, 0xc1d0_0000));
    assert_eq!(
        d.ioctl(CTL_FH, FileKind::Ctl, PID, cmd, 0x10, &[], 0, &m),
        Err(libc::EFAULT)
    );
    // _IOR: read at arg, result copied out by the kernel
    let a2 = m.place(&nvos21(0, 0, 0, 0x41, 0, 0));
    let out = d
        .ioctl(CTL_FH, FileKind::Ctl, PID, 0x8020_462B, a2, &[], 32, &m)
        .unwrap();
    assert_eq!(r32(&out, 28), 0);
    assert_eq!(r32(&out, 8), 0xc1d0_0001);
}

#[test]
fn uvm_layouts_follow_the_branch() {
    let m = FakeMem::new();
    // (version, MAP_EXTERNAL_ALLOCATION (size, rmStatus), ALLOC_SEMAPHORE_POOL,
    // FREE), as each tag's headers have them.
    for (version, map, pool, free) in [
        ("535.261.03", (1200, 1196), (1184, 1176), (24, 16)),
        ("550.40.07", (1200, 1196), (1184, 1176), (24, 16)),
        ("550.163.01", (9264, 9260), (9248, 9240), (24, 16)),
        ("590.44.01", (9264, 9260), (9248, 9240), (16, 8)),
    ] {
        let mut d = drv(1, 80 * GIB, version);
        for (cmd, (size, status)) in [(33u32, map), (68, pool), (34, free)] {
            let mut p = vec![0xffu8; size];
            w64(&mut p, 0, 0x7000_0000);
            let a = m.place(&p);
            assert_eq!(
                d.ioctl(UVM_FH, FileKind::Uvm, PID, cmd, a, &[], 0, &m),
                Ok(vec![]),
                "{version} {cmd}"
            );
            let got = m.get(a);
            let want = if cmd == 68 { 0 } else { 0x1E };
            assert_eq!(r32(&got, status), want, "{version} {cmd}");
            // Nothing else written.
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &b)| (status..status + 4).contains(&i) || i < 8 || b == 0xff),
                "{version} {cmd}"
            );
        }
    }
}

#[test]
fn uvm_commands() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let uvm = |d: &mut Driver, cmd: u32, arg: u64| {
        d.ioctl(UVM_FH, FileKind::Uvm, PID, cmd, arg, &[], 0, &m)
    };
    // INITIALIZE {u64 flags; u32 rmStatus@8}
    let mut p = vec![0u8; 16];
    w32(&mut p, 8, 0xffff_ffff);
    w32(&mut p, 12, 0x7777_7777);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 0x3000_0001, a), Ok(vec![]));
    assert_eq!(r32(&m.get(a), 8), 0);
    assert_eq!(r32(&m.get(a), 12), 0x7777_7777);
    assert_eq!(uvm(&mut d, 0x3000_0001, 0), Err(libc::EFAULT));
    assert_eq!(
        uvm(&mut d, 0x3000_0002, 0),
        Ok(vec![]),
        "DEINITIALIZE has no params"
    );
    // CREATE_EXTERNAL_RANGE {base@0; length@8; rmStatus@16}
    let mut p = vec![0u8; 24];
    w64(&mut p, 0, 0x2000_0000);
    w64(&mut p, 8, 4 * MIB);
    w32(&mut p, 16, 0xffff_ffff);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 73, a), Ok(vec![]));
    assert_eq!(r32(&m.get(a), 16), 0);
    assert_eq!(d.state().uvm_ranges, 1);
    assert_eq!(uvm(&mut d, 73, a), Ok(vec![]));
    assert_eq!(
        r32(&m.get(a), 16),
        0x68,
        "overlap: NV_ERR_UVM_ADDRESS_IN_USE"
    );
    // MAP_EXTERNAL_ALLOCATION: 9264 bytes at 580, base@0 length@8 read,
    // rmStatus@9260 the only field written; a shorter buffer faults.
    let mut p = vec![0x5au8; 9264];
    w64(&mut p, 0, 0x2000_0000);
    w64(&mut p, 8, 4 * MIB);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 33, a), Ok(vec![]));
    let mut want = p.clone();
    want[9260..9264].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(m.get(a), want);
    let short = m.place(&p[..1200]);
    assert_eq!(uvm(&mut d, 33, short), Err(libc::EFAULT));
    // Into no range: NV_ERR_INVALID_ADDRESS.
    w64(&mut p, 0, 0x9000_0000);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 33, a), Ok(vec![]));
    assert_eq!(r32(&m.get(a), 9260), 0x1E);
    // FREE {base@0; length@8; rmStatus@16}
    let mut p = vec![0u8; 24];
    w64(&mut p, 0, 0x2000_0000);
    w32(&mut p, 16, 0xffff_ffff);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 34, a), Ok(vec![]));
    assert_eq!(r32(&m.get(a), 16), 0);
    assert_eq!(d.state().uvm_ranges, 0);
    assert_eq!(uvm(&mut d, 34, a), Ok(vec![]));
    assert_eq!(
        r32(&m.get(a), 16),
        0x1E,
        "unknown base: NV_ERR_INVALID_ADDRESS"
    );
    // CREATE_RANGE_GROUP {u64 id@0 (out); rmStatus@8}
    let a = m.place(&[0xffu8; 16]);
    assert_eq!(uvm(&mut d, 23, a), Ok(vec![]));
    assert_eq!((r64(&m.get(a), 0), r32(&m.get(a), 8)), (1, 0));
    // REGISTER_GPU rmStatus@36, REGISTER_GPU_VASPACE @28, REGISTER_CHANNEL @48,
    // PAGEABLE_MEM_ACCESS @4, MM_INITIALIZE @4
    for (cmd, size, off) in [
        (37u32, 40usize, 36usize),
        (25, 32, 28),
        (27, 56, 48),
        (39, 8, 4),
        (75, 8, 4),
    ] {
        let a = m.place(&vec![0xffu8; size]);
        assert_eq!(uvm(&mut d, cmd, a), Ok(vec![]), "cmd {cmd}");
        assert_eq!(r32(&m.get(a), off), 0, "cmd {cmd}");
    }
    assert_eq!(
        uvm(&mut d, 0x1234_5678, a),
        Err(libc::EINVAL),
        "unknown command"
    );
    assert_eq!(
        uvm(&mut d, 51, 0),
        Ok(vec![]),
        "known number, layout not modelled"
    );
    // the RM escapes are not nvidia-uvm commands
    assert_eq!(uvm(&mut d, 0xC020_462B, a), Err(libc::EINVAL));
    d.release(UVM_FH);
}

#[test]
fn state_json_schema() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 1);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 3 * MIB);
    memalloc(&mut d, &m, CTL_FH, 7, cl, dev, 0, 0x3E, 100);
    let v: serde_json::Value = serde_json::from_str(&d.state_json()).unwrap();
    assert_eq!(v["driver_version"], "580.159");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(v["gpus"][1]["index"], 1);
    assert_eq!(v["gpus"][1]["capacity_bytes"], 80 * GIB);
    assert_eq!(v["gpus"][1]["used_bytes"], 4 * MIB);
    assert_eq!(v["gpus"][1]["host_bytes"], 4096);
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs[0]["pid"], 7, "sorted by pid");
    assert_eq!(procs[0]["gpus"][0]["gpu"], 1);
    assert_eq!(procs[0]["gpus"][0]["host_bytes"], 4096);
    assert_eq!(procs[0]["gpus"][0]["bytes"], 0);
    let p = &procs[1];
    assert_eq!(p["pid"], PID);
    for (k, want) in [
        ("bytes", 4 * MIB),
        ("peak_bytes", 4 * MIB),
        ("host_bytes", 0),
        ("allocs", 1),
        ("frees", 0),
    ] {
        assert_eq!(p["gpus"][0][k], want, "{k}");
    }
    let c = &v["clients"][0];
    assert_eq!(c["handle"], cl);
    assert_eq!(c["fh"], CTL_FH);
    assert_eq!(c["creator_pid"], PID);
    assert_eq!(c["objects"], 3);
    assert_eq!(v["ioctls"]["total"], 4);
    assert_eq!(v["ioctls"]["failed"], 0);
}

// ----- memories shared between handles, processes and export files -------

const PID_A: u32 = 100;
const PID_B: u32 = 200;
const B_CTL_FH: u64 = 30;
const EXP_FH: u64 = 20;
const EXP2_FH: u64 = 21;

/// RM_CONTROL (NVOS54: hClient@0 hObject@4 cmd@8 flags@12 params@16
/// paramsSize@24 status@28) with `params` placed in caller memory and the
/// caller's descriptors resolved by `fds`. Returns (status, params after).
#[allow(clippy::too_many_arguments)]
fn control(
    d: &mut Driver,
    m: &FakeMem,
    fh: u64,
    pid: u32,
    fds: &dyn FdResolver,
    client: u32,
    obj: u32,
    cmd: u32,
    params: &[u8],
) -> (u32, Vec<u8>) {
    let a = m.place(params);
    let mut b = vec![0u8; 32];
    w32(&mut b, 0, client);
    w32(&mut b, 4, obj);
    w32(&mut b, 8, cmd);
    w64(&mut b, 16, a);
    w32(&mut b, 24, params.len() as u32);
    w32(&mut b, 28, 0xffff_ffff);
    let out = d
        .ioctl_fds(fh, kind(fh), pid, 0xC020_462A, 0, &b, 32, m, fds)
        .expect("RM_CONTROL ioctl succeeds");
    (r32(&out, 28), m.get(a))
}

/// EXPORT_OBJECT_TO_FD (24): type@0 (1 = RM) hDevice@4 hParent@8 hObject@12
/// fd@16 flags@20.
fn export1(dev: u32, obj: u32, fd: i32) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    w32(&mut p, 0, 1);
    w32(&mut p, 4, dev);
    w32(&mut p, 12, obj);
    w32(&mut p, 16, fd as u32);
    p
}

/// IMPORT_OBJECT_FROM_FD (20): fd@0 type@4 hDevice@8 hParent@12 hObject@16.
fn import1(fd: i32, parent: u32, new: u32) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    w32(&mut p, 0, fd as u32);
    w32(&mut p, 4, 1);
    w32(&mut p, 12, parent);
    w32(&mut p, 16, new);
    p
}

/// EXPORT_OBJECTS_TO_FD (2128): fd@0 hDevice@4 maxObjects u16@8
/// metadata[64]@10 objects[512]@76 numObjects u16@2124 index u16@2126.
fn export_n(fd: i32, dev: u32, max: u16, objs: &[u32], index: u16) -> Vec<u8> {
    let mut p = vec![0u8; 2128];
    w32(&mut p, 0, fd as u32);
    w32(&mut p, 4, dev);
    p[8..10].copy_from_slice(&max.to_le_bytes());
    p[10..74].fill(0x5a);
    for (i, o) in objs.iter().enumerate() {
        w32(&mut p, 76 + 4 * i, *o);
    }
    p[2124..2126].copy_from_slice(&(objs.len() as u16).to_le_bytes());
    p[2126..2128].copy_from_slice(&index.to_le_bytes());
    p
}

/// IMPORT_OBJECTS_FROM_FD (652): fd@0 hParent@4 objects[128]@8
/// objectTypes[128] u8@520 numObjects u16@648 index u16@650.
fn import_n(fd: i32, parent: u32, objs: &[u32], index: u16) -> Vec<u8> {
    let mut p = vec![0u8; 652];
    w32(&mut p, 0, fd as u32);
    w32(&mut p, 4, parent);
    for (i, o) in objs.iter().enumerate() {
        w32(&mut p, 8 + 4 * i, *o);
    }
    p[520..648].fill(0xee);
    p[648..650].copy_from_slice(&(objs.len() as u16).to_le_bytes());
    p[650..652].copy_from_slice(&index.to_le_bytes());
    p
}

/// RM_DUP_OBJECT (NVOS55, 28): hClient@0 hParent@4 hObject@8 hClientSrc@12
/// hObjectSrc@16 flags@20 status@24. Returns (status, hObject after).
#[allow(clippy::too_many_arguments)]
fn dup(
    d: &mut Driver,
    m: &FakeMem,
    fh: u64,
    pid: u32,
    client: u32,
    parent: u32,
    new: u32,
    src_client: u32,
    src_obj: u32,
) -> (u32, u32) {
    let mut b = vec![0u8; 28];
    w32(&mut b, 0, client);
    w32(&mut b, 4, parent);
    w32(&mut b, 8, new);
    w32(&mut b, 12, src_client);
    w32(&mut b, 16, src_obj);
    w32(&mut b, 24, 0xffff_ffff);
    call(d, m, fh, pid, 0xC01C_4634, &mut b).unwrap();
    (r32(&b, 24), r32(&b, 8))
}

/// A client and a device on `gpu` for `pid` on file `fh`.
fn setup_on(d: &mut Driver, m: &FakeMem, fh: u64, pid: u32, gpu: u32) -> (u32, u32) {
    d.open(fh, kind(fh));
    let cl = client(d, m, fh, pid, 0);
    let (st, dev) = device(d, m, fh, pid, cl, 0, gpu);
    assert_eq!(st, 0);
    (cl, dev)
}

fn fig(d: &Driver, pid: u32, gpu: u32) -> (u64, u64, u64, u64, u64) {
    let p = d.proc_gpu(pid, gpu).unwrap_or_default();
    (
        p.bytes,
        p.peak_bytes,
        p.driver_video_bytes,
        p.allocs,
        p.frees,
    )
}

#[test]
fn alloc_memory_of_video_classes_allocates_nothing() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 1);
    // NVOS02 + fd: hRoot@0 hObjectParent@4 hObjectNew@8 hClass@12 limit@32
    // status@40 fd@48
    let mut b = vec![0u8; 56];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 12, 0x40);
    w64(&mut b, 32, 4095);
    w32(&mut b, 40, 0xffff_ffff);
    call(&mut d, &m, GPU1_FH, PID, 0xC038_4627, &mut b).unwrap();
    assert_eq!(r32(&b, 40), 0);
    let h = r32(&b, 8);
    assert_eq!(d.object_class(cl, h), Some(0x40), "a 0-byte object exists");
    assert_eq!(
        r64(&b, 32),
        80 * GIB - 1,
        "limit = the whole heap of that GPU - 1"
    );
    assert_eq!((d.gpu_used(1), d.gpu_host(1)), (0, 0));
    assert_eq!(d.proc_gpu(PID, 1), None, "no figure moved: no entry");
    // 0x3F: limit 0xFFFFFFFF, nothing allocated
    w32(&mut b, 8, 0);
    w32(&mut b, 12, 0x3F);
    w64(&mut b, 32, 0);
    call(&mut d, &m, GPU0_FH, PID, 0xC038_4627, &mut b).unwrap();
    assert_eq!((r32(&b, 40), r64(&b, 32)), (0, 0xFFFF_FFFF));
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(d.memory_count(), 2);
    // the objects can be mapped and freed like any memory
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, h), 0);
    assert_eq!(d.memory_count(), 1);
    assert_eq!(d.proc_gpu(PID, 1), None);
}

/// NVOS32 ALLOC_SIZE (function 2): hRoot@0 hObjectParent@4 function@8
/// status@20 hMemory@44 flags@52 attr@56 size@88 attr2@144.
fn vid_heap_alloc(flags: u32, attr: u32, attr2: u32, size: u64, cl: u32, dev: u32) -> Vec<u8> {
    let mut b = vec![0u8; 184];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 8, 2);
    w32(&mut b, 20, 0xffff_ffff);
    w32(&mut b, 52, flags);
    w32(&mut b, 56, attr);
    w64(&mut b, 88, size);
    w32(&mut b, 144, attr2);
    b
}

#[test]
fn vid_heap_classifies_like_the_driver() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let run = |d: &mut Driver, b: &mut Vec<u8>| {
        call(d, &m, CTL_FH, PID, 0xC0B8_464A, b).unwrap();
        assert_eq!(r32(b, 20), 0);
        r32(b, 44)
    };
    // flags & 0x80000 (VIRTUAL) wins over everything: 0x50A0, 0 bytes
    let mut b = vid_heap_alloc(0x80000, 1 << 25, 1 << 24, 3 * MIB, cl, dev);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x50A0));
    assert_eq!((d.gpu_used(0), d.gpu_host(0), d.gpu_egm(0)), (0, 0, 0));
    // attr2 bit 24 (USE_EGM, 550+): EGM, rounded like video
    let mut b = vid_heap_alloc(0, 0, 1 << 24, 3 * MIB, cl, dev);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x42));
    assert_eq!(r64(&b, 88), 4 * MIB, "size@88 written back");
    assert_eq!((d.gpu_used(0), d.gpu_egm(0)), (0, 4 * MIB));
    // attr bits 26:25 == 0: video
    let mut b = vid_heap_alloc(0, 0xF9FF_FFFF, 0, 3 * MIB, cl, dev);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x40));
    assert_eq!(d.gpu_used(0), 4 * MIB);
    // any other location: host 0x3E, rounded to 4 KiB
    for loc in [1u32, 2, 3] {
        let mut b = vid_heap_alloc(0, loc << 25, 0, 5000, cl, dev);
        let h = run(&mut d, &mut b);
        assert_eq!(d.object_class(cl, h), Some(0x3E));
        assert_eq!(r64(&b, 88), 8192);
    }
    assert_eq!((d.gpu_used(0), d.gpu_host(0)), (4 * MIB, 3 * 8192));
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!(
        (pg.bytes, pg.host_bytes, pg.egm_bytes, pg.allocs),
        (4 * MIB, 3 * 8192, 4 * MIB, 5),
        "the virtual range is not an allocation"
    );
    // ALLOC_SIZE_RANGE (14): size@80; the EGM bit is not looked at
    let mut b = vid_heap_alloc(0, 0, 1 << 24, 0, cl, dev);
    w32(&mut b, 8, 14);
    w64(&mut b, 80, MIB + 1);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x40));
    assert_eq!(r64(&b, 80), 2 * MIB, "size@80 written back");
    assert_eq!(r64(&b, 88), 0, "size@88 untouched");
    let mut b = vid_heap_alloc(0, 2 << 25, 0, 0, cl, dev);
    w32(&mut b, 8, 14);
    w64(&mut b, 80, 100);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x3E));
    let mut b = vid_heap_alloc(0x80000, 0, 0, 0, cl, dev);
    w32(&mut b, 8, 14);
    w64(&mut b, 80, MIB);
    let h = run(&mut d, &mut b);
    assert_eq!(d.object_class(cl, h), Some(0x50A0));
    // ALLOC_OS_DESCRIPTOR (27): hMemory@40 (out), limit@72: host, limit + 1
    let mut b = vec![0u8; 184];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w32(&mut b, 8, 27);
    w32(&mut b, 20, 0xffff_ffff);
    w64(&mut b, 72, 9999);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!(r32(&b, 20), 0);
    let h = r32(&b, 40);
    assert_eq!(d.object_class(cl, h), Some(0x71));
    assert_eq!(r64(&b, 72), 9999, "limit untouched");
    assert_eq!(d.gpu_used(0), 6 * MIB);
    assert_eq!(d.gpu_host(0), 3 * 8192 + 4096 + 10_000);
    // before 550 the EGM bit means nothing: video
    let mut d = drv(1, 80 * GIB, "535.104");
    let (cl, dev) = setup(&mut d, &m, 0);
    let mut b = vid_heap_alloc(0, 0, 1 << 24, MIB, cl, dev);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!(r32(&b, 20), 0);
    assert_eq!(d.object_class(cl, r32(&b, 44)), Some(0x40));
    assert_eq!((d.gpu_used(0), d.gpu_egm(0)), (2 * MIB, 0));
    // unknown function: NV_ERR_NOT_SUPPORTED
    w32(&mut b, 8, 99);
    call(&mut d, &m, CTL_FH, PID, 0xC0B8_464A, &mut b).unwrap();
    assert_eq!(r32(&b, 20), 0x56);
}

#[test]
fn zero_byte_classes_and_egm() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x2080, 0, 0);
    // 0xC2: 24-byte params, memSize@0 written with the whole heap
    let mut p = vec![0u8; 24];
    w64(&mut p, 0, 7);
    w64(&mut p, 8, 0x1234);
    w64(&mut p, 16, 0x5678);
    let a = m.place(&p);
    let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xC2, a, 24);
    assert_eq!(st, 0);
    let back = m.get(a);
    assert_eq!(r64(&back, 0), 80 * GIB, "memSize = the whole heap");
    assert_eq!((r64(&back, 8), r64(&back, 16)), (0x1234, 0x5678));
    assert_eq!(d.object_class(cl, h), Some(0xC2));
    let short = m.place(&[0u8; 23]);
    let mut b = nvos21(cl, dev, 0, 0xC2, short, 24);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT),
        "0xC2 reads 24 bytes"
    );
    // 0xF8: 48 bytes, allocSize@8; only under a subdevice
    let mut p = vec![0u8; 48];
    w64(&mut p, 8, 64 * MIB);
    let a = m.place(&p);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xF8, a, 48);
    assert_eq!(
        st, 0x36,
        "fabric under a device: NV_ERR_INVALID_OBJECT_PARENT"
    );
    let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0xF8, a, 48);
    assert_eq!(st, 0);
    assert_eq!(d.object_class(cl, h), Some(0xF8));
    let short = m.place(&[0u8; 47]);
    let mut b = nvos21(cl, sub, 0, 0xF8, short, 48);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT)
    );
    // 0xFD from 550 on: 80 bytes (allocSize@48)
    let mut p = vec![0u8; 80];
    w64(&mut p, 48, 32 * MIB);
    let a = m.place(&p);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xFD, a, 80);
    assert_eq!(st, 0);
    let short = m.place(&[0u8; 79]);
    let mut b = nvos21(cl, dev, 0, 0xFD, short, 80);
    assert_eq!(
        call(&mut d, &m, CTL_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EFAULT),
        "80 bytes read from 550 on"
    );
    // 0xF9, 0xFB, 0xE0, 0x50A0, 0x70: no params needed
    for c in [0xF9u32, 0xFB, 0xE0, 0x50A0, 0x70] {
        let (st, h) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, c, 0, 0);
        assert_eq!(st, 0, "class {c:#x}");
        assert_eq!(d.object_class(cl, h), Some(c));
    }
    assert_eq!((d.gpu_used(0), d.gpu_host(0), d.gpu_egm(0)), (0, 0, 0));
    assert_eq!(d.proc_gpu(PID, 0), None, "no bytes, no entry");
    assert_eq!(d.memory_count(), 8);
    // 0x42 EGM: NV_MEMORY_ALLOCATION_PARAMS, size@64 rounded like video
    let (st, eh, real) = memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x42, 3 * MIB);
    assert_eq!((st, real), (0, 4 * MIB));
    assert_eq!((d.gpu_used(0), d.gpu_egm(0)), (0, 4 * MIB));
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!(
        (pg.bytes, pg.egm_bytes, pg.driver_video_bytes, pg.allocs),
        (0, 4 * MIB, 0, 1),
        "EGM is its own kind, not in the driver figure"
    );
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, eh), 0);
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!((pg.egm_bytes, pg.frees), (0, 1));
    // before 550, 0xFD reads 40 bytes (allocSize@8)
    let mut d = drv(1, 80 * GIB, "535.104");
    let (cl, dev) = setup(&mut d, &m, 0);
    let a = m.place(&[0u8; 40]);
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xFD, a, 40);
    assert_eq!(st, 0, "40 bytes are enough before 550");
}

#[test]
fn dup_takes_a_reference_and_the_charge_moves() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    // A's client on one file; a forked child C allocates through it
    let child = 300;
    let (cl, dev) = setup_on(&mut d, &m, CTL_FH, PID_A, 0);
    let (st, mh, _) = memalloc(&mut d, &m, CTL_FH, child, cl, dev, 0, 0x40, 6 * MIB);
    assert_eq!(st, 0);
    // A dups it into a second client of its own, on another file
    let (cl2, dev2) = setup_on(&mut d, &m, 40, PID_A, 0);
    let (st, dh) = dup(&mut d, &m, 40, PID_A, cl2, dev2, 0x7700, cl, mh);
    assert_eq!((st, dh), (0, 0x7700), "hObject@8 kept");
    assert_eq!(d.object_class(cl2, dh), Some(0x40));
    assert_eq!(d.gpu_used(0), 6 * MIB, "a reference, no new bytes");
    assert_eq!(d.memory_count(), 1);
    assert_eq!(fig(&d, child, 0), (6 * MIB, 6 * MIB, 0, 1, 0));
    assert_eq!(
        fig(&d, PID_A, 0),
        (0, 0, 6 * MIB, 0, 0),
        "driver figure: A's client"
    );
    // the child's handle goes: the charge moves to A (the dup's creator)
    let mut b = vec![0u8; 16];
    w32(&mut b, 0, cl);
    w32(&mut b, 8, mh);
    call(&mut d, &m, CTL_FH, child, 0xC010_4629, &mut b).unwrap();
    assert_eq!(r32(&b, 12), 0);
    assert_eq!(d.gpu_used(0), 6 * MIB, "memory stays");
    assert_eq!(fig(&d, child, 0), (0, 6 * MIB, 0, 1, 0), "not a free");
    assert_eq!(
        fig(&d, PID_A, 0),
        (6 * MIB, 6 * MIB, 6 * MIB, 0, 0),
        "not an allocation; the peak rises"
    );
    // the dup goes: the memory is freed, from A
    assert_eq!(free(&mut d, &m, 40, cl2, dev2, dh), 0);
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(fig(&d, PID_A, 0), (0, 6 * MIB, 0, 0, 1));
    assert_eq!(d.memory_count(), 0);
    // a dup picked by the driver (hObject 0) is written back; duplicate
    // handles and wrong parents are refused
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID_A, cl, dev, 0, 0x40, 2 * MIB);
    let (st, h) = dup(&mut d, &m, CTL_FH, PID_A, cl, dev, 0, cl, mh);
    assert_eq!(st, 0);
    assert_ne!(h, 0);
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_A, cl, dev, h, cl, mh);
    assert_eq!(st, 0x19);
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_A, cl, cl, 0, cl, mh);
    assert_eq!(st, 0x36, "memory needs a device on its GPU");
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_A, cl, dev, 0, cl, 0x9999);
    assert_eq!(st, 0x57, "unknown source object");
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_A, cl2, dev2, 0, cl, mh);
    assert_eq!(st, 0x23, "destination client of another open file");
    // non-memory objects are duplicated as plain objects
    let (st, dd) = dup(&mut d, &m, 40, PID_A, cl2, cl2, 0, cl, dev);
    assert_eq!(st, 0);
    assert_eq!(d.object_class(cl2, dd), Some(0x80));
    let (st, _, _) = memalloc(&mut d, &m, 40, PID_A, cl2, dd, 0, 0x40, 2 * MIB);
    assert_eq!(st, 0, "the dup'd device is a device on the same GPU");
    assert_eq!(d.gpu_used(0), 4 * MIB);
}

#[test]
fn dup_is_refused_across_processes() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (ca, deva) = setup_on(&mut d, &m, CTL_FH, PID_A, 0);
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x40, 2 * MIB);
    let (cb, devb) = setup_on(&mut d, &m, B_CTL_FH, PID_B, 0);
    let (st, _) = dup(&mut d, &m, B_CTL_FH, PID_B, cb, devb, 0x55, ca, mh);
    assert_eq!(st, 0x23, "source client of another process");
    assert_eq!(d.object_class(cb, 0x55), None);
    // even through the same open file (a forked child): the pid decides
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_B, ca, deva, 0x56, ca, mh);
    assert_eq!(st, 0x23);
    assert_eq!(d.state().memories[0].handles, 1);
    assert_eq!(d.state().ioctls.failed, 2);
}

#[test]
fn export_and_import_between_two_processes() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "580.159");
    let (ca, deva) = setup_on(&mut d, &m, CTL_FH, PID_A, 1);
    let (_, m1, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x40, 8 * MIB);
    let (_, m2, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x3E, 8192);
    let (cb, devb) = setup_on(&mut d, &m, B_CTL_FH, PID_B, 1);
    d.open(EXP_FH, FileKind::Ctl);
    d.open(EXP2_FH, FileKind::Ctl);
    d.open(GPU0_FH, FileKind::Gpu(0));
    // fd numbers mean different files in A and B
    let fds_a: BTreeMap<i32, u64> = [(5, EXP_FH), (6, EXP2_FH), (7, GPU0_FH)].into();
    let fds_b: BTreeMap<i32, u64> = [(9, EXP_FH), (11, EXP2_FH)].into();
    let exp = |d: &mut Driver, p: &[u8]| control(d, &m, CTL_FH, PID_A, &fds_a, ca, ca, 0x3d05, p).0;
    // bad requests first: nothing changes
    assert_eq!(
        exp(&mut d, &export1(deva, m1, 8)),
        0x3B,
        "fd not resolvable"
    );
    assert_eq!(exp(&mut d, &export1(deva, m1, 7)), 0x3B, "fd not nvidiactl");
    assert_eq!(exp(&mut d, &export1(deva, m1, -1)), 0x3B);
    let mut p = export1(deva, m1, 5);
    w32(&mut p, 20, 1);
    assert_eq!(exp(&mut d, &p), 0x3B, "EMPTY_FD flag");
    let mut p = export1(deva, m1, 5);
    w32(&mut p, 0, 0);
    assert_eq!(exp(&mut d, &p), 0x3B, "type NONE");
    assert_eq!(exp(&mut d, &export1(deva, 0x4444, 5)), 0x57);
    assert_eq!(exp(&mut d, &export1(deva, deva, 5)), 0x56, "not a memory");
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds_a,
        ca,
        deva,
        0x3d05,
        &export1(deva, m1, 5),
    );
    assert_eq!(st, 0x56, "a class-0000 control on a device");
    let (st, _) = control(
        &mut d, &m, CTL_FH, PID_A, &fds_a, ca, ca, 0x3d05, &[0u8; 20],
    );
    assert_eq!(st, 0x1F, "paramsSize must be 24");
    assert_eq!(
        d.state()
            .memories
            .iter()
            .map(|x| x.export_refs)
            .sum::<u64>(),
        0
    );
    // A exports m1 to the file of its fd 5
    assert_eq!(exp(&mut d, &export1(deva, m1, 5)), 0);
    assert_eq!(
        exp(&mut d, &export1(deva, m2, 5)),
        0x63,
        "already an export file"
    );
    // B imports it through its fd 9 (the same open file)
    let (st, p) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d06,
        &import1(9, devb, 0),
    );
    assert_eq!(st, 0);
    let ib = r32(&p, 16);
    assert_ne!(ib, 0, "hObject@16 written back");
    assert_eq!(d.object_class(cb, ib), Some(0x40));
    assert_eq!(d.gpu_used(1), 8 * MIB, "no new bytes");
    assert_eq!(fig(&d, PID_A, 1), (8 * MIB, 8 * MIB, 8 * MIB, 2, 0));
    assert_eq!(fig(&d, PID_B, 1), (0, 0, 0, 0, 0), "B has no entry yet");
    assert_eq!(d.proc_gpu(PID_B, 1), None);
    // a chosen handle; a wrong type; fd of a file without a table
    let (st, p) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d06,
        &import1(9, devb, 0x4242),
    );
    assert_eq!((st, r32(&p, 16)), (0, 0x4242));
    let mut p = import1(9, devb, 0);
    w32(&mut p, 4, 2);
    let (st, _) = control(&mut d, &m, B_CTL_FH, PID_B, &fds_b, cb, cb, 0x3d06, &p);
    assert_eq!(st, 0x3B);
    let (st, _) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d06,
        &import1(11, devb, 0),
    );
    assert_eq!(st, 0x3B, "no table on that file yet");
    // batch export of [m2, 0, m1] at index 1 of a 4-slot table on EXP2
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds_a,
        ca,
        ca,
        0x3d0b,
        &export_n(6, deva, 4, &[m2, m1], 3),
    );
    assert_eq!(
        st, 0x5B,
        "index + numObjects > maxObjects: NV_ERR_OUT_OF_RANGE"
    );
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds_a,
        ca,
        ca,
        0x3d0b,
        &export_n(6, 0, 4, &[m2], 0),
    );
    assert_eq!(st, 0x3B, "hDevice 0: objects of a device do not match");
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds_a,
        ca,
        ca,
        0x3d0b,
        &export_n(6, deva, 4, &[m2, 0, m1], 1),
    );
    assert_eq!(st, 0);
    // B imports slots 0..4: 0 and 2 are empty
    let (st, p) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d0c,
        &import_n(11, devb, &[0, 0, 0x5000, 0], 0),
    );
    assert_eq!(st, 0);
    let types: Vec<u8> = p[520..524].to_vec();
    assert_eq!(
        types,
        vec![0, 2, 0, 1],
        "objectTypes: none, sysmem, none, vidmem"
    );
    assert_eq!(p[524], 0xee, "the rest untouched");
    let (o0, o1, o2, o3) = (r32(&p, 8), r32(&p, 12), r32(&p, 16), r32(&p, 20));
    assert_eq!((o0, o2), (0, 0x5000), "empty slots leave objects[i] alone");
    assert_eq!(d.object_class(cb, o1), Some(0x3E));
    assert_eq!(d.object_class(cb, o3), Some(0x40));
    assert_eq!(d.object_class(cb, 0x5000), None);
    let (st, _) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d0c,
        &import_n(11, devb, &[0, 0], 3),
    );
    assert_eq!(st, 0x5B);
    // a failing batch imports nothing
    let before = d.client_objects(cb);
    let (st, _) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d0c,
        &import_n(11, devb, &[0, o1, 0, 0], 0),
    );
    assert_eq!(st, 0x19, "objects[1] is taken");
    assert_eq!(d.client_objects(cb), before);
    // the import into a device of another GPU is refused
    let (_, dev0) = device(&mut d, &m, B_CTL_FH, PID_B, cb, 0, 0);
    let (st, _) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds_b,
        cb,
        cb,
        0x3d06,
        &import1(9, dev0, 0),
    );
    assert_eq!(st, 0x36);
    // overwriting a slot drops its reference: [m1] at 1 replaces m2
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds_a,
        ca,
        ca,
        0x3d0b,
        &export_n(6, 0, 0, &[m1], 1),
    );
    assert_eq!(st, 0);
    let s = d.state();
    assert_eq!(
        s.memories
            .iter()
            .map(|x| (x.handles, x.export_refs))
            .collect::<Vec<_>>(),
        vec![(4, 3), (2, 0)],
        "m1: A's + 3 imports, EXP slot 0 + EXP2 slots 1 and 3; m2: A's + 1 import"
    );
    assert_eq!(d.gpu_used(1), 8 * MIB);
    assert_eq!(d.gpu_host(1), 8192);
}

#[test]
fn export_reference_outlives_the_exporters_free() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (ca, deva) = setup_on(&mut d, &m, CTL_FH, PID_A, 0);
    let (cb, devb) = setup_on(&mut d, &m, B_CTL_FH, PID_B, 0);
    d.open(EXP_FH, FileKind::Ctl);
    let fds: BTreeMap<i32, u64> = [(3, EXP_FH)].into();
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x40, 10 * MIB);
    let (st, _) = control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds,
        ca,
        ca,
        0x3d05,
        &export1(0, mh, 3),
    );
    assert_eq!(st, 0);
    // A frees its only handle: the export keeps the memory, the charge stays
    assert_eq!(free(&mut d, &m, CTL_FH, ca, deva, mh), 0);
    assert_eq!(d.gpu_used(0), 10 * MIB);
    assert_eq!(
        fig(&d, PID_A, 0),
        (10 * MIB, 10 * MIB, 0, 1, 0),
        "still charged to A, in nobody's driver figure"
    );
    // B imports it: B's handle is now the oldest and takes the charge
    let (st, p) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds,
        cb,
        cb,
        0x3d06,
        &import1(3, devb, 0),
    );
    assert_eq!(st, 0);
    let ib = r32(&p, 16);
    assert_eq!(fig(&d, PID_A, 0), (0, 10 * MIB, 0, 1, 0));
    assert_eq!(fig(&d, PID_B, 0), (10 * MIB, 10 * MIB, 10 * MIB, 0, 0));
    // the export file goes: B's handle keeps it
    d.release(EXP_FH);
    assert_eq!(d.gpu_used(0), 10 * MIB);
    // B frees: gone, the free is B's
    let mut b = vec![0u8; 16];
    w32(&mut b, 0, cb);
    w32(&mut b, 8, ib);
    call(&mut d, &m, B_CTL_FH, PID_B, 0xC010_4629, &mut b).unwrap();
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(fig(&d, PID_B, 0), (0, 10 * MIB, 0, 0, 1));
    assert_eq!(fig(&d, PID_A, 0), (0, 10 * MIB, 0, 1, 0));
    // when nobody imports, the release of the export file frees it from A
    d.open(EXP_FH, FileKind::Ctl);
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x40, 2 * MIB);
    control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds,
        ca,
        ca,
        0x3d05,
        &export1(0, mh, 3),
    );
    free(&mut d, &m, CTL_FH, ca, deva, mh);
    assert_eq!(d.gpu_used(0), 2 * MIB);
    d.release(EXP_FH);
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(fig(&d, PID_A, 0), (0, 10 * MIB, 0, 2, 1));
    assert_eq!(d.memory_count(), 0);
}

#[test]
fn subdevice_free_tears_down_the_memory_under_it() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x2080, 0, 0);
    let (_, a, _) = memalloc(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0x40, 4 * MIB);
    memalloc(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0x3E, 4096);
    let fp = m.place(&[0u8; 48]);
    alloc21(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0xF8, fp, 48);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 2 * MIB);
    // a dup of the subdevice's memory elsewhere keeps that one alive
    let (st, keep) = dup(&mut d, &m, CTL_FH, PID, cl, dev, 0, cl, a);
    assert_eq!(st, 0);
    assert_eq!(d.gpu_used(0), 6 * MIB);
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, sub), 0);
    assert_eq!(d.object_class(cl, sub), None);
    assert_eq!(d.object_class(cl, a), None);
    assert_eq!(d.gpu_used(0), 6 * MIB, "the dup keeps the 4 MiB");
    assert_eq!(d.gpu_host(0), 0);
    let pg = d.proc_gpu(PID, 0).unwrap();
    assert_eq!(
        (pg.bytes, pg.host_bytes, pg.allocs, pg.frees),
        (6 * MIB, 0, 3, 1)
    );
    assert_eq!(free(&mut d, &m, CTL_FH, cl, dev, keep), 0);
    assert_eq!(d.gpu_used(0), 2 * MIB);
    assert_eq!(d.memory_count(), 1);
}

#[test]
fn file_release_moves_the_charges_of_shared_memories() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (ca, deva) = setup_on(&mut d, &m, CTL_FH, PID_A, 0);
    let (ca2, deva2) = setup_on(&mut d, &m, CTL_FH, PID_A, 0);
    let (cb, devb) = setup_on(&mut d, &m, B_CTL_FH, PID_B, 0);
    d.open(EXP_FH, FileKind::Ctl);
    let fds: BTreeMap<i32, u64> = [(3, EXP_FH)].into();
    let (_, mh, _) = memalloc(&mut d, &m, CTL_FH, PID_A, ca, deva, 0, 0x40, 4 * MIB);
    // A's second client (same file) dups it; B imports it later
    let (st, _) = dup(&mut d, &m, CTL_FH, PID_A, ca2, deva2, 0, ca, mh);
    assert_eq!(st, 0);
    control(
        &mut d,
        &m,
        CTL_FH,
        PID_A,
        &fds,
        ca,
        ca,
        0x3d05,
        &export1(deva, mh, 3),
    );
    let (st, _) = control(
        &mut d,
        &m,
        B_CTL_FH,
        PID_B,
        &fds,
        cb,
        cb,
        0x3d06,
        &import1(3, devb, 0),
    );
    assert_eq!(st, 0);
    d.release(EXP_FH);
    // an unrelated 8 MiB of B's so that a transient state would show in B's peak
    memalloc(&mut d, &m, B_CTL_FH, PID_B, cb, devb, 0, 0x40, 8 * MIB);
    assert_eq!(fig(&d, PID_B, 0), (8 * MIB, 8 * MIB, 8 * MIB, 1, 0));
    // A's file goes: both of A's handles go at once, then the charge moves
    // to B's (the oldest survivor), not to A's dup on the way
    d.release(CTL_FH);
    assert!(!d.has_client(ca) && !d.has_client(ca2));
    assert_eq!(d.gpu_used(0), 12 * MIB);
    assert_eq!(fig(&d, PID_A, 0), (0, 4 * MIB, 0, 1, 0), "not a free");
    assert_eq!(fig(&d, PID_B, 0), (12 * MIB, 12 * MIB, 12 * MIB, 1, 0));
    d.release(B_CTL_FH);
    assert_eq!(d.gpu_used(0), 0);
    assert_eq!(fig(&d, PID_B, 0), (0, 12 * MIB, 0, 1, 2));
}

#[test]
fn driver_figure_and_caller_figure_for_a_forked_child() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let parent = 500;
    let child = 501;
    let (cl, dev) = setup_on(&mut d, &m, CTL_FH, parent, 0);
    memalloc(&mut d, &m, CTL_FH, parent, cl, dev, 0, 0x40, 2 * MIB);
    memalloc(&mut d, &m, CTL_FH, child, cl, dev, 0, 0x40, 6 * MIB);
    memalloc(&mut d, &m, CTL_FH, child, cl, dev, 0, 0x3E, 4096);
    // per-caller: who allocated; driver: who created the client
    assert_eq!(fig(&d, child, 0), (6 * MIB, 6 * MIB, 0, 2, 0));
    assert_eq!(fig(&d, parent, 0), (2 * MIB, 2 * MIB, 8 * MIB, 1, 0));
    assert_eq!(d.proc_gpu(child, 0).unwrap().host_bytes, 4096);
    let s = d.state();
    let by_pid: BTreeMap<u32, (u64, u64)> = s
        .processes
        .iter()
        .map(|p| (p.pid, (p.gpus[0].bytes, p.gpus[0].driver_video_bytes)))
        .collect();
    assert_eq!(by_pid[&parent], (2 * MIB, 8 * MIB));
    assert_eq!(by_pid[&child], (6 * MIB, 0));
    assert_eq!(s.memories.len(), 3);
    assert_eq!(s.memories[1].charged_pid, child);
    assert_eq!(s.memories[1].driver_pid, Some(parent));
    assert_eq!(s.memories[2].driver_pid, None, "host memory");
    d.release(CTL_FH);
    assert_eq!(fig(&d, child, 0), (0, 6 * MIB, 0, 2, 2));
    assert_eq!(fig(&d, parent, 0), (0, 2 * MIB, 0, 1, 1));
}

#[test]
fn startup_escapes_answer_success_and_allocate_nothing() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    let total = d.state().ioctls.total;
    // ALLOC_OS_EVENT 206 / FREE_OS_EVENT 207 (16): hClient@0 hDevice@4 fd@8 status@12
    for nr in [206u32, 207] {
        for fh in [CTL_FH, GPU0_FH] {
            let mut b = vec![0u8; 16];
            w32(&mut b, 0, cl);
            w32(&mut b, 4, dev);
            w32(&mut b, 8, 7);
            w32(&mut b, 12, 0xffff_ffff);
            call(&mut d, &m, fh, PID, iowr(nr, 16), &mut b).unwrap();
            assert_eq!((r32(&b, 0), r32(&b, 8), r32(&b, 12)), (cl, 7, 0));
        }
        let mut b = vec![0u8; 12];
        assert_eq!(
            call(&mut d, &m, CTL_FH, PID, iowr(nr, 12), &mut b),
            Err(libc::EINVAL)
        );
    }
    // SYS_PARAMS 214 (8): an input, left alone
    let mut b = 0x1234_5678u64.to_le_bytes().to_vec();
    call(&mut d, &m, CTL_FH, PID, iowr(214, 8), &mut b).unwrap();
    assert_eq!(r64(&b, 0), 0x1234_5678);
    // NUMA_INFO 215: any size, zero-filled
    for n in [8usize, 64, 1200] {
        let mut b = vec![0xffu8; n];
        call(&mut d, &m, GPU0_FH, PID, iowr(215, n as u32), &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "{n} bytes");
    }
    // WAIT_OPEN_COMPLETE 218 (8, 550+): rc@0 adapterStatus@4
    let mut b = vec![0xffu8; 8];
    call(&mut d, &m, GPU0_FH, PID, iowr(218, 8), &mut b).unwrap();
    assert_eq!((r32(&b, 0), r32(&b, 4)), (0, 0));
    // RM_UPDATE_DEVICE_MAPPING_INFO 0x5E (NVOS56, 40): status@32
    let mut b = vec![0u8; 40];
    w32(&mut b, 0, cl);
    w32(&mut b, 4, dev);
    w64(&mut b, 16, 0x7000_0000);
    w64(&mut b, 24, 0x7100_0000);
    w32(&mut b, 32, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC028_465E, &mut b).unwrap();
    assert_eq!(r32(&b, 32), 0);
    assert_eq!(r64(&b, 24), 0x7100_0000);
    let s = d.state();
    assert_eq!(s.ioctls.total, total + 4 + 2 + 1 + 3 + 1 + 1);
    assert_eq!(s.ioctls.failed, 2, "only the two wrong sizes");
    assert_eq!(d.memory_count(), 0);
    assert_eq!(d.gpu_used(0), 0);
    assert!(s.processes.is_empty());
    // before 550 there is no WAIT_OPEN_COMPLETE
    let mut d = drv(1, 80 * GIB, "535.104");
    let mut b = vec![0u8; 8];
    assert_eq!(
        call(&mut d, &m, GPU0_FH, PID, iowr(218, 8), &mut b),
        Err(libc::EINVAL)
    );
}

#[test]
fn named_fd_finds_the_descriptor_inside_the_controls() {
    let m = FakeMem::new();
    let d = drv(1, 80 * GIB, "580.159");
    let ctl = |cmd: u32, params: &[u8]| {
        let a = m.place(params);
        let mut b = vec![0u8; 32];
        w32(&mut b, 8, cmd);
        w64(&mut b, 16, a);
        w32(&mut b, 24, params.len() as u32);
        b
    };
    let cases = [
        (0x3d05, export1(0, 1, 17), Some(17)),
        (0x3d06, import1(18, 1, 0), Some(18)),
        (0x3d0b, export_n(19, 0, 1, &[1], 0), Some(19)),
        (0x3d0c, import_n(20, 1, &[0], 0), Some(20)),
        (0x3d05, export1(0, 1, -1), None),
        (0x2080_0110, export1(0, 1, 17), None),
    ];
    for (cmd, p, want) in cases {
        let b = ctl(cmd, &p);
        assert_eq!(
            d.named_fd(FileKind::Ctl, 0xC020_462A, 0, &b, &m),
            want,
            "{cmd:#x}"
        );
        assert_eq!(d.named_fd(FileKind::Gpu(0), 0xC020_462A, 0, &b, &m), None);
        // through XFER_CMD {cmd@0 size@4 ptr@8}
        let ba = m.place(&b);
        let mut x = vec![0u8; 16];
        w32(&mut x, 0, 0x2A);
        w32(&mut x, 4, 32);
        w64(&mut x, 8, ba);
        assert_eq!(d.named_fd(FileKind::Ctl, 0xC010_46D3, 0, &x, &m), want);
    }
    // a wrong paramsSize names nothing
    let mut b = ctl(0x3d05, &export1(0, 1, 17));
    w32(&mut b, 24, 20);
    assert_eq!(d.named_fd(FileKind::Ctl, 0xC020_462A, 0, &b, &m), None);
}

#[test]
fn state_json_has_the_new_fields() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "580.159");
    let (cl, dev) = setup(&mut d, &m, 0);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x42, MIB);
    memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, MIB);
    alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x50A0, 0, 0);
    let v: serde_json::Value = serde_json::from_str(&d.state_json()).unwrap();
    assert_eq!(v["gpus"][0]["egm_bytes"], 2 * MIB);
    let g = &v["processes"][0]["gpus"][0];
    assert_eq!(g["egm_bytes"], 2 * MIB);
    assert_eq!(g["driver_video_bytes"], 2 * MIB);
    let mems = v["memories"].as_array().unwrap();
    assert_eq!(mems.len(), 3);
    assert_eq!(mems[0]["kind"], "egm");
    assert_eq!(mems[1]["kind"], "video");
    assert_eq!(mems[1]["driver_pid"], PID);
    assert_eq!(mems[2]["kind"], "none");
    assert_eq!(mems[2]["class"], 0x50A0);
    assert_eq!(mems[2]["driver_pid"], serde_json::Value::Null);
    for k in [
        "id",
        "gpu",
        "bytes",
        "charged_pid",
        "handles",
        "export_refs",
    ] {
        assert!(mems[0][k].is_u64(), "{k}");
    }
}

/// NVOS54 control on (cl, obj) with `params` placed in fake memory; returns
/// (status, the params as the caller sees them after the call).
fn ctl_call(
    d: &mut Driver,
    m: &FakeMem,
    cl: u32,
    obj: u32,
    cmd: u32,
    params: &[u8],
) -> (u32, Vec<u8>) {
    let a = if params.is_empty() {
        0
    } else {
        m.place(params)
    };
    let mut c = vec![0u8; 32];
    w32(&mut c, 0, cl);
    w32(&mut c, 4, obj);
    w32(&mut c, 8, cmd);
    w64(&mut c, 16, a);
    w32(&mut c, 24, params.len() as u32);
    w32(&mut c, 28, 0xffff_ffff);
    call(d, m, CTL_FH, PID, 0xC020_462A, &mut c).unwrap();
    (r32(&c, 28), if a == 0 { Vec::new() } else { m.get(a) })
}

#[test]
fn controls_are_dispatched_in_the_drivers_order() {
    let m = FakeMem::new();
    let mut d = drv(2, 80 * GIB, "535.261.03");
    let (cl, dev) = setup(&mut d, &m, 1);
    let spa = m.place(&[0u8; 4]);
    let (st, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0xd1, 0x2080, spa, 4);
    assert_eq!(st, 0);
    // GPU_GET_NAME_STRING {flags@0, name@4 (128)}: 132 bytes, on the subdevice.
    let (st, p) = ctl_call(&mut d, &m, cl, sub, 0x2080_0110, &[0u8; 132]);
    assert_eq!(st, 0);
    assert_eq!(&p[4..15], b"NVIDIA H200");
    // The same command with a wrong size: INVALID_ARGUMENT, even on an object
    // that does not exist (the size is checked first).
    let (st, _) = ctl_call(&mut d, &m, cl, 0x4040, 0x2080_0110, &[0u8; 8]);
    assert_eq!(st, 0x1f);
    // Right size, unknown object: INVALID_OBJECT_HANDLE.
    let (st, _) = ctl_call(&mut d, &m, cl, 0x4040, 0x2080_0110, &[0u8; 132]);
    assert_eq!(st, 0x33);
    // A subdevice command sent to the device: not in its class table.
    let (st, _) = ctl_call(&mut d, &m, cl, dev, 0x2080_0110, &[0u8; 132]);
    assert_eq!(st, 0x56);
    // FB_GET_INFO_V2 {entryCount@0, entries[]@4 of {index, data}}: total RAM
    // (index 8) in KiB, from the configuration.
    let mut fb = vec![0u8; 436];
    w32(&mut fb, 0, 1);
    w32(&mut fb, 4, 8);
    let (st, p) = ctl_call(&mut d, &m, cl, sub, 0x2080_1303, &fb);
    assert_eq!(st, 0);
    assert_eq!(r32(&p, 8) as u64, 80 * GIB / 1024);
    // The null command (category and index 0) succeeds and does nothing.
    let (st, _) = ctl_call(&mut d, &m, cl, sub, 0x2080_0000, &[]);
    assert_eq!(st, 0);
    // Every control was counted for this process, failed ones too.
    let r = &d.state().received[0];
    assert_eq!((r.pid, r.controls["0x20800110"]), (PID, 4));
}

#[test]
fn events_on_nvidia_n_usermode_and_unknown_classes() {
    let m = FakeMem::new();
    let mut d = drv(1, 80 * GIB, "535.261.03");
    let (cl, dev) = setup(&mut d, &m, 0);
    let spa = m.place(&[0u8; 4]);
    let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0xd1, 0x2080, spa, 4);
    // NV01_EVENT_OS_EVENT (0x79) through nvidia0 (escape.c allows the event
    // classes there), naming the client of the nvidiactl file.
    let (st, ev) = alloc21(&mut d, &m, GPU0_FH, PID, cl, sub, 0, 0x79, 0, 0);
    assert_eq!(st, 0);
    assert_ne!(ev, 0);
    // Any other class through nvidia0 is refused by the escape itself.
    let mut b = nvos21(cl, dev, 0, 0x40, 0, 0);
    assert_eq!(
        call(&mut d, &m, GPU0_FH, PID, 0xC020_462B, &mut b),
        Err(libc::EINVAL)
    );
    // HOPPER_USERMODE_A under the subdevice, then mapped (NVOS33 + fd).
    let (st, um) = alloc21(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0xC661, 0, 0);
    assert_eq!(st, 0);
    let mut mm = vec![0u8; 56];
    w32(&mut mm, 0, cl);
    w32(&mut mm, 4, sub);
    w32(&mut mm, 8, um);
    w32(&mut mm, 40, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC038_464E, &mut mm).unwrap();
    assert_eq!(r32(&mm, 40), 0);
    // A class the driver does not know: INVALID_CLASS.
    let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xBEEF, 0, 0);
    assert_eq!(st, 0x22);
}

/// GPU_GET_PID_INFO (0x2080018e) of `pid` on the subdevice `sub` of client
/// `cl`: VIDEO_MEMORY_USAGE's memPrivate (entry 0: pid@8, index@12 = 0,
/// result@16, memPrivate@24 of the 14408-byte params).
fn pid_info(d: &mut Driver, m: &FakeMem, cl: u32, sub: u32, pid: u32) -> u64 {
    let mut p = vec![0u8; 14408];
    w32(&mut p, 0, 1);
    w32(&mut p, 8, pid);
    let (st, out) = control(d, m, CTL_FH, PID, &NoFds, cl, sub, 0x2080_018e, &p);
    assert_eq!((st, r32(&out, 16)), (0, 0));
    r64(&out, 24)
}

/// NV_MEMORY_HW_RESOURCES_ALLOCATION_PARAMS (120 bytes): attr@12, size@72.
fn hw_resources(d: &mut Driver, m: &FakeMem, cl: u32, dev: u32, attr: u32, size: u64) -> u32 {
    let mut p = vec![0u8; 120];
    w32(&mut p, 12, attr);
    w64(&mut p, 72, size);
    let a = m.place(&p);
    let (st, h) = alloc21(d, m, CTL_FH, PID, cl, dev, 0, 0xB1, a, 120);
    assert_eq!(st, 0);
    h
}

/// One client with two device objects on GPU 0 (memory under each) and a
/// HW_RESOURCES object under the first: the per-process figure NVML reads
/// follows each branch's rule (535: the first device and HW_RESOURCES; 545:
/// every device and HW_RESOURCES; 550 on: every device, no HW_RESOURCES),
/// while the exact figures are the same in every branch.
#[test]
fn pid_info_follows_each_branchs_rule_and_the_exact_figure_does_not() {
    for (version, want) in [
        ("535.261.03", 2 * MIB + 3 * MIB),
        ("545.29.06", 2 * MIB + 6 * MIB + 3 * MIB),
        ("550.163.01", 2 * MIB + 6 * MIB),
        ("570.211.01", 2 * MIB + 6 * MIB),
    ] {
        let m = FakeMem::new();
        let mut d = drv(2, 80 * GIB, version);
        let cl = client(&mut d, &m, CTL_FH, PID, 0);
        let (_, first) = device(&mut d, &m, CTL_FH, PID, cl, 0xd0, 0);
        let (_, second) = device(&mut d, &m, CTL_FH, PID, cl, 0xd1, 0);
        let (_, other_gpu) = device(&mut d, &m, CTL_FH, PID, cl, 0xd2, 1);
        let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, first, 0, 0x2080, 0, 0);
        memalloc(&mut d, &m, CTL_FH, PID, cl, sub, 0, 0x40, 2 * MIB);
        memalloc(&mut d, &m, CTL_FH, PID, cl, second, 0, 0x40, 6 * MIB);
        memalloc(&mut d, &m, CTL_FH, PID, cl, other_gpu, 0, 0x40, 10 * MIB);
        // Video (location 0) HW resources count up to 545; host ones never.
        hw_resources(&mut d, &m, cl, first, 0, 3 * MIB);
        hw_resources(&mut d, &m, cl, first, 2 << 25, 5 * MIB);
        assert_eq!(pid_info(&mut d, &m, cl, sub, PID), want, "{version}");
        assert_eq!(d.pid_info_video_bytes(PID, 0), want, "{version}");
        assert_eq!(d.pid_info_video_bytes(PID, 1), 10 * MIB, "{version}");
        // The exact figures: HW_RESOURCES takes no framebuffer.
        assert_eq!(d.gpu_used(0), 8 * MIB, "{version}");
        assert_eq!(fig(&d, PID, 0), (8 * MIB, 8 * MIB, 8 * MIB, 2, 0));
        let s = d.state();
        let g0 = &s.processes[0].gpus[0];
        assert_eq!(
            (g0.driver_video_bytes, g0.pid_info_video_bytes),
            (8 * MIB, want),
            "{version}"
        );
        // A pid with no client: nothing.
        assert_eq!(pid_info(&mut d, &m, cl, sub, PID + 1), 0);
        // The first device gone, the second is the first.
        assert_eq!(free(&mut d, &m, CTL_FH, cl, cl, first), 0);
        assert_eq!(d.pid_info_video_bytes(PID, 0), 6 * MIB, "{version}");
    }
}

/// A caller in a container: 9000 sees host pid P >= 4000 as P - 4000 and
/// nothing below; every other caller shares the host's namespace.
fn container_ns(pid: u32, caller: u32) -> Option<u32> {
    match caller {
        9000 => pid.checked_sub(4000),
        _ => Some(pid),
    }
}

/// GPU_GET_PIDS by class (0x2080018d: idType@0 CLASS, id@4, count@8,
/// pidTbl@12) of `gpu`'s subdevice `sub`, sent by `caller`.
fn get_pids(d: &mut Driver, m: &FakeMem, cl: u32, sub: u32, class: u32, caller: u32) -> Vec<u32> {
    let mut p = vec![0u8; 3812];
    w32(&mut p, 4, class);
    let (st, out) = control(d, m, CTL_FH, caller, &NoFds, cl, sub, 0x2080_018d, &p);
    assert_eq!(st, 0);
    (0..r32(&out, 8) as usize)
        .map(|k| r32(&out, 12 + 4 * k))
        .collect()
}

/// GET_PIDS answers a caller in a container with the pids it sees (every
/// branch); GET_PID_INFO matches the pid asked for in the initial namespace up
/// to 560 (so the container's pid finds nothing) and in the caller's from 565.
#[test]
fn pid_info_matches_pids_in_the_callers_namespace_from_565() {
    for (version, callers_ns) in [("550.163.01", false), ("570.211.01", true)] {
        let m = FakeMem::new();
        let mut d = drv(1, 80 * GIB, version);
        d.ns_pid = container_ns;
        let (cl, dev) = setup(&mut d, &m, 0);
        let (_, sub) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x2080, 0, 0);
        memalloc(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0x40, 2 * MIB);
        // A compute object (class 0xC7C0 stands for any owned class here).
        let (st, _) = alloc21(&mut d, &m, CTL_FH, PID, cl, dev, 0, 0xCBC0, 0, 0);
        assert_eq!(st, 0);
        // The host sees the host pid; the container 242.
        assert_eq!(get_pids(&mut d, &m, cl, sub, 0xCBC0, 1), [PID]);
        assert_eq!(get_pids(&mut d, &m, cl, sub, 0xCBC0, 9000), [PID - 4000]);
        // A process of the host the container cannot see is not listed to it.
        d.ns_pid = |pid, caller| if caller == 9000 { None } else { Some(pid) };
        assert!(get_pids(&mut d, &m, cl, sub, 0xCBC0, 9000).is_empty());
        d.ns_pid = container_ns;
        let info = |d: &mut Driver, pid: u32, caller: u32| {
            let mut p = vec![0u8; 14408];
            w32(&mut p, 0, 1);
            w32(&mut p, 8, pid);
            let (st, out) = control(d, &m, CTL_FH, caller, &NoFds, cl, sub, 0x2080_018e, &p);
            assert_eq!((st, r32(&out, 16)), (0, 0));
            r64(&out, 24)
        };
        assert_eq!(info(&mut d, PID, 1), 2 * MIB, "{version}: the host");
        let (container, host_pid) = if callers_ns {
            (2 * MIB, 0)
        } else {
            (0, 2 * MIB)
        };
        assert_eq!(info(&mut d, PID - 4000, 9000), container, "{version}");
        assert_eq!(info(&mut d, PID, 9000), host_pid, "{version}");
    }
}
