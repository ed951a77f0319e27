//! HTTP/1.1 on the wire: the request written as one buffer, the response
//! head parsed with `httparse`, and how the body that follows is framed.

use std::io::Write;

use bytes::BytesMut;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode};

use super::UpstreamError;

/// Headers an engine's answer carries are few; more is a broken engine.
const MAX_HEADERS: usize = 64;

/// How the body after a response head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// No length and not chunked: the body ends when the engine closes.
    UntilClose,
}

/// A parsed response head.
pub(crate) struct Head {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request afterwards.
    pub keep_alive: bool,
}

/// The request line, `host`, the caller's headers, `content-length` and
/// the body, in one buffer so that it leaves in one write.
pub(crate) fn encode_request(
    method: &Method,
    authority: &str,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    let mut out = Vec::with_capacity(64 + path.len() + authority.len() + header_bytes + body.len());
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || method == Method::POST || method == Method::PUT {
        let _ = write!(out, "content-length: {}\r\n", body.len());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Interim (1xx) answers one response may carry before its head; an engine
/// sending them without end would otherwise hold the request until its
/// deadline.
const MAX_INTERIM: u32 = 8;

/// Parses a response head from the front of `buffer` and removes it; None
/// while the head is incomplete. Interim (1xx) answers are skipped and
/// counted in `interim`.
pub(crate) fn take_head(
    buffer: &mut BytesMut,
    no_body: bool,
    interim: &mut u32,
) -> Result<Option<Head>, UpstreamError> {
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        let length = match parsed.parse(buffer) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(UpstreamError::Protocol(format!("response head: {e}"))),
        };
        let code = parsed.code.unwrap_or_default();
        let status = StatusCode::from_u16(code)
            .map_err(|_| UpstreamError::Protocol(format!("status code {code}")))?;
        if status.is_informational() {
            *interim += 1;
            if *interim > MAX_INTERIM {
                return Err(UpstreamError::Protocol(format!(
                    "more than {MAX_INTERIM} interim (1xx) answers before the response"
                )));
            }
            let _ = buffer.split_to(length);
            continue;
        }
        let http11 = parsed.version == Some(1);
        let mut headers = HeaderMap::with_capacity(parsed.headers.len());
        let mut connection_close = !http11;
        let mut length_header = None;
        let mut chunked = None;
        for header in parsed.headers.iter() {
            let name = HeaderName::from_bytes(header.name.as_bytes())
                .map_err(|_| UpstreamError::Protocol(format!("header name {:?}", header.name)))?;
            let value = HeaderValue::from_bytes(header.value)
                .map_err(|_| UpstreamError::Protocol(format!("value of header {}", header.name)))?;
            if name == hyper::header::CONNECTION {
                let text = value.to_str().unwrap_or_default().to_ascii_lowercase();
                if text.contains("close") {
                    connection_close = true;
                } else if text.contains("keep-alive") {
                    connection_close = false;
                }
            } else if name == hyper::header::CONTENT_LENGTH {
                let n = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| UpstreamError::Protocol(format!("content-length {value:?}")))?;
                if length_header.is_some_and(|m| m != n) {
                    return Err(UpstreamError::Protocol(
                        "two different content-length headers".to_string(),
                    ));
                }
                length_header = Some(n);
            } else if name == hyper::header::TRANSFER_ENCODING {
                let last = value.to_str().unwrap_or_default().rsplit(',').next();
                chunked = Some(last.is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked")));
            }
            headers.append(name, value);
        }
        if chunked.is_some() && length_header.is_some() {
            // Both framings named: the transfer coding wins, the length is
            // wrong for what the client will get, and the connection cannot
            // be trusted with another request (RFC 9112, section 6.3).
            headers.remove(hyper::header::CONTENT_LENGTH);
            connection_close = true;
        }
        let framing =
            if no_body || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
                Framing::Empty
            } else {
                match (chunked, length_header) {
                    (Some(true), _) => Framing::Chunked,
                    (Some(false), _) => Framing::UntilClose,
                    (None, Some(n)) => Framing::Length(n),
                    (None, None) => Framing::UntilClose,
                }
            };
        let _ = buffer.split_to(length);
        return Ok(Some(Head {
            status,
            headers,
            keep_alive: !connection_close && framing != Framing::UntilClose,
            framing,
        }));
    }
}
