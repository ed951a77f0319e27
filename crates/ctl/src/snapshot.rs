//! `llmgw ctl snapshot save FILE`: a consistent backup of the control
//! plane's state, written durably, with its index, term and state hash.

use std::io::Write;
use std::path::Path;

use llmgw_api::{BackupSummary, paths};
use reqwest::Method;
use serde::Deserialize;

use crate::client::{AdminClient, CtlError};

pub async fn save(client: &AdminClient, file: &Path) -> Result<String, CtlError> {
    let answer = client.call(Method::GET, paths::SNAPSHOT, None).await?;
    let backup = BackupSummary::deserialize(&answer.body)
        .map_err(|_| CtlError::Usage("the peer's answer is not a backup".to_owned()))?;
    let (index, term) = (backup.index(), backup.term());
    let (hash, peer) = (&backup.state_hash, backup.saved_on_peer);
    // The file holds the whole answer, not only what is shown of it.
    let bytes = serde_json::to_vec(&answer.body)
        .map_err(|e| CtlError::Usage(format!("cannot encode the backup: {e}")))?;
    write_durably(file, &bytes)
        .map_err(|e| CtlError::Usage(format!("cannot write {}: {e}", file.display())))?;
    Ok(format!(
        "saved {}: index {index}, term {term}, state hash {hash}, taken on peer {peer}, {} bytes\n\
         restore: llmgw server --config server.yaml --restore {} (on every peer of the new cluster)\n",
        file.display(),
        bytes.len(),
        file.display(),
    ))
}

/// Temporary file, fsync, rename, fsync of the directory: a backup that
/// says it was saved survives a power cut.
fn write_durably(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    let tmp = dir.join(name);
    {
        let mut out = std::fs::File::create(&tmp)?;
        out.write_all(bytes)?;
        out.sync_all()?;
    }
    std::fs::rename(&tmp, file)?;
    std::fs::File::open(&dir)?.sync_all()
}
