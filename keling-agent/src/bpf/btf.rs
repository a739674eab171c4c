//! Struct member offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The probes read a few `task_struct` fields whose offsets change with every kernel
//! build; the agent looks them up here and hands them to the programs at load time.
//! Only what that needs is parsed: the type section, struct/union members, and the
//! sizes of the other kinds so they can be skipped. aya's own BTF parser keeps these
//! lookups private.
use std::collections::HashMap;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad magic or header)")]
    BadHeader,
    #[error("BTF data is truncated")]
    Truncated,
    #[error("unknown BTF kind {0}")]
    UnknownKind(u32),
    #[error("struct {0} not found in kernel BTF")]
    NoStruct(String),
    #[error("struct {0} has no member {1}")]
    NoMember(String, String),
    #[error("{0}.{1} is a bitfield")]
    Bitfield(String, String),
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

struct Member {
    name_off: u32,
    type_id: u32,
    /// Bit offset.
    offset_bits: u32,
    bitfield: bool,
}

struct Composite {
    members: Vec<Member>,
}

/// The struct and union types of one BTF blob.
pub struct Btf {
    strings: Vec<u8>,
    /// Type id -> composite, for every struct and union.
    composites: HashMap<u32, Composite>,
    /// Struct name -> type id (first definition wins; vmlinux has one).
    structs: HashMap<String, u32>,
    /// Type id -> the id it refers to, for typedef/const/volatile (to see through
    /// `typeof(...)` wrappers around anonymous members).
    aliases: HashMap<u32, u32>,
}

fn u32_at(data: &[u8], off: usize) -> Result<u32, BtfError> {
    let bytes = data.get(off..off + 4).ok_or(BtfError::Truncated)?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

impl Btf {
    pub fn from_sys_fs() -> anyhow::Result<Self> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).map_err(|e| {
            anyhow::anyhow!("{path}: {e}: this kernel has no BTF (CONFIG_DEBUG_INFO_BTF); Keling needs it to find task_struct offsets")
        })?;
        Ok(Self::parse(&data)?)
    }

    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != 0xeb9f {
            return Err(BtfError::BadHeader);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Truncated)?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Truncated)?
            .to_vec();
        let mut btf = Self {
            strings,
            composites: HashMap::new(),
            structs: HashMap::new(),
            aliases: HashMap::new(),
        };
        let mut pos = 0;
        let mut id = 1u32;
        while pos < types.len() {
            let name_off = u32_at(types, pos)?;
            let info = u32_at(types, pos + 4)?;
            let size_or_type = u32_at(types, pos + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kflag = info >> 31 == 1;
            pos += 12;
            let extra = match kind {
                1 | 14 | 17 => 4,          // int, var, decl_tag
                2 | 7 | 12 | 16 | 18 => 0, // ptr, fwd, func, float, type_tag
                8..=11 => {
                    // typedef, volatile, const, restrict
                    btf.aliases.insert(id, size_or_type);
                    0
                }
                3 => 12,              // array
                6 | 13 => vlen * 8,   // enum, func_proto
                15 | 19 => vlen * 12, // datasec, enum64
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = pos + i * 12;
                        let raw_off = u32_at(types, m + 8)?;
                        let (offset_bits, bitfield) = if kflag {
                            (raw_off & 0xff_ffff, raw_off >> 24 != 0)
                        } else {
                            (raw_off, false)
                        };
                        members.push(Member {
                            name_off: u32_at(types, m)?,
                            type_id: u32_at(types, m + 4)?,
                            offset_bits,
                            bitfield,
                        });
                    }
                    if kind == KIND_STRUCT && name_off != 0 {
                        let name = btf.name(name_off).to_owned();
                        btf.structs.entry(name).or_insert(id);
                    }
                    btf.composites.insert(id, Composite { members });
                    vlen * 12
                }
                other => return Err(BtfError::UnknownKind(other)),
            };
            pos += extra;
            id += 1;
        }
        Ok(btf)
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    fn resolve(&self, mut id: u32) -> u32 {
        while let Some(&next) = self.aliases.get(&id) {
            id = next;
        }
        id
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// struct/union members as C does.
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self
            .structs
            .get(name)
            .ok_or_else(|| BtfError::NoStruct(name.into()))?;
        let bits = self
            .find_member(id, member, 0)
            .ok_or_else(|| BtfError::NoMember(name.into(), member.into()))?;
        match bits {
            (_, true) => Err(BtfError::Bitfield(name.into(), member.into())),
            (bits, false) => Ok(bits / 8),
        }
    }

    fn find_member(&self, id: u32, member: &str, base_bits: u32) -> Option<(u32, bool)> {
        let composite = self.composites.get(&self.resolve(id))?;
        for m in &composite.members {
            if m.name_off == 0 {
                if let Some(found) = self.find_member(m.type_id, member, base_bits + m.offset_bits)
                {
                    return Some(found);
                }
            } else if self.name(m.name_off) == member {
                return Some((base_bits + m.offset_bits, m.bitfield));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct outer { int a; union { int b; }; int c:3; }`.
    fn sample() -> Vec<u8> {
        let strings = b"\0outer\0a\0b\0c\0int\0".to_vec();
        let (s_outer, s_a, s_b, s_c, s_int) = (1u32, 7u32, 9u32, 11u32, 13u32);
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int (size 4, 32 bits)
        push(&[s_int, 1 << 24, 4, 32]);
        // 2: anonymous union { int b; }
        push(&[0, (KIND_UNION << 24) | 1, 4, s_b, 1, 0]);
        // 3: struct outer (kflag set: bitfield encoding)
        push(&[
            s_outer,
            (1 << 31) | (KIND_STRUCT << 24) | 3,
            12,
            s_a,
            1,
            0,
            0,
            2,
            32,
            s_c,
            1,
            (3 << 24) | 64,
        ]);
        let mut data = Vec::new();
        for w in [
            0xeb9f_u32 | (1 << 16),
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(&strings);
        data
    }

    #[test]
    fn finds_direct_and_anonymous_members() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Ok(0));
        assert_eq!(btf.member_offset("outer", "b"), Ok(4));
        assert_eq!(
            btf.member_offset("outer", "c"),
            Err(BtfError::Bitfield("outer".into(), "c".into()))
        );
        assert_eq!(
            btf.member_offset("outer", "zz"),
            Err(BtfError::NoMember("outer".into(), "zz".into()))
        );
        assert!(matches!(
            btf.member_offset("inner", "a"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert_eq!(Btf::parse(b"hello").err(), Some(BtfError::BadHeader));
        let mut data = sample();
        data.truncate(40);
        assert!(Btf::parse(&data).is_err());
    }

    #[test]
    fn reads_this_kernels_task_struct() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            // Reported like the integration tests' skips, so `cargo xtask test` counts it.
            let reason =
                "reads_this_kernels_task_struct: this kernel has no /sys/kernel/btf/vmlinux";
            eprintln!("skipping: {reason}");
            if let Some(log) = std::env::var_os("KELING_SKIP_LOG") {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap();
                writeln!(f, "{reason}").unwrap();
            }
            return;
        };
        let btf = Btf::parse(&data).unwrap();
        let pid = btf.member_offset("task_struct", "pid").unwrap();
        let tgid = btf.member_offset("task_struct", "tgid").unwrap();
        // pid_t pid; pid_t tgid; are adjacent in every kernel since 2.6.
        assert_eq!(tgid, pid + 4);
        btf.member_offset("task_struct", "exit_code").unwrap();
    }
}
