//! GPU knowledge the agent needs outside the kernel: where the devices are and which
//! driver serves them ([`env`]), human names for ABI numbers ([`names`]; every RM
//! control command's in [`controls`]), the exact figures read from the kernel maps
//! shaped per process and device ([`stats`]), and NVML for cross-checks and
//! capacities ([`nvml`]).
pub mod controls;
pub mod env;
pub mod names;
pub mod nvml;
pub mod stats;
