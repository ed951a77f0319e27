//! Tokenizing in the router, with the model's own tokenizer and chat
//! template read from a directory on the router's host
//! (`balancing.tokenizers`): no round trip to an engine per request.
//!
//! The router's tokens are only worth what they share with the engine's,
//! so a sample is checked against the engine's `/tokenize`: a model's
//! first requests, then one in `tokenizer_check_every`. Until a model's
//! first check agreed, and for every checked request, the engine's tokens
//! route it; the first difference stops the router tokenizing that model
//! (a warning in the log, a metric), and the engine's `/tokenize` serves it
//! from then on.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use llmgw_tokenizer::{ModelTokenizer, PromptFields};

use crate::error::RouterError;

/// Requests of a model always checked before the router's tokens are
/// trusted alone.
const FIRST_CHECKS: u64 = 8;

/// The models the router tokenizes itself.
#[derive(Clone, Default)]
pub struct LocalTokenizers {
    models: Arc<HashMap<String, Arc<LocalTokenizer>>>,
    check_every: u64,
}

impl std::fmt::Debug for LocalTokenizers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dirs: BTreeMap<&str, PathBuf> = self
            .models
            .iter()
            .map(|(model, t)| (model.as_str(), t.tokenizer.dir().to_path_buf()))
            .collect();
        f.debug_struct("LocalTokenizers")
            .field("models", &dirs)
            .field("check_every", &self.check_every)
            .finish()
    }
}

pub struct LocalTokenizer {
    tokenizer: ModelTokenizer,
    requests: AtomicU64,
    /// A check found other tokens than the engine's: not used any more.
    disagreed: AtomicBool,
    /// A check agreed: unchecked requests may use the router's tokens.
    agreed: AtomicBool,
}

/// The router's tokens for one request, and whether an engine must
/// confirm them before they are used.
pub struct LocalTokens {
    pub ids: Vec<u32>,
    pub check: bool,
}

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Agreed,
    /// The first position where the two differ.
    Disagreed {
        at: usize,
    },
}

impl LocalTokenizers {
    /// Loads every configured model directory; a directory that cannot be
    /// read is an error naming the model and the file.
    pub fn load(dirs: &BTreeMap<String, PathBuf>, check_every: u64) -> Result<Self, RouterError> {
        let mut models = HashMap::with_capacity(dirs.len());
        for (model, dir) in dirs {
            let tokenizer = ModelTokenizer::load(dir).map_err(|source| RouterError::Tokenizer {
                model: model.clone(),
                source,
            })?;
            models.insert(
                model.clone(),
                Arc::new(LocalTokenizer {
                    tokenizer,
                    requests: AtomicU64::new(0),
                    disagreed: AtomicBool::new(false),
                    agreed: AtomicBool::new(false),
                }),
            );
        }
        Ok(LocalTokenizers {
            models: Arc::new(models),
            check_every: check_every.max(1),
        })
    }

    /// The model's tokenizer, unless it has none here or it disagreed.
    pub fn get(&self, model: &str) -> Option<Arc<LocalTokenizer>> {
        self.models
            .get(model)
            .filter(|t| !t.disagreed.load(Ordering::Relaxed))
            .cloned()
    }

    /// (in use, stopped after a disagreement).
    pub fn counts(&self) -> (u64, u64) {
        let stopped = self
            .models
            .values()
            .filter(|t| t.disagreed.load(Ordering::Relaxed))
            .count() as u64;
        (self.models.len() as u64 - stopped, stopped)
    }

    /// The request's tokens by the router; none when the tokenizer cannot
    /// make them (content it leaves to the engine, a template error).
    /// Encoding takes about a microsecond a token, so a long prompt is
    /// tokenized off the thread that serves connections.
    /// `request` is `body` already read; the blocking pool needs the
    /// bytes themselves.
    pub async fn tokenize(
        &self,
        tokenizer: &Arc<LocalTokenizer>,
        request: &PromptFields<'_>,
        body: &[u8],
    ) -> Option<LocalTokens> {
        let ids = if body.len() <= INLINE_BODY_BYTES {
            request.token_ids(&tokenizer.tokenizer).ok()
        } else {
            let (tokenizer, body) = (Arc::clone(tokenizer), body.to_vec());
            tokio::task::spawn_blocking(move || tokenizer.token_ids(&body))
                .await
                .ok()
                .flatten()
        }?;
        let n = tokenizer.requests.fetch_add(1, Ordering::Relaxed);
        let check = n < FIRST_CHECKS
            || !tokenizer.agreed.load(Ordering::Relaxed)
            || n.is_multiple_of(self.check_every);
        Some(LocalTokens { ids, check })
    }
}

/// Request bodies up to this size are tokenized where they are routed
/// (some tens of microseconds); larger ones on the blocking pool.
const INLINE_BODY_BYTES: usize = 4096;

impl LocalTokenizer {
    fn token_ids(&self, body: &[u8]) -> Option<Vec<u32>> {
        let fields: PromptFields<'_> = serde_json::from_slice(body).ok()?;
        fields.token_ids(&self.tokenizer).ok()
    }

    /// Compares the router's tokens with the engine's for one request.
    pub fn check(&self, model: &str, ours: &[u32], engine: &[u32]) -> Check {
        if ours == engine {
            self.agreed.store(true, Ordering::Relaxed);
            return Check::Agreed;
        }
        let at = ours
            .iter()
            .zip(engine)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(engine.len()));
        if !self.disagreed.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                model,
                dir = %self.tokenizer.dir().display(),
                router_tokens = ours.len(),
                engine_tokens = engine.len(),
                first_difference_at = at,
                "the router's tokenizer disagrees with the engine's /tokenize; asking the engine from now on"
            );
        }
        Check::Disagreed { at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_directory_that_cannot_be_read_names_the_model_and_the_file() {
        let dirs = BTreeMap::from([("qwen".to_string(), PathBuf::from("/nonexistent/qwen"))]);
        let err = LocalTokenizers::load(&dirs, 100)
            .expect_err("refused")
            .to_string();
        assert!(
            err.starts_with(
                "balancing.tokenizers: model `qwen`: /nonexistent/qwen/tokenizer.json: "
            ),
            "{err}"
        );
    }
}
