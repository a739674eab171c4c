//! Two empty programs on the ioctl tracepoints Keling uses: the least any tracer
//! attached there can cost. Never attached by the agent's tracing; `keling
//! floor` (hidden, for `cargo xtask bench`) attaches only these, so the bench's
//! floor is measured with the same loader, attachment and JIT as Keling itself.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn floor_enter_ioctl(_ctx: TracePointContext) -> i32 {
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn floor_exit_ioctl(_ctx: TracePointContext) -> i32 {
    0
}
