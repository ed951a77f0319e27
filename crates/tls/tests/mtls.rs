//! The accept loop and the dialer against each other in one process: who
//! gets through with which identity, and that reloaded material is what new
//! handshakes use.

use std::path::Path;
use std::time::{Duration, SystemTime};

use llmgw_tls::certs::{self, IssueRequest};
use llmgw_tls::{Identity, Tls, TlsFiles, incoming};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;

fn issue(ca: &Path, out: &Path, identity: Identity, stem: &str) -> TlsFiles {
    let mut request = IssueRequest::new(identity, vec!["127.0.0.1".into()]);
    request.name = Some(stem.into());
    certs::issue(ca, out, &request).unwrap()
}

fn serial(cert: &rustls_pki_types::CertificateDer<'_>) -> Vec<u8> {
    webpki::EndEntityCert::try_from(cert)
        .unwrap()
        .serial()
        .to_vec()
}

#[tokio::test]
async fn peers_and_nodes_get_through_with_their_identity_and_strangers_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init_ca(&ca).unwrap();
    assert!(matches!(
        certs::init_ca(&ca),
        Err(llmgw_tls::TlsError::Exists(_))
    ));
    let server = Tls::load(
        issue(&ca, dir.path(), Identity::Peer(1), "p1"),
        Identity::Peer(1),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut conns = incoming(listener, Some(server.clone()));

    // A peer and a node each arrive with their identity.
    for identity in [Identity::Peer(2), Identity::Node("gpu-1".into())] {
        let files = issue(&ca, dir.path(), identity.clone(), "client");
        let client = Tls::load(files, identity.clone()).unwrap();
        let chain = llmgw_tls::probe(&addr, &client).await.unwrap();
        assert_eq!(
            Identity::from_certificate(&chain[0]).unwrap(),
            Identity::Peer(1)
        );
        let conn = tokio::time::timeout(Duration::from_secs(10), conns.next())
            .await
            .expect("the connection is accepted")
            .unwrap()
            .unwrap();
        assert_eq!(conn.info().identity.as_ref(), Some(&identity));
    }

    // A certificate from another CA never reaches the service.
    let other = dir.path().join("other");
    certs::init_ca(&other).unwrap();
    let foreign = issue(&other, dir.path(), Identity::Peer(2), "foreign");
    let foreign = Tls::load(
        TlsFiles {
            ca: certs::ca_files(&ca).0,
            ..foreign
        },
        Identity::Peer(2),
    )
    .unwrap();
    let _ = llmgw_tls::probe(&addr, &foreign).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), conns.next())
            .await
            .is_err(),
        "a foreign certificate was accepted"
    );

    // An own certificate that names someone else is refused at load.
    let wrong = issue(&ca, dir.path(), Identity::Node("gpu-2".into()), "wrong");
    let error = Tls::load(wrong, Identity::Node("gpu-1".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("node gpu-2") && error.contains("node gpu-1"),
        "{error}"
    );
}

#[tokio::test]
async fn reloaded_material_is_used_by_new_handshakes_and_bad_files_keep_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init_ca(&ca).unwrap();
    let files = issue(&ca, &ca, Identity::Peer(1), "peer-1");
    let server = Tls::load(files.clone(), Identity::Peer(1)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _conns = incoming(listener, Some(server.clone()));
    let client = Tls::load(
        issue(&ca, dir.path(), Identity::Peer(2), "p2"),
        Identity::Peer(2),
    )
    .unwrap();
    let before = serial(&llmgw_tls::probe(&addr, &client).await.unwrap()[0]);

    assert!(!server.reload_if_changed().unwrap(), "nothing changed yet");
    // A key that does not parse: refused, the old material stays.
    let good_key = std::fs::read(&files.key).unwrap();
    std::fs::write(&files.key, "garbage").unwrap();
    let error = server.reload_if_changed().unwrap_err().to_string();
    assert!(error.contains(&files.key.display().to_string()), "{error}");
    assert!(!error.contains("garbage"));
    assert_eq!(
        serial(&llmgw_tls::probe(&addr, &client).await.unwrap()[0]),
        before
    );
    std::fs::write(&files.key, good_key).unwrap();

    // A new certificate and key: served by the next handshake.
    let mut request = IssueRequest::new(Identity::Peer(1), vec!["127.0.0.1".into()]);
    request.not_after = SystemTime::now() + Duration::from_secs(3600);
    certs::issue(&ca, &ca, &request).unwrap();
    assert!(server.reload_if_changed().unwrap());
    let after = serial(&llmgw_tls::probe(&addr, &client).await.unwrap()[0]);
    assert_ne!(after, before);

    // A certificate for another peer in the same files is refused.
    certs::issue(
        &ca,
        &ca,
        &IssueRequest {
            name: Some("peer-1".into()),
            ..IssueRequest::new(Identity::Peer(9), vec![])
        },
    )
    .unwrap();
    assert!(server.reload_if_changed().is_err());
    assert_eq!(
        serial(&llmgw_tls::probe(&addr, &client).await.unwrap()[0]),
        after
    );
}

#[tokio::test]
async fn the_dialer_refuses_a_server_with_a_node_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init_ca(&ca).unwrap();
    let fake = Tls::load(
        issue(&ca, dir.path(), Identity::Node("gpu-1".into()), "fake"),
        Identity::Node("gpu-1".into()),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _conns = incoming(listener, Some(fake));
    let client = Tls::load(
        issue(&ca, dir.path(), Identity::Peer(2), "p2"),
        Identity::Peer(2),
    )
    .unwrap();
    let endpoint = llmgw_tls::endpoint(&addr).unwrap();
    let error = llmgw_tls::connect(&endpoint, Some(&client))
        .await
        .unwrap_err();
    let text = format!("{error:?}");
    assert!(text.contains("only control-plane peers"), "{text}");
}

/// An operator's own CA, with its own name and key type, signs what llmgw
/// processes present; a peer and a node get through with their identity.
#[tokio::test]
async fn certificates_from_an_operators_own_ca_are_issued_and_accepted() {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
        KeyUsagePurpose, PKCS_ECDSA_P384_SHA384,
    };
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("corp-ca");
    std::fs::create_dir_all(&own).unwrap();
    let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).unwrap();
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "Example Corp Issuing CA 2");
    name.push(DnType::OrganizationName, "Example Corp");
    name.push(DnType::CountryName, "NL");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path) = (own.join("corp-root.crt"), own.join("corp-root.key"));
    std::fs::write(&cert_path, ca_cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();

    let issue_own = |identity: Identity, stem: &str| {
        let mut request = IssueRequest::new(identity, vec!["127.0.0.1".into()]);
        request.name = Some(stem.into());
        certs::issue_with(&cert_path, &key_path, dir.path(), &request).unwrap()
    };
    let server_files = issue_own(Identity::Peer(1), "p1");
    assert_eq!(server_files.ca, cert_path);
    let server = Tls::load(server_files, Identity::Peer(1)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut conns = incoming(listener, Some(server));
    let identity = Identity::Node("gpu-1".into());
    let client = Tls::load(issue_own(identity.clone(), "n1"), identity.clone()).unwrap();
    let chain = llmgw_tls::probe(&addr, &client).await.unwrap();
    assert_eq!(
        Identity::from_certificate(&chain[0]).unwrap(),
        Identity::Peer(1)
    );
    let conn = tokio::time::timeout(Duration::from_secs(10), conns.next())
        .await
        .expect("the connection is accepted")
        .unwrap()
        .unwrap();
    assert_eq!(conn.info().identity.as_ref(), Some(&identity));
}

/// `llmgw certs revoke` lists a certificate in the CA's CRL; a process
/// whose `tls.crl` points there refuses it after its next reload, and
/// still takes everyone else.
#[tokio::test]
async fn a_revoked_certificate_is_refused_after_the_crl_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init_ca(&ca).unwrap();
    // A list that exists before anything that matters is revoked.
    let retired = issue(&ca, dir.path(), Identity::Node("retired".into()), "retired");
    let (crl, count) = certs::revoke(&ca, &retired.cert).unwrap();
    assert_eq!((crl.clone(), count), (ca.join(certs::CRL), 1));

    let server_files = TlsFiles {
        crl: Some(crl.clone()),
        ..issue(&ca, dir.path(), Identity::Peer(1), "p1")
    };
    let server = Tls::load(server_files, Identity::Peer(1)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut conns = incoming(listener, Some(server.clone()));
    let node = |name: &str| {
        let identity = Identity::Node(name.into());
        let files = issue(&ca, dir.path(), identity.clone(), name);
        (files.clone(), Tls::load(files, identity).unwrap())
    };
    let (stolen_files, stolen) = node("gpu-7");
    let (_, honest) = node("gpu-8");
    let _ = llmgw_tls::probe(&addr, &stolen).await;
    assert!(accepted(&mut conns).await, "gpu-7 before its revocation");

    certs::revoke(&ca, &stolen_files.cert).unwrap();
    assert!(server.reload_if_changed().unwrap(), "the new CRL is loaded");
    let _ = llmgw_tls::probe(&addr, &stolen).await;
    assert!(
        !accepted(&mut conns).await,
        "a revoked certificate got through"
    );
    let _ = llmgw_tls::probe(&addr, &honest).await;
    assert!(accepted(&mut conns).await, "gpu-8 is not revoked");
    // Revoking twice lists it once.
    let (_, count) = certs::revoke(&ca, &stolen_files.cert).unwrap();
    assert_eq!(count, 2);
}

/// Whether the accept loop hands out a connection within 1.5 s.
async fn accepted<S: tokio_stream::Stream + Unpin>(conns: &mut S) -> bool {
    tokio::time::timeout(Duration::from_millis(1500), conns.next())
        .await
        .is_ok()
}
