//! NVIDIA driver ioctls: decoded at entry (inputs) and exit (what the driver
//! returned), following XFER_CMD, and turned into exact accounting.
//!
//! Two backends see the calls, chosen by the agent at start; everything after
//! "this is an NVIDIA call on this file" ([`backends::enter`], [`backends::exit`]) is the same code:
//! - the syscall tracepoints (`sys_enter_ioctl`, `sys_exit_ioctl`), which work
//!   everywhere, the simulated driver included. Only ioctls whose command has the
//!   shape of an RM escape or a UVM command are looked at further, and only on
//!   files that are NVIDIA devices by their inode (files.rs): any other ioctl on
//!   the host costs one comparison at entry and one array load at exit, on top of
//!   the syscall tracepoints' own cost, which every ioctl pays once they are
//!   attached.
//! - the driver entry (`keling_driver_ioctl_entry` and `_return`: a kprobe and a
//!   kretprobe on the NVIDIA modules' `unlocked_ioctl` file operations), where the
//!   kernel allows kprobes and the modules are loaded: only NVIDIA calls reach
//!   them, so every other ioctl on the host pays nothing at all. The kernel hands
//!   them the open file; the fd comes from the syscall's saved registers.
//!
//! The kernel tail-calls only between programs of one type, so the handler
//! programs exist in both types (the `_kprobe` ones), each in its own program
//! array ([`handlers::IoctlCalls`]).
//!
//! Every call of a followed process is also counted at entry in `CALL_COUNTS`,
//! by RM escape, UVM command and RM_CONTROL command (keling-common's `call_kind`):
//! what the process sent, exact whatever the ring buffer drops.
//!
//! One file per job; imports between them go one way:
//!
//! ```text
//! backends ─> decode, handlers   the entry and exit programs of both backends
//! handlers ─> objects            the exit of each call, by escape (tail calls)
//! decode                         the call's inputs, read at entry; call counts
//! objects                        the object table: new objects, references, frees
//! ```
//!
//! What they all use (the pending call, the registered files, reads of the
//! caller's memory) is here.
mod backends;
mod decode;
mod handlers;
mod objects;

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap},
};
use keling_common::undecoded;

use crate::atomic_add;

/// What the entry learned, for the exit.
#[derive(Clone, Copy)]
struct PendingIoctl {
    /// User address of the escape's params (after following XFER).
    params: u64,
    /// `pAllocParms` (RM_ALLOC), or RM_CONTROL's params pointer; else 0.
    sub_params: u64,
    /// The open file the call was made on.
    file_id: u64,
    /// Export / import controls: the export file the params name.
    aux_file: u64,
    cmd: u32,
    /// RM escape nr, or the UVM command.
    escape: u32,
    /// Params size (from the command, or XFER's size).
    size: u32,
    device: u32,
    fd: i32,
    client: u32,
    parent: u32,
    /// Handle (in; RM may choose it and write it back) or object freed.
    handle: u32,
    class: u32,
    /// GPU from the params (device alloc) or the fd (nvidiaN).
    gpu: u32,
    /// RM_CONTROL command, or VID_HEAP function.
    sub: u32,
    /// RM_CONTROL's params size; RM_DUP_OBJECT's source client.
    aux: u32,
    /// RM_DUP_OBJECT's source handle.
    aux2: u32,
    via_xfer: u32,
    /// 0, or 1 + an undecoded reason found at entry.
    undecoded: u32,
    /// The caller.
    pid: u32,
    tid: u32,
    /// Filled at exit: ioctl's return value; the new object's memory kind and bytes.
    ret: i64,
    mem_kind: u32,
    /// 1 once RM_CONTROL's command (`sub`) was read at entry.
    has_control: u32,
    bytes: u64,
}

#[map]
static PENDING_IOCTL: HashMap<u32, PendingIoctl> =
    HashMap::with_max_entries(keling_common::MAX_PENDING, 0);

/// [0]: entries in `PENDING_IOCTL` now, at least (added to before an insert,
/// taken from after a remove that found one; an insert over a stale entry counts
/// twice, which only costs speed). While it is 0, `sys_exit_ioctl` returns before
/// any helper call or hash lookup: the exit of every ioctl that is not an NVIDIA
/// call in flight costs one array load (the verifier inlines array lookups).
#[map]
static IN_FLIGHT: Array<u64> = Array::with_max_entries(1, 0);

/// The pending entry of `tid` is gone: one fewer in flight.
#[inline(always)]
fn pending_removed(tid: u32) {
    if PENDING_IOCTL.remove(tid).is_ok()
        && let Some(n) = IN_FLIGHT.get_ptr_mut(0)
    {
        // SAFETY: a map value pointer; every CPU changes it only atomically.
        unsafe { atomic_add(n, u64::MAX) };
    }
}

/// nvidiaN open file -> the nvidiactl open file it was registered with
/// (REGISTER_FD): calls through the former act on clients of the latter. LRU: an
/// nvidiaN file's release is not followed, so old entries make room.
#[map]
static REGISTERED: aya_ebpf::maps::LruHashMap<u64, u64> =
    aya_ebpf::maps::LruHashMap::with_max_entries(keling_common::MAX_FILES, 0);

#[inline(always)]
fn user<T>(addr: u64) -> Result<T, u32> {
    // SAFETY: bpf_probe_read_user checks the address; a bad one is an error.
    unsafe { bpf_probe_read_user(addr as *const T) }.map_err(|_| undecoded::FAULT)
}

#[inline(always)]
fn user_u32(base: u64, off: usize) -> Result<u32, u32> {
    user::<u32>(base + off as u64)
}

#[inline(always)]
fn user_u64(base: u64, off: usize) -> Result<u64, u32> {
    user::<u64>(base + off as u64)
}

/// The first `N` 32-bit words of a parameter struct, in one read: a helper call
/// costs far more than the bytes, and the fields every call needs sit together at
/// the start. Indexed by byte offset (`w[off / 4]`, via [`word`] and [`dword`]).
#[inline(always)]
fn user_words<const N: usize>(base: u64) -> Result<[u32; N], u32> {
    user::<[u32; N]>(base)
}

#[inline(always)]
fn word<const N: usize>(w: &[u32; N], off: usize) -> u32 {
    w[off / 4]
}

/// A little-endian u64 at byte offset `off` of `w` (8-aligned in every struct).
#[inline(always)]
fn dword<const N: usize>(w: &[u32; N], off: usize) -> u64 {
    w[off / 4] as u64 | (w[off / 4 + 1] as u64) << 32
}
