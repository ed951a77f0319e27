//! Router end to end: real `llmgw-engine-sim` processes on 127.0.0.1 and the
//! router in-process.

mod common;
mod t10_errors;
mod t15_wire;
mod t20_openai_client;
mod t30_failover;
mod t35_resume;
mod t40_drain;
mod t45_scale_from_zero;
mod t47_queue;
mod t50_control_plane;
mod t60_cancel;
mod t70_threads;
mod t80_cache_aware;
mod t82_local_tokenizer;
