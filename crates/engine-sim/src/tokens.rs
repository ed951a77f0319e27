//! The simulated tokenizer: about four bytes a token, a chat template with
//! fixed framing tokens per message. It is deterministic and prefix-stable
//! (a conversation that grows keeps the token ids of its earlier turns),
//! which is all a prefix cache and a router's index need from a tokenizer.
//! Counts agree with the usage the simulator reports.

/// Framing tokens of the chat template, below the text ids.
const IM_START: u32 = 151_644;
const IM_END: u32 = 151_645;
const NEWLINE: u32 = 198;
const BOS: u32 = 151_643;
/// Text ids fall in [TEXT_BASE, TEXT_BASE + TEXT_IDS).
const TEXT_BASE: u32 = 1_000;
const TEXT_IDS: u32 = 150_000;

/// Token ids of `text`, four bytes each (the last may be shorter).
pub fn text_ids(text: &str, out: &mut Vec<u32>) {
    for chunk in text.as_bytes().chunks(4) {
        let mut hash: u32 = 0x811c_9dc5;
        for b in chunk {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        out.push(TEXT_BASE + hash % TEXT_IDS);
    }
}

fn role_id(role: &str) -> u32 {
    let mut ids = Vec::with_capacity(1);
    text_ids(&role[..role.len().min(4)], &mut ids);
    ids.first().copied().unwrap_or(TEXT_BASE)
}

/// Builds a chat prompt's tokens message by message.
pub struct ChatTokens {
    ids: Vec<u32>,
}

impl ChatTokens {
    pub fn new() -> Self {
        ChatTokens { ids: Vec::new() }
    }

    /// One message: `<|im_start|>role\n` + its text + `<|im_end|>`, four
    /// framing tokens; `text` is the message's role and content as the
    /// simulator reads them.
    pub fn message(&mut self, role: Option<&str>, text: &str) {
        self.ids
            .extend([IM_START, role_id(role.unwrap_or("user")), NEWLINE]);
        text_ids(text, &mut self.ids);
        self.ids.push(IM_END);
    }

    /// The generation prompt, `<|im_start|>assistant\n`: three tokens.
    pub fn finish(mut self) -> Vec<u32> {
        self.ids.extend([IM_START, role_id("assistant"), NEWLINE]);
        self.ids
    }
}

/// A completion prompt: a BOS token, then the text.
pub fn completion_ids(text: &str) -> Vec<u32> {
    let mut ids = vec![BOS];
    text_ids(text, &mut ids);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_growing_conversation_keeps_the_ids_of_its_earlier_turns() {
        let mut first = ChatTokens::new();
        first.message(Some("system"), "systemYou are terse.");
        first.message(Some("user"), "userHello there");
        let first = first.finish();
        let mut second = ChatTokens::new();
        second.message(Some("system"), "systemYou are terse.");
        second.message(Some("user"), "userHello there");
        second.message(Some("assistant"), "assistantHi.");
        second.message(Some("user"), "userAnd now?");
        let second = second.finish();
        let shared = first.len() - 3;
        assert_eq!(first[..shared], second[..shared]);
        assert_ne!(first, second);
    }

    #[test]
    fn counts_are_four_bytes_a_token_plus_framing() {
        let mut chat = ChatTokens::new();
        chat.message(Some("user"), "user12345678");
        assert_eq!(chat.finish().len(), 3 + 4 + 3);
        assert_eq!(completion_ids("abcde").len(), 1 + 2);
    }
}
