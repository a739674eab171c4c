//! The exit of each call, by escape: its status, and for the calls that change
//! memory a handler program of its own (reached by tail call), which hands the
//! objects to the object table.
use aya_ebpf::{
    macros::map,
    maps::ProgramArray,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use keling_common::{
    BATCH_OBJECTS, EventKind, GpuIoctlEvent, ObjectKey, active_cause, device_file, mem_kind,
    nvidia::{
        MEMORY_ALLOCATION_PARAMS_SIZE, OS_DESC_LIMIT, ObjectKind, class, ctrl, escape,
        hw_resources, nvos00, nvos02, nvos05, nvos21, nvos32, nvos33, nvos34, nvos54, nvos55,
        nvos64, size, uvm,
    },
    outcome, ref_how, table_full, tail_call, undecoded,
};

use super::{
    PENDING_IOCTL, PendingIoctl, REGISTERED,
    objects::{export_one, free_object, import_one, new_ref, record_object},
    pending_removed, user, user_u32, user_u64,
};
use crate::{
    count_table_full, count_undecoded, current_ids, emit, emit_quiet, header,
    probes::{
        deferred::{self, TailCalls},
        files::device_of_file,
    },
    table_full_at,
};

/// What a call that changed no memory is reported as.
#[derive(Clone, Copy)]
pub(super) struct Report {
    status: u32,
    outcome: u32,
    /// A failed video allocation: the bytes asked for.
    requested: u64,
}

impl Report {
    pub(super) fn status(status: u32) -> Self {
        Report {
            status,
            outcome: outcome::DECODED,
            requested: 0,
        }
    }
}

/// Handlers of the calls that change memory, each its own program reached by tail
/// call from `sys_exit_ioctl` (together they are too much for the verifier).
pub const IOCTL_ALLOC: u32 = tail_call::ioctl::ALLOC;
pub const IOCTL_FREE: u32 = tail_call::ioctl::FREE;
pub const IOCTL_CONTROL: u32 = tail_call::ioctl::CONTROL;
pub const IOCTL_DUP: u32 = tail_call::ioctl::DUP;
pub const IOCTL_BATCH_EXPORT: u32 = tail_call::ioctl::BATCH_EXPORT;
pub const IOCTL_BATCH_IMPORT: u32 = tail_call::ioctl::BATCH_IMPORT;

/// The handler programs, by the numbers above; set by the agent at load time.
#[map]
static IOCTL_PROG: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);
/// The same, as kprobe programs (the driver-entry backend).
#[map]
static IOCTL_PROG_KPROBE: ProgramArray = ProgramArray::with_max_entries(tail_call::SLOTS, 0);

/// A program type and its array of handler programs (see [`TailCalls`]).
pub trait IoctlCalls: TailCalls {
    fn ioctl_prog() -> &'static ProgramArray;
}

impl IoctlCalls for TracePointContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG
    }
}

impl IoctlCalls for ProbeContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG_KPROBE
    }
}

impl IoctlCalls for RetProbeContext {
    #[inline(always)]
    fn ioctl_prog() -> &'static ProgramArray {
        &IOCTL_PROG_KPROBE
    }
}

/// Which handler a successful call needs (0: none, it is a plain call).
#[inline(always)]
pub(super) fn handler(p: &PendingIoctl) -> u32 {
    if p.device == device_file::UVM {
        return 0;
    }
    match p.escape {
        escape::ALLOC | escape::ALLOC_OBJECT | escape::ALLOC_MEMORY => IOCTL_ALLOC,
        escape::VID_HEAP_CONTROL if p.sub == nvos32::FUNCTION_FREE => IOCTL_FREE,
        escape::VID_HEAP_CONTROL => IOCTL_ALLOC,
        escape::FREE => IOCTL_FREE,
        escape::CONTROL if p.sub_params != 0 && p.sub == ctrl::EXPORT_OBJECTS_TO_FD => {
            IOCTL_BATCH_EXPORT
        }
        escape::CONTROL if p.sub_params != 0 && p.sub == ctrl::IMPORT_OBJECTS_FROM_FD => {
            IOCTL_BATCH_IMPORT
        }
        escape::CONTROL if p.sub_params != 0 => IOCTL_CONTROL,
        escape::DUP_OBJECT => IOCTL_DUP,
        _ => 0,
    }
}

/// Reports the outcome of a call and lets go of its pending entry; runs any work
/// it queued.
#[inline(always)]
pub(super) fn finish<C: IoctlCalls>(
    ctx: &C,
    p: &mut PendingIoctl,
    result: Result<Option<Report>, u32>,
) {
    let tid = p.tid;
    match result {
        // Fully reported; a teardown it queued is done now.
        Ok(None) => {
            pending_removed(tid);
            deferred::run(ctx);
        }
        Ok(Some(report)) => {
            let reason = p.undecoded;
            let mut report = report;
            if reason != 0 {
                count_undecoded(p.pid, call_reason(reason - 1));
                report.outcome = outcome::UNDECODED;
            }
            report_ioctl(p, &report, reason);
            pending_removed(tid);
        }
        Err(r) => {
            count_undecoded(p.pid, call_reason(r));
            let report = Report {
                status: 0,
                outcome: outcome::UNDECODED,
                requested: 0,
            };
            report_ioctl(p, &report, 1 + r);
            pending_removed(tid);
            deferred::run(ctx);
        }
    }
}

/// What [`count_undecoded`] counts for a call undecoded for `reason`: a full table
/// met in the call's own decoding is counted as `table_full::CALL`.
#[inline(always)]
fn call_reason(reason: u32) -> u32 {
    if reason == undecoded::TABLE_FULL {
        table_full_at(table_full::CALL)
    } else {
        reason
    }
}

/// The pending entry of the current thread, for a handler program.
#[inline(always)]
fn pending() -> Option<&'static mut PendingIoctl> {
    let (_, tid) = current_ids();
    let p = PENDING_IOCTL.get_ptr_mut(tid)?;
    // SAFETY: a map value pointer, valid for this program run.
    Some(unsafe { &mut *p })
}

tail_called!(
    /// RM_ALLOC, ALLOC_OBJECT, ALLOC_MEMORY and VID_HEAP_CONTROL allocations.
    keling_ioctl_alloc,
    keling_ioctl_alloc_kprobe,
    ioctl_alloc
);

fn ioctl_alloc<C: IoctlCalls>(ctx: &C) {
    handle(ctx, |p| match p.escape {
        escape::ALLOC | escape::ALLOC_OBJECT => exit_alloc(p),
        escape::ALLOC_MEMORY => exit_alloc_memory(p),
        _ => exit_vid_heap(p),
    });
}

/// A handler program's work: `exit` on the current thread's pending call, then
/// its report.
#[inline(always)]
fn handle<C: IoctlCalls>(
    ctx: &C,
    exit: impl FnOnce(&mut PendingIoctl) -> Result<Option<Report>, u32>,
) {
    if let Some(p) = pending() {
        let r = exit(p);
        finish(ctx, p, r);
    }
}

tail_called!(
    /// RM_FREE and VID_HEAP_CONTROL FREE.
    keling_ioctl_free,
    keling_ioctl_free_kprobe,
    ioctl_free
);

fn ioctl_free<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_free);
}

tail_called!(
    /// RM_CONTROL commands that change memory.
    keling_ioctl_control,
    keling_ioctl_control_kprobe,
    ioctl_control
);

fn ioctl_control<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_control);
}

tail_called!(
    /// Batch exports: one object per run, then itself again.
    keling_ioctl_batch_export,
    keling_ioctl_batch_export_kprobe,
    batch_export
);

fn batch_export<C: IoctlCalls>(ctx: &C) {
    batch(ctx, IOCTL_BATCH_EXPORT);
}

tail_called!(
    /// Batch imports: one object per run, then itself again.
    keling_ioctl_batch_import,
    keling_ioctl_batch_import_kprobe,
    batch_import
);

fn batch_import<C: IoctlCalls>(ctx: &C) {
    batch(ctx, IOCTL_BATCH_IMPORT);
}

#[inline(always)]
fn batch<C: IoctlCalls>(ctx: &C, me: u32) {
    let Some(p) = pending() else {
        return;
    };
    if p.aux2 == 0 {
        match user_u32(p.params, nvos54::STATUS) {
            Ok(0) => {}
            Ok(status) => return finish(ctx, p, Ok(Some(Report::status(status)))),
            Err(e) => return finish(ctx, p, Err(e)),
        }
    }
    let step = if me == IOCTL_BATCH_EXPORT {
        batch_export_step(p)
    } else {
        batch_import_step(p)
    };
    match step {
        Ok(true) => {
            // SAFETY: a tail call to a program of the same type.
            unsafe { C::ioctl_prog().tail_call(ctx, me) };
            finish(ctx, p, Err(undecoded::TABLE_FULL));
        }
        Ok(false) => finish(ctx, p, Ok(None)),
        Err(e) => finish(ctx, p, Err(e)),
    }
}

tail_called!(
    /// RM_DUP_OBJECT.
    keling_ioctl_dup,
    keling_ioctl_dup_kprobe,
    ioctl_dup
);

fn ioctl_dup<C: IoctlCalls>(ctx: &C) {
    handle(ctx, exit_dup);
}

/// RM_FREE, or VID_HEAP_CONTROL FREE, that returned.
#[inline(never)]
fn exit_free(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = if p.escape == escape::FREE {
        user_u32(p.params, nvos00::STATUS)?
    } else {
        user_u32(p.params, nvos32::STATUS)?
    };
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    free_object(p)?;
    Ok(None)
}

/// RM_DUP_OBJECT that returned.
#[inline(never)]
fn exit_dup(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = user_u32(p.params, nvos55::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    p.handle = user_u32(p.params, nvos55::H_OBJECT)?;
    let src = ObjectKey {
        client: p.aux,
        handle: p.aux2,
    };
    new_ref(p, &src, 0, ref_how::DUP)?;
    Ok(None)
}

/// Reports a call that changed no memory.
#[inline(never)]
fn report_ioctl(p: &PendingIoctl, report: &Report, reason: u32) {
    emit_quiet_or_not(GpuIoctlEvent {
        header: header(EventKind::GpuIoctl, p.pid, p.tid),
        fd: p.fd,
        device: p.device,
        escape: p.escape,
        cmd: p.cmd,
        control_cmd: if p.escape == escape::CONTROL && p.device != device_file::UVM {
            p.sub
        } else {
            0
        },
        class: p.class,
        gpu: p.gpu,
        _reserved: 0,
        status: report.status,
        outcome: report.outcome,
        undecoded: reason.saturating_sub(1),
        via_xfer: p.via_xfer,
        ret: p.ret,
        requested_bytes: report.requested,
    });
}

/// A failed allocation may matter to a decision at once (memory pressure); plain
/// calls are detail. The long-running agent asks for memory and activity only:
/// every other call is an activity signal to it (active.rs), with no ring-buffer
/// reservation; what it counts of them (undecoded calls, call counts) the kernel
/// counts in maps.
#[inline(always)]
fn emit_quiet_or_not(e: GpuIoctlEvent) {
    if e.requested_bytes != 0 {
        emit(e);
    } else if crate::probes::active::limited() {
        crate::probes::active::report(e.header.pid, e.header.tid, active_cause::IOCTL);
    } else {
        emit_quiet(e);
    }
}

/// A successful call that changes no memory: its status.
#[inline(always)]
pub(super) fn plain_exit(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    if p.device == device_file::UVM {
        // Where rmStatus is: fixed, or moved between driver branches (the offsets
        // the agent set for the driver in use).
        let status = match p.escape {
            uvm::INITIALIZE => user_u32(base, uvm::INITIALIZE_RM_STATUS)?,
            uvm::CREATE_EXTERNAL_RANGE => user_u32(base, uvm::CREATE_EXTERNAL_RANGE_RM_STATUS)?,
            uvm::FREE => user_u32(base, config!(uvm_free_status_off) as usize)?,
            uvm::MAP_EXTERNAL_ALLOCATION => {
                user_u32(base, config!(uvm_map_external_status_off) as usize)?
            }
            uvm::ALLOC_SEMAPHORE_POOL => {
                user_u32(base, config!(uvm_semaphore_pool_status_off) as usize)?
            }
            _ => 0,
        };
        return Ok(Some(Report::status(status)));
    }
    match p.escape {
        escape::CONTROL => Ok(Some(Report::status(user_u32(base, nvos54::STATUS)?))),
        escape::REGISTER_FD => {
            if p.aux_file != 0 && device_of_file(p.aux_file) == device_file::CTL {
                let _ = REGISTERED.insert(p.file_id, p.aux_file, 0);
            }
            Ok(Some(Report {
                status: 0,
                outcome: outcome::NO_MEMORY_ESCAPE,
                requested: 0,
            }))
        }
        escape::MAP_MEMORY => Ok(Some(Report::status(user_u32(base, nvos33::STATUS)?))),
        // Its layout moved at 570: the status offset is the driver's.
        escape::EXPORT_TO_DMABUF_FD => Ok(Some(Report {
            status: user_u32(base, config!(dmabuf_export_status_off) as usize)?,
            outcome: outcome::NO_MEMORY_ESCAPE,
            requested: 0,
        })),
        escape::UNMAP_MEMORY => Ok(Some(Report::status(user_u32(base, nvos34::STATUS)?))),
        _ => Ok(Some(Report {
            status: 0,
            outcome: outcome::NO_MEMORY_ESCAPE,
            requested: 0,
        })),
    }
}

#[inline(never)]
fn exit_alloc(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let off = match p.size {
        size::NVOS64_ALLOC => nvos64::STATUS,
        nvos64::SIZE_PRE_535 => nvos64::STATUS_PRE_535,
        size::NVOS05_ALLOC_OBJECT => nvos05::STATUS,
        _ => config!(nvos21_status_off) as usize,
    };
    let status = user_u32(base, off)?;
    let kind = ObjectKind::of_class(p.class);
    if status != 0 {
        // The size asked for: what a memory-pressure decision needs (video only).
        let mut r = Report::status(status);
        if kind == ObjectKind::VideoMemory && p.sub_params != 0 {
            r.requested = user_u64(p.sub_params, MEMORY_ALLOCATION_PARAMS_SIZE)?;
        }
        return Ok(Some(r));
    }
    p.handle = user_u32(base, nvos21::H_OBJECT_NEW)?;
    let bytes = match p.class {
        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            user_u64(p.sub_params, OS_DESC_LIMIT)?.saturating_add(1)
        }
        c if ObjectKind::has_memory_params(c) => {
            user_u64(p.sub_params, MEMORY_ALLOCATION_PARAMS_SIZE)?
        }
        // No framebuffer and no memory kind: its size (video location only)
        // is kept on the object for the NVML-rule figure up to 545, in no
        // figure of Keling's own.
        class::NV01_MEMORY_HW_RESOURCES => hw_resources_video_bytes(p.sub_params)?,
        _ => 0,
    };
    {
        p.mem_kind = kind.mem_kind().unwrap_or(0);
        p.bytes = bytes;
        record_object(p, kind)?
    };
    Ok(None)
}

/// The size of a NV01_MEMORY_HW_RESOURCES object of video location (0 for any
/// other location), from its `NV_MEMORY_HW_RESOURCES_ALLOCATION_PARAMS`.
#[inline(always)]
fn hw_resources_video_bytes(params: u64) -> Result<u64, u32> {
    let attr = user_u32(params, hw_resources::ATTR)?;
    if (attr >> nvos32::ATTR_LOCATION_SHIFT) & nvos32::ATTR_LOCATION_MASK != 0 {
        return Ok(0);
    }
    user_u64(params, hw_resources::SIZE)
}

#[inline(never)]
fn exit_alloc_memory(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let status = user_u32(base, nvos02::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    p.handle = user_u32(base, nvos02::H_OBJECT_NEW)?;
    match p.class {
        class::NV01_MEMORY_SYSTEM | class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR => {
            let bytes = user_u64(base, nvos02::LIMIT)?.saturating_add(1);
            {
                p.mem_kind = mem_kind::HOST;
                p.bytes = bytes;
                record_object(p, ObjectKind::HostMemory)?
            };
        }
        class::NV01_MEMORY_LOCAL_USER | class::NV01_MEMORY_LOCAL_PRIVILEGED => {
            // The driver allocates nothing and writes the whole heap into `limit`.
            {
                p.mem_kind = 0;
                p.bytes = 0;
                record_object(p, ObjectKind::VirtualMemory)?
            };
        }
        _ => return Err(undecoded::UNKNOWN_LAYOUT),
    }
    Ok(None)
}

#[inline(never)]
fn exit_vid_heap(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let base = p.params;
    let status = user_u32(base, nvos32::STATUS)?;
    if status != 0 {
        return Ok(Some(Report::status(status)));
    }
    let (kind, bytes) = match p.sub {
        nvos32::FUNCTION_ALLOC_SIZE | nvos32::FUNCTION_ALLOC_SIZE_RANGE => {
            let range = p.sub == nvos32::FUNCTION_ALLOC_SIZE_RANGE;
            p.handle = user_u32(base, nvos32::H_MEMORY)?;
            let flags = user_u32(base, nvos32::FLAGS)?;
            let attr = user_u32(base, nvos32::ATTR)?;
            let egm = !range && config!(driver_major) >= nvos32::EGM_SINCE_MAJOR;
            let attr2 = if egm {
                user_u32(base, nvos32::ATTR2)?
            } else {
                0
            };
            let size_off = if range {
                nvos32::ALLOC_SIZE_RANGE_SIZE
            } else {
                nvos32::ALLOC_SIZE
            };
            match nvos32::classify(flags, attr, attr2, egm) {
                None => {
                    p.class = class::NV50_MEMORY_VIRTUAL;
                    (0, 0)
                }
                Some(kind) => {
                    p.class = match kind {
                        mem_kind::VIDEO => class::NV01_MEMORY_LOCAL_USER,
                        mem_kind::HOST => class::NV01_MEMORY_SYSTEM,
                        _ => class::NV_MEMORY_EXTENDED_USER,
                    };
                    (kind, user_u64(base, size_off)?)
                }
            }
        }
        nvos32::FUNCTION_ALLOC_OS_DESCRIPTOR => {
            p.handle = user_u32(base, nvos32::OS_DESCRIPTOR_H_MEMORY)?;
            p.class = class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR;
            let limit = user_u64(base, nvos32::OS_DESCRIPTOR_LIMIT)?;
            (mem_kind::HOST, limit.saturating_add(1))
        }
        _ => return Ok(Some(Report::status(status))),
    };
    let object_kind = ObjectKind::of_class(p.class);
    {
        p.mem_kind = kind;
        p.bytes = bytes;
        record_object(p, object_kind)?
    };
    Ok(None)
}

#[inline(never)]
fn exit_control(p: &mut PendingIoctl) -> Result<Option<Report>, u32> {
    let status = user_u32(p.params, nvos54::STATUS)?;
    if status != 0 || p.sub_params == 0 {
        return Ok(Some(Report::status(status)));
    }
    let params = p.sub_params;
    match p.sub {
        ctrl::EXPORT_OBJECT_TO_FD => {
            let handle = user_u32(params, ctrl::EXPORT_H_OBJECT)?;
            export_one(p, handle, 0)?;
        }
        ctrl::IMPORT_OBJECT_FROM_FD => {
            p.parent = user_u32(params, ctrl::IMPORT_H_PARENT)?;
            p.handle = user_u32(params, ctrl::IMPORT_H_OBJECT)?;
            import_one(p, 0)?;
        }
        _ => return Ok(Some(Report::status(status))),
    }
    Ok(None)
}

/// Where a batch control is: (its size, index, and the next object, `p.aux2`);
/// `None` when it is done. Counts objects beyond what Keling decodes.
#[inline(always)]
fn batch_next(
    p: &PendingIoctl,
    num_off: usize,
    index_off: usize,
) -> Result<Option<(u32, u32)>, u32> {
    let n = user::<u16>(p.sub_params + num_off as u64)? as u32;
    let index = user::<u16>(p.sub_params + index_off as u64)? as u32;
    let i = p.aux2;
    if i == 0 && n as usize > BATCH_OBJECTS {
        count_table_full(p.pid, table_full::BATCH);
    }
    if i >= n || i as usize >= BATCH_OBJECTS {
        return Ok(None);
    }
    Ok(Some((index, i)))
}

/// One object of a batch export. `Ok(true)`: more to do.
#[inline(never)]
fn batch_export_step(p: &mut PendingIoctl) -> Result<bool, u32> {
    let Some((index, i)) = batch_next(p, ctrl::EXPORT_BATCH_NUM, ctrl::EXPORT_BATCH_INDEX)? else {
        return Ok(false);
    };
    let at = (i as usize & (BATCH_OBJECTS - 1)) * 4;
    let handle = user_u32(p.sub_params, ctrl::EXPORT_BATCH_OBJECTS + at)?;
    export_one(p, handle, index + i)?;
    p.aux2 = i + 1;
    Ok(true)
}

/// One object of a batch import. `Ok(true)`: more to do.
#[inline(never)]
fn batch_import_step(p: &mut PendingIoctl) -> Result<bool, u32> {
    let Some((index, i)) = batch_next(p, ctrl::IMPORT_BATCH_NUM, ctrl::IMPORT_BATCH_INDEX)? else {
        return Ok(false);
    };
    let at = (i as usize & (BATCH_OBJECTS - 1)) * 4;
    p.parent = user_u32(p.sub_params, ctrl::IMPORT_BATCH_H_PARENT)?;
    p.handle = user_u32(p.sub_params, ctrl::IMPORT_BATCH_OBJECTS + at)?;
    import_one(p, index + i)?;
    p.aux2 = i + 1;
    Ok(true)
}
