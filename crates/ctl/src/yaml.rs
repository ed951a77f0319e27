//! `-o yaml`: JSON values written as block YAML.

use serde_json::Value;

pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Array(items) if items.is_empty() => out.push_str("[]\n"),
        Value::Object(map) if map.is_empty() => out.push_str("{}\n"),
        Value::Array(_) | Value::Object(_) => write_block(value, 0, &mut out),
        scalar => {
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_block(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                out.push_str(&format!("{pad}{}:", key_text(key)));
                write_child(item, indent, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                out.push_str(&format!("{pad}-"));
                match item {
                    Value::Object(map) if !map.is_empty() => {
                        // The first key goes on the dash's line.
                        let mut first = true;
                        for (key, inner) in map {
                            if first {
                                out.push_str(&format!(" {}:", key_text(key)));
                                first = false;
                            } else {
                                out.push_str(&format!("{pad}  {}:", key_text(key)));
                            }
                            write_child(inner, indent + 2, out);
                        }
                    }
                    other => write_child(other, indent, out),
                }
            }
        }
        scalar => {
            out.push_str(&format!("{pad}{}\n", scalar_text(scalar)));
        }
    }
}

fn write_child(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_block(value, indent + 2, out);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_block(value, indent + 2, out);
        }
        Value::Object(_) => out.push_str(" {}\n"),
        Value::Array(_) => out.push_str(" []\n"),
        scalar => out.push_str(&format!(" {}\n", scalar_text(scalar))),
    }
}

fn key_text(key: &str) -> String {
    scalar_text(&Value::String(key.to_owned()))
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
                && !matches!(
                    s.as_str(),
                    "true" | "false" | "null" | "yes" | "no" | "on" | "off"
                )
                && s.parse::<f64>().is_err();
            if plain {
                s.clone()
            } else {
                // JSON strings are valid YAML double-quoted scalars.
                Value::String(s.clone()).to_string()
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_values_become_block_yaml_that_reads_back() {
        let value = serde_json::json!({
            "name": "qwen",
            "replicas": 2,
            "aliases": ["a", "b c"],
            "profiles": [{"name": "tp1", "engine_args": [], "env": {"A": "1"}}],
            "note": "true"
        });
        let text = to_yaml(&value);
        assert_eq!(
            text,
            "aliases:\n  - a\n  - \"b c\"\nname: qwen\nnote: \"true\"\nprofiles:\n  - engine_args: []\n    env:\n      A: \"1\"\n    name: tp1\nreplicas: 2\n"
        );
        let parsed = llmgw_yaml::parse(&text).expect("valid YAML");
        assert!(format!("{parsed:?}").contains("qwen"));
    }
}
