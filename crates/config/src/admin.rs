//! The `admin` section of server.yaml: bearer tokens for the admin API.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path as FsPath, PathBuf};

use llmgw_yaml::{Cx, Decode, Node, Path};
use serde::{Serialize, Serializer};

/// Shorter tokens are refused: they can be guessed.
pub const MIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AdminConfig {
    /// No tokens: the admin API is open to anyone who reaches it (a warning
    /// at start says so).
    pub tokens: Vec<AdminToken>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdminToken {
    /// Shown in logs and errors instead of the token.
    pub name: String,
    pub role: AdminRole,
    pub source: TokenSource,
}

/// `read` may call GET; `write` may call everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminRole {
    Read,
    Write,
}

impl fmt::Display for AdminRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdminRole::Read => "read",
            AdminRole::Write => "write",
        })
    }
}

/// Where a token's secret comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// A file holding the token (surrounding whitespace is ignored): the
    /// secret stays out of server.yaml.
    File(PathBuf),
    /// Written in server.yaml itself.
    Inline(Secret),
}

/// A secret: never printed, serialized or logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: String) -> Self {
        Secret(text)
    }

    /// The secret itself, for comparing with what a client sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<redacted>")
    }
}

impl AdminToken {
    /// The token itself; a `token_file` is read now. Errors name the token
    /// and the file, never the secret.
    pub fn secret(&self) -> Result<Secret, String> {
        match &self.source {
            TokenSource::Inline(secret) => Ok(secret.clone()),
            TokenSource::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "admin token {:?}: cannot read its token_file {}: {e}",
                        self.name,
                        path.display()
                    )
                })?;
                let token = text.trim();
                check_token(token).map_err(|why| {
                    format!(
                        "admin token {:?}: token_file {}: {why}",
                        self.name,
                        path.display()
                    )
                })?;
                Ok(Secret(token.to_owned()))
            }
        }
    }

    pub(crate) fn resolve(mut self, config_file: &FsPath) -> Self {
        if let TokenSource::File(path) = self.source {
            self.source = TokenSource::File(crate::common::relative_to(config_file, path));
        }
        self
    }
}

fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the token is empty".to_owned());
    }
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(format!(
            "the token is shorter than {MIN_TOKEN_CHARS} characters; make one with e.g. \
             `openssl rand -hex 32`"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the token has whitespace or control characters inside".to_owned());
    }
    Ok(())
}

impl Decode for AdminConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["tokens"])?;
        let tokens: Vec<AdminToken> = f.or(cx, "tokens", Vec::new());
        let mut names = BTreeMap::new();
        let mut secrets = BTreeMap::new();
        for (i, token) in tokens.iter().enumerate() {
            let at = f.item_pos("tokens", i);
            let item = f.path().field("tokens").index(i);
            if let Some(first) = names.insert(token.name.as_str(), i) {
                cx.report(
                    at,
                    &item.field("name"),
                    format!(
                        "token name {:?} is also used by tokens[{first}]",
                        token.name
                    ),
                );
            }
            if let TokenSource::Inline(secret) = &token.source
                && let Some(first) = secrets.insert(secret.expose(), i)
            {
                cx.report(
                    at,
                    &item.field("token"),
                    format!("the same token as tokens[{first}]; every token must differ"),
                );
            }
        }
        Some(AdminConfig { tokens })
    }
}

impl Decode for AdminToken {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["name", "role", "token", "token_file"])?;
        let name: Option<String> = f.required(cx, "name");
        if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            f.report(cx, "name", "must not be empty");
        }
        let role = match f.required::<String>(cx, "role").as_deref() {
            Some("read") => Some(AdminRole::Read),
            Some("write") => Some(AdminRole::Write),
            Some(other) => {
                f.report(
                    cx,
                    "role",
                    format!("unknown role {other:?}; expected `read` or `write`"),
                );
                None
            }
            None => None,
        };
        let source = match (f.has("token"), f.has("token_file")) {
            (true, true) => {
                f.report(cx, "token", "give `token` or `token_file`, not both");
                None
            }
            (false, false) => {
                f.report(
                    cx,
                    "token_file",
                    "required: a file holding the token (or `token` with the token itself)",
                );
                None
            }
            (true, false) => {
                let token: Option<String> = f.optional(cx, "token");
                match token {
                    Some(token) => match check_token(&token) {
                        Ok(()) => Some(TokenSource::Inline(Secret(token))),
                        Err(why) => {
                            f.report(cx, "token", why);
                            None
                        }
                    },
                    None => None,
                }
            }
            (false, true) => f
                .optional::<PathBuf>(cx, "token_file")
                .map(TokenSource::File),
        };
        Some(AdminToken {
            name: name?,
            role: role?,
            source: source?,
        })
    }
}
