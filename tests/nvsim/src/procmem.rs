//! Access to the memory of the process making an ioctl, and tid -> tgid.

use std::io::Read;

use crate::driver::UserMem;

/// The memory of one thread's process, through `process_vm_readv/writev`.
/// FUSE gives the calling thread's id; these syscalls accept a tid as well.
pub struct ProcMem {
    pub tid: u32,
}

impl UserMem for ProcMem {
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let mut buf = vec![0u8; len];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` points at `len` writable bytes we own; the remote
        // iovec is only interpreted by the kernel in the other process.
        let n =
            unsafe { libc::process_vm_readv(self.tid as libc::pid_t, &local, 1, &remote, 1, 0) };
        (n == len as isize).then_some(buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: `local` points at `data`, which the kernel only reads; the
        // remote iovec is only interpreted by the kernel in the other process.
        let n =
            unsafe { libc::process_vm_writev(self.tid as libc::pid_t, &local, 1, &remote, 1, 0) };
        n == data.len() as isize
    }
}

/// The process (thread group) id of thread `tid`, from `/proc/<tid>/status`.
pub fn tgid_of(tid: u32) -> Option<u32> {
    let mut s = String::new();
    std::fs::File::open(format!("/proc/{tid}/status"))
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_own_memory_and_faults_on_bad_addresses() {
        let me = std::process::id();
        let m = ProcMem { tid: me };
        let mut x = [1u8, 2, 3, 4];
        let a = x.as_mut_ptr() as u64;
        assert_eq!(m.read(a, 4), Some(vec![1, 2, 3, 4]));
        assert!(m.write(a + 1, &[9, 9]));
        // SAFETY: the kernel wrote into `x` behind the compiler's back.
        let y = unsafe { std::ptr::read_volatile(&x) };
        assert_eq!(y, [1, 9, 9, 4]);
        assert_eq!(m.read(0x10, 4), None);
        assert!(!m.write(0x10, &[1]));
        assert_eq!(tgid_of(me), Some(me));
    }
}
