//! The scheduler: a pure core (`core`) and, around it, the agent's actuators.
pub mod core;
