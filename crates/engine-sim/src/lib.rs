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

pub mod argparse;
pub mod cli;
pub mod config;
pub mod embed;
pub mod failures;
pub mod flags;
pub mod generate;
pub mod http;
pub mod knobs;
pub mod lifecycle;
mod load;
pub mod logs;
pub mod metrics;
pub mod models;
pub mod persona;
pub mod plan;
pub mod ray;
pub mod rendezvous;
pub mod rng;
pub mod routes;
pub mod serve;
pub mod state;
pub mod sys;
pub mod wire;
pub mod workers;

pub use cli::main_with_args;
pub use knobs::{Fault, Knobs};
pub use persona::{Engine, Persona};
