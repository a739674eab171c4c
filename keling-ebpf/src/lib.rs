//! Keling's eBPF programs live in `main.rs` and `probes/`; this stub library lets the
//! crate be a workspace member that cargo can check on the host, and a
//! build-dependency of keling-agent, whose build.rs builds the programs.
#![no_std]
