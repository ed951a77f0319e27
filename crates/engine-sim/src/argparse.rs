//! A command-line parser that fails the way Python's `argparse` fails.
//!
//! The engines are Python programs, so a supervisor that builds their
//! command lines meets argparse's rules: long-option abbreviations, `--x=v`,
//! `nargs='+'`, `BooleanOptionalAction` (`--x` / `--no-x`), choices, and the
//! exact error text with exit code 2. Only the option shapes the engines use
//! are modelled.

use std::collections::HashMap;
use std::fmt;

/// How many values an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// `store_true`: no value.
    Flag,
    /// `BooleanOptionalAction`: `--x` sets true, `--no-x` sets false.
    BoolOptional,
    /// Exactly one value.
    One,
    /// `nargs='+'`.
    OneOrMore,
}

/// What a value must look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueKind {
    Str,
    Int,
    Float,
    Choice(&'static [&'static str]),
}

/// One option as the engine declares it.
#[derive(Debug, Clone)]
pub struct OptSpec {
    /// Key under which the value is stored (the long name without dashes).
    pub dest: &'static str,
    /// Every spelling, long name first (`--tensor-parallel-size`, `-tp`).
    pub names: Vec<&'static str>,
    pub arity: Arity,
    pub kind: ValueKind,
    pub required: bool,
}

impl OptSpec {
    pub fn new(names: &[&'static str], arity: Arity, kind: ValueKind) -> Self {
        let dest = names[0].trim_start_matches('-');
        Self {
            dest,
            names: names.to_vec(),
            arity,
            kind,
            required: false,
        }
    }

    /// argparse names an option in errors by joining its spellings with `/`.
    fn display_name(&self) -> String {
        let mut names: Vec<String> = self.names.iter().map(|n| n.to_string()).collect();
        if self.arity == Arity::BoolOptional {
            names.push(format!("--no-{}", &self.names[0][2..]));
        }
        names.join("/")
    }

    fn metavar(&self) -> String {
        match self.kind {
            ValueKind::Choice(choices) => format!("{{{}}}", choices.join(",")),
            _ => self.dest.replace('-', "_").to_uppercase(),
        }
    }
}

/// A parser: program name, usage line and option table.
#[derive(Debug, Clone)]
pub struct Parser {
    pub prog: String,
    /// The usage text after `usage: `; generated from the table when empty.
    pub usage: String,
    pub opts: Vec<OptSpec>,
    /// Name of the single optional positional (`model_tag` for vLLM).
    pub positional: Option<&'static str>,
    /// vLLM's parser turns `_` into `-` in option names before parsing.
    pub underscores_to_dashes: bool,
}

/// A parsed value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    Str(String),
    List(Vec<String>),
}

/// The result of a successful parse.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    pub values: HashMap<&'static str, Value>,
    pub positional: Option<String>,
    /// Options in the order given, with their parsed values, as vLLM logs them
    /// in `non-default args`.
    pub given: Vec<&'static str>,
    pub help: bool,
}

impl Parsed {
    pub fn str(&self, dest: &str) -> Option<&str> {
        match self.values.get(dest) {
            Some(Value::Str(s)) => Some(s),
            Some(Value::List(l)) => l.first().map(String::as_str),
            _ => None,
        }
    }

    pub fn list(&self, dest: &str) -> Option<&[String]> {
        match self.values.get(dest) {
            Some(Value::List(l)) => Some(l),
            _ => None,
        }
    }

    pub fn flag(&self, dest: &str) -> Option<bool> {
        match self.values.get(dest) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    pub fn int(&self, dest: &str) -> Option<i64> {
        self.str(dest).and_then(|s| s.parse().ok())
    }

    pub fn float(&self, dest: &str) -> Option<f64> {
        self.str(dest).and_then(|s| s.parse().ok())
    }
}

/// An argparse failure: printed as usage plus `prog: error: message`, exit 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    pub usage: String,
    pub prog: String,
    pub message: String,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "usage: {}\n{}: error: {}",
            self.usage, self.prog, self.message
        )
    }
}

impl std::error::Error for ArgError {}

enum Lookup<'a> {
    Found(&'a OptSpec, bool, Option<String>),
    Unknown,
}

impl Parser {
    pub fn usage_text(&self) -> String {
        if !self.usage.is_empty() {
            return self.usage.clone();
        }
        // argparse wraps the generated usage under the program name.
        let mut parts = vec!["[-h]".to_string()];
        // The simulator's own `--sim-*` knobs are hidden, as argparse.SUPPRESS hides options.
        for opt in self.opts.iter().filter(|o| !o.dest.starts_with("sim-")) {
            let mut part = match opt.arity {
                Arity::Flag => opt.names[0].to_string(),
                Arity::BoolOptional => format!("{} | --no-{}", opt.names[0], &opt.names[0][2..]),
                Arity::One => format!("{} {}", opt.names[0], opt.metavar()),
                Arity::OneOrMore => {
                    format!("{} {} [{} ...]", opt.names[0], opt.metavar(), opt.metavar())
                }
            };
            if !opt.required {
                part = format!("[{part}]");
            }
            parts.push(part);
        }
        let indent = " ".repeat("usage: ".len() + self.prog.len() + 1);
        let mut out = self.prog.clone();
        let mut line_len = out.len() + "usage: ".len();
        for part in parts {
            if line_len + 1 + part.len() > 78 {
                out.push('\n');
                out.push_str(&indent);
                out.push_str(&part);
                line_len = indent.len() + part.len();
            } else {
                out.push(' ');
                out.push_str(&part);
                line_len += 1 + part.len();
            }
        }
        out
    }

    fn error(&self, message: impl Into<String>) -> ArgError {
        ArgError {
            usage: self.usage_text(),
            prog: self.prog.clone(),
            message: message.into(),
        }
    }

    /// Long help in the argparse layout; printed for `-h/--help`.
    pub fn help_text(&self) -> String {
        let mut out = format!(
            "usage: {}\n\noptions:\n  -h, --help            show this help message and exit\n",
            self.usage_text()
        );
        for opt in self.opts.iter().filter(|o| !o.dest.starts_with("sim-")) {
            out.push_str(&format!("  {}\n", opt.display_name()));
        }
        out
    }

    fn lookup(&self, token: &str) -> Result<Lookup<'_>, ArgError> {
        let (key, explicit) = match token.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (token, None),
        };
        for opt in &self.opts {
            if opt.names.contains(&key) {
                return Ok(Lookup::Found(opt, true, explicit));
            }
            if opt.arity == Arity::BoolOptional
                && key.strip_prefix("--no-") == Some(&opt.names[0][2..])
            {
                return Ok(Lookup::Found(opt, false, explicit));
            }
        }
        if !key.starts_with("--") || key.len() < 3 {
            return Ok(Lookup::Unknown);
        }
        // argparse's allow_abbrev: a unique prefix of a long option selects it.
        let mut matches: Vec<(&OptSpec, bool, String)> = Vec::new();
        for opt in &self.opts {
            for name in opt.names.iter().filter(|n| n.starts_with("--")) {
                if name.starts_with(key) {
                    matches.push((opt, true, name.to_string()));
                }
            }
            if opt.arity == Arity::BoolOptional {
                let negative = format!("--no-{}", &opt.names[0][2..]);
                if negative.starts_with(key) {
                    matches.push((opt, false, negative));
                }
            }
        }
        match matches.len() {
            0 => Ok(Lookup::Unknown),
            1 => Ok(Lookup::Found(matches[0].0, matches[0].1, explicit)),
            _ => {
                let names: Vec<String> = matches.into_iter().map(|m| m.2).collect();
                Err(self.error(format!(
                    "ambiguous option: {key} could match {}",
                    names.join(", ")
                )))
            }
        }
    }

    fn convert(&self, opt: &OptSpec, raw: &str) -> Result<String, ArgError> {
        let name = opt.display_name();
        match opt.kind {
            ValueKind::Str => Ok(raw.to_string()),
            ValueKind::Int => raw
                .parse::<i64>()
                .map(|_| raw.to_string())
                .map_err(|_| self.error(format!("argument {name}: invalid int value: '{raw}'"))),
            ValueKind::Float => raw
                .parse::<f64>()
                .map(|_| raw.to_string())
                .map_err(|_| self.error(format!("argument {name}: invalid float value: '{raw}'"))),
            ValueKind::Choice(choices) => {
                if choices.contains(&raw) {
                    Ok(raw.to_string())
                } else {
                    let listed: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
                    Err(self.error(format!(
                        "argument {name}: invalid choice: '{raw}' (choose from {})",
                        listed.join(", ")
                    )))
                }
            }
        }
    }

    fn normalise(&self, args: &[String]) -> Vec<String> {
        if !self.underscores_to_dashes {
            return args.to_vec();
        }
        let mut out = Vec::with_capacity(args.len());
        for arg in args {
            if let Some(level) = arg
                .strip_prefix("-O")
                .filter(|l| !l.is_empty() && !arg.starts_with("--"))
            {
                // vLLM accepts `-O3` and `-O=3` for `-O 3`.
                out.push("-O".to_string());
                out.push(level.trim_start_matches('=').to_string());
            } else if !arg.starts_with("--") {
                out.push(arg.clone());
            } else {
                out.push(match arg.split_once('=') {
                    Some((key, value)) => format!("{}={value}", key.replace('_', "-")),
                    None => arg.replace('_', "-"),
                });
            }
        }
        out
    }

    /// Parses `args` (without the program name) or returns argparse's error.
    pub fn parse(&self, args: &[String]) -> Result<Parsed, ArgError> {
        let args = self.normalise(args);
        let mut parsed = Parsed::default();
        let mut extras: Vec<String> = Vec::new();
        let mut i = 0;
        let mut only_positionals = false;
        while i < args.len() {
            let token = &args[i];
            i += 1;
            if !only_positionals && token == "--" {
                only_positionals = true;
                continue;
            }
            if only_positionals || !looks_like_option(token) {
                if self.positional.is_some() && parsed.positional.is_none() {
                    parsed.positional = Some(token.clone());
                } else {
                    extras.push(token.clone());
                }
                continue;
            }
            if token == "-h" || token == "--help" {
                parsed.help = true;
                continue;
            }
            let (opt, positive, explicit) = match self.lookup(token)? {
                Lookup::Found(opt, positive, explicit) => (opt, positive, explicit),
                Lookup::Unknown => {
                    extras.push(token.clone());
                    continue;
                }
            };
            let name = opt.display_name();
            let value = match opt.arity {
                Arity::Flag | Arity::BoolOptional => {
                    if let Some(explicit) = explicit {
                        return Err(self.error(format!(
                            "argument {name}: ignored explicit argument '{explicit}'"
                        )));
                    }
                    Value::Bool(positive)
                }
                Arity::One => {
                    let raw = match explicit {
                        Some(v) => v,
                        None if i < args.len() && !looks_like_option(&args[i]) => {
                            i += 1;
                            args[i - 1].clone()
                        }
                        None => {
                            return Err(
                                self.error(format!("argument {name}: expected one argument"))
                            );
                        }
                    };
                    Value::Str(self.convert(opt, &raw)?)
                }
                Arity::OneOrMore => {
                    let mut values = Vec::new();
                    if let Some(v) = explicit {
                        values.push(self.convert(opt, &v)?);
                    } else {
                        while i < args.len() && !looks_like_option(&args[i]) {
                            values.push(self.convert(opt, &args[i])?);
                            i += 1;
                        }
                    }
                    if values.is_empty() {
                        return Err(
                            self.error(format!("argument {name}: expected at least one argument"))
                        );
                    }
                    Value::List(values)
                }
            };
            if !parsed.given.contains(&opt.dest) {
                parsed.given.push(opt.dest);
            }
            parsed.values.insert(opt.dest, value);
        }
        if parsed.help {
            return Ok(parsed);
        }
        let missing: Vec<String> = self
            .opts
            .iter()
            .filter(|o| o.required && !parsed.values.contains_key(o.dest))
            .map(OptSpec::display_name)
            .collect();
        if !missing.is_empty() {
            return Err(self.error(format!(
                "the following arguments are required: {}",
                missing.join(", ")
            )));
        }
        if !extras.is_empty() {
            return Err(self.error(format!("unrecognized arguments: {}", extras.join(" "))));
        }
        Ok(parsed)
    }
}

/// argparse treats a token as an option when it starts with `-` and is not a
/// negative number.
fn looks_like_option(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && token.parse::<f64>().is_err()
}

#[cfg(test)]
mod tests;
