//! The SPANK API, declared by hand from Slurm 22.05's `spank.h` (the calls and
//! item numbers this plugin uses; the header has been stable across releases).
//! The functions are resolved at load time from the process that loads the
//! plugin (srun, sbatch, salloc, slurmstepd).
use std::ffi::{c_char, c_int, c_void};

/// `spank_t`: Slurm's handle, opaque.
pub type Spank = *mut c_void;

/// `spank_opt_cb_f`.
pub type OptionCallback =
    unsafe extern "C" fn(val: c_int, optarg: *const c_char, remote: c_int) -> c_int;

/// `struct spank_option`.
#[repr(C)]
pub struct SpankOption {
    pub name: *const c_char,
    pub arginfo: *const c_char,
    pub usage: *const c_char,
    /// 1: the option takes an argument.
    pub has_arg: c_int,
    pub val: c_int,
    pub cb: Option<OptionCallback>,
}

/// `ESPANK_SUCCESS`.
pub const SUCCESS: c_int = 0;

// `enum spank_item`, as numbered in spank.h.
pub const S_JOB_UID: c_int = 0;
pub const S_JOB_GID: c_int = 1;
pub const S_JOB_ID: c_int = 2;
pub const S_JOB_STEPID: c_int = 3;
pub const S_TASK_ID: c_int = 11;
pub const S_TASK_GLOBAL_ID: c_int = 12;
/// `gid_t **` and `int *`: the job's supplementary groups.
pub const S_JOB_SUPPLEMENTARY_GIDS: c_int = 19;

// `enum spank_context`.
pub const S_CTX_REMOTE: c_int = 2;

/// `SLURM_VERSION_NUMBER` of the Slurm this was written against (22.05.8);
/// Slurm does not check it for SPANK plugins.
pub const SLURM_VERSION_NUMBER: u32 = 0x16_05_08;

unsafe extern "C" {
    pub fn spank_context() -> c_int;
    pub fn spank_option_register(sp: Spank, opt: *mut SpankOption) -> c_int;
    pub fn spank_option_getopt(sp: Spank, opt: *mut SpankOption, optarg: *mut *mut c_char)
    -> c_int;
    pub fn spank_get_item(sp: Spank, item: c_int, ...) -> c_int;
    pub fn spank_getenv(sp: Spank, var: *const c_char, buf: *mut c_char, len: c_int) -> c_int;
    pub fn slurm_error(fmt: *const c_char, ...);
    pub fn slurm_info(fmt: *const c_char, ...);
}
