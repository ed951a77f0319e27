//! Conformance suite: the real `llmgw-engine-sim` binary, started as a
//! process on 127.0.0.1, run through the same scenarios for every persona
//! (startup, streaming, failure, cancellation, shutdown), with wire formats
//! and error tails asserted exactly. Files are numbered by stage.

mod common;
mod t10_argv;
mod t20_startup;
mod t30_serving;
mod t40_failures;
mod t50_shutdown;
mod t60_multinode;
mod t70_ray;
