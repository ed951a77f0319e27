//! The router's readers of outside bytes as functions of bytes, for the
//! fuzz targets (`crates/fuzz-targets`): what clients send on a
//! connection, and an engine's answer, which is outside input too (a
//! misbehaving engine ends its own stream, never the router). Besides
//! never panicking, the readers keep promises checked here: requests and
//! events come out the same however the reads split the bytes, framing
//! loses and reorders no byte, and every event a continuation sends reads
//! back as exactly the payload it carries.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::framing::Broken;
use crate::front::{self, BodyReader, RequestBody};
use crate::resume::{Charge, ResumeMemory, Route, Spliced, Transcript};
use crate::resume::{continuation_request, request_refusal, splice_event};
use crate::sse::{Event, EventFramer, encode, payloads};
use crate::upstream::take_head;

/// `data` as what clients send on one connection, after a first byte that
/// picks the length of each read: request heads and bodies taken as the
/// router's server side takes them, until one is refused.
pub fn client_requests(data: &[u8]) {
    let Some((&cut, sent)) = data.split_first() else {
        return;
    };
    let whole = read_requests(std::iter::once(sent));
    let split = read_requests(sent.chunks(usize::from(cut).max(1)));
    assert_eq!(split, whole, "the requests depend on how reads split them");
}

/// What the server side made of one request.
#[derive(Debug, PartialEq, Eq)]
enum ClientRead {
    Request {
        method: String,
        target: String,
        headers: usize,
        keep_alive: bool,
        body: RequestBody,
    },
    Refused(u16),
    BrokenBody(Broken),
}

/// A body limit small enough for mutations to cross.
const FUZZ_BODY_LIMIT: usize = 1024;

fn read_requests<'a>(reads: impl Iterator<Item = &'a [u8]>) -> Vec<ClientRead> {
    let mut buffer = BytesMut::new();
    let mut found = Vec::new();
    let mut in_body = None;
    for read in reads {
        buffer.extend_from_slice(read);
        loop {
            let Some((head, reader)) = &mut in_body else {
                match front::take_head(&mut buffer) {
                    Ok(Some(head)) => {
                        let reader = BodyReader::new(head.body, FUZZ_BODY_LIMIT);
                        in_body = Some((head, reader));
                        continue;
                    }
                    Ok(None) => break,
                    Err(refusal) => {
                        found.push(ClientRead::Refused(refusal.status.as_u16()));
                        return found;
                    }
                }
            };
            match reader.advance(&mut buffer) {
                Ok(None) => break,
                Ok(Some(body)) => {
                    let closes = body == RequestBody::TooLarge;
                    found.push(ClientRead::Request {
                        method: head.method.to_string(),
                        target: head.uri.to_string(),
                        headers: head.headers.len(),
                        keep_alive: head.keep_alive,
                        body,
                    });
                    if closes {
                        return found;
                    }
                    in_body = None;
                }
                Err(broken) => {
                    found.push(ClientRead::BrokenBody(broken));
                    return found;
                }
            }
        }
    }
    found
}

/// `data` as an engine's answer after a first byte that picks the length
/// of each read: a response head (when one parses), then the body as an
/// event stream.
pub fn engine_answer(data: &[u8]) {
    let Some((&cut, answer)) = data.split_first() else {
        return;
    };
    let mut buffer = BytesMut::from(answer);
    let body = match take_head(&mut buffer, false, &mut 0) {
        Ok(Some(_)) => &answer[answer.len() - buffer.len()..],
        _ => answer,
    };
    let memory = Arc::new(ResumeMemory::new(1 << 20));
    for route in [Route::Chat, Route::Completion] {
        let charge = Charge::new(Arc::clone(&memory), 0).expect("nothing is held yet");
        let mut transcript = Transcript::new(route, 4096, charge);
        let mut framer = EventFramer::default();
        let mut relayed = Vec::with_capacity(body.len());
        for read in body.chunks(usize::from(cut).max(1)) {
            let events = framer.push(Bytes::copy_from_slice(read));
            relayed.extend_from_slice(&events);
            for (span, event) in payloads(&events) {
                assert!(span.end <= events.len(), "an event past its bytes");
                match event {
                    Event::Done => transcript.note_done(),
                    Event::Data(payload) => {
                        let _ = transcript.observe(&payload);
                        check_splice(&payload, &transcript);
                    }
                }
            }
        }
        let whole = EventFramer::default().push(Bytes::copy_from_slice(body));
        let events = |bytes: &[u8]| -> Vec<Vec<u8>> {
            payloads(bytes)
                .map(|(_, event)| match event {
                    Event::Data(payload) => payload.into_owned(),
                    Event::Done => b"[DONE]".to_vec(),
                })
                .collect()
        };
        assert_eq!(
            events(&relayed),
            events(&whole),
            "the events depend on how reads split them"
        );
        relayed.extend_from_slice(&framer.release(Bytes::new()));
        assert_eq!(relayed, body, "framing changed the stream");
        let original = match route {
            Route::Chat => {
                br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
                    .as_slice()
            }
            Route::Completion => br#"{"model":"m","stream":true,"prompt":"hi","max_tokens":9}"#,
        };
        let _ = continuation_request(original, &transcript);
        let _ = continuation_request(body, &transcript);
        let _ = request_refusal(body, route);
    }
    assert_eq!(memory.used(), 0, "a finished stream kept memory");
}

fn check_splice(payload: &[u8], transcript: &Transcript) {
    let Spliced::Send(event) = splice_event(payload, transcript, transcript.tokens) else {
        return;
    };
    let encoded = encode(&event);
    let read: Vec<_> = payloads(encoded.as_bytes()).map(|(_, e)| e).collect();
    let expected = if event == "[DONE]" {
        Event::Done
    } else {
        Event::Data(event.as_bytes().into())
    };
    assert_eq!(read, [expected], "a spliced event reads back changed");
}
