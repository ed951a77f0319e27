//! The fuzz targets in the normal test run: every corpus file, then seeded
//! mutations of them for a bounded time per target. A panic names the
//! target and prints the input (hex) so it can be added to the corpus.
//! Long runs use libFuzzer: `cargo fuzz run NAME` (docs/security.md).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Instant;

use llmgw_fuzz_targets::{SMOKE_BUDGET, TARGETS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// One to four random edits: flip, insert, delete, duplicate, splice.
fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = data.len();
        match rng.random_range(0..5) {
            0 if len > 0 => {
                let at = rng.random_range(0..len);
                data[at] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                let at = rng.random_range(0..=len);
                let byte = match rng.random_range(0..3) {
                    0 => rng.random(),
                    1 => b"{}[]:,-\n\"\0"[rng.random_range(0..10)],
                    _ => b' ',
                };
                data.insert(at, byte);
            }
            2 if len > 0 => {
                let from = rng.random_range(0..len);
                let to = rng.random_range(from..=len.min(from + 16));
                data.drain(from..to);
            }
            3 if len > 0 => {
                let from = rng.random_range(0..len);
                let to = rng.random_range(from..=len.min(from + 32));
                let piece = data[from..to].to_vec();
                let at = rng.random_range(0..=data.len());
                data.splice(at..at, piece);
            }
            _ if !other.is_empty() => {
                let at = rng.random_range(0..=len);
                let from = rng.random_range(0..other.len());
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    data
}

fn run_one(name: &str, target: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        panic!("fuzz target {name} panicked on input (hex) {hex}");
    }
}

#[test]
fn every_target_survives_its_corpus_and_seeded_mutations() {
    let mut report = Vec::new();
    for (i, (name, target)) in TARGETS.iter().enumerate() {
        let seeds = corpus(name);
        assert!(!seeds.is_empty(), "fuzz/corpus/{name} is empty");
        for input in &seeds {
            run_one(name, *target, input);
        }
        let mut rng = StdRng::seed_from_u64(0x11_6a_77 + i as u64);
        let started = Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < SMOKE_BUDGET {
            let input = &seeds[rng.random_range(0..seeds.len())];
            let other = &seeds[rng.random_range(0..seeds.len())];
            let mutated = mutate(&mut rng, input, other);
            run_one(name, *target, &mutated);
            runs += 1;
        }
        report.push(format!(
            "{name}: {} corpus inputs, {runs} mutations",
            seeds.len()
        ));
    }
    println!("{}", report.join("\n"));
}

/// Deep nesting reaches every text parser without a panic or a stack
/// overflow: the inputs that once aborted a peer.
#[test]
fn deep_nesting_reaches_every_text_target_safely() {
    let nested = [
        "- ".repeat(30_000) + "x\n",
        "[".repeat(50_000),
        "{\"a\":".repeat(20_000) + "1" + &"}".repeat(20_000),
    ];
    for (name, target) in TARGETS {
        for input in &nested {
            run_one(name, *target, input.as_bytes());
        }
    }
}

/// A seed that its target refuses at the first step fuzzes nothing: the
/// binary and JSON seeds decode.
#[test]
fn the_seeds_are_what_their_targets_read() {
    use prost::Message;
    for seed in corpus("state_apply") {
        serde_json::from_slice::<Vec<llmgw_state::Command>>(&seed)
            .unwrap_or_else(|e| panic!("a state_apply seed does not decode: {e}"));
    }
    for seed in corpus("agent_message") {
        let message = llmgw_proto::agent::AgentMessage::decode(seed.as_slice()).unwrap();
        assert!(message.body.is_some(), "{message:?}");
    }
    for seed in corpus("router_request") {
        let _: serde_json::Value = serde_json::from_slice(&seed).unwrap();
    }
}
