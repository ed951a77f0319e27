//! Checking a profile's `engine_args` against an engine release before
//! anything is launched. The engine's parser stops at the first problem;
//! here each option is checked on its own, after the arguments llmgw itself
//! passes, so every problem is reported at once with the item it is in.

use crate::argparse::{Parser, is_negative_number};
use crate::data::{EngineOptions, Nargs};
use crate::suggest::{describe, suggest};

/// A problem with one item of `engine_args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgProblem {
    /// Index into `engine_args`.
    pub index: usize,
    pub message: String,
}

/// Every problem the release's parser would have with `engine_args`, as
/// appended to llmgw's own arguments.
pub fn check_engine_args(data: &EngineOptions, engine_args: &[String]) -> Vec<ArgProblem> {
    let parser = Parser::new(data);
    let release = format!("{} {}", data.engine, data.version);
    let base = required_arguments(&parser);
    let mut problems = Vec::new();
    let starts: Vec<usize> = (0..engine_args.len())
        .filter(|i| starts_option(&engine_args[*i]))
        .collect();
    if let Some(first) = starts.first().copied().or(Some(engine_args.len()))
        && first > 0
    {
        for (index, stray) in engine_args[..first].iter().enumerate() {
            problems.push(ArgProblem {
                index,
                message: format!(
                    "{stray:?} is not an option; engine_args holds options (`--name`) and their values"
                ),
            });
        }
    }
    for (n, start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(engine_args.len());
        let token = &engine_args[*start];
        if let Some(problem) = unknown_option(&parser, &release, token) {
            problems.push(ArgProblem {
                index: *start,
                message: problem,
            });
            continue;
        }
        let mut line = base.clone();
        line.extend(engine_args[*start..end].iter().cloned());
        if let Err(error) = parser.parse(&line) {
            let message = match error.message.strip_prefix("unrecognized arguments: ") {
                Some(left) => format!(
                    "{token} does not take {left}: {release} refuses it (unrecognized arguments: {left})"
                ),
                None => format!("{release} refuses it: {}", error.message),
            };
            problems.push(ArgProblem {
                index: *start,
                message,
            });
        }
    }
    problems
}

/// Whether `token` begins an option (rather than being a value), as the
/// engine's parser classifies it: a leading `-` that is not a negative
/// number.
fn starts_option(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && !is_negative_number(token)
}

/// An option the release does not know, or one that abbreviates several:
/// the message with suggestions.
fn unknown_option(parser: &Parser<'_>, release: &str, token: &str) -> Option<String> {
    let rewritten = if parser.data.underscore_spelling && token.starts_with("--") {
        let (name, value) = token
            .split_once('=')
            .map_or((token, None), |(n, v)| (n, Some(v)));
        let name = format!(
            "--{}",
            name[2..].split('.').next().unwrap_or("").replace('_', "-")
        );
        value.map_or(name.clone(), |v| format!("{name}={v}"))
    } else {
        token.to_string()
    };
    let name = rewritten
        .split_once('=')
        .map_or(rewritten.as_str(), |(n, _)| n);
    if parser.action_for(name).is_some() {
        return None;
    }
    let known = parser.data.allow_abbrev
        && name.starts_with("--")
        && parser.option_strings().any(|f| f.starts_with(name));
    let single_dash_known = !name.starts_with("--")
        && parser
            .option_strings()
            .any(|f| !f.starts_with("--") && (name.starts_with(f) || f.starts_with(name)));
    if known || single_dash_known {
        // An abbreviation (or ambiguous one): the parser itself decides.
        return None;
    }
    let shown = token.split_once('=').map_or(token, |(n, _)| n);
    Some(format!(
        "{shown} is not an option of {release}{}",
        describe(&suggest(parser, shown))
    ))
}

/// What llmgw always passes, so that required arguments are present: the
/// model (positional or `--model-path`) and any other required option.
fn required_arguments(parser: &Parser<'_>) -> Vec<String> {
    let mut line = Vec::new();
    for action in parser.actions() {
        let arg = action.arg;
        if arg.is_positional() {
            if matches!(arg.nargs, Nargs::One | Nargs::Optional | Nargs::OneOrMore) {
                line.push("MODEL".to_string());
            }
        } else if arg.required
            && let Some(flag) = arg.flags.first()
        {
            line.push(flag.clone());
            line.push("MODEL".to_string());
        }
    }
    line
}
