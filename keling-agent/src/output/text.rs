//! The text timeline: one line per event as it happens, then per-thread and
//! per-process GPU tables, the calls made on NVIDIA files (by escape or UVM command,
//! and by RM control, exact from the kernel's counters), and the findings (see
//! [`super::findings`]): what usually explains a misbehaving process.
use std::io::{self, Write};

use super::{Sink, Summary, decision::Decision, findings::Findings};
use crate::{
    event::decode::{Event, ExitStatus, IoctlOutcome, OpenHow, RefHow, comm, cstr},
    gpu::{
        names,
        nvml::NvmlDiff,
        stats::{GpuDeviceStats, GpuProcessStats},
    },
    process_model::ProcessStats,
};

pub struct TextSink {
    out: Box<dyn Write + Send>,
    /// Timestamp the timeline counts from.
    start_ns: u64,
    /// Show context switches (jsonl always has them).
    switches: bool,
    findings: Findings,
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

/// The line of the text timeline for a GPU event (None for other events).
pub fn gpu_text(event: &Event) -> Option<String> {
    Some(match event {
        Event::GpuOpen(e) => {
            let device = names::device(e.device);
            match e.how {
                OpenHow::Open => format!("gpu open fd {} {device}", e.fd),
                OpenHow::Dup { src_fd } => format!("gpu dup fd {} of fd {src_fd} {device}", e.fd),
                OpenHow::Received => format!("gpu received fd {} {device}", e.fd),
                OpenHow::FirstUse => format!("gpu first use of fd {} {device}", e.fd),
            }
        }
        Event::GpuClose(e) => format!(
            "gpu close fd {} {}{}",
            e.fd,
            names::device(e.device),
            if e.released { " (file released)" } else { "" }
        ),
        Event::GpuAlloc(e) => format!(
            "gpu alloc {} bytes {} on {}: handle {:#x} class {:#x} ({})",
            e.bytes,
            names::object_kind(e.kind()),
            names::gpu(e.gpu),
            e.handle,
            e.class,
            names::escape(e.escape)
        ),
        Event::GpuFree(e) => {
            let whose = match e.freed_pid {
                Some(pid) => format!("freed from pid {pid}"),
                None if e.mem_kind.is_some() => "other references remain".to_owned(),
                None => "no memory".to_owned(),
            };
            format!(
                "gpu free {} bytes {} on {}: handle {:#x} class {:#x} ({whose}) ({})",
                e.bytes,
                names::object_kind(e.kind),
                names::gpu(e.gpu),
                e.handle,
                e.class,
                names::escape(e.escape)
            )
        }
        Event::GpuObject(e) => format!(
            "gpu object {} {:#x} class {:#x} under {:#x} on {}",
            names::object_kind(e.kind),
            e.handle,
            e.class,
            e.parent,
            names::gpu(e.gpu)
        ),
        Event::GpuTeardown(e) => format!(
            "gpu teardown of client {:#x} ({}): {} bytes video, {} host, {} egm, {} objects of pid {} on {} (device {:#x}{})",
            e.client,
            names::teardown_reason(e.reason),
            e.bytes,
            e.host_bytes,
            e.egm_bytes,
            e.objects,
            e.owner_pid,
            names::gpu(e.gpu),
            e.device,
            e.sub
                .map_or(String::new(), |s| format!(", subdevice {s:#x}"))
        ),
        Event::GpuIoctl(e) => {
            let mut t = format!(
                "gpu ioctl {} fd {} {} status {:#x} ret {}",
                names::call(e.call),
                e.fd,
                names::device(e.device),
                e.status,
                e.ret
            );
            if let Some(cmd) = e.control_cmd {
                t.push_str(&format!(" control {}", names::control_label(cmd)));
            }
            if e.class != 0 {
                t.push_str(&format!(" class {:#x}", e.class));
                if let Some(name) = names::class(e.class) {
                    t.push_str(&format!(" {name}"));
                }
            }
            if let Some(g) = e.gpu {
                t.push_str(&format!(" on gpu{g}"));
            }
            if e.requested_bytes != 0 {
                t.push_str(&format!(" asked for {} bytes", e.requested_bytes));
            }
            if e.via_xfer {
                t.push_str(" via XFER_CMD");
            }
            match e.outcome {
                IoctlOutcome::Decoded => {}
                IoctlOutcome::NoMemoryEscape => t.push_str(" (no memory)"),
                IoctlOutcome::Undecoded(r) => {
                    t.push_str(&format!(" (undecoded: {})", names::undecoded_reason(r)))
                }
            }
            t
        }
        Event::GpuRef(e) => {
            let from = match e.how {
                RefHow::Dup {
                    src_client,
                    src_handle,
                } => format!("dup of handle {src_handle:#x} of client {src_client:#x}"),
                RefHow::Import => "import".to_owned(),
            };
            format!(
                "gpu ref handle {:#x} under {:#x} to {} bytes {} on {} ({from})",
                e.handle,
                e.parent,
                e.bytes,
                e.mem_kind.map_or("(no memory)", names::mem_kind),
                names::gpu(e.gpu)
            )
        }
        Event::GpuExport(e) => format!(
            "gpu export handle {:#x} of client {:#x} ({} bytes on {}) to file {:#x} position {}",
            e.handle,
            e.client,
            e.bytes,
            names::gpu(e.gpu),
            e.file_id,
            e.position
        ),
        Event::GpuCharge(e) => format!(
            "gpu charge {} bytes {} on {} moved from pid {} to pid {} (now handle {:#x} of client {:#x})",
            e.bytes,
            names::mem_kind(e.mem_kind),
            names::gpu(e.gpu),
            e.from_pid,
            e.to_pid,
            e.handle,
            e.client
        ),
        Event::Fork(_) | Event::Exec(_) | Event::Exit(_) | Event::Switch(_) | Event::Active(_) => {
            return None;
        }
    })
}

impl TextSink {
    pub fn new(out: Box<dyn Write + Send>, start_ns: u64, switches: bool) -> Self {
        Self {
            out,
            start_ns,
            switches,
            findings: Findings::new(start_ns),
        }
    }
}

impl Sink for TextSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        self.findings.event(event);
        let h = event.header();
        let text = if let Some(t) = gpu_text(event) {
            t
        } else {
            match event {
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
                Event::Switch(e) if self.switches => format!(
                    "switch {} [{}] -> {}",
                    e.prev_tid,
                    state_letter(e.prev_state),
                    e.next_tid
                ),
                // Switches left out; GPU events have their line above.
                _ => return Ok(()),
            }
        };
        let secs = h.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let comm = match event {
            Event::Fork(e) => comm(&e.comm),
            Event::Exec(e) => comm(&e.comm),
            Event::Exit(e) => comm(&e.comm),
            _ => String::new(),
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
                "nvml check: pid {} gpu{}: NVML {} bytes, Keling (driver figure) {} bytes, difference {}; charged to the process as a caller {} bytes",
                d.pid,
                d.gpu,
                d.nvml_bytes.map_or("n/a".into(), |b| b.to_string()),
                d.keling_driver_bytes,
                d.diff_bytes.map_or("n/a".into(), |b| b.to_string()),
                d.keling_caller_bytes
            )?;
        }
        Ok(())
    }

    fn decision(&mut self, d: &Decision) -> io::Result<()> {
        self.findings.decision(d);
        let secs = d.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        writeln!(
            self.out,
            "{secs:>11.6} {:<5} {:>7}/{:<7} {:<16} {}",
            "",
            d.pid,
            "",
            "",
            d.text()
        )
    }

    fn summary(&mut self, s: &Summary) -> io::Result<()> {
        let findings = self.findings.report(s.ts_ns);
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
            .filter(|p| p.gpu.gpu_allocs > 0 || p.gpu.undecoded > 0 || p.gpu.gpu_driver_bytes > 0)
            .collect();
        if !gpu_procs.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{:>7} {:<16} {:>14} {:>14} {:>12} {:>12} {:>14} {:>8} {:>8} {:>9}",
                "PID",
                "COMM",
                "GPU MEM",
                "GPU PEAK",
                "HOST PINNED",
                "EGM",
                "DRIVER",
                "ALLOCS",
                "FREES",
                "UNDECODED"
            )?;
            for p in gpu_procs {
                let g = &p.gpu;
                writeln!(
                    out,
                    "{:>7} {:<16} {:>14} {:>14} {:>12} {:>12} {:>14} {:>8} {:>8} {:>9}{}",
                    p.pid,
                    p.comm,
                    g.gpu_mem_bytes,
                    g.gpu_mem_peak_bytes,
                    g.gpu_host_bytes,
                    g.gpu_egm_bytes,
                    g.gpu_driver_bytes,
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
        calls_table(out, s)?;
        if !findings.is_empty() {
            writeln!(out)?;
            writeln!(out, "findings:")?;
            for f in &findings {
                writeln!(out, "  {f}")?;
            }
        }
        writeln!(
            out,
            "{} processes, {} events in {:.3} s, {} lost in the kernel, {} undecodable; \
             NVIDIA ioctls seen at: {}",
            s.processes.len(),
            s.events,
            s.duration_ns as f64 / 1e9,
            s.drops,
            s.decode_errors,
            s.ioctl_backend
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The calls on NVIDIA files by escape (or UVM command), then by RM control, each
/// with its count; nothing when there were none.
fn calls_table(out: &mut dyn Write, s: &Summary) -> io::Result<()> {
    let c = s.calls;
    let rows = |out: &mut dyn Write, title: &str, rows: Vec<(String, u64)>| -> io::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let width = rows
            .iter()
            .map(|(l, _)| l.len())
            .chain([title.len()])
            .max()
            .unwrap_or(0);
        writeln!(out)?;
        writeln!(out, "{title:<width$} {:>10}", "CALLS")?;
        for (label, n) in rows {
            writeln!(out, "{label:<width$} {n:>10}")?;
        }
        Ok(())
    };
    let calls = c.calls.iter().map(|(&k, &n)| (names::call(k), n)).collect();
    rows(out, "CALL", calls)?;
    let controls = c
        .controls
        .iter()
        .map(|(&cmd, &n)| (names::control_label(cmd), n))
        .collect();
    rows(out, "RM CONTROL", controls)?;
    if c.uncounted != 0 {
        writeln!(
            out,
            "{} calls not counted by number (the kernel's table of numbers was full)",
            c.uncounted
        )?;
    }
    Ok(())
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

    use crate::{
        event::decode::{Call, IoctlOutcome, MemKind, OpenHow, RefHow, UndecodedReason},
        gpu::stats::CallCounts,
        output::{capture::Capture, test_events as ev},
    };

    fn line(e: &Event) -> String {
        gpu_text(e).expect("a GPU event")
    }

    #[test]
    fn a_video_allocation_reads_as_before() {
        assert_eq!(
            line(&ev::alloc(MemKind::Video)),
            "gpu alloc 4194304 bytes video_memory on gpu0: handle 0xc1d00010 class 0x40 (RM_ALLOC)"
        );
    }

    #[test]
    fn one_line_per_gpu_event() {
        assert_eq!(line(&ev::open(OpenHow::Open)), "gpu open fd 5 nvidiactl");
        assert_eq!(
            line(&ev::open(OpenHow::Dup { src_fd: 3 })),
            "gpu dup fd 5 of fd 3 nvidiactl"
        );
        assert_eq!(
            line(&ev::open(OpenHow::Received)),
            "gpu received fd 5 nvidiactl"
        );
        assert_eq!(
            line(&ev::open(OpenHow::FirstUse)),
            "gpu first use of fd 5 nvidiactl"
        );
        assert_eq!(line(&ev::close()), "gpu close fd 5 nvidia1 (file released)");
        assert_eq!(
            line(&ev::alloc(MemKind::Egm)),
            "gpu alloc 4194304 bytes extended_memory on gpu0: handle 0xc1d00010 class 0x40 (RM_ALLOC)"
        );
        assert_eq!(
            line(&ev::free(Some(41))),
            "gpu free 4194304 bytes video_memory on gpu0: handle 0xc1d00010 class 0x40 (freed from pid 41) (RM_FREE)"
        );
        assert_eq!(
            line(&ev::free(None)),
            "gpu free 0 bytes video_memory on gpu0: handle 0xc1d00010 class 0x40 (other references remain) (RM_FREE)"
        );
        assert_eq!(
            line(&ev::free_object()),
            "gpu free 0 bytes device on gpu?: handle 0xc1d00002 class 0x80 (no memory) (RM_FREE)"
        );
        assert_eq!(
            line(&ev::object()),
            "gpu object device 0xc1d00002 class 0x80 under 0xc1d00001 on gpu1"
        );
        assert_eq!(
            line(&ev::teardown()),
            "gpu teardown of client 0xc1d00001 (subdevice_freed): 6291456 bytes video, 4096 host, 8192 egm, 3 objects of pid 41 on gpu0 (device 0xc1d00002, subdevice 0xc1d00003)"
        );
        assert_eq!(
            line(&ev::ioctl_no_memory()),
            "gpu ioctl RM_ALLOC fd 3 nvidiactl status 0x51 ret 0 class 0x40 NV01_MEMORY_LOCAL_USER on gpu0 asked for 1073741824 bytes via XFER_CMD"
        );
        assert_eq!(
            line(&ev::ioctl_control(IoctlOutcome::Undecoded(
                UndecodedReason::Fault
            ))),
            "gpu ioctl RM_CONTROL fd 3 nvidiactl status 0x0 ret 0 control 0x3d05 NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD (undecoded: fault)"
        );
        assert_eq!(
            line(&ev::ioctl_uvm()),
            "gpu ioctl UVM_INITIALIZE fd 7 nvidia-uvm status 0x0 ret 0"
        );
        assert_eq!(
            line(&ev::ioctl_no_memory_escape()),
            "gpu ioctl SYS_PARAMS fd 3 nvidiactl status 0x0 ret 0 (no memory)"
        );
        assert_eq!(
            line(&ev::reference(RefHow::Dup {
                src_client: 0xc1d0_0001,
                src_handle: 0xc1d0_0010
            })),
            "gpu ref handle 0xc1d00020 under 0xc1d00006 to 2097152 bytes video on gpu0 (dup of handle 0xc1d00010 of client 0xc1d00001)"
        );
        assert_eq!(
            line(&ev::reference(RefHow::Import)),
            "gpu ref handle 0xc1d00020 under 0xc1d00006 to 2097152 bytes video on gpu0 (import)"
        );
        assert_eq!(
            line(&ev::export()),
            "gpu export handle 0xc1d00010 of client 0xc1d00001 (2097152 bytes on gpu0) to file 0xabc position 2"
        );
        assert_eq!(
            line(&ev::charge()),
            "gpu charge 2097152 bytes video on gpu0 moved from pid 41 to pid 42 (now handle 0xc1d00020 of client 0xc1d00005)"
        );
    }

    #[test]
    fn timeline_line_and_gpu_table() {
        let (capture, out) = Capture::new();
        let mut sink = TextSink::new(Box::new(capture), 0, false);
        sink.event(&ev::alloc(MemKind::Video)).unwrap();
        let procs = vec![ProcessStats {
            pid: 42,
            comm: "cuda".into(),
            gpu: GpuProcessStats {
                gpu_mem_bytes: 100,
                gpu_egm_bytes: 300,
                gpu_driver_bytes: 400,
                gpu_allocs: 1,
                ..Default::default()
            },
            ..Default::default()
        }];
        sink.summary(&Summary {
            ts_ns: 1,
            duration_ns: 2,
            events: 1,
            drops: 0,
            decode_errors: 0,
            processes: &procs,
            gpus: &[],
            undecoded: &[],
            table_full_at: &[],
            calls: &CallCounts {
                calls: [(Call::Rm(0x2A), 3), (Call::Uvm(0x3000_0001), 1)].into(),
                controls: [(0x2080_0110, 2), (0x2080_ffff, 1)].into(),
                uncounted: 0,
            },
            ioctl_backend: "tracepoints",
        })
        .unwrap();
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let cells = |first: &str| -> Vec<String> {
            let row = text.lines().find(|l| l.starts_with(first)).expect(first);
            row.split_whitespace().map(str::to_owned).collect()
        };
        assert_eq!(cells("RM_CONTROL "), ["RM_CONTROL", "3"]);
        assert_eq!(cells("UVM_INITIALIZE "), ["UVM_INITIALIZE", "1"]);
        assert_eq!(
            cells("0x20800110 "),
            ["0x20800110", "NV2080_CTRL_CMD_GPU_GET_NAME_STRING", "2"]
        );
        assert_eq!(cells("0x2080ffff "), ["0x2080ffff", "1"]);
        let mut lines = text.lines();
        let first = lines.next().unwrap();
        assert!(first.starts_with("   0.000001 cpu2       42/43"), "{first}");
        assert!(first.ends_with(
            "gpu alloc 4194304 bytes video_memory on gpu0: handle 0xc1d00010 class 0x40 (RM_ALLOC)"
        ));
        let header = text.lines().find(|l| l.contains("GPU MEM")).unwrap();
        let cols: Vec<&str> = header.split_whitespace().collect();
        assert!(
            cols.contains(&"EGM") && cols.contains(&"DRIVER"),
            "{header}"
        );
        let row = text.lines().find(|l| l.contains("cuda")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["42", "cuda", "100", "0", "0", "300", "400", "1", "0", "0"]
        );
    }

    #[test]
    fn nvml_line_shows_both_figures() {
        let (capture, out) = Capture::new();
        let mut sink = TextSink::new(Box::new(capture), 0, false);
        sink.nvml_check(
            0,
            &[NvmlDiff {
                pid: 7,
                gpu: 0,
                nvml_bytes: Some(150),
                keling_driver_bytes: 100,
                keling_caller_bytes: 80,
                diff_bytes: Some(50),
            }],
        )
        .unwrap();
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "nvml check: pid 7 gpu0: NVML 150 bytes, Keling (driver figure) 100 bytes, difference 50; charged to the process as a caller 80 bytes\n"
        );
    }
}
