//! Keling's eBPF programs live in `main.rs` and `probes/`; this stub library lets the
//! crate be a workspace member that cargo can check on the host.
#![no_std]
