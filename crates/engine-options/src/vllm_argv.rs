//! What vLLM's `FlexibleArgumentParser` does around argparse: before
//! parsing it rewrites `--max_model_len` to `--max-model-len`,
//! `--help=KEYWORD` to `--help`, `-O3` to `-O 3`, and gathers dotted keys
//! (`--compilation-config.mode 3`) into one JSON value per option; after
//! parsing it warns about deprecated options whose value changed.
//! `--config FILE` and moving `--model` are left out: they read files or
//! depend on the release, and llmgw manages `--model` itself.

use serde_json::{Map, Value};

use crate::argparse::{Parsed, Parser};
use crate::pyjson::{self, Dialect};
use crate::registry::Version;

/// The release differences in this rewriting, as facts about vLLM.
struct Release {
    /// 0.11.0 refuses `--model`; later releases move its value to the front.
    moves_model_option: bool,
    before_0_12: bool,
}

impl Release {
    fn of(parser: &Parser<'_>) -> Self {
        let version = parser.version.unwrap_or(Version::new(0, 0, 0));
        Self {
            moves_model_option: version >= Version::new(0, 11, 1),
            before_0_12: version < Version::new(0, 12, 0),
        }
    }
}

/// `--model X` anywhere becomes the positional model, with a warning.
fn move_model_option(release: &Release, args: &mut Vec<String>, warnings: &mut Vec<String>) {
    let Some(at) = args
        .iter()
        .position(|a| a == "--model" || (a.starts_with("--model=") && a.len() > 8))
    else {
        return;
    };
    let (model, rest_from) = match args[at].strip_prefix("--model=") {
        Some(model) => (model.to_string(), at + 1),
        None => match args.get(at + 1) {
            Some(model) => (model.clone(), at + 2),
            // vLLM fails with an IndexError; argparse's refusal is close.
            None => return,
        },
    };
    let removal = if release.before_0_12 {
        "in v0.13"
    } else {
        "in a future version"
    };
    warnings.push(format!(
        "With `vllm serve`, you should provide the model as a positional argument or in a config file instead of via the `--model` option. The `--model` option will be removed {removal}."
    ));
    let mut moved = vec![model];
    moved.extend(args[..at].iter().cloned());
    moved.extend(args[rest_from..].iter().cloned());
    *args = moved;
}

/// vLLM 0.12 and later add a hint to an unrecognized `--task`.
pub fn amend_error(parser: &Parser<'_>, message: &mut String) {
    let unrecognized = message
        .strip_prefix("unrecognized arguments: ")
        .is_some_and(|rest| {
            rest.split(' ')
                .any(|a| a == "--task" || a.starts_with("--task="))
        });
    if unrecognized && !Release::of(parser).before_0_12 {
        message.push_str(
            "\n\nHint: --task is not a vllm serve option. For embedding, reranking, or reward models, use --runner pooling. To adapt a generative model for pooling, also use --convert embed, --convert classify, or --convert reward.",
        );
    }
}

/// The command line as argparse receives it, and warnings printed before.
pub fn rewrite(parser: &Parser<'_>, args: &[String]) -> (Vec<String>, Vec<String>) {
    let release = Release::of(parser);
    let mut warnings = Vec::new();
    let mut args = args.to_vec();
    if release.moves_model_option {
        move_model_option(&release, &mut args, &mut warnings);
    }
    if release.before_0_12 && args.iter().any(|a| a == "--disable-log-requests") {
        warnings.push(
            "argument '--disable-log-requests' is deprecated and replaced with '--enable-log-requests'. This will be removed in v0.12.0.".to_string(),
        );
    }
    // `-O3`: the compilation level in 0.11, `--optimization-level` later.
    let level_option = if parser.action_for("--optimization-level").is_some() {
        "--optimization-level"
    } else {
        "-O"
    };
    let mut processed = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        if arg.starts_with("--help=") {
            processed.push("--help".to_string());
        } else if arg.starts_with("--") {
            processed.push(match arg.split_once('=') {
                Some((key, value)) => format!("{}={value}", dashes_in_name(key)),
                None => dashes_in_name(arg),
            });
        } else if let Some(level) = arg
            .strip_prefix("-O")
            .filter(|l| !l.is_empty() && !l.starts_with('.'))
        {
            processed.push(level_option.to_string());
            processed.push(level.strip_prefix('=').unwrap_or(level).to_string());
        } else if arg == "-O"
            && args
                .get(i + 1)
                .is_some_and(|n| ["0", "1", "2", "3"].contains(&n.as_str()))
        {
            processed.push(level_option.to_string());
        } else {
            processed.push(arg.clone());
        }
    }
    if !release.before_0_12 {
        let repeated = repeated_options(&processed);
        if !repeated.is_empty() {
            warnings.push(format!("Found duplicate keys {}", repeated.join(", ")));
        }
    }
    (gather_dotted_keys(processed), warnings)
}

/// Long options given more than once (vLLM 0.12 and later warn).
fn repeated_options(args: &[String]) -> Vec<String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut repeated: Vec<String> = Vec::new();
    for arg in args
        .iter()
        .filter(|a| a.starts_with("--") && !a.contains('.'))
    {
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        if seen.contains(&name) {
            if !repeated.iter().any(|r| r == name) {
                repeated.push(name.to_string());
            }
        } else {
            seen.push(name);
        }
    }
    repeated
}

/// `--max_model_len` to `--max-model-len`: underscores after `--` up to the
/// first `.` (what follows a dot is a JSON key, kept as written).
fn dashes_in_name(key: &str) -> String {
    let body = &key[2..];
    let end = body.find('.').unwrap_or(body.len());
    format!("--{}{}", body[..end].replace('_', "-"), &body[end..])
}

/// `--opt.a.b VALUE` becomes `--opt '{"a": {"b": VALUE}}'`, appended after
/// the other arguments; `--opt.list+ a,b` appends to a list.
fn gather_dotted_keys(args: Vec<String>) -> Vec<String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut gathered: Vec<(String, Map<String, Value>)> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if !(arg.starts_with('-') && arg.contains('.')) {
            kept.push(arg.clone());
            continue;
        }
        let (name, text) = match arg.split_once('=') {
            Some((name, text)) if name.contains('.') => (name.to_string(), text.to_string()),
            Some(_) => {
                kept.push(arg.clone());
                continue;
            }
            None => match args.get(i) {
                Some(next) => {
                    i += 1;
                    (arg.clone(), next.clone())
                }
                // vLLM fails with an IndexError here; the token is left for
                // argparse, which refuses it as unrecognized.
                None => {
                    kept.push(arg.clone());
                    continue;
                }
            },
        };
        let (name, value) = match name.strip_suffix('+') {
            Some(name) => (
                name.to_string(),
                Value::Array(text.split(',').map(|s| Value::String(s.into())).collect()),
            ),
            None => (
                name,
                pyjson::loads(&text, Dialect::Python).unwrap_or(Value::String(text)),
            ),
        };
        let mut keys = name.split('.');
        let option = keys.next().unwrap_or_default().to_string();
        let path: Vec<&str> = keys.collect();
        let mut nested = value;
        for key in path.iter().rev() {
            let mut map = Map::new();
            map.insert((*key).to_string(), nested);
            nested = Value::Object(map);
        }
        let slot = match gathered.iter_mut().find(|(o, _)| *o == option) {
            Some((_, map)) => map,
            None => {
                gathered.push((option, Map::new()));
                &mut gathered.last_mut().expect("just pushed").1
            }
        };
        if let Value::Object(update) = nested {
            merge(slot, update);
        }
    }
    for (option, map) in gathered {
        kept.push(option);
        kept.push(python_dumps(&Value::Object(map)));
    }
    kept
}

fn merge(into: &mut Map<String, Value>, update: Map<String, Value>) {
    for (key, value) in update {
        match (into.get_mut(&key), value) {
            (Some(Value::Object(old)), Value::Object(new)) => merge(old, new),
            (Some(Value::Array(old)), Value::Array(new)) => old.extend(new),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// `json.dumps` with Python's default separators and ASCII escaping.
fn python_dumps(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {}",
                        python_dumps(&Value::String(k.clone())),
                        python_dumps(v)
                    )
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_dumps).collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        other => other.to_string(),
    }
}

/// vLLM (on Python < 3.13) warns once per deprecated option whose value
/// differs from its default, after parsing.
pub fn deprecation_warnings(parser: &Parser<'_>, parsed: &mut Parsed) {
    for action in parser.actions() {
        let arg = action.arg;
        if !arg.deprecated || !arg.deprecation_is_vllm_post_parse() {
            continue;
        }
        if parsed
            .values
            .get(&arg.dest)
            .is_some_and(|v| *v != arg.default)
        {
            let warning = format!("argument '{}' is deprecated", arg.dest);
            if !parsed.warnings.contains(&warning) {
                parsed.warnings.push(warning);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dotted_keys_become_one_json_value() {
        let out = gather_dotted_keys(strings(&[
            "M",
            "--compilation-config.mode",
            "3",
            "--compilation-config.custom_ops+",
            "+a,-b",
            "--port",
            "1",
        ]));
        assert_eq!(
            out,
            strings(&[
                "M",
                "--port",
                "1",
                "--compilation-config",
                "{\"custom_ops\": [\"+a\", \"-b\"], \"mode\": 3}"
            ])
        );
    }

    #[test]
    fn underscores_change_only_in_the_option_name() {
        assert_eq!(dashes_in_name("--max_model_len"), "--max-model-len");
        assert_eq!(dashes_in_name("--a_b.c_d"), "--a-b.c_d");
    }
}
