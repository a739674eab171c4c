//! The agent's defaults, in one place. `--help` shows each where its flag is
//! defined; the scheduler core's own defaults (quanta, kill grace) are in
//! `keling-sched`, and table sizes shared with the kernel in `keling-common`.

/// Size of the kernel ring buffer, KiB.
pub const RINGBUF_KIB: u32 = 4096;
/// `keling run`: seconds between status lines.
pub const STATUS_INTERVAL_S: u64 = 10;
/// `keling run`: the scheduler's clock and the drain of detail events, ms.
pub const RUN_TICK_MS: u64 = 10;
/// `keling trace`: how often detail events (which do not wake the agent) are drained, ms.
pub const TRACE_TICK_MS: u64 = 20;
/// `keling trace`: NVML cross-check every this many seconds (when NVML is there).
pub const NVML_CHECK_EVERY_S: u64 = 5;
/// Priority of tasks nobody gives one.
pub const PRIORITY: u8 = 8;
/// Session duration limit, ms.
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// Warning window before the duration limit, ms.
pub const GRACE_PERIOD_MS: u64 = 30_000;
/// A task is idle after this long without GPU calls or CPU time, ms.
pub const IDLE_TIMEOUT_MS: u64 = 300;
/// Tasks that may run at once on one GPU.
pub const SLOTS_PER_GPU: u32 = 1;
