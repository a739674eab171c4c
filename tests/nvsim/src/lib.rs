//! Library part of `keling-nvsim`: the simulated driver ([`driver`]), the ABI
//! facts it and the workload generator share ([`abi`]), and the hand-written
//! FUSE server ([`fuse`]) with its mount helpers ([`mount`]). See the binary's
//! documentation (`src/main.rs`) for what is simulated.

pub mod abi;
pub mod controls;
pub mod driver;
pub mod fuse;
pub mod mount;
pub mod pidns;
pub mod procmem;
pub mod sandbox;
