//! What a stream has delivered so far, as far as resuming it needs: the
//! answer's id and `created`, its text, how many tokens carried it, and
//! whether anything makes it impossible to continue faithfully.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Bytes held for resumption by all streams together, against a cap.
pub struct ResumeMemory {
    used: AtomicUsize,
    cap: usize,
}

impl ResumeMemory {
    pub fn new(cap: usize) -> Self {
        ResumeMemory {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_charge(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                let after = used.checked_add(bytes)?;
                (after <= self.cap).then_some(after)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Bytes charged to [`ResumeMemory`], given back on drop.
pub struct Charge {
    memory: Arc<ResumeMemory>,
    bytes: usize,
}

impl Charge {
    pub fn new(memory: Arc<ResumeMemory>, bytes: usize) -> Option<Self> {
        // Not `then_some`: a Charge built eagerly and dropped on refusal
        // would give back bytes it never took.
        memory.try_charge(bytes).then(|| Charge { memory, bytes })
    }

    fn grow(&mut self, bytes: usize) -> bool {
        let ok = self.memory.try_charge(bytes);
        if ok {
            self.bytes += bytes;
        }
        ok
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.memory.release(self.bytes);
    }
}

/// The OpenAI route a stream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

/// What an event from the engine meant for the stream.
#[derive(Debug, PartialEq)]
pub enum Seen {
    /// An ordinary event.
    Event,
    /// The engine reported an error in the stream (vLLM and SGLang send
    /// `data: {"error": ...}` when generation fails mid-way).
    EngineError(String),
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    choices: Choices<'a>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// The first choice of an event and whether others came with it: only
/// single-choice answers can be resumed, and reading an event should not
/// cost an allocation.
#[derive(Default)]
struct Choices<'a> {
    first: Option<ChunkChoice<'a>>,
    more: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Choices<'a>, A::Error> {
                let first = seq.next_element::<ChunkChoice<'a>>()?;
                let mut more = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    more = true;
                }
                Ok(Choices { first, more })
            }
        }
        deserializer.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
    #[serde(default)]
    logprobs: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    /// vLLM's name for reasoning since late 2025; `reasoning_content`
    /// before, and still SGLang's.
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
}

pub struct Transcript {
    pub route: Route,
    pub id: Option<String>,
    pub created: Option<u64>,
    /// The answer's text so far, across every engine that produced it.
    pub text: String,
    /// Events that carried text: one token each as vLLM and SGLang stream.
    pub tokens: u64,
    /// A `finish_reason` arrived: the answer is complete.
    pub finished: bool,
    /// `data: [DONE]` arrived.
    pub done: bool,
    /// Why this stream can no longer be resumed, once something says so.
    pub refusal: Option<&'static str>,
    /// The end of the last bytes [`Transcript::note_unfollowed`] read, so a
    /// key split between two reads is still found.
    seam: Vec<u8>,
    max_text_bytes: usize,
    charge: Charge,
}

impl Transcript {
    pub fn new(route: Route, max_text_bytes: usize, charge: Charge) -> Self {
        Transcript {
            route,
            id: None,
            created: None,
            text: String::new(),
            tokens: 0,
            finished: false,
            done: false,
            refusal: None,
            seam: Vec::new(),
            max_text_bytes,
            charge,
        }
    }

    pub fn refuse(&mut self, reason: &'static str) {
        if self.refusal.is_none() {
            self.refusal = Some(reason);
            // Nothing will be resumed: give the memory back now.
            self.charge.memory.release(self.charge.bytes);
            self.charge.bytes = 0;
            self.text = String::new();
        }
    }

    pub fn note_done(&mut self) {
        self.done = true;
    }

    /// What a stream no longer followed event by event still tells, read
    /// from its raw bytes: that its answer finished, and that `[DONE]` went
    /// by, so that a failure after them ends the stream as a lost end does
    /// and not with an error. Engines write `"finish_reason":"` without
    /// spaces, and a quote inside a JSON string is escaped, so the key
    /// cannot come from the text. A key split between two reads is found
    /// across the seam. An answer of several choices is not over when one
    /// of them finishes.
    pub fn note_unfollowed(&mut self, bytes: &[u8]) {
        const FINISHED: &[u8] = b"\"finish_reason\":\"";
        const DONE: &[u8] = b"data: [DONE]";
        const SEAM: usize = if FINISHED.len() > DONE.len() {
            FINISHED.len() - 1
        } else {
            DONE.len() - 1
        };
        if self.refusal == Some("n") || bytes.is_empty() {
            return;
        }
        // The seam and the start of `bytes`: only there can a key begun
        // in an earlier read end.
        let mut buffer = [0u8; 2 * SEAM];
        let head = &bytes[..bytes.len().min(SEAM)];
        let joined_len = self.seam.len() + head.len();
        buffer[..self.seam.len()].copy_from_slice(&self.seam);
        buffer[self.seam.len()..joined_len].copy_from_slice(head);
        let joined = &buffer[..joined_len];
        let found = |key: &[u8]| {
            memchr::memmem::find(joined, key).is_some()
                || memchr::memmem::find(bytes, key).is_some()
        };
        if found(FINISHED) {
            self.finished = true;
        }
        if found(DONE) {
            self.done = true;
        }
        // When `bytes` is shorter than the seam, `joined` holds all of it.
        let tail = if bytes.len() >= SEAM { bytes } else { joined };
        self.seam.clear();
        self.seam
            .extend_from_slice(&tail[tail.len().saturating_sub(SEAM)..]);
    }

    /// Reads one event's JSON payload.
    pub fn observe(&mut self, payload: &[u8]) -> Seen {
        let chunk: Chunk<'_> = match serde_json::from_slice(payload) {
            Ok(chunk) => chunk,
            Err(_) => {
                self.refuse("unreadable_event");
                return Seen::Event;
            }
        };
        if let Some(error) = chunk.error {
            let message = error
                .get("message")
                .and_then(|m| m.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string());
            return Seen::EngineError(message);
        }
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
            self.created = chunk.created;
        }
        if chunk.choices.more {
            self.refuse("n");
        }
        if let Some(choice) = chunk.choices.first {
            if choice.index != 0 {
                self.refuse("n");
                return Seen::Event;
            }
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
            if choice.logprobs.is_some() {
                self.refuse("logprobs");
            }
            let piece = match (self.route, choice.delta, choice.text) {
                (Route::Chat, Some(delta), _) => {
                    if delta.tool_calls.is_some() || delta.function_call.is_some() {
                        self.refuse("tool_calls");
                    }
                    let reasons = |r: Option<Cow<'_, str>>| r.is_some_and(|r| !r.is_empty());
                    if reasons(delta.reasoning) || reasons(delta.reasoning_content) {
                        self.refuse("reasoning");
                    }
                    delta.content
                }
                (Route::Completion, _, text) => text,
                (Route::Chat, None, _) => None,
            };
            if let Some(piece) = piece.filter(|p| !p.is_empty()) {
                self.tokens += 1;
                self.keep(&piece);
            }
        }
        Seen::Event
    }

    fn keep(&mut self, piece: &str) {
        if self.refusal.is_some() {
            return;
        }
        if self.text.len() + piece.len() > self.max_text_bytes {
            self.refuse("text_budget");
        } else if !self.charge.grow(piece.len()) {
            self.refuse("memory_cap");
        } else {
            self.text.push_str(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(route: Route, max_text: usize, cap: usize) -> (Transcript, Arc<ResumeMemory>) {
        let memory = Arc::new(ResumeMemory::new(cap));
        let charge = Charge::new(Arc::clone(&memory), 0).unwrap();
        (Transcript::new(route, max_text, charge), memory)
    }

    #[test]
    fn chat_text_tokens_and_finish_are_followed() {
        let (mut t, memory) = transcript(Route::Chat, 1024, 1024);
        let role = br#"{"id":"chatcmpl-1","created":7,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(t.observe(role), Seen::Event);
        t.observe(br#"{"id":"chatcmpl-1","created":7,"choices":[{"index":0,"delta":{"content":"The"},"finish_reason":null}]}"#);
        t.observe(br#"{"id":"chatcmpl-1","created":7,"choices":[{"index":0,"delta":{"content":" quick"},"finish_reason":"stop"}]}"#);
        assert_eq!(t.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(t.created, Some(7));
        assert_eq!(t.text, "The quick");
        assert_eq!(t.tokens, 2);
        assert!(t.finished);
        assert_eq!(t.refusal, None);
        assert_eq!(memory.used(), 9);
        drop(t);
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn an_unfollowed_stream_finds_its_finish_and_done_split_across_reads() {
        let stream = concat!(
            r#"data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}"#,
            "\n\n",
            r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            "\n\ndata: [DONE]\n\n",
        )
        .as_bytes();
        let finish_at = memchr::memmem::find(stream, b"\"finish_reason\":\"").unwrap();
        let done_at = memchr::memmem::find(stream, b"[DONE]").unwrap();
        for cut in 1..stream.len() {
            let (mut t, _) = transcript(Route::Chat, 1024, 1024);
            t.refuse("logprobs");
            t.note_unfollowed(&stream[..cut]);
            assert_eq!(t.finished, cut >= finish_at + 17, "finish, cut at {cut}");
            assert_eq!(t.done, cut >= done_at + 6, "done, cut at {cut}");
            t.note_unfollowed(&stream[cut..]);
            assert!(t.finished && t.done, "cut at {cut}");
        }
        // One byte at a time: every key spans reads.
        let (mut t, _) = transcript(Route::Chat, 1024, 1024);
        t.refuse("logprobs");
        for byte in stream {
            t.note_unfollowed(std::slice::from_ref(byte));
        }
        assert!(t.finished && t.done);
    }

    #[test]
    fn a_refused_charge_gives_nothing_back() {
        let memory = Arc::new(ResumeMemory::new(10));
        let held = Charge::new(Arc::clone(&memory), 8).unwrap();
        assert!(Charge::new(Arc::clone(&memory), 8).is_none());
        assert_eq!(memory.used(), 8);
        drop(held);
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn errors_tools_and_budgets_are_recognised() {
        let (mut t, _) = transcript(Route::Chat, 1024, 1024);
        assert_eq!(
            t.observe(br#"{"error":{"message":"EngineCore died","code":500}}"#),
            Seen::EngineError("EngineCore died".into())
        );
        t.observe(br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#);
        assert_eq!(t.refusal, Some("tool_calls"));
        for name in ["reasoning", "reasoning_content"] {
            let (mut t, _) = transcript(Route::Chat, 1024, 1024);
            t.observe(br#"{"choices":[{"index":0,"delta":{"reasoning":null,"content":"a"}}]}"#);
            assert_eq!(t.refusal, None, "an empty {name} is no reasoning");
            let event =
                format!(r#"{{"choices":[{{"index":0,"delta":{{"{name}":"Let me think"}}}}]}}"#);
            t.observe(event.as_bytes());
            assert_eq!(t.refusal, Some("reasoning"), "{name}");
        }

        let (mut t, memory) = transcript(Route::Completion, 4, 1024);
        t.observe(br#"{"choices":[{"index":0,"text":"abc"}]}"#);
        t.observe(br#"{"choices":[{"index":0,"text":"de"}]}"#);
        assert_eq!(t.refusal, Some("text_budget"));
        assert_eq!(memory.used(), 0, "a refused stream holds nothing");

        let (mut t, memory) = transcript(Route::Completion, 1024, 2);
        t.observe(br#"{"choices":[{"index":0,"text":"abc"}]}"#);
        assert_eq!(t.refusal, Some("memory_cap"));
        assert_eq!(memory.used(), 0);
    }
}
