//! Request JSON as template values, and template values back as JSON the
//! way Python writes it. Object keys keep the client's order: a template
//! that writes `tools | tojson` must give the engine's exact text.

use std::fmt;
use std::fmt::Write;

use minijinja::Value;
use minijinja::value::ValueKind;
use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Parses JSON text into a template value, objects in written order.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = OrderedValue.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

struct OrderedValue;

impl<'de> DeserializeSeed<'de> for OrderedValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for OrderedValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(OrderedValue)? {
            items.push(item);
        }
        Ok(Value::from(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields: Vec<(String, Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(OrderedValue)?;
            // A repeated key keeps its first place and its last value, as
            // Python's json module does.
            match fields.iter_mut().find(|(k, _)| *k == key) {
                Some(field) => field.1 = value,
                None => fields.push((key, value)),
            }
        }
        Ok(Value::from_iter(fields))
    }
}

/// `json.dumps(value, ensure_ascii=False)` as transformers' `tojson` filter
/// writes it: `", "` and `": "` between items, or `indent` spaces per level
/// with `","` at line ends.
pub fn to_python_json(value: &Value, indent: Option<usize>) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    write_value(&mut out, value, indent, 0)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    depth: usize,
) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => out.push_str(&string_json(value.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_items(out, '[', ']', indent, depth, items.len(), |out, i| {
                write_value(out, &items[i], indent, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            write_items(out, '{', '}', indent, depth, keys.len(), |out, i| {
                out.push_str(&string_json(&keys[i].to_string()));
                out.push_str(": ");
                write_value(out, &value.get_item(&keys[i])?, indent, depth + 1)
            })?;
        }
        _ => out.push_str(&string_json(&value.to_string())),
    }
    Ok(())
}

fn write_items(
    out: &mut String,
    open: char,
    close: char,
    indent: Option<usize>,
    depth: usize,
    count: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    out.push(open);
    if count == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..count {
        match indent {
            Some(width) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.extend(std::iter::repeat_n(' ', width * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        item(out, i)?;
    }
    if let Some(width) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', width * depth));
    }
    out.push(close);
    Ok(())
}

fn string_json(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// Integers as they are; floats as Python's `repr`: `1.0`, `0.5`, `1e+20`.
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let Ok(float) = f64::try_from(value.clone()) else {
        let _ = write!(out, "{value}");
        return;
    };
    if float.is_nan() {
        out.push_str("NaN");
    } else if float.is_infinite() {
        out.push_str(if float > 0.0 { "Infinity" } else { "-Infinity" });
    } else if float != 0.0 && (float.abs() >= 1e16 || float.abs() < 1e-4) {
        // Python: mantissa, then e, sign and at least two exponent digits.
        let text = format!("{float:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let (sign, digits) = match exponent.strip_prefix('-') {
            Some(digits) => ('-', digits),
            None => ('+', exponent),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    } else if float.fract() == 0.0 {
        let _ = write!(out, "{float:.1}");
    } else {
        let _ = write!(out, "{float}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python(text: &str, indent: Option<usize>) -> String {
        to_python_json(&parse(text).unwrap(), indent).unwrap()
    }

    #[test]
    fn objects_keep_the_order_the_client_wrote() {
        assert_eq!(
            python(r#"{"z": 1, "a": [true, null, "é\n"], "m": {}}"#, None),
            r#"{"z": 1, "a": [true, null, "é\n"], "m": {}}"#
        );
    }

    #[test]
    fn floats_read_as_python_writes_them() {
        assert_eq!(
            python("[1.0, 0.5, 1e20, 0.00001, -2.5e-7, 3]", None),
            "[1.0, 0.5, 1e+20, 1e-05, -2.5e-07, 3]"
        );
    }

    #[test]
    fn indent_puts_every_item_on_its_own_line() {
        assert_eq!(
            python(r#"{"a": [1, 2], "b": {}}"#, Some(2)),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}"
        );
    }

    #[test]
    fn a_repeated_key_keeps_its_first_place_and_last_value() {
        assert_eq!(
            python(r#"{"a": 1, "b": 2, "a": 3}"#, None),
            r#"{"a": 3, "b": 2}"#
        );
    }
}
