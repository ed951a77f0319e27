//! A client's request head, parsed with `httparse` straight from the read
//! buffer (header values are slices of it, not copies), and how the body
//! after it is framed (RFC 9112 §6). Framing that could be read two ways
//! (`transfer-encoding` with `content-length`, differing lengths) is
//! refused: a proxy that guesses is a proxy that can be smuggled through.

use bytes::{Bytes, BytesMut};
use hyper::header::{
    CONNECTION, CONTENT_LENGTH, EXPECT, HeaderMap, HeaderName, HeaderValue, TRANSFER_ENCODING,
};
use hyper::{Method, StatusCode, Uri, Version};

use crate::framing::{Broken, Decoder, Step};

/// A request head longer than this is refused with 431.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// More headers than this is refused with 431.
const MAX_HEADERS: usize = 100;

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct Head {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: BodyFraming,
    /// Whether the client will send another request on this connection.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending its body.
    pub expect_continue: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    Length(u64),
    Chunked,
}

/// Why the server side refused a request itself (its head, its body's
/// framing, or its pace); the connection closes after the answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
    }

    pub(crate) fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_request", message)
    }

    fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_head_too_large",
            message,
        )
    }
}

/// Parses a request head from the front of `buffer` and removes it; None
/// while the head is incomplete.
pub(crate) fn take_head(buffer: &mut BytesMut) -> Result<Option<Head>, Refusal> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut slots);
    let head_len = match parsed.parse(buffer) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buffer.len() > MAX_HEAD_BYTES => {
            return Err(Refusal::too_large(format!(
                "the request head is longer than {MAX_HEAD_BYTES} bytes"
            )));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::too_large(format!(
                "the request has more than {MAX_HEADERS} headers"
            )));
        }
        Err(e) => return Err(Refusal::malformed(format!("malformed request head: {e}"))),
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(Refusal::too_large(format!(
            "the request head is longer than {MAX_HEAD_BYTES} bytes"
        )));
    }
    let start = buffer.as_ptr() as usize;
    let offset = |slice: &[u8]| slice.as_ptr() as usize - start;
    let method = parsed.method.unwrap_or_default().as_bytes();
    let method = Method::from_bytes(method)
        .map_err(|_| Refusal::malformed("the request method is not a token"))?;
    let target = parsed.path.unwrap_or_default().as_bytes();
    let target = offset(target)..offset(target) + target.len();
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut fields = Vec::with_capacity(parsed.headers.len());
    for header in parsed.headers.iter() {
        let name = HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| {
            Refusal::malformed(format!("header name {:?} is not a token", header.name))
        })?;
        fields.push((
            name,
            offset(header.value)..offset(header.value) + header.value.len(),
        ));
    }
    let bytes: Bytes = buffer.split_to(head_len).freeze();
    let uri = Uri::from_maybe_shared(bytes.slice(target))
        .map_err(|e| Refusal::malformed(format!("invalid request target: {e}")))?;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        let value = HeaderValue::from_maybe_shared(bytes.slice(value))
            .map_err(|_| Refusal::malformed(format!("the value of header {name} is not valid")))?;
        headers.append(name, value);
    }
    let body = body_framing(&headers, version)?;
    let keep_alive = match version {
        Version::HTTP_10 => has_token(&headers, &CONNECTION, "keep-alive"),
        _ => !has_token(&headers, &CONNECTION, "close"),
    };
    let expect_continue = headers
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(Head {
        method,
        uri,
        version,
        headers,
        body,
        keep_alive,
        expect_continue,
    }))
}

fn body_framing(headers: &HeaderMap, version: Version) -> Result<BodyFraming, Refusal> {
    let lengths = headers.get_all(CONTENT_LENGTH);
    if headers.contains_key(TRANSFER_ENCODING) {
        if lengths.iter().next().is_some() {
            return Err(Refusal::malformed(
                "the request has both transfer-encoding and content-length",
            ));
        }
        if version == Version::HTTP_10 {
            return Err(Refusal::malformed(
                "transfer-encoding is not defined for HTTP/1.0",
            ));
        }
        let codings: Vec<String> = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .collect();
        return match codings.as_slice() {
            [only] if only == "chunked" => Ok(BodyFraming::Chunked),
            [.., last] if last == "chunked" => Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                "unsupported_transfer_coding",
                format!(
                    "transfer-encoding {} is not supported; send the body as is or chunked",
                    codings.join(", ")
                ),
            )),
            _ => Err(Refusal::malformed(
                "the last transfer coding of a request must be chunked",
            )),
        };
    }
    let mut length = None;
    for value in lengths.iter() {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            let parsed =
                (!part.is_empty() && part.len() <= 19 && part.iter().all(u8::is_ascii_digit))
                    .then(|| std::str::from_utf8(part).ok()?.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| Refusal::malformed("content-length is not a number"))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(Refusal::malformed(
                    "the request has differing content-lengths",
                ));
            }
            length = Some(parsed);
        }
    }
    Ok(BodyFraming::Length(length.unwrap_or(0)))
}

/// A client's request body as the router received it.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestBody {
    Complete(Bytes),
    /// Longer than `max_body_bytes`; left unread, so the connection closes
    /// after the answer.
    TooLarge,
}

/// A request body being taken from the read buffer as it fills.
pub(crate) struct BodyReader {
    decoder: Decoder,
    limit: usize,
    /// What chunks gave so far.
    chunks: BytesMut,
}

impl BodyReader {
    pub(crate) fn new(framing: BodyFraming, limit: usize) -> Self {
        let decoder = match framing {
            BodyFraming::Length(n) => Decoder::length(n),
            BodyFraming::Chunked => Decoder::chunked(),
        };
        BodyReader {
            decoder,
            limit,
            chunks: BytesMut::new(),
        }
    }

    /// The body once `buffer` holds all of it (None: read more), or
    /// TooLarge as soon as it is known to pass the limit. A body with a
    /// length is one slice of the buffer; chunks are joined.
    pub(crate) fn advance(&mut self, buffer: &mut BytesMut) -> Result<Option<RequestBody>, Broken> {
        if let Decoder::Length(n) = self.decoder {
            if n > self.limit as u64 {
                return Ok(Some(RequestBody::TooLarge));
            }
            let n = n as usize;
            if buffer.len() < n {
                buffer.reserve(n - buffer.len());
                return Ok(None);
            }
            self.decoder = Decoder::Done;
            return Ok(Some(RequestBody::Complete(buffer.split_to(n).freeze())));
        }
        loop {
            match self.decoder.step(buffer, true)? {
                Step::Data(data) if self.chunks.len() + data.len() > self.limit => {
                    return Ok(Some(RequestBody::TooLarge));
                }
                Step::Data(data) => self.chunks.extend_from_slice(&data),
                Step::End => {
                    return Ok(Some(RequestBody::Complete(
                        std::mem::take(&mut self.chunks).freeze(),
                    )));
                }
                Step::NeedMore => return Ok(None),
            }
        }
    }
}

/// Whether a comma-separated header (such as `connection`) names `token`.
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &str) -> Result<Option<Head>, Refusal> {
        take_head(&mut BytesMut::from(wire))
    }

    fn refusal(wire: &str) -> (u16, String) {
        let e = parse(wire).expect_err("refused");
        (e.status.as_u16(), e.message)
    }

    #[test]
    fn a_head_is_parsed_and_removed_leaving_the_body() {
        let mut buffer = BytesMut::from(
            "POST /v1/completions?x=1 HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\n{}",
        );
        let head = take_head(&mut buffer).unwrap().unwrap();
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.uri.path(), "/v1/completions");
        assert_eq!(head.uri.query(), Some("x=1"));
        assert_eq!(head.body, BodyFraming::Length(2));
        assert!(head.keep_alive);
        assert_eq!(head.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&buffer[..], b"{}");
    }

    #[test]
    fn an_incomplete_head_waits_and_an_endless_one_is_refused() {
        assert!(parse("GET / HTTP/1.1\r\nHost: r\r\n").unwrap().is_none());
        let endless = format!("GET / HTTP/1.1\r\nx-long: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refusal(&endless).0, 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert_eq!(refusal(&format!("GET / HTTP/1.1\r\n{many}\r\n")).0, 431);
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let both = "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(refusal(both).0, 400);
        let differing = "POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n";
        assert_eq!(refusal(differing).0, 400);
        assert_eq!(
            refusal("POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n").0,
            400
        );
        assert_eq!(
            refusal("POST / HTTP/1.1\r\ncontent-length: 1e3\r\n\r\n").0,
            400
        );
        assert_eq!(
            refusal("POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n").0,
            400
        );
        assert_eq!(
            refusal("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n").0,
            501
        );
        assert_eq!(
            refusal("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n").0,
            400
        );
        assert_eq!(refusal("GET / HTTP/1.1\r\nbad header: 1\r\n\r\n").0, 400);
        assert_eq!(refusal("GET /\x01 HTTP/1.1\r\n\r\n").0, 400);
    }

    #[test]
    fn same_repeated_lengths_and_chunked_are_understood() {
        let same = "POST / HTTP/1.1\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(parse(same).unwrap().unwrap().body, BodyFraming::Length(3));
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(parse(chunked).unwrap().unwrap().body, BodyFraming::Chunked);
        let none = "GET / HTTP/1.1\r\n\r\n";
        assert_eq!(parse(none).unwrap().unwrap().body, BodyFraming::Length(0));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection_header() {
        let keeps = |wire: &str| parse(wire).unwrap().unwrap().keep_alive;
        assert!(keeps("GET / HTTP/1.1\r\n\r\n"));
        assert!(!keeps(
            "GET / HTTP/1.1\r\nconnection: upgrade, Close\r\n\r\n"
        ));
        assert!(!keeps("GET / HTTP/1.0\r\n\r\n"));
        assert!(keeps("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        let waits = parse("POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n");
        assert!(waits.unwrap().unwrap().expect_continue);
    }

    #[test]
    fn bodies_are_taken_whole_and_refused_past_the_limit() {
        let mut buffer = BytesMut::from("{\"a\"");
        let mut reader = BodyReader::new(BodyFraming::Length(7), 10);
        assert_eq!(reader.advance(&mut buffer), Ok(None));
        buffer.extend_from_slice(b":1}GET");
        let body = reader.advance(&mut buffer);
        assert_eq!(
            body,
            Ok(Some(RequestBody::Complete(Bytes::from_static(
                b"{\"a\":1}"
            ))))
        );
        assert_eq!(&buffer[..], b"GET");

        let mut over = BodyReader::new(BodyFraming::Length(11), 10);
        assert_eq!(
            over.advance(&mut BytesMut::new()),
            Ok(Some(RequestBody::TooLarge))
        );
        let mut chunks = BodyReader::new(BodyFraming::Chunked, 10);
        let mut buffer = BytesMut::from("6\r\nabcdef\r\n");
        assert_eq!(chunks.advance(&mut buffer), Ok(None));
        buffer.extend_from_slice(b"5\r\nghijk\r\n0\r\n\r\n");
        assert_eq!(chunks.advance(&mut buffer), Ok(Some(RequestBody::TooLarge)));
        let mut chunks = BodyReader::new(BodyFraming::Chunked, 10);
        let mut buffer = BytesMut::from("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nnext");
        let body = chunks.advance(&mut buffer);
        assert_eq!(
            body,
            Ok(Some(RequestBody::Complete(Bytes::from_static(b"abcde"))))
        );
        assert_eq!(&buffer[..], b"next");
    }
}
