//! The agent's defaults, in one place. `--help` shows each where its flag is
//! defined; the scheduler core's own defaults (quanta, kill grace) are in
//! `keling-sched`, and table sizes shared with the kernel in `keling-common`.

/// Size of the kernel ring buffer, KiB.
pub const RINGBUF_KIB: u32 = 4096;
/// `keling run`: seconds between status lines.
pub const STATUS_INTERVAL_S: u64 = 10;
/// `keling run`: the scheduler's clock and the drain of detail events, ms.
pub const RUN_TICK_MS: u64 = 10;
/// `keling run`: the same while no task lives (nothing depends on the time then:
/// the agent sleeps instead of waking 100 times a second), ms. Well under
/// [`WATCHDOG_MS`]: the fail-safe's heartbeat rides on it.
pub const IDLE_TICK_MS: u64 = 100;
/// `keling trace`: how often detail events (which do not wake the agent) are drained, ms.
pub const TRACE_TICK_MS: u64 = 20;
/// `keling trace`: NVML cross-check every this many seconds (when NVML is there).
pub const NVML_CHECK_EVERY_S: u64 = 5;
/// Priority of tasks nobody gives one.
pub const PRIORITY: u8 = 8;
/// Session duration limit, ms.
pub const MAX_DURATION_MS: u64 = keling_sched::DEFAULT_MAX_DURATION_MS;
/// Warning window before the duration limit, ms.
pub const GRACE_PERIOD_MS: u64 = keling_sched::DEFAULT_GRACE_MS;
/// `keling run`: at most one "active" signal per task per this many ns reaches the
/// scheduler core (limited in the agent, per task); the kernel limits them per
/// tracked root process to [`active_interval_ns`], never less than this.
pub const ACTIVE_INTERVAL_NS: u32 = 5_000_000;
/// The most the kernel's interval between two activity signals of one process
/// tree grows to (see [`active_interval_ns`]), ns.
pub const ACTIVE_INTERVAL_MAX_NS: u32 = 100_000_000;

/// The kernel's interval between two activity signals of one tracked process
/// tree under an idle timeout of `idle_timeout_ms`: a quarter of it, so that a
/// task working without a break is never taken for idle, and at least
/// [`ACTIVE_INTERVAL_NS`]. Each signal wakes the agent, so a busy GPU process
/// costs it 13 wake-ups a second at the default idle timeout instead of 200. The
/// first signal after a quiet spell is never held back (the spell is longer than
/// the interval by the time anything depends on it).
pub fn active_interval_ns(idle_timeout_ms: u64) -> u32 {
    let quarter_ns = idle_timeout_ms.saturating_mul(1_000_000) / 4;
    quarter_ns.clamp(
        u64::from(ACTIVE_INTERVAL_NS),
        u64::from(ACTIVE_INTERVAL_MAX_NS),
    ) as u32
}

/// A task is idle after this long without GPU calls or CPU time, ms.
pub const IDLE_TIMEOUT_MS: u64 = keling_sched::DEFAULT_IDLE_TIMEOUT_MS;
/// Tasks that may run at once on one GPU: under memory sharing (the default)
/// 0, no cap (every task whose memory fits runs); under `--sharing slots`, 0
/// counts as 1.
pub const SLOTS_PER_GPU: u32 = 0;
/// How the tasks on one GPU share it: by memory (every task whose memory fits
/// runs at once; priorities still preempt).
pub const SHARING: keling_sched::Sharing = keling_sched::Sharing::Memory;
/// When a launched task that names no GPU is bound to one: when a GPU can run
/// it, so no GPU idles while a task that could run there waits.
pub const BINDING: keling_sched::Binding = keling_sched::Binding::Late;
/// The group whose members (besides root) may use the control socket.
pub const SOCKET_GROUP: &str = "keling";
/// The highest priority (lowest number) a user other than root may ask for unless
/// the config grants more: the real-time class 0-2 is root's.
pub const USER_MIN_PRIORITY: u8 = 3;
/// The one-agent lock.
pub const LOCK_FILE: &str = "/run/keling/keling.lock";
/// The fail-safe thaws everything after this long without a heartbeat, ms.
pub const WATCHDOG_MS: u64 = 1000;
/// SCHED_FIFO priority of the actuation thread and the fail-safe (0: ordinary class).
pub const ACTUATOR_RT_PRIORITY: u8 = 50;
/// `keling run --loop-priority`: the event loop's SCHED_FIFO priority, below the
/// actuation thread's (a thaw's writer must not wait for the loop).
pub const LOOP_RT_PRIORITY: u8 = 40;
/// Finished (archived) tasks stay in `keling status` this long, s.
pub const ARCHIVE_RETENTION_S: u64 = 600;
/// At most this many finished (archived) tasks are kept: those that finished
/// first are forgotten first (`keling run --archive-max`).
pub const ARCHIVE_MAX: usize = 2000;
/// The scheduling log and the input log each rotate at this size (one old file
/// kept as `FILE.1`), MiB; 0: never.
pub const LOG_MAX_MIB: u64 = 64;
/// `keling run --histo-log`: seconds per interval.
pub const HISTO_INTERVAL_S: u64 = 10;
/// `keling run`: where Prometheus `/metrics` is served (loopback only by default).
pub const METRICS_ADDR: &str = "127.0.0.1:9475";
/// `keling run`: an exited process leaves `/metrics` this long after its exit, s.
pub const METRICS_GRACE_S: u64 = 60;

/// The scheduler core's config `keling run` builds when no flag, config file or
/// environment variable changes it, GPUs aside (it finds those on the host).
/// `keling run`'s flags default to the constants above, and `keling replay`
/// (no header, and `--synthetic`'s default run) starts from this; a test
/// compares it with what `keling run` builds from its parsed default flags.
pub fn sched_config() -> keling_sched::SchedConfig {
    keling_sched::SchedConfig {
        gpus: Vec::new(),
        slots_per_gpu: SLOTS_PER_GPU,
        sharing: SHARING,
        binding: BINDING,
        idle_timeout_ms: IDLE_TIMEOUT_MS,
        default_max_duration_ms: MAX_DURATION_MS,
        default_grace_ms: GRACE_PERIOD_MS,
        default_hard_kill: true,
        ..keling_sched::SchedConfig::default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_activity_interval_is_a_quarter_of_the_idle_timeout_within_bounds() {
        use super::active_interval_ns as f;
        assert_eq!(f(20), 5_000_000);
        assert_eq!(f(super::IDLE_TIMEOUT_MS), 75_000_000);
        assert_eq!(f(1), 5_000_000);
        assert_eq!(f(3_600_000), 100_000_000);
        assert_eq!(f(u64::MAX), 100_000_000);
    }
}
