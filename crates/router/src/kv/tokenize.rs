//! A request's prompt as token ids, asked of one of the model's engines
//! (`POST /tokenize`, which vLLM and SGLang both serve with the chat
//! template applied), so the index is looked up with the very tokens the
//! engine will cache.

use std::time::Duration;

use hyper::Method;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::upstream::Upstream;

/// The fields of a chat or completion request that decide its tokens.
#[derive(Deserialize)]
pub struct TokenizeRequest<'a> {
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    add_generation_prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    continue_final_message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
}

impl TokenizeRequest<'_> {
    /// The `/tokenize` body for the engine serving `model`.
    fn body(&self, model: &str) -> Option<Vec<u8>> {
        let mut body = serde_json::Map::new();
        body.insert("model".into(), serde_json::Value::String(model.into()));
        let fields = [
            ("messages", self.messages),
            ("prompt", self.prompt),
            ("add_generation_prompt", self.add_generation_prompt),
            ("continue_final_message", self.continue_final_message),
            ("chat_template_kwargs", self.chat_template_kwargs),
            ("tools", self.tools),
        ];
        if self.messages.is_none() && self.prompt.is_none() {
            return None;
        }
        for (key, value) in fields {
            if let Some(raw) = value {
                body.insert(key.into(), serde_json::from_str(raw.get()).ok()?);
            }
        }
        serde_json::to_vec(&body).ok()
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
