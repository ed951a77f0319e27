//! Which of llmgw's four files a document is, for `llmgw config check`.

use std::fmt;
use std::str::FromStr;

use llmgw_yaml::{Node, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Agent,
    Server,
    Router,
    Models,
}

impl FileKind {
    pub const ALL: [FileKind; 4] = [
        FileKind::Agent,
        FileKind::Server,
        FileKind::Router,
        FileKind::Models,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Agent => "agent",
            FileKind::Server => "server",
            FileKind::Router => "router",
            FileKind::Models => "models",
        }
    }

    /// Guesses the kind from the top-level keys. Each kind has keys no other
    /// kind uses, so the first distinctive key decides.
    pub fn detect(root: &Node) -> Option<FileKind> {
        let Value::Map(entries) = &root.value else {
            return None;
        };
        let has = |k: &str| entries.iter().any(|e| e.key == k);
        if has("peers") || has("data_dir") || has("admin_listen") {
            Some(FileKind::Server)
        } else if has("node_id")
            || has("mgmt_addr")
            || has("server")
            || has("servers")
            || has("engines")
        {
            Some(FileKind::Agent)
        } else if has("listen") || has("control_plane") || has("api_keys") || has("balancing") {
            Some(FileKind::Router)
        } else if has("models") {
            Some(FileKind::Models)
        } else {
            None
        }
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FileKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FileKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown kind {s:?}; expected agent, server, router or models"))
    }
}
