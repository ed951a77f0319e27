//! This process's TLS material (CA bundle, certificate, key) as rustls
//! configs, reloaded when the files change on disk.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::{Identity, TlsError};

/// How often [`Tls::watch`] looks at the files by default.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The three PEM files of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates that sign every llmgw certificate (a bundle: during a
    /// CA rotation it holds the old and the new CA).
    pub ca: PathBuf,
    /// This process's certificate, followed by any intermediates.
    pub cert: PathBuf,
    /// The certificate's private key (PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// Certificate revocation lists (PEM, one or more), reloaded like the
    /// rest: a certificate listed there is refused on every link, in both
    /// directions. `None`: nothing is revoked.
    pub crl: Option<PathBuf>,
}

/// One loaded generation of the material.
struct Loaded {
    server: Arc<ServerConfig>,
    /// The admin API's: the same certificate, no client certificate asked
    /// for (callers authenticate with bearer tokens), HTTP/1.1.
    https: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// Serial and validity of the certificate, for logs.
    summary: String,
}

/// This process's mTLS material. Cheap to clone; every clone sees reloads.
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    identity: Identity,
    current: RwLock<Arc<Loaded>>,
    /// What the files looked like when last read (loaded or not).
    seen: Mutex<[Option<Stamp>; 4]>,
}

/// Enough of a file's metadata to notice a replaced or rewritten file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

impl Tls {
    /// Loads the files; this process's certificate must name `identity`.
    pub fn load(files: TlsFiles, identity: Identity) -> Result<Tls, TlsError> {
        let seen = stamps(&files);
        let loaded = load(&files, &identity)?;
        tracing::info!(
            %identity,
            cert = %files.cert.display(),
            ca = %files.ca.display(),
            certificate = %loaded.summary,
            "mTLS material loaded"
        );
        Ok(Tls {
            inner: Arc::new(Inner {
                files,
                identity,
                current: RwLock::new(Arc::new(loaded)),
                seen: Mutex::new(seen),
            }),
        })
    }

    /// Who this process is.
    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// The config new incoming handshakes use.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current().server.clone()
    }

    /// The config new HTTPS handshakes on the admin API use.
    pub fn https_server_config(&self) -> Arc<ServerConfig> {
        self.current().https.clone()
    }

    /// The config new outgoing handshakes use.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.current().client.clone()
    }

    fn current(&self) -> Arc<Loaded> {
        self.inner
            .current
            .read()
            .expect("TLS material lock poisoned")
            .clone()
    }

    /// Reloads when any of the files changed since they were last read.
    /// Returns whether new material is in use; on an error the previous
    /// material stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.inner.files);
        {
            let mut seen = self.inner.seen.lock().expect("TLS stamps poisoned");
            if *seen == now {
                return Ok(false);
            }
            // Remembered even when loading fails: the next attempt waits for
            // the next change (a key written after its certificate).
            *seen = now;
        }
        let loaded = load(&self.inner.files, &self.inner.identity)?;
        let summary = loaded.summary.clone();
        *self
            .inner
            .current
            .write()
            .expect("TLS material lock poisoned") = Arc::new(loaded);
        tracing::info!(
            identity = %self.inner.identity,
            cert = %self.inner.files.cert.display(),
            certificate = %summary,
            "mTLS material reloaded; new connections use it"
        );
        Ok(true)
    }

    /// Looks at the files every `every` and reloads them when they change,
    /// for as long as any clone of this handle lives. Needs a tokio runtime.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let tls = Tls { inner };
                if let Err(error) = tls.reload_if_changed() {
                    tracing::warn!(
                        identity = %tls.inner.identity,
                        %error,
                        "mTLS files changed but do not load; keeping the previous certificate and key"
                    );
                }
            }
        })
    }
}

fn stamps(files: &TlsFiles) -> [Option<Stamp>; 4] {
    [
        stamp(&files.ca),
        stamp(&files.cert),
        stamp(&files.key),
        files.crl.as_deref().and_then(stamp),
    ]
}

/// Every CRL in a PEM file; an empty list for no file.
fn read_crls(path: Option<&Path>) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    match path {
        Some(path) => read_blocks("revocation list", "X509 CRL", path),
        None => Ok(Vec::new()),
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file; at least one.
pub fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    read_blocks(what, "CERTIFICATE", path)
}

/// Every `block` in the PEM file at `path`; at least one.
fn read_blocks<T: PemObject>(
    what: &'static str,
    block: &str,
    path: &Path,
) -> Result<Vec<T>, TlsError> {
    let pem = read(what, path)?;
    let items = T::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            why: format!("not a PEM {what} file: {e}"),
        })?;
    if items.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            why: format!("holds no {block} block"),
        });
    }
    Ok(items)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("private key", path)?;
    // The parser's error never carries key bytes.
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        why: format!("holds no usable private key: {e}"),
    })
}

/// The ring provider: llmgw builds no other crypto.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Serial number and validity of a certificate, for logs.
pub(crate) fn describe(cert: &CertificateDer<'_>) -> String {
    let serial = match webpki::EndEntityCert::try_from(cert) {
        Ok(parsed) => parsed
            .serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
        Err(e) => return format!("(does not parse: {e})"),
    };
    match crate::der::validity(cert.as_ref()) {
        Some((not_before, not_after)) => {
            let now = SystemTime::now();
            let state = if now < not_before {
                " (NOT valid yet)"
            } else if now > not_after {
                " (EXPIRED)"
            } else {
                ""
            };
            format!(
                "serial {serial}, valid {} to {}{state}",
                crate::der::format_time(not_before),
                crate::der::format_time(not_after)
            )
        }
        None => format!("serial {serial}"),
    }
}

fn load(files: &TlsFiles, identity: &Identity) -> Result<Loaded, TlsError> {
    let ca = read_certificates("CA bundle", &files.ca)?;
    let chain = read_certificates("certificate", &files.cert)?;
    let key = read_key(&files.key)?;
    let crls = read_crls(files.crl.as_deref())?;
    // The file to blame when the CA bundle and CRL cannot verify anything.
    let unusable = |whose: &'static str| {
        let path = match &files.crl {
            Some(crl) if !crls.is_empty() => crl.clone(),
            _ => files.ca.clone(),
        };
        move |e: rustls::server::VerifierBuilderError| TlsError::Pem {
            path,
            why: format!("cannot verify {whose} certificates with this CA bundle and CRL: {e}"),
        }
    };

    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots.add(cert).map_err(|e| TlsError::Pem {
            path: files.ca.clone(),
            why: format!("holds a certificate that cannot be a trust anchor: {e}"),
        })?;
    }
    let roots = Arc::new(roots);

    let found = Identity::from_certificate(&chain[0]).map_err(|e| TlsError::Pem {
        path: files.cert.clone(),
        why: e.to_string(),
    })?;
    if &found != identity {
        return Err(TlsError::WrongIdentity {
            path: files.cert.clone(),
            found,
            expected: identity.clone(),
        });
    }
    let summary = describe(&chain[0]);

    let provider = provider();
    let rustls_error = |what: &str| {
        let what = format!("{what} ({}, {})", files.cert.display(), files.key.display());
        move |source: rustls::Error| TlsError::Rustls { what, source }
    };
    // Revocation is checked for the leaf only, and a certificate whose CA
    // published no list passes: during a CA rotation one CA may have a
    // list and the other none.
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .with_crls(crls.clone())
        .only_check_end_entity_revocation()
        .allow_unknown_revocation_status()
        .build()
        .map_err(unusable("client"))?;
    let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .with_crls(crls.clone())
        .only_check_end_entity_revocation()
        .allow_unknown_revocation_status()
        .build()
        .map_err(unusable("server"))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_error("TLS versions"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(rustls_error("the certificate and key do not go together"))?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut https = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_error("TLS versions"))?
        .with_no_client_auth()
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(rustls_error("the certificate and key do not go together"))?;
    https.alpn_protocols = vec![b"http/1.1".to_vec()];

    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(rustls_error("TLS versions"))?
        .with_webpki_verifier(server_verifier)
        .with_client_auth_cert(chain, key)
        .map_err(rustls_error("the certificate and key do not go together"))?;
    client.alpn_protocols = vec![b"h2".to_vec()];

    Ok(Loaded {
        server: Arc::new(server),
        https: Arc::new(https),
        client: Arc::new(client),
        summary,
    })
}

/// What an admin API client (`llmgw ctl`, a router, a test) trusts: the
/// certificates in the CA bundle at `ca` and nothing else, HTTP/1.1, no
/// client certificate.
pub fn https_client_config(ca: &Path) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certificates("CA bundle", ca)? {
        roots.add(cert).map_err(|e| TlsError::Pem {
            path: ca.to_owned(),
            why: format!("holds a certificate that cannot be a trust anchor: {e}"),
        })?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions".to_owned(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
