//! Reads only what routing needs from a request body (`model`, `stream`, and
//! the start of the prompt) without building a JSON tree; the body is
//! forwarded byte for byte, so unknown fields pass through untouched.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, PartialEq)]
pub struct Peeked<'a> {
    pub model: Cow<'a, str>,
    pub stream: bool,
    /// The prompt's raw JSON text (`messages`, `prompt` or `input`), for
    /// prefix affinity; raw text is a stable key and costs no decoding.
    pub prompt: Option<&'a str>,
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PeekError {
    #[error("We could not parse the JSON body of your request: {0}")]
    Malformed(String),
    #[error("you must provide a model parameter")]
    MissingModel,
}

pub fn peek(body: &[u8]) -> Result<Peeked<'_>, PeekError> {
    // serde_json reads the whole document, so a truncated or invalid body is
    // refused here even though most of it is skipped.
    let fields: Fields<'_> =
        serde_json::from_slice(body).map_err(|e| PeekError::Malformed(e.to_string()))?;
    let model = fields
        .model
        .filter(|m| !m.is_empty())
        .ok_or(PeekError::MissingModel)?;
    Ok(Peeked {
        model,
        stream: fields.stream.unwrap_or(false),
        prompt: fields
            .messages
            .or(fields.prompt)
            .or(fields.input)
            .map(RawValue::get),
    })
}

/// The first `limit` bytes of the prompt, cut on a character boundary.
pub fn prefix(prompt: &str, limit: usize) -> &str {
    if prompt.len() <= limit {
        return prompt;
    }
    let mut end = limit;
    while !prompt.is_char_boundary(end) {
        end -= 1;
    }
    &prompt[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_stream_and_prompt() {
        let body = br#"{"model":"m\u00e9","stream":true,"messages":[{"role":"user","content":"hi"}],"extra":{"x":[1,2]}}"#;
        let p = peek(body).unwrap();
        assert_eq!(p.model, "m\u{e9}");
        assert!(p.stream);
        assert_eq!(p.prompt, Some(r#"[{"role":"user","content":"hi"}]"#));
    }

    #[test]
    fn refuses_bad_bodies() {
        assert!(matches!(peek(b"{\"model\":"), Err(PeekError::Malformed(_))));
        assert!(matches!(peek(b"[1]"), Err(PeekError::Malformed(_))));
        assert_eq!(peek(b"{\"prompt\":\"x\"}"), Err(PeekError::MissingModel));
        assert_eq!(peek(b"{\"model\":\"\"}"), Err(PeekError::MissingModel));
    }

    #[test]
    fn prefix_cuts_on_char_boundary() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("ab", 10), "ab");
    }
}
