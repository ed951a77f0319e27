//! Python 3.11's `argparse`, driven by a data file: the same classification
//! of tokens, abbreviations, `nargs` matching, actions, converters, choices,
//! and the same error texts, so that a command line is accepted or refused
//! exactly as the engine's own parser does.

mod actions;
mod nargs;
mod parse;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::Value;

use crate::convert::Converter;
use crate::data::{Argument, EngineOptions};
use crate::registry::{Engine, Version};

pub use actions::ActionKind;
pub use parse::is_negative_number;

/// One argument, ready to act: what it stores and how values convert.
#[derive(Debug, Clone)]
pub struct Action<'d> {
    pub arg: &'d Argument,
    pub kind: ActionKind,
    pub converter: Converter,
    /// The option strings that error messages show (`flags` of the data).
    pub option_strings: Vec<String>,
}

/// A parser for one engine release.
#[derive(Debug, Clone)]
pub struct Parser<'d> {
    pub data: &'d EngineOptions,
    pub engine: Engine,
    pub version: Option<Version>,
    actions: Vec<Action<'d>>,
    /// Every accepted option string, in registration order (argparse lists
    /// ambiguous matches in this order).
    strings: Vec<(String, usize)>,
    by_string: HashMap<String, usize>,
}

/// A successful parse: the namespace and what the engine printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// Every dest with its value (defaults included), as JSON.
    pub values: BTreeMap<String, Value>,
    /// Dests given on the command line, in the order first given.
    pub given: Vec<String>,
    /// Warnings the parser logs (deprecations), in the order printed.
    pub warnings: Vec<String>,
    /// `-h/--help` was given: the engine prints help and exits 0.
    pub help: bool,
}

impl Parsed {
    pub fn get(&self, dest: &str) -> Option<&Value> {
        self.values.get(dest).filter(|v| !v.is_null())
    }

    /// A text value, or the first of a list.
    pub fn str(&self, dest: &str) -> Option<&str> {
        match self.get(dest)? {
            Value::String(s) => Some(s),
            Value::Array(items) => items.first().and_then(Value::as_str),
            _ => None,
        }
    }

    pub fn int(&self, dest: &str) -> Option<i64> {
        match self.get(dest)? {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub fn float(&self, dest: &str) -> Option<f64> {
        match self.get(dest)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub fn flag(&self, dest: &str) -> Option<bool> {
        self.get(dest)?.as_bool()
    }

    /// A list of texts (a single text as a list of one).
    pub fn list(&self, dest: &str) -> Option<Vec<String>> {
        match self.get(dest)? {
            Value::Array(items) => Some(
                items
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect(),
            ),
            Value::String(s) => Some(vec![s.clone()]),
            _ => None,
        }
    }

    pub fn was_given(&self, dest: &str) -> bool {
        self.given.iter().any(|d| d == dest)
    }
}

/// argparse's failure: usage, `prog: error: message`, exit status 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ParseError {
    pub prog: String,
    pub usage: String,
    pub message: String,
}

impl ParseError {
    /// What the engine prints on stderr, final newline included.
    pub fn stderr(&self) -> String {
        format!(
            "usage: {}\n{}: error: {}\n",
            self.usage, self.prog, self.message
        )
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.stderr().trim_end())
    }
}

impl<'d> Parser<'d> {
    /// The parser of an engine release from its data.
    pub fn new(data: &'d EngineOptions) -> Self {
        let engine = if data.engine == "vllm" {
            Engine::Vllm
        } else {
            Engine::Sglang
        };
        let mut actions = Vec::new();
        let mut strings = Vec::new();
        let mut by_string = HashMap::new();
        for arg in data.options.iter().chain(&data.positionals) {
            let index = actions.len();
            for flag in arg.flags.iter().chain(&arg.hidden_flags) {
                if by_string.insert(flag.clone(), index).is_none() {
                    strings.push((flag.clone(), index));
                }
            }
            let type_info = arg.type_name.as_deref().and_then(|t| data.types.get(t));
            actions.push(Action {
                arg,
                kind: ActionKind::of(arg),
                converter: Converter::new(engine, arg.type_name.as_deref(), type_info),
                option_strings: arg.flags.clone(),
            });
        }
        Self {
            data,
            engine,
            version: Version::parse(&data.version),
            actions,
            strings,
            by_string,
        }
    }

    pub fn actions(&self) -> &[Action<'d>] {
        &self.actions
    }

    /// The action an exact option string names.
    pub fn action_for(&self, option_string: &str) -> Option<&Action<'d>> {
        self.by_string.get(option_string).map(|i| &self.actions[*i])
    }

    /// Every option string the parser accepts, in registration order.
    pub fn option_strings(&self) -> impl Iterator<Item = &str> {
        self.strings.iter().map(|(s, _)| s.as_str())
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            prog: self.data.prog.clone(),
            usage: self.data.usage.clone(),
            message: message.into(),
        }
    }

    /// Unrecognized arguments: for a subcommand (`vllm serve`) the
    /// top-level parser reports them, under its own name and usage.
    fn top_error(&self, message: impl Into<String>) -> ParseError {
        match (&self.data.top_prog, &self.data.top_usage) {
            (Some(prog), Some(usage)) => ParseError {
                prog: prog.clone(),
                usage: usage.clone(),
                message: message.into(),
            },
            _ => self.error(message),
        }
    }

    fn argument_error(&self, action: &Action<'_>, message: impl fmt::Display) -> ParseError {
        self.error(format!("argument {}: {message}", action.arg.display_name()))
    }
}
