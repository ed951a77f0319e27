//! What a model directory holds for tokenizing: `tokenizer.json`, and the
//! chat template and special tokens from `tokenizer_config.json`, where a
//! `chat_template.jinja` beside it takes precedence (transformers writes
//! the template there since 4.43).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::TokenizerError;

/// The special tokens a chat template may name (`bos_token`, ...), by name.
pub type SpecialTokens = BTreeMap<&'static str, String>;

const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

/// A model's chat templates by name; a single template is `default`.
pub type Templates = BTreeMap<String, String>;

pub struct ModelFiles {
    pub tokenizer: Tokenizer,
    pub chat_templates: Option<Templates>,
    pub special_tokens: SpecialTokens,
}

impl ModelFiles {
    pub fn read(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&path).map_err(|err| TokenizerError::File {
            path: path.clone(),
            reason: err.to_string(),
        })?;
        // transformers sets truncation and padding per call and asks for
        // neither when the engines encode a prompt.
        tokenizer
            .with_truncation(None)
            .map_err(|err| TokenizerError::File {
                path,
                reason: err.to_string(),
            })?;
        tokenizer.with_padding(None);

        let config_path = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| TokenizerError::File {
                path: config_path.clone(),
                reason: err.to_string(),
            })?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(err) => {
                return Err(TokenizerError::File {
                    path: config_path,
                    reason: err.to_string(),
                });
            }
        };
        let template_path = dir.join("chat_template.jinja");
        let chat_templates = match std::fs::read_to_string(&template_path) {
            Ok(text) => Some(Templates::from([("default".to_string(), text)])),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                config_templates(&config_path, config.get("chat_template"))?
            }
            Err(err) => {
                return Err(TokenizerError::File {
                    path: template_path,
                    reason: err.to_string(),
                });
            }
        };
        let special_tokens = SPECIAL_TOKENS
            .into_iter()
            .filter_map(|name| Some((name, token_text(config.get(name)?)?)))
            .collect();
        Ok(ModelFiles {
            tokenizer,
            chat_templates,
            special_tokens,
        })
    }
}

/// `chat_template` is one template, or a list of `{name, template}`.
fn config_templates(
    path: &Path,
    field: Option<&Value>,
) -> Result<Option<Templates>, TokenizerError> {
    let malformed = || TokenizerError::File {
        path: path.to_path_buf(),
        reason: "chat_template must be a string or a list of {name, template}".into(),
    };
    match field {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(Templates::from([("default".into(), text.clone())]))),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(name), Some(template)) => Ok((name.to_string(), template.to_string())),
                    _ => Err(malformed()),
                }
            })
            .collect::<Result<Templates, _>>()
            .map(Some),
        Some(_) => Err(malformed()),
    }
}

/// A special token is its text, or an object with it in `content`
/// (transformers' saved `AddedToken`).
fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(fields) => fields.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}
