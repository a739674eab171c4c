//! Placeholder: the pure scheduling core is being written.
#![allow(dead_code)]
