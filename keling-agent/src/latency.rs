//! Placeholder: decision latency and the timeout model are being written.
#![allow(dead_code)]
