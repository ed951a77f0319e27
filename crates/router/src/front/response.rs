//! A response on the wire: the head, and the body framed by length,
//! chunked, or by closing the connection, encoded into one write buffer so
//! that a head and the frames ready with it leave in one write.

use std::cell::RefCell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::header::{CONNECTION, CONTENT_LENGTH, DATE, HeaderMap, TRANSFER_ENCODING};
use hyper::{StatusCode, Version};

/// How the body after the head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body may follow (a `204`, `304` or an answer to `HEAD`).
    None,
    /// `content-length`; the bytes still to send.
    Length(u64),
    Chunked,
    /// The body ends when the connection closes (HTTP/1.0 clients).
    UntilClose,
}

/// The body's data did not match the framing the head promised.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Overrun;

impl Framing {
    /// Chooses the framing: the length the answer names or its body knows,
    /// else chunked, else (for an HTTP/1.0 client) until close.
    pub(crate) fn choose(
        status: StatusCode,
        headers: &HeaderMap,
        exact_size: Option<u64>,
        version: Version,
        head_request: bool,
    ) -> Framing {
        if head_request || status.is_informational() || matches!(status.as_u16(), 204 | 304) {
            return Framing::None;
        }
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        match declared.or(exact_size) {
            Some(n) => Framing::Length(n),
            None if version == Version::HTTP_10 => Framing::UntilClose,
            None => Framing::Chunked,
        }
    }

    /// Whether the connection can carry another request once the body is
    /// complete.
    pub(crate) fn delimits_itself(self) -> bool {
        self != Framing::UntilClose
    }

    /// Appends one frame of body data as this framing sends it.
    pub(crate) fn encode(&mut self, data: &Bytes, out: &mut Vec<u8>) -> Result<(), Overrun> {
        match self {
            Framing::None => {}
            Framing::Length(left) => {
                let n = data.len() as u64;
                if n > *left {
                    return Err(Overrun);
                }
                *left -= n;
                out.extend_from_slice(data);
            }
            Framing::Chunked if data.is_empty() => {}
            Framing::Chunked => {
                let _ = write!(out, "{:x}\r\n", data.len());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
            Framing::UntilClose => out.extend_from_slice(data),
        }
        Ok(())
    }

    /// Appends what ends the body; an error when fewer bytes came than the
    /// head promised.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), Overrun> {
        match self {
            Framing::Length(left) if *left > 0 => Err(Overrun),
            Framing::Chunked => {
                out.extend_from_slice(b"0\r\n\r\n");
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Appends the status line and headers. `connection`, `content-length`
/// and `transfer-encoding` are the router's to say, from `framing` and
/// `keep_alive`; `date` is added when the answer has none.
pub(crate) fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    framing: Framing,
    version: Version,
    keep_alive: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == CONNECTION || name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key(DATE) {
        out.extend_from_slice(b"date: ");
        with_http_date(|date| out.extend_from_slice(date.as_bytes()));
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::None | Framing::UntilClose => {}
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    /// The `date` value, formatted once a second per thread.
    static DATE_CACHE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

fn with_http_date(use_date: impl FnOnce(&str)) {
    let now = SystemTime::now();
    let second = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    DATE_CACHE.with_borrow_mut(|(cached_second, text)| {
        if *cached_second != second {
            *text = httpdate::fmt_http_date(now);
            *cached_second = second;
        }
        use_date(text);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::{CONTENT_TYPE, HeaderValue};

    fn head(framing: Framing, version: Version, keep_alive: bool) -> String {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(
            DATE,
            HeaderValue::from_static("Sat, 05 Dec 2026 20:00:00 GMT"),
        );
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        let mut out = Vec::new();
        encode_head(
            &mut out,
            StatusCode::OK,
            &headers,
            framing,
            version,
            keep_alive,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_head_says_the_framing_and_whether_the_connection_stays() {
        assert_eq!(
            head(Framing::Length(5), Version::HTTP_11, true),
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ndate: Sat, 05 Dec 2026 20:00:00 GMT\r\ncontent-length: 5\r\n\r\n"
        );
        assert!(
            head(Framing::Chunked, Version::HTTP_11, false)
                .ends_with("transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        );
        assert!(
            head(Framing::Length(0), Version::HTTP_10, true)
                .ends_with("content-length: 0\r\nconnection: keep-alive\r\n\r\n")
        );
    }

    #[test]
    fn a_date_is_added_when_missing() {
        let mut out = Vec::new();
        encode_head(
            &mut out,
            StatusCode::NOT_FOUND,
            &HeaderMap::new(),
            Framing::Length(0),
            Version::HTTP_11,
            true,
        );
        let text = String::from_utf8(out).unwrap();
        let date = text
            .lines()
            .find_map(|l| l.strip_prefix("date: "))
            .expect("a date");
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
    }

    #[test]
    fn framing_follows_the_declared_length_then_the_body_then_the_version() {
        let mut declared = HeaderMap::new();
        declared.insert(CONTENT_LENGTH, HeaderValue::from_static("7"));
        let choose =
            |h: &HeaderMap, exact, v, head| Framing::choose(StatusCode::OK, h, exact, v, head);
        assert_eq!(
            choose(&declared, Some(3), Version::HTTP_11, false),
            Framing::Length(7)
        );
        assert_eq!(
            choose(&HeaderMap::new(), Some(3), Version::HTTP_11, false),
            Framing::Length(3)
        );
        assert_eq!(
            choose(&HeaderMap::new(), None, Version::HTTP_11, false),
            Framing::Chunked
        );
        assert_eq!(
            choose(&HeaderMap::new(), None, Version::HTTP_10, false),
            Framing::UntilClose
        );
        assert_eq!(
            choose(&declared, None, Version::HTTP_11, true),
            Framing::None
        );
        let none = Framing::choose(
            StatusCode::NO_CONTENT,
            &declared,
            None,
            Version::HTTP_11,
            false,
        );
        assert_eq!(none, Framing::None);
    }

    #[test]
    fn bodies_are_encoded_as_framed_and_held_to_their_length() {
        let mut out = Vec::new();
        let mut chunked = Framing::Chunked;
        chunked
            .encode(&Bytes::from_static(b"hello world, 17 b"), &mut out)
            .unwrap();
        chunked.encode(&Bytes::new(), &mut out).unwrap();
        chunked.finish(&mut out).unwrap();
        assert_eq!(&out[..], b"11\r\nhello world, 17 b\r\n0\r\n\r\n");

        let mut length = Framing::Length(3);
        assert_eq!(
            length.encode(&Bytes::from_static(b"ab"), &mut Vec::new()),
            Ok(())
        );
        assert_eq!(length.finish(&mut Vec::new()), Err(Overrun));
        assert_eq!(
            length.encode(&Bytes::from_static(b"cd"), &mut Vec::new()),
            Err(Overrun)
        );
    }
}
