//! Signals to the processes a test started, and whether they still run:
//! llmgw's own process facts (`llmgw-procfs`), under the path tests have
//! always imported them from.

pub use llmgw_procfs::{alive, signal_group, signal_pid};
