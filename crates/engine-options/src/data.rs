//! The shape of a data file, `data/<engine>-<version>.json`, as
//! `scripts/engine-options/generate` writes it (its README describes every
//! field). Only what parsing and validation need is read here; the recorded
//! `cases` are read by the conformance test alone.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// One engine release's command line, as its own argparse parser defines it.
#[derive(Debug, Clone, Deserialize)]
pub struct EngineOptions {
    pub engine: String,
    pub version: String,
    /// Program name in error messages (`vllm serve`, `sglang serve`).
    pub prog: String,
    /// The usage text that follows `usage: `.
    pub usage: String,
    /// vLLM: `vllm serve` is a subcommand, and unrecognized arguments are
    /// reported by the top-level `vllm` parser with its own usage.
    #[serde(default)]
    pub top_prog: Option<String>,
    #[serde(default)]
    pub top_usage: Option<String>,
    pub allow_abbrev: bool,
    /// `--max_model_len` is rewritten to `--max-model-len` before parsing.
    pub underscore_spelling: bool,
    #[serde(default)]
    pub types: BTreeMap<String, TypeInfo>,
    pub positionals: Vec<Argument>,
    pub options: Vec<Argument>,
}

/// A `type=` converter met in the parser.
#[derive(Debug, Clone, Deserialize)]
pub struct TypeInfo {
    /// The word in argparse's `invalid NAME value: 'x'`.
    pub argparse_name: String,
    /// The real converter's verdicts on sample inputs, keyed by input.
    #[serde(default)]
    pub probes: BTreeMap<String, Probe>,
}

/// What the real converter did with one input.
#[derive(Debug, Clone, Deserialize)]
pub struct Probe {
    #[serde(default)]
    pub value: Option<Value>,
    #[serde(default)]
    pub argument_type_error: Option<String>,
    #[serde(default)]
    pub invalid: Option<String>,
    #[serde(default)]
    pub raises: Option<String>,
}

/// One argument (option or positional) in declaration order.
#[derive(Debug, Clone, Deserialize)]
pub struct Argument {
    pub dest: String,
    /// Option strings as argparse shows them; empty for positionals.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Also accepted, never shown (vLLM's `--no-enable-x`).
    #[serde(default)]
    pub hidden_flags: Vec<String>,
    /// `store`, `store_true`, ..., `boolean_optional`, or a custom class name.
    pub action: String,
    /// The argparse action a custom class derives from, when any.
    #[serde(default)]
    pub action_base: Option<String>,
    #[serde(default)]
    pub action_attrs: BTreeMap<String, Value>,
    #[serde(default, deserialize_with = "nargs")]
    pub nargs: Nargs,
    #[serde(default, rename = "const")]
    pub constant: Option<Value>,
    /// A key of [`EngineOptions::types`].
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    pub choices: Option<Vec<String>>,
    /// The choices as Python values, when they are not strings (`[1, 8]`).
    #[serde(default)]
    pub choices_python: Option<Vec<Value>>,
    /// JSON, a Python repr string, or `==SUPPRESS==`.
    #[serde(default)]
    pub default: Value,
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub deprecated: bool,
    /// How the deprecation is announced, in words.
    #[serde(default)]
    pub deprecation: Option<String>,
    #[serde(default)]
    pub help: Option<String>,
    /// What each spelling of a valueless flag stores.
    #[serde(default)]
    pub flag_values: BTreeMap<String, Value>,
}

/// argparse's `nargs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nargs {
    /// `None`: exactly one value, stored as it is.
    #[default]
    One,
    /// An integer: that many values, stored as a list (0 for flags).
    Exactly(usize),
    /// `?`
    Optional,
    /// `*`
    ZeroOrMore,
    /// `+`
    OneOrMore,
    /// `...` (REMAINDER) and `A...` (PARSER): everything that follows.
    Rest,
}

fn nargs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Nargs, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(match &value {
        Value::Null => Nargs::One,
        Value::Number(n) => Nargs::Exactly(n.as_u64().unwrap_or(0) as usize),
        Value::String(s) => match s.as_str() {
            "?" => Nargs::Optional,
            "*" => Nargs::ZeroOrMore,
            "+" => Nargs::OneOrMore,
            "..." | "A..." => Nargs::Rest,
            other => {
                return Err(serde::de::Error::custom(format!("unknown nargs {other:?}")));
            }
        },
        other => {
            return Err(serde::de::Error::custom(format!("unknown nargs {other}")));
        }
    })
}

/// argparse's marker for "no default: leave the attribute unset".
pub const SUPPRESS: &str = "==SUPPRESS==";

impl Argument {
    pub fn is_positional(&self) -> bool {
        self.flags.is_empty()
    }

    /// How argparse names the argument in errors: its option strings joined
    /// by `/`, or a positional's dest.
    pub fn display_name(&self) -> String {
        if self.flags.is_empty() {
            self.dest.clone()
        } else {
            self.flags.join("/")
        }
    }

    /// vLLM's own deprecation (Python < 3.13): a warning after parsing
    /// when the value differs from the default.
    pub fn deprecation_is_vllm_post_parse(&self) -> bool {
        self.deprecation
            .as_deref()
            .is_some_and(|d| d.starts_with("vLLM deprecated=True"))
    }

    /// Whether the default leaves the attribute unset in the namespace.
    pub fn default_is_suppressed(&self) -> bool {
        self.default.as_str() == Some(SUPPRESS)
    }
}
