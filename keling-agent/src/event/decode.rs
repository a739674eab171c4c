//! Ring-buffer bytes -> typed events. The only place that looks at raw event bytes.
//!
//! Process and scheduler events keep the contract's structs as they are. Each GPU
//! kind becomes its own typed struct here, named as the contract's (`GpuOpenEvent`,
//! ...), whose numeric codes are already checked and turned into Rust enums: a code
//! the contract does not define is a [`DecodeError`], never a guess. Consumers match
//! on [`Event`] and never look at `header.kind` or a raw code again.
use keling_common::{
    self as raw, ALL_GPUS, ActiveEvent, COMM_LEN, EventHeader, EventKind, ExecEvent, ExitEvent,
    ForkEvent, NO_GPU, SwitchEvent, call_kind,
    nvidia::{self, ObjectKind, escape},
    open_how::OpenHowCode,
    outcome::OutcomeCode,
    ref_how::RefHowCode,
};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("{kind:?} event has {got} bytes, expected {want}")]
    BadSize {
        kind: EventKind,
        got: usize,
        want: usize,
    },
    #[error("{kind:?} event has {field} {value:#x}, which the contract does not define")]
    BadCode {
        kind: EventKind,
        field: &'static str,
        value: u32,
    },
}

/// One decoded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Fork(ForkEvent),
    Exec(ExecEvent),
    Exit(ExitEvent),
    Switch(SwitchEvent),
    Active(ActiveEvent),
    GpuOpen(GpuOpenEvent),
    GpuClose(GpuCloseEvent),
    GpuAlloc(GpuAllocEvent),
    GpuFree(GpuFreeEvent),
    GpuObject(GpuObjectEvent),
    GpuTeardown(GpuTeardownEvent),
    GpuIoctl(GpuIoctlEvent),
    GpuRef(GpuRefEvent),
    GpuExport(GpuExportEvent),
    GpuCharge(GpuChargeEvent),
}

impl Event {
    pub fn header(&self) -> &EventHeader {
        match self {
            Event::Fork(e) => &e.header,
            Event::Exec(e) => &e.header,
            Event::Exit(e) => &e.header,
            Event::Switch(e) => &e.header,
            Event::Active(e) => &e.header,
            Event::GpuOpen(e) => &e.header,
            Event::GpuClose(e) => &e.header,
            Event::GpuAlloc(e) => &e.header,
            Event::GpuFree(e) => &e.header,
            Event::GpuObject(e) => &e.header,
            Event::GpuTeardown(e) => &e.header,
            Event::GpuIoctl(e) => &e.header,
            Event::GpuRef(e) => &e.header,
            Event::GpuExport(e) => &e.header,
            Event::GpuCharge(e) => &e.header,
        }
    }

    /// The kind (what the variant already says; for counting and logs).
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Fork(_) => EventKind::Fork,
            Event::Exec(_) => EventKind::Exec,
            Event::Exit(_) => EventKind::Exit,
            Event::Switch(_) => EventKind::Switch,
            Event::Active(_) => EventKind::Active,
            Event::GpuOpen(_) => EventKind::GpuOpen,
            Event::GpuClose(_) => EventKind::GpuClose,
            Event::GpuAlloc(_) => EventKind::GpuAlloc,
            Event::GpuFree(_) => EventKind::GpuFree,
            Event::GpuObject(_) => EventKind::GpuObject,
            Event::GpuTeardown(_) => EventKind::GpuTeardown,
            Event::GpuIoctl(_) => EventKind::GpuIoctl,
            Event::GpuRef(_) => EventKind::GpuRef,
            Event::GpuExport(_) => EventKind::GpuExport,
            Event::GpuCharge(_) => EventKind::GpuCharge,
        }
    }

    /// Whether this came from the NVIDIA probes.
    pub fn is_gpu(&self) -> bool {
        !matches!(
            self,
            Event::Fork(_) | Event::Exec(_) | Event::Exit(_) | Event::Switch(_) | Event::Active(_)
        )
    }
}

/// Which NVIDIA device file: keling-common's [`device_file`](keling_common::device_file) set.
pub use keling_common::device_file::DeviceFile;

/// What kind of bytes a memory holds: keling-common's [`mem_kind`](keling_common::mem_kind) set.
pub use keling_common::mem_kind::MemKind;

/// Why memory was freed all at once: keling-common's [`teardown`](keling_common::teardown) set.
pub use keling_common::teardown::TeardownReason;

/// How a process came to have an NVIDIA fd ([`keling_common::open_how`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenHow {
    Open,
    /// dup, dup2, dup3, fcntl(F_DUPFD*) of `src_fd`.
    Dup {
        src_fd: i32,
    },
    /// Over a unix socket or with pidfd_getfd.
    Received,
    /// First seen at an ioctl.
    FirstUse,
}

impl OpenHow {
    fn from_raw(how: u32, src_fd: i32) -> Option<Self> {
        Some(match OpenHowCode::from_raw(how)? {
            OpenHowCode::Open => Self::Open,
            OpenHowCode::Dup => Self::Dup { src_fd },
            OpenHowCode::Received => Self::Received,
            OpenHowCode::FirstUse => Self::FirstUse,
        })
    }

    /// Its code in keling-common's [`open_how`](keling_common::open_how) set (number and name).
    pub const fn kind(self) -> OpenHowCode {
        match self {
            Self::Open => OpenHowCode::Open,
            Self::Dup { .. } => OpenHowCode::Dup,
            Self::Received => OpenHowCode::Received,
            Self::FirstUse => OpenHowCode::FirstUse,
        }
    }

    pub const fn code(self) -> u32 {
        self.kind().code()
    }
}

/// How a new handle to existing memory came to be ([`keling_common::ref_how`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefHow {
    /// RM_DUP_OBJECT of `src_handle` in `src_client`.
    Dup { src_client: u32, src_handle: u32 },
    /// An import control.
    Import,
}

impl RefHow {
    fn from_raw(how: u32, src_client: u32, src_handle: u32) -> Option<Self> {
        Some(match RefHowCode::from_raw(how)? {
            RefHowCode::Dup => Self::Dup {
                src_client,
                src_handle,
            },
            RefHowCode::Import => Self::Import,
        })
    }

    /// Its code in keling-common's [`ref_how`](keling_common::ref_how) set (number and name).
    pub const fn kind(self) -> RefHowCode {
        match self {
            Self::Dup { .. } => RefHowCode::Dup,
            Self::Import => RefHowCode::Import,
        }
    }

    pub const fn code(self) -> u32 {
        self.kind().code()
    }
}

/// Why a call could not be decoded: keling-common's [`undecoded`](keling_common::undecoded) set.
pub use keling_common::undecoded::UndecodedReason;

/// What came of a plain ioctl ([`keling_common::outcome`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoctlOutcome {
    /// Decoded; it changed no memory.
    Decoded,
    /// An escape that carries no memory.
    NoMemoryEscape,
    Undecoded(UndecodedReason),
}

impl IoctlOutcome {
    fn from_raw(outcome: u32, reason: u32) -> Result<Self, (&'static str, u32)> {
        match OutcomeCode::from_raw(outcome).ok_or(("outcome", outcome))? {
            OutcomeCode::Decoded => Ok(Self::Decoded),
            OutcomeCode::NoMemoryEscape => Ok(Self::NoMemoryEscape),
            OutcomeCode::Undecoded => UndecodedReason::from_raw(reason)
                .map(Self::Undecoded)
                .ok_or(("undecoded", reason)),
        }
    }

    /// Its code in keling-common's [`outcome`](keling_common::outcome) set (number and name).
    pub const fn kind(self) -> OutcomeCode {
        match self {
            Self::Decoded => OutcomeCode::Decoded,
            Self::NoMemoryEscape => OutcomeCode::NoMemoryEscape,
            Self::Undecoded(_) => OutcomeCode::Undecoded,
        }
    }

    pub const fn code(self) -> u32 {
        self.kind().code()
    }
}

/// Which call an ioctl was: the meaning of its number depends on the device file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// An RM escape (`nvidiactl`, `nvidiaN`), by `nr`.
    Rm(u32),
    /// A UVM command (`nvidia-uvm`).
    Uvm(u32),
    /// An ioctl on `nvidiactl` / `nvidiaN` that is no RM escape (its `_IOC_TYPE` is
    /// not 'F'), by its whole command.
    NotRm(u32),
}

impl Call {
    /// The call a `CALL_COUNTS` key counts (keling-common's `call_kind`); None for
    /// RM_CONTROL commands, which are no call of their own, and unknown kinds.
    pub const fn of_counted(kind: u32, number: u32) -> Option<Self> {
        match kind {
            call_kind::RM_ESCAPE => Some(Self::Rm(number)),
            call_kind::UVM => Some(Self::Uvm(number)),
            call_kind::NOT_RM => Some(Self::NotRm(number)),
            _ => None,
        }
    }
}

/// `gpu` of an event: [`NO_GPU`] is "not known"; [`ALL_GPUS`] is never an event's.
fn gpu_of(v: u32) -> Option<Option<u32>> {
    match v {
        NO_GPU => Some(None),
        ALL_GPUS => None,
        g => Some(Some(g)),
    }
}

fn nonzero(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

/// A process has an NVIDIA fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuOpenEvent {
    pub header: EventHeader,
    pub fd: i32,
    pub device: DeviceFile,
    pub file_id: u64,
    pub how: OpenHow,
}

/// A process closed an NVIDIA fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuCloseEvent {
    pub header: EventHeader,
    pub fd: i32,
    pub device: DeviceFile,
    pub file_id: u64,
    /// The driver released the open file (this was its last reference).
    pub released: bool,
}

/// A memory the driver allocated; `header.pid` is the caller, charged with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuAllocEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub class: u32,
    pub mem_kind: MemKind,
    pub gpu: Option<u32>,
    /// The RM escape that allocated it.
    pub escape: u32,
    pub via_xfer: bool,
    pub bytes: u64,
}

impl GpuAllocEvent {
    /// The kind of object it is (from its memory kind).
    pub fn kind(&self) -> ObjectKind {
        self.mem_kind.object_kind()
    }
}

/// A handle freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFreeEvent {
    pub header: EventHeader,
    pub client: u32,
    pub handle: u32,
    pub class: u32,
    pub kind: ObjectKind,
    pub gpu: Option<u32>,
    /// The memory's kind, None when the object held no memory.
    pub mem_kind: Option<MemKind>,
    /// The process whose charge was freed, None when nothing was freed.
    pub freed_pid: Option<u32>,
    pub escape: u32,
    /// Bytes given back to the driver (0 when other references keep the memory).
    pub bytes: u64,
}

/// A non-memory object created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuObjectEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub class: u32,
    pub kind: ObjectKind,
    pub gpu: Option<u32>,
}

/// One contributor of a client freed all at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTeardownEvent {
    pub header: EventHeader,
    pub client: u32,
    pub reason: TeardownReason,
    /// The process whose charge was freed.
    pub owner_pid: u32,
    pub gpu: Option<u32>,
    /// The device object handle the memory hung under.
    pub device: u32,
    /// The subdevice handle, None when directly under the device.
    pub sub: Option<u32>,
    pub objects: u32,
    /// Video bytes.
    pub bytes: u64,
    pub host_bytes: u64,
    pub egm_bytes: u64,
}

/// Any other ioctl on an NVIDIA file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuIoctlEvent {
    pub header: EventHeader,
    pub fd: i32,
    pub device: DeviceFile,
    pub call: Call,
    /// The raw ioctl command.
    pub cmd: u32,
    /// RM_CONTROL's command (Some exactly when the call is RM_CONTROL).
    pub control_cmd: Option<u32>,
    /// The RM class of an allocation (0 when none).
    pub class: u32,
    pub gpu: Option<u32>,
    /// RM status (0 = success).
    pub status: u32,
    pub outcome: IoctlOutcome,
    pub via_xfer: bool,
    /// ioctl(2)'s return value.
    pub ret: i64,
    /// A failed video-memory allocation: the bytes asked for (0 otherwise).
    pub requested_bytes: u64,
}

/// A new handle referring to an existing memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuRefEvent {
    pub header: EventHeader,
    pub client: u32,
    pub parent: u32,
    pub handle: u32,
    pub how: RefHow,
    pub gpu: Option<u32>,
    /// `None`: the object referred to holds no memory (a 0-byte object, such as
    /// the framebuffer-size query of ALLOC_MEMORY class 0x40).
    pub mem_kind: Option<MemKind>,
    /// The memory's bytes (charged elsewhere: a reference adds none).
    pub bytes: u64,
}

/// A memory exported to an export file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuExportEvent {
    pub header: EventHeader,
    pub client: u32,
    pub handle: u32,
    pub file_id: u64,
    pub position: u32,
    pub gpu: Option<u32>,
    pub bytes: u64,
}

/// A memory's charge moved from one process to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuChargeEvent {
    pub header: EventHeader,
    pub from_pid: u32,
    pub to_pid: u32,
    pub gpu: Option<u32>,
    pub mem_kind: MemKind,
    /// The handle now charged.
    pub client: u32,
    pub handle: u32,
    pub bytes: u64,
}

/// Marker for the `#[repr(C)]`, padding-free, integer-only event structs: any bytes
/// of the right length are a valid value.
///
/// # Safety
/// Implement only for such types.
unsafe trait Plain: Copy {}
// SAFETY: integer-only #[repr(C)] structs without padding (see keling-common tests).
unsafe impl Plain for EventHeader {}
// SAFETY: as above.
unsafe impl Plain for ForkEvent {}
// SAFETY: as above.
unsafe impl Plain for ExecEvent {}
// SAFETY: as above.
unsafe impl Plain for ExitEvent {}
// SAFETY: as above.
unsafe impl Plain for SwitchEvent {}
// SAFETY: as above.
unsafe impl Plain for ActiveEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuOpenEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuCloseEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuAllocEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuFreeEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuObjectEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuTeardownEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuIoctlEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuRefEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuExportEvent {}
// SAFETY: as above.
unsafe impl Plain for raw::GpuChargeEvent {}

fn read<T: Plain>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= size_of::<T>())
        // SAFETY: length checked; T: Plain accepts any bit pattern; unaligned read.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn exact<T: Plain>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() != size_of::<T>() {
        return Err(DecodeError::BadSize {
            kind,
            got: bytes.len(),
            want: size_of::<T>(),
        });
    }
    Ok(read(bytes).expect("length checked"))
}

/// Checks one coded field of a `kind` event.
struct Fields {
    kind: EventKind,
}

impl Fields {
    fn get<T>(&self, field: &'static str, value: u32, conv: Option<T>) -> Result<T, DecodeError> {
        conv.ok_or(DecodeError::BadCode {
            kind: self.kind,
            field,
            value,
        })
    }
    fn device(&self, v: u32) -> Result<DeviceFile, DecodeError> {
        self.get("device", v, DeviceFile::from_raw(v))
    }
    fn gpu(&self, v: u32) -> Result<Option<u32>, DecodeError> {
        self.get("gpu", v, gpu_of(v))
    }
    fn mem_kind(&self, v: u32) -> Result<MemKind, DecodeError> {
        self.get("mem_kind", v, MemKind::from_raw(v))
    }
    fn object_kind(&self, v: u32) -> Result<ObjectKind, DecodeError> {
        self.get("kind", v, ObjectKind::from_raw(v))
    }
    fn flag(&self, field: &'static str, v: u32) -> Result<bool, DecodeError> {
        self.get(field, v, (v <= 1).then_some(v == 1))
    }
}

pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let header: EventHeader = read(bytes).ok_or(DecodeError::Short(bytes.len()))?;
    let kind = EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    let f = Fields { kind };
    Ok(match kind {
        EventKind::Fork => Event::Fork(exact(kind, bytes)?),
        EventKind::Exec => Event::Exec(exact(kind, bytes)?),
        EventKind::Exit => Event::Exit(exact(kind, bytes)?),
        EventKind::Switch => Event::Switch(exact(kind, bytes)?),
        EventKind::Active => Event::Active(exact(kind, bytes)?),
        EventKind::GpuOpen => {
            let e: raw::GpuOpenEvent = exact(kind, bytes)?;
            Event::GpuOpen(GpuOpenEvent {
                header,
                fd: e.fd,
                device: f.device(e.device)?,
                file_id: e.file_id,
                how: f.get("how", e.how, OpenHow::from_raw(e.how, e.src_fd))?,
            })
        }
        EventKind::GpuClose => {
            let e: raw::GpuCloseEvent = exact(kind, bytes)?;
            Event::GpuClose(GpuCloseEvent {
                header,
                fd: e.fd,
                device: f.device(e.device)?,
                file_id: e.file_id,
                released: f.flag("released", e.released)?,
            })
        }
        EventKind::GpuAlloc => {
            let e: raw::GpuAllocEvent = exact(kind, bytes)?;
            Event::GpuAlloc(GpuAllocEvent {
                header,
                client: e.client,
                parent: e.parent,
                handle: e.handle,
                class: e.class,
                mem_kind: f.mem_kind(e.mem_kind)?,
                gpu: f.gpu(e.gpu)?,
                escape: e.escape,
                via_xfer: f.flag("via_xfer", e.via_xfer)?,
                bytes: e.bytes,
            })
        }
        EventKind::GpuFree => {
            let e: raw::GpuFreeEvent = exact(kind, bytes)?;
            Event::GpuFree(GpuFreeEvent {
                header,
                client: e.client,
                handle: e.handle,
                class: e.class,
                kind: f.object_kind(e.kind)?,
                gpu: f.gpu(e.gpu)?,
                mem_kind: match e.mem_kind {
                    0 => None,
                    k => Some(f.mem_kind(k)?),
                },
                freed_pid: nonzero(e.freed_pid),
                escape: e.escape,
                bytes: e.bytes,
            })
        }
        EventKind::GpuObject => {
            let e: raw::GpuObjectEvent = exact(kind, bytes)?;
            Event::GpuObject(GpuObjectEvent {
                header,
                client: e.client,
                parent: e.parent,
                handle: e.handle,
                class: e.class,
                kind: f.object_kind(e.kind)?,
                gpu: f.gpu(e.gpu)?,
            })
        }
        EventKind::GpuTeardown => {
            let e: raw::GpuTeardownEvent = exact(kind, bytes)?;
            Event::GpuTeardown(GpuTeardownEvent {
                header,
                client: e.client,
                reason: f.get("reason", e.reason, TeardownReason::from_raw(e.reason))?,
                owner_pid: e.owner_pid,
                gpu: f.gpu(e.gpu)?,
                device: e.device,
                sub: nonzero(e.sub),
                objects: e.objects,
                bytes: e.bytes,
                host_bytes: e.host_bytes,
                egm_bytes: e.egm_bytes,
            })
        }
        EventKind::GpuIoctl => {
            let e: raw::GpuIoctlEvent = exact(kind, bytes)?;
            let device = f.device(e.device)?;
            let call = match device {
                DeviceFile::Uvm => Call::Uvm(e.escape),
                _ if nvidia::rm_type(e.cmd) != nvidia::RM_IOCTL_TYPE => Call::NotRm(e.cmd),
                _ => Call::Rm(e.escape),
            };
            let outcome = IoctlOutcome::from_raw(e.outcome, e.undecoded)
                .map_err(|(field, value)| DecodeError::BadCode { kind, field, value })?;
            Event::GpuIoctl(GpuIoctlEvent {
                header,
                fd: e.fd,
                device,
                call,
                cmd: e.cmd,
                control_cmd: (call == Call::Rm(escape::CONTROL)).then_some(e.control_cmd),
                class: e.class,
                gpu: f.gpu(e.gpu)?,
                status: e.status,
                outcome,
                via_xfer: f.flag("via_xfer", e.via_xfer)?,
                ret: e.ret,
                requested_bytes: e.requested_bytes,
            })
        }
        EventKind::GpuRef => {
            let e: raw::GpuRefEvent = exact(kind, bytes)?;
            Event::GpuRef(GpuRefEvent {
                header,
                client: e.client,
                parent: e.parent,
                handle: e.handle,
                how: f.get(
                    "how",
                    e.how,
                    RefHow::from_raw(e.how, e.src_client, e.src_handle),
                )?,
                gpu: f.gpu(e.gpu)?,
                mem_kind: match (e.mem_kind, e.bytes) {
                    (0, 0) => None,
                    (k, _) => Some(f.mem_kind(k)?),
                },
                bytes: e.bytes,
            })
        }
        EventKind::GpuExport => {
            let e: raw::GpuExportEvent = exact(kind, bytes)?;
            Event::GpuExport(GpuExportEvent {
                header,
                client: e.client,
                handle: e.handle,
                file_id: e.file_id,
                position: e.position,
                gpu: f.gpu(e.gpu)?,
                bytes: e.bytes,
            })
        }
        EventKind::GpuCharge => {
            let e: raw::GpuChargeEvent = exact(kind, bytes)?;
            Event::GpuCharge(GpuChargeEvent {
                header,
                from_pid: e.from_pid,
                to_pid: e.to_pid,
                gpu: f.gpu(e.gpu)?,
                mem_kind: f.mem_kind(e.mem_kind)?,
                client: e.client,
                handle: e.handle,
                bytes: e.bytes,
            })
        }
    })
}

/// A NUL-terminated kernel string as text (lossy, cut at the first NUL).
pub fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

pub fn comm(bytes: &[u8; COMM_LEN]) -> String {
    cstr(bytes)
}

/// How a process ended, from a wait(2) status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled { signal: i32, core_dumped: bool },
}

impl ExitStatus {
    pub fn from_wait_status(status: u32) -> Self {
        let signal = (status & 0x7f) as i32;
        if signal == 0 {
            ExitStatus::Exited(((status >> 8) & 0xff) as i32)
        } else {
            ExitStatus::Signaled {
                signal,
                core_dumped: status & 0x80 != 0,
            }
        }
    }

    /// The shell's convention: the exit code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Exited(code) => code,
            ExitStatus::Signaled { signal, .. } => 128 + signal,
        }
    }

    pub fn signal(self) -> Option<i32> {
        match self {
            ExitStatus::Exited(_) => None,
            ExitStatus::Signaled { signal, .. } => Some(signal),
        }
    }
}

#[cfg(test)]
mod tests {
    use keling_common::{
        device_file, mem_kind, nvidia::status, open_how, outcome, ref_how, teardown, undecoded,
    };
    use proptest::prelude::*;

    use super::*;

    fn bytes_of<T: Plain>(v: &T) -> Vec<u8> {
        // SAFETY: T: Plain has no padding, so every byte is initialised.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn hdr(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 1,
            ts_ns: 123_456,
            pid: 10,
            tid: 11,
        }
    }

    #[test]
    fn decodes_each_kind() {
        let fork = ForkEvent {
            header: hdr(EventKind::Fork),
            child_pid: 12,
            child_tid: 12,
            tracked: 1,
            _reserved: 0,
            comm: *b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        assert_eq!(decode(&bytes_of(&fork)), Ok(Event::Fork(fork)));
        let mut filename = [0u8; keling_common::FILENAME_LEN];
        filename[..9].copy_from_slice(b"/bin/true");
        let exec = ExecEvent {
            header: hdr(EventKind::Exec),
            old_tid: 11,
            tracked: 1,
            comm: *b"true\0\0\0\0\0\0\0\0\0\0\0\0",
            filename,
        };
        let decoded = decode(&bytes_of(&exec)).unwrap();
        assert_eq!(decoded, Event::Exec(exec));
        if let Event::Exec(e) = decoded {
            assert_eq!(cstr(&e.filename), "/bin/true");
            assert_eq!(comm(&e.comm), "true");
        }
        let exit = ExitEvent {
            header: hdr(EventKind::Exit),
            exit_status: 7 << 8,
            group_dead: 1,
            tracked: 1,
            _reserved: 0,
            comm: [0; COMM_LEN],
        };
        assert_eq!(decode(&bytes_of(&exit)), Ok(Event::Exit(exit)));
        let switch = SwitchEvent {
            header: hdr(EventKind::Switch),
            prev_tid: 11,
            prev_pid: 10,
            next_tid: 0,
            next_pid: 0,
            prev_state: 1,
            prev_runtime_ns: 12_345,
        };
        assert_eq!(decode(&bytes_of(&switch)), Ok(Event::Switch(switch)));
        assert!(switch.voluntary());
    }

    #[test]
    fn decodes_gpu_kinds_into_typed_fields() {
        let open = raw::GpuOpenEvent {
            header: hdr(EventKind::GpuOpen),
            fd: 5,
            device: 3,
            file_id: 0xffff_8880_0000_1000,
            how: open_how::DUP,
            src_fd: 4,
        };
        assert_eq!(
            decode(&bytes_of(&open)),
            Ok(Event::GpuOpen(GpuOpenEvent {
                header: open.header,
                fd: 5,
                device: DeviceFile::Gpu(3),
                file_id: 0xffff_8880_0000_1000,
                how: OpenHow::Dup { src_fd: 4 },
            }))
        );
        let close = raw::GpuCloseEvent {
            header: hdr(EventKind::GpuClose),
            fd: 5,
            device: device_file::UVM,
            file_id: 1,
            released: 1,
            _reserved: 0,
        };
        let Ok(Event::GpuClose(c)) = decode(&bytes_of(&close)) else {
            panic!("close")
        };
        assert_eq!((c.device, c.released), (DeviceFile::Uvm, true));
        let alloc = raw::GpuAllocEvent {
            header: hdr(EventKind::GpuAlloc),
            client: 0xc1d0_0001,
            parent: 0xc1d0_0002,
            handle: 0xc1d0_0003,
            class: 0x42,
            mem_kind: mem_kind::EGM,
            gpu: NO_GPU,
            escape: escape::ALLOC,
            via_xfer: 1,
            bytes: 4096,
        };
        let Ok(Event::GpuAlloc(a)) = decode(&bytes_of(&alloc)) else {
            panic!("alloc")
        };
        assert_eq!(
            (a.mem_kind, a.gpu, a.via_xfer, a.kind()),
            (MemKind::Egm, None, true, ObjectKind::ExtendedMemory)
        );
        let free = raw::GpuFreeEvent {
            header: hdr(EventKind::GpuFree),
            client: 1,
            handle: 2,
            class: 0x80,
            kind: ObjectKind::Device as u32,
            gpu: 1,
            mem_kind: 0,
            freed_pid: 0,
            escape: escape::FREE,
            bytes: 0,
        };
        let Ok(Event::GpuFree(fr)) = decode(&bytes_of(&free)) else {
            panic!("free")
        };
        assert_eq!(
            (fr.kind, fr.gpu, fr.mem_kind, fr.freed_pid),
            (ObjectKind::Device, Some(1), None, None)
        );
        let td = raw::GpuTeardownEvent {
            header: hdr(EventKind::GpuTeardown),
            client: 1,
            reason: teardown::SUBDEVICE_FREED,
            owner_pid: 10,
            gpu: 0,
            device: 2,
            sub: 3,
            objects: 4,
            _reserved: 0,
            bytes: 5,
            host_bytes: 6,
            egm_bytes: 7,
        };
        let Ok(Event::GpuTeardown(t)) = decode(&bytes_of(&td)) else {
            panic!("teardown")
        };
        assert_eq!(
            (t.reason, t.sub, t.egm_bytes),
            (TeardownReason::SubdeviceFreed, Some(3), 7)
        );
        let ioctl = raw::GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 3,
            device: device_file::CTL,
            escape: escape::CONTROL,
            cmd: 0xC020_462A,
            control_cmd: 0x3d05,
            class: 0,
            gpu: NO_GPU,
            _reserved: 0,
            status: 0,
            outcome: outcome::UNDECODED,
            undecoded: undecoded::FAULT,
            via_xfer: 0,
            ret: 0,
            requested_bytes: 0,
        };
        let Ok(Event::GpuIoctl(i)) = decode(&bytes_of(&ioctl)) else {
            panic!("ioctl")
        };
        assert_eq!(
            (i.call, i.control_cmd, i.outcome),
            (
                Call::Rm(escape::CONTROL),
                Some(0x3d05),
                IoctlOutcome::Undecoded(UndecodedReason::Fault)
            )
        );
        let uvm = raw::GpuIoctlEvent {
            device: device_file::UVM,
            escape: keling_common::nvidia::uvm::FREE,
            cmd: keling_common::nvidia::uvm::FREE,
            outcome: outcome::DECODED,
            undecoded: 99, // ignored unless the outcome is UNDECODED
            status: status::NO_MEMORY,
            ..ioctl
        };
        let Ok(Event::GpuIoctl(u)) = decode(&bytes_of(&uvm)) else {
            panic!("uvm")
        };
        assert_eq!(
            (u.call, u.control_cmd, u.outcome),
            (
                Call::Uvm(keling_common::nvidia::uvm::FREE),
                None,
                IoctlOutcome::Decoded
            )
        );
        // A small plain number on nvidiactl is no RM escape: named by its command.
        let not_rm = raw::GpuIoctlEvent {
            escape: 0,
            cmd: 0x1234,
            control_cmd: 0,
            undecoded: undecoded::UNKNOWN_ESCAPE,
            ..ioctl
        };
        let Ok(Event::GpuIoctl(n)) = decode(&bytes_of(&not_rm)) else {
            panic!("not rm")
        };
        assert_eq!((n.call, n.control_cmd), (Call::NotRm(0x1234), None));
        assert_eq!(
            Call::of_counted(keling_common::call_kind::RM_ESCAPE, 0xca),
            Some(Call::Rm(0xca))
        );
        assert_eq!(
            Call::of_counted(keling_common::call_kind::UVM, 75),
            Some(Call::Uvm(75))
        );
        assert_eq!(
            Call::of_counted(keling_common::call_kind::NOT_RM, 0x1234),
            Some(Call::NotRm(0x1234))
        );
        assert_eq!(
            Call::of_counted(keling_common::call_kind::RM_CONTROL, 0x101),
            None
        );
        let r = raw::GpuRefEvent {
            header: hdr(EventKind::GpuRef),
            client: 1,
            parent: 2,
            handle: 3,
            how: ref_how::DUP,
            src_client: 4,
            src_handle: 5,
            gpu: 0,
            mem_kind: mem_kind::VIDEO,
            bytes: 8,
        };
        let Ok(Event::GpuRef(rf)) = decode(&bytes_of(&r)) else {
            panic!("ref")
        };
        assert_eq!(
            rf.how,
            RefHow::Dup {
                src_client: 4,
                src_handle: 5
            }
        );
        let charge = raw::GpuChargeEvent {
            header: hdr(EventKind::GpuCharge),
            from_pid: 10,
            to_pid: 11,
            gpu: 0,
            mem_kind: mem_kind::HOST,
            client: 1,
            handle: 2,
            bytes: 3,
        };
        let Ok(Event::GpuCharge(ch)) = decode(&bytes_of(&charge)) else {
            panic!("charge")
        };
        assert_eq!(ch.mem_kind, MemKind::Host);
        let export = raw::GpuExportEvent {
            header: hdr(EventKind::GpuExport),
            client: 1,
            handle: 2,
            file_id: 3,
            position: 4,
            gpu: 0,
            bytes: 5,
        };
        let Ok(Event::GpuExport(ex)) = decode(&bytes_of(&export)) else {
            panic!("export")
        };
        assert_eq!((ex.position, ex.gpu), (4, Some(0)));
    }

    #[test]
    fn rejects_bad_bytes() {
        assert_eq!(decode(&[1, 2, 3]), Err(DecodeError::Short(3)));
        let mut h = bytes_of(&hdr(EventKind::Fork));
        h[0] = 99;
        assert_eq!(decode(&h), Err(DecodeError::UnknownKind(99)));
        let h = bytes_of(&hdr(EventKind::Switch));
        assert_eq!(
            decode(&h),
            Err(DecodeError::BadSize {
                kind: EventKind::Switch,
                got: 24,
                want: size_of::<SwitchEvent>()
            })
        );
        // The old GpuDup kind is gone.
        let mut h = bytes_of(&hdr(EventKind::Fork));
        h[..4].copy_from_slice(&202u32.to_le_bytes());
        assert_eq!(decode(&h), Err(DecodeError::UnknownKind(202)));
    }

    #[test]
    fn rejects_codes_the_contract_does_not_define() {
        let bad =
            |kind: EventKind, field: &'static str, value: u32| -> Result<Event, DecodeError> {
                Err(DecodeError::BadCode { kind, field, value })
            };
        let open = raw::GpuOpenEvent {
            header: hdr(EventKind::GpuOpen),
            fd: 5,
            device: device_file::CTL,
            file_id: 1,
            how: 9,
            src_fd: -1,
        };
        assert_eq!(decode(&bytes_of(&open)), bad(EventKind::GpuOpen, "how", 9));
        let open = raw::GpuOpenEvent {
            how: open_how::OPEN,
            device: device_file::NONE,
            ..open
        };
        assert_eq!(
            decode(&bytes_of(&open)),
            bad(EventKind::GpuOpen, "device", device_file::NONE)
        );
        let open = raw::GpuOpenEvent {
            device: 248,
            ..open
        };
        assert_eq!(
            decode(&bytes_of(&open)),
            bad(EventKind::GpuOpen, "device", 248)
        );
        let alloc = raw::GpuAllocEvent {
            header: hdr(EventKind::GpuAlloc),
            client: 1,
            parent: 2,
            handle: 3,
            class: 0x40,
            mem_kind: 0,
            gpu: 0,
            escape: escape::ALLOC,
            via_xfer: 0,
            bytes: 1,
        };
        assert_eq!(
            decode(&bytes_of(&alloc)),
            bad(EventKind::GpuAlloc, "mem_kind", 0)
        );
        let alloc = raw::GpuAllocEvent {
            mem_kind: mem_kind::VIDEO,
            gpu: ALL_GPUS,
            ..alloc
        };
        assert_eq!(
            decode(&bytes_of(&alloc)),
            bad(EventKind::GpuAlloc, "gpu", ALL_GPUS)
        );
        let alloc = raw::GpuAllocEvent {
            gpu: 0,
            via_xfer: 2,
            ..alloc
        };
        assert_eq!(
            decode(&bytes_of(&alloc)),
            bad(EventKind::GpuAlloc, "via_xfer", 2)
        );
        let free = raw::GpuFreeEvent {
            header: hdr(EventKind::GpuFree),
            client: 1,
            handle: 2,
            class: 0x40,
            kind: 14,
            gpu: 0,
            mem_kind: mem_kind::VIDEO,
            freed_pid: 10,
            escape: escape::FREE,
            bytes: 1,
        };
        assert_eq!(
            decode(&bytes_of(&free)),
            bad(EventKind::GpuFree, "kind", 14)
        );
        let td = raw::GpuTeardownEvent {
            header: hdr(EventKind::GpuTeardown),
            client: 1,
            reason: 0,
            owner_pid: 10,
            gpu: 0,
            device: 2,
            sub: 0,
            objects: 1,
            _reserved: 0,
            bytes: 1,
            host_bytes: 0,
            egm_bytes: 0,
        };
        assert_eq!(
            decode(&bytes_of(&td)),
            bad(EventKind::GpuTeardown, "reason", 0)
        );
        let ioctl = raw::GpuIoctlEvent {
            header: hdr(EventKind::GpuIoctl),
            fd: 3,
            device: device_file::CTL,
            escape: escape::CARD_INFO,
            cmd: 0,
            control_cmd: 0,
            class: 0,
            gpu: NO_GPU,
            _reserved: 0,
            status: 0,
            outcome: 3,
            undecoded: 0,
            via_xfer: 0,
            ret: 0,
            requested_bytes: 0,
        };
        assert_eq!(
            decode(&bytes_of(&ioctl)),
            bad(EventKind::GpuIoctl, "outcome", 3)
        );
        let ioctl = raw::GpuIoctlEvent {
            outcome: outcome::UNDECODED,
            undecoded: undecoded::COUNT,
            ..ioctl
        };
        assert_eq!(
            decode(&bytes_of(&ioctl)),
            bad(EventKind::GpuIoctl, "undecoded", undecoded::COUNT)
        );
        let r = raw::GpuRefEvent {
            header: hdr(EventKind::GpuRef),
            client: 1,
            parent: 2,
            handle: 3,
            how: 3,
            src_client: 0,
            src_handle: 0,
            gpu: 0,
            mem_kind: mem_kind::VIDEO,
            bytes: 8,
        };
        assert_eq!(decode(&bytes_of(&r)), bad(EventKind::GpuRef, "how", 3));
    }

    #[test]
    fn exit_status_follows_wait_encoding() {
        assert_eq!(ExitStatus::from_wait_status(3 << 8), ExitStatus::Exited(3));
        assert_eq!(ExitStatus::from_wait_status(3 << 8).code(), 3);
        let killed = ExitStatus::from_wait_status(9);
        assert_eq!(
            killed,
            ExitStatus::Signaled {
                signal: 9,
                core_dumped: false
            }
        );
        assert_eq!(killed.code(), 137);
        assert_eq!(
            ExitStatus::from_wait_status(0x80 | 11),
            ExitStatus::Signaled {
                signal: 11,
                core_dumped: true
            }
        );
    }

    #[test]
    fn voluntary_follows_prev_state() {
        let mut s = SwitchEvent {
            header: hdr(EventKind::Switch),
            prev_tid: 1,
            prev_pid: 1,
            next_tid: 2,
            next_pid: 0,
            prev_state: 0,
            prev_runtime_ns: 0,
        };
        assert!(!s.voluntary(), "runnable (yield) is involuntary");
        s.prev_state = keling_common::task_state::PREEMPTED;
        assert!(!s.voluntary(), "preempted is involuntary");
        s.prev_state = keling_common::task_state::UNINTERRUPTIBLE;
        assert!(s.voluntary());
    }

    /// Bytes of one record of `kind`: `fill` everywhere, then every coded field set
    /// to the valid code `pick` selects (so that any record the probes may write is
    /// covered, whatever its other fields hold).
    fn record(kind: EventKind, fill: u8, pick: usize) -> Vec<u8> {
        fn filled<T: Plain>(fill: u8) -> T {
            read(&vec![fill; size_of::<T>()]).unwrap()
        }
        fn one<T: Copy>(choices: &[T], pick: usize) -> T {
            choices[pick % choices.len()]
        }
        let devices = [device_file::CTL, device_file::UVM, 0, device_file::MAX_GPU];
        let gpus = [NO_GPU, 0, 7, u32::from(fill)];
        let kinds = [mem_kind::VIDEO, mem_kind::HOST, mem_kind::EGM];
        let flags = [0, 1];
        match kind {
            EventKind::Fork => bytes_of(&filled::<ForkEvent>(fill)),
            EventKind::Exec => bytes_of(&filled::<ExecEvent>(fill)),
            EventKind::Exit => bytes_of(&filled::<ExitEvent>(fill)),
            EventKind::Switch => bytes_of(&filled::<SwitchEvent>(fill)),
            EventKind::Active => bytes_of(&filled::<ActiveEvent>(fill)),
            EventKind::GpuOpen => {
                let mut e: raw::GpuOpenEvent = filled(fill);
                e.device = one(&devices, pick);
                e.how = one(&[1, 2, 3, 4], pick / 3);
                bytes_of(&e)
            }
            EventKind::GpuClose => {
                let mut e: raw::GpuCloseEvent = filled(fill);
                e.device = one(&devices, pick);
                e.released = one(&flags, pick / 5);
                bytes_of(&e)
            }
            EventKind::GpuAlloc => {
                let mut e: raw::GpuAllocEvent = filled(fill);
                e.mem_kind = one(&kinds, pick);
                e.gpu = one(&gpus, pick / 3);
                e.via_xfer = one(&flags, pick / 5);
                bytes_of(&e)
            }
            EventKind::GpuFree => {
                let mut e: raw::GpuFreeEvent = filled(fill);
                e.kind = (pick % 14) as u32;
                e.gpu = one(&gpus, pick / 3);
                e.mem_kind = one(&[0, 1, 2, 3], pick / 5);
                bytes_of(&e)
            }
            EventKind::GpuObject => {
                let mut e: raw::GpuObjectEvent = filled(fill);
                e.kind = (pick % 14) as u32;
                e.gpu = one(&gpus, pick / 3);
                bytes_of(&e)
            }
            EventKind::GpuTeardown => {
                let mut e: raw::GpuTeardownEvent = filled(fill);
                e.reason = one(&[1, 2, 3, 4], pick);
                e.gpu = one(&gpus, pick / 3);
                bytes_of(&e)
            }
            EventKind::GpuIoctl => {
                let mut e: raw::GpuIoctlEvent = filled(fill);
                e.device = one(&devices, pick);
                e.gpu = one(&gpus, pick / 3);
                e.outcome = one(&[0, 1, 2], pick / 5);
                e.undecoded = (pick % undecoded::COUNT as usize) as u32;
                e.via_xfer = one(&flags, pick / 7);
                bytes_of(&e)
            }
            EventKind::GpuRef => {
                let mut e: raw::GpuRefEvent = filled(fill);
                e.how = one(&[1, 2], pick);
                e.gpu = one(&gpus, pick / 3);
                e.mem_kind = one(&[0, 1, 2, 3], pick / 5);
                if e.mem_kind == 0 {
                    e.bytes = 0;
                }
                bytes_of(&e)
            }
            EventKind::GpuExport => {
                let mut e: raw::GpuExportEvent = filled(fill);
                e.gpu = one(&gpus, pick);
                bytes_of(&e)
            }
            EventKind::GpuCharge => {
                let mut e: raw::GpuChargeEvent = filled(fill);
                e.gpu = one(&gpus, pick);
                e.mem_kind = one(&kinds, pick / 3);
                bytes_of(&e)
            }
        }
    }

    proptest! {
        /// Any bytes at all decode to an event or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        /// Any bytes behind a valid header of any kind, at any length: never a panic.
        #[test]
        fn arbitrary_bodies_never_panic(k in 0..EventKind::ALL.len(),
                                        body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut bytes = bytes_of(&hdr(EventKind::ALL[k]));
            bytes.extend(body);
            let _ = decode(&bytes);
        }

        /// Every well-sized record of every kind, with the contract's codes in its
        /// coded fields and anything elsewhere, decodes to that kind.
        #[test]
        fn well_sized_records_decode(k in 0..EventKind::ALL.len(), fill in any::<u8>(),
                                     pick in any::<usize>()) {
            let kind = EventKind::ALL[k];
            let mut bytes = record(kind, fill, pick);
            bytes[..4].copy_from_slice(&(kind as u32).to_le_bytes());
            let ev = decode(&bytes);
            prop_assert!(ev.is_ok(), "{:?}: {:?}", kind, ev);
            let ev = ev.unwrap();
            prop_assert_eq!(ev.kind(), kind);
            prop_assert_eq!(ev.header().kind, kind as u32);
            prop_assert_eq!(ev.is_gpu(), kind as u32 >= 200);
        }
    }
}
