//! Parameter decoding at entry: what the call asks, read from the caller's
//! memory before the driver changes it; and the exact call counts.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use keling_common::{
    MAX_CALL_KEYS, call_key, call_kind, device_file,
    nvidia::{
        self, NV0080_DEVICE_ID, class, ctrl, escape, nvos00, nvos02, nvos21, nvos32, nvos33,
        nvos54, nvos55, nvos64, size, xfer,
    },
    undecoded,
};

use super::{PendingIoctl, dword, user_u32, user_u64, user_words, word};
use crate::{
    atomic_add,
    probes::files::{device_of_file, file_of_fd},
};

/// Calls of followed processes by `call_key(kind, number)`: what they sent, counted
/// at entry. Updated with atomic adds (one process's threads call on several
/// CPUs at once). `keling trace` only: the agent (`active::limited`) counts none.
#[map]
static CALL_COUNTS: HashMap<u64, u64> = HashMap::with_max_entries(MAX_CALL_KEYS, 0);

/// [0]: calls not in `CALL_COUNTS` because it was full when their key was new.
#[map]
static CALLS_UNCOUNTED: Array<u64> = Array::with_max_entries(1, 0);

const BPF_NOEXIST: u64 = 1;

/// Reads the inputs of the call described by `p.cmd`/`p.params`.
#[inline(never)]
pub(super) fn decode_enter(p: &mut PendingIoctl) -> Result<(), u32> {
    if p.device == device_file::UVM {
        p.escape = p.cmd;
        return Ok(());
    }
    if nvidia::rm_type(p.cmd) != nvidia::RM_IOCTL_TYPE {
        return Err(undecoded::UNKNOWN_ESCAPE);
    }
    p.escape = nvidia::rm_nr(p.cmd);
    p.size = nvidia::rm_size(p.cmd);
    if p.escape == escape::XFER_CMD {
        if p.size != size::XFER {
            return Err(undecoded::UNKNOWN_LAYOUT);
        }
        let w = user_words::<4>(p.params)?;
        p.escape = word(&w, xfer::CMD) & 0xff;
        p.size = word(&w, xfer::SIZE);
        p.params = dword(&w, xfer::PTR);
        p.via_xfer = 1;
    }
    let base = p.params;
    match p.escape {
        escape::ALLOC => {
            let flags_off = match p.size {
                size::NVOS21_ALLOC => None,
                size::NVOS64_ALLOC => Some(nvos64::FLAGS),
                nvos64::SIZE_PRE_535 => Some(nvos64::FLAGS_PRE_535),
                _ => return Err(undecoded::UNKNOWN_LAYOUT),
            };
            if let Some(off) = flags_off
                && user_u32(base, off)? & nvos64::FLAGS_FINN_SERIALIZED != 0
            {
                return Err(undecoded::FINN_SERIALIZED);
            }
            let w = user_words::<6>(base)?;
            p.client = word(&w, nvos21::H_ROOT);
            p.parent = word(&w, nvos21::H_OBJECT_PARENT);
            p.class = word(&w, nvos21::H_CLASS);
            p.sub_params = dword(&w, nvos21::P_ALLOC_PARMS);
            if p.class == class::NV01_DEVICE_0 {
                p.gpu = device_gpu(p.sub_params)?;
            }
        }
        escape::ALLOC_OBJECT => {
            // NVOS21's first 16 bytes, no params: `sub_params` stays 0.
            if p.size != size::NVOS05_ALLOC_OBJECT {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos21::H_ROOT);
            p.parent = word(&w, nvos21::H_OBJECT_PARENT);
            p.class = word(&w, nvos21::H_CLASS);
            if p.class == class::NV01_DEVICE_0 {
                p.gpu = device_gpu(0)?;
            }
        }
        escape::FREE => {
            if p.size != size::NVOS00_FREE {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos00::H_ROOT);
            p.parent = word(&w, nvos00::H_OBJECT_PARENT);
            p.handle = word(&w, nvos00::H_OBJECT_OLD);
        }
        escape::ALLOC_MEMORY => {
            if p.size != size::NVOS02_ALLOC_MEMORY {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos02::H_ROOT);
            p.parent = word(&w, nvos02::H_OBJECT_PARENT);
            p.class = word(&w, nvos02::H_CLASS);
        }
        escape::VID_HEAP_CONTROL => {
            if p.size != size::NVOS32_VID_HEAP {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos32::H_ROOT);
            p.parent = word(&w, nvos32::H_OBJECT_PARENT);
            p.sub = word(&w, nvos32::FUNCTION);
            p.handle = user_u32(base, nvos32::H_MEMORY)?;
        }
        escape::CONTROL => {
            if p.size != size::NVOS54_CONTROL {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<4>(base)?;
            p.client = word(&w, nvos54::H_CLIENT);
            p.handle = word(&w, nvos54::H_OBJECT);
            p.sub = word(&w, nvos54::CMD);
            p.has_control = 1;
            if word(&w, nvos54::FLAGS) & nvos54::FLAGS_FINN_SERIALIZED != 0 {
                return Err(undecoded::FINN_SERIALIZED);
            }
            decode_control_enter(p)?;
        }
        escape::DUP_OBJECT => {
            if p.size != size::NVOS55_DUP_OBJECT {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<5>(base)?;
            p.client = word(&w, nvos55::H_CLIENT);
            p.parent = word(&w, nvos55::H_PARENT);
            p.aux = word(&w, nvos55::H_CLIENT_SRC);
            p.aux2 = word(&w, nvos55::H_OBJECT_SRC);
        }
        escape::MAP_MEMORY | escape::UNMAP_MEMORY => {
            let want = if p.escape == escape::MAP_MEMORY {
                size::NVOS33_MAP_MEMORY
            } else {
                size::NVOS34_UNMAP_MEMORY
            };
            if p.size != want {
                return Err(undecoded::UNKNOWN_LAYOUT);
            }
            let w = user_words::<3>(base)?;
            p.client = word(&w, nvos33::H_CLIENT);
            p.handle = word(&w, nvos33::H_MEMORY);
        }
        escape::REGISTER_FD => {
            // `{int ctl_fd}`: this nvidiaN file acts for the clients of that
            // nvidiactl file (RM_ALLOC_MEMORY comes through nvidiaN).
            let ctl_fd = user_u32(base, 0)? as i32;
            p.aux_file = file_of_fd(ctl_fd);
        }
        e if escape::carries_no_memory(e) => {}
        _ => return Err(undecoded::UNKNOWN_ESCAPE),
    }
    Ok(())
}

/// The GPU of a device object from its `NV0080_ALLOC_PARAMETERS` (`params`, 0 when
/// none: the driver then takes device instance `class - NV01_DEVICE_0`, that is 0,
/// `deviceConstruct_IMPL`).
#[inline(always)]
fn device_gpu(params: u64) -> Result<u32, u32> {
    if params == 0 {
        return Ok(0);
    }
    user_u32(params, NV0080_DEVICE_ID)
}

/// Counts the call `p` describes in `CALL_COUNTS` (see the module doc).
#[inline(never)]
pub(super) fn count_calls(p: &PendingIoctl) {
    if p.device == device_file::UVM {
        count_call(call_key(call_kind::UVM, p.cmd));
        return;
    }
    if nvidia::rm_type(p.cmd) != nvidia::RM_IOCTL_TYPE {
        count_call(call_key(call_kind::NOT_RM, p.cmd));
        return;
    }
    // After XFER_CMD, the escape it carries (`escape` is the command's own nr when
    // the XFER struct could not be read).
    let nr = if p.via_xfer != 0 {
        p.escape
    } else {
        nvidia::rm_nr(p.cmd)
    };
    count_call(call_key(call_kind::RM_ESCAPE, nr));
    if p.has_control != 0 {
        count_call(call_key(call_kind::RM_CONTROL, p.sub));
    }
}

/// Adds one call to `CALL_COUNTS[key]`, exactly: a new key is inserted only if
/// absent (two CPUs meeting a new key at once land on the same entry), then added
/// to atomically.
#[inline(never)]
fn count_call(key: u64) {
    if let Some(n) = CALL_COUNTS.get_ptr_mut(key) {
        // SAFETY: an aligned map value, updated atomically.
        unsafe { atomic_add(n, 1) };
        return;
    }
    let _ = CALL_COUNTS.insert(key, 0u64, BPF_NOEXIST);
    let n = match CALL_COUNTS.get_ptr_mut(key) {
        Some(n) => n,
        None => match CALLS_UNCOUNTED.get_ptr_mut(0) {
            Some(n) => n,
            None => return,
        },
    };
    // SAFETY: as above.
    unsafe { atomic_add(n, 1) };
}

/// RM_CONTROL: the controls that share memory name an export file by fd in the
/// caller's table; resolve it now, while the fd means what the caller meant.
#[inline(always)]
fn decode_control_enter(p: &mut PendingIoctl) -> Result<(), u32> {
    let (want, fd_off) = match p.sub {
        ctrl::EXPORT_OBJECT_TO_FD => (ctrl::EXPORT_SIZE, ctrl::EXPORT_FD),
        ctrl::IMPORT_OBJECT_FROM_FD => (ctrl::IMPORT_SIZE, ctrl::IMPORT_FD),
        ctrl::EXPORT_OBJECTS_TO_FD => (ctrl::EXPORT_BATCH_SIZE, ctrl::EXPORT_BATCH_FD),
        ctrl::IMPORT_OBJECTS_FROM_FD => (ctrl::IMPORT_BATCH_SIZE, ctrl::IMPORT_BATCH_FD),
        _ => return Ok(()),
    };
    p.sub_params = user_u64(p.params, nvos54::PARAMS)?;
    p.aux = user_u32(p.params, nvos54::PARAMS_SIZE)?;
    if p.aux != want {
        return Err(undecoded::UNKNOWN_LAYOUT);
    }
    let fd = user_u32(p.sub_params, fd_off)? as i32;
    p.aux_file = file_of_fd(fd);
    if device_of_file(p.aux_file) != device_file::CTL {
        // Not an nvidiactl open file: the driver refuses it; nothing to account.
        p.aux_file = 0;
    }
    Ok(())
}
