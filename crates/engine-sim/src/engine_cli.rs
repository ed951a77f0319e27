//! The engine's command line as the persona's release parses it: options,
//! values, errors and deprecation warnings come from that release's option
//! data through `llmgw-engine-options`, so the simulator accepts and refuses
//! exactly what the engine does. The simulator's own `--sim-*` knobs are
//! taken out first: they are no engine's options and never appear in usage
//! or abbreviation matches.

use std::collections::HashMap;

use llmgw_engine_options::{EngineOptions, ParseError, Parsed, Parser, newest_up_to, versions};

use crate::persona::Persona;

/// The option data for a persona: its release, or the newest older one
/// with data (options are added far more often than removed), or the
/// oldest known when the persona predates them all.
pub fn options_for(persona: Persona) -> &'static EngineOptions {
    let engine = persona.engine;
    let (major, minor, patch) = persona.version;
    let version = llmgw_engine_options::Version::new(major, minor, patch);
    let (_, data) = newest_up_to(engine, version)
        .or_else(|| {
            let oldest = *versions(engine).first()?;
            newest_up_to(engine, oldest)
        })
        .expect("llmgw-engine-options embeds data for both engines");
    data
}

/// `--sim-x V`, `--sim-x=V` and `--sim_x V` out of `args`: the knobs by
/// flag name (`sim-x`), and the rest for the engine's parser.
pub fn split_sim_flags(args: &[String]) -> (HashMap<String, String>, Vec<String>) {
    let mut knobs = HashMap::new();
    let mut rest = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(body) = arg
            .strip_prefix("--sim")
            .filter(|b| b.starts_with(['-', '_']))
        else {
            rest.push(arg.clone());
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        let value = value.or_else(|| {
            let next = args.get(i).cloned();
            i += usize::from(next.is_some());
            next
        });
        knobs.insert(
            format!("sim{}", name.replace('_', "-")),
            value.unwrap_or_default(),
        );
    }
    (knobs, rest)
}

/// Parses the engine part of a command line for `persona`.
pub fn parse(persona: Persona, args: &[String]) -> Result<Parsed, ParseError> {
    Parser::new(options_for(persona)).parse(args)
}

/// The dest under which the persona's release stores `flag`: releases
/// rename dests (SGLang's `--tp-size` is `tensor_parallel_size` in 0.5.10,
/// `tp_size` in 0.5.23). A positional is named by its dest with dashes.
pub fn dest_of(persona: Persona, flag: &str) -> String {
    options_for(persona)
        .options
        .iter()
        .find(|o| o.flags.iter().chain(&o.hidden_flags).any(|f| f == flag))
        .map_or_else(
            || flag.trim_start_matches('-').replace('-', "_"),
            |o| o.dest.clone(),
        )
}

/// `usage: ...` as the persona's release prints it.
pub fn usage(persona: Persona) -> String {
    format!("usage: {}", options_for(persona).usage)
}

/// The program name in the persona's error messages.
pub fn prog(persona: Persona) -> String {
    options_for(persona).prog.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn sim_knobs_are_taken_out_in_every_spelling() {
        let (knobs, rest) = split_sim_flags(&strings(
            "M --sim-ttft 1ms --port 1 --sim_itl=2ms --sim-seed 7",
        ));
        assert_eq!(rest, strings("M --port 1"));
        assert_eq!(knobs["sim-ttft"], "1ms");
        assert_eq!(knobs["sim-itl"], "2ms");
        assert_eq!(knobs["sim-seed"], "7");
    }

    #[test]
    fn each_persona_parses_with_its_release() {
        let sglang = Persona::parse("sglang=0.5.23").unwrap();
        let parsed = parse(
            sglang,
            &strings("--model-path M --tp 16 --context-length 8k"),
        )
        .unwrap();
        assert_eq!(parsed.int(&dest_of(sglang, "--tp-size")), Some(16));
        assert_eq!(parsed.int("context_length"), Some(8000));
        let err = parse(sglang, &strings("--model-path M --max-model-len 8192")).unwrap_err();
        assert_eq!(err.prog, "sglang serve");
        assert_eq!(err.message, "unrecognized arguments: --max-model-len 8192");
        let old = Persona::parse("vllm=0.11.0").unwrap();
        let err = parse(old, &strings("M -n 2")).unwrap_err();
        assert_eq!(err.message, "unrecognized arguments: -n 2");
        let new = Persona::parse("vllm=0.11.1").unwrap();
        assert_eq!(
            parse(new, &strings("M -n 2 -r 1"))
                .unwrap()
                .int("node_rank"),
            Some(1)
        );
    }
}
