//! The load of an engine process: worker processes, distributed init (the
//! multi-node rendezvous or Ray placement), weights, KV cache and CUDA
//! graphs, each with the persona's log lines, pace and failure checks.

use std::time::Duration;

use crate::config::ServeConfig;
use crate::failures::Failure;
use crate::knobs::{Fault, LoadCrash, LoadPhase};
use crate::logs::Logger;
use crate::models::ModelSpec;
use crate::persona::Engine;
use crate::rendezvous::{self, Membership};
use crate::workers::Workers;

const GIB: f64 = (1u64 << 30) as f64;
/// Activation peak and CUDA graphs, reserved before the KV cache is sized.
const OVERHEAD_GIB: f64 = 1.5;

pub(crate) fn hang_at(cfg: &ServeConfig, phase: LoadPhase) -> bool {
    cfg.knobs.faults.contains(&Fault::HangOnLoad(phase))
}

pub(crate) fn crash_at(cfg: &ServeConfig, kind: LoadCrash) -> bool {
    cfg.knobs.faults.contains(&Fault::CrashOnLoad(kind))
}

pub(crate) async fn hang_forever() -> ! {
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

pub(crate) fn share(cfg: &ServeConfig, fraction: f64) -> Duration {
    cfg.knobs.load_time.mul_f64(fraction)
}

/// Everything loading established, for serving.
pub(crate) struct Loaded {
    pub(crate) kv_tokens: u64,
    pub(crate) workers: Workers,
    pub(crate) membership: Option<Membership>,
}

/// The load: workers, distributed init, weights, KV cache, graphs.
pub(crate) async fn load(
    cfg: &ServeConfig,
    log: &mut Logger,
    spec: &ModelSpec,
    arch: &str,
    max_model_len: u64,
    use_ray: bool,
) -> Result<Loaded, Failure> {
    let loading = Loading::new(cfg, spec);
    let workers = loading.spawn_workers(log)?;
    loading.log_engine_init(log, max_model_len);
    loading.check_devices(use_ray)?;
    let membership = loading.distributed_init(log, use_ray).await?;
    let weights_gib = loading.load_weights(log, arch).await?;
    let kv_tokens = loading
        .allocate_kv_cache(log, weights_gib, max_model_len)
        .await?;
    loading
        .capture_cuda_graphs(log, kv_tokens, max_model_len)
        .await;
    tokio::time::sleep(share(cfg, 0.05)).await;
    Ok(Loaded {
        kv_tokens,
        workers,
        membership,
    })
}

/// What every load phase reads: the config, the model, and the memory
/// figures derived from them once.
struct Loading<'a> {
    cfg: &'a ServeConfig,
    spec: &'a ModelSpec,
    vllm: bool,
    /// Processes this node runs (its share of the world).
    local: u64,
    /// The global rank of this node's first GPU.
    first_rank: u64,
    /// One GPU's memory.
    total_gib: f64,
    /// The share of `total_gib` the engine may use.
    budget_gib: f64,
}

impl<'a> Loading<'a> {
    fn new(cfg: &'a ServeConfig, spec: &'a ModelSpec) -> Self {
        let local = cfg.local_world();
        let total_gib = cfg.knobs.gpu_memory_gb;
        Self {
            cfg,
            spec,
            vllm: cfg.persona.engine == Engine::Vllm,
            local,
            first_rank: cfg.node_rank * local,
            total_gib,
            budget_gib: total_gib * cfg.memory_fraction,
        }
    }

    /// A line from the process that loads the model: vLLM's engine core or
    /// SGLang's first scheduler.
    fn scheduler_line(&self, log: &Logger, message: &str) {
        if self.vllm {
            log.core("INFO", "gpu_model_runner.py:2602", message);
        } else {
            log.sglang(Some(self.first_rank as u32), message);
        }
    }

    /// The engine's worker processes, named as `ps` shows the real ones.
    fn spawn_workers(&self, log: &mut Logger) -> Result<Workers, Failure> {
        let cfg = self.cfg;
        let ranks = self.first_rank..self.first_rank + self.local;
        let mut titles: Vec<String> = Vec::new();
        if self.vllm {
            if !cfg.headless {
                titles.push("VLLM::EngineCore_DP0".into());
            }
            if self.local > 1 || cfg.headless {
                titles.extend(ranks.map(|rank| format!("VLLM::Worker_TP{rank}")));
            }
        } else {
            titles.extend(ranks.map(|rank| format!("sglang::scheduler_TP{rank}")));
            if cfg.node_rank == 0 {
                titles.push("sglang::detokenizer".into());
            }
        }
        let workers = Workers::spawn(&titles).map_err(|e| Failure::WorkerSpawn(e.to_string()))?;
        log.core_pid = workers.pids().first().copied().unwrap_or(log.api_pid);
        Ok(workers)
    }

    /// The lines an engine prints before it touches a GPU.
    fn log_engine_init(&self, log: &Logger, max_model_len: u64) {
        let cfg = self.cfg;
        let v = cfg.persona.version_string();
        if !self.vllm {
            log.sglang(
                Some(self.first_rank as u32),
                "Attention backend not explicitly specified. Use flashinfer backend by default.",
            );
            log.sglang(
                Some(self.first_rank as u32),
                "Init torch distributed begin.",
            );
            return;
        }
        if cfg.headless {
            log.api(
                "INFO",
                "serve.py:164",
                &format!(
                    "Launching vLLM (v{v}) headless multiproc executor, with head node address {} for torch.distributed process group.",
                    cfg.rendezvous.clone().unwrap_or_else(|| "127.0.0.1:29501".into())
                ),
            );
        }
        log.core(
            "INFO",
            "core.py:644",
            "Waiting for init message from front-end.",
        );
        log.core(
            "INFO",
            "core.py:77",
            &format!(
                "Initializing a V1 LLM engine (v{v}) with config: model='{m}', speculative_config=None, tokenizer='{m}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len={max_model_len}, download_dir=None, load_format=auto, tensor_parallel_size={}, pipeline_parallel_size={}, data_parallel_size={}, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name={}, enable_prefix_caching=True",
                cfg.tp,
                cfg.pp,
                cfg.dp,
                cfg.first_name(),
                m = cfg.model
            ),
        );
    }

    /// Enough visible GPUs for this node's processes (Ray places vLLM's
    /// workers on other nodes, so it needs only one here).
    fn check_devices(&self, use_ray: bool) -> Result<(), Failure> {
        let visible = self.cfg.visible_gpus;
        if visible == 0 {
            return Err(Failure::NoGpus);
        }
        let placed_here = !self.vllm || !use_ray;
        if placed_here && self.local > visible {
            return Err(Failure::InvalidDeviceOrdinal);
        }
        Ok(())
    }

    /// The multi-node rendezvous, or the Ray placement, or nothing.
    async fn distributed_init(
        &self,
        log: &Logger,
        use_ray: bool,
    ) -> Result<Option<Membership>, Failure> {
        let cfg = self.cfg;
        let membership = if cfg.nnodes > 1 {
            Some(self.rendezvous(log).await?)
        } else {
            if hang_at(cfg, LoadPhase::Distributed) {
                hang_forever().await;
            }
            if use_ray {
                crate::ray::wait_for_placement(cfg, log).await;
                crate::ray::watch_cluster(cfg)
            } else {
                None
            }
        };
        if !self.vllm {
            log.sglang(
                Some(self.first_rank as u32),
                "Init torch distributed ends. mem usage=0.09 GB",
            );
        }
        Ok(membership)
    }

    /// Node 0 hosts the rendezvous and waits for every node; the others
    /// join it.
    async fn rendezvous(&self, log: &Logger) -> Result<Membership, Failure> {
        let cfg = self.cfg;
        let addr = cfg
            .rendezvous
            .clone()
            .unwrap_or_else(|| "127.0.0.1:29501".into());
        if self.vllm {
            log.core(
                "INFO",
                "parallel_state.py:1165",
                &format!(
                    "world_size={} rank={} local_rank=0 distributed_init_method=tcp://{addr} backend=nccl",
                    cfg.world_size(),
                    self.first_rank
                ),
            );
        }
        if hang_at(cfg, LoadPhase::Distributed) {
            hang_forever().await;
        }
        if cfg.node_rank != 0 {
            return rendezvous::join(&addr, cfg.node_rank, cfg.nnodes)
                .await
                .map_err(|e| Failure::Rendezvous(e.to_string()));
        }
        let listener = rendezvous::bind_head(&addr).await.map_err(|e| match e {
            rendezvous::RendezvousError::Bind { port, .. } => Failure::RendezvousPortInUse { port },
            other => Failure::Rendezvous(other.to_string()),
        })?;
        // From 0.12 vLLM gives up on nodes that never come
        // (VLLM_ENGINE_READY_TIMEOUT_S); older releases wait for ever.
        if !(self.vllm && cfg.persona.at_least((0, 12, 0))) {
            return Ok(rendezvous::run_head(listener, cfg.nnodes).await);
        }
        let timeout = std::env::var("VLLM_ENGINE_READY_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(600);
        tokio::time::timeout(
            Duration::from_secs(timeout),
            rendezvous::run_head(listener, cfg.nnodes),
        )
        .await
        .map_err(|_| Failure::EngineReadyTimeout(timeout))
    }

    /// Loads the weights; returns what they take on one GPU, in GiB.
    async fn load_weights(&self, log: &Logger, arch: &str) -> Result<f64, Failure> {
        let cfg = self.cfg;
        let total_gib = self.total_gib;
        let weights_gib = self.spec.weight_bytes_per_gpu(cfg.tp, cfg.pp) as f64 / GIB;
        if crash_at(cfg, LoadCrash::FreeMemory) {
            return Err(if self.vllm {
                Failure::FreeMemory {
                    free_gib: total_gib * 0.5,
                    total_gib,
                    util: cfg.memory_fraction,
                }
            } else {
                Failure::SchedulerKilled
            });
        }
        if self.vllm {
            log.core(
                "INFO",
                "gpu_model_runner.py:2602",
                &format!("Starting to load model {}...", cfg.model),
            );
        } else {
            self.scheduler_line(
                log,
                &format!("Load weight begin. avail mem={:.2} GB", total_gib - 0.5),
            );
        }
        if hang_at(cfg, LoadPhase::Weights) {
            hang_forever().await;
        }
        let weight_time = share(cfg, 0.5);
        tokio::time::sleep(weight_time).await;
        if crash_at(cfg, LoadCrash::Oom) || weights_gib > self.budget_gib {
            let per_layer = weights_gib / self.spec.num_hidden_layers.max(1) as f64;
            return Err(Failure::CudaOom {
                tried_gib: (per_layer * 4.0).max(0.25),
                total_gib,
                free_gib: (total_gib - weights_gib.min(total_gib))
                    .max(0.0)
                    .min(per_layer),
            });
        }
        if self.vllm {
            log.core(
                "INFO",
                "default_loader.py:267",
                &format!(
                    "Loading weights took {:.2} seconds",
                    weight_time.as_secs_f64()
                ),
            );
            log.core(
                "INFO",
                "gpu_model_runner.py:2653",
                &format!(
                    "Model loading took {weights_gib:.4} GiB and {:.6} seconds",
                    weight_time.as_secs_f64()
                ),
            );
        } else {
            self.scheduler_line(
                log,
                &format!(
                    "Load weight end. type={arch}, dtype=torch.bfloat16, avail mem={:.2} GB, mem usage={weights_gib:.2} GB.",
                    total_gib - weights_gib
                ),
            );
        }
        Ok(weights_gib)
    }

    /// Sizes the KV cache from what the weights left; returns its capacity
    /// in tokens, refused when it cannot hold one `max_model_len` request.
    async fn allocate_kv_cache(
        &self,
        log: &Logger,
        weights_gib: f64,
        max_model_len: u64,
    ) -> Result<u64, Failure> {
        let cfg = self.cfg;
        if hang_at(cfg, LoadPhase::KvCache) {
            hang_forever().await;
        }
        tokio::time::sleep(share(cfg, 0.15)).await;
        let kv_gib = self.budget_gib - weights_gib - OVERHEAD_GIB;
        if crash_at(cfg, LoadCrash::KvCache) || kv_gib <= 0.0 {
            return Err(Failure::NoKvCache);
        }
        let per_token = self.spec.kv_bytes_per_token_per_gpu(cfg.tp, cfg.pp).max(1);
        let profiled = (kv_gib * GIB / per_token as f64) as u64;
        let kv_tokens = match cfg.num_gpu_blocks_override {
            Some(blocks) => {
                log.core(
                    "INFO",
                    "gpu_worker.py:311",
                    &format!(
                        "Overriding num_gpu_blocks={} with num_gpu_blocks_override={blocks}",
                        profiled / cfg.block_size as u64
                    ),
                );
                blocks * cfg.block_size as u64
            }
            None => profiled,
        };
        if kv_tokens < max_model_len {
            if self.vllm {
                return Err(Failure::KvTooSmall {
                    max_len: max_model_len,
                    need_gib: max_model_len as f64 * per_token as f64 / GIB,
                    avail_gib: kv_gib,
                    est_len: kv_tokens,
                });
            }
            return Err(Failure::NoKvCache);
        }
        if self.vllm {
            log.core(
                "INFO",
                "gpu_worker.py:298",
                &format!("Available KV cache memory: {kv_gib:.2} GiB"),
            );
            log.core(
                "INFO",
                "kv_cache_utils.py:1087",
                &format!("GPU KV cache size: {} tokens", thousands(kv_tokens)),
            );
            log.core(
                "INFO",
                "kv_cache_utils.py:1091",
                &format!(
                    "Maximum concurrency for {} tokens per request: {:.2}x",
                    thousands(max_model_len),
                    kv_tokens as f64 / max_model_len as f64
                ),
            );
        } else {
            let half = kv_gib / 2.0;
            let avail_gib = self.total_gib - self.budget_gib + OVERHEAD_GIB;
            self.scheduler_line(
                log,
                &format!(
                    "KV Cache is allocated. #tokens: {kv_tokens}, K size: {half:.2} GB, V size: {half:.2} GB"
                ),
            );
            self.scheduler_line(
                log,
                &format!("Memory pool end. avail mem={avail_gib:.2} GB"),
            );
            self.scheduler_line(
                log,
                &format!(
                    "Capture cuda graph begin. This can take up to several minutes. avail mem={avail_gib:.2} GB"
                ),
            );
        }
        Ok(kv_tokens)
    }

    async fn capture_cuda_graphs(&self, log: &Logger, kv_tokens: u64, max_model_len: u64) {
        let cfg = self.cfg;
        let graph_time = share(cfg, 0.2);
        tokio::time::sleep(graph_time).await;
        if self.vllm {
            log.core(
                "INFO",
                "gpu_model_runner.py:3480",
                &format!(
                    "Graph capturing finished in {} secs, took 0.50 GiB",
                    graph_time.as_secs().max(1)
                ),
            );
            return;
        }
        let avail_gib = self.total_gib - self.budget_gib + 1.0;
        self.scheduler_line(
            log,
            &format!(
                "Capture cuda graph end. Time elapsed: {:.2} s. mem usage=0.50 GB. avail mem={avail_gib:.2} GB.",
                graph_time.as_secs_f64(),
            ),
        );
        self.scheduler_line(
            log,
            &format!(
                "max_total_num_tokens={kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests={}, context_len={max_model_len}, available_gpu_mem={avail_gib:.2} GB",
                cfg.max_num_seqs,
            ),
        );
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
