//! `keling-cuda-probe`: a CUDA driver-API program, the first thing any CUDA
//! application does, for testing against real libcuda in `keling-nvsim sandbox`.
//!
//! It loads `libcuda.so.1` by its soname (no CUDA toolkit needed), calls
//! cuInit, cuDriverGetVersion, cuDeviceGetCount and, for every device,
//! cuDeviceGet, cuDeviceGetName, cuDeviceTotalMem_v2, cuDeviceGetPCIBusId and
//! cuDeviceGetAttribute for the attributes below, and prints one JSON object on
//! stdout, with how many NVIDIA device files it holds open after cuInit
//! (`nvidia_fds_after_init`) and after the device queries (`nvidia_fds`, and by
//! file in `nvidia_fds_by_file`): what sizes Keling's per-process fd table. Exits 0 when every call returned CUDA_SUCCESS; otherwise the object
//! names the first failing call and its CUresult, and the exit code is 1.
//!
//! ```json
//! {"ok":true,"driver_version":12020,"count":2,
//!  "devices":[{"ordinal":0,"name":"NVIDIA H200","total_mem":151397597184,
//!              "pci_bus_id":"0000:18:00.0","attributes":{"compute_capability_major":9,...}}]}
//! ```
use std::ffi::{CStr, c_char, c_int, c_void};

/// `CUdevice_attribute` values (cuda.h) the probe asks for.
const ATTRIBUTES: &[(&str, c_int)] = &[
    ("max_threads_per_block", 1),
    ("warp_size", 10),
    ("multiprocessor_count", 16),
    ("pci_bus_id", 33),
    ("pci_device_id", 34),
    ("pci_domain_id", 50),
    ("compute_capability_major", 75),
    ("compute_capability_minor", 76),
];

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuInt = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

/// This process's open fds on NVIDIA device files (`/dev/nvidia*`), by file name.
fn nvidia_fds() -> std::collections::BTreeMap<String, u64> {
    let mut by_file = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(e.path())
            && let Some(name) = target.to_str().and_then(|t| t.strip_prefix("/dev/"))
            && name.starts_with("nvidia")
        {
            *by_file.entry(name.to_owned()).or_insert(0) += 1;
        }
    }
    by_file
}

/// Prints the failure object and exits 1.
fn fail(call: &str, code: c_int, so_far: &serde_json::Value) -> ! {
    let mut v = so_far.clone();
    v["ok"] = false.into();
    v["failed_call"] = call.into();
    v["cuda_result"] = code.into();
    println!("{v}");
    std::process::exit(1);
}

/// The address of `name` in `lib`, as a function of type `T`.
///
/// # Safety
/// `T` must be the function's real type.
unsafe fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> T {
    // SAFETY: `lib` is a handle from dlopen and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        println!(
            "{}",
            serde_json::json!({"ok": false, "failed_call": "dlsym", "symbol": name.to_string_lossy()})
        );
        std::process::exit(1);
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller vouches for the type; sizes are checked above.
    unsafe { std::mem::transmute_copy(&p) }
}

fn main() {
    // SAFETY: dlopen with a NUL-terminated soname.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message or NULL.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                String::new()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        println!(
            "{}",
            serde_json::json!({"ok": false, "failed_call": "dlopen libcuda.so.1", "error": why})
        );
        std::process::exit(1);
    }
    // SAFETY: the types are those of cuda.h for each entry point.
    let (init, version, count, get, name, total, pci, attr) = unsafe {
        (
            sym::<CuInit>(lib, c"cuInit"),
            sym::<CuInt>(lib, c"cuDriverGetVersion"),
            sym::<CuInt>(lib, c"cuDeviceGetCount"),
            sym::<CuDeviceGet>(lib, c"cuDeviceGet"),
            sym::<CuDeviceGetName>(lib, c"cuDeviceGetName"),
            sym::<CuDeviceTotalMem>(lib, c"cuDeviceTotalMem_v2"),
            sym::<CuDeviceGetName>(lib, c"cuDeviceGetPCIBusId"),
            sym::<CuDeviceGetAttribute>(lib, c"cuDeviceGetAttribute"),
        )
    };
    let mut out = serde_json::json!({"ok": true, "pid": std::process::id()});
    // SAFETY: a libcuda entry point with out-pointers to live locals and
    // the lengths of their buffers.
    let r = unsafe { init(0) };
    if r != 0 {
        fail("cuInit", r, &out);
    }
    out["nvidia_fds_after_init"] = nvidia_fds().values().sum::<u64>().into();
    let mut v: c_int = 0;
    // SAFETY: a libcuda entry point with out-pointers to live locals and
    // the lengths of their buffers.
    let r = unsafe { version(&mut v) };
    if r != 0 {
        fail("cuDriverGetVersion", r, &out);
    }
    out["driver_version"] = v.into();
    let mut n: c_int = 0;
    // SAFETY: a libcuda entry point with out-pointers to live locals and
    // the lengths of their buffers.
    let r = unsafe { count(&mut n) };
    if r != 0 {
        fail("cuDeviceGetCount", r, &out);
    }
    out["count"] = n.into();
    let mut devices = Vec::new();
    for ordinal in 0..n {
        let mut dev: c_int = 0;
        // SAFETY: a libcuda entry point with out-pointers to live locals and
        // the lengths of their buffers.
        let r = unsafe { get(&mut dev, ordinal) };
        if r != 0 {
            fail("cuDeviceGet", r, &out);
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: a libcuda entry point with out-pointers to live locals and
        // the lengths of their buffers.
        let r = unsafe { name(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        if r != 0 {
            fail("cuDeviceGetName", r, &out);
        }
        // SAFETY: libcuda wrote a NUL-terminated string within the buffer.
        let dev_name = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut bytes: usize = 0;
        // SAFETY: a libcuda entry point with out-pointers to live locals and
        // the lengths of their buffers.
        let r = unsafe { total(&mut bytes, dev) };
        if r != 0 {
            fail("cuDeviceTotalMem_v2", r, &out);
        }
        let mut bus = [0 as c_char; 64];
        // SAFETY: a libcuda entry point with out-pointers to live locals and
        // the lengths of their buffers.
        let r = unsafe { pci(bus.as_mut_ptr(), bus.len() as c_int, dev) };
        if r != 0 {
            fail("cuDeviceGetPCIBusId", r, &out);
        }
        // SAFETY: as above.
        let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut attributes = serde_json::Map::new();
        for (label, a) in ATTRIBUTES {
            let mut x: c_int = 0;
            // SAFETY: a libcuda entry point with out-pointers to live locals and
            // the lengths of their buffers.
            let r = unsafe { attr(&mut x, *a, dev) };
            if r != 0 {
                fail(&format!("cuDeviceGetAttribute({label})"), r, &out);
            }
            attributes.insert(label.to_string(), x.into());
        }
        devices.push(serde_json::json!({
            "ordinal": ordinal, "name": dev_name, "total_mem": bytes,
            "pci_bus_id": bus, "attributes": attributes,
        }));
    }
    out["devices"] = devices.into();
    let by_file = nvidia_fds();
    out["nvidia_fds"] = by_file.values().sum::<u64>().into();
    out["nvidia_fds_by_file"] = serde_json::json!(by_file);
    println!("{out}");
}
