//! `llmgw config check`: validate any llmgw file and say what is wrong.

use std::path::Path;

use crate::common::{ConfigError, read_file};
use crate::{AgentConfig, FileKind, RouterConfig, ServerConfig};

/// The outcome of checking one file.
#[derive(Debug)]
pub struct CheckReport {
    pub kind: FileKind,
    pub summary: String,
    pub warnings: Vec<String>,
}

/// Validates `path` as `kind`, or as the kind its content shows.
pub fn check_file(path: &Path, kind: Option<FileKind>) -> Result<CheckReport, ConfigError> {
    let (name, text) = read_file(path)?;
    check_text(&name, &text, kind)
}

/// Validates `text`, named `name` in every problem, as `kind` or as the
/// kind its content shows.
pub fn check_text(
    name: &str,
    text: &str,
    kind: Option<FileKind>,
) -> Result<CheckReport, ConfigError> {
    let kind = match kind {
        Some(k) => k,
        None => detect_kind(name, text)?,
    };
    let (summary, warnings) = match kind {
        FileKind::Agent => {
            let c = AgentConfig::parse(name, text)?;
            let summary = format!(
                "node {} with {} fabric(s), {} control-plane peer(s)",
                c.node_id,
                c.fabrics.len(),
                c.servers.len()
            );
            (summary, c.warnings())
        }
        FileKind::Server => {
            let c = ServerConfig::parse(name, text)?;
            (
                format!("peer {} of a {}-peer cluster", c.id, c.peers.len()),
                c.warnings(),
            )
        }
        FileKind::Router => {
            let c = RouterConfig::parse(name, text)?;
            let summary = format!(
                "router on {} with {} static model(s), watching {} peer(s)",
                c.listen,
                c.models.models.len(),
                c.control_plane.len()
            );
            (summary, Vec::new())
        }
        FileKind::Models => {
            let c = llmgw_catalog::parse_catalog(name, text)?;
            let managed = c.models.iter().filter(|m| m.managed().is_some()).count();
            let summary = format!(
                "{} model(s): {managed} run by llmgw, {} routed to static endpoints",
                c.models.len(),
                c.models.len() - managed
            );
            (summary, Vec::new())
        }
    };
    Ok(CheckReport {
        kind,
        summary,
        warnings,
    })
}

fn detect_kind(name: &str, text: &str) -> Result<FileKind, ConfigError> {
    let problem = |pos, message: String| {
        ConfigError::Invalid(llmgw_yaml::Problems {
            file: name.to_string(),
            items: vec![llmgw_yaml::Problem {
                pos,
                path: String::new(),
                message,
            }],
        })
    };
    let root = llmgw_yaml::parse(text)
        .map_err(|e| problem(e.pos, format!("not valid YAML: {}", e.message)))?;
    FileKind::detect(&root).ok_or_else(|| {
        problem(
            root.pos,
            "cannot tell which llmgw file this is (agent, server, router or models); pass --kind"
                .to_string(),
        )
    })
}
