//! Development certificates (`llmgw certs`): a CA in a directory, and peer
//! and node certificates signed by it. Production fleets can bring their own
//! CA: llmgw only needs the identity URI in each certificate.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use time::OffsetDateTime;

use crate::{Identity, TlsError, TlsFiles};

/// File names inside a CA directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";

/// How long certificates made here are valid unless told otherwise.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
pub const CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Validity starts this far in the past, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The CA's certificate and key in `dir`.
pub fn ca_files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join(CA_CERT), dir.join(CA_KEY))
}

/// Creates a development CA in `dir` (created if missing). Refuses to
/// overwrite an existing CA: every certificate it signed would stop working.
pub fn init_ca(dir: &Path) -> Result<PathBuf, TlsError> {
    let (cert_path, key_path) = ca_files(dir);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(TlsError::Exists(path.clone()));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = ca_params();
    let now = SystemTime::now();
    params.not_before = OffsetDateTime::from(now - BACKDATE);
    params.not_after = OffsetDateTime::from(now + CA_VALIDITY);
    let cert = params.self_signed(&key).map_err(generate)?;
    write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
    write_file(&cert_path, cert.pem().as_bytes(), false)?;
    Ok(cert_path)
}

/// The development CA's name and usages.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "llmgw development CA");
    name.push(DnType::OrganizationName, "llmgw");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// What to put in a certificate.
#[derive(Debug, Clone)]
pub struct IssueRequest {
    pub identity: Identity,
    /// DNS names and IP addresses the holder serves on (peers: what others
    /// dial; agents need none).
    pub hosts: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// File name without extension; default `peer-<ID>` or `node-<ID>`.
    pub name: Option<String>,
}

impl IssueRequest {
    /// A certificate valid from now (backdated an hour) for [`CERT_VALIDITY`].
    pub fn new(identity: Identity, hosts: Vec<String>) -> Self {
        let now = SystemTime::now();
        IssueRequest {
            identity,
            hosts,
            not_before: now - BACKDATE,
            not_after: now + CERT_VALIDITY,
            name: None,
        }
    }

    pub fn file_stem(&self) -> String {
        self.name.clone().unwrap_or_else(|| match &self.identity {
            Identity::Peer(id) => format!("peer-{id}"),
            Identity::Node(id) => format!("node-{id}"),
        })
    }
}

/// Signs a certificate for `request` with the CA in `ca_dir` (`ca.pem`,
/// `ca.key`) and writes `<stem>.pem` and `<stem>.key` into `out_dir`,
/// replacing earlier files (each file atomically, key first). Returns the
/// files a process would configure (`ca`, `cert`, `key`).
pub fn issue(ca_dir: &Path, out_dir: &Path, request: &IssueRequest) -> Result<TlsFiles, TlsError> {
    let (ca_cert_path, ca_key_path) = ca_files(ca_dir);
    issue_with(&ca_cert_path, &ca_key_path, out_dir, request)
}

/// Like [`issue`], with any CA: one made by `llmgw certs init` or an
/// operator's own (its certificate and private key in PEM; ECDSA, Ed25519
/// or RSA). The new certificate names the CA's own subject as its issuer.
pub fn issue_with(
    ca_cert_path: &Path,
    ca_key_path: &Path,
    out_dir: &Path,
    request: &IssueRequest,
) -> Result<TlsFiles, TlsError> {
    if let Identity::Node(id) = &request.identity {
        crate::identity::check_node_id(id).map_err(TlsError::Identity)?;
    }
    let (issuer, ca_subject) = load_ca(ca_cert_path, ca_key_path)?;
    let bad_ca = |why: &str| TlsError::Pem {
        path: ca_cert_path.to_owned(),
        why: why.to_owned(),
    };

    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("llmgw {}", request.identity));
    name.push(DnType::OrganizationName, "llmgw");
    params.distinguished_name = name;
    params.subject_alt_names.push(SanType::URI(
        request.identity.uri().try_into().map_err(generate)?,
    ));
    for host in &request.hosts {
        params.subject_alt_names.push(match host.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.clone().try_into().map_err(|e| {
                TlsError::Generate(format!("{host:?} is not a DNS name or IP address: {e}"))
            })?),
        });
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Peers both serve and dial; agents dial, and may serve their own API.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = OffsetDateTime::from(request.not_before);
    params.not_after = OffsetDateTime::from(request.not_after);

    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;
    let issued = webpki::EndEntityCert::try_from(cert.der())
        .map_err(|e| TlsError::Generate(format!("the new certificate does not parse: {e}")))?;
    if issued.issuer() != ca_subject.as_slice() {
        return Err(bad_ca("signed a certificate that names another issuer"));
    }
    std::fs::create_dir_all(out_dir).map_err(|source| TlsError::Write {
        path: out_dir.to_owned(),
        source,
    })?;
    let stem = request.file_stem();
    let files = TlsFiles {
        ca: ca_cert_path.to_owned(),
        cert: out_dir.join(format!("{stem}.pem")),
        key: out_dir.join(format!("{stem}.key")),
        crl: None,
    };
    write_file(&files.key, key.serialize_pem().as_bytes(), true)?;
    write_file(&files.cert, cert.pem().as_bytes(), false)?;
    Ok(files)
}

/// The revocation list `revoke` writes beside the CA, for `tls.crl`.
pub const CRL: &str = "crl.pem";
/// What `revoke` has revoked so far: one `SERIAL_HEX UNIX_SECONDS` line each.
const REVOKED: &str = "revoked.txt";
/// How long a revocation list is current; `revoke` issues a fresh one.
const CRL_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Adds the certificate in `cert_path` to the revocation list of the CA in
/// `ca_dir` and writes `crl.pem` there, signed by the CA. Processes with
/// `tls.crl` pointing at it refuse that certificate from their next reload
/// on. Returns the list's path and how many certificates it revokes.
pub fn revoke(ca_dir: &Path, cert_path: &Path) -> Result<(PathBuf, usize), TlsError> {
    let victim = crate::read_certificates("certificate to revoke", cert_path)?.remove(0);
    let serial = webpki::EndEntityCert::try_from(&victim)
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_owned(),
            why: format!("does not parse ({e})"),
        })?
        .serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let mut revoked = read_revoked(ca_dir)?;
    if !revoked.iter().any(|(s, _)| *s == serial) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        revoked.push((serial, at));
    }
    let text: String = revoked
        .iter()
        .map(|(serial, at)| format!("{serial} {at}\n"))
        .collect();
    write_file(&ca_dir.join(REVOKED), text.as_bytes(), false)?;
    let crl = publish_crl(ca_dir)?;
    Ok((crl, revoked.len()))
}

/// Writes `crl.pem` in `ca_dir`: a fresh list, signed by the CA, of every
/// certificate `revoke` revoked (none yet is a valid, empty list, so
/// `tls.crl` can point at it before anything is revoked).
pub fn publish_crl(ca_dir: &Path) -> Result<PathBuf, TlsError> {
    let (ca_cert_path, ca_key_path) = ca_files(ca_dir);
    let (issuer, _) = load_ca(&ca_cert_path, &ca_key_path)?;
    let revoked = read_revoked(ca_dir)?;
    let now = SystemTime::now();
    let params = rcgen::CertificateRevocationListParams {
        this_update: OffsetDateTime::from(now),
        next_update: OffsetDateTime::from(now + CRL_VALIDITY),
        // Newer lists carry higher numbers.
        crl_number: rcgen::SerialNumber::from(
            now.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs()),
        ),
        issuing_distribution_point: None,
        revoked_certs: revoked
            .iter()
            .map(|(serial, at)| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(hex_bytes(serial)),
                revocation_time: OffsetDateTime::from(
                    SystemTime::UNIX_EPOCH + Duration::from_secs(*at),
                ),
                reason_code: None,
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    };
    let crl = params
        .signed_by(&issuer)
        .and_then(|crl| crl.pem())
        .map_err(generate)?;
    let crl_path = ca_dir.join(CRL);
    write_file(&crl_path, crl.as_bytes(), false)?;
    Ok(crl_path)
}

/// The serials `revoke` recorded, with when.
fn read_revoked(ca_dir: &Path) -> Result<Vec<(String, u64)>, TlsError> {
    let path = ca_dir.join(REVOKED);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .filter_map(|line| {
                let (serial, at) = line.split_once(' ')?;
                Some((serial.to_owned(), at.trim().parse().ok()?))
            })
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(TlsError::Read {
            what: "revoked serials",
            path,
            source,
        }),
    }
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// A CA's certificate and key as a signer, and the CA's subject. The
/// issuer's name and key identifier come from the certificate itself, so
/// any CA signs, not only one with llmgw's own name.
fn load_ca(
    cert_path: &Path,
    key_path: &Path,
) -> Result<(Issuer<'static, KeyPair>, Vec<u8>), TlsError> {
    let cert = crate::read_certificates("CA certificate", cert_path)?.remove(0);
    let key_pem = std::fs::read_to_string(key_path).map_err(|source| TlsError::Read {
        what: "CA key",
        path: key_path.to_owned(),
        source,
    })?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::Pem {
        path: key_path.to_owned(),
        why: format!("holds no usable private key: {e}"),
    })?;
    let bad_ca = |why: String| TlsError::Pem {
        path: cert_path.to_owned(),
        why,
    };
    let parsed = webpki::EndEntityCert::try_from(&cert)
        .map_err(|e| bad_ca(format!("does not parse ({e})")))?;
    if parsed.subject_public_key_info().as_ref() != key.subject_public_key_info().as_slice() {
        return Err(bad_ca(format!(
            "does not belong to the key in {}",
            key_path.display()
        )));
    }
    let subject = parsed.subject().to_vec();
    let issuer = Issuer::from_ca_cert_der(&cert, key)
        .map_err(|e| bad_ca(format!("cannot be read as a CA certificate ({e})")))?;
    Ok((issuer, subject))
}

fn generate(error: rcgen::Error) -> TlsError {
    TlsError::Generate(error.to_string())
}

/// Writes through a temporary file and a rename, so a process reloading the
/// file never reads half of it. Keys are readable by the owner only.
fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(err)
}
