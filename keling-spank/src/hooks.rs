//! The plugin's symbols and SPANK hooks (see the crate doc). A panic never
//! crosses into Slurm: each hook catches it and lets the job run.
use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint},
    sync::atomic::{AtomicBool, Ordering},
};

use crate::{
    Attach, Outcome, SlurmRef,
    ffi::{self, Spank, SpankOption},
};

#[unsafe(no_mangle)]
pub static plugin_name: [u8; 7] = *b"keling\0";
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 6] = *b"spank\0";
#[unsafe(no_mangle)]
pub static plugin_version: c_uint = ffi::SLURM_VERSION_NUMBER;
#[unsafe(no_mangle)]
pub static spank_plugin_version: c_uint = 0;

const PRIORITY_VAL: c_int = 1;
const NOTIFY_VAL: c_int = 2;

/// Whether `--gpu-notify-preempt` was given (set by its callback).
static NOTIFY_PREEMPT: AtomicBool = AtomicBool::new(false);

/// The options, made once per process and never freed (Slurm keeps pointers).
fn options() -> [*mut SpankOption; 2] {
    let priority = Box::leak(Box::new(SpankOption {
        name: c"gpu-priority".as_ptr(),
        arginfo: c"P".as_ptr(),
        usage: c"Keling priority of this job's GPU work: 0 (highest) to 15 (lowest); a higher one preempts lower ones on its GPU".as_ptr(),
        has_arg: 1,
        val: PRIORITY_VAL,
        cb: Some(option_cb),
    }));
    let notify = Box::leak(Box::new(SpankOption {
        name: c"gpu-notify-preempt".as_ptr(),
        arginfo: std::ptr::null(),
        usage: c"Keling: tell the job (on its standard error) each time it is frozen and resumed"
            .as_ptr(),
        has_arg: 0,
        val: NOTIFY_VAL,
        cb: Some(option_cb),
    }));
    [priority, notify]
}

unsafe extern "C" fn option_cb(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    std::panic::catch_unwind(|| {
        if val == NOTIFY_VAL {
            NOTIFY_PREEMPT.store(true, Ordering::Relaxed);
            return 0;
        }
        if optarg.is_null() {
            return -1;
        }
        // SAFETY: Slurm passes the option's NUL-terminated argument.
        let arg = unsafe { CStr::from_ptr(optarg) }.to_string_lossy();
        match crate::parse_priority(&arg) {
            Ok(_) => 0,
            Err(why) => {
                error(&why);
                -1
            }
        }
    })
    .unwrap_or(-1)
}

fn error(msg: &str) {
    let m = CString::new(msg.replace('\0', "")).unwrap_or_default();
    // SAFETY: a "%s" format with one C string.
    unsafe { ffi::slurm_error(c"keling: %s".as_ptr(), m.as_ptr()) };
}

fn info(msg: &str) {
    let m = CString::new(msg.replace('\0', "")).unwrap_or_default();
    // SAFETY: a "%s" format with one C string.
    unsafe { ffi::slurm_info(c"keling: %s".as_ptr(), m.as_ptr()) };
}

/// Registers the options (every context: srun and sbatch show and check them,
/// slurmstepd hands their values to the task hook).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_init(sp: Spank, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    std::panic::catch_unwind(|| {
        for opt in options() {
            // SAFETY: a leaked option that outlives the process's use of it.
            if unsafe { ffi::spank_option_register(sp, opt) } != ffi::SUCCESS {
                error("cannot register its options (--gpu-priority, --gpu-notify-preempt)");
            }
        }
        0
    })
    .unwrap_or(0)
}

/// A job variable, as the task will see it.
fn getenv(sp: Spank, name: &str) -> Option<String> {
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: a buffer of its length.
    let r =
        unsafe { ffi::spank_getenv(sp, n.as_ptr(), buf.as_mut_ptr().cast(), buf.len() as c_int) };
    if r != ffi::SUCCESS {
        return None;
    }
    let s = CStr::from_bytes_until_nul(&buf).ok()?;
    Some(s.to_string_lossy().into_owned())
}

/// The job's supplementary groups (empty when Slurm does not say).
fn supplementary_groups(sp: Spank) -> Vec<u32> {
    let mut gids: *mut libc::gid_t = std::ptr::null_mut();
    let mut n: c_int = 0;
    // SAFETY: the item takes a `gid_t **` and an `int *`; Slurm keeps the array.
    let r = unsafe {
        ffi::spank_get_item(
            sp,
            ffi::S_JOB_SUPPLEMENTARY_GIDS,
            &mut gids as *mut *mut libc::gid_t,
            &mut n as *mut c_int,
        )
    };
    let n = usize::try_from(n).unwrap_or(0).min(65_536);
    if r != ffi::SUCCESS || gids.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: Slurm's array of `n` gids, read before anything can change it.
    unsafe { std::slice::from_raw_parts(gids, n) }.to_vec()
}

fn item_u32(sp: Spank, item: c_int) -> Option<u32> {
    let mut v: u32 = 0;
    // SAFETY: the items read here take a pointer to a 32-bit value.
    (unsafe { ffi::spank_get_item(sp, item, &mut v as *mut u32) } == ffi::SUCCESS).then_some(v)
}

/// `--gpu-priority`'s value in this job, if given.
fn priority_of(sp: Spank) -> Option<u8> {
    let [opt, _] = options();
    let mut arg: *mut c_char = std::ptr::null_mut();
    // SAFETY: an option like the registered one (matched by name) and an out pointer.
    if unsafe { ffi::spank_option_getopt(sp, opt, &mut arg) } != ffi::SUCCESS || arg.is_null() {
        return None;
    }
    // SAFETY: Slurm's NUL-terminated copy of the argument.
    let s = unsafe { CStr::from_ptr(arg) }.to_string_lossy();
    crate::parse_priority(&s).ok()
}

fn notify_of(sp: Spank) -> bool {
    let [_, opt] = options();
    let mut arg: *mut c_char = std::ptr::null_mut();
    // SAFETY: as in priority_of.
    let given = unsafe { ffi::spank_option_getopt(sp, opt, &mut arg) } == ffi::SUCCESS;
    given || NOTIFY_PREEMPT.load(Ordering::Relaxed)
}

/// In the task's process, as root, before it execs: hand it to the agent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_task_init_privileged(
    sp: Spank,
    ac: c_int,
    av: *mut *mut c_char,
) -> c_int {
    // SAFETY: Slurm passes the plugin's `ac` arguments.
    let args = unsafe { crate::args_of(ac, av.cast()) };
    std::panic::catch_unwind(|| task_init(sp, &args)).unwrap_or(0)
}

fn task_init(sp: Spank, args: &[String]) -> c_int {
    // SAFETY: no arguments.
    if unsafe { ffi::spank_context() } != ffi::S_CTX_REMOTE {
        return 0;
    }
    let args = match crate::parse_args(args.iter().map(String::as_str)) {
        Ok(a) => a,
        Err(why) => {
            error(&format!("plugstack.conf: {why}"));
            crate::PluginArgs::default()
        }
    };
    let Some(step) = item_u32(sp, ffi::S_JOB_STEPID) else {
        error("cannot read the job step's id from Slurm: this task is not handed to Keling");
        return if args.refuse_without_agent { -1 } else { 0 };
    };
    let Some(gpus) = crate::job_gpus(step, |v| getenv(sp, v)) else {
        return 0; // no GPU of this node in the step: nothing for Keling
    };
    let node = crate::node_name(|v| std::env::var(v).ok(), |v| getenv(sp, v)).unwrap_or_default();
    let socket = crate::socket_for(&args, Some(&node));
    let ids = (
        item_u32(sp, ffi::S_JOB_UID),
        item_u32(sp, ffi::S_JOB_GID),
        item_u32(sp, ffi::S_JOB_ID),
        item_u32(sp, ffi::S_TASK_GLOBAL_ID),
    );
    // Never a guess: an owner of 0 would be root's limits.
    let (Some(uid), Some(gid), Some(job), Some(task)) = ids else {
        error(&format!(
            "cannot read the job's owner, group, id or task id from Slurm ({ids:?}): this task \
             is not handed to Keling"
        ));
        return if args.refuse_without_agent { -1 } else { 0 };
    };
    let req = Attach {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() } as u32,
        uid,
        gid,
        slurm: SlurmRef { job, step, task },
        gpus: gpus.gpus,
        mem_budget_bytes: gpus.budget_bytes,
        priority: priority_of(sp),
        notify_preempt: notify_of(sp),
        groups: supplementary_groups(sp),
    };
    let first_here = item_u32(sp, ffi::S_TASK_ID).unwrap_or(0) == 0;
    match crate::attach(&socket, &req, libc::STDERR_FILENO) {
        Outcome::Attached { task } => {
            info(&format!(
                "job {} step {} task {}: Keling task {task} on GPU {}",
                req.slurm.job, req.slurm.step, req.slurm.task, req.gpus[0]
            ));
            0
        }
        Outcome::Refused(why) => {
            let msg = format!("keling: the agent of node {node} refused this task: {why}");
            crate::tell(libc::STDERR_FILENO, &msg);
            logged(&msg);
            -1
        }
        Outcome::NoAgent(why) => without_keling(
            &crate::no_agent_message(&node, &why, args.refuse_without_agent),
            first_here,
            args.refuse_without_agent,
        ),
        Outcome::NotTaken(why) => without_keling(
            &crate::not_taken_message(&node, &why, args.refuse_without_agent),
            first_here,
            args.refuse_without_agent,
        ),
    }
}

/// The task goes on without Keling (`msg` says why), or with
/// `refuse_without_agent` (`refuse`) fails; the first task of the node tells
/// its output.
fn without_keling(msg: &str, first_here: bool, refuse: bool) -> c_int {
    if first_here || refuse {
        crate::tell(libc::STDERR_FILENO, msg);
    }
    logged(msg);
    if refuse { -1 } else { 0 }
}

/// What the task's output was told, for slurmd's log too: at info level,
/// since slurmstepd writes its own errors to the job's standard error as well
/// (`slurmstepd-NODE: error: ...`, measured), which would tell the job twice,
/// and each task of the step once more.
fn logged(msg: &str) {
    info(msg.strip_prefix("keling: ").unwrap_or(msg));
}
