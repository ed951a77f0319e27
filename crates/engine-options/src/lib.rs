//! `llmgw-engine-options`: the command-line options of each vLLM and SGLang
//! release, as their real parsers define them, and one implementation of
//! those parsers' rules for everything in llmgw that reads engine flags.
//!
//! * `data/<engine>-<version>.json`, written by
//!   `scripts/engine-options/generate` from the engines' own argparse
//!   parsers, compiled in (`registry.rs` lists them);
//! * [`Parser`]: Python 3.11's argparse driven by that data, with the
//!   engines' converters and vLLM's command-line rewriting, so that a
//!   command line is accepted or refused as the engine would, with its text;
//! * [`check_engine_args`]: a profile's `engine_args` checked before launch,
//!   every problem at once, with "did you mean" ([`suggest`]).
//!
//! Pure: no files are read, no clock, no environment.

pub mod argparse;
pub mod convert;
pub mod data;
pub mod pyjson;
pub mod pyrepr;
mod registry;
pub mod suggest;
mod validate;
mod vllm_argv;

pub use argparse::{ParseError, Parsed, Parser};
pub use data::EngineOptions;
pub use registry::{
    DEFAULT_SGLANG_VERSION, DEFAULT_VLLM_VERSION, Engine, UnknownEngine, Version, embedded_files,
    newest_up_to, options, versions,
};
pub use validate::{ArgProblem, check_engine_args};
