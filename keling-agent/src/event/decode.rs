//! Ring-buffer bytes -> typed events. The only place that looks at raw event bytes.
use keling_common::{
    COMM_LEN, EventHeader, EventKind, ExecEvent, ExitEvent, ForkEvent, GpuEvent, GpuFileEvent,
    SwitchEvent,
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
}

/// One decoded event, as the kernel wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Fork(ForkEvent),
    Exec(ExecEvent),
    Exit(ExitEvent),
    Switch(SwitchEvent),
    /// Open, close or dup of an NVIDIA fd (`kind` in the header says which).
    GpuFile(GpuFileEvent),
    /// Allocation, free, object, teardown or other ioctl (`kind` says which).
    Gpu(GpuEvent),
}

impl Event {
    pub fn header(&self) -> &EventHeader {
        match self {
            Event::Fork(e) => &e.header,
            Event::Exec(e) => &e.header,
            Event::Exit(e) => &e.header,
            Event::Switch(e) => &e.header,
            Event::GpuFile(e) => &e.header,
            Event::Gpu(e) => &e.header,
        }
    }
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
unsafe impl Plain for GpuFileEvent {}
// SAFETY: as above.
unsafe impl Plain for GpuEvent {}

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

pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let header: EventHeader = read(bytes).ok_or(DecodeError::Short(bytes.len()))?;
    let kind = EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind(header.kind))?;
    Ok(match kind {
        EventKind::Fork => Event::Fork(exact(kind, bytes)?),
        EventKind::Exec => Event::Exec(exact(kind, bytes)?),
        EventKind::Exit => Event::Exit(exact(kind, bytes)?),
        EventKind::Switch => Event::Switch(exact(kind, bytes)?),
        EventKind::GpuOpen | EventKind::GpuClose | EventKind::GpuDup => {
            Event::GpuFile(exact(kind, bytes)?)
        }
        EventKind::GpuAlloc
        | EventKind::GpuFree
        | EventKind::GpuObject
        | EventKind::GpuTeardown
        | EventKind::GpuIoctl => Event::Gpu(exact(kind, bytes)?),
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
    use super::*;
    use proptest::prelude::*;

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
        };
        assert_eq!(decode(&bytes_of(&switch)), Ok(Event::Switch(switch)));
        assert!(switch.voluntary());
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
        };
        assert!(!s.voluntary(), "runnable (yield) is involuntary");
        s.prev_state = keling_common::task_state::PREEMPTED;
        assert!(!s.voluntary(), "preempted is involuntary");
        s.prev_state = keling_common::task_state::UNINTERRUPTIBLE;
        assert!(s.voluntary());
    }

    proptest! {
        /// Any bytes at all decode to an event or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        /// Any well-sized record with a valid kind round-trips.
        #[test]
        fn well_sized_records_decode(kind in prop_oneof![Just(1u32), Just(2), Just(3), Just(100),
                                                         Just(200), Just(201), Just(202), Just(210),
                                                         Just(211), Just(212), Just(213), Just(214)],
                                     fill in any::<u8>()) {
            let k = EventKind::from_u32(kind).unwrap();
            let len = match k {
                EventKind::Fork => size_of::<ForkEvent>(),
                EventKind::Exec => size_of::<ExecEvent>(),
                EventKind::Exit => size_of::<ExitEvent>(),
                EventKind::Switch => size_of::<SwitchEvent>(),
                EventKind::GpuOpen | EventKind::GpuClose | EventKind::GpuDup => size_of::<GpuFileEvent>(),
                _ => size_of::<GpuEvent>(),
            };
            let mut bytes = vec![fill; len];
            bytes[..4].copy_from_slice(&kind.to_le_bytes());
            let ev = decode(&bytes).unwrap();
            prop_assert_eq!(ev.header().kind, kind);
        }
    }
}
