//! Health and load probes against an engine's own HTTP endpoints. A plain
//! HTTP/1.0 GET is all they need, and it keeps "connection refused" (a vLLM
//! still loading) apart from an HTTP status (SGLang's 503 warm-up).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What one probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Nothing listens yet.
    Refused,
    /// An HTTP answer with this status and body.
    Answer { status: u16, body: String },
    /// Timed out, reset, or not HTTP.
    Broken(String),
}

/// Largest body read (a vLLM /metrics page is tens of kilobytes).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// `GET url` where url is `http://host:port/path`.
pub async fn get(url: &str, timeout: Duration) -> Probe {
    request("GET", url, timeout).await
}

/// `POST url` with an empty body: vLLM's sleep and wake endpoints.
pub async fn post(url: &str, timeout: Duration) -> Probe {
    request("POST", url, timeout).await
}

async fn request(method: &str, url: &str, timeout: Duration) -> Probe {
    match tokio::time::timeout(timeout, request_inner(method, url)).await {
        Ok(p) => p,
        Err(_) => Probe::Broken(format!("no answer within {timeout:?}")),
    }
}

async fn request_inner(method: &str, url: &str) -> Probe {
    let Some(rest) = url.strip_prefix("http://") else {
        return Probe::Broken(format!("not an http:// URL: {url}"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = match TcpStream::connect(authority).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Err(e) => return Probe::Broken(format!("connect {authority}: {e}")),
    };
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: */*\r\nContent-Length: 0\r\n\r\n"
    );
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Probe::Broken(format!("write: {e}"));
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_BODY {
                    break;
                }
            }
            Err(e) if buf.is_empty() => return Probe::Broken(format!("read: {e}")),
            Err(_) => break,
        }
    }
    parse_response(&buf)
}

/// vLLM's `GET /is_sleeping` answer: `{"is_sleeping": true}`.
pub fn is_sleeping(body: &str) -> Result<bool, String> {
    let value: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| format!("/is_sleeping answered something other than JSON: {e}"))?;
    value["is_sleeping"]
        .as_bool()
        .ok_or_else(|| format!("/is_sleeping answered without `is_sleeping`: {body}"))
}

fn parse_response(buf: &[u8]) -> Probe {
    let text = String::from_utf8_lossy(buf);
    let Some(status_line) = text.lines().next() else {
        return Probe::Broken("empty answer".into());
    };
    let mut parts = status_line.split_whitespace();
    let status = match (
        parts.next(),
        parts.next().and_then(|s| s.parse::<u16>().ok()),
    ) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => code,
        _ => return Probe::Broken(format!("not HTTP: {status_line:?}")),
    };
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Probe::Answer { status, body }
}

/// Requests the engine is still working on, from its Prometheus page: vLLM
/// `vllm:num_requests_running` + `vllm:num_requests_waiting`, SGLang
/// `sglang:num_running_reqs` + `sglang:num_queue_reqs`, summed over label
/// sets. `None` when the page has none of them.
pub fn requests_in_flight(metrics: &str) -> Option<f64> {
    const NAMES: [&str; 4] = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    ];
    let mut total = None;
    for line in metrics.lines() {
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if !NAMES.contains(&&line[..name_end]) {
            continue;
        }
        let value = line
            .rsplit_once('}')
            .map_or(&line[name_end..], |(_, v)| v)
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// Whether an engine's `/v1/models` answer lists `model`; if not, what it
/// serves instead.
pub fn lists_model(body: &str, model: &str) -> Result<(), String> {
    let listed: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| format!("/v1/models answered something that is not JSON: {e}"))?;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .map(|data| data.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    if ids.contains(&model) {
        Ok(())
    } else {
        Err(format!(
            "the engine answering on this port serves {ids:?}, not `{model}`: another process holds the port"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_list_names_the_engine_that_answered() {
        let body = r#"{"object":"list","data":[{"id":"qwen","object":"model"},{"id":"q","object":"model"}]}"#;
        assert_eq!(lists_model(body, "q"), Ok(()));
        let other = lists_model(body, "llama").unwrap_err();
        assert!(other.contains(r#"["qwen", "q"]"#), "{other}");
        assert!(other.contains("another process holds the port"), "{other}");
        assert!(lists_model("<html>", "qwen").is_err());
    }

    #[test]
    fn in_flight_sums_running_and_waiting_of_either_engine() {
        let vllm = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\nvllm:num_requests_running_total 99\n";
        assert_eq!(requests_in_flight(vllm), Some(5.0));
        let sglang = "sglang:num_running_reqs{model_name=\"m\",tp_rank=\"0\"} 0.0\nsglang:num_queue_reqs{model_name=\"m\",tp_rank=\"0\"} 0.0\n";
        assert_eq!(requests_in_flight(sglang), Some(0.0));
        assert_eq!(requests_in_flight("other 1\n"), None);
    }

    #[test]
    fn responses_are_split_into_status_and_body() {
        let p = parse_response(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(
            p,
            Probe::Answer {
                status: 503,
                body: String::new()
            }
        );
        assert!(matches!(parse_response(b"SSH-2.0"), Probe::Broken(_)));
    }

    #[tokio::test]
    async fn a_closed_port_is_refused() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let p = get(
            &format!("http://127.0.0.1:{port}/health"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(p, Probe::Refused);
    }
}
