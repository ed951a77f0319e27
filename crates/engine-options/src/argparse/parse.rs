//! `parse_args`, step by step as Python 3.11 takes them: classify every
//! token first (ambiguous abbreviations fail here, before any value is
//! read), then consume positionals and options alternately, then check
//! required arguments and report what was left over.

use serde_json::Value;

use super::nargs::{missing_message, option_count, positional_counts};
use super::{Action, ActionKind, ParseError, Parsed, Parser};
use crate::convert::ConvertError;
use crate::data::Nargs;
use crate::pyrepr::{str_repr, value_repr};

/// A token that names an option: which action (none when unknown), the
/// option string as matched, and a value attached with `=`.
#[derive(Debug, Clone)]
struct OptionToken {
    action: Option<usize>,
    option_string: String,
    explicit: Option<String>,
}

/// The state of one parse.
struct Run<'p, 'd> {
    parser: &'p Parser<'d>,
    args: Vec<String>,
    pattern: Vec<u8>,
    options: Vec<Option<OptionToken>>,
    parsed: Parsed,
    seen: Vec<bool>,
    extras: Vec<String>,
    positionals: Vec<usize>,
}

impl<'d> Parser<'d> {
    /// Parses `args` (what follows the program name) as the engine does,
    /// after the engine's own rewriting of the command line.
    pub fn parse(&self, args: &[String]) -> Result<Parsed, ParseError> {
        let (args, mut early_warnings) = if self.data.underscore_spelling {
            crate::vllm_argv::rewrite(self, args)
        } else {
            (args.to_vec(), Vec::new())
        };
        let mut parsed = self.parse_rewritten(args).map_err(|mut error| {
            if self.data.underscore_spelling {
                crate::vllm_argv::amend_error(self, &mut error.message);
            }
            error
        })?;
        early_warnings.append(&mut parsed.warnings);
        parsed.warnings = early_warnings;
        if self.data.underscore_spelling && !parsed.help {
            crate::vllm_argv::deprecation_warnings(self, &mut parsed);
        }
        Ok(parsed)
    }

    fn parse_rewritten(&self, args: Vec<String>) -> Result<Parsed, ParseError> {
        let mut run = Run {
            parser: self,
            pattern: Vec::with_capacity(args.len()),
            options: Vec::with_capacity(args.len()),
            parsed: Parsed::default(),
            seen: vec![false; self.actions.len()],
            extras: Vec::new(),
            positionals: (0..self.actions.len())
                .filter(|i| self.actions[*i].arg.is_positional())
                .collect(),
            args,
        };
        for action in &self.actions {
            if !action.arg.default_is_suppressed() {
                run.parsed
                    .values
                    .insert(action.arg.dest.clone(), action.arg.default.clone());
            }
        }
        run.classify()?;
        if run.consume_all()? {
            return Ok(run.parsed);
        }
        run.finish()
    }

    /// argparse's `_parse_optional`: whether a token is an option, and which.
    fn option_token(&self, token: &str) -> Result<Option<OptionToken>, ParseError> {
        if !token.starts_with('-') {
            return Ok(None);
        }
        if let Some(index) = self.by_string.get(token) {
            return Ok(Some(OptionToken {
                action: Some(*index),
                option_string: token.to_string(),
                explicit: None,
            }));
        }
        if token.len() == 1 {
            return Ok(None);
        }
        if let Some((name, value)) = token.split_once('=')
            && let Some(index) = self.by_string.get(name)
        {
            return Ok(Some(OptionToken {
                action: Some(*index),
                option_string: name.to_string(),
                explicit: Some(value.to_string()),
            }));
        }
        let matches = self.prefix_matches(token);
        if matches.len() > 1 {
            let names: Vec<&str> = matches.iter().map(|m| m.option_string.as_str()).collect();
            return Err(self.error(format!(
                "ambiguous option: {token} could match {}",
                names.join(", ")
            )));
        }
        if let Some(only) = matches.into_iter().next() {
            return Ok(Some(only));
        }
        if is_negative_number(token) || token.contains(' ') {
            return Ok(None);
        }
        Ok(Some(OptionToken {
            action: None,
            option_string: token.to_string(),
            explicit: None,
        }))
    }

    /// argparse's `_get_option_tuples`: options a token abbreviates.
    fn prefix_matches(&self, token: &str) -> Vec<OptionToken> {
        let mut found = Vec::new();
        if token.starts_with("--") {
            if !self.data.allow_abbrev {
                return found;
            }
            let (prefix, explicit) = match token.split_once('=') {
                Some((p, v)) => (p, Some(v.to_string())),
                None => (token, None),
            };
            for (string, index) in &self.strings {
                if string.starts_with(prefix) {
                    found.push(OptionToken {
                        action: Some(*index),
                        option_string: string.clone(),
                        explicit: explicit.clone(),
                    });
                }
            }
        } else {
            // `-tp4`: a single-dash option followed by its value, or a
            // prefix of a longer single-dash option.
            let short: String = token.chars().take(2).collect();
            let attached = &token[short.len()..];
            for (string, index) in &self.strings {
                if *string == short {
                    found.push(OptionToken {
                        action: Some(*index),
                        option_string: string.clone(),
                        explicit: Some(attached.to_string()),
                    });
                } else if string.starts_with(token) {
                    found.push(OptionToken {
                        action: Some(*index),
                        option_string: string.clone(),
                        explicit: None,
                    });
                }
            }
        }
        found
    }
}

/// argparse's `^-\d+$|^-\d*\.\d+$`: a negative number is an argument.
pub fn is_negative_number(token: &str) -> bool {
    let Some(body) = token.strip_prefix('-') else {
        return false;
    };
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    match body.split_once('.') {
        None => !body.is_empty() && digits(body),
        Some((whole, fraction)) => digits(whole) && !fraction.is_empty() && digits(fraction),
    }
}

impl Run<'_, '_> {
    fn classify(&mut self) -> Result<(), ParseError> {
        let mut after_marker = false;
        for token in &self.args {
            if after_marker {
                self.pattern.push(b'A');
                self.options.push(None);
            } else if token == "--" {
                after_marker = true;
                self.pattern.push(b'-');
                self.options.push(None);
            } else {
                let option = self.parser.option_token(token)?;
                self.pattern
                    .push(if option.is_some() { b'O' } else { b'A' });
                self.options.push(option);
            }
        }
        Ok(())
    }

    /// The main loop. Returns true when `--help` ended the parse.
    fn consume_all(&mut self) -> Result<bool, ParseError> {
        let last_option = self.options.iter().rposition(Option::is_some);
        let mut start = 0;
        if let Some(last_option) = last_option {
            while start <= last_option {
                let next_option = (start..self.options.len())
                    .find(|i| self.options[*i].is_some())
                    .unwrap_or(last_option);
                if start != next_option {
                    let end = self.consume_positionals(start)?;
                    if end > start {
                        start = end;
                        continue;
                    }
                }
                if self.options[start].is_none() {
                    self.extras
                        .extend(self.args[start..next_option].iter().cloned());
                    start = next_option;
                }
                match self.consume_option(start)? {
                    Some(stop) => start = stop,
                    None => return Ok(true),
                }
            }
        }
        let stop = self.consume_positionals(start)?;
        self.extras.extend(self.args[stop..].iter().cloned());
        Ok(false)
    }

    fn consume_positionals(&mut self, start: usize) -> Result<usize, ParseError> {
        let nargs: Vec<Nargs> = self
            .positionals
            .iter()
            .map(|i| self.parser.actions[*i].arg.nargs)
            .collect();
        let counts = positional_counts(&nargs, &self.pattern[start..]);
        let mut index = start;
        for (position, count) in counts.iter().enumerate() {
            let action = self.positionals[position];
            let strings = self.args[index..index + count].to_vec();
            index += count;
            self.take_action(action, strings, None)?;
        }
        self.positionals.drain(..counts.len());
        Ok(index)
    }

    /// Consumes the option at `start`; returns where the next token is, or
    /// `None` when the option was `--help`.
    fn consume_option(&mut self, start: usize) -> Result<Option<usize>, ParseError> {
        let Some(token) = self.options[start].clone() else {
            return Ok(Some(start + 1));
        };
        let OptionToken {
            action,
            mut option_string,
            mut explicit,
        } = token;
        let Some(mut action) = action else {
            self.extras.push(self.args[start].clone());
            return Ok(Some(start + 1));
        };
        let mut taken: Vec<(usize, Vec<String>, String)> = Vec::new();
        let stop;
        loop {
            let act = &self.parser.actions[action];
            let nargs = act.arg.nargs;
            if let Some(value) = explicit.take() {
                let count = option_count(nargs, b"A")
                    .ok_or_else(|| self.parser.argument_error(act, missing_message(nargs)))?;
                let single_dash = !option_string[1..].starts_with('-');
                if count == 0 && single_dash && !value.is_empty() {
                    // `-xyz`: `-x` takes nothing, so `-y` follows.
                    taken.push((action, Vec::new(), option_string.clone()));
                    let mut chars = value.chars();
                    let next = chars.next().unwrap_or_default();
                    option_string = format!("-{next}");
                    let rest: String = chars.collect();
                    match self.parser.by_string.get(&option_string) {
                        Some(index) => {
                            action = *index;
                            explicit = (!rest.is_empty()).then_some(rest);
                        }
                        None => {
                            return Err(self.parser.argument_error(
                                act,
                                format!("ignored explicit argument {}", str_repr(&value)),
                            ));
                        }
                    }
                } else if count == 1 {
                    taken.push((action, vec![value], option_string.clone()));
                    stop = start + 1;
                    break;
                } else {
                    return Err(self.parser.argument_error(
                        act,
                        format!("ignored explicit argument {}", str_repr(&value)),
                    ));
                }
            } else {
                let from = start + 1;
                let count = option_count(nargs, &self.pattern[from..])
                    .ok_or_else(|| self.parser.argument_error(act, missing_message(nargs)))?;
                taken.push((
                    action,
                    self.args[from..from + count].to_vec(),
                    option_string,
                ));
                stop = from + count;
                break;
            }
        }
        for (action, strings, option_string) in taken {
            if self.parser.actions[action].kind.is_help() {
                self.parsed.help = true;
                return Ok(None);
            }
            self.take_action(action, strings, Some(&option_string))?;
        }
        Ok(Some(stop))
    }

    fn take_action(
        &mut self,
        index: usize,
        mut strings: Vec<String>,
        option_string: Option<&str>,
    ) -> Result<(), ParseError> {
        let action = &self.parser.actions[index];
        self.seen[index] = true;
        if action.arg.nargs != Nargs::Rest
            && let Some(marker) = strings.iter().position(|s| s == "--")
        {
            strings.remove(marker);
        }
        let values = self.values(action, strings)?;
        let dest = action.arg.dest.clone();
        let (stored, warning) = action
            .kind
            .apply(
                action.arg,
                self.parsed.values.get(&dest),
                values,
                option_string,
            )
            .map_err(|message| self.parser.error(message))?;
        if let Some(warning) = warning {
            self.parsed.warnings.push(warning);
        }
        if !self.parsed.given.contains(&dest) && option_string.is_some() {
            self.parsed.given.push(dest.clone());
        }
        self.parsed.values.insert(dest, stored);
        Ok(())
    }

    /// argparse's `_get_values`.
    fn values(&self, action: &Action<'_>, strings: Vec<String>) -> Result<Value, ParseError> {
        let arg = action.arg;
        let positional = arg.is_positional();
        if strings.is_empty() && arg.nargs == Nargs::Optional {
            let value = if positional {
                arg.default.clone()
            } else {
                arg.constant.clone().unwrap_or(Value::Null)
            };
            return match value {
                Value::String(text) => self.convert_checked(action, &text),
                other => Ok(other),
            };
        }
        if strings.is_empty() && arg.nargs == Nargs::ZeroOrMore && positional {
            return Ok(if arg.default.is_null() {
                Value::Array(Vec::new())
            } else {
                arg.default.clone()
            });
        }
        if strings.len() == 1 && matches!(arg.nargs, Nargs::One | Nargs::Optional) {
            return self.convert_checked(action, &strings[0]);
        }
        if matches!(
            action.kind,
            ActionKind::Const(_) | ActionKind::BooleanOptional
        ) || arg.nargs == Nargs::Exactly(0)
        {
            return Ok(Value::Array(Vec::new()));
        }
        let mut items = Vec::with_capacity(strings.len());
        for text in &strings {
            items.push(self.convert_checked(action, text)?);
        }
        Ok(Value::Array(items))
    }

    fn convert_checked(&self, action: &Action<'_>, text: &str) -> Result<Value, ParseError> {
        let value = action.converter.convert(text).map_err(|e| match e {
            ConvertError::Invalid => {
                let name = action
                    .arg
                    .type_name
                    .as_deref()
                    .and_then(|t| self.parser.data.types.get(t))
                    .map_or("str", |t| t.argparse_name.as_str());
                self.parser
                    .argument_error(action, format!("invalid {name} value: {}", str_repr(text)))
            }
            ConvertError::Message(message) => self.parser.argument_error(action, message),
        })?;
        self.check_choice(action, &value)?;
        Ok(value)
    }

    /// argparse's `_check_value`.
    fn check_choice(&self, action: &Action<'_>, value: &Value) -> Result<(), ParseError> {
        let arg = action.arg;
        let Some(choices) = &arg.choices else {
            return Ok(());
        };
        let python: Vec<Value> = match &arg.choices_python {
            Some(values) => values.clone(),
            None => choices.iter().cloned().map(Value::String).collect(),
        };
        if python.iter().any(|c| same_python_value(c, value)) {
            return Ok(());
        }
        let listed: Vec<String> = python.iter().map(value_repr).collect();
        Err(self.parser.argument_error(
            action,
            format!(
                "invalid choice: {} (choose from {})",
                value_repr(value),
                listed.join(", ")
            ),
        ))
    }

    fn finish(mut self) -> Result<Parsed, ParseError> {
        let mut required = Vec::new();
        for (index, action) in self.parser.actions.iter().enumerate() {
            if self.seen[index] {
                continue;
            }
            if action.arg.required {
                required.push(action.arg.display_name());
            } else if let Value::String(text) = &action.arg.default
                && !action.arg.default_is_suppressed()
                && action.arg.type_name.is_some()
                && let Ok(value) = action.converter.convert(text)
            {
                // argparse converts a text default of an absent argument.
                self.parsed.values.insert(action.arg.dest.clone(), value);
            }
        }
        if !required.is_empty() {
            return Err(self.parser.error(format!(
                "the following arguments are required: {}",
                required.join(", ")
            )));
        }
        if !self.extras.is_empty() {
            return Err(self
                .parser
                .top_error(format!("unrecognized arguments: {}", self.extras.join(" "))));
        }
        Ok(self.parsed)
    }
}

/// Python's `==` between a choice and a value (`1 == 1.0`, `True == 1`).
fn same_python_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Bool(x), Value::Number(y)) | (Value::Number(y), Value::Bool(x)) => {
            y.as_f64() == Some(if *x { 1.0 } else { 0.0 })
        }
        _ => a == b,
    }
}
