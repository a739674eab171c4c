//! Figures as people read them: memory in binary units, times in the largest unit
//! that keeps them short, reasons and signals in words. Pure functions, shared by
//! `keling launch` and `keling status`.
use keling_sched::Reason;

/// Bytes in binary units with three significant digits: `512 B`, `1.50 KiB`,
/// `64.0 MiB`, `512 MiB`, `2.00 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let u = UNITS[unit];
    // Rounding may carry into the next digit (1023.9 -> "1024"): acceptable.
    if v < 10.0 {
        format!("{v:.2} {u}")
    } else if v < 100.0 {
        format!("{v:.1} {u}")
    } else {
        format!("{v:.0} {u}")
    }
}

/// A duration given in ms: `850 ms`, `1.50 s`, `12.3 s`, `2m 03s`, `1h 02m`,
/// `3d 04h`.
pub fn duration_ms(ms: u64) -> String {
    const S: u64 = 1000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;
    const D: u64 = 24 * H;
    match ms {
        0..S => format!("{ms} ms"),
        S..10_000 => format!("{:.2} s", ms as f64 / 1000.0),
        10_000..M => format!("{:.1} s", ms as f64 / 1000.0),
        M..H => format!("{}m {:02}s", ms / M, ms % M / S),
        H..D => format!("{}h {:02}m", ms / H, ms % H / M),
        _ => format!("{}d {:02}h", ms / D, ms % D / H),
    }
}

/// A latency given in ns: `850 ns`, `12.3 µs`, `412 µs`, `2.31 ms`, `23.8 ms`,
/// `1.20 s`.
pub fn latency_ns(ns: u64) -> String {
    let three = |v: f64, unit: &str| {
        if v < 10.0 {
            format!("{v:.2} {unit}")
        } else if v < 100.0 {
            format!("{v:.1} {unit}")
        } else {
            format!("{v:.0} {unit}")
        }
    };
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => three(ns as f64 / 1e3, "µs"),
        1_000_000..1_000_000_000 => three(ns as f64 / 1e6, "ms"),
        _ => three(ns as f64 / 1e9, "s"),
    }
}

/// Why a task changed state, in words.
pub fn reason(r: Reason) -> &'static str {
    match r {
        Reason::Placed => "placed",
        Reason::Queued => "queued at arrival",
        Reason::QuantumExpired => "its time slice ran out",
        Reason::Idle => "idle while another task waited",
        Reason::PreemptedByHigherPriority => "preempted by a higher priority",
        Reason::RoundRobin => "its turn passed (round robin)",
        Reason::Resumed => "resumed",
        Reason::ThawUnconfirmed => "thaw unconfirmed, assumed running",
        Reason::Exited => "exited",
        Reason::ExitedWithError => "exited with an error",
        Reason::DurationLimit => "session duration limit",
        Reason::EvictedForMemory => "evicted to free GPU memory",
        Reason::OverQuota => "over its GPU memory quota",
        Reason::Archived => "archived",
        Reason::NoMemory => "its memory no longer fits beside the tasks ahead",
        Reason::Overloaded => "truncated by the overload rule",
    }
}

/// Why a task queued unbound (late binding) is not bound yet.
pub fn wait_reason(r: keling_sched::WaitReason) -> &'static str {
    match r {
        keling_sched::WaitReason::SlotsHeld => "every GPU it may use is taken",
        keling_sched::WaitReason::Ending => "Keling is ending it",
        keling_sched::WaitReason::Memory => "its memory does not fit on any GPU it may use",
        keling_sched::WaitReason::HigherPriority => "a higher priority works on its GPU",
    }
}

/// What a waiting task waits for: `waits for memory`.
pub fn waits_for(r: keling_sched::WaitReason) -> &'static str {
    match r {
        keling_sched::WaitReason::SlotsHeld => "a place under the cap (--slots)",
        keling_sched::WaitReason::Ending => "its end (Keling is ending it)",
        keling_sched::WaitReason::Memory => "memory",
        keling_sched::WaitReason::HigherPriority => "a higher priority to finish",
    }
}

/// `1 job`, `3 jobs`.
pub fn jobs(n: usize) -> String {
    if n == 1 {
        "1 job".into()
    } else {
        format!("{n} jobs")
    }
}

/// A signal's name: `SIGKILL`, or `signal 40`.
pub fn signal(n: i32) -> String {
    let name = match n {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGCONT => "SIGCONT",
        _ => return format!("signal {n}"),
    };
    name.to_owned()
}

/// An exit code as `keling launch` returns it: `exit code 3`, or `killed by
/// SIGKILL (exit code 137)` for 128 + N.
pub fn exit_code(code: i32) -> String {
    if (129..=192).contains(&code) {
        format!("killed by {} (exit code {code})", signal(code - 128))
    } else {
        format!("exit code {code}")
    }
}

/// Lays out rows under a header, each column as wide as its widest cell, two
/// spaces apart; `right[i]` right-aligns column i. Trailing spaces are trimmed.
pub fn table(header: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(width(cell));
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - width(cell));
            if right.get(i).copied().unwrap_or(false) {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.00 KiB"),
            (1536, "1.50 KiB"),
            (64 << 20, "64.0 MiB"),
            (512 << 20, "512 MiB"),
            (3 << 30, "3.00 GiB"),
            (1 << 40, "1.00 TiB"),
        ];
        for (n, text) in cases {
            assert_eq!(bytes(n), text, "{n}");
        }
    }

    #[test]
    fn durations_and_latencies_in_human_units() {
        let d = [
            (0, "0 ms"),
            (999, "999 ms"),
            (1502, "1.50 s"),
            (12_345, "12.3 s"),
            (123_000, "2m 03s"),
            (3_720_000, "1h 02m"),
            (2 * 86_400_000 + 3_600_000, "2d 01h"),
        ];
        for (ms, text) in d {
            assert_eq!(duration_ms(ms), text, "{ms}");
        }
        let l = [
            (850, "850 ns"),
            (12_340, "12.3 µs"),
            (412_000, "412 µs"),
            (2_310_000, "2.31 ms"),
            (23_800_000, "23.8 ms"),
            (1_200_000_000, "1.20 s"),
        ];
        for (ns, text) in l {
            assert_eq!(latency_ns(ns), text, "{ns}");
        }
    }

    #[test]
    fn exit_codes_name_the_signal() {
        assert_eq!(exit_code(0), "exit code 0");
        assert_eq!(exit_code(137), "killed by SIGKILL (exit code 137)");
        assert_eq!(exit_code(143), "killed by SIGTERM (exit code 143)");
        assert_eq!(signal(40), "signal 40");
    }

    #[test]
    fn tables_align_on_the_widest_cell() {
        let rows = vec![
            vec!["1".to_string(), "µ-name".to_string(), "x".to_string()],
            vec!["100".to_string(), "b".to_string(), String::new()],
        ];
        assert_eq!(
            table(&["ID", "NAME", "NOTE"], &[true, false, false], &rows),
            " ID  NAME    NOTE\n  1  µ-name  x\n100  b\n"
        );
    }
}
