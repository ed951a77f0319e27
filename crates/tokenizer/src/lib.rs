//! A model's tokenizer as vLLM and SGLang apply it to a request, read from
//! the model directory: the chat template (Jinja) rendered with the
//! request's messages and tools as Hugging Face transformers renders it,
//! then the text encoded by `tokenizer.json` without special tokens; a
//! completion prompt encoded with them. Tested against ids transformers
//! itself produced (`scripts/tokenizer/`).
//!
//! What it does not know (message content given as a list of parts, a
//! template that fails) is an error: the caller asks the engine instead.

mod files;
mod json;
mod request;
mod template;

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

pub use request::PromptFields;
use template::ChatTemplate;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("{}: no chat template (tokenizer_config.json `chat_template`, chat_template.jinja)", dir.display())]
    NoChatTemplate { dir: PathBuf },
    #[error("chat template: {0}")]
    Template(String),
    #[error("request: {0}")]
    Request(String),
    #[error("encoding: {0}")]
    Encode(String),
}

/// The fields of a chat request that decide its tokens, as JSON text the
/// way the client wrote them.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChatRequest<'a> {
    pub messages: &'a str,
    pub tools: Option<&'a str>,
    /// `true` unless the request says otherwise (vLLM's default).
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// An object whose fields become template variables.
    pub chat_template_kwargs: Option<&'a str>,
}

/// A model's tokenizer and chat template.
pub struct ModelTokenizer {
    dir: PathBuf,
    tokenizer: Tokenizer,
    chat: Option<ChatTemplate>,
}

impl ModelTokenizer {
    /// Reads `tokenizer.json` (required), `tokenizer_config.json` and
    /// `chat_template.jinja` from a model directory.
    pub fn load(dir: &Path) -> Result<Self, TokenizerError> {
        let files = files::ModelFiles::read(dir)?;
        let chat = match files.chat_templates {
            Some(templates) => Some(ChatTemplate::new(templates, files.special_tokens)?),
            None => None,
        };
        Ok(ModelTokenizer {
            dir: dir.to_path_buf(),
            tokenizer: files.tokenizer,
            chat,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The prompt text the chat template makes of a request.
    pub fn render_chat(&self, request: &ChatRequest<'_>) -> Result<String, TokenizerError> {
        let chat = self
            .chat
            .as_ref()
            .ok_or_else(|| TokenizerError::NoChatTemplate {
                dir: self.dir.clone(),
            })?;
        chat.render(request)
    }

    /// A chat request's token ids: the rendered template, encoded without
    /// adding special tokens (the template wrote them).
    pub fn chat_ids(&self, request: &ChatRequest<'_>) -> Result<Vec<u32>, TokenizerError> {
        let text = self.render_chat(request)?;
        self.encode(&text, false)
    }

    /// A completion prompt's token ids, special tokens added (a BOS where
    /// the tokenizer has one), as the engines encode `prompt`.
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode(prompt, true)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|err| TokenizerError::Encode(err.to_string()))
    }
}
