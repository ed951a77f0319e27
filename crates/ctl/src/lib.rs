//! `llmgw ctl`: the operator's view of the control plane, over the admin
//! API of any peer. Output is a table, or JSON with `-o json`.

mod args;
mod client;
mod drain;
mod keys;
mod render;
mod run;
mod snapshot;
mod table;
mod usage;
mod yaml;

pub use args::{CtlArgs, CtlCommand, OutputFormat};
pub use client::{AdminClient, CtlError};
pub use run::run_ctl;
