//! The text timeline: one line per event as it happens, then per-thread and
//! per-process GPU tables.
use std::io::{self, Write};

use keling_common::EventKind;

use super::{Sink, Summary};
use crate::{
    event::{
        decode::{Event, ExitStatus, comm, cstr},
        model::ProcessStats,
    },
    gpu::{
        names,
        nvml::NvmlDiff,
        stats::{GpuDeviceStats, GpuProcessStats},
    },
};

pub struct TextSink {
    out: Box<dyn Write + Send>,
    /// Timestamp the timeline counts from.
    start_ns: u64,
    /// Show context switches (jsonl always has them).
    switches: bool,
}

/// sched_switch's one-letter state, as `ps` and the tracepoint print it.
pub fn state_letter(prev_state: u64) -> &'static str {
    use keling_common::task_state::*;
    const LETTERS: &[(u64, &str)] = &[
        (INTERRUPTIBLE, "S"),
        (UNINTERRUPTIBLE, "D"),
        (STOPPED, "T"),
        (TRACED, "t"),
        (EXIT_DEAD, "X"),
        (EXIT_ZOMBIE, "Z"),
        (PARKED, "P"),
        (IDLE, "I"),
    ];
    if prev_state & PREEMPTED != 0 {
        return "R+";
    }
    LETTERS
        .iter()
        .find(|(bit, _)| prev_state & bit != 0)
        .map_or("R", |(_, l)| l)
}

/// One line of text timeline for a GPU event.
fn gpu_text(kind: u32, e: &keling_common::GpuEvent) -> String {
    let gpu = names::gpu(e.gpu).map_or("gpu?".to_string(), |g| format!("gpu{g}"));
    match EventKind::from_u32(kind) {
        Some(EventKind::GpuAlloc) => format!(
            "gpu alloc {} bytes {} on {gpu}: handle {:#x} class {:#x} ({})",
            e.bytes,
            names::kind(e.kind),
            e.handle,
            e.class,
            names::call(0, e.escape)
        ),
        Some(EventKind::GpuFree) => format!(
            "gpu free {} bytes {} on {gpu}: handle {:#x} (allocated by {})",
            e.bytes,
            names::kind(e.kind),
            e.handle,
            e.owner_pid
        ),
        Some(EventKind::GpuObject) => format!(
            "gpu object {} {:#x} class {:#x} under {:#x} on {gpu}",
            names::kind(e.kind),
            e.handle,
            e.class,
            e.parent
        ),
        Some(EventKind::GpuTeardown) => format!(
            "gpu teardown of client {:#x} ({}): {} bytes video, {} host, {} objects of pid {} on {gpu}",
            e.client,
            names::teardown_reason(e.reason),
            e.bytes,
            e.host_bytes,
            e.control_cmd,
            e.owner_pid
        ),
        _ => {
            let device = if e.escape >= 0x3000_0000 || e.cmd == e.escape {
                keling_common::device_file::UVM
            } else {
                0
            };
            let mut t = format!(
                "gpu ioctl {} status {:#x} ret {}",
                names::call(device, e.escape),
                e.status,
                e.ret
            );
            if e.reason != 0 {
                t.push_str(&format!(
                    " (undecoded: {})",
                    names::undecoded_reason(e.reason - 1)
                ));
            }
            t
        }
    }
}

impl TextSink {
    pub fn new(out: Box<dyn Write + Send>, start_ns: u64, switches: bool) -> Self {
        Self {
            out,
            start_ns,
            switches,
        }
    }
}

impl Sink for TextSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        let h = event.header();
        let text = match event {
            Event::Fork(e) if e.child_pid == h.pid => format!("thread {}", e.child_tid),
            Event::Fork(e) => format!("fork -> pid {}", e.child_pid),
            Event::Exec(e) => format!("exec {} ({})", cstr(&e.filename), comm(&e.comm)),
            Event::Exit(e) => {
                let status = ExitStatus::from_wait_status(e.exit_status);
                let what = if e.group_dead != 0 {
                    "exit"
                } else {
                    "thread exit"
                };
                match status {
                    ExitStatus::Exited(c) => format!("{what} code {c}"),
                    ExitStatus::Signaled {
                        signal,
                        core_dumped,
                    } => format!(
                        "{what} killed by signal {signal}{}",
                        if core_dumped { " (core dumped)" } else { "" }
                    ),
                }
            }
            Event::Switch(e) => {
                if !self.switches {
                    return Ok(());
                }
                format!(
                    "switch {} [{}] -> {}",
                    e.prev_tid,
                    state_letter(e.prev_state),
                    e.next_tid
                )
            }
            Event::GpuFile(e) => {
                let what = match EventKind::from_u32(h.kind) {
                    Some(EventKind::GpuOpen) => "open",
                    Some(EventKind::GpuDup) => "dup",
                    _ if e.released != 0 => "close (file released)",
                    _ => "close",
                };
                format!("gpu {what} fd {} {}", e.fd, names::device(e.device))
            }
            Event::Gpu(e) => gpu_text(h.kind, e),
        };
        let secs = h.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let comm = match event {
            Event::Fork(e) => comm(&e.comm),
            Event::Exec(e) => comm(&e.comm),
            Event::Exit(e) => comm(&e.comm),
            Event::Switch(_) | Event::GpuFile(_) | Event::Gpu(_) => String::new(),
        };
        writeln!(
            self.out,
            "{secs:>11.6} cpu{:<2} {:>7}/{:<7} {comm:<16} {text}",
            h.cpu, h.pid, h.tid
        )
    }

    fn drops(&mut self, _ts_ns: u64, per_cpu: &[u64]) -> io::Result<()> {
        let total: u64 = per_cpu.iter().sum();
        if total == 0 {
            return Ok(());
        }
        writeln!(
            self.out,
            "keling: {total} events lost in the kernel (ring buffer full); per CPU {per_cpu:?}"
        )
    }

    /// Snapshots are for machine readers: the text timeline leaves them out.
    fn gpu_snapshot(
        &mut self,
        _ts_ns: u64,
        _seq: u64,
        _processes: &std::collections::BTreeMap<u32, GpuProcessStats>,
        _gpus: &[GpuDeviceStats],
    ) -> io::Result<()> {
        Ok(())
    }

    fn nvml_check(&mut self, _ts_ns: u64, diffs: &[NvmlDiff]) -> io::Result<()> {
        for d in diffs {
            writeln!(
                self.out,
                "nvml check: pid {} gpu{}: NVML {} bytes, Keling {} bytes, difference {}",
                d.pid,
                d.gpu,
                d.nvml_bytes.map_or("n/a".into(), |b| b.to_string()),
                d.keling_bytes,
                d.diff_bytes.map_or("n/a".into(), |b| b.to_string())
            )?;
        }
        Ok(())
    }

    fn summary(&mut self, s: &Summary) -> io::Result<()> {
        let out = &mut self.out;
        writeln!(out)?;
        writeln!(
            out,
            "{:>7} {:>7} {:<16} {:>12} {:>9} {:>9} {:>9} {:>6}",
            "PID", "TID", "COMM", "ON-CPU ms", "SWITCHES", "VOLUNT", "INVOL", "EXIT"
        )?;
        for p in s.processes {
            for t in &p.threads {
                let exit = match (t.tid == p.pid, p.exit_code, t.exit_code) {
                    (true, Some(c), _) | (false, _, Some(c)) => c.to_string(),
                    _ => "-".into(),
                };
                writeln!(
                    out,
                    "{:>7} {:>7} {:<16} {:>12.3} {:>9} {:>9} {:>9} {:>6}",
                    p.pid,
                    t.tid,
                    if t.comm.is_empty() { &p.comm } else { &t.comm },
                    t.on_cpu_ns as f64 / 1e6,
                    t.switches,
                    t.voluntary_switches,
                    t.involuntary_switches,
                    exit
                )?;
            }
        }
        let gpu_procs: Vec<&ProcessStats> = s
            .processes
            .iter()
            .filter(|p| p.gpu.gpu_allocs > 0 || p.gpu.undecoded > 0)
            .collect();
        if !gpu_procs.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{:>7} {:<16} {:>14} {:>14} {:>12} {:>8} {:>8} {:>9}",
                "PID", "COMM", "GPU MEM", "GPU PEAK", "HOST PINNED", "ALLOCS", "FREES", "UNDECODED"
            )?;
            for p in gpu_procs {
                let g = &p.gpu;
                writeln!(
                    out,
                    "{:>7} {:<16} {:>14} {:>14} {:>12} {:>8} {:>8} {:>9}{}",
                    p.pid,
                    p.comm,
                    g.gpu_mem_bytes,
                    g.gpu_mem_peak_bytes,
                    g.gpu_host_bytes,
                    g.gpu_allocs,
                    g.gpu_frees,
                    g.undecoded,
                    if g.gpu_mem_held_after_exit {
                        "  (exited; still held through an open file another process keeps)"
                    } else {
                        ""
                    }
                )?;
            }
        }
        writeln!(
            out,
            "{} processes, {} events in {:.3} s, {} lost in the kernel, {} undecodable",
            s.processes.len(),
            s.events,
            s.duration_ns as f64 / 1e9,
            s.drops,
            s.decode_errors
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_letters() {
        assert_eq!(state_letter(0), "R");
        assert_eq!(state_letter(keling_common::task_state::PREEMPTED), "R+");
        assert_eq!(state_letter(1), "S");
        assert_eq!(state_letter(0x20), "Z");
    }
}
