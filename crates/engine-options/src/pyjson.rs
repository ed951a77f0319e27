//! JSON read the way Python's `json.loads` reads it, with its error texts:
//! several engine converters put `Expecting value: line 1 column 1 (char 0)`
//! into their own messages, and Python accepts `NaN` and `Infinity`.

use serde_json::{Map, Number, Value};

/// A `json.JSONDecodeError`: the message and the character offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub message: String,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How strictly to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Python's `json`: `NaN`, `Infinity` and `-Infinity` are numbers.
    Python,
    /// Standard JSON only (`orjson`).
    Strict,
}

/// Reads `text` as one JSON document. Non-finite numbers become their
/// Python repr (`nan`, `inf`) as strings, as the data files record them.
pub fn loads(text: &str, dialect: Dialect) -> Result<Value, JsonError> {
    let chars: Vec<char> = text.chars().collect();
    let mut reader = Reader {
        chars: &chars,
        pos: 0,
        dialect,
    };
    reader.skip_ws();
    let value = reader.value()?;
    reader.skip_ws();
    if reader.pos != chars.len() {
        return Err(reader.error("Extra data", reader.pos));
    }
    Ok(value)
}

struct Reader<'a> {
    chars: &'a [char],
    pos: usize,
    dialect: Dialect,
}

const MAX_DEPTH_GUARD: usize = 512;

impl Reader<'_> {
    fn error(&self, what: &str, at: usize) -> JsonError {
        let before = &self.chars[..at.min(self.chars.len())];
        let line = before.iter().filter(|c| **c == '\n').count() + 1;
        let column = match before.iter().rposition(|c| *c == '\n') {
            Some(nl) => at - nl,
            None => at + 1,
        };
        JsonError {
            message: format!("{what}: line {line} column {column} (char {at})"),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.pos += 1;
        }
    }

    fn starts_with(&self, word: &str) -> bool {
        word.chars()
            .enumerate()
            .all(|(k, c)| self.chars.get(self.pos + k) == Some(&c))
    }

    fn value(&mut self) -> Result<Value, JsonError> {
        self.value_at_depth(0)
    }

    fn value_at_depth(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH_GUARD {
            return Err(self.error("Expecting value", self.pos));
        }
        match self.peek() {
            Some('"') => {
                self.pos += 1;
                self.string(self.pos - 1).map(Value::String)
            }
            Some('{') => self.object(depth),
            Some('[') => self.array(depth),
            _ => match self.literal_here() {
                Some((word, value)) => self.literal(word, value),
                None => self.number(),
            },
        }
    }

    /// The literal the next character announces, with the value it reads
    /// as; `None` where only a number can follow.
    fn literal_here(&self) -> Option<(&'static str, Value)> {
        let python = self.dialect == Dialect::Python;
        match self.peek() {
            Some('n') => Some(("null", Value::Null)),
            Some('t') => Some(("true", Value::Bool(true))),
            Some('f') => Some(("false", Value::Bool(false))),
            Some('N') if python => Some(("NaN", Value::String("nan".into()))),
            Some('I') if python => Some(("Infinity", Value::String("inf".into()))),
            Some('-') if python && self.starts_with("-Infinity") => {
                Some(("-Infinity", Value::String("-inf".into())))
            }
            _ => None,
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, JsonError> {
        if !self.starts_with(word) {
            return Err(self.error("Expecting value", self.pos));
        }
        self.pos += word.chars().count();
        Ok(value)
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let mut i = self.pos;
        let digit = |i: usize| self.chars.get(i).is_some_and(char::is_ascii_digit);
        if self.chars.get(i) == Some(&'-') {
            i += 1;
        }
        match self.chars.get(i) {
            Some('0') => i += 1,
            Some(c) if c.is_ascii_digit() => {
                while digit(i) {
                    i += 1;
                }
            }
            _ => return Err(self.error("Expecting value", start)),
        }
        let mut float = false;
        if self.chars.get(i) == Some(&'.') && digit(i + 1) {
            float = true;
            i += 1;
            while digit(i) {
                i += 1;
            }
        }
        if matches!(self.chars.get(i), Some('e' | 'E')) {
            let mut j = i + 1;
            if matches!(self.chars.get(j), Some('+' | '-')) {
                j += 1;
            }
            if digit(j) {
                float = true;
                i = j;
                while digit(i) {
                    i += 1;
                }
            }
        }
        let text: String = self.chars[start..i].iter().collect();
        self.pos = i;
        if !float && let Ok(n) = text.parse::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        if !float && let Ok(n) = text.parse::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        let x: f64 = text.parse().unwrap_or(f64::INFINITY);
        Ok(Number::from_f64(x)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(crate::pyrepr::float_repr(x))))
    }

    /// Reads a string whose opening quote is at `open` (already consumed).
    fn string(&mut self, open: usize) -> Result<String, JsonError> {
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error("Unterminated string starting at", open));
            };
            self.pos += 1;
            match c {
                '"' => return Ok(out),
                '\\' => out.push(self.escape(open)?),
                c if (c as u32) < 0x20 => {
                    return Err(self.error("Invalid control character at", self.pos - 1));
                }
                c => out.push(c),
            }
        }
    }

    /// Reads the escape after a backslash (already consumed) of the string
    /// opened at `open`.
    fn escape(&mut self, open: usize) -> Result<char, JsonError> {
        let escape_at = self.pos - 1;
        let Some(e) = self.peek() else {
            return Err(self.error("Unterminated string starting at", open));
        };
        self.pos += 1;
        Ok(match e {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => self.unicode_escape(escape_at)?,
            _ => return Err(self.error("Invalid \\escape", escape_at)),
        })
    }

    fn hex4(&mut self, escape_at: usize) -> Result<u32, JsonError> {
        let digits: String = self.chars.iter().skip(self.pos).take(4).collect();
        if digits.len() != 4 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(self.error("Invalid \\uXXXX escape", escape_at));
        }
        self.pos += 4;
        Ok(u32::from_str_radix(&digits, 16).unwrap_or(0))
    }

    fn unicode_escape(&mut self, escape_at: usize) -> Result<char, JsonError> {
        let first = self.hex4(escape_at)?;
        if (0xd800..0xdc00).contains(&first) && self.starts_with("\\u") {
            let save = self.pos;
            self.pos += 2;
            let second = self.hex4(escape_at)?;
            if (0xdc00..0xe000).contains(&second) {
                let code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
                return Ok(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            self.pos = save;
        }
        Ok(char::from_u32(first).unwrap_or('\u{fffd}'))
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut map = Map::new();
        self.skip_ws();
        if self.peek() == Some('}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            if self.peek() != Some('"') {
                return Err(self.error(
                    "Expecting property name enclosed in double quotes",
                    self.pos,
                ));
            }
            self.pos += 1;
            let key = self.string(self.pos - 1)?;
            self.skip_ws();
            if self.peek() != Some(':') {
                return Err(self.error("Expecting ':' delimiter", self.pos));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value_at_depth(depth + 1)?;
            map.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some('}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                Some(',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(self.error("Expecting ',' delimiter", self.pos)),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value_at_depth(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                Some(',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                _ => return Err(self.error("Expecting ',' delimiter", self.pos)),
            }
        }
    }
}

/// Python's `type(value).__name__` for a decoded JSON value.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(s) if matches!(s.as_str(), "nan" | "inf" | "-inf") => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        loads(text, Dialect::Python).unwrap_err().message
    }

    #[test]
    fn errors_read_like_python() {
        assert_eq!(err(""), "Expecting value: line 1 column 1 (char 0)");
        assert_eq!(err("abc"), "Expecting value: line 1 column 1 (char 0)");
        assert_eq!(err("8k"), "Extra data: line 1 column 2 (char 1)");
        assert_eq!(err("1.5K"), "Extra data: line 1 column 4 (char 3)");
        assert_eq!(
            err("{oops"),
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
        );
        assert_eq!(err("[1,]"), "Expecting value: line 1 column 4 (char 3)");
        assert_eq!(
            err("{\"a\" 1}"),
            "Expecting ':' delimiter: line 1 column 6 (char 5)"
        );
        assert_eq!(err("\n x"), "Expecting value: line 2 column 2 (char 2)");
    }

    #[test]
    fn values_keep_python_types() {
        assert_eq!(
            loads(" 1.5 ", Dialect::Python).unwrap(),
            serde_json::json!(1.5)
        );
        assert_eq!(loads("-1", Dialect::Python).unwrap(), serde_json::json!(-1));
        assert_eq!(
            loads("NaN", Dialect::Python).unwrap(),
            serde_json::json!("nan")
        );
        assert!(loads("NaN", Dialect::Strict).is_err());
        assert_eq!(
            loads("{\"a\": [1, true, null]}", Dialect::Python).unwrap(),
            serde_json::json!({"a": [1, true, null]})
        );
    }
}
