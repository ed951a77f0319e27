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
    /// A local directory given as the tokenizer (vLLM `--tokenizer`,
    /// SGLang `--tokenizer-path`): requests are tokenized by the model's
    /// own tokenizer and chat template from it. A repository id, or
    /// nothing, keeps the simulated tokenizer.
    pub tokenizer_dir: Option<std::path::PathBuf>,
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
    /// vLLM `--num-gpu-blocks-override`: the KV cache holds this many
    /// blocks whatever the memory left for it.
    pub num_gpu_blocks_override: Option<u64>,
    /// vLLM `--enable-sleep-mode`.
    pub sleep_mode: bool,
    /// `VLLM_SERVER_DEV_MODE=1`: vLLM registers its development endpoints,
    /// the sleep ones among them.
    pub dev_mode: bool,
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
    /// Tokens per KV block: vLLM's `--block-size` (16), SGLang's
    /// `--page-size` (1).
    pub block_size: usize,
    /// Where KV events go (`--kv-events-config`); none when off.
    pub kv_events: Option<crate::kv_events::KvEventsConfig>,
    /// Seeds the prefix cache's hash chain: `PYTHONHASHSEED` when set;
    /// otherwise vLLM before 0.34 draws one per process and the others
    /// hash deterministically.
    pub hash_seed: u64,
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

    /// GPUs this node must see: every data-parallel rank has a world of
    /// its own.
    pub fn local_gpus_needed(&self) -> u64 {
        self.local_world() * self.dp.max(1)
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
        let line = CommandLine { persona, args };
        let vllm = persona.engine == Engine::Vllm;
        let model = line.model();
        let served_names = match args.list(&line.key("--served-model-name")) {
            Some(names) if !names.is_empty() => names,
            _ => vec![model.clone()],
        };
        let tokenizer_dir = line
            .str(if vllm {
                "--tokenizer"
            } else {
                "--tokenizer-path"
            })
            .filter(|path| path.starts_with('/') || path.starts_with('.'))
            .map(std::path::PathBuf::from);
        let (tp, pp, dp) = (
            line.int("--tensor-parallel-size", 1)?,
            line.int("--pipeline-parallel-size", 1)?,
            line.int("--data-parallel-size", 1)?,
        );
        // Read in the engines' order, so the first bad option is the one
        // reported.
        let nnodes = line.int("--nnodes", 1)?;
        let node_rank = line.int("--node-rank", 0)?;
        let (host, shown_host, port) = line.listen_address()?;
        let rendezvous = line.rendezvous(nnodes)?;
        let mut api_keys: Vec<String> = args.list(&line.key("--api-key")).unwrap_or_default();
        if api_keys.is_empty()
            && vllm
            && let Some(key) = env.get("VLLM_API_KEY").filter(|k| !k.is_empty())
        {
            api_keys.push(key);
        }
        let max_num_seqs = if vllm {
            line.int("--max-num-seqs", 256)?
        } else {
            line.int("--max-running-requests", 1024)?
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
        let shutdown_timeout = Duration::from_secs(line.int("--shutdown-timeout", 0)?);
        let flag = |name: &str| args.flag(&line.key(name)).unwrap_or(false);
        let block_size = if vllm {
            line.int("--block-size", 16)?
        } else {
            line.int("--page-size", 1)?
        };
        let kv_events = crate::kv_events::parse(persona, line.str("--kv-events-config"))
            .map_err(ConfigError)?;
        let hash_seed = match env
            .get("PYTHONHASHSEED")
            .and_then(|s| s.parse::<u64>().ok())
        {
            Some(seed) => seed,
            None if vllm && !persona.at_least((0, 34, 0)) => knobs.seed,
            None => 0,
        };
        Ok(Self {
            persona,
            model,
            served_names,
            tokenizer_dir,
            host,
            shown_host,
            port,
            tp: tp.max(1),
            pp: pp.max(1),
            dp: dp.max(1),
            nnodes: nnodes.max(1),
            node_rank,
            rendezvous,
            headless: flag("--headless"),
            backend: line.backend(),
            api_keys,
            max_num_seqs: max_num_seqs.max(1),
            max_model_len,
            num_gpu_blocks_override: match vllm {
                true => args
                    .int(&line.key("--num-gpu-blocks-override"))
                    .filter(|n| *n > 0)
                    .map(|n| n as u64),
                false => None,
            },
            sleep_mode: vllm && flag("--enable-sleep-mode"),
            dev_mode: vllm && env.get("VLLM_SERVER_DEV_MODE").as_deref() == Some("1"),
            memory_fraction: line.memory_fraction(),
            enable_metrics: vllm || flag("--enable-metrics"),
            enable_load_tracking: flag("--enable-server-load-tracking"),
            shutdown_timeout,
            force_include_usage: flag("--enable-force-include-usage"),
            show_hidden_metrics: args
                .str(&line.key("--show-hidden-metrics-for-version"))
                .is_some(),
            skip_warmup: flag("--skip-server-warmup"),
            log_stats: !flag("--disable-log-stats"),
            visible_gpus: line.visible_gpus(env, knobs.node_gpus),
            knobs,
            block_size: block_size.max(1) as usize,
            kv_events,
            hash_seed,
            given: line.given(),
            parse_warnings: args.warnings.clone(),
        })
    }
}

/// A parsed command line read by option name, with each engine's defaults.
struct CommandLine<'a> {
    persona: Persona,
    args: &'a Parsed,
}

impl CommandLine<'_> {
    fn vllm(&self) -> bool {
        self.persona.engine == Engine::Vllm
    }

    /// The dest behind an option: it differs between releases.
    fn key(&self, flag: &str) -> String {
        crate::engine_cli::dest_of(self.persona, flag)
    }

    fn str(&self, flag: &str) -> Option<&str> {
        self.args.str(&self.key(flag))
    }

    /// A non-negative integer option, `default` when not given.
    fn int(&self, flag: &str, default: u64) -> Result<u64, ConfigError> {
        let dest = self.key(flag);
        match self.args.int(&dest) {
            None => Ok(default),
            Some(v) if v >= 0 => Ok(v as u64),
            Some(v) => Err(ConfigError(format!(
                "argument --{}: must be non-negative, got {v}",
                dest.replace('_', "-")
            ))),
        }
    }

    fn model(&self) -> String {
        if self.vllm() {
            self.str("--model-tag")
                .or_else(|| self.str("--model"))
                .unwrap_or("Qwen/Qwen3-0.6B")
                .to_string()
        } else {
            self.str("--model-path").unwrap_or_default().to_string()
        }
    }

    /// (host to bind, host to print, port).
    fn listen_address(&self) -> Result<(String, String, u16), ConfigError> {
        let host = match self.str("--host") {
            Some(h) => h.to_string(),
            None if self.vllm() => "0.0.0.0".to_string(),
            None => "127.0.0.1".to_string(),
        };
        let default_port = if self.vllm() { 8000 } else { 30000 };
        let port = self.int("--port", default_port)?;
        let port =
            u16::try_from(port).map_err(|_| ConfigError(format!("port {port} is out of range")))?;
        Ok((host.clone(), host, port))
    }

    /// Where a multi-node replica's nodes meet.
    fn rendezvous(&self, nnodes: u64) -> Result<Option<String>, ConfigError> {
        if !self.vllm() {
            return Ok(self.str("--dist-init-addr").map(str::to_string));
        }
        if nnodes <= 1 {
            return Ok(None);
        }
        let addr = self.str("--master-addr").unwrap_or("127.0.0.1");
        let port = self.int("--master-port", 29501)?;
        Ok(Some(format!("{addr}:{port}")))
    }

    fn backend(&self) -> Option<Backend> {
        match self.str("--distributed-executor-backend") {
            Some("ray") => Some(Backend::Ray),
            Some("mp") => Some(Backend::Mp),
            Some("uni") => Some(Backend::Uni),
            _ => None,
        }
    }

    fn memory_fraction(&self) -> f64 {
        if !self.vllm() {
            return self
                .args
                .float(&self.key("--mem-fraction-static"))
                .unwrap_or(0.88);
        }
        let default = if self.persona.at_least((0, 12, 0)) {
            0.92
        } else {
            0.9
        };
        self.args
            .float(&self.key("--gpu-memory-utilization"))
            .unwrap_or(default)
    }

    /// GPUs the engine sees: `--device-ids`, else `CUDA_VISIBLE_DEVICES`,
    /// else the node's.
    fn visible_gpus(&self, env: &dyn Env, node_gpus: u64) -> u64 {
        let count = |list: &str| list.split(',').filter(|s| !s.trim().is_empty()).count() as u64;
        match (
            self.args.list(&self.key("--device-ids")),
            env.get("CUDA_VISIBLE_DEVICES"),
        ) {
            (Some(ids), _) => ids.iter().map(|i| count(i)).sum(),
            (None, Some(devices)) => count(&devices),
            (None, None) => node_gpus,
        }
    }

    /// The options given, by dest, with Python's repr of their values.
    fn given(&self) -> Vec<(String, String)> {
        self.args
            .given
            .iter()
            .map(|dest| {
                let value = self
                    .args
                    .values
                    .get(dest)
                    .map(value_repr)
                    .unwrap_or_default();
                (dest.clone(), value)
            })
            .collect()
    }
}
