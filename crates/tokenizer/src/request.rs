//! The fields of an OpenAI chat or completion request that decide its
//! tokens, borrowed from the body as the client wrote it: tokenized here,
//! or sent unparsed to an engine's `/tokenize`.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{ChatRequest, ModelTokenizer, TokenizerError};

#[derive(Debug, Default, Deserialize, Serialize)]
pub struct PromptFields<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<&'a RawValue>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<&'a RawValue>,
}

impl PromptFields<'_> {
    /// Neither `messages` nor `prompt`: nothing to tokenize.
    pub fn is_empty(&self) -> bool {
        self.messages.is_none() && self.prompt.is_none()
    }

    /// The request's prompt token ids as the engines compute them: a chat
    /// through the template, a completion prompt (one string) with special
    /// tokens. A prompt given as token ids or a list is left to the engine.
    pub fn token_ids(&self, tokenizer: &ModelTokenizer) -> Result<Vec<u32>, TokenizerError> {
        if let Some(chat) = self.chat()? {
            return tokenizer.chat_ids(&chat);
        }
        let prompt = self
            .prompt
            .ok_or_else(|| TokenizerError::Request("neither messages nor prompt".into()))?;
        let text: String = serde_json::from_str(prompt.get()).map_err(|_| {
            TokenizerError::Request("a prompt other than one string is left to the engine".into())
        })?;
        tokenizer.prompt_ids(&text)
    }

    /// The chat fields, when the request has `messages`.
    pub fn chat(&self) -> Result<Option<ChatRequest<'_>>, TokenizerError> {
        let Some(messages) = self.messages else {
            return Ok(None);
        };
        Ok(Some(ChatRequest {
            messages: messages.get(),
            tools: present(self.tools),
            add_generation_prompt: flag(self.add_generation_prompt, "add_generation_prompt", true)?,
            continue_final_message: flag(
                self.continue_final_message,
                "continue_final_message",
                false,
            )?,
            chat_template_kwargs: present(self.chat_template_kwargs),
        }))
    }
}

/// A field's JSON text, unless absent or `null`.
fn present(field: Option<&RawValue>) -> Option<&str> {
    field.map(RawValue::get).filter(|v| *v != "null")
}

fn flag(value: Option<&RawValue>, name: &str, default: bool) -> Result<bool, TokenizerError> {
    match value.map(RawValue::get) {
        None | Some("null") => Ok(default),
        Some(text) => serde_json::from_str(text)
            .map_err(|_| TokenizerError::Request(format!("{name} must be true or false"))),
    }
}
