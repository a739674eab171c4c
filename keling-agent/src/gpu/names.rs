//! Human names for NVIDIA ABI numbers and Keling's own codes: one table per set,
//! `(code, name)`, that every output (text, JSON lines, logs) uses. A test checks
//! that each constant of the contract has exactly one name and that names are unique.
use keling_common::{
    mem_kind,
    nvidia::{ObjectKind, class, ctrl, escape, uvm},
    open_how, outcome, ref_how, teardown, undecoded,
};

use crate::event::decode::{
    Call, DeviceFile, IoctlOutcome, MemKind, OpenHow, RefHow, TeardownReason, UndecodedReason,
};

/// RM escapes (`nr` of the ioctl command on `nvidiactl` / `nvidiaN`).
pub const ESCAPES: &[(u32, &str)] = &[
    (escape::ALLOC_MEMORY, "RM_ALLOC_MEMORY"),
    (escape::FREE, "RM_FREE"),
    (escape::CONTROL, "RM_CONTROL"),
    (escape::ALLOC, "RM_ALLOC"),
    (escape::DUP_OBJECT, "RM_DUP_OBJECT"),
    (escape::SHARE, "RM_SHARE"),
    (escape::VID_HEAP_CONTROL, "RM_VID_HEAP_CONTROL"),
    (escape::MAP_MEMORY, "RM_MAP_MEMORY"),
    (escape::UNMAP_MEMORY, "RM_UNMAP_MEMORY"),
    (escape::ALLOC_CONTEXT_DMA2, "RM_ALLOC_CONTEXT_DMA2"),
    (escape::MAP_MEMORY_DMA, "RM_MAP_MEMORY_DMA"),
    (escape::UNMAP_MEMORY_DMA, "RM_UNMAP_MEMORY_DMA"),
    (
        escape::UPDATE_DEVICE_MAPPING_INFO,
        "RM_UPDATE_DEVICE_MAPPING_INFO",
    ),
    (escape::CARD_INFO, "CARD_INFO"),
    (escape::REGISTER_FD, "REGISTER_FD"),
    (escape::ALLOC_OS_EVENT, "ALLOC_OS_EVENT"),
    (escape::FREE_OS_EVENT, "FREE_OS_EVENT"),
    (escape::CHECK_VERSION_STR, "CHECK_VERSION_STR"),
    (escape::XFER_CMD, "XFER_CMD"),
    (escape::ATTACH_GPUS_TO_FD, "ATTACH_GPUS_TO_FD"),
    (escape::SYS_PARAMS, "SYS_PARAMS"),
    (escape::NUMA_INFO, "NUMA_INFO"),
    (escape::WAIT_OPEN_COMPLETE, "WAIT_OPEN_COMPLETE"),
];

/// nvidia-uvm commands.
pub const UVM_COMMANDS: &[(u32, &str)] = &[
    (uvm::INITIALIZE, "UVM_INITIALIZE"),
    (uvm::DEINITIALIZE, "UVM_DEINITIALIZE"),
    (uvm::CREATE_RANGE_GROUP, "UVM_CREATE_RANGE_GROUP"),
    (uvm::REGISTER_GPU_VASPACE, "UVM_REGISTER_GPU_VASPACE"),
    (uvm::REGISTER_CHANNEL, "UVM_REGISTER_CHANNEL"),
    (uvm::MAP_EXTERNAL_ALLOCATION, "UVM_MAP_EXTERNAL_ALLOCATION"),
    (uvm::FREE, "UVM_FREE"),
    (uvm::REGISTER_GPU, "UVM_REGISTER_GPU"),
    (uvm::PAGEABLE_MEM_ACCESS, "UVM_PAGEABLE_MEM_ACCESS"),
    (uvm::MIGRATE, "UVM_MIGRATE"),
    (uvm::UNMAP_EXTERNAL, "UVM_UNMAP_EXTERNAL"),
    (uvm::ALLOC_SEMAPHORE_POOL, "UVM_ALLOC_SEMAPHORE_POOL"),
    (uvm::CREATE_EXTERNAL_RANGE, "UVM_CREATE_EXTERNAL_RANGE"),
    (uvm::MM_INITIALIZE, "UVM_MM_INITIALIZE"),
];

/// The RM_CONTROL commands Keling decodes.
pub const CONTROLS: &[(u32, &str)] = &[
    (
        ctrl::EXPORT_OBJECT_TO_FD,
        "NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD",
    ),
    (
        ctrl::IMPORT_OBJECT_FROM_FD,
        "NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD",
    ),
    (
        ctrl::EXPORT_OBJECTS_TO_FD,
        "NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD",
    ),
    (
        ctrl::IMPORT_OBJECTS_FROM_FD,
        "NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD",
    ),
];

/// RM classes (`g_allclasses.h`).
pub const CLASSES: &[(u32, &str)] = &[
    (class::NV01_ROOT, "NV01_ROOT"),
    (class::NV01_ROOT_NON_PRIV, "NV01_ROOT_NON_PRIV"),
    (class::NV01_ROOT_CLIENT, "NV01_ROOT_CLIENT"),
    (class::NV01_DEVICE_0, "NV01_DEVICE_0"),
    (class::NV20_SUBDEVICE_0, "NV20_SUBDEVICE_0"),
    (class::NV01_MEMORY_SYSTEM, "NV01_MEMORY_SYSTEM"),
    (
        class::NV01_MEMORY_LOCAL_PRIVILEGED,
        "NV01_MEMORY_LOCAL_PRIVILEGED",
    ),
    (class::NV01_MEMORY_LOCAL_USER, "NV01_MEMORY_LOCAL_USER"),
    (class::NV_MEMORY_EXTENDED_USER, "NV_MEMORY_EXTENDED_USER"),
    (class::NV01_MEMORY_VIRTUAL, "NV01_MEMORY_VIRTUAL"),
    (
        class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
        "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
    ),
    (
        class::NV01_MEMORY_LOCAL_PHYSICAL,
        "NV01_MEMORY_LOCAL_PHYSICAL",
    ),
    (class::CLASS_0XE0, "NV_MEMORY_EXPORT"),
    (class::NV_MEMORY_FABRIC, "NV_MEMORY_FABRIC"),
    (
        class::NV_MEMORY_FABRIC_IMPORT_V2,
        "NV_MEMORY_FABRIC_IMPORT_V2",
    ),
    (
        class::NV_MEMORY_FABRIC_IMPORTED_REF,
        "NV_MEMORY_FABRIC_IMPORTED_REF",
    ),
    (
        class::NV_MEMORY_MULTICAST_FABRIC,
        "NV_MEMORY_MULTICAST_FABRIC",
    ),
    (class::NV_MEMORY_MAPPER, "NV_MEMORY_MAPPER"),
    (class::NV50_MEMORY_VIRTUAL, "NV50_MEMORY_VIRTUAL"),
    (class::FERMI_CONTEXT_SHARE_A, "FERMI_CONTEXT_SHARE_A"),
    (class::FERMI_VASPACE_A, "FERMI_VASPACE_A"),
    (class::KEPLER_CHANNEL_GROUP_A, "KEPLER_CHANNEL_GROUP_A"),
    (class::GPFIFO[0], "VOLTA_CHANNEL_GPFIFO_A"),
    (class::GPFIFO[1], "TURING_CHANNEL_GPFIFO_A"),
    (class::GPFIFO[2], "AMPERE_CHANNEL_GPFIFO_A"),
    (class::GPFIFO[3], "HOPPER_CHANNEL_GPFIFO_A"),
    (class::GPFIFO[4], "BLACKWELL_CHANNEL_GPFIFO_A"),
    (class::GPFIFO[5], "BLACKWELL_CHANNEL_GPFIFO_B"),
    (class::COMPUTE[0], "TURING_COMPUTE_A"),
    (class::COMPUTE[1], "AMPERE_COMPUTE_A"),
    (class::COMPUTE[2], "AMPERE_COMPUTE_B"),
    (class::COMPUTE[3], "ADA_COMPUTE_A"),
    (class::COMPUTE[4], "HOPPER_COMPUTE_A"),
    (class::COMPUTE[5], "BLACKWELL_COMPUTE_A"),
    (class::COMPUTE[6], "BLACKWELL_COMPUTE_B"),
    (class::COPY[0], "AMPERE_DMA_COPY_B"),
    (class::COPY[1], "HOPPER_DMA_COPY_A"),
];

/// What an RM object is ([`ObjectKind`] as `u32`).
pub const OBJECT_KINDS: &[(u32, &str)] = &[
    (ObjectKind::Other as u32, "other"),
    (ObjectKind::Client as u32, "client"),
    (ObjectKind::Device as u32, "device"),
    (ObjectKind::Subdevice as u32, "subdevice"),
    (ObjectKind::VaSpace as u32, "vaspace"),
    (ObjectKind::ChannelGroup as u32, "channel_group"),
    (ObjectKind::ContextShare as u32, "context_share"),
    (ObjectKind::Channel as u32, "channel"),
    (ObjectKind::Compute as u32, "compute"),
    (ObjectKind::Copy as u32, "copy"),
    (ObjectKind::VideoMemory as u32, "video_memory"),
    (ObjectKind::HostMemory as u32, "host_memory"),
    (ObjectKind::VirtualMemory as u32, "virtual_memory"),
    (ObjectKind::ExtendedMemory as u32, "extended_memory"),
];

pub const MEM_KINDS: &[(u32, &str)] = &[
    (mem_kind::VIDEO, "video"),
    (mem_kind::HOST, "host"),
    (mem_kind::EGM, "egm"),
];

pub const UNDECODED_REASONS: &[(u32, &str)] = &[
    (
        undecoded::FINN_SERIALIZED,
        undecoded::NAMES[undecoded::FINN_SERIALIZED as usize],
    ),
    (
        undecoded::UNKNOWN_LAYOUT,
        undecoded::NAMES[undecoded::UNKNOWN_LAYOUT as usize],
    ),
    (
        undecoded::FAULT,
        undecoded::NAMES[undecoded::FAULT as usize],
    ),
    (
        undecoded::UNKNOWN_ESCAPE,
        undecoded::NAMES[undecoded::UNKNOWN_ESCAPE as usize],
    ),
    (
        undecoded::TABLE_FULL,
        undecoded::NAMES[undecoded::TABLE_FULL as usize],
    ),
    (
        undecoded::UNKNOWN_OBJECT,
        undecoded::NAMES[undecoded::UNKNOWN_OBJECT as usize],
    ),
];

pub const TEARDOWN_REASONS: &[(u32, &str)] = &[
    (teardown::CLIENT_FREED, "client_freed"),
    (teardown::FILE_RELEASED, "file_released"),
    (teardown::DEVICE_FREED, "device_freed"),
    (teardown::SUBDEVICE_FREED, "subdevice_freed"),
];

pub const OPEN_HOWS: &[(u32, &str)] = &[
    (open_how::OPEN, "open"),
    (open_how::DUP, "dup"),
    (open_how::RECEIVED, "received"),
    (open_how::FIRST_USE, "first_use"),
];

pub const REF_HOWS: &[(u32, &str)] = &[(ref_how::DUP, "dup"), (ref_how::IMPORT, "import")];

pub const OUTCOMES: &[(u32, &str)] = &[
    (outcome::DECODED, "decoded"),
    (outcome::NO_MEMORY_ESCAPE, "no_memory_escape"),
    (outcome::UNDECODED, "undecoded"),
];

/// The name of `code` in `table`.
pub fn lookup(table: &[(u32, &'static str)], code: u32) -> Option<&'static str> {
    table.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// For codes that always have a name (the tests check it).
fn named(table: &[(u32, &'static str)], code: u32) -> &'static str {
    lookup(table, code).unwrap_or("?")
}

pub fn device(d: DeviceFile) -> String {
    match d {
        DeviceFile::Ctl => "nvidiactl".into(),
        DeviceFile::Uvm => "nvidia-uvm".into(),
        DeviceFile::Gpu(n) => format!("nvidia{n}"),
    }
}

/// An RM escape by its number (`RM_0x..` when Keling has no name for it).
pub fn escape(nr: u32) -> String {
    lookup(ESCAPES, nr).map_or_else(|| format!("RM_{nr:#x}"), str::to_owned)
}

/// A UVM command by its number (`UVM_0x..` when Keling has no name for it).
pub fn uvm_command(cmd: u32) -> String {
    lookup(UVM_COMMANDS, cmd).map_or_else(|| format!("UVM_{cmd:#x}"), str::to_owned)
}

/// An RM escape or a UVM command.
pub fn call(c: Call) -> String {
    match c {
        Call::Rm(nr) => escape(nr),
        Call::Uvm(cmd) => uvm_command(cmd),
    }
}

pub fn control(cmd: u32) -> Option<&'static str> {
    lookup(CONTROLS, cmd)
}

pub fn class(c: u32) -> Option<&'static str> {
    lookup(CLASSES, c)
}

pub fn object_kind(k: ObjectKind) -> &'static str {
    named(OBJECT_KINDS, k as u32)
}

pub fn mem_kind(k: MemKind) -> &'static str {
    named(MEM_KINDS, k.code())
}

pub fn undecoded_reason(r: UndecodedReason) -> &'static str {
    named(UNDECODED_REASONS, r.code())
}

/// The name of the kernel's per-reason counter `index`.
pub fn undecoded_index(index: usize) -> &'static str {
    u32::try_from(index)
        .ok()
        .and_then(|i| lookup(UNDECODED_REASONS, i))
        .unwrap_or("unknown")
}

pub fn teardown_reason(r: TeardownReason) -> &'static str {
    named(TEARDOWN_REASONS, r.code())
}

pub fn open_how(h: OpenHow) -> &'static str {
    named(OPEN_HOWS, h.code())
}

pub fn ref_how(h: RefHow) -> &'static str {
    named(REF_HOWS, h.code())
}

pub fn outcome(o: IoctlOutcome) -> &'static str {
    named(OUTCOMES, o.code())
}

/// `gpuN`, or `gpu?` when not known (text output).
pub fn gpu(g: Option<u32>) -> String {
    g.map_or_else(|| "gpu?".into(), |g| format!("gpu{g}"))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// The contract's source, to list every constant of a module (so that a constant
    /// added there without a name here fails this test).
    const NVIDIA_RS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../keling-common/src/nvidia.rs"
    ));

    fn parse_u32(s: &str) -> u32 {
        let s = s.trim().replace('_', "");
        match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => s.parse(),
        }
        .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// `pub const NAME: u32 = V;` and `pub const NAME: [u32; N] = [..];` of `pub mod
    /// module`, as (name, value) (arrays as NAME[i]).
    fn constants(module: &str) -> Vec<(String, u32)> {
        let start = format!("pub mod {module} {{");
        let body: Vec<&str> = NVIDIA_RS
            .lines()
            .skip_while(|l| l.trim_end() != start)
            .skip(1)
            .take_while(|l| *l != "}")
            .collect();
        assert!(!body.is_empty(), "no module {module} in nvidia.rs");
        let mut out = Vec::new();
        for line in body {
            let Some(rest) = line.trim().strip_prefix("pub const ") else {
                continue;
            };
            if rest.starts_with("fn ") {
                continue;
            }
            let Some((name, rest)) = rest.split_once(':') else {
                continue;
            };
            let (ty, value) = rest.split_once('=').expect("a value");
            let value = value.trim().trim_end_matches(';');
            match ty.trim() {
                "u32" => out.push((name.to_owned(), parse_u32(value))),
                t if t.starts_with("[u32;") => {
                    let items = value.trim_start_matches('[').trim_end_matches(']');
                    for (i, v) in items.split(',').enumerate() {
                        out.push((format!("{name}[{i}]"), parse_u32(v)));
                    }
                }
                _ => {} // offsets (usize)
            }
        }
        out
    }

    /// Each constant has exactly one entry, every entry is a constant, names unique.
    fn covers(table: &[(u32, &str)], consts: &[(String, u32)]) {
        let names: BTreeSet<&str> = table.iter().map(|(_, n)| *n).collect();
        assert_eq!(names.len(), table.len(), "names not unique: {table:?}");
        let codes: BTreeMap<u32, &String> = consts.iter().map(|(n, v)| (*v, n)).collect();
        for (name, value) in consts {
            let hits = table.iter().filter(|(c, _)| c == value).count();
            assert_eq!(hits, 1, "{name} = {value:#x} has {hits} names");
        }
        for (code, name) in table {
            assert!(
                codes.contains_key(code),
                "{name} ({code:#x}) is no constant"
            );
        }
    }

    #[test]
    fn every_abi_constant_has_exactly_one_name() {
        let escapes = constants("escape");
        assert!(escapes.iter().any(|(n, _)| n == "WAIT_OPEN_COMPLETE"));
        covers(ESCAPES, &escapes);
        covers(UVM_COMMANDS, &constants("uvm"));
        let classes = constants("class");
        assert!(classes.iter().any(|(n, _)| n == "COMPUTE[6]"));
        covers(CLASSES, &classes);
        // Controls: the command numbers of `ctrl`, not its sizes (u32 `*_SIZE`).
        let controls: Vec<(String, u32)> = constants("ctrl")
            .into_iter()
            .filter(|(n, _)| !n.ends_with("_SIZE"))
            .collect();
        assert_eq!(controls.len(), 4, "{controls:?}");
        covers(CONTROLS, &controls);
    }

    #[test]
    fn every_code_has_exactly_one_name() {
        let named = |table: &[(u32, &str)], codes: &[u32]| {
            let consts: Vec<(String, u32)> = codes.iter().map(|&c| (c.to_string(), c)).collect();
            covers(table, &consts);
        };
        let kinds: Vec<u32> = (0..64)
            .filter(|&k| ObjectKind::from_u32(k) as u32 == k)
            .collect();
        assert_eq!(kinds.len(), 14);
        named(OBJECT_KINDS, &kinds);
        let mem: Vec<u32> = MemKind::ALL.iter().map(|k| k.code()).collect();
        named(MEM_KINDS, &mem);
        let und: Vec<u32> = UndecodedReason::ALL.iter().map(|r| r.code()).collect();
        named(UNDECODED_REASONS, &und);
        assert_eq!(und.len(), undecoded::COUNT as usize);
        let td: Vec<u32> = TeardownReason::ALL.iter().map(|r| r.code()).collect();
        named(TEARDOWN_REASONS, &td);
        named(
            OPEN_HOWS,
            &[
                open_how::OPEN,
                open_how::DUP,
                open_how::RECEIVED,
                open_how::FIRST_USE,
            ],
        );
        named(REF_HOWS, &[ref_how::DUP, ref_how::IMPORT]);
        named(
            OUTCOMES,
            &[
                outcome::DECODED,
                outcome::NO_MEMORY_ESCAPE,
                outcome::UNDECODED,
            ],
        );
        for (i, name) in undecoded::NAMES.iter().enumerate() {
            assert_eq!(undecoded_index(i), *name);
        }
    }

    #[test]
    fn names_read_as_the_outputs_show_them() {
        assert_eq!(device(DeviceFile::Ctl), "nvidiactl");
        assert_eq!(device(DeviceFile::Gpu(3)), "nvidia3");
        assert_eq!(device(DeviceFile::Uvm), "nvidia-uvm");
        assert_eq!(call(Call::Rm(escape::ALLOC)), "RM_ALLOC");
        assert_eq!(call(Call::Rm(escape::SYS_PARAMS)), "SYS_PARAMS");
        assert_eq!(call(Call::Rm(0x99)), "RM_0x99");
        assert_eq!(call(Call::Uvm(uvm::FREE)), "UVM_FREE");
        assert_eq!(call(Call::Uvm(0x99)), "UVM_0x99");
        assert_eq!(class(0x40), Some("NV01_MEMORY_LOCAL_USER"));
        assert_eq!(class(0x1234), None);
        assert_eq!(
            control(0x3d0c),
            Some("NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD")
        );
        assert_eq!(object_kind(ObjectKind::ExtendedMemory), "extended_memory");
        assert_eq!(mem_kind(MemKind::Egm), "egm");
        assert_eq!(
            teardown_reason(TeardownReason::SubdeviceFreed),
            "subdevice_freed"
        );
        assert_eq!(open_how(OpenHow::Dup { src_fd: 3 }), "dup");
        assert_eq!(ref_how(RefHow::Import), "import");
        assert_eq!(
            outcome(IoctlOutcome::Undecoded(UndecodedReason::Fault)),
            "undecoded"
        );
        assert_eq!(undecoded_reason(UndecodedReason::TableFull), "table_full");
        assert_eq!(undecoded_index(99), "unknown");
        assert_eq!(gpu(Some(1)), "gpu1");
        assert_eq!(gpu(None), "gpu?");
    }
}
