//! The models the simulator knows, with the shapes the engines check.
//!
//! The registry ships as `models.json` inside the binary. A local directory
//! holding a Hugging Face `config.json` is read as well, so a test can invent
//! a model without touching the registry.

use std::path::Path;

use serde::Deserialize;

const REGISTRY: &str = include_str!("../models.json");

/// One model's shape, as in its Hugging Face `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    pub architecture: String,
    pub model_type: String,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    pub num_hidden_layers: u64,
    pub hidden_size: u64,
    pub head_dim: u64,
    pub vocab_size: u64,
    pub max_position_embeddings: u64,
    pub parameter_bytes: u64,
    #[serde(default)]
    pub num_experts: Option<u64>,
    #[serde(default)]
    pub num_experts_per_tok: Option<u64>,
    #[serde(default)]
    pub kv_bytes_per_token_override: Option<u64>,
    pub eos_token_id: u64,
    /// `generate` or `embed`.
    pub task: String,
}

#[derive(Deserialize)]
struct Registry {
    models: Vec<ModelSpec>,
}

/// Architectures the simulated engines can run.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "BertModel",
    "DeepseekV3ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
];

impl ModelSpec {
    /// KV-cache bytes one token occupies on one GPU (bf16 cache).
    pub fn kv_bytes_per_token_per_gpu(&self, tp: u64, pp: u64) -> u64 {
        let layers = self.num_hidden_layers.div_ceil(pp.max(1));
        if let Some(total) = self.kv_bytes_per_token_override {
            return total.div_ceil(pp.max(1));
        }
        // KV heads are replicated when there are fewer of them than TP ranks.
        let kv_heads = (self.num_key_value_heads / tp.max(1)).max(1);
        2 * layers * kv_heads * self.head_dim * 2
    }

    /// Weight bytes resident on one GPU.
    pub fn weight_bytes_per_gpu(&self, tp: u64, pp: u64) -> u64 {
        self.parameter_bytes / (tp.max(1) * pp.max(1))
    }

    pub fn is_embedding(&self) -> bool {
        self.task == "embed"
    }
}

/// Every model in the shipped registry.
pub fn registry() -> Vec<ModelSpec> {
    // The registry is compiled in; a parse failure is a build defect that the
    // unit tests catch, so it is reported rather than silently emptied.
    match serde_json::from_str::<Registry>(REGISTRY) {
        Ok(r) => r.models,
        Err(e) => panic!("models.json shipped with the simulator is invalid: {e}"),
    }
}

/// Finds a model by Hugging Face name, or reads a local model directory.
pub fn find(name: &str) -> Option<ModelSpec> {
    let trimmed = name.trim_end_matches('/');
    if let Some(spec) = registry().into_iter().find(|m| m.name == trimmed) {
        return Some(spec);
    }
    from_local_dir(Path::new(name), name)
}

/// Reads the fields the engines check from a local `config.json`.
fn from_local_dir(dir: &Path, name: &str) -> Option<ModelSpec> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let get = |key: &str| config.get(key).and_then(serde_json::Value::as_u64);
    let heads = get("num_attention_heads")?;
    let hidden = get("hidden_size")?;
    let layers = get("num_hidden_layers")?;
    let vocab = get("vocab_size").unwrap_or(32000);
    // Without a weight index, estimate a dense transformer's size in bf16.
    let estimated_params = 12 * layers * hidden * hidden + 2 * vocab * hidden;
    Some(ModelSpec {
        name: name.to_string(),
        architecture: config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("LlamaForCausalLM")
            .to_string(),
        model_type: config
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("llama")
            .to_string(),
        num_attention_heads: heads,
        num_key_value_heads: get("num_key_value_heads").unwrap_or(heads),
        num_hidden_layers: layers,
        hidden_size: hidden,
        head_dim: get("head_dim").unwrap_or(hidden / heads.max(1)),
        vocab_size: vocab,
        max_position_embeddings: get("max_position_embeddings").unwrap_or(4096),
        parameter_bytes: get("parameter_bytes").unwrap_or(estimated_params * 2),
        num_experts: get("num_experts"),
        num_experts_per_tok: get("num_experts_per_tok"),
        kv_bytes_per_token_override: None,
        eos_token_id: get("eos_token_id").unwrap_or(2),
        task: if config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            == Some("BertModel")
        {
            "embed".into()
        } else {
            "generate".into()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_parses_and_holds_the_required_models() {
        let names: Vec<String> = registry().into_iter().map(|m| m.name).collect();
        for required in [
            "Qwen/Qwen2.5-0.5B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-70B-Instruct",
            "Qwen/Qwen3-235B-A22B",
        ] {
            assert!(
                names.iter().any(|n| n == required),
                "{required} missing from models.json"
            );
        }
    }

    #[test]
    fn llama_8b_kv_per_token_matches_its_shape() {
        let m = find("meta-llama/Llama-3.1-8B-Instruct").unwrap();
        // 2 (K and V) * 32 layers * 8 KV heads * 128 dims * 2 bytes.
        assert_eq!(m.kv_bytes_per_token_per_gpu(1, 1), 131072);
        assert_eq!(m.kv_bytes_per_token_per_gpu(2, 1), 65536);
    }
}
