//! The model catalog: what `models.yaml` says, and every rule it must pass.
//!
//! A [`Model`] is either run by llmgw ([`Serving::Managed`]: a source, a
//! desired replica count and [`Profile`]s tried in order) or only routed to
//! ([`Serving::Endpoints`]). Validation happens while decoding, in one place
//! (`decode.rs`), so the server, the router and `llmgw config check` agree on
//! what a valid catalog is. Values serialize with serde in the same shape as
//! the YAML file (JSON on the wire and in the Raft log).

mod decode;
mod engine_args;
mod managed_flags;
mod model;
mod price;

pub use decode::{
    MAX_GPUS_PER_NODE, MAX_NODES_PER_REPLICA, MAX_REPLICAS, check_endpoint_url, decode_catalog,
    parse_catalog, parse_model,
};
pub use engine_args::{check_engine_args, options_for, options_up_to, resolve_engine_version};
pub use llmgw_engine_options::Version as EngineRelease;
pub use llmgw_engine_options::{ArgProblem, UnknownEngine};
pub use managed_flags::{MANAGED_ENV, managed_flag};
pub use model::{
    Autoscale, Catalog, Engine, LaunchMode, Managed, Model, Profile, RolloutPolicy, Serving,
};
pub use price::{Price, Usd};
