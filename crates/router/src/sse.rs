//! Server-sent events as engines stream them: `data: <json>` lines, each
//! event ended by a blank line. A resumable stream is relayed event by
//! event, so that a cut never leaves half an event at the client and the
//! continuation can start on a boundary.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

/// Splits a byte stream into whole events, holding back a partial one.
#[derive(Default)]
pub struct EventFramer {
    partial: BytesMut,
}

impl EventFramer {
    /// The whole events completed by `data` (zero-copy when nothing was
    /// held back and `data` ends on an event boundary, as engines send
    /// them); the rest is held until its end arrives.
    pub fn push(&mut self, data: Bytes) -> Bytes {
        if self.partial.is_empty() && data.ends_with(b"\n\n") {
            return data;
        }
        self.partial.extend_from_slice(&data);
        match last_boundary(&self.partial) {
            Some(end) => self.partial.split_to(end).freeze(),
            None => Bytes::new(),
        }
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
        self.partial.split().freeze()
    }

    /// Forgets the held partial event: its stream was cut.
    pub fn discard(&mut self) {
        self.partial.clear();
    }
}

fn last_boundary(bytes: &[u8]) -> Option<usize> {
    memchr::memmem::rfind(bytes, b"\n\n").map(|i| i + 2)
}

/// Each event in `events` (whole events only) with the offset just past
/// its end and the payload of its `data:` lines; comments and other fields
/// are skipped, as are events without data.
pub fn payloads(events: &[u8]) -> impl Iterator<Item = (usize, Event<'_>)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        loop {
            let rest = &events[start..];
            let len = memchr::memmem::find(rest, b"\n\n")?;
            let block = &rest[..len];
            start += len + 2;
            let mut data = block
                .split(|&b| b == b'\n')
                .filter_map(|line| line.strip_prefix(b"data:"))
                .map(|value| value.strip_prefix(b" ").unwrap_or(value));
            let Some(first) = data.next() else {
                continue;
            };
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
            return Some((start, event));
        }
    })
}

#[derive(Debug, PartialEq)]
pub enum Event<'a> {
    Data(Cow<'a, [u8]>),
    Done,
}

/// One event as the client receives it.
pub fn encode(json: &str) -> String {
    format!("data: {json}\n\n")
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
        let events: Vec<(usize, Event<'_>)> =
            payloads(b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n")
                .collect();
        assert_eq!(
            events,
            vec![
                (29, Event::Data(Cow::Borrowed(b"{\"a\":1}"))),
                (46, Event::Data(Cow::Owned(b"x\ny".to_vec()))),
                (60, Event::Done),
            ]
        );
    }
}
