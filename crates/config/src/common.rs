//! Pieces shared by the three config files: TLS settings, addresses, and
//! reading a file with errors that name it.

use std::path::{Path as FsPath, PathBuf};

use llmgw_yaml::{Cx, Decode, Fields, Node, Path, Problems};
use serde::Serialize;

/// Why a config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(#[from] Problems),
}

impl ConfigError {
    /// Every problem, one per line, each naming file, line, column and field.
    pub fn problems(&self) -> Option<&Problems> {
        match self {
            ConfigError::Invalid(p) => Some(p),
            ConfigError::Read { .. } => None,
        }
    }
}

pub(crate) fn read_file(path: &FsPath) -> Result<(String, String), ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: name.clone(),
        source,
    })?;
    Ok((name, text))
}

/// Resolves a path written in a config file relative to that file's folder,
/// so a config directory can be moved as a whole.
pub(crate) fn relative_to(config_file: &FsPath, path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        return path;
    }
    match config_file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(path),
        _ => path,
    }
}

/// mTLS material: the CA that signs every llmgw certificate, and this
/// process's own certificate and key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsConfig {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Certificate revocation lists (PEM); reloaded when the file changes.
    pub crl: Option<PathBuf>,
}

impl Decode for TlsConfig {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(node, path, &["ca", "cert", "key", "crl"])?;
        Some(TlsConfig {
            ca: f.required(cx, "ca")?,
            cert: f.required(cx, "cert")?,
            key: f.required(cx, "key")?,
            crl: f.optional(cx, "crl"),
        })
    }
}

impl TlsConfig {
    pub(crate) fn resolve(self, config_file: &FsPath) -> Self {
        TlsConfig {
            ca: relative_to(config_file, self.ca),
            cert: relative_to(config_file, self.cert),
            key: relative_to(config_file, self.key),
            crl: self.crl.map(|crl| relative_to(config_file, crl)),
        }
    }
}

/// Reads `tls` and `insecure` together: a file with both is contradictory.
pub(crate) fn decode_transport(f: &Fields<'_>, cx: &mut Cx) -> (Option<TlsConfig>, bool) {
    let tls: Option<TlsConfig> = f.optional(cx, "tls");
    let insecure: bool = f.or(cx, "insecure", false);
    if tls.is_some() && insecure {
        f.report(
            cx,
            "insecure",
            "`insecure: true` turns TLS off, but a `tls` section is also given; keep one",
        );
    }
    (tls, insecure)
}

/// `host:port`, where host is a name, an IPv4 address or a bracketed IPv6
/// address. Returns why not.
pub fn check_host_port(text: &str) -> Result<(), String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} has no port; write it as host:port"));
    };
    if host.is_empty() {
        return Err(format!("{text:?} has no host"));
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("{text:?} has an invalid port {port:?}"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{text:?}: put an IPv6 address in brackets, e.g. [::1]:7443"
        ));
    }
    if host.contains('/') {
        return Err(format!("{text:?} is a URL; give host:port only"));
    }
    Ok(())
}

/// A peer given as `http://host:port`, `https://host:port` or `host:port`:
/// returns `host:port`.
pub fn grpc_authority(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .unwrap_or(text)
        .trim_end_matches('/');
    check_host_port(rest)?;
    Ok(rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert!(check_host_port("10.0.0.1:7443").is_ok());
        assert!(check_host_port("peer-1.internal:7443").is_ok());
        assert!(check_host_port("[::1]:7443").is_ok());
        assert!(check_host_port("::1:7443").is_err());
        assert!(check_host_port("peer-1").is_err());
        assert!(check_host_port("peer:0").is_err());
        assert_eq!(
            grpc_authority("http://llmgw-server.internal:7443").unwrap(),
            "llmgw-server.internal:7443"
        );
    }
}
