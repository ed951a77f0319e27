//! What the simulated model says, as a function of what it was asked: the
//! same model answers the same conversation with the same words (as a real
//! engine does under greedy decoding), and an answer it is asked to
//! continue goes on exactly where it stopped. That lets a router resume a
//! stream on another replica and a test check the spliced text against one
//! uninterrupted generation.
//!
//! Chat requests continue with `continue_final_message: true` (the final
//! message is the answer so far). Completion requests continue when the
//! prompt ends with words this model would have said to the rest of the
//! prompt.

use crate::rng::SplitMix;

/// What the model "says": a fixed vocabulary so that `stop` is testable.
pub const VOCABULARY: &[&str] = &[
    "The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dog",
    ".",
    " A",
    " simulated",
    " engine",
    " answers",
    " every",
    " request",
    " with",
    " plain",
    " words",
    ",",
    " one",
    " token",
    " at",
    " a",
    " time",
    ".",
];

/// Longest run of its own words the simulator looks for at the end of a
/// completion prompt; bounds the work a hostile prompt can cause.
const MAX_RUN: usize = 4096;

/// The generator for an answer's content: seeded by the model and the
/// conversation, never by the process, so every replica agrees.
pub fn content_rng(model: &str, conversation: &str) -> SplitMix {
    let mut hash = Fnv::new();
    hash.write(model.as_bytes());
    hash.write(&[0]);
    hash.write(conversation.as_bytes());
    SplitMix::new(hash.0)
}

/// The first vocabulary index of an answer, drawn first from its generator.
pub fn first_word(rng: &mut SplitMix) -> usize {
    rng.below(VOCABULARY.len() as u64) as usize
}

/// How many words of the answer starting at `start` make up `text`
/// exactly, or None when `text` is not such a beginning.
pub fn words_matching(text: &str, start: usize) -> Option<u64> {
    let mut rest = text;
    let mut count = 0;
    while !rest.is_empty() {
        let word = VOCABULARY[(start + count) % VOCABULARY.len()];
        rest = rest.strip_prefix(word)?;
        count += 1;
    }
    Some(count as u64)
}

/// Where a completion prompt's own earlier answer begins: the longest
/// trailing run of vocabulary words that the model, asked the prompt
/// before the run, would have started with. Returns the byte offset and
/// the number of words, or None when the prompt ends with no such run.
pub fn split_own_answer(model: &str, prompt: &str) -> Option<(usize, u64)> {
    // Walk back over every chain of consecutive words that ends the prompt;
    // "." appears twice in the vocabulary, so there can be two.
    let mut candidates: Vec<(usize, usize, u64)> = Vec::new(); // (offset, first word, words)
    let mut chains: Vec<(usize, usize, u64)> = VOCABULARY
        .iter()
        .enumerate()
        .filter(|(_, w)| prompt.ends_with(*w))
        .map(|(i, w)| (prompt.len() - w.len(), i, 1))
        .collect();
    while let Some((offset, word, words)) = chains.pop() {
        candidates.push((offset, word, words));
        if words as usize >= MAX_RUN {
            continue;
        }
        let before = (word + VOCABULARY.len() - 1) % VOCABULARY.len();
        let head = &prompt[..offset];
        if head.ends_with(VOCABULARY[before]) {
            chains.push((offset - VOCABULARY[before].len(), before, words + 1));
        }
    }
    // The hash of each candidate's head, in one pass over the prompt.
    let mut offsets: Vec<usize> = candidates.iter().map(|c| c.0).collect();
    offsets.sort_unstable();
    offsets.dedup();
    let mut hashes = Vec::with_capacity(offsets.len());
    let mut hash = Fnv::new();
    hash.write(model.as_bytes());
    hash.write(&[0]);
    let mut done = 0;
    for &offset in &offsets {
        hash.write(&prompt.as_bytes()[done..offset]);
        done = offset;
        hashes.push((offset, hash.0));
    }
    candidates
        .into_iter()
        .filter(|(offset, word, _)| {
            let seed = hashes
                .iter()
                .find(|(o, _)| o == offset)
                .map(|(_, h)| *h)
                .expect("every candidate offset was hashed");
            first_word(&mut SplitMix::new(seed)) == *word
        })
        .max_by_key(|(_, _, words)| *words)
        .map(|(offset, _, words)| (offset, words))
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(model: &str, conversation: &str, words: usize) -> String {
        let start = first_word(&mut content_rng(model, conversation));
        (0..words)
            .map(|i| VOCABULARY[(start + i) % VOCABULARY.len()])
            .collect()
    }

    #[test]
    fn the_same_conversation_gets_the_same_words_from_every_replica() {
        assert_eq!(answer("m", "hello", 5), answer("m", "hello", 5));
        let starts: std::collections::BTreeSet<usize> = (0..50)
            .map(|i| first_word(&mut content_rng("m", &format!("prompt {i}"))))
            .collect();
        assert!(starts.len() > 10, "answers barely vary: {starts:?}");
    }

    #[test]
    fn words_matching_counts_whole_words_only() {
        assert_eq!(words_matching("", 3), Some(0));
        assert_eq!(words_matching(" fox jumps", 3), Some(2));
        assert_eq!(words_matching(" fox jum", 3), None);
        assert_eq!(words_matching(" time.The", 24), Some(3));
    }

    #[test]
    fn a_completion_prompt_ending_in_the_models_own_answer_is_split_there() {
        let prompt = "Write a sentence:";
        let said = answer("m", prompt, 7);
        let joined = format!("{prompt}{said}");
        assert_eq!(split_own_answer("m", &joined), Some((prompt.len(), 7)));
        assert_eq!(split_own_answer("m", prompt), None);
        // Words the model would not have started with are the user's own.
        let other = answer("other-model", prompt, 7);
        if other != said {
            let found = split_own_answer("m", &format!("{prompt}{other}"));
            assert_ne!(found, Some((prompt.len(), 7)));
        }
    }
}
