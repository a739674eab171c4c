//! Byte-level tests of the driver state machine. Requests are built with the
//! offsets of NVIDIA-RM-ABI.md written out as literals here (not with the
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
    w32(&mut c, 8, 0x2080_0110);
    w32(&mut c, 28, 0xffff_ffff);
    call(&mut d, &m, CTL_FH, PID, 0xC020_462A, &mut c).unwrap();
    assert_eq!(r32(&c, 28), 0, "any cmd, null params: status 0");
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
    // MAP_EXTERNAL_ALLOCATION: base@0 length@8 read; nothing written
    let mut p = vec![0x5au8; 64];
    w64(&mut p, 0, 0x2000_0000);
    w64(&mut p, 8, 4 * MIB);
    let a = m.place(&p);
    assert_eq!(uvm(&mut d, 33, a), Ok(vec![]));
    assert_eq!(m.get(a), p);
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
