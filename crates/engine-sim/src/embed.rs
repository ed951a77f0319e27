//! `/v1/embeddings` for embedding models: deterministic unit vectors of the
//! model's hidden size, so that equal inputs embed equally.

use serde::Deserialize;

use crate::persona::Engine;
use crate::plan::Rejection;
use crate::rng::SplitMix;
use crate::state::EngineState;
use crate::wire;

#[derive(Deserialize)]
struct EmbeddingRequest {
    #[serde(default)]
    model: Option<String>,
    input: Option<serde_json::Value>,
}

fn inputs(value: &serde_json::Value) -> Vec<String> {
    match value {
        serde_json::Value::Array(items) if items.iter().all(|i| !i.is_number()) => {
            items.iter().map(|i| i.to_string()).collect()
        }
        other => vec![other.to_string()],
    }
}

/// Builds the response body, or the engine's error for a bad request.
pub fn respond(state: &EngineState, body: &[u8]) -> Result<String, Rejection> {
    let request: EmbeddingRequest = serde_json::from_slice(body)
        .map_err(|e| Rejection::bad_request(format!("JSON decode error: {e}")))?;
    let model = request.model.unwrap_or_default();
    if !model.is_empty() && !state.cfg.served_names.contains(&model) {
        return Err(Rejection {
            status: 404,
            message: format!("The model `{model}` does not exist."),
            kind: "NotFoundError",
        });
    }
    let input = request.input.ok_or_else(|| {
        Rejection::bad_request(
            "[{'type': 'missing', 'loc': ('body', 'input'), 'msg': 'Field required'}]",
        )
    })?;
    let dim = state.embedding_dim.unwrap_or(384) as usize;
    let mut data = Vec::new();
    let mut prompt_tokens = 0;
    for (index, text) in inputs(&input).iter().enumerate() {
        prompt_tokens += (text.len() as u64).div_ceil(4).max(1);
        let seed = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut rng = SplitMix::new(seed);
        let raw: Vec<f64> = (0..dim).map(|_| rng.unit() * 2.0 - 1.0).collect();
        let norm = raw
            .iter()
            .map(|v| v * v)
            .sum::<f64>()
            .sqrt()
            .max(f64::MIN_POSITIVE);
        let values: Vec<String> = raw.iter().map(|v| format!("{:.6}", v / norm)).collect();
        data.push(format!(
            "{{\"index\":{index},\"object\":\"embedding\",\"embedding\":[{}]}}",
            values.join(",")
        ));
    }
    let name = if model.is_empty() {
        state.cfg.first_name().to_string()
    } else {
        model
    };
    let created = state.created_unix;
    let id = format!(
        "embd-{:032x}",
        u128::from(state.cfg.knobs.seed) ^ u128::from(created)
    );
    let usage = match state.cfg.persona.engine {
        Engine::Vllm => format!(
            "{{\"prompt_tokens\":{prompt_tokens},\"total_tokens\":{prompt_tokens},\"completion_tokens\":0,\"prompt_tokens_details\":null}}"
        ),
        Engine::Sglang => format!(
            "{{\"prompt_tokens\":{prompt_tokens},\"total_tokens\":{prompt_tokens},\"completion_tokens\":0,\"prompt_tokens_details\":null,\"reasoning_tokens\":0}}"
        ),
    };
    Ok(format!(
        "{{\"id\":{},\"object\":\"list\",\"created\":{created},\"model\":{},\"data\":[{}],\"usage\":{usage}}}",
        wire::js(&id),
        wire::js(&name),
        data.join(",")
    ))
}
