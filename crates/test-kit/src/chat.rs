//! Chat completions as a client sends them, to an engine or a router.

use serde_json::{Value, json};

/// A non-streamed chat completion of `model` at `base` (an engine's or a
/// router's URL); the answer's content, or why there was none. The reason
/// says where it failed, for the chaos suite's records as much as for a
/// test's message: `transport: ...` (no answer at all), `HTTP 503, body
/// cut off: ...`, `HTTP 429: <body>`, `HTTP 200, not JSON (...)`, or
/// `HTTP 200 without content`.
pub async fn chat(http: &reqwest::Client, base: &str, model: &str) -> Result<String, String> {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 8
        }))
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status().as_u16();
    let text = response
        .text()
        .await
        .map_err(|e| format!("HTTP {status}, body cut off: {e}"))?;
    if status != 200 {
        return Err(format!("HTTP {status}: {text}"));
    }
    let body: Value =
        serde_json::from_str(&text).map_err(|e| format!("HTTP 200, not JSON ({e}): {text}"))?;
    body["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("HTTP 200 without content: {text}"))
}

/// A streamed chat completion: the content of every event, once the
/// stream ended with `data: [DONE]`.
pub async fn stream_chat(
    http: &reqwest::Client,
    base: &str,
    model: &str,
) -> Result<String, String> {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "stream": true,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "Hello!"}]
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    if !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("the stream did not end with [DONE]: {text}"));
    }
    let mut content = String::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(chunk) = serde_json::from_str::<Value>(line)
            && let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str()
        {
            content.push_str(piece);
        }
    }
    Ok(content)
}
