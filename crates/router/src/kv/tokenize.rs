//! A request's prompt as token ids, asked of one of the model's engines
//! (`POST /tokenize`, which vLLM and SGLang both serve with the chat
//! template applied), so the index is looked up with the very tokens the
//! engine will cache.

use std::time::Duration;

use hyper::Method;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::upstream::Upstream;

/// The fields of a chat or completion request that decide its tokens,
/// borrowed from the client's body as written and written back unparsed.
#[derive(Deserialize, Serialize)]
pub struct TokenizeRequest<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    add_generation_prompt: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    continue_final_message: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
}

/// `/tokenize`'s body: the engine's name for the model, then those fields.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(flatten)]
    request: &'a TokenizeRequest<'a>,
}

impl TokenizeRequest<'_> {
    /// The `/tokenize` body for the engine serving `model`; none for a
    /// request with neither `messages` nor `prompt` (nothing to tokenize).
    fn body(&self, model: &str) -> Option<Vec<u8>> {
        if self.messages.is_none() && self.prompt.is_none() {
            return None;
        }
        serde_json::to_vec(&Body {
            model,
            request: self,
        })
        .ok()
    }
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
    request: &TokenizeRequest<'_>,
    within: Duration,
) -> Option<Vec<u32>> {
    let body = request.body(model)?;
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
        let request: TokenizeRequest<'_> = serde_json::from_slice(client).unwrap();
        let body: serde_json::Value =
            serde_json::from_slice(&request.body("qwen").unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})
        );
        let embeddings: TokenizeRequest<'_> = serde_json::from_slice(br#"{"input": "x"}"#).unwrap();
        assert!(embeddings.body("qwen").is_none());
    }
}
