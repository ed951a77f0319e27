//! How each engine dies: the output tail and exit status of every failure
//! the simulator reproduces. Supervisors show these tails to operators and
//! classify them, so the last lines are the engines' own text.

use crate::logs::Logger;
use crate::persona::Engine;

const PY: &str = "/usr/local/lib/python3.12/dist-packages";

/// A failure the engines report, with the values their messages carry.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    ModelNotFound(String),
    /// The tokenizer directory given cannot be loaded.
    Tokenizer {
        dir: String,
        reason: String,
    },
    UnsupportedArch(String),
    HeadsNotDivisible {
        heads: u64,
        tp: u64,
    },
    WorldTooLarge {
        world: u64,
        gpus: u64,
    },
    NodeRankOutOfRange {
        rank: u64,
        nnodes: u64,
    },
    NnodesDoesNotDivide {
        world: u64,
        nnodes: u64,
    },
    NoGpus,
    /// A CUDA allocation failed; GiB figures as PyTorch prints them.
    CudaOom {
        tried_gib: f64,
        total_gib: f64,
        free_gib: f64,
    },
    NoKvCache,
    KvTooSmall {
        max_len: u64,
        need_gib: f64,
        avail_gib: f64,
        est_len: u64,
    },
    FreeMemory {
        free_gib: f64,
        total_gib: f64,
        util: f64,
    },
    PortInUse {
        host: String,
        port: u16,
    },
    RendezvousPortInUse {
        port: u16,
    },
    /// The KV event publisher could not bind its socket.
    KvEventsBind {
        endpoint: String,
    },
    /// SGLang: a scheduler process was killed (host OOM killer).
    SchedulerKilled,
    /// SGLang asked for more GPUs than the node shows.
    InvalidDeviceOrdinal,
    /// vLLM 0.34: no engine came up within `VLLM_ENGINE_READY_TIMEOUT_S`.
    EngineReadyTimeout(u64),
    /// The rank could not join its replica's rendezvous.
    Rendezvous(String),
    /// The operating system refused to start a worker process.
    WorkerSpawn(String),
}

/// How the process ends after printing its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exit(i32),
    /// Killed by a signal (SGLang kills its own process tree with SIGKILL).
    Signal(i32),
}

impl Failure {
    /// The Python exception line that ends the traceback.
    pub fn exception(&self, engine: Engine) -> String {
        match self {
            Failure::ModelNotFound(name) => match engine {
                Engine::Vllm => format!(
                    "ValueError: Invalid repository ID or local directory specified: '{name}'.\nPlease verify the following requirements:\n1. Provide a valid Hugging Face repository ID.\n2. Specify a local directory that contains a recognized configuration file.\n   - For Hugging Face models: ensure the presence of a 'config.json'.\n   - For Mistral models: ensure the presence of a 'params.json'.\n3. For GGUF: pass the local path of the GGUF file."
                ),
                Engine::Sglang => format!(
                    "OSError: {name} is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`"
                ),
            },
            Failure::Tokenizer { dir, reason } => format!(
                "OSError: Can't load tokenizer for '{dir}'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name. Otherwise, make sure '{dir}' is the correct path to a directory containing all relevant files for a PreTrainedTokenizerFast tokenizer. ({reason})"
            ),
            Failure::UnsupportedArch(arch) => format!(
                "ValueError: Model architectures ['{arch}'] are not supported for now. Supported architectures: {}",
                format_list(crate::models::SUPPORTED_ARCHITECTURES)
            ),
            Failure::HeadsNotDivisible { heads, tp } => match engine {
                Engine::Vllm => format!(
                    "ValueError: Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
                ),
                Engine::Sglang => format!("AssertionError: {heads} is not divisible by {tp}"),
            },
            Failure::WorldTooLarge { world, gpus } => format!(
                "ValueError: World size ({world}) is larger than the number of available GPUs ({gpus}) in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing, set '--nnodes' appropriately."
            ),
            Failure::NodeRankOutOfRange { rank, nnodes } => {
                format!("ValueError: node_rank ({rank}) must be in the range [0, {nnodes}) when nnodes is {nnodes}.")
            }
            Failure::NnodesDoesNotDivide { world, nnodes } => {
                format!("ValueError: world_size ({world}) must be divisible by nnodes ({nnodes}).")
            }
            Failure::NoGpus => "RuntimeError: No CUDA GPUs are available".into(),
            Failure::CudaOom { tried_gib, total_gib, free_gib } => format!(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2} GiB. GPU 0 has a total capacity of {total_gib:.2} GiB of which {free_gib:.2} GiB is free. Including non-PyTorch memory, this process has {:.2} GiB memory in use. Of the allocated memory {:.2} GiB is allocated by PyTorch, and 0.00 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
                total_gib - free_gib,
                total_gib - free_gib
            ),
            Failure::NoKvCache => match engine {
                Engine::Vllm => "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.".into(),
                Engine::Sglang => "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.".into(),
            },
            Failure::KvTooSmall { max_len, need_gib, avail_gib, est_len } => format!(
                "ValueError: To serve at least one request with the models's max seq len ({max_len}), ({need_gib:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({avail_gib:.2} GiB). Based on the available memory, the estimated maximum model length is {est_len}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
            ),
            Failure::FreeMemory { free_gib, total_gib, util } => format!(
                "ValueError: Free memory on device ({free_gib:.2}/{total_gib:.2} GiB) on startup is less than desired GPU memory utilization ({util}, {:.2} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                total_gib * util
            ),
            Failure::PortInUse { .. } => "OSError: [Errno 98] Address already in use".into(),
            Failure::RendezvousPortInUse { port } => format!(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
            ),
            Failure::KvEventsBind { endpoint } => {
                format!("zmq.error.ZMQError: Address already in use (addr='{endpoint}')")
            }
            Failure::SchedulerKilled => "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.".into(),
            Failure::InvalidDeviceOrdinal => "torch.AcceleratorError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1".into(),
            Failure::Rendezvous(reason) => format!("torch.distributed.DistNetworkError: {reason}"),
            Failure::WorkerSpawn(reason) => format!("RuntimeError: cannot start a worker process: {reason}"),
            Failure::EngineReadyTimeout(secs) => format!(
                "TimeoutError: Timed out waiting for engine core processes to start. This can happen if the model is large or the engine cannot reach its peers. Waited {secs} seconds (VLLM_ENGINE_READY_TIMEOUT_S)."
            ),
        }
    }

    /// True where vLLM raises in the API process, before any engine starts.
    fn in_vllm_frontend(&self) -> bool {
        matches!(
            self,
            Failure::ModelNotFound(_)
                | Failure::Tokenizer { .. }
                | Failure::UnsupportedArch(_)
                | Failure::HeadsNotDivisible { .. }
                | Failure::WorldTooLarge { .. }
                | Failure::NodeRankOutOfRange { .. }
                | Failure::NnodesDoesNotDivide { .. }
                | Failure::PortInUse { .. }
                | Failure::EngineReadyTimeout(_)
        )
    }

    /// True where SGLang fails in its main process rather than a scheduler.
    fn in_sglang_main(&self) -> bool {
        matches!(
            self,
            Failure::ModelNotFound(_)
                | Failure::Tokenizer { .. }
                | Failure::PortInUse { .. }
                | Failure::SchedulerKilled
        )
    }
}

fn format_list(items: &[&str]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn prefixed(prefix: &str, text: &str) -> String {
    text.lines().map(|l| format!("{prefix}{l}\n")).collect()
}

fn vllm_frontend_frames(failure: &Failure) -> String {
    let tail = match failure {
        Failure::ModelNotFound(_) => format!(
            "  File \"{PY}/vllm/engine/arg_utils.py\", line 1137, in create_model_config\n    return ModelConfig(\n           ^^^^^^^^^^^^\n  File \"{PY}/vllm/transformers_utils/config.py\", line 452, in get_config\n    raise ValueError(\n"
        ),
        Failure::PortInUse { .. } => format!(
            "  File \"{PY}/vllm/entrypoints/openai/api_server.py\", line 1886, in create_server_socket\n    sock.bind(addr)\n"
        ),
        Failure::EngineReadyTimeout(_) => format!(
            "  File \"{PY}/vllm/v1/engine/utils.py\", line 826, in wait_for_engine_startup\n    raise TimeoutError(\n"
        ),
        _ => format!(
            "  File \"{PY}/vllm/engine/arg_utils.py\", line 1336, in create_engine_config\n    config = VllmConfig(\n             ^^^^^^^^^^^\n  File \"{PY}/vllm/config/__init__.py\", line 3653, in __post_init__\n    self.model_config.verify_with_parallel_config(self.parallel_config)\n  File \"{PY}/vllm/config/model.py\", line 1105, in verify_with_parallel_config\n    raise ValueError(\n"
        ),
    };
    format!(
        "Traceback (most recent call last):\n  File \"/usr/local/bin/vllm\", line 10, in <module>\n    sys.exit(main())\n             ^^^^^^\n  File \"{PY}/vllm/entrypoints/cli/main.py\", line 54, in main\n    args.dispatch_function(args)\n  File \"{PY}/vllm/entrypoints/cli/serve.py\", line 57, in cmd\n    uvloop.run(run_server(args))\n  File \"{PY}/vllm/entrypoints/openai/api_server.py\", line 1941, in run_server\n    await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)\n{tail}"
    )
}

const VLLM_CORE_FRAMES: &str = "Traceback (most recent call last):\n  File \"PY/vllm/v1/engine/core.py\", line 699, in run_engine_core\n    engine_core = EngineCoreProc(*args, **kwargs)\n                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File \"PY/vllm/v1/engine/core.py\", line 498, in __init__\n    super().__init__(vllm_config, executor_class, log_stats,\n  File \"PY/vllm/v1/engine/core.py\", line 92, in __init__\n    self._initialize_kv_caches(vllm_config)\n  File \"PY/vllm/v1/engine/core.py\", line 190, in _initialize_kv_caches\n    kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,\n";

/// Prints the tail of `failure` for `log`'s persona and says how to end.
pub fn report(log: &Logger, failure: &Failure) -> Ending {
    let engine = log.persona.engine;
    let exception = failure.exception(engine);
    match engine {
        Engine::Vllm if failure.in_vllm_frontend() => {
            let prefix = format!("(APIServer pid={}) ", log.api_pid);
            log.raw_err(&prefixed(
                &prefix,
                &format!("{}{exception}", vllm_frontend_frames(failure)),
            ));
            Ending::Exit(1)
        }
        Engine::Vllm => {
            let core_frames = VLLM_CORE_FRAMES.replace("PY", PY);
            log.core("ERROR", "core.py:708", "EngineCore failed to start.");
            for line in format!("{core_frames}{exception}").lines() {
                log.core("ERROR", "core.py:708", line);
            }
            log.raw_err(&format!(
                "Process EngineCore_DP0:\nTraceback (most recent call last):\n  File \"/usr/lib/python3.12/multiprocessing/process.py\", line 314, in _bootstrap\n    self.run()\n  File \"/usr/lib/python3.12/multiprocessing/process.py\", line 108, in run\n    self._target(*self._args, **self._kwargs)\n  File \"{PY}/vllm/v1/engine/core.py\", line 712, in run_engine_core\n    raise e\n{exception}\n"
            ));
            let prefix = format!("(APIServer pid={}) ", log.api_pid);
            let api = format!(
                "Traceback (most recent call last):\n  File \"/usr/local/bin/vllm\", line 10, in <module>\n    sys.exit(main())\n             ^^^^^^\n  File \"{PY}/vllm/entrypoints/cli/main.py\", line 54, in main\n    args.dispatch_function(args)\n  File \"{PY}/vllm/entrypoints/cli/serve.py\", line 57, in cmd\n    uvloop.run(run_server(args))\n  File \"{PY}/vllm/v1/engine/utils.py\", line 885, in wait_for_engine_startup\n    raise RuntimeError(\"Engine core initialization failed. \"\nRuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore_DP0': 1}}"
            );
            log.raw_err(&prefixed(&prefix, &api));
            Ending::Exit(1)
        }
        Engine::Sglang if failure.in_sglang_main() => {
            let frames = match failure {
                Failure::SchedulerKilled => format!(
                    "  File \"{PY}/sglang/srt/entrypoints/engine.py\", line 912, in _launch_subprocesses\n    raise RuntimeError(\n"
                ),
                _ => format!(
                    "  File \"{PY}/sglang/srt/server_args.py\", line 3688, in prepare_server_args\n    return ServerArgs.from_cli_args(raw_args)\n  File \"{PY}/sglang/srt/utils/hf_transformers_utils.py\", line 241, in get_config\n    config = AutoConfig.from_pretrained(\n"
                ),
            };
            log.raw_err(&format!(
                "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n  File \"<frozen runpy>\", line 88, in _run_code\n  File \"{PY}/sglang/launch_server.py\", line 32, in <module>\n    launch_server(server_args)\n{frames}{exception}\n"
            ));
            Ending::Exit(1)
        }
        Engine::Sglang => {
            log.sglang(
                Some(0),
                &format!(
                    "Scheduler hit an exception: Traceback (most recent call last):\n  File \"{PY}/sglang/srt/managers/scheduler.py\", line 2941, in run_scheduler_process\n    scheduler = Scheduler(\n                ^^^^^^^^^^\n  File \"{PY}/sglang/srt/model_executor/model_runner.py\", line 318, in initialize\n    self.init_memory_pool(\n{exception}\n"
                ),
            );
            log.sglang(
                None,
                "Received sigquit from a child process. It usually means the child failed.",
            );
            Ending::Signal(libc::SIGKILL)
        }
    }
}
