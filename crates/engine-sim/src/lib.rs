//! `llmgw-engine-sim`: one binary that stands in for vLLM (`serve MODEL`),
//! SGLang (`-m sglang.launch_server`) and Ray (`start`, `status`, `stop`).
//!
//! It parses command lines the way the engines do (argparse rules, per
//! release), checks what they check (model known, heads divisible by TP,
//! GPUs visible, weights and KV cache fit), loads with their log lines,
//! refuses connections while loading, meets its peers in a real TCP
//! rendezvous, serves the OpenAI and engine routes with their exact wire
//! shapes and metrics, shuts down as each release does, and injects faults
//! on request. Everything is steered by `--sim-*` flags or `LLMGW_SIM_*`
//! variables; see docs/engine-sim.md.

mod cli;
mod config;
mod continuation;
mod embed;
pub mod engine_cli;
pub mod failures;
mod generate;
mod http;
pub mod knobs;
mod kv_events;
mod lifecycle;
mod load;
mod logs;
pub mod metrics;
pub mod models;
pub mod persona;
mod plan;
mod prefix_cache;
mod ray;
mod rendezvous;
mod rng;
mod routes;
mod serve;
mod sleep;
mod state;
mod stats_log;
mod sys;
mod tokens;
pub mod wire;
mod workers;

pub use cli::main_with_args;
pub use failures::{Ending, Failure};
pub use knobs::{Fault, Knobs};
pub use models::{ModelSpec, find as find_model, registry as model_registry};
pub use persona::{Engine, Persona};
