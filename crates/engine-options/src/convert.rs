//! The engines' `type=` converters, reimplemented: Python's builtins, the
//! `json` module, and the engines' own helpers (human-readable integers,
//! vLLM's `optional_type`/`parse_type` wrappers, SGLang's `nullable_str`...).
//! A converter is picked by the name the data file gives it; each data file
//! also records the real converter on sample inputs, and a test holds these
//! implementations to those probes.

use serde_json::{Number, Value};

use crate::data::TypeInfo;
use crate::pyjson::{self, Dialect};
use crate::registry::Engine;

/// Why a value was refused, in the two ways argparse reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConvertError {
    /// The converter raised `ValueError`/`TypeError`: argparse prints
    /// `invalid NAME value: 'raw'`.
    Invalid,
    /// The converter raised `ArgumentTypeError`: argparse prints its text.
    Message(String),
}

/// A converter, named as in the data file (`int`, `optional_type(int)`).
#[derive(Debug, Clone)]
pub struct Converter {
    kind: Kind,
    /// Whether llmgw knows this converter's rules; an unknown one accepts
    /// every value, so a new engine helper never refuses a good profile.
    pub known: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
    JsonLoads,
    HumanInt(HumanIntRules),
    HumanIntOrAuto(HumanIntRules),
    NullableStr,
    JsonList,
    CudaGraphBackend,
    CudaGraphConfig,
    /// vLLM's `optional_type(wrapped)`: `''` and `'None'` are `None`.
    Optional(Box<Kind>, String),
    /// vLLM's `parse_type(wrapped)`: a `ValueError` becomes a message naming the wrapped callable.
    ParseType(Box<Kind>, String),
    UnionDictAndStr,
    /// vLLM's `parse_dataclass(cls=...)`: pydantic validation, not
    /// reproduced; only "is it JSON" is checked.
    Dataclass,
    ReasoningParser,
    /// A lambda made of string methods: `lambda s: s.lower().replace('-', '_')`.
    StringMethods(Vec<StringMethod>),
    /// A converter llmgw does not know: every value passes, unchanged.
    Unknown,
}

#[derive(Debug, Clone)]
enum StringMethod {
    Lower,
    Upper,
    Strip,
    Replace(String, String),
}

/// Reads `lambda s: s.m1().m2(...)` when every method is a plain string
/// method with literal arguments.
fn string_methods(source: &str) -> Option<Vec<StringMethod>> {
    let rest = source.strip_prefix("lambda ")?;
    let (param, body) = rest.split_once(": ")?;
    let mut body = body.strip_prefix(param)?;
    let mut methods = Vec::new();
    while !body.is_empty() {
        body = body.strip_prefix('.')?;
        let (name, after) = body.split_once('(')?;
        let (args, after) = after.split_once(')')?;
        let literal = |t: &str| {
            let t = t.trim();
            t.strip_prefix('\'')?.strip_suffix('\'').map(str::to_string)
        };
        methods.push(match (name, args) {
            ("lower", "") => StringMethod::Lower,
            ("upper", "") => StringMethod::Upper,
            ("strip", "") => StringMethod::Strip,
            ("replace", args) => {
                let (from, to) = args.split_once(", ")?;
                StringMethod::Replace(literal(from)?, literal(to)?)
            }
            _ => return None,
        });
        body = after;
    }
    Some(methods)
}

#[derive(Debug, Clone, Copy)]
enum HumanIntRules {
    /// vLLM: `k/m/g` decimal, `K/M/G` binary (no decimals), else `int()`.
    Vllm,
    /// SGLang: `k/M/G/T` decimal, `Ki/Mi/Gi/Ti` binary; failures are
    /// messages when `messages` (newer releases), else `ValueError`.
    Sglang { messages: bool },
}

impl Converter {
    /// The converter for a data file's type name. `info` is that type's
    /// entry, whose probes tell version differences apart.
    pub fn new(engine: Engine, name: Option<&str>, info: Option<&TypeInfo>) -> Self {
        let kind = name.map_or(Kind::Str, |n| kind_of(engine, n, info));
        let known = !contains_unknown(&kind);
        Self { kind, known }
    }

    pub fn convert(&self, raw: &str) -> Result<Value, ConvertError> {
        convert(&self.kind, raw)
    }

    /// Whether values are checked only in part (pydantic models), so a
    /// refusal by the real engine may be missed here.
    pub fn is_partial(&self) -> bool {
        matches!(&self.kind, Kind::Dataclass)
            || matches!(&self.kind, Kind::Optional(k, _) | Kind::ParseType(k, _) if matches!(**k, Kind::Dataclass))
    }
}

fn contains_unknown(kind: &Kind) -> bool {
    match kind {
        Kind::Unknown => true,
        Kind::Optional(inner, _) | Kind::ParseType(inner, _) => contains_unknown(inner),
        _ => false,
    }
}

/// Splits `outer(inner)` into `("outer", Some("inner"))`.
fn split_call(name: &str) -> (&str, Option<&str>) {
    match name.split_once('(') {
        Some((head, rest)) if rest.ends_with(')') => (head, Some(&rest[..rest.len() - 1])),
        _ => (name, None),
    }
}

fn kind_of(engine: Engine, name: &str, info: Option<&TypeInfo>) -> Kind {
    let (head, inner) = split_call(name);
    let human = || match engine {
        Engine::Vllm => HumanIntRules::Vllm,
        Engine::Sglang => HumanIntRules::Sglang {
            messages: info
                .and_then(|i| i.probes.get("abc"))
                .is_some_and(|p| p.argument_type_error.is_some()),
        },
    };
    match (head, inner) {
        ("str", None) => Kind::Str,
        ("int", None) => Kind::Int,
        ("float", None) => Kind::Float,
        ("bool", None) => Kind::Bool,
        ("json.loads", None) => Kind::JsonLoads,
        ("human_readable_int", None) => Kind::HumanInt(human()),
        ("human_readable_int_or_auto", None) => Kind::HumanIntOrAuto(human()),
        ("nullable_str", None) => Kind::NullableStr,
        ("json_list_type", None) => Kind::JsonList,
        ("parse_cuda_graph_backend_arg", None) => Kind::CudaGraphBackend,
        ("parse_cuda_graph_config_arg", None) => Kind::CudaGraphConfig,
        ("union_dict_and_str", None) => Kind::UnionDictAndStr,
        ("parse_reasoning_parser", None) => Kind::ReasoningParser,
        ("parse_dataclass", Some(_)) => Kind::Dataclass,
        _ if name.starts_with("lambda ") => {
            string_methods(name).map_or(Kind::Unknown, Kind::StringMethods)
        }
        ("optional_type", Some(inner)) => {
            Kind::Optional(Box::new(kind_of(engine, inner, None)), callable_str(inner))
        }
        ("parse_type", Some(inner)) => {
            Kind::ParseType(Box::new(kind_of(engine, inner, None)), callable_str(inner))
        }
        _ => Kind::Unknown,
    }
}

/// `str()` of the wrapped callable, as vLLM's `parse_type` message shows it.
/// Memory addresses are written as the data files record them.
fn callable_str(name: &str) -> String {
    let (head, _) = split_call(name);
    match head {
        "int" | "float" | "str" | "bool" => format!("<class '{head}'>"),
        "json.loads" => "<function loads at 0x…>".into(),
        "parse_dataclass" => "<function parse_dataclass.<locals>._parse_dataclass at 0x…>".into(),
        other => format!("<function {other} at 0x…>"),
    }
}

fn convert(kind: &Kind, raw: &str) -> Result<Value, ConvertError> {
    match kind {
        Kind::Str | Kind::Unknown => Ok(Value::String(raw.into())),
        Kind::Int => py_int(raw).map(int_value).ok_or(ConvertError::Invalid),
        Kind::Float => py_float(raw).map(float_value).ok_or(ConvertError::Invalid),
        Kind::Bool => Ok(Value::Bool(!raw.is_empty())),
        Kind::JsonLoads => pyjson::loads(raw, Dialect::Python).map_err(|_| ConvertError::Invalid),
        Kind::HumanInt(rules) => human_int(*rules, raw),
        Kind::HumanIntOrAuto(rules) => {
            let t = raw.trim();
            if t == "-1" || t.eq_ignore_ascii_case("auto") {
                Ok(Value::from(-1))
            } else {
                human_int(*rules, raw)
            }
        }
        Kind::NullableStr => Ok(if raw.is_empty() || raw == "None" {
            Value::Null
        } else {
            Value::String(raw.into())
        }),
        Kind::JsonList => pyjson::loads(raw, Dialect::Strict).map_err(|_| {
            ConvertError::Message(format!(
                "Invalid JSON list: {raw}. Please provide a valid JSON list."
            ))
        }),
        Kind::CudaGraphBackend => {
            if raw == "tc_piecewise" {
                Err(ConvertError::Message(
                    "tc_piecewise was removed; select breakable, full, or disabled".into(),
                ))
            } else {
                Ok(Value::String(raw.into()))
            }
        }
        Kind::CudaGraphConfig => cuda_graph_config(raw),
        Kind::Optional(inner, shown) => {
            if raw.is_empty() || raw == "None" {
                Ok(Value::Null)
            } else {
                parse_type(inner, shown, raw)
            }
        }
        Kind::ParseType(inner, shown) => parse_type(inner, shown, raw),
        Kind::UnionDictAndStr => {
            let t = raw.trim();
            if t.starts_with('{') && t.ends_with('}') {
                convert(
                    &Kind::Optional(Box::new(Kind::JsonLoads), callable_str("json.loads")),
                    raw,
                )
            } else {
                Ok(Value::String(raw.into()))
            }
        }
        Kind::Dataclass => pyjson::loads(raw, Dialect::Python)
            .map(|_| Value::String(raw.into()))
            .map_err(|e| ConvertError::Message(format!("Invalid JSON: {e}"))),
        Kind::StringMethods(methods) => {
            let mut text = raw.to_string();
            for method in methods {
                text = match method {
                    StringMethod::Lower => text.to_lowercase(),
                    StringMethod::Upper => text.to_uppercase(),
                    StringMethod::Strip => text.trim().to_string(),
                    StringMethod::Replace(from, to) => text.replace(from.as_str(), to),
                };
            }
            Ok(Value::String(text))
        }
        Kind::ReasoningParser => Ok(Value::String(if raw.eq_ignore_ascii_case("none") {
            String::new()
        } else {
            raw.into()
        })),
    }
}

fn parse_type(inner: &Kind, shown: &str, raw: &str) -> Result<Value, ConvertError> {
    convert(inner, raw).map_err(|e| match e {
        ConvertError::Invalid => {
            ConvertError::Message(format!("Value {raw} cannot be converted to {shown}."))
        }
        message => message,
    })
}

fn int_value(n: i128) -> Value {
    i64::try_from(n)
        .map(Value::from)
        .or_else(|_| u64::try_from(n).map(Value::from))
        .unwrap_or_else(|_| Value::String(n.to_string()))
}

fn float_value(x: f64) -> Value {
    Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(crate::pyrepr::float_repr(x)))
}

/// Removes `_` where Python allows it in numbers: single, between digits.
fn without_digit_underscores(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (i, c) in chars.iter().enumerate() {
        if *c == '_' {
            let ok = i > 0
                && chars[i - 1].is_ascii_digit()
                && chars.get(i + 1).is_some_and(char::is_ascii_digit);
            if !ok {
                return None;
            }
        } else {
            out.push(*c);
        }
    }
    Some(out)
}

/// Python's `int(text)`.
pub fn py_int(text: &str) -> Option<i128> {
    let t = without_digit_underscores(text.trim())?;
    let digits = t.strip_prefix(['+', '-']).unwrap_or(&t);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    t.parse::<i128>().ok()
}

/// Python's `float(text)`.
pub fn py_float(text: &str) -> Option<f64> {
    let t = without_digit_underscores(text.trim())?;
    let body = t.strip_prefix(['+', '-']).unwrap_or(&t);
    let word = body.to_ascii_lowercase();
    if matches!(word.as_str(), "inf" | "infinity" | "nan") {
        return t.parse().ok();
    }
    // Rust also reads forms Python refuses (none known) and refuses none
    // that Python reads once words and underscores are handled.
    if body.is_empty() || !body.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    t.parse().ok()
}

/// `DIGITS[.DIGITS]` times `multiplier`, truncated toward zero as Python's
/// `int(float(n) * m)` or `int(Decimal(n) * m)` gives for the values met.
fn scaled(number: &str, multiplier: i128) -> Option<i128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: i128 = whole.parse().ok()?;
    let mut result = whole.checked_mul(multiplier)?;
    if !fraction.is_empty() {
        let scale = 10i128.checked_pow(fraction.len() as u32)?;
        let part: i128 = fraction.parse().ok()?;
        result = result.checked_add(part.checked_mul(multiplier)? / scale)?;
    }
    Some(result)
}

/// Splits `DIGITS[.DIGITS]SUFFIX` for one of `suffixes` (longest first).
fn number_and_suffix<'a>(text: &'a str, suffixes: &[&'a str]) -> Option<(&'a str, &'a str)> {
    let suffix = suffixes.iter().find(|s| text.ends_with(**s))?;
    let number = &text[..text.len() - suffix.len()];
    let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    (digits(whole) && digits(fraction)).then_some((number, *suffix))
}

fn human_int(rules: HumanIntRules, raw: &str) -> Result<Value, ConvertError> {
    let value = raw.trim();
    match rules {
        HumanIntRules::Vllm => {
            if let Some((number, suffix)) =
                number_and_suffix(value, &["k", "K", "m", "M", "g", "G", "t", "T"])
            {
                let decimal = match suffix {
                    "k" => Some(1_000),
                    "m" => Some(1_000_000),
                    "g" => Some(1_000_000_000),
                    _ => None,
                };
                let binary = match suffix {
                    "K" => Some(1 << 10),
                    "M" => Some(1 << 20),
                    "G" => Some(1 << 30),
                    _ => None,
                };
                if let Some(m) = decimal {
                    return scaled(number, m)
                        .map(int_value)
                        .ok_or(ConvertError::Invalid);
                }
                if let Some(m) = binary {
                    if number.contains('.') {
                        return Err(ConvertError::Message(format!(
                            "Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use {number}{} instead?",
                            suffix.to_lowercase()
                        )));
                    }
                    return scaled(number, m)
                        .map(int_value)
                        .ok_or(ConvertError::Invalid);
                }
            }
            py_int(value).map(int_value).ok_or(ConvertError::Invalid)
        }
        HumanIntRules::Sglang { messages } => {
            let iec = ["Ki", "Mi", "Gi", "Ti"];
            if let Some((number, suffix)) =
                number_and_suffix(value, &["Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"])
            {
                if iec.contains(&suffix) {
                    if let Some((whole, _)) = number.split_once('.') {
                        return Err(ConvertError::Message(format!(
                            "Decimals are not allowed with IEC suffixes like '{suffix}'. Use an integer IEC value such as '{}{suffix}', or an SI value such as '{number}{}'.",
                            whole.trim_start_matches('0').parse::<i128>().unwrap_or(0),
                            &suffix[..1]
                        )));
                    }
                    let shift = 10 * (1 + iec.iter().position(|s| *s == suffix).unwrap_or(0));
                    return scaled(number, 1i128 << shift)
                        .map(int_value)
                        .ok_or(ConvertError::Invalid);
                }
                let m = match suffix {
                    "k" => 1_000,
                    "M" => 1_000_000,
                    "G" => 1_000_000_000,
                    _ => 1_000_000_000_000,
                };
                return scaled(number, m)
                    .map(int_value)
                    .ok_or(ConvertError::Invalid);
            }
            match py_int(value) {
                Some(n) => Ok(int_value(n)),
                None if messages => Err(ConvertError::Message(format!(
                    "Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
                ))),
                None => Err(ConvertError::Invalid),
            }
        }
    }
}

/// SGLang's `--cuda-graph-config`: a JSON object of phase to settings.
fn cuda_graph_config(raw: &str) -> Result<Value, ConvertError> {
    const FLAG: &str = "--cuda-graph-config";
    let parsed = pyjson::loads(raw, Dialect::Python)
        .map_err(|e| ConvertError::Message(format!("{FLAG} must be JSON: {e}")))?;
    let Value::Object(phases) = &parsed else {
        return Err(ConvertError::Message(format!(
            "{FLAG} must be a JSON object, got {}",
            pyjson::type_name(&parsed)
        )));
    };
    for (phase, settings) in phases {
        if phase != "decode" && phase != "prefill" {
            return Err(ConvertError::Message(format!(
                "{FLAG}: unknown phase '{phase}', expected one of ('decode', 'prefill')"
            )));
        }
        if !settings.is_object() {
            return Err(ConvertError::Message(format!(
                "{FLAG}['{phase}'] must be a JSON object, got {}",
                pyjson::type_name(settings)
            )));
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_numbers() {
        assert_eq!(py_int(" 1_000 "), Some(1000));
        assert_eq!(py_int("+7"), Some(7));
        assert_eq!(py_int("1__0"), None);
        assert_eq!(py_int("1.0"), None);
        assert_eq!(py_float("1_0.5"), Some(10.5));
        assert_eq!(py_float("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(py_float("1e3"), Some(1000.0));
        assert_eq!(py_float(".5"), Some(0.5));
        assert_eq!(py_float("abc"), None);
        assert_eq!(py_float(""), None);
    }

    #[test]
    fn human_readable_ints() {
        let vllm = Kind::HumanInt(HumanIntRules::Vllm);
        assert_eq!(convert(&vllm, "25.6k"), Ok(Value::from(25600)));
        assert_eq!(convert(&vllm, "8K"), Ok(Value::from(8192)));
        assert!(matches!(
            convert(&vllm, "1.5K"),
            Err(ConvertError::Message(_))
        ));
        assert_eq!(convert(&vllm, "8T"), Err(ConvertError::Invalid));
        let sglang = Kind::HumanInt(HumanIntRules::Sglang { messages: true });
        assert_eq!(convert(&sglang, "1Ki"), Ok(Value::from(1024)));
        assert_eq!(convert(&sglang, "1.5M"), Ok(Value::from(1_500_000)));
        assert!(matches!(
            convert(&sglang, "1.5Ki"),
            Err(ConvertError::Message(_))
        ));
    }
}
