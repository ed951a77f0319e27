//! What one simulated engine process was asked to do, resolved from its
//! command line, environment and persona defaults.

use std::time::Duration;

use crate::knobs::{Env, Knobs};
use crate::persona::{Engine, Persona};
use llmgw_engine_options::Parsed;
use llmgw_engine_options::pyrepr::value_repr;

/// Executor backend of a vLLM replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Mp,
    Ray,
    Uni,
}

/// One engine process's resolved settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub persona: Persona,
    pub model: String,
    pub served_names: Vec<String>,
    pub host: String,
    /// What the logs show for the host (`0.0.0.0` when vLLM's host is unset).
    pub shown_host: String,
    pub port: u16,
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    pub nnodes: u64,
    pub node_rank: u64,
    /// Rendezvous address of a multi-node replica (`--master-addr:--master-port`
    /// or `--dist-init-addr`).
    pub rendezvous: Option<String>,
    pub headless: bool,
    pub backend: Option<Backend>,
    pub api_keys: Vec<String>,
    pub max_num_seqs: u64,
    pub max_model_len: Option<u64>,
    pub memory_fraction: f64,
    pub enable_metrics: bool,
    pub enable_load_tracking: bool,
    pub shutdown_timeout: Duration,
    pub force_include_usage: bool,
    pub show_hidden_metrics: bool,
    pub skip_warmup: bool,
    /// vLLM `--disable-log-stats`: no periodic throughput lines.
    pub log_stats: bool,
    /// GPUs this process may use, from `CUDA_VISIBLE_DEVICES`, `--device-ids`
    /// or the simulated node size.
    pub visible_gpus: u64,
    pub knobs: Knobs,
    /// Options given on the command line, as `non-default args` shows them.
    pub given: Vec<(String, String)>,
    /// Warnings the engine's parser printed (deprecated options), in order.
    pub parse_warnings: Vec<String>,
}

/// A setting the engine itself would reject, with its message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ServeConfig {
    pub fn world_size(&self) -> u64 {
        self.tp * self.pp
    }

    /// Ranks of the replica that run on this node.
    pub fn local_world(&self) -> u64 {
        self.world_size().div_ceil(self.nnodes.max(1))
    }

    pub fn first_name(&self) -> &str {
        &self.served_names[0]
    }

    /// Resolves a parsed vLLM or SGLang command line.
    pub fn resolve(
        persona: Persona,
        args: &Parsed,
        knobs: Knobs,
        env: &dyn Env,
    ) -> Result<Self, ConfigError> {
        let vllm = persona.engine == Engine::Vllm;
        // Read by option name: the dest behind it differs between releases.
        let key = |flag: &str| crate::engine_cli::dest_of(persona, flag);
        let model = if vllm {
            args.str(&key("--model-tag"))
                .or_else(|| args.str(&key("--model")))
                .unwrap_or("Qwen/Qwen3-0.6B")
                .to_string()
        } else {
            args.str(&key("--model-path"))
                .unwrap_or_default()
                .to_string()
        };
        let served_names = match args.list(&key("--served-model-name")) {
            Some(names) if !names.is_empty() => names,
            _ => vec![model.clone()],
        };
        let int = |dest: &str, default: u64| -> Result<u64, ConfigError> {
            match args.int(dest) {
                None => Ok(default),
                Some(v) if v >= 0 => Ok(v as u64),
                Some(v) => Err(ConfigError(format!(
                    "argument --{}: must be non-negative, got {v}",
                    dest.replace('_', "-")
                ))),
            }
        };
        let (tp, pp, dp) = (
            int(&key("--tensor-parallel-size"), 1)?,
            int(&key("--pipeline-parallel-size"), 1)?,
            int(&key("--data-parallel-size"), 1)?,
        );
        let nnodes = int(&key("--nnodes"), 1)?;
        let node_rank = int(&key("--node-rank"), 0)?;
        let host_arg = args.str(&key("--host")).map(str::to_string);
        let (host, shown_host) = match (&host_arg, vllm) {
            (Some(h), _) => (h.clone(), h.clone()),
            (None, true) => ("0.0.0.0".to_string(), "0.0.0.0".to_string()),
            (None, false) => ("127.0.0.1".to_string(), "127.0.0.1".to_string()),
        };
        let default_port = if vllm { 8000 } else { 30000 };
        let port = int(&key("--port"), default_port)?;
        let port =
            u16::try_from(port).map_err(|_| ConfigError(format!("port {port} is out of range")))?;
        let rendezvous = if vllm {
            if nnodes > 1 {
                let addr = args.str(&key("--master-addr")).unwrap_or("127.0.0.1");
                let port = int(&key("--master-port"), 29501)?;
                Some(format!("{addr}:{port}"))
            } else {
                None
            }
        } else {
            args.str(&key("--dist-init-addr")).map(str::to_string)
        };
        let backend = match args.str(&key("--distributed-executor-backend")) {
            Some("ray") => Some(Backend::Ray),
            Some("mp") => Some(Backend::Mp),
            Some("uni") => Some(Backend::Uni),
            _ => None,
        };
        let mut api_keys: Vec<String> = args.list(&key("--api-key")).unwrap_or_default();
        if api_keys.is_empty()
            && vllm
            && let Some(key) = env.get("VLLM_API_KEY").filter(|k| !k.is_empty())
        {
            api_keys.push(key);
        }
        let max_num_seqs = if vllm {
            int(&key("--max-num-seqs"), 256)?
        } else {
            int(&key("--max-running-requests"), 1024)?
        };
        // The parser has read `32k`, `auto` (-1) and plain numbers already.
        let max_model_len = args
            .int(if vllm {
                "max_model_len"
            } else {
                "context_length"
            })
            .filter(|n| *n > 0)
            .map(|n| n as u64);
        let memory_fraction = if vllm {
            args.float(&key("--gpu-memory-utilization")).unwrap_or(
                if persona.at_least((0, 12, 0)) {
                    0.92
                } else {
                    0.9
                },
            )
        } else {
            args.float(&key("--mem-fraction-static")).unwrap_or(0.88)
        };
        let visible_gpus = match (
            args.list(&key("--device-ids")),
            env.get("CUDA_VISIBLE_DEVICES"),
        ) {
            (Some(ids), _) => ids
                .iter()
                .flat_map(|i| i.split(','))
                .filter(|s| !s.trim().is_empty())
                .count() as u64,
            (None, Some(devices)) => {
                devices.split(',').filter(|s| !s.trim().is_empty()).count() as u64
            }
            (None, None) => knobs.node_gpus,
        };
        let shutdown_timeout = Duration::from_secs(int(&key("--shutdown-timeout"), 0)?);
        let given = args
            .given
            .iter()
            .map(|dest| {
                let value = args.values.get(dest).map(value_repr).unwrap_or_default();
                (dest.clone(), value)
            })
            .collect();
        Ok(Self {
            persona,
            model,
            served_names,
            host,
            shown_host,
            port,
            tp: tp.max(1),
            pp: pp.max(1),
            dp: dp.max(1),
            nnodes: nnodes.max(1),
            node_rank,
            rendezvous,
            headless: args.flag(&key("--headless")).unwrap_or(false),
            backend,
            api_keys,
            max_num_seqs: max_num_seqs.max(1),
            max_model_len,
            memory_fraction,
            enable_metrics: vllm || args.flag(&key("--enable-metrics")).unwrap_or(false),
            enable_load_tracking: args
                .flag(&key("--enable-server-load-tracking"))
                .unwrap_or(false),
            shutdown_timeout,
            force_include_usage: args
                .flag(&key("--enable-force-include-usage"))
                .unwrap_or(false),
            show_hidden_metrics: args
                .str(&key("--show-hidden-metrics-for-version"))
                .is_some(),
            skip_warmup: args.flag(&key("--skip-server-warmup")).unwrap_or(false),
            log_stats: !args.flag(&key("--disable-log-stats")).unwrap_or(false),
            visible_gpus,
            knobs,
            given,
            parse_warnings: args.warnings.clone(),
        })
    }
}
