//! Empty programs for `keling floor` (hidden, for `cargo xtask bench`), never
//! attached by the agent's tracing, so that the bench's floors are measured with
//! the same loader, attachment and JIT as Keling itself:
//! - two on the ioctl tracepoints Keling uses: the least any tracer attached
//!   there can cost;
//! - two on the raw `sys_enter` and `sys_exit` tracepoints (`--raw-syscalls`):
//!   what a program run on every syscall costs, the other way of seeing them.
use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn floor_enter_ioctl(_ctx: TracePointContext) -> i32 {
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn floor_exit_ioctl(_ctx: TracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn floor_raw_sys_enter(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn floor_raw_sys_exit(_ctx: RawTracePointContext) -> i32 {
    0
}
