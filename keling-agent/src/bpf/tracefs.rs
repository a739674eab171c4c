//! tracefs: where it is (mounting it when absent) and the field offsets of the
//! tracepoints the probes read, from their `format` files.
use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

/// The tracefs mount point, mounting it at /sys/kernel/tracing when it is absent
/// (fresh machines here boot without it; aya needs it to resolve tracepoint ids).
pub fn ensure_mounted() -> anyhow::Result<PathBuf> {
    if let Some(dir) = crate::os::mounts::find("tracefs")? {
        return Ok(dir);
    }
    let target = Path::new("/sys/kernel/tracing");
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (src, dst, fstype) = (c("tracefs"), c("/sys/kernel/tracing"), c("tracefs"));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "tracefs is not mounted and mounting it at {} failed: {err}. \
             Mount it by hand: mount -t tracefs tracefs {}",
            target.display(),
            target.display()
        );
    }
    log::info!("mounted tracefs at {}", target.display());
    Ok(target.to_path_buf())
}

/// Field offsets of one tracepoint, from its `format` file.
pub struct TracepointFormat {
    fields: Vec<(String, u32)>,
}

impl TracepointFormat {
    pub fn read(tracefs: &Path, category: &str, name: &str) -> anyhow::Result<Self> {
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: this kernel lacks the tracepoint {category}:{name}",
                path.display()
            )
        })?;
        Ok(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|line| {
                let line = line.trim();
                let decl = line.strip_prefix("field:")?.split(';').next()?;
                let name = decl.split_whitespace().last()?;
                let name = name.split('[').next()?.to_owned();
                let offset = line
                    .split(';')
                    .find_map(|p| p.trim().strip_prefix("offset:"))?
                    .parse()
                    .ok()?;
                Some((name, offset))
            })
            .collect();
        Self { fields }
    }

    pub fn offset(&self, field: &str) -> Option<u32> {
        self.fields
            .iter()
            .find(|(n, _)| n == field)
            .map(|&(_, o)| o)
    }

    pub fn require(&self, tp: &str, field: &str) -> anyhow::Result<u32> {
        self.offset(field)
            .with_context(|| format!("tracepoint {tp} has no field {field} on this kernel"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracepoint_format() {
        let text = "name: sched_process_exit\nID: 369\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
            \tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n\nprint fmt: \"x\"\n";
        let f = TracepointFormat::parse(text);
        assert_eq!(f.offset("comm"), Some(8));
        assert_eq!(f.offset("pid"), Some(24));
        assert_eq!(f.offset("group_dead"), Some(32));
        assert_eq!(f.offset("filename"), Some(8));
        assert_eq!(f.offset("nope"), None);
    }
}
