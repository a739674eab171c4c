//! Lines the agent prints that other programs wait for or read (`cargo xtask
//! bench`, the integration tests): written and read only through this module, so
//! the two sides cannot drift apart.
use core::fmt;

/// What `keling run` prints (standard error) once its probes are attached and its
/// control socket listens.
pub const AGENT_READY: &str = "keling: ready:";

/// What `keling floor` prints (standard error) once its two empty programs are
/// attached.
pub const FLOOR_READY: &str = "keling floor: attached";

/// An actuation that took longer than 2 ms from its decision, and where that time
/// went; `keling run` logs it (info) after [`SlowActuation::PREFIX`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowActuation<'a> {
    /// The action (`Freeze`, `Thaw`, ...).
    pub kind: &'a str,
    pub task: u64,
    /// From the decision to the write's return.
    pub took_ms: f64,
    /// From the decision until the actuation thread picked the job up.
    pub handoff_ms: f64,
    /// Raising the task's threads before a freeze, and how many.
    pub boost_ms: f64,
    pub threads: u64,
    /// The write to the cgroup (or the signal).
    pub write_ms: f64,
    /// The actuation thread's context switches in boost and write.
    pub voluntary: u64,
    pub involuntary: u64,
    /// Of boost and write, the time the thread was on a CPU (its vCPU running).
    pub on_cpu_ms: f64,
}

impl<'a> SlowActuation<'a> {
    pub const PREFIX: &'static str = "slow actuation: ";

    /// Reads what [`fmt::Display`] wrote (without [`Self::PREFIX`]).
    pub fn parse(line: &'a str) -> Option<Self> {
        let (kind, rest) = line.split_once(" of task ")?;
        let (task, rest) = rest.split_once(" took ")?;
        let (took, rest) = rest.split_once(" ms: handoff ")?;
        let (handoff, rest) = rest.split_once(" ms, boost ")?;
        let (boost, rest) = rest.split_once(" ms (")?;
        let (threads, rest) = rest.split_once(" threads), write ")?;
        let (write, rest) = rest.split_once(" ms (")?;
        let (voluntary, rest) = rest.split_once(" voluntary, ")?;
        let (involuntary, rest) =
            rest.split_once(" involuntary context switches in boost and write; on CPU ")?;
        let on_cpu = rest.strip_suffix(" ms of them)")?;
        Some(SlowActuation {
            kind,
            task: task.parse().ok()?,
            took_ms: took.parse().ok()?,
            handoff_ms: handoff.parse().ok()?,
            boost_ms: boost.parse().ok()?,
            threads: threads.parse().ok()?,
            write_ms: write.parse().ok()?,
            voluntary: voluntary.parse().ok()?,
            involuntary: involuntary.parse().ok()?,
            on_cpu_ms: on_cpu.parse().ok()?,
        })
    }
}

impl fmt::Display for SlowActuation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of task {} took {:.3} ms: handoff {:.3} ms, boost {:.3} ms ({} threads), \
             write {:.3} ms ({} voluntary, {} involuntary context switches in boost and write; \
             on CPU {:.3} ms of them)",
            self.kind,
            self.task,
            self.took_ms,
            self.handoff_ms,
            self.boost_ms,
            self.threads,
            self.write_ms,
            self.voluntary,
            self.involuntary,
            self.on_cpu_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn a_slow_actuation_reads_back_as_written() {
        let s = SlowActuation {
            kind: "Freeze",
            task: 17,
            took_ms: 2.492,
            handoff_ms: 0.062,
            boost_ms: 0.203,
            threads: 17,
            write_ms: 2.227,
            voluntary: 1,
            involuntary: 2,
            on_cpu_ms: 0.613,
        };
        let line = s.to_string();
        assert_eq!(SlowActuation::parse(&line), Some(s));
        // What the bench finds in the agent's log, level and all.
        let logged = std::format!("[INFO ] {}{line}", SlowActuation::PREFIX);
        let (_, after) = logged.split_once(SlowActuation::PREFIX).unwrap();
        assert_eq!(SlowActuation::parse(after), Some(s));
    }

    #[test]
    fn other_lines_are_not_slow_actuations() {
        assert_eq!(SlowActuation::parse("Freeze of task 1 took 2.4 ms"), None);
        let line = SlowActuation {
            kind: "Thaw",
            task: 1,
            took_ms: 3.0,
            handoff_ms: 0.1,
            boost_ms: 0.0,
            threads: 0,
            write_ms: 2.9,
            voluntary: 0,
            involuntary: 0,
            on_cpu_ms: 2.8,
        }
        .to_string();
        let damaged = line.replace("voluntary", "willing");
        assert_eq!(SlowActuation::parse(&damaged), None);
        let cut = &line[..line.len() - 1];
        assert_eq!(SlowActuation::parse(cut), None);
    }
}
