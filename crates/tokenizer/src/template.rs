//! The chat template rendered as transformers renders it for vLLM and
//! SGLang: Jinja with `trim_blocks` and `lstrip_blocks`, Python's string
//! and dict methods, `raise_exception`, `strftime_now`, a `tojson` that
//! writes Python's JSON, and the variables `messages`, `tools`,
//! `documents`, `add_generation_prompt`, the special tokens and the
//! request's `chat_template_kwargs`.

use std::collections::BTreeMap;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::files::{SpecialTokens, Templates};
use crate::{ChatRequest, TokenizerError, json};

/// transformers marks the final message this way to cut the render after
/// it when the request continues that message.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

pub struct ChatTemplate {
    env: Environment<'static>,
    names: Vec<String>,
    special_tokens: SpecialTokens,
}

impl ChatTemplate {
    pub fn new(
        templates: Templates,
        special_tokens: SpecialTokens,
    ) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let names = templates.keys().cloned().collect();
        for (name, source) in templates {
            env.add_template_owned(name.clone(), source)
                .map_err(|err| TokenizerError::Template(format!("{name}: {err:#}")))?;
        }
        Ok(ChatTemplate {
            env,
            names,
            special_tokens,
        })
    }

    /// transformers' choice among named templates: `tool_use` when the
    /// request has tools and the model has one, else `default`.
    fn pick(&self, has_tools: bool) -> Result<&str, TokenizerError> {
        let wanted = if has_tools && self.names.iter().any(|n| n == "tool_use") {
            "tool_use"
        } else if self.names.len() == 1 {
            &self.names[0]
        } else {
            "default"
        };
        self.names
            .iter()
            .find(|n| *n == wanted)
            .map(String::as_str)
            .ok_or_else(|| {
                TokenizerError::Template(format!(
                    "no `{wanted}` among the model's templates {:?}",
                    self.names
                ))
            })
    }

    pub fn render(&self, request: &ChatRequest<'_>) -> Result<String, TokenizerError> {
        let bad =
            |what: &str, err: serde_json::Error| TokenizerError::Request(format!("{what}: {err}"));
        let mut messages =
            messages(json::parse(request.messages).map_err(|e| bad("messages", e))?)?;
        let tools = match request.tools {
            Some(text) => json::parse(text).map_err(|e| bad("tools", e))?,
            None => Value::from(()),
        };
        let has_tools = tools.kind() == ValueKind::Seq && tools.len().unwrap_or(0) > 0;
        if request.continue_final_message {
            let last = messages.pop().ok_or_else(|| {
                TokenizerError::Request("continue_final_message with no messages".into())
            })?;
            messages.push(with_content(&last, |content| {
                format!("{content}{CONTINUE_TAG}")
            })?);
        }

        let mut context: BTreeMap<String, Value> = BTreeMap::new();
        for (name, token) in &self.special_tokens {
            context.insert((*name).to_string(), Value::from(token.as_str()));
        }
        if let Some(text) = request.chat_template_kwargs {
            let kwargs = json::parse(text).map_err(|e| bad("chat_template_kwargs", e))?;
            if kwargs.kind() != ValueKind::Map {
                return Err(TokenizerError::Request(
                    "chat_template_kwargs must be an object".into(),
                ));
            }
            for key in kwargs.try_iter().map_err(template_error)? {
                let value = kwargs.get_item(&key).map_err(template_error)?;
                context.insert(key.to_string(), value);
            }
        }
        context.insert("messages".into(), Value::from(messages));
        context.insert("tools".into(), tools);
        context.insert("documents".into(), Value::from(()));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(request.add_generation_prompt && !request.continue_final_message),
        );

        let template = self
            .env
            .get_template(self.pick(has_tools)?)
            .map_err(template_error)?;
        let rendered = template
            .render(Value::from(context))
            .map_err(template_error)?;
        if !request.continue_final_message {
            return Ok(rendered);
        }
        let tag = CONTINUE_TAG.trim_end();
        let at = rendered.rfind(tag).ok_or_else(|| {
            TokenizerError::Template(
                "the final message to continue does not appear in the render".into(),
            )
        })?;
        Ok(if rendered[at..].starts_with(CONTINUE_TAG) {
            rendered[..at].to_string()
        } else {
            rendered[..at].trim_end().to_string()
        })
    }
}

fn template_error(err: Error) -> TokenizerError {
    TokenizerError::Template(format!("{err:#}"))
}

/// The messages as the engines hand them to the template: content text as
/// given (null as empty), and each tool call's `arguments` string parsed
/// into the object it holds, as vLLM does for templates that write them
/// with `tojson`.
fn messages(list: Value) -> Result<Vec<Value>, TokenizerError> {
    if list.kind() != ValueKind::Seq {
        return Err(TokenizerError::Request("messages must be a list".into()));
    }
    let items: Vec<Value> = list.try_iter().map_err(template_error)?.collect();
    items.iter().map(message).collect()
}

fn message(message: &Value) -> Result<Value, TokenizerError> {
    if message.kind() != ValueKind::Map {
        return Err(TokenizerError::Request(
            "a message must be an object".into(),
        ));
    }
    let mut fields: Vec<(String, Value)> = Vec::new();
    for key in message.try_iter().map_err(template_error)? {
        let value = message.get_item(&key).map_err(template_error)?;
        let value = match key.as_str() {
            Some("content") => match value.kind() {
                ValueKind::String => value,
                ValueKind::None | ValueKind::Undefined => Value::from(""),
                _ => {
                    return Err(TokenizerError::Request(
                        "message content other than text is left to the engine".into(),
                    ));
                }
            },
            Some("tool_calls") if value.kind() == ValueKind::Seq => tool_calls(&value)?,
            _ => value,
        };
        fields.push((key.to_string(), value));
    }
    Ok(Value::from_iter(fields))
}

fn tool_calls(calls: &Value) -> Result<Value, TokenizerError> {
    let mut out = Vec::new();
    for call in calls.try_iter().map_err(template_error)? {
        let function = call.get_attr("function").map_err(template_error)?;
        if function.kind() != ValueKind::Map {
            out.push(call);
            continue;
        }
        let arguments = function.get_attr("arguments").map_err(template_error)?;
        let parsed = match arguments.kind() {
            ValueKind::String if !arguments.as_str().unwrap_or_default().is_empty() => {
                json::parse(arguments.as_str().unwrap_or_default())
                    .map_err(|err| TokenizerError::Request(format!("tool call arguments: {err}")))?
            }
            ValueKind::String | ValueKind::None | ValueKind::Undefined => {
                Value::from_iter(Vec::<(String, Value)>::new())
            }
            _ => arguments,
        };
        let function = replace_field(&function, "arguments", parsed)?;
        out.push(replace_field(&call, "function", function)?);
    }
    Ok(Value::from(out))
}

fn replace_field(map: &Value, name: &str, new: Value) -> Result<Value, TokenizerError> {
    let mut fields: Vec<(String, Value)> = Vec::new();
    for key in map.try_iter().map_err(template_error)? {
        let value = if key.as_str() == Some(name) {
            new.clone()
        } else {
            map.get_item(&key).map_err(template_error)?
        };
        fields.push((key.to_string(), value));
    }
    if !fields.iter().any(|(k, _)| k == name) {
        fields.push((name.to_string(), new));
    }
    Ok(Value::from_iter(fields))
}

fn with_content(message: &Value, change: impl Fn(&str) -> String) -> Result<Value, TokenizerError> {
    let content = message.get_attr("content").map_err(template_error)?;
    let text = content.as_str().ok_or_else(|| {
        TokenizerError::Request("the final message to continue has no text".into())
    })?;
    replace_field(message, "content", Value::from(change(text)))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `json.dumps(x, ensure_ascii=False, indent=indent)`; other options of
/// transformers' filter (separators, sort_keys) are refused.
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(width) => Some(width),
        None => indent,
    };
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(json::to_python_json(
        value, indent,
    )?))
}

/// Python's `datetime.now().strftime(format)` for the directives chat
/// templates use; the engines run on UTC hosts.
fn strftime_now(format: String) -> Result<String, Error> {
    let now = time::OffsetDateTime::now_utc();
    strftime(now, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

fn strftime(at: time::OffsetDateTime, format: &str) -> Result<String, Error> {
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month = MONTHS[usize::from(u8::from(at.month())) - 1];
        let weekday = WEEKDAYS[usize::from(at.weekday().number_days_from_monday())];
        match chars.next() {
            Some('Y') => out.push_str(&at.year().to_string()),
            Some('y') => out.push_str(&format!("{:02}", at.year().rem_euclid(100))),
            Some('m') => out.push_str(&format!("{:02}", u8::from(at.month()))),
            Some('d') => out.push_str(&format!("{:02}", at.day())),
            Some('j') => out.push_str(&format!("{:03}", at.ordinal())),
            Some('H') => out.push_str(&format!("{:02}", at.hour())),
            Some('M') => out.push_str(&format!("{:02}", at.minute())),
            Some('S') => out.push_str(&format!("{:02}", at.second())),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive %{} is not supported",
                        other.unwrap_or(' ')
                    ),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_writes_what_python_writes() {
        let at = time::Date::from_calendar_date(2026, time::Month::March, 5)
            .unwrap()
            .with_hms(7, 8, 9)
            .unwrap()
            .assume_utc();
        assert_eq!(strftime(at, "%d %b %Y").unwrap(), "05 Mar 2026");
        assert_eq!(
            strftime(at, "%A, %B %-d").unwrap_err().kind(),
            ErrorKind::InvalidOperation
        );
        assert_eq!(
            strftime(at, "%Y-%m-%dT%H:%M:%S %j %a %%").unwrap(),
            "2026-03-05T07:08:09 064 Thu %"
        );
    }
}
