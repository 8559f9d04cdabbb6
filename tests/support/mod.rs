//! Helpers shared by integration tests and benchmarks.
pub mod tiny;
