//! `gres.conf` and `plugstack.conf` lines for this node (`keling slurm gres`,
//! `keling slurm plugstack`).
//!
//! One `gpu` per GPU the agent schedules and, on the same device file, a `shard`
//! count equal to its memory in whole GiB: `--gres=shard:20` then asks for 20 GiB
//! of one GPU (Slurm gives a job's shards from one GPU), and the plugin hands
//! Keling that budget to enforce.
use std::path::Path;

use keling_sched::GpuInfo;

/// One shard: 1 GiB of a GPU's memory.
pub const SHARD_BYTES: u64 = 1 << 30;
/// The plugin's file name, as `cargo xtask build` leaves it beside `keling`.
pub const PLUGIN_FILE: &str = "libkeling_spank.so";

/// Checks a Slurm node name: 1 to 64 letters, digits, `-`, `_` or `.` (what
/// can stand in a `gres.conf` line unquoted).
pub fn parse_node_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?}: a node name is 1 to 64 letters, digits, `-`, `_` or `.`"
        ))
    }
}

/// The shards of a GPU of `capacity_bytes`: its whole GiB.
pub fn shards(capacity_bytes: u64) -> u64 {
    capacity_bytes / SHARD_BYTES
}

/// The `gres.conf` lines of node `node` for `gpus`, whose device files are
/// `DEVICE_DIR/nvidiaN` (`/dev` on a GPU host). A GPU of less than 1 GiB gets
/// no shard line (Slurm refuses a count of 0).
pub fn gres_lines(node: &str, gpus: &[GpuInfo], device_dir: &Path) -> String {
    let mut gpus = gpus.to_vec();
    gpus.sort_by_key(|g| g.index);
    let mut out = String::new();
    for g in &gpus {
        let file = device_dir.join(format!("nvidia{}", g.index));
        out.push_str(&format!(
            "NodeName={node} Name=gpu File={}\n",
            file.display()
        ));
    }
    for g in &gpus {
        let file = device_dir.join(format!("nvidia{}", g.index));
        let n = shards(g.capacity_bytes);
        if n > 0 {
            out.push_str(&format!(
                "NodeName={node} Name=shard Count={n} File={}\n",
                file.display()
            ));
        }
    }
    out
}

/// The `slurm.conf` `Gres=` value that matches [`gres_lines`].
pub fn node_gres(gpus: &[GpuInfo]) -> String {
    let shards: u64 = gpus.iter().map(|g| shards(g.capacity_bytes)).sum();
    format!("gpu:{},shard:{shards}", gpus.len())
}

/// The `plugstack.conf` line that loads the plugin at `plugin` with `args`.
pub fn plugstack_line(plugin: &Path, args: &[String]) -> String {
    let mut line = format!("required {}", plugin.display());
    for a in args {
        line.push(' ');
        line.push_str(a);
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_and_its_memory_in_gib_per_device() {
        let gpus = [
            GpuInfo {
                index: 1,
                capacity_bytes: 40 << 30,
            },
            GpuInfo {
                index: 0,
                capacity_bytes: (80 << 30) + 5,
            },
            GpuInfo {
                index: 2,
                capacity_bytes: 512 << 20,
            },
        ];
        assert_eq!(
            gres_lines("n1", &gpus, Path::new("/dev")),
            "NodeName=n1 Name=gpu File=/dev/nvidia0\n\
             NodeName=n1 Name=gpu File=/dev/nvidia1\n\
             NodeName=n1 Name=gpu File=/dev/nvidia2\n\
             NodeName=n1 Name=shard Count=80 File=/dev/nvidia0\n\
             NodeName=n1 Name=shard Count=40 File=/dev/nvidia1\n"
        );
        assert_eq!(node_gres(&gpus), "gpu:3,shard:120");
    }

    #[test]
    fn node_names_that_cannot_stand_in_a_line_are_refused() {
        assert!(parse_node_name("gpu-node01.a_b").is_ok());
        for bad in ["", "n1 Name=gpu", "n1\nNodeName=x", "a/b", &"x".repeat(65)] {
            assert!(parse_node_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_plugstack_line_names_the_plugin_and_its_arguments() {
        assert_eq!(
            plugstack_line(
                Path::new("/opt/keling/libkeling_spank.so"),
                &["refuse".into()]
            ),
            "required /opt/keling/libkeling_spank.so refuse\n"
        );
    }
}
