//! The router's readers of engine bytes as one function of bytes, for the
//! fuzz targets (`crates/fuzz-targets`): an engine's answer is outside
//! input too, and a misbehaving engine ends its own stream, never the
//! router. Besides never panicking, the readers keep promises checked
//! here: framing loses and reorders no byte, finds the same events however
//! the reads split them, and every event a continuation sends reads back
//! as exactly the payload it carries.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::resume::{Charge, ResumeMemory, Route, Spliced, Transcript};
use crate::resume::{continuation_request, request_refusal, splice_event};
use crate::sse::{Event, EventFramer, encode, payloads};
use crate::upstream::take_head;

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
