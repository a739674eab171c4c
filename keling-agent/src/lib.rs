//! Keling's userspace agent: a library (this crate) and the thin `keling` binary
//! (`main.rs`). The map of its modules, each with one job:
//!
//! | module | owns | must not |
//! |---|---|---|
//! | [`cmd`] | one module per subcommand: parse its arguments, wire the pipeline, exit code | be imported by any other module |
//! | [`agent_loop`] | `keling run`'s event loop as a type: one method per event source (kernel events, tick, control requests, wakes, confirmations, fail-safe, scrapes), one drain of kernel events, shutdown; the kernel, ring buffer and fail-safe behind traits (tested without root) | parse arguments or set up the host (`cmd::run` wires it) |
//! | [`trace_loop`] | `keling trace`'s event loop as a type: one method per source (kernel events, the command's end, tick, deadline, signals), the one drain into the model and the sink, the summary; the kernel's maps, ring buffer and signals behind traits (tested without root) | parse arguments or find the processes to trace (`cmd::trace` does) |
//! | [`bpf`] | loading the eBPF object, the program table (required / optional per feature), BTF and tracefs offsets, reading the kernel maps | decide anything about scheduling or output |
//! | [`event`] | draining the ring buffer, decoding raw records into typed events | do I/O besides the ring buffer |
//! | [`process_model`] | the process model (not [`latency::timeout_model`], the decision timeout): processes and threads from decoded events, each joined with its GPU figures | do I/O |
//! | [`gpu`] | the device directory and driver version, names of ABI numbers, GPU figures per process, NVML | touch the kernel maps (it is handed what `bpf` read) |
//! | [`sched`] | the daemon around `keling-sched` (feed, act, export; launches, membership, client notices beside it), the machine behind one `Host` trait (a fake one tests the daemon without root), actuators (cgroup, signals), writing the logs, config, fail-safe | parse `/proc` itself (it asks `os`) |
//! | [`log_format`] | the scheduling log's line types and the input log's header: the one definition the writer (`sched::log_writer`) and every reader use | do I/O or import any other module of the agent |
//! | [`control`] | the typed control protocol, its server (one task per client, deadlines, size limits) and client | block the event loop |
//! | [`latency`] | decision latency histograms, timeout models, exports | read clocks |
//! | [`prometheus`] | Prometheus `/metrics` (not [`replay::figures`], what a replay measures): the figures as prometheus-client families, the label grace rule, a minimal hardened HTTP server | block the event loop (it renders only what the loop hands it) |
//! | [`output`] | trace sinks (text, JSON lines, Perfetto) behind one `Sink` trait; findings; scheduler decisions read back | read `/proc`, maps or clocks |
//! | [`os`] | `/proc` (the only parser of it), mounts, spawning held children, clocks, privileges, pidfds | know about GPUs or scheduling |
//! | [`replay`] | reading the input and scheduling logs back, exact and what-if replay through `keling-sched`, the synthetic workload, what a replay measures ([`replay::figures`]) | read a clock (the command times it) |
//! | [`report`] | the HTML report: queueing-delay heatmaps, the longest waits and the GPUs idle through them, root-cause findings, task timelines, latency histogram (SVG) | read anything but the logs it is given |
//! | [`slurm`] | Keling under Slurm: gres.conf and plugstack.conf lines, a Slurm job's notices to its output file, requeue and the reason told to Slurm | block the event loop (Slurm's commands run on the blocking pool) |
//! | [`instance`] | which agent instance this process serves, and every path derived from it (cgroup root, run directory, socket, lock) | do I/O |
//! | [`defaults`] | every default value the command line shows | |
//!
//! The scheduler core is the separate crate `keling-sched` (no I/O, no clock); the
//! kernel/user contract is `keling-common`.
pub mod agent_loop;
pub mod bpf;
pub mod cmd;
pub mod control;
pub mod defaults;
pub mod event;
pub mod gpu;
pub mod instance;
pub mod latency;
pub mod log_format;
pub mod os;
pub mod output;
pub mod process_model;
pub mod prometheus;
pub mod replay;
pub mod report;
pub mod sched;
pub mod slurm;
pub mod trace_loop;
