//! The simulated driver's ioctl handling (`keling-nvsim`'s `Driver`) as its FUSE
//! server drives it: opens, ioctls with raw params on nvidiactl, nvidiaN and
//! nvidia-uvm (with the descriptor an export/import control names resolved, as
//! `fuse.rs` does), and releases, on a state that persists across the calls.
//!
//! Input: byte 0 = GPUs (1-4) and driver version; bytes 1..4097 = the caller's
//! memory at 0x1000 (pointers inside params land there); then calls:
//! op, cmd (u32), arg (u64), in_len (u16), out_len (u16), in_data.
#![no_main]
use std::{cell::RefCell, collections::BTreeMap};

use keling_nvsim::driver::{Config, Driver, FileKind, UserMem};
use libfuzzer_sys::fuzz_target;

const MEM_BASE: u64 = 0x1000;
const MEM_LEN: usize = 4096;
const VERSIONS: [&str; 4] = ["535.261.03", "525.147.05", "550.54.14", "580.95.05"];

/// The caller's memory: one region at [`MEM_BASE`]; anything else faults.
struct Mem(RefCell<Vec<u8>>);

impl Mem {
    fn range(&self, addr: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let off = usize::try_from(addr.checked_sub(MEM_BASE)?).ok()?;
        let end = off.checked_add(len)?;
        (end <= self.0.borrow().len()).then_some(off..end)
    }
}

impl UserMem for Mem {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let r = self.range(addr, len)?;
        Some(self.0.borrow()[r].to_vec())
    }
    fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.range(addr, data.len()) {
            Some(r) => {
                self.0.borrow_mut()[r].copy_from_slice(data);
                true
            }
            None => false,
        }
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn le<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let t = self.take(N);
        b[..t.len()].copy_from_slice(t);
        b
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.u8();
    let gpus = 1 + (setup & 3) as u32;
    let mut driver = Driver::new(Config {
        gpus,
        mem_per_gpu: 16 << 30,
        driver_version: VERSIONS[(setup >> 2) as usize & 3].into(),
    });
    let mut mem = input.take(MEM_LEN).to_vec();
    mem.resize(MEM_LEN, 0);
    let mem = Mem(RefCell::new(mem));
    // Files 10..=15: nvidiactl, nvidia0..3, nvidia-uvm (as the fh FUSE gave);
    // only the GPUs the machine has have a file (an absent one is nvidiactl).
    let file_of = |fh: u64| match fh {
        15 => FileKind::Uvm,
        n @ 11..=14 if ((n - 11) as u32) < gpus => FileKind::Gpu((n - 11) as u32),
        _ => FileKind::Ctl,
    };
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        let op = input.u8();
        let fh = 10 + (op & 7) as u64 % 6;
        let file = file_of(fh);
        let pid = 1000 + ((op >> 3) & 3) as u32;
        match op >> 5 {
            0 => driver.open(fh, file),
            1 => driver.release(fh),
            _ => {
                let cmd = u32::from_le_bytes(input.le());
                let arg = u64::from_le_bytes(input.le());
                let in_len = u16::from_le_bytes(input.le()) as usize;
                let out_len = u16::from_le_bytes(input.le()) as usize;
                let in_data = input.take(in_len).to_vec();
                // A named descriptor resolves to one of the open files, or none.
                let mut fds = BTreeMap::new();
                if let Some(fd) = driver.named_fd(file, cmd, arg, &in_data, &mem)
                    && fd % 2 == 0
                {
                    fds.insert(fd, 10 + (fd as u64) % 6);
                }
                let _ = driver.ioctl_fds(fh, file, pid, cmd, arg, &in_data, out_len, &mem, &fds);
            }
        }
    }
    let _ = driver.state_json();
    for fh in 10..16 {
        driver.release(fh);
    }
    assert_eq!(
        driver.memory_count(),
        0,
        "every memory freed once every file is released"
    );
});
