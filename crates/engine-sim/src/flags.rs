//! The option tables of each persona: which flags exist and what they take.

use crate::argparse::{Arity, OptSpec, Parser, ValueKind};
use crate::persona::Persona;

const DTYPES: &[&str] = &["auto", "half", "float16", "bfloat16", "float", "float32"];
const VLLM_BACKENDS: &[&str] = &["ray", "mp", "uni", "external_launcher"];
const VLLM_QUANT: &[&str] = &[
    "aqlm",
    "awq",
    "deepspeedfp",
    "tpu_int8",
    "fp8",
    "ptpc_fp8",
    "fbgemm_fp8",
    "modelopt",
    "modelopt_fp4",
    "marlin",
    "bitblas",
    "gguf",
    "gptq_marlin_24",
    "gptq_marlin",
    "gptq_bitblas",
    "awq_marlin",
    "gptq",
    "compressed-tensors",
    "bitsandbytes",
    "qqq",
    "hqq",
    "experts_int8",
    "neuron_quant",
    "ipex",
    "quark",
    "moe_wna16",
    "torchao",
    "auto-round",
    "rtn",
    "inc",
    "mxfp4",
    "petit_nvfp4",
];
const SGLANG_QUANT: &[&str] = &[
    "awq",
    "fp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp4",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "qoq",
    "w4afp8",
    "mxfp4",
    "compressed-tensors",
];
const LOG_LEVELS: &[&str] = &["debug", "info", "warning", "error", "critical", "trace"];

fn one(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::One, ValueKind::Str)
}
fn int(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::One, ValueKind::Int)
}
fn float(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::One, ValueKind::Float)
}
fn choice(names: &[&'static str], choices: &'static [&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::One, ValueKind::Choice(choices))
}
fn flag(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::Flag, ValueKind::Str)
}
fn boolean(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::BoolOptional, ValueKind::Str)
}
fn many(names: &[&'static str]) -> OptSpec {
    OptSpec::new(names, Arity::OneOrMore, ValueKind::Str)
}

/// The simulator's own knobs, accepted by every persona so that a test can
/// pass them on the engine's command line as well as in the environment.
fn sim_opts() -> Vec<OptSpec> {
    vec![
        one(&["--sim-persona"]),
        one(&["--sim-load-time"]),
        one(&["--sim-ttft"]),
        one(&["--sim-itl"]),
        float(&["--sim-gpu-memory-gb"]),
        one(&["--sim-fault"]),
        int(&["--sim-seed"]),
        int(&["--sim-output-tokens"]),
        int(&["--sim-gpus"]),
    ]
}

/// `vllm serve` for the given release.
pub fn vllm_parser(persona: Persona) -> Parser {
    let mut opts = vec![
        one(&["--host"]),
        int(&["--port"]),
        one(&["--uds"]),
        choice(&["--uvicorn-log-level"], LOG_LEVELS),
        boolean(&["--allow-credentials"]),
        many(&["--api-key"]),
        many(&["--served-model-name"]),
        one(&["--model"]),
        one(&["--tokenizer"]),
        one(&["--revision"]),
        one(&["--tokenizer-revision"]),
        choice(
            &["--tokenizer-mode"],
            &["auto", "slow", "mistral", "custom"],
        ),
        boolean(&["--trust-remote-code"]),
        choice(&["--dtype"], DTYPES),
        int(&["--seed"]),
        one(&["--max-model-len"]),
        choice(&["--quantization", "-q"], VLLM_QUANT),
        boolean(&["--enforce-eager"]),
        int(&["--max-num-seqs"]),
        int(&["--max-num-batched-tokens"]),
        float(&["--gpu-memory-utilization"]),
        float(&["--swap-space"]),
        float(&["--cpu-offload-gb"]),
        one(&["--kv-cache-dtype"]),
        int(&["--block-size"]),
        boolean(&["--enable-prefix-caching"]),
        boolean(&["--enable-chunked-prefill"]),
        int(&["--tensor-parallel-size", "-tp"]),
        int(&["--pipeline-parallel-size", "-pp"]),
        int(&["--data-parallel-size", "-dp"]),
        int(&["--data-parallel-size-local", "-dpl"]),
        one(&["--data-parallel-address", "-dpa"]),
        int(&["--data-parallel-rpc-port", "-dpp"]),
        int(&["--data-parallel-start-rank", "-dpr"]),
        int(&["--data-parallel-rank", "-dpn"]),
        choice(&["--data-parallel-backend", "-dpb"], &["mp", "ray"]),
        boolean(&["--data-parallel-hybrid-lb"]),
        int(&["--api-server-count"]),
        choice(&["--distributed-executor-backend"], VLLM_BACKENDS),
        flag(&["--headless"]),
        boolean(&["--enable-expert-parallel"]),
        boolean(&["--disable-custom-all-reduce"]),
        boolean(&["--disable-log-stats"]),
        boolean(&["--enable-log-requests"]),
        flag(&["--enable-server-load-tracking"]),
        flag(&["--enable-force-include-usage"]),
        one(&["--show-hidden-metrics-for-version"]),
        one(&["--load-format"]),
        one(&["--download-dir"]),
        int(&["--max-logprobs"]),
        one(&["--chat-template"]),
        one(&["--generation-config"]),
        one(&["--override-generation-config"]),
        one(&["--hf-overrides"]),
        one(&["--compilation-config", "-O"]),
        one(&["--speculative-config"]),
        one(&["--tool-call-parser"]),
        flag(&["--enable-auto-tool-choice"]),
        one(&["--reasoning-parser"]),
        one(&["--limit-mm-per-prompt"]),
        boolean(&["--enable-lora"]),
        int(&["--max-loras"]),
        int(&["--max-lora-rank"]),
        many(&["--lora-modules"]),
        one(&["--root-path"]),
        one(&["--ssl-keyfile"]),
        one(&["--ssl-certfile"]),
        one(&["--config"]),
        one(&["--response-role"]),
        one(&["--otlp-traces-endpoint"]),
    ];
    if persona.at_least((0, 11, 1)) {
        opts.push(int(&["--nnodes", "-n"]));
        opts.push(int(&["--node-rank", "-r"]));
        opts.push(one(&["--master-addr"]));
        opts.push(int(&["--master-port"]));
    }
    if persona.at_least((0, 12, 0)) {
        // In later releases the old switch is the negative form of the
        // boolean pair; in 0.11 it is a deprecated store_true of its own.
        opts.push(int(&["--shutdown-timeout"]));
        opts.push(one(&["--device-ids"]));
        opts.retain(|o| o.dest != "enable-log-requests");
        let mut pair = flag(&["--enable-log-requests"]);
        pair.dest = "enable-log-requests";
        opts.push(pair);
        let mut negative = flag(&["--disable-log-requests"]);
        negative.dest = "disable-log-requests";
        opts.push(negative);
    } else {
        opts.push(flag(&["--disable-log-requests"]));
    }
    opts.extend(sim_opts());
    Parser {
        prog: "vllm serve".into(),
        usage: "vllm serve [model_tag] [options]".into(),
        opts,
        positional: Some("model_tag"),
        underscores_to_dashes: true,
    }
}

/// `python -m sglang.launch_server`.
pub fn sglang_parser(_persona: Persona) -> Parser {
    let mut model = one(&["--model-path", "--model"]);
    model.required = true;
    let mut opts = vec![
        model,
        one(&["--tokenizer-path"]),
        one(&["--host"]),
        int(&["--port"]),
        one(&["--revision"]),
        flag(&["--trust-remote-code"]),
        choice(&["--dtype"], DTYPES),
        choice(&["--quantization"], SGLANG_QUANT),
        one(&["--kv-cache-dtype"]),
        int(&["--context-length"]),
        one(&["--served-model-name"]),
        one(&["--chat-template"]),
        float(&["--mem-fraction-static"]),
        int(&["--max-running-requests"]),
        int(&["--max-total-tokens"]),
        int(&["--chunked-prefill-size"]),
        one(&["--schedule-policy"]),
        int(&["--tensor-parallel-size", "--tp-size"]),
        int(&["--pipeline-parallel-size", "--pp-size"]),
        int(&["--data-parallel-size", "--dp-size"]),
        int(&["--expert-parallel-size", "--ep-size"]),
        int(&["--nnodes"]),
        int(&["--node-rank"]),
        one(&["--dist-init-addr", "--nccl-init-addr"]),
        int(&["--dist-timeout"]),
        int(&["--base-gpu-id"]),
        int(&["--random-seed"]),
        float(&["--watchdog-timeout"]),
        choice(&["--log-level"], LOG_LEVELS),
        flag(&["--log-requests"]),
        flag(&["--enable-metrics"]),
        one(&["--api-key"]),
        flag(&["--skip-server-warmup"]),
        flag(&["--disable-radix-cache"]),
        flag(&["--disable-cuda-graph"]),
        int(&["--cuda-graph-max-bs"]),
        flag(&["--enable-dp-attention"]),
        flag(&["--enable-torch-compile"]),
        flag(&["--enable-cache-report"]),
        flag(&["--enable-mixed-chunk"]),
        one(&["--attention-backend"]),
        one(&["--load-format"]),
        one(&["--download-dir"]),
        one(&["--tool-call-parser"]),
        one(&["--reasoning-parser"]),
        one(&["--grammar-backend"]),
        one(&["--device"]),
        int(&["--stream-interval"]),
        int(&["--decode-log-interval"]),
        one(&["--speculative-algorithm"]),
        one(&["--model-impl"]),
        flag(&["--show-time-cost"]),
    ];
    opts.extend(sim_opts());
    Parser {
        prog: "launch_server.py".into(),
        usage: String::new(),
        opts,
        positional: None,
        underscores_to_dashes: false,
    }
}
