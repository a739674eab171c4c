//! The kernel's own view of a process's eBPF maps: how many entries each of the
//! hash-like maps it holds open has, by name. One place for `cargo xtask soak`
//! (growth per hour) and the root tests (`tests/tests/operator.rs`); it reads
//! `/proc/<pid>/fd`, `/proc/<pid>/fdinfo` and walks each map's keys with the bpf
//! syscall, so it needs root (CAP_BPF / CAP_SYS_ADMIN) to see anything.
use std::collections::{BTreeMap, BTreeSet};

/// The bpf syscall.
fn bpf(cmd: libc::c_int, attr: &mut [u8; 128]) -> libc::c_long {
    // SAFETY: `attr` is a zeroed bpf_attr-sized buffer whose pointers (set by the
    // callers) outlive the call.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) }
}

const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;
const BPF_MAP_GET_FD_BY_ID: libc::c_int = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;

/// The entries of each hash-like map `pid` holds open, by name (maps of the same
/// name are summed; each map id is counted once however many fds point at it).
/// Arrays, per-CPU arrays and ring buffers have fixed sizes and are left out.
/// A process that is gone, or fds that cannot be read, give fewer (or no) maps.
pub fn map_entries(pid: u32) -> BTreeMap<String, u64> {
    // BPF_MAP_TYPE_HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH, LPM_TRIE, HASH_OF_MAPS.
    const HASHES: [u32; 6] = [1, 5, 9, 10, 11, 13];
    let mut ids = BTreeSet::new();
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if link.to_string_lossy() != "anon_inode:bpf-map" {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        let (Some(ty), Some(id), Some(key_size)) =
            (field("map_type:"), field("map_id:"), field("key_size:"))
        else {
            continue;
        };
        if HASHES.contains(&ty) && ids.insert(id) {
            let (name, n) = count_map(id, key_size as usize);
            *out.entry(name).or_default() += n;
        }
    }
    out
}

/// The name and number of keys of map `id`.
fn count_map(id: u32, key_size: usize) -> (String, u64) {
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&id.to_ne_bytes());
    let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut attr);
    if fd < 0 {
        return (format!("map {id} (cannot open)"), 0);
    }
    let fd = fd as i32;
    let name = map_name(fd).unwrap_or_else(|| format!("map {id}"));
    let mut key = vec![0u8; key_size.max(1)];
    let mut next = vec![0u8; key_size.max(1)];
    let mut n = 0u64;
    let mut first = true;
    // Bounded: a map that keeps changing while walked cannot loop forever.
    while n < 10_000_000 {
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
        let key_ptr = if first { 0 } else { key.as_ptr() as u64 };
        attr[8..16].copy_from_slice(&key_ptr.to_ne_bytes());
        attr[16..24].copy_from_slice(&(next.as_mut_ptr() as u64).to_ne_bytes());
        if bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) < 0 {
            break;
        }
        first = false;
        n += 1;
        std::mem::swap(&mut key, &mut next);
    }
    // SAFETY: closing the fd the kernel just gave us.
    unsafe { libc::close(fd) };
    (name, n)
}

/// BPF_OBJ_GET_INFO_BY_FD's name of a map.
fn map_name(fd: i32) -> Option<String> {
    let mut info = [0u8; 96];
    let mut attr = [0u8; 128];
    attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) < 0 {
        return None;
    }
    let name = &info[24..40];
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..len]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash map of this process's own with `keys` entries, named `name`; its fd.
    fn hash_map(name: &str, keys: u32) -> Option<i32> {
        const BPF_MAP_CREATE: libc::c_int = 0;
        const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&1u32.to_ne_bytes()); // BPF_MAP_TYPE_HASH
        attr[4..8].copy_from_slice(&4u32.to_ne_bytes()); // key_size
        attr[8..12].copy_from_slice(&8u32.to_ne_bytes()); // value_size
        attr[12..16].copy_from_slice(&64u32.to_ne_bytes()); // max_entries
        attr[28..28 + name.len()].copy_from_slice(name.as_bytes());
        let fd = bpf(BPF_MAP_CREATE, &mut attr);
        if fd < 0 {
            return None;
        }
        for k in 0..keys {
            let value = u64::from(k) * 3;
            let mut attr = [0u8; 128];
            attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
            attr[8..16].copy_from_slice(&(&k as *const u32 as u64).to_ne_bytes());
            attr[16..24].copy_from_slice(&(&value as *const u64 as u64).to_ne_bytes());
            assert_eq!(bpf(BPF_MAP_UPDATE_ELEM, &mut attr), 0, "update key {k}");
        }
        Some(fd as i32)
    }

    #[test]
    fn a_process_that_is_gone_has_no_maps() {
        assert!(map_entries(u32::MAX).is_empty());
    }

    /// The count is the kernel's: the entries put in, under the map's name, the map
    /// counted once though two fds hold it. Needs CAP_BPF (root); without it the
    /// map cannot be made and the test says so and checks nothing more.
    #[test]
    fn counts_the_entries_of_a_hash_map_once_by_name() {
        let Some(fd) = hash_map("kbm_test", 5) else {
            eprintln!("skipped: cannot create a bpf map (not root?)");
            return;
        };
        // SAFETY: duplicating an fd this test owns.
        let dup = unsafe { libc::dup(fd) };
        assert!(dup >= 0);
        let maps = map_entries(std::process::id());
        // SAFETY: closing the fds this test opened.
        unsafe {
            libc::close(dup);
            libc::close(fd);
        }
        assert_eq!(maps.get("kbm_test"), Some(&5), "{maps:?}");
        assert!(!map_entries(std::process::id()).contains_key("kbm_test"));
    }
}
