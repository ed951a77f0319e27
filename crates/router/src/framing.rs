//! HTTP/1.1 message bodies decoded in place from a read buffer: a length,
//! chunked transfer coding (RFC 9112 §7), or until the peer closes. One
//! decoder for both directions: engines' response bodies (`upstream`) and
//! clients' request bodies (`front`). Data comes out as slices of the
//! buffer, never copied.

use bytes::{Bytes, BytesMut};

/// A chunk-size or trailer line longer than this is not HTTP.
const MAX_LINE: usize = 4096;

/// Where the decoder stands in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoder {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    Trailers,
    UntilClose,
    Done,
    /// The framing was broken: every later step fails too, so an error
    /// noticed while looking ahead is not skipped over.
    Broken,
}

/// What the buffer gave.
pub(crate) enum Step {
    Data(Bytes),
    NeedMore,
    End,
}

/// The body's framing is not HTTP; says what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Broken(pub &'static str);

impl Decoder {
    pub(crate) fn length(n: u64) -> Self {
        if n == 0 {
            Decoder::Done
        } else {
            Decoder::Length(n)
        }
    }

    pub(crate) fn chunked() -> Self {
        Decoder::ChunkSize
    }

    /// Decodes what `buffer` holds. With `yield_data` false it stops at
    /// data instead of taking it (and says NeedMore): a look ahead for the
    /// end of the body.
    pub(crate) fn step(&mut self, buffer: &mut BytesMut, yield_data: bool) -> Result<Step, Broken> {
        self.decode(buffer, yield_data)
            .inspect_err(|_| *self = Decoder::Broken)
    }

    fn decode(&mut self, buffer: &mut BytesMut, yield_data: bool) -> Result<Step, Broken> {
        loop {
            match *self {
                Decoder::Broken => return Err(Broken("the body's framing was broken")),
                Decoder::Done | Decoder::Length(0) => return Ok(Step::End),
                Decoder::Length(left) | Decoder::ChunkData(left) => {
                    if buffer.is_empty() || !yield_data {
                        return Ok(Step::NeedMore);
                    }
                    let take = left.min(buffer.len() as u64);
                    let rest = left - take;
                    *self = match *self {
                        Decoder::Length(_) => Decoder::Length(rest),
                        _ if rest == 0 => Decoder::ChunkEnd,
                        _ => Decoder::ChunkData(rest),
                    };
                    return Ok(Step::Data(buffer.split_to(take as usize).freeze()));
                }
                Decoder::UntilClose => {
                    if buffer.is_empty() || !yield_data {
                        return Ok(Step::NeedMore);
                    }
                    return Ok(Step::Data(buffer.split().freeze()));
                }
                Decoder::ChunkEnd => {
                    if buffer.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &buffer[..2] != b"\r\n" {
                        return Err(Broken("chunk data not followed by CRLF"));
                    }
                    let _ = buffer.split_to(2);
                    *self = Decoder::ChunkSize;
                }
                Decoder::ChunkSize => {
                    let Some(line) = take_line(buffer)? else {
                        return Ok(Step::NeedMore);
                    };
                    let size = chunk_size(&line)?;
                    *self = if size == 0 {
                        Decoder::Trailers
                    } else {
                        Decoder::ChunkData(size)
                    };
                }
                Decoder::Trailers => {
                    let Some(line) = take_line(buffer)? else {
                        return Ok(Step::NeedMore);
                    };
                    if line.is_empty() {
                        *self = Decoder::Done;
                        return Ok(Step::End);
                    }
                }
            }
        }
    }

    /// Bytes still expected when the body has a length; None otherwise.
    pub(crate) fn exact_left(&self) -> Option<u64> {
        match *self {
            Decoder::Length(n) => Some(n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }
}

/// One CRLF-terminated line from the buffer, without its CRLF.
fn take_line(buffer: &mut BytesMut) -> Result<Option<BytesMut>, Broken> {
    match buffer.iter().position(|&b| b == b'\n') {
        Some(end) => {
            let mut line = buffer.split_to(end + 1);
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None if buffer.len() > MAX_LINE => Err(Broken("chunk line too long")),
        None => Ok(None),
    }
}

/// The hex size at the start of a chunk line (extensions after `;` are
/// ignored).
fn chunk_size(line: &[u8]) -> Result<u64, Broken> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(Broken("bad chunk size"));
    }
    digits.iter().try_fold(0u64, |size, &b| {
        let digit = (b as char).to_digit(16).ok_or(Broken("bad chunk size"))?;
        Ok(size * 16 + u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(decoder: &mut Decoder, wire: &[u8]) -> Result<(Vec<u8>, bool), Broken> {
        let mut buffer = BytesMut::from(wire);
        let mut out = Vec::new();
        loop {
            match decoder.step(&mut buffer, true)? {
                Step::Data(d) => out.extend_from_slice(&d),
                Step::NeedMore => return Ok((out, false)),
                Step::End => return Ok((out, true)),
            }
        }
    }

    #[test]
    fn chunks_with_extensions_and_trailers_decode_to_their_data() {
        let mut decoder = Decoder::chunked();
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(
            decode_all(&mut decoder, wire),
            Ok((b"hello world".to_vec(), true))
        );
    }

    #[test]
    fn a_split_chunk_waits_for_the_rest() {
        let mut decoder = Decoder::chunked();
        assert_eq!(
            decode_all(&mut decoder, b"5\r\nhel"),
            Ok((b"hel".to_vec(), false))
        );
        assert_eq!(
            decode_all(&mut decoder, b"lo\r\n0\r\n\r\n"),
            Ok((b"lo".to_vec(), true))
        );
    }

    #[test]
    fn broken_framing_stays_broken() {
        let mut decoder = Decoder::chunked();
        assert_eq!(
            decode_all(&mut decoder, b"zz\r\n"),
            Err(Broken("bad chunk size"))
        );
        assert!(decode_all(&mut decoder, b"0\r\n\r\n").is_err());
        let mut decoder = Decoder::chunked();
        assert_eq!(
            decode_all(&mut decoder, b"2\r\nabXY"),
            Err(Broken("chunk data not followed by CRLF"))
        );
        let mut decoder = Decoder::chunked();
        assert!(decode_all(&mut decoder, &[b'1'; 5000]).is_err());
    }

    #[test]
    fn a_length_ends_after_its_bytes() {
        let mut decoder = Decoder::length(3);
        assert_eq!(decode_all(&mut decoder, b"ab"), Ok((b"ab".to_vec(), false)));
        assert_eq!(decoder.exact_left(), Some(1));
        let mut buffer = BytesMut::from(&b"cdef"[..]);
        assert!(matches!(decoder.step(&mut buffer, true), Ok(Step::Data(d)) if &d[..] == b"c"));
        assert!(matches!(decoder.step(&mut buffer, true), Ok(Step::End)));
        assert_eq!(
            &buffer[..],
            b"def",
            "bytes past the body stay in the buffer"
        );
    }
}
