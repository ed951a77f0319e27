//! Usage the router asks engines for on a client's behalf, and the event
//! that carries it, kept from the client who did not ask.

use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem;

/// The request with `stream_options.include_usage` set, for a stream whose
/// client did not ask for usage; `None` when it did (or the body is not a
/// JSON object, which the engine refuses on its own).
pub(crate) fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    let mut request: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).ok()?;
    let options = request
        .entry("stream_options")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    let serde_json::Value::Object(options) = options else {
        return None;
    };
    if options.get("include_usage") == Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&request).ok().map(Bytes::from)
}

/// Takes the usage event the client did not ask for out of a stream:
/// complete events pass at once, a partial one waits for its end. Engines
/// end events with a blank line (`\n\n`).
#[derive(Default)]
pub(super) struct UsageStripper {
    pub(super) partial: Vec<u8>,
}

static EVENT_END: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\n\n"));
static USAGE_OBJECT: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\":{"));
static NO_CHOICES: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"choices\":[]"));

impl UsageStripper {
    /// What of `data` goes to the client now.
    pub(super) fn pass(&mut self, data: &[u8]) -> Bytes {
        self.partial.extend_from_slice(data);
        let Some(end) = memmem::rfind(&self.partial, b"\n\n") else {
            return Bytes::new();
        };
        let rest = self.partial.split_off(end + 2);
        let complete = std::mem::replace(&mut self.partial, rest);
        if USAGE_OBJECT.find(&complete).is_none() {
            return Bytes::from(complete);
        }
        let mut out = Vec::with_capacity(complete.len());
        let mut start = 0;
        for at in EVENT_END.find_iter(&complete) {
            let event = &complete[start..at + 2];
            if !is_usage_event(event) {
                out.extend_from_slice(event);
            }
            start = at + 2;
        }
        Bytes::from(out)
    }

    /// What is left once the stream ended (an event without its blank
    /// line), passed as it is.
    pub(super) fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.partial))
    }
}

/// `data: {...,"choices":[],...,"usage":{...}}`: the usage chunk.
fn is_usage_event(event: &[u8]) -> bool {
    event.starts_with(b"data: {")
        && NO_CHOICES.find(event).is_some()
        && USAGE_OBJECT.find(event).is_some()
}
