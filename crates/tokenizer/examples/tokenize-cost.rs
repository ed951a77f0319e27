//! What tokenizing a chat request in process costs: the template render
//! and the encoding, for prompts of a few sizes, on the fixture model
//! (a byte-level BPE of 524 tokens, so more tokens per byte than a real
//! vocabulary of 150,000: an upper bound on the encoding's share).
//!
//!   cargo run --release -p llmgw-tokenizer --example tokenize-cost

use std::path::Path;
use std::time::Instant;

use llmgw_tokenizer::{ChatRequest, ModelTokenizer};

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chatml-bpe");
    let tokenizer = ModelTokenizer::load(&dir).expect("fixture model");
    let sentence = "The router sends each request to the engine that already holds its prefix. ";
    println!(
        "{:>12} {:>8} {:>12} {:>12}",
        "prompt bytes", "tokens", "render us", "total us"
    );
    for repeats in [1u32, 10, 100, 400] {
        let system = sentence.repeat(repeats as usize);
        let messages = serde_json::json!([
            {"role": "system", "content": system},
            {"role": "user", "content": "What does a prefix cache hold?"},
        ])
        .to_string();
        let request = ChatRequest {
            messages: &messages,
            add_generation_prompt: true,
            ..Default::default()
        };
        let rounds = 2_000 / repeats.min(100) + 20;
        let started = Instant::now();
        for _ in 0..rounds {
            std::hint::black_box(tokenizer.render_chat(&request).unwrap());
        }
        let render = started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
        let started = Instant::now();
        let mut tokens = 0;
        for _ in 0..rounds {
            tokens = std::hint::black_box(tokenizer.chat_ids(&request).unwrap()).len();
        }
        let total = started.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
        println!(
            "{:>12} {:>8} {:>12.1} {:>12.1}",
            messages.len(),
            tokens,
            render,
            total
        );
    }
}
