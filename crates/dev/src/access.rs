//! How clients reach a local cluster's admin API: HTTPS trusting the dev CA
//! (plain HTTP with `--insecure`), a read and a write token made for this
//! work directory, and the `admin` section of server.yaml that requires
//! them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;

/// What `llmgw ctl` (and `llmgw dev`'s own progress display) needs.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// The CA bundle that signed the peers' certificates; `None` with
    /// `--insecure` (plain HTTP).
    pub ca: Option<PathBuf>,
    pub read_token_file: PathBuf,
    pub write_token_file: PathBuf,
}

impl AdminAccess {
    /// Makes (or keeps, on a second run in the same work directory) a read
    /// and a write token under `work_dir`, readable by this user only.
    pub fn create(work_dir: &Path, ca: Option<PathBuf>) -> std::io::Result<AdminAccess> {
        let access = AdminAccess {
            ca,
            read_token_file: work_dir.join("admin-read.token"),
            write_token_file: work_dir.join("admin-write.token"),
        };
        for file in [&access.read_token_file, &access.write_token_file] {
            if std::fs::read_to_string(file).is_ok_and(|t| !t.trim().is_empty()) {
                continue;
            }
            write_secret(file, &new_token())?;
        }
        Ok(access)
    }

    /// The `admin` section of every peer's server.yaml.
    pub fn server_yaml(&self) -> String {
        format!(
            "admin:\n  tokens:\n    - {{ name: dev-write, role: write, token_file: \"{}\" }}\n    \
             - {{ name: dev-read, role: read, token_file: \"{}\" }}\n",
            self.write_token_file.display(),
            self.read_token_file.display()
        )
    }

    /// router.yaml lines that let a standalone router follow the peers.
    pub fn router_yaml(&self) -> String {
        let mut out = format!(
            "control_plane_token_file: \"{}\"\n",
            self.read_token_file.display()
        );
        if let Some(ca) = &self.ca {
            out.push_str(&format!("control_plane_ca: \"{}\"\n", ca.display()));
        }
        out
    }

    /// The read token, for clients inside this process.
    pub fn read_token(&self) -> std::io::Result<String> {
        read_trimmed(&self.read_token_file)
    }

    /// The write token, for clients inside this process.
    pub fn write_token(&self) -> std::io::Result<String> {
        read_trimmed(&self.write_token_file)
    }

    /// An admin API client: trusts the CA (when there is one) and sends
    /// `token` as `Authorization: Bearer` on every request.
    pub fn http_client(&self, timeout: Duration, token: Option<&str>) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token
            && let Ok(mut value) =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        {
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2))
            .default_headers(headers);
        if let Some(ca) = &self.ca {
            match llmgw_tls::https_client_config(ca) {
                Ok(tls) => builder = builder.use_preconfigured_tls(tls),
                Err(error) => tracing::warn!(%error, "cannot trust the CA; HTTPS calls will fail"),
            }
        }
        builder.build().expect("an HTTP client with rustls")
    }

    /// The shell lines that point `llmgw ctl` at the cluster.
    pub fn ctl_env(&self, apis: &[String]) -> String {
        let mut out = format!("  export LLMGW_API={}\n", apis.join(","));
        if let Some(ca) = &self.ca {
            out.push_str(&format!("  export LLMGW_CA={}\n", ca.display()));
        }
        out.push_str(&format!(
            "  export LLMGW_TOKEN=$(cat {})   # read-only: {}\n",
            self.write_token_file.display(),
            self.read_token_file.display()
        ));
        out
    }
}

fn read_trimmed(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

/// 32 random bytes as hex.
fn new_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_made_once_private_and_required_by_server_yaml() {
        let dir = tempfile::tempdir().unwrap();
        let access = AdminAccess::create(dir.path(), None).unwrap();
        let (read, write) = (access.read_token().unwrap(), access.write_token().unwrap());
        assert_eq!(read.len(), 64);
        assert_ne!(read, write);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&access.write_token_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "token readable by others: {mode:o}");

        let again = AdminAccess::create(dir.path(), None).unwrap();
        assert_eq!(
            again.write_token().unwrap(),
            write,
            "a rerun keeps the tokens"
        );

        let yaml = format!(
            "id: 1\ninsecure: true\npeers: [{{id: 1, grpc: \"a:1\", admin: \"http://a:2\"}}]\n{}",
            access.server_yaml()
        );
        let config = llmgw_config::ServerConfig::parse("server.yaml", &yaml).unwrap();
        let roles: Vec<String> = config
            .admin
            .tokens
            .iter()
            .map(|t| t.role.to_string())
            .collect();
        assert_eq!(roles, ["write", "read"]);
    }
}
