//! Decoding a [`Node`] tree into typed values while collecting every problem.
//!
//! Decoders never stop at the first mistake: a field that cannot be read is
//! recorded as a [`Problem`] and decoding carries on with its siblings, so an
//! operator fixes a file in one pass.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::node::{Node, Pos, Value};
use crate::suggest::closest;

/// One mistake in a file: where, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub pos: Pos,
    pub path: String,
    pub message: String,
}

/// Every problem found in one file, in source order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems {
    pub file: String,
    pub items: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.items.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}: ", self.file, p.pos)?;
            if !p.path.is_empty() {
                write!(f, "{}: ", p.path)?;
            }
            write!(f, "{}", p.message)?;
        }
        Ok(())
    }
}

/// The path to a field, printed as `fabrics[0].rate_gbps`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn root() -> Self {
        Path(String::new())
    }

    pub fn field(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Collects problems while a file is decoded.
#[derive(Debug, Default)]
pub struct Cx {
    problems: Vec<Problem>,
}

impl Cx {
    pub fn new() -> Self {
        Cx::default()
    }

    pub fn report(&mut self, pos: Pos, path: &Path, message: impl Into<String>) {
        self.problems.push(Problem {
            pos,
            path: path.0.clone(),
            message: message.into(),
        });
    }

    pub fn expected(&mut self, node: &Node, path: &Path, what: &str) {
        let found = node.describe();
        self.report(node.pos, path, format!("expected {what}, found {found}"));
    }

    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    /// How many problems so far; decoders compare it before and after a
    /// value to know whether that value was sound.
    pub fn problem_count(&self) -> usize {
        self.problems.len()
    }

    /// Finishes decoding: the value when nothing was wrong, else every problem.
    pub fn finish<T>(mut self, file: &str, value: Option<T>) -> Result<T, Problems> {
        match value {
            Some(v) if self.problems.is_empty() => Ok(v),
            _ => {
                self.problems.sort_by_key(|p| p.pos);
                Err(Problems {
                    file: file.to_string(),
                    items: self.problems,
                })
            }
        }
    }

    /// Reads a mapping whose allowed keys are `known`. Unknown and duplicate
    /// keys are reported (with the closest known key as a suggestion), and the
    /// known ones are returned for field-by-field decoding.
    pub fn map<'n>(&mut self, node: &'n Node, path: &Path, known: &[&str]) -> Option<Fields<'n>> {
        let entries = match &node.value {
            Value::Map(entries) => entries,
            // An empty document or section reads as a mapping with no keys.
            Value::Null => {
                return Some(Fields {
                    node,
                    path: path.clone(),
                    entries: BTreeMap::new(),
                });
            }
            _ => {
                self.expected(node, path, "a mapping");
                return None;
            }
        };
        let mut fields = BTreeMap::new();
        for entry in entries {
            let key_path = path.field(&entry.key);
            if !known.contains(&entry.key.as_str()) {
                let hint = closest(&entry.key, known)
                    .map(|k| format!(" (did you mean `{k}`?)"))
                    .unwrap_or_default();
                self.report(
                    entry.key_pos,
                    &key_path,
                    format!("unknown key `{}`{hint}", entry.key),
                );
                continue;
            }
            if fields.insert(entry.key.as_str(), &entry.value).is_some() {
                self.report(entry.key_pos, &key_path, "key appears twice");
            }
        }
        Some(Fields {
            node,
            path: path.clone(),
            entries: fields,
        })
    }
}

/// The known fields of one mapping.
pub struct Fields<'n> {
    node: &'n Node,
    path: Path,
    entries: BTreeMap<&'n str, &'n Node>,
}

impl<'n> Fields<'n> {
    pub fn pos(&self) -> Pos {
        self.node.pos
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the key is written at all, even as `null`.
    pub fn has_key(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// Whether the key is written with a value other than `null`.
    pub fn has(&self, key: &str) -> bool {
        self.entries.get(key).is_some_and(|n| !n.is_null())
    }

    /// The raw node of a field, for decoders that need its position.
    pub fn node(&self, key: &str) -> Option<&'n Node> {
        self.entries.get(key).copied().filter(|n| !n.is_null())
    }

    /// Where the `i`th item of a list field is (the field itself, or the
    /// mapping, when that item cannot be found).
    pub fn item_pos(&self, key: &str, i: usize) -> Pos {
        match self.node(key) {
            Some(Node {
                value: Value::Seq(items),
                pos,
            }) => items.get(i).map_or(*pos, |n| n.pos),
            Some(node) => node.pos,
            None => self.node.pos,
        }
    }

    /// A field that may be absent (absent and `null` are the same).
    pub fn optional<T: Decode>(&self, cx: &mut Cx, key: &str) -> Option<T> {
        let node = self.node(key)?;
        T::decode(node, &self.path.field(key), cx)
    }

    /// A field that may be absent, with its default.
    pub fn or<T: Decode>(&self, cx: &mut Cx, key: &str, default: T) -> T {
        self.optional(cx, key).unwrap_or(default)
    }

    /// A field that must be present.
    pub fn required<T: Decode>(&self, cx: &mut Cx, key: &str) -> Option<T> {
        match self.node(key) {
            Some(node) => T::decode(node, &self.path.field(key), cx),
            None => {
                cx.report(
                    self.node.pos,
                    &self.path.field(key),
                    "required field is missing",
                );
                None
            }
        }
    }

    /// Reports a problem at a field's value (or at the mapping when absent).
    pub fn report(&self, cx: &mut Cx, key: &str, message: impl Into<String>) {
        let pos = self.node(key).map_or(self.node.pos, |n| n.pos);
        cx.report(pos, &self.path.field(key), message);
    }
}

/// A value that can be read from a node, reporting what is wrong with it.
pub trait Decode: Sized {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self>;
}

fn scalar<'a>(node: &'a Node, path: &Path, cx: &mut Cx, what: &str) -> Option<(&'a str, bool)> {
    match &node.value {
        Value::Scalar { text, quoted } => Some((text.as_str(), *quoted)),
        _ => {
            cx.expected(node, path, what);
            None
        }
    }
}

impl Decode for String {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        scalar(node, path, cx, "a string").map(|(text, _)| text.to_string())
    }
}

impl Decode for bool {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        match scalar(node, path, cx, "true or false")? {
            ("true", false) => Some(true),
            ("false", false) => Some(false),
            _ => {
                cx.expected(node, path, "true or false");
                None
            }
        }
    }
}

macro_rules! decode_number {
    ($($t:ty),*) => {$(
        impl Decode for $t {
            fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
                let (text, quoted) = scalar(node, path, cx, "a number")?;
                match text.parse::<$t>() {
                    Ok(v) if !quoted => Some(v),
                    _ => {
                        let what = if text.starts_with('-') || text.contains('.') {
                            concat!("a number (", stringify!($t), ")")
                        } else {
                            "a number"
                        };
                        cx.expected(node, path, what);
                        None
                    }
                }
            }
        }
    )*};
}
decode_number!(u16, u32, u64, usize, i32, i64, f64);

impl Decode for Duration {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let (text, _) = scalar(node, path, cx, "a duration such as `5s`, `250ms` or `1m`")?;
        match parse_duration(text) {
            Ok(d) => Some(d),
            Err(why) => {
                cx.report(node.pos, path, format!("invalid duration {text:?}: {why}"));
                None
            }
        }
    }
}

impl Decode for std::path::PathBuf {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let text = String::decode(node, path, cx)?;
        if text.is_empty() {
            cx.report(node.pos, path, "expected a path, found an empty string");
            return None;
        }
        Some(text.into())
    }
}

impl Decode for std::net::SocketAddr {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let text = String::decode(node, path, cx)?;
        match text.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                cx.report(
                    node.pos,
                    path,
                    format!(
                        "expected an IP address and port such as `0.0.0.0:7443`, found {text:?}"
                    ),
                );
                None
            }
        }
    }
}

impl<T: Decode> Decode for Vec<T> {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        match &node.value {
            Value::Seq(items) => {
                let before = cx.problems.len();
                let out: Vec<T> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| T::decode(item, &path.index(i), cx))
                    .collect();
                (cx.problems.len() == before).then_some(out)
            }
            Value::Null => Some(Vec::new()),
            _ => {
                cx.expected(node, path, "a list");
                None
            }
        }
    }
}

impl<T: Decode> Decode for BTreeMap<String, T> {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        match &node.value {
            Value::Map(entries) => {
                let before = cx.problems.len();
                let mut out = BTreeMap::new();
                for entry in entries {
                    let entry_path = path.field(&entry.key);
                    if let Some(v) = T::decode(&entry.value, &entry_path, cx)
                        && out.insert(entry.key.clone(), v).is_some()
                    {
                        cx.report(entry.key_pos, &entry_path, "key appears twice");
                    }
                }
                (cx.problems.len() == before).then_some(out)
            }
            Value::Null => Some(BTreeMap::new()),
            _ => {
                cx.expected(node, path, "a mapping");
                None
            }
        }
    }
}

/// Parses `250ms`, `5s`, `1m`, `2h`, `1m30s`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty".to_string());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("add a unit: ms, s, m or h (for example `5s`)".to_string());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| "missing unit after the number".to_string())?;
        if number_len == 0 {
            return Err("expected a number before the unit".to_string());
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("{:?} is not a number", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
        };
        // A huge or endless number is a refusal, not a panic.
        let too_long = || format!("{text:?} is longer than any duration llmgw can wait");
        let part =
            Duration::try_from_secs_f64(number * seconds_per_unit).map_err(|_| too_long())?;
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// Formats a duration the way config files write it (`1m30s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let mut secs = ms / 1000;
    let mut out = String::new();
    for (unit, size) in [("h", 3600), ("m", 60)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    if secs > 0 {
        out.push_str(&format!("{secs}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::parse;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("5").unwrap_err().contains("unit"));
        assert!(parse_duration("5 parsecs").is_err());
        // Found by fuzzing `config check`: these used to panic.
        let huge = format!("{}h", "9".repeat(400));
        assert!(
            parse_duration(&huge)
                .unwrap_err()
                .contains("longer than any duration")
        );
        // Each part fits, the sum does not.
        assert!(parse_duration("3000000000000000h3000000000000000h").is_err());
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn type_errors_name_path_and_found_value() {
        let doc = parse("fabrics:\n  - name: a\n    rate_gbps: fast\n").unwrap();
        let mut cx = Cx::new();
        let top = cx.map(&doc, &Path::root(), &["fabrics"]).unwrap();
        let fabrics = top.node("fabrics").unwrap();
        let Value::Seq(items) = &fabrics.value else {
            panic!()
        };
        let f = cx
            .map(
                &items[0],
                &Path::root().field("fabrics").index(0),
                &["name", "rate_gbps"],
            )
            .unwrap();
        let rate: Option<u32> = f.optional(&mut cx, "rate_gbps");
        assert!(rate.is_none());
        let err = cx.finish::<()>("agent.yaml", None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent.yaml:3:16: fabrics[0].rate_gbps: expected a number, found \"fast\""
        );
    }

    #[test]
    fn unknown_keys_suggest_the_closest() {
        let doc = parse("heartbeat_intervl: 5s\n").unwrap();
        let mut cx = Cx::new();
        cx.map(&doc, &Path::root(), &["heartbeat_interval", "labels"]);
        let err = cx.finish::<()>("a.yaml", None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a.yaml:1:1: heartbeat_intervl: unknown key `heartbeat_intervl` (did you mean `heartbeat_interval`?)"
        );
    }

    #[test]
    fn quoted_numbers_are_strings() {
        let doc = parse("x: \"5\"\n").unwrap();
        let mut cx = Cx::new();
        let f = cx.map(&doc, &Path::root(), &["x"]).unwrap();
        assert_eq!(f.optional::<u32>(&mut cx, "x"), None);
        assert!(cx.has_problems());
    }
}
