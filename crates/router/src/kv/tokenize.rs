//! A request's prompt as token ids, asked of one of the model's engines
//! (`POST /tokenize`, which vLLM and SGLang both serve with the chat
//! template applied), so the index is looked up with the very tokens the
//! engine will cache.

use std::time::Duration;

use hyper::Method;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use llmgw_tokenizer::PromptFields;
use serde::{Deserialize, Serialize};

use crate::upstream::Upstream;

/// `/tokenize`'s body: the engine's name for the model, then the request's
/// fields that decide its tokens, as the client wrote them.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(flatten)]
    request: &'a PromptFields<'a>,
}

/// The `/tokenize` body for the engine serving `model`; none for a request
/// with neither `messages` nor `prompt` (nothing to tokenize).
fn body(request: &PromptFields<'_>, model: &str) -> Option<Vec<u8>> {
    if request.is_empty() {
        return None;
    }
    serde_json::to_vec(&Body { model, request }).ok()
}

#[derive(Deserialize)]
struct Tokens {
    tokens: Vec<u32>,
}

/// The prompt's token ids from the engine at `authority`; none when the
/// engine cannot say (no `/tokenize`, an error, too slow).
pub async fn tokenize(
    upstream: &Upstream,
    authority: &str,
    model: &str,
    request: &PromptFields<'_>,
    within: Duration,
) -> Option<Vec<u32>> {
    let body = body(request, model)?;
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let (status, answer) = upstream
        .fetch(
            &Method::POST,
            authority,
            "/tokenize",
            &headers,
            &body,
            within,
        )
        .await
        .ok()?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice::<Tokens>(&answer)
        .ok()
        .map(|t| t.tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_decides_the_tokens_is_sent() {
        let client = br#"{"model": "alias", "stream": true, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}"#;
        let request: PromptFields<'_> = serde_json::from_slice(client).unwrap();
        let sent: serde_json::Value =
            serde_json::from_slice(&body(&request, "qwen").unwrap()).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})
        );
        let embeddings: PromptFields<'_> = serde_json::from_slice(br#"{"input": "x"}"#).unwrap();
        assert!(body(&embeddings, "qwen").is_none());
    }
}
