//! Probes, one module per subsystem.
//!
//! Imports between them go one way: each module imports only modules below it
//! here (and the crate root's shared maps and helpers, which import none of them).
//!
//! ```text
//! work ───────> accounting, orphans, files, deferred   the work programs (tail calls)
//! nvidia ─────> accounting, files, active, deferred    NVIDIA ioctls
//! context_switch > orphans, active, deferred           context switches
//! process ────> files, deferred                        fork, exec, exit
//! orphans ────> files, deferred                        files released out of sight
//! accounting ─> files, deferred                        clients, memories, totals
//! files ──────> deferred                               NVIDIA fds and open files
//! deferred                                             the deferred-work queue
//! active                                               "this process is working"
//! floor                                                empty programs, the bench's floor
//! ```
//!
//! The deferred-work queue and the programs that do the work are apart on purpose:
//! files, accounting, orphans and nvidia queue work (deferred), and the work
//! programs (work) call back into them to do it.
pub mod accounting;
pub mod active;
pub mod context_switch;
pub mod deferred;
pub mod files;
pub mod floor;
pub mod nvidia;
pub mod orphans;
pub mod process;
pub mod work;
