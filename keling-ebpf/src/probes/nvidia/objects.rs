//! The object table: the objects and clients the driver created, each checked
//! against the caller's open file, the references to memory (dups, imports,
//! exports) and the frees.
use keling_common::{
    ClientInfo, EventKind, GpuAllocEvent, GpuExportEvent, GpuFreeEvent, GpuObjectEvent,
    GpuRefEvent, MemHandle, NO_GPU, ObjectInfo, ObjectKey, device_file, mem_kind,
    nvidia::{ObjectKind, class},
    ref_how, teardown, undecoded,
};

use super::{PendingIoctl, REGISTERED};
use crate::{
    emit, emit_quiet, header,
    probes::{
        accounting::{
            CLIENTS, NO_BYTES_EXPORT, OBJECTS, add_handle, charge_new, claim_charge, export_memory,
            exported, free_mem_handle, link_shared, new_client, queue_teardown, scratch_object,
            share,
        },
        deferred::Scope,
        files::proc_fds,
    },
};

/// The client named by a call, checked against the open file the call came
/// through: a process can act only on clients created on an open file it has.
/// A client first seen now (created before Keling started) is adopted on it.
#[inline(always)]
fn client_on(p: &PendingIoctl) -> Result<*mut ClientInfo, u32> {
    let pid = p.pid;
    if CLIENTS.get_ptr(p.client).is_none() {
        // Its file: this one if it is an nvidiactl file, else the nvidiactl file
        // this nvidiaN file was registered with, else not known yet (0).
        let file = if p.device == device_file::CTL {
            p.file_id
        } else {
            // SAFETY: copied out at once.
            unsafe { REGISTERED.get(p.file_id) }.copied().unwrap_or(0)
        };
        new_client(pid, p.client, file, p.device);
    }
    let c = CLIENTS.get_ptr_mut(p.client).ok_or(undecoded::TABLE_FULL)?;
    // SAFETY: a map value pointer.
    let file = unsafe { (*c).file_id };
    if file == p.file_id {
        return Ok(c);
    }
    if file == 0 {
        // A client from before Keling, first met through an nvidiaN file: the
        // first nvidiactl file it is used through is its own.
        if p.device == device_file::CTL {
            // SAFETY: as above.
            unsafe { (*c).file_id = p.file_id };
            crate::probes::accounting::attach_client(p.client, p.file_id, p.device, pid);
        }
        return Ok(c);
    }
    // SAFETY: copied out at once.
    if unsafe { REGISTERED.get(p.file_id) }.copied() == Some(file) {
        return Ok(c);
    }
    // Through an nvidiaN file registered before Keling was watching: the caller
    // must have the client's own file open.
    if p.device <= device_file::MAX_GPU && has_file(pid, file) {
        let _ = REGISTERED.insert(p.file_id, file, 0);
        return Ok(c);
    }
    Err(undecoded::UNKNOWN_OBJECT)
}

/// Whether `pid` has an fd of the open file `file` (as far as Keling knows).
#[inline(never)]
fn has_file(pid: u32, file: u64) -> bool {
    let Some(fds) = proc_fds(pid, false) else {
        return false;
    };
    for i in 0..keling_common::FD_SLOTS {
        // SAFETY: a map value pointer; i is in bounds.
        if unsafe { (*fds).slots[i].file_id } == file {
            return true;
        }
    }
    false
}

/// A live object of a client (its generation matches).
#[inline(always)]
fn object(key: &ObjectKey) -> Option<ObjectInfo> {
    // SAFETY: copied out at once.
    let obj = unsafe { OBJECTS.get(key) }.copied()?;
    // SAFETY: as above.
    let gen_ = unsafe { CLIENTS.get(key.client) }?.gen_;
    (obj.client_gen == gen_).then_some(obj)
}

/// A live object of a client, in place.
#[inline(always)]
fn object_ref(key: &ObjectKey) -> Option<&'static ObjectInfo> {
    let obj = OBJECTS.get_ptr(key)?;
    // SAFETY: copied out at once.
    let gen_ = unsafe { CLIENTS.get(key.client) }?.gen_;
    // SAFETY: a map value pointer, valid for this program run.
    let obj = unsafe { &*obj };
    (obj.client_gen == gen_).then_some(obj)
}

/// Where a new object under `parent` hangs: (device, subdevice, gpu).
#[inline(always)]
fn placement(p: &PendingIoctl, kind: ObjectKind) -> (u32, u32, u32) {
    let mut gpu = p.gpu;
    let (mut device, mut sub) = (0, 0);
    if p.parent != p.client
        && let Some(parent) = object(&ObjectKey {
            client: p.client,
            handle: p.parent,
        })
    {
        device = parent.device;
        sub = parent.sub;
        if gpu == NO_GPU {
            gpu = parent.gpu;
        }
    }
    match kind {
        ObjectKind::Device => (p.handle, 0, gpu),
        ObjectKind::Subdevice => (device, p.handle, gpu),
        _ => (device, sub, gpu),
    }
}

/// A new object (or client) the driver created.
#[inline(never)]
pub(super) fn record_object(p: &mut PendingIoctl, kind: ObjectKind) -> Result<(), u32> {
    let (pid, tid, mem, bytes) = (p.pid, p.tid, p.mem_kind, p.bytes);
    if kind == ObjectKind::Client {
        new_client(pid, p.handle, p.file_id, p.device);
        p.client = p.handle;
        emit_object(pid, tid, p, kind);
        return Ok(());
    }
    let client = client_on(p)?;
    let (device, sub, gpu) = placement(p, kind);
    p.gpu = gpu;
    let info = scratch_object().ok_or(undecoded::TABLE_FULL)?;
    info.class = p.class;
    info.kind = kind as u32;
    info.parent = p.parent;
    info.device = device;
    info.sub = sub;
    info.gpu = gpu;
    info.owner_pid = pid;
    // SAFETY: a map value pointer.
    info.client_gen = unsafe { (*client).gen_ };
    info.bytes = bytes;
    info.mem_kind = mem;
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    // By reference: a copy would put the whole record on the 512-byte stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if OBJECTS.insert(key, &*info, 0).is_err() {
        return Err(undecoded::TABLE_FULL);
    }
    if mem == 0 {
        emit_object(pid, tid, p, kind);
        return Ok(());
    }
    let h = MemHandle {
        client: p.client,
        handle: p.handle,
        device,
        sub,
        pid,
        seq: 0,
    };
    charge_new(client, &h, gpu, mem, bytes);
    emit_alloc(p);
    Ok(())
}

/// Reports the allocation `p` describes (its own frame: the caller's is deep).
#[inline(never)]
fn emit_alloc(p: &PendingIoctl) {
    emit(GpuAllocEvent {
        header: header(EventKind::GpuAlloc, p.pid, p.tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        class: p.class,
        mem_kind: p.mem_kind,
        gpu: p.gpu,
        escape: p.escape,
        via_xfer: p.via_xfer,
        bytes: p.bytes,
    });
}

#[inline(never)]
fn emit_object(pid: u32, tid: u32, p: &PendingIoctl, kind: ObjectKind) {
    emit_quiet(GpuObjectEvent {
        header: header(EventKind::GpuObject, pid, tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        class: p.class,
        kind: kind as u32,
        gpu: p.gpu,
    });
}

/// A new handle `p.client`/`p.handle` under `p.parent` referring to `src` (a dup)
/// or to the memory `mem_id` (an import).
#[inline(never)]
pub(super) fn new_ref(
    p: &mut PendingIoctl,
    src: &ObjectKey,
    mut mem_id: u64,
    how: u32,
) -> Result<(), u32> {
    let pid = p.pid;
    let client = client_on(p)?;
    let info = scratch_object().ok_or(undecoded::TABLE_FULL)?;
    info.parent = p.parent;
    info.gpu = NO_GPU;
    info.owner_pid = pid;
    // SAFETY: a map value pointer.
    info.client_gen = unsafe { (*client).gen_ };
    if mem_id == 0 {
        let source = object_ref(src).ok_or(undecoded::UNKNOWN_OBJECT)?;
        info.class = source.class;
        info.kind = source.kind;
        info.gpu = source.gpu;
        info.bytes = source.bytes;
        info.mem_kind = source.mem_kind;
        if source.mem_kind != 0 {
            mem_id = share(src);
            if mem_id == 0 {
                return Err(undecoded::TABLE_FULL);
            }
        }
    } else {
        let m = crate::probes::accounting::MEMS
            .get_ptr(mem_id)
            .ok_or(undecoded::UNKNOWN_OBJECT)?;
        // SAFETY: a map value pointer, read field by field (a copy is 128 bytes of stack).
        unsafe {
            info.mem_kind = (*m).kind;
            info.bytes = (*m).bytes;
            info.gpu = (*m).gpu;
        }
        info.class = match info.mem_kind {
            mem_kind::VIDEO => class::NV01_MEMORY_LOCAL_USER,
            mem_kind::HOST => class::NV01_MEMORY_SYSTEM,
            _ => class::NV_MEMORY_EXTENDED_USER,
        };
        info.kind = ObjectKind::of_class(info.class) as u32;
    }
    let kind = ObjectKind::from_u32(info.kind);
    p.gpu = info.gpu;
    let (device, sub, gpu) = placement(p, kind);
    info.device = device;
    info.sub = sub;
    if info.gpu == NO_GPU {
        info.gpu = gpu;
    }
    if mem_id != 0 {
        let h = MemHandle {
            client: p.client,
            handle: p.handle,
            device,
            sub,
            pid,
            seq: 0,
        };
        if !add_handle(mem_id, &h) {
            return Err(undecoded::TABLE_FULL);
        }
        // A memory only export files held takes its new handle as the charged one.
        claim_charge(pid, p.tid, mem_id);
        info.mem_id = mem_id;
    }
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    // By reference: a copy would put the whole record on the 512-byte stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    if OBJECTS.insert(key, &*info, 0).is_err() {
        return Err(undecoded::TABLE_FULL);
    }
    if mem_id != 0 {
        link_shared(&key);
    }
    p.gpu = info.gpu;
    p.mem_kind = info.mem_kind;
    p.bytes = info.bytes;
    emit_ref(p, src, how);
    Ok(())
}

#[inline(never)]
fn emit_ref(p: &PendingIoctl, src: &ObjectKey, how: u32) {
    emit(GpuRefEvent {
        header: header(EventKind::GpuRef, p.pid, p.tid),
        client: p.client,
        parent: p.parent,
        handle: p.handle,
        how,
        src_client: src.client,
        src_handle: src.handle,
        gpu: p.gpu,
        mem_kind: p.mem_kind,
        bytes: p.bytes,
    });
}

/// Exports `handle` of the call's client to position `position` of its export file.
#[inline(never)]
pub(super) fn export_one(p: &PendingIoctl, handle: u32, position: u32) -> Result<(), u32> {
    let pid = p.pid;
    if p.aux_file == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    client_on(p)?;
    if handle == 0 {
        // An empty entry: the position is emptied.
        export_memory(pid, p.aux_file, position, 0);
        return Ok(());
    }
    let key = ObjectKey {
        client: p.client,
        handle,
    };
    let (mem, gpu, obj_bytes) = {
        let obj = object_ref(&key).ok_or(undecoded::UNKNOWN_OBJECT)?;
        (obj.mem_kind, obj.gpu, obj.bytes)
    };
    let mem_id = if mem != 0 {
        share(&key)
    } else {
        NO_BYTES_EXPORT
    };
    if mem_id == 0 || !export_memory(pid, p.aux_file, position, mem_id) {
        return Err(undecoded::TABLE_FULL);
    }
    let bytes = if mem != 0 { obj_bytes } else { 0 };
    emit_export(p, handle, position, gpu, bytes);
    Ok(())
}

#[inline(never)]
fn emit_export(p: &PendingIoctl, handle: u32, position: u32, gpu: u32, bytes: u64) {
    emit(GpuExportEvent {
        header: header(EventKind::GpuExport, p.pid, p.tid),
        client: p.client,
        handle,
        file_id: p.aux_file,
        position,
        gpu,
        bytes,
    });
}

/// Imports the object at `position` of the call's export file as `p.handle`.
#[inline(never)]
pub(super) fn import_one(p: &mut PendingIoctl, position: u32) -> Result<(), u32> {
    if p.aux_file == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    if p.handle == 0 {
        return Ok(()); // nothing was imported
    }
    let mem_id = exported(p.aux_file, position);
    if mem_id == NO_BYTES_EXPORT {
        // An object without bytes (fabric, multicast): a plain new object.
        p.class = 0;
        p.mem_kind = 0;
        p.bytes = 0;
        return record_object(p, ObjectKind::VirtualMemory);
    }
    if mem_id == 0 {
        return Err(undecoded::UNKNOWN_OBJECT);
    }
    new_ref(p, &ObjectKey::default(), mem_id, ref_how::IMPORT)
}

/// RM_FREE (or VID_HEAP FREE) that the driver accepted.
#[inline(never)]
pub(super) fn free_object(p: &mut PendingIoctl) -> Result<(), u32> {
    let (pid, tid) = (p.pid, p.tid);
    if p.handle == p.client {
        // SAFETY: copied out at once.
        let file = unsafe { CLIENTS.get(p.client) }
            .map(|c| c.file_id)
            .ok_or(undecoded::UNKNOWN_OBJECT)?;
        if file != p.file_id {
            return Err(undecoded::UNKNOWN_OBJECT);
        }
        queue_teardown(
            pid,
            tid,
            p.client,
            &Scope::default(),
            teardown::CLIENT_FREED,
        );
        emit_free(pid, tid, p, ObjectKind::Client);
        return Ok(());
    }
    client_on(p)?;
    let key = ObjectKey {
        client: p.client,
        handle: p.handle,
    };
    let (mem, kind) = {
        let obj = object_ref(&key).ok_or(undecoded::UNKNOWN_OBJECT)?;
        p.class = obj.class;
        p.gpu = obj.gpu;
        p.parent = obj.parent;
        (obj.mem_kind, obj.kind)
    };
    if mem != 0 {
        free_mem_handle(pid, tid, &key, p.escape);
        return Ok(());
    }
    let _ = OBJECTS.remove(key);
    let kind = ObjectKind::from_u32(kind);
    match kind {
        // The driver frees everything under the device (subdevice) with it.
        ObjectKind::Device => queue_teardown(
            pid,
            tid,
            p.client,
            &Scope {
                device: p.handle,
                sub: 0,
            },
            teardown::DEVICE_FREED,
        ),
        ObjectKind::Subdevice => queue_teardown(
            pid,
            tid,
            p.client,
            &Scope {
                device: 0,
                sub: p.handle,
            },
            teardown::SUBDEVICE_FREED,
        ),
        _ => {}
    }
    emit_free(pid, tid, p, kind);
    Ok(())
}

#[inline(never)]
fn emit_free(pid: u32, tid: u32, p: &PendingIoctl, kind: ObjectKind) {
    emit(GpuFreeEvent {
        header: header(EventKind::GpuFree, pid, tid),
        client: p.client,
        handle: p.handle,
        class: p.class,
        kind: kind as u32,
        gpu: p.gpu,
        mem_kind: 0,
        freed_pid: 0,
        escape: p.escape,
        bytes: 0,
    });
}
