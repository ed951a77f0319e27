use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Yaml,
}

/// Operate the control plane through the admin API of any peer.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Admin API base URL of a peer; repeat (or separate with commas) to
    /// name several, tried in order.
    #[arg(
        long = "api",
        global = true,
        env = "LLMGW_API",
        value_delimiter = ',',
        default_value = "https://127.0.0.1:7480"
    )]
    pub api: Vec<String>,
    /// CA bundle that signed the peers' certificates (the `ca` of
    /// server.yaml): the admin API is HTTPS whenever the peers have TLS.
    #[arg(long, global = true, env = "LLMGW_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Admin API bearer token (a read token for reads, a write token for
    /// changes). Prefer the environment variable: a flag shows in `ps`.
    #[arg(long, global = true, env = "LLMGW_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Show the result again every 2 seconds until Ctrl-C.
    #[arg(short = 'w', long, global = true)]
    pub watch: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum CtlCommand {
    /// Raft peers: roles, indexes and state hashes; add or remove peers.
    Cluster {
        #[command(subcommand)]
        action: Option<ClusterAction>,
    },
    /// GPU nodes: status, time since the last heartbeat, GPUs, fabrics and
    /// shards; with a NODE, its whole inventory.
    Nodes {
        node: Option<String>,
        /// Only nodes in this status: ready, unreachable or lost.
        #[arg(long, conflicts_with = "node")]
        status: Option<String>,
    },
    /// Why each replica of a model is where it is, or why it is pending.
    Explain { model: String },
    /// Model replicas and their shards.
    Replicas,
    /// The model catalog.
    Models {
        #[command(subcommand)]
        action: Option<ModelAction>,
    },
    /// API keys clients present to routers: list them, or create, update,
    /// rotate and revoke one.
    Keys {
        #[command(subcommand)]
        action: Option<KeyAction>,
    },
    /// What API keys used: requests and tokens per day, key and model, or
    /// summed by key, team or model.
    Usage {
        /// The last N days, today included (UTC).
        #[arg(long, default_value_t = 7)]
        days: u64,
        /// Sum over the period by this instead of listing each day.
        #[arg(long, value_enum)]
        by: Option<UsageGrouping>,
        /// Print CSV (a header line, then one line per row).
        #[arg(long)]
        csv: bool,
    },
    /// Backups of the control plane's state.
    Snapshot {
        #[command(subcommand)]
        action: SnapshotAction,
    },
    /// Stop placing new replicas on a node.
    Cordon { node: String },
    /// Allow placements on a node again.
    Uncordon { node: String },
    /// Move every replica off a node (each replacement ready before the old
    /// replica drains), then leave it cordoned. Shows progress until done.
    Drain {
        node: String,
        /// How long in-flight requests get before shards stop anyway
        /// (e.g. 90s, 10m).
        #[arg(long, default_value = "5m", value_parser = parse_deadline)]
        deadline: std::time::Duration,
        /// Return once the drain is accepted instead of following it.
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ClusterAction {
    /// Add a peer: it joins as a learner, catches up, then becomes a voter.
    Add {
        /// The new peer's id; ids of removed peers are never reused.
        #[arg(long)]
        id: u64,
        /// The new peer's gRPC address (host:port).
        #[arg(long)]
        grpc: String,
        /// The new peer's admin API URL.
        #[arg(long, default_value = "")]
        admin: String,
    },
    /// Remove a peer; its id is retired for good.
    Remove { id: u64 },
}

#[derive(Debug, Clone, Subcommand)]
pub enum SnapshotAction {
    /// Save a consistent snapshot (every write acknowledged before it) to
    /// FILE, with its index, term and state hash. Restore it with `llmgw
    /// server --config server.yaml --restore FILE` on every peer.
    Save { file: PathBuf },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ModelAction {
    /// Show one model entry.
    Get { name: String },
    /// Add or replace a model from a file holding one entry (YAML or JSON).
    Put {
        file: PathBuf,
        /// The model's name; by default the `name` in the file.
        #[arg(long)]
        name: Option<String>,
    },
    /// Remove a model from the catalog.
    Delete { name: String },
    /// How far the model's current spec has rolled onto its replicas:
    /// each replica with the spec it runs, failures, and what blocks it.
    Status { name: String },
    /// Restore the launch spec the model had before its last change; its
    /// replicas roll back the same way (make-before-break).
    Rollback { name: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageGrouping {
    Key,
    Team,
    Model,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeyAction {
    /// Show one key.
    Get { name: String },
    /// Create a key. Its secret is printed once, here, and never again.
    Create {
        name: String,
        #[command(flatten)]
        settings: KeyFlags,
    },
    /// Change a key's team, models, expiry or limits; what no flag names
    /// stays as it is.
    Update {
        name: String,
        #[command(flatten)]
        settings: KeyFlags,
    },
    /// A new secret for the key, printed once; the old one is refused from
    /// then on.
    Rotate { name: String },
    /// Refuse the key from now on, on every router within a second.
    Revoke { name: String },
}

#[derive(Debug, Clone, Default, Args)]
pub struct KeyFlags {
    /// The team (or owner) the key belongs to.
    #[arg(long)]
    pub team: Option<String>,
    /// A model (name or alias) the key may use; repeat for several. None
    /// given on create: every model.
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// Let the key use every model again.
    #[arg(long, conflicts_with = "models")]
    pub all_models: bool,
    /// Refused after this long from now (e.g. 30d, 12h).
    #[arg(long, value_parser = parse_deadline)]
    pub expires_in: Option<std::time::Duration>,
    /// Remove the expiry.
    #[arg(long, conflicts_with = "expires_in")]
    pub never_expires: bool,
    /// Requests per minute each router admits for the key; 0 removes the
    /// limit.
    #[arg(long)]
    pub requests_per_minute: Option<u32>,
    /// Requests in flight at once on each router; 0 removes the limit.
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    /// Prompt and completion tokens per minute each router admits for the
    /// key, charged when an answer is over; 0 removes the limit.
    #[arg(long)]
    pub tokens_per_minute: Option<u32>,
    /// Tokens per UTC day over every router; 0 removes the budget.
    #[arg(long)]
    pub tokens_per_day: Option<u64>,
    /// Tokens per UTC calendar month over every router; 0 removes the
    /// budget.
    #[arg(long)]
    pub tokens_per_month: Option<u64>,
    /// Dollars per UTC day over every router, by the models' `price`; 0
    /// removes the budget.
    #[arg(long, value_parser = parse_usd)]
    pub usd_per_day: Option<llmgw_api::keys::Usd>,
    /// Dollars per UTC calendar month over every router; 0 removes the
    /// budget.
    #[arg(long, value_parser = parse_usd)]
    pub usd_per_month: Option<llmgw_api::keys::Usd>,
    /// Count what the limits would refuse without refusing it.
    #[arg(long)]
    pub shadow: bool,
    /// Enforce the limits (leave shadow mode).
    #[arg(long, conflicts_with = "shadow")]
    pub enforce: bool,
}

fn parse_usd(text: &str) -> Result<llmgw_api::keys::Usd, String> {
    text.trim_start_matches('$')
        .parse::<f64>()
        .ok()
        .and_then(llmgw_api::keys::Usd::from_dollars)
        .ok_or_else(|| format!("{text:?} is not an amount of dollars (e.g. 25 or 12.50)"))
}

fn parse_deadline(text: &str) -> Result<std::time::Duration, String> {
    llmgw_yaml::parse_duration(text)
}
