//! "Did you mean": for an option the engine does not know, the options it
//! most likely stands for. Spelling similarity cannot tell that vLLM's
//! `--max-model-len` is SGLang's `--context-length`, so a table of
//! cross-engine equivalents comes first; then the engine's own options that
//! are spelled alike.

use crate::argparse::Parser;
use crate::registry::Engine;

/// One likely meaning of an unknown option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suggestion {
    /// An option of the engine being checked.
    pub flag: String,
    /// Why, when it is not a near spelling (the other engine's name).
    pub why: Option<String>,
}

/// vLLM options and the SGLang options that do the same, both ways.
/// Facts about the engines; each pair was checked against the data files of
/// vLLM 0.11 and SGLang 0.5.23, and a suggestion is only made when the
/// target exists in the release being checked.
const EQUIVALENTS: &[(&str, &str)] = &[
    ("--max-model-len", "--context-length"),
    ("--gpu-memory-utilization", "--mem-fraction-static"),
    ("--tensor-parallel-size", "--tp-size"),
    ("-tp", "--tp-size"),
    ("--pipeline-parallel-size", "--pp-size"),
    ("-pp", "--pp-size"),
    ("--data-parallel-size", "--dp-size"),
    ("-dp", "--dp-size"),
    ("--max-num-seqs", "--max-running-requests"),
    ("--max-num-batched-tokens", "--chunked-prefill-size"),
    ("--no-enable-prefix-caching", "--disable-radix-cache"),
    ("--seed", "--random-seed"),
    ("--tokenizer", "--tokenizer-path"),
];

/// Options of one engine that the other never needs, with the reason.
const NOT_NEEDED: &[(Engine, &str, &str)] = &[(
    Engine::Sglang,
    "--enable-prefix-caching",
    "SGLang caches prefixes by default (its radix cache); --disable-radix-cache turns it off",
)];

/// The options `token` most likely meant, best first (at most three).
pub fn suggest(parser: &Parser<'_>, token: &str) -> Vec<Suggestion> {
    let name = token.split_once('=').map_or(token, |(n, _)| n);
    let mut found: Vec<Suggestion> = Vec::new();
    let exists = |flag: &str| parser.action_for(flag).is_some();
    let other = match parser.engine {
        Engine::Vllm => "SGLang",
        Engine::Sglang => "vLLM",
    };
    for (vllm, sglang) in EQUIVALENTS {
        let (from, to) = match parser.engine {
            Engine::Sglang => (vllm, sglang),
            Engine::Vllm => (sglang, vllm),
        };
        if *from == name && exists(to) {
            found.push(Suggestion {
                flag: to.to_string(),
                why: Some(format!("{other} calls it {from}")),
            });
        }
    }
    for (engine, flag, why) in NOT_NEEDED {
        if *engine == parser.engine && *flag == name {
            found.push(Suggestion {
                flag: String::new(),
                why: Some((*why).to_string()),
            });
        }
    }
    // The spelling vLLM accepts but SGLang does not.
    let dashed = format!("--{}", name.trim_start_matches('-').replace('_', "-"));
    if dashed != name && exists(&dashed) {
        found.push(Suggestion {
            flag: dashed,
            why: None,
        });
    }
    let mut near: Vec<(usize, &str)> = parser
        .option_strings()
        .filter(|f| f.starts_with("--"))
        .filter_map(|flag| {
            let distance = edit_distance(name, flag);
            let limit = (name.len() / 4).max(2);
            let close = distance <= limit || (name.len() >= 6 && flag.starts_with(name));
            close.then_some((distance, flag))
        })
        .collect();
    near.sort();
    for (_, flag) in near {
        if !found.iter().any(|s| s.flag == flag) {
            found.push(Suggestion {
                flag: flag.to_string(),
                why: None,
            });
        }
    }
    found.truncate(3);
    found
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// "did you mean ..." for a message, or nothing.
pub fn describe(suggestions: &[Suggestion]) -> String {
    let mut parts = Vec::new();
    let mut notes = Vec::new();
    for s in suggestions {
        match (&s.why, s.flag.is_empty()) {
            (Some(why), true) => notes.push(why.clone()),
            (Some(why), false) => parts.push(format!("{} ({why})", s.flag)),
            (None, _) => parts.push(s.flag.clone()),
        }
    }
    let mut out = String::new();
    if !parts.is_empty() {
        out = format!("; did you mean {}?", parts.join(" or "));
    }
    for note in notes {
        out.push_str(&format!("; {note}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    #[test]
    fn distance_counts_edits() {
        assert_eq!(edit_distance("--port", "--prot"), 2);
        assert_eq!(edit_distance("--host", "--hosts"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
