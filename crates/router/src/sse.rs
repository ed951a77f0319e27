//! Server-sent events as engines stream them: `data: <json>` lines, each
//! event ended by a blank line. A resumable stream is relayed event by
//! event, so that a cut never leaves half an event at the client and the
//! continuation can start on a boundary. Lines may end with LF (vLLM and
//! SGLang), CRLF or CR, as the SSE format allows.

use std::borrow::Cow;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// Splits a byte stream into whole events, holding back a partial one.
/// Each byte is scanned once, however thinly the engine spreads an event
/// over its writes.
#[derive(Default)]
pub struct EventFramer {
    partial: BytesMut,
    /// Where the line whose end has not arrived starts in `partial`.
    line_start: usize,
    /// How much of `partial` has been searched for line ends.
    scanned: usize,
    /// `partial` ended with a CR that ended a line: an LF coming first is
    /// the rest of that CRLF, not an empty line.
    ended_with_cr: bool,
}

impl EventFramer {
    /// The whole events completed by `data` (zero-copy when nothing was
    /// held back and `data` ends on an event boundary, as engines send
    /// them); the rest is held until its end arrives.
    pub fn push(&mut self, data: Bytes) -> Bytes {
        if data.is_empty() {
            return data;
        }
        if self.partial.is_empty() && data.ends_with(b"\n\n") {
            self.ended_with_cr = false;
            return data;
        }
        self.partial.extend_from_slice(&data);
        let mut line_start = self.line_start;
        let mut search = self.scanned;
        if self.ended_with_cr && self.partial.get(line_start) == Some(&b'\n') {
            line_start += 1;
            search = line_start;
        }
        self.ended_with_cr = false;
        let mut boundary = None;
        while let Some((end, next)) = line_end(&self.partial, search) {
            if end == line_start {
                boundary = Some(next);
            }
            // A CR as the last byte may be half a CRLF.
            self.ended_with_cr =
                next == end + 1 && next == self.partial.len() && self.partial[end] == b'\r';
            line_start = next;
            search = next;
        }
        let whole = boundary.unwrap_or(0);
        self.line_start = line_start - whole;
        self.scanned = self.partial.len() - whole;
        self.partial.split_to(whole).freeze()
    }

    /// Bytes of an event whose end has not arrived.
    pub fn held(&self) -> usize {
        self.partial.len()
    }

    /// Anything held back, then `data`, as they came: for a stream no
    /// longer followed event by event.
    pub fn release(&mut self, data: Bytes) -> Bytes {
        if self.partial.is_empty() {
            return data;
        }
        self.partial.extend_from_slice(&data);
        self.line_start = 0;
        self.scanned = 0;
        self.ended_with_cr = false;
        self.partial.split().freeze()
    }

    /// Forgets the held partial event: its stream was cut.
    pub fn discard(&mut self) {
        self.partial.clear();
        self.line_start = 0;
        self.scanned = 0;
        self.ended_with_cr = false;
    }
}

/// Whether `bytes` end with the blank line that ends an event (a tail
/// appended after them starts an event of its own).
pub fn ends_an_event(bytes: &[u8]) -> bool {
    let before_last_line_end = bytes
        .strip_suffix(b"\r\n")
        .or_else(|| bytes.strip_suffix(b"\n"))
        .or_else(|| bytes.strip_suffix(b"\r"));
    before_last_line_end.is_some_and(|rest| rest.ends_with(b"\n") || rest.ends_with(b"\r"))
}

/// One whole event in a byte stream.
struct Block {
    /// From the event's first byte to the end of the blank line closing it.
    whole: Range<usize>,
    /// Where its last line (with that line's own end) stops.
    lines_end: usize,
}

/// The whole events in `bytes`, in order; a trailing partial one is left out.
fn blocks(bytes: &[u8]) -> impl Iterator<Item = Block> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let mut line_start = start;
        loop {
            let (text_end, next) = line_end(bytes, line_start)?;
            if text_end == line_start {
                let block = Block {
                    whole: start..next,
                    lines_end: line_start,
                };
                start = next;
                return Some(block);
            }
            line_start = next;
        }
    })
}

/// The first line end in `bytes` at or after `from`: where the line's text
/// stops and where the next line starts. A CR as the last byte counts as
/// a whole line end; an LF that follows it later reads as an empty line,
/// which ends an empty event, which carries nothing.
fn line_end(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let end = from + memchr::memchr2(b'\n', b'\r', &bytes[from..])?;
    let crlf = bytes[end] == b'\r' && bytes.get(end + 1) == Some(&b'\n');
    Some((end, if crlf { end + 2 } else { end + 1 }))
}

/// The lines of one event, without their ends.
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut from = 0;
    std::iter::from_fn(move || {
        let (end, next) = line_end(block, from)?;
        let line = &block[from..end];
        from = next;
        Some(line)
    })
}

/// Each event in `events` (whole events only) with the bytes it spans and
/// the payload of its `data:` lines; comments and other fields are
/// skipped, as are events without data.
pub fn payloads(events: &[u8]) -> impl Iterator<Item = (Range<usize>, Event<'_>)> {
    blocks(events).filter_map(move |block| {
        let text = &events[block.whole.start..block.lines_end];
        let mut data = lines(text).filter_map(data_value);
        let first = data.next()?;
        // Engines send one data line per event: borrowed, no copy.
        let payload = match data.next() {
            None => Cow::Borrowed(first),
            Some(second) => {
                let mut joined = [first, second].join(&b'\n');
                for more in data {
                    joined.push(b'\n');
                    joined.extend_from_slice(more);
                }
                Cow::Owned(joined)
            }
        };
        let event = if payload.as_ref() == b"[DONE]" {
            Event::Done
        } else {
            Event::Data(payload)
        };
        Some((block.whole, event))
    })
}

/// The value of a `data` field line (`data: x`, `data:x`, or a bare
/// `data`, which is an empty value).
fn data_value(line: &[u8]) -> Option<&[u8]> {
    if line == b"data" {
        return Some(b"");
    }
    let value = line.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

#[derive(Debug, PartialEq)]
pub enum Event<'a> {
    Data(Cow<'a, [u8]>),
    Done,
}

/// One event as the client receives it: a `data:` line per line of
/// `payload` (JSON has none inside, other payloads may).
pub fn encode(payload: &str) -> String {
    let mut event = String::with_capacity(payload.len() + 8);
    for line in payload.split('\n') {
        event.push_str("data: ");
        event.push_str(line);
        event.push('\n');
    }
    event.push('\n');
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_frames_pass_unchanged_and_split_events_are_held_until_whole() {
        let mut framer = EventFramer::default();
        let whole = Bytes::from_static(b"data: {\"a\":1}\n\n");
        assert_eq!(framer.push(whole.clone()), whole);
        assert_eq!(
            framer.push(Bytes::from_static(b"data: {\"b\"")),
            Bytes::new()
        );
        assert_eq!(framer.held(), 10);
        assert_eq!(
            framer.push(Bytes::from_static(b":2}\n\ndata: {\"c\"")),
            Bytes::from_static(b"data: {\"b\":2}\n\n")
        );
        assert_eq!(
            framer.push(Bytes::from_static(b":3}\n\n")),
            Bytes::from_static(b"data: {\"c\":3}\n\n")
        );
        assert_eq!(framer.held(), 0);
    }

    #[test]
    fn events_ended_by_crlf_or_cr_are_framed_too() {
        let mut framer = EventFramer::default();
        assert_eq!(
            framer.push(Bytes::from_static(b"data: 1\r\n\r\ndata: 2\r\n")),
            Bytes::from_static(b"data: 1\r\n\r\n")
        );
        assert_eq!(
            framer.push(Bytes::from_static(b"\r\ndata: 3\r\r")),
            Bytes::from_static(b"data: 2\r\n\r\ndata: 3\r\r")
        );
        assert_eq!(framer.held(), 0);
        // A CRLF split between two reads is one line end, not two.
        assert_eq!(framer.push(Bytes::from_static(b"data: 4\r")), Bytes::new());
        assert_eq!(
            framer.push(Bytes::from_static(b"\ndata: 5\r")),
            Bytes::new()
        );
        assert_eq!(
            framer.push(Bytes::from_static(b"\n\r\n")),
            Bytes::from_static(b"data: 4\r\ndata: 5\r\n\r\n")
        );
    }

    #[test]
    fn a_blank_line_at_the_end_ends_an_event_whatever_the_line_ends() {
        for ended in [
            "data: x\n\n",
            "data: x\r\n\r\n",
            "data: x\r\r",
            "data: x\r\r\n",
        ] {
            assert!(ends_an_event(ended.as_bytes()), "{ended:?}");
        }
        for open in ["data: x\n", "data: x\r\n", "data: x", ""] {
            assert!(!ends_an_event(open.as_bytes()), "{open:?}");
        }
    }

    #[test]
    fn a_crlf_ending_one_read_is_not_half_of_one() {
        let mut framer = EventFramer::default();
        assert_eq!(
            framer.push(Bytes::from_static(b"data: [DONE]\r\n")),
            Bytes::new()
        );
        // An empty read changes nothing.
        assert_eq!(framer.push(Bytes::new()), Bytes::new());
        assert_eq!(
            framer.push(Bytes::from_static(b"\n")),
            Bytes::from_static(b"data: [DONE]\r\n\n")
        );
        // Nor between the halves of a CRLF.
        assert_eq!(framer.push(Bytes::from_static(b"data: 4\r")), Bytes::new());
        assert_eq!(framer.push(Bytes::new()), Bytes::new());
        assert_eq!(
            framer.push(Bytes::from_static(b"\ndata: 5\n")),
            Bytes::new()
        );
        assert_eq!(
            framer.push(Bytes::from_static(b"\n")),
            Bytes::from_static(b"data: 4\r\ndata: 5\n\n")
        );
    }

    #[test]
    fn an_event_fed_a_byte_at_a_time_comes_out_once_whole() {
        let stream = b"data: 1\r\n\r\n: note\n\ndata: 2\ndata: 3\r\r";
        let mut framer = EventFramer::default();
        let mut out = Vec::new();
        let mut ends = Vec::new();
        for byte in stream {
            let events = framer.push(Bytes::copy_from_slice(&[*byte]));
            if !events.is_empty() {
                out.extend_from_slice(&events);
                ends.push(out.len());
            }
        }
        assert_eq!(out, stream);
        assert_eq!(ends, vec![10, 19, stream.len()]);
    }

    #[test]
    fn released_bytes_come_with_what_was_held_first() {
        let mut framer = EventFramer::default();
        framer.push(Bytes::from_static(b"data: {\"b\""));
        assert_eq!(
            framer.release(Bytes::from_static(b":2}\n")),
            Bytes::from_static(b"data: {\"b\":2}\n")
        );
        assert_eq!(framer.held(), 0);
        let raw = Bytes::from_static(b"no events at all");
        assert_eq!(framer.release(raw.clone()), raw);
    }

    #[test]
    fn payloads_are_data_lines_joined_and_done_is_recognised() {
        let events: Vec<(Range<usize>, Event<'_>)> =
            payloads(b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n")
                .collect();
        assert_eq!(
            events,
            vec![
                (14..29, Event::Data(Cow::Borrowed(b"{\"a\":1}"))),
                (29..46, Event::Data(Cow::Owned(b"x\ny".to_vec()))),
                (46..60, Event::Done),
            ]
        );
    }

    #[test]
    fn payloads_read_crlf_and_cr_lines_and_bare_data_fields() {
        let events: Vec<(Range<usize>, Event<'_>)> =
            payloads(b"data:{\"a\":1}\r\n\r\ndata: x\rdata\rdata: y\r\r: note\r\n\r\n").collect();
        assert_eq!(
            events,
            vec![
                (0..16, Event::Data(Cow::Borrowed(b"{\"a\":1}"))),
                (16..38, Event::Data(Cow::Owned(b"x\n\ny".to_vec()))),
            ]
        );
    }

    #[test]
    fn encoded_payloads_keep_each_line_a_data_line() {
        assert_eq!(encode("{\"a\":1}"), "data: {\"a\":1}\n\n");
        assert_eq!(encode("x\ny"), "data: x\ndata: y\n\n");
        let encoded = encode("x\n\ny");
        let events: Vec<_> = payloads(encoded.as_bytes()).map(|(_, e)| e).collect();
        assert_eq!(events, vec![Event::Data(Cow::Owned(b"x\n\ny".to_vec()))]);
    }
}
