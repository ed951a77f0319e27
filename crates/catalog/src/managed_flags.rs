//! Engine flags and environment variables that llmgw sets itself. A profile
//! that sets one of them would fight the launch plan (two `--port`s, a TP size
//! that disagrees with the placement), so the catalog refuses it up front.

use crate::model::Engine;

const VLLM_FLAGS: &[&str] = &[
    "--model",
    "--host",
    "--port",
    "--uds",
    "--served-model-name",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--distributed-executor-backend",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--device-ids",
    "--kv-events-config",
];
const VLLM_SHORT_FLAGS: &[(&str, &str)] = &[
    ("-tp", "--tensor-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
    ("-dp", "--data-parallel-size"),
    ("-n", "--nnodes"),
    ("-r", "--node-rank"),
];

const SGLANG_FLAGS: &[&str] = &[
    "--model-path",
    "--model",
    "--host",
    "--port",
    "--served-model-name",
    "--tensor-parallel-size",
    "--tp-size",
    "--pipeline-parallel-size",
    "--pp-size",
    "--data-parallel-size",
    "--dp-size",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--base-gpu-id",
    "--kv-events-config",
];

/// Environment llmgw derives from the placement and the node.
pub const MANAGED_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "VLLM_HOST_IP",
    "VLLM_PORT",
];

/// If `arg` is (or abbreviates) a flag llmgw manages for `engine`, the managed
/// flag's full name. Handles `--flag=value`, `_` for `-`, the engines' short
/// aliases, and argparse's unambiguous prefixes (SGLang's `--tp`).
pub fn managed_flag(engine: Engine, arg: &str) -> Option<&'static str> {
    if !arg.starts_with('-') {
        return None;
    }
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    let long = match engine {
        Engine::Vllm => VLLM_FLAGS,
        Engine::Sglang => SGLANG_FLAGS,
    };
    if !name.starts_with("--") {
        if engine == Engine::Vllm {
            return VLLM_SHORT_FLAGS
                .iter()
                .find(|(s, _)| *s == name)
                .map(|(_, l)| *l);
        }
        return None;
    }
    let normalized = name.replace('_', "-");
    if let Some(flag) = long.iter().find(|f| **f == normalized) {
        return Some(flag);
    }
    // argparse accepts any unambiguous prefix of a long option; a prefix of
    // exactly one managed flag reaches that flag.
    if normalized.len() >= 4 {
        let mut matches = long.iter().filter(|f| f.starts_with(&normalized));
        if let (Some(flag), None) = (matches.next(), matches.next()) {
            return Some(flag);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_every_spelling() {
        assert_eq!(managed_flag(Engine::Vllm, "--port"), Some("--port"));
        assert_eq!(managed_flag(Engine::Vllm, "--port=9000"), Some("--port"));
        assert_eq!(
            managed_flag(Engine::Vllm, "--tensor_parallel_size"),
            Some("--tensor-parallel-size")
        );
        assert_eq!(
            managed_flag(Engine::Vllm, "-tp"),
            Some("--tensor-parallel-size")
        );
        assert_eq!(managed_flag(Engine::Sglang, "--tp"), Some("--tp-size"));
        assert_eq!(managed_flag(Engine::Sglang, "--tp-s"), Some("--tp-size"));
        assert_eq!(
            managed_flag(Engine::Sglang, "--dist-init"),
            Some("--dist-init-addr")
        );
        assert_eq!(managed_flag(Engine::Vllm, "--max-model-len"), None);
        assert_eq!(managed_flag(Engine::Vllm, "8192"), None);
    }
}
