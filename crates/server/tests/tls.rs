//! mTLS on the peer transport, with real `llmgw server` processes: who is
//! refused and why (the peer logs it), that an agent's certificate cannot
//! call Raft RPCs, and that a rotated certificate is served without a
//! restart.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use llmgw_api::{ClusterView, NodeStatus, NodeView, paths};
use llmgw_proto::raft::RaftPayload;
use llmgw_proto::raft::raft_service_client::RaftServiceClient;
use llmgw_test_kit::dev::Dev;
use llmgw_test_kit::{Cluster, DEADLINE, admin_client, get_json, llmgw_bin, one_cluster_at_a_time};
use llmgw_tls::certs::{self, IssueRequest};
use llmgw_tls::{Identity, Tls, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate for `identity` signed by the CA in `ca_dir`, written as
/// `<stem>.pem/.key` in `out`, and loaded as a client's material that
/// trusts `trust` (the cluster's CA).
fn client_material(
    ca_dir: &Path,
    out: &Path,
    trust: &Path,
    mut request: IssueRequest,
    stem: &str,
) -> Tls {
    request.name = Some(stem.to_owned());
    let identity = request.identity.clone();
    let files = certs::issue(ca_dir, out, &request).expect("issue a test certificate");
    Tls::load(
        TlsFiles {
            ca: trust.to_owned(),
            ..files
        },
        identity,
    )
    .expect("load the test certificate")
}

/// Calls the Raft `status` RPC on `addr` over mTLS with `tls`.
async fn raft_status(addr: &str, tls: &Tls) -> Result<(), String> {
    let endpoint = llmgw_tls::endpoint(addr)?.connect_timeout(Duration::from_secs(5));
    let channel = llmgw_tls::connect(&endpoint, Some(tls))
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    RaftServiceClient::new(channel)
        .status(RaftPayload {
            data: Vec::new(),
            error: String::new(),
        })
        .await
        .map(|_| ())
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

/// What a refused client tries.
enum Attempt {
    /// A TLS handshake that offers no client certificate.
    NoCertificate,
    /// The Raft `status` RPC.
    Raft(Tls),
    /// The Raft `status` RPC, tried until the peer has reloaded its CRL
    /// (it polls its files every 2 s).
    RaftOnceRevoked(Tls),
    /// `AgentService.Connect` with a `Register` for `node`.
    Register { tls: Tls, node: &'static str },
}

/// One row of the refusal table: who, what they try, and what the client
/// and the peer's log must say.
struct Refusal {
    who: &'static str,
    attempt: Attempt,
    /// In the error the client sees (empty: refused in the handshake,
    /// whatever the client library makes of that).
    client_sees: &'static str,
    /// Every one of these in one line of the peer's log.
    peer_logs: &'static [&'static str],
}

/// Every way into a peer without the right certificate, against a real
/// mTLS cluster: each is refused, the peer logs why, and the cluster does
/// not notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mtls_refusals_table() {
    let cluster = Cluster::start_tls("");
    cluster.wait_leader().await;
    let view = cluster.cluster_view(1).await.unwrap();
    assert!(!view.insecure, "{view:?}");
    let addr = cluster.grpc(1);
    let issuer = Issuer::of(&cluster);

    // Controls: a valid peer certificate is served, and so is the one
    // revoked below, before its revocation.
    let good =
        issuer.signed_by_the_cluster_ca(IssueRequest::new(Identity::Peer(7), vec![]), "peer-7");
    raft_status(&addr, &good)
        .await
        .expect("a valid peer certificate");
    let doomed =
        issuer.signed_by_the_cluster_ca(IssueRequest::new(Identity::Peer(9), vec![]), "peer-9");
    raft_status(&addr, &doomed)
        .await
        .expect("peer-9 before its revocation");
    issuer.revoke("peer-9");

    for row in refusals(&issuer, doomed) {
        refused_and_logged(&cluster, &addr, &issuer.trust, row).await;
    }

    // None of it disturbed the cluster, and the good certificate still works.
    cluster.wait_leader().await;
    let (status, body) = cluster.put_model(2, "after-refusals").await.unwrap();
    assert_eq!(status, 200, "{body}");
    raft_status(&addr, &good)
        .await
        .expect("a valid peer certificate");
}

/// Client certificates for the refusal table: from the cluster's CA, or
/// from another CA that the cluster does not trust.
struct Issuer {
    ca_dir: std::path::PathBuf,
    /// The cluster's CA bundle, which every client trusts.
    trust: std::path::PathBuf,
    scratch: tempfile::TempDir,
    other_ca: tempfile::TempDir,
}

impl Issuer {
    fn of(cluster: &Cluster) -> Issuer {
        let ca_dir = cluster.tls_dir();
        let trust = certs::ca_files(&ca_dir).0;
        let other_ca = tempfile::tempdir().unwrap();
        certs::init_ca(other_ca.path()).unwrap();
        Issuer {
            ca_dir,
            trust,
            scratch: tempfile::tempdir().unwrap(),
            other_ca,
        }
    }

    fn signed_by_the_cluster_ca(&self, request: IssueRequest, stem: &str) -> Tls {
        client_material(
            &self.ca_dir,
            self.scratch.path(),
            &self.trust,
            request,
            stem,
        )
    }

    fn signed_by_another_ca(&self, request: IssueRequest, stem: &str) -> Tls {
        client_material(
            self.other_ca.path(),
            self.scratch.path(),
            &self.trust,
            request,
            stem,
        )
    }

    /// Revokes the certificate issued as `stem`, into the CRL the peers
    /// read.
    fn revoke(&self, stem: &str) {
        let (crl, _) = certs::revoke(
            &self.ca_dir,
            &self.scratch.path().join(format!("{stem}.pem")),
        )
        .unwrap();
        assert_eq!(crl, self.ca_dir.join(certs::CRL), "the peers' tls.crl");
    }
}

/// The table itself; `revoked` is a certificate the peers served before
/// its revocation.
fn refusals(issuer: &Issuer, revoked: Tls) -> Vec<Refusal> {
    let day = Duration::from_secs(24 * 3600);
    let mut expired = IssueRequest::new(Identity::Peer(3), vec![]);
    expired.not_before = SystemTime::now() - 10 * day;
    expired.not_after = SystemTime::now() - day;
    vec![
        Refusal {
            who: "no client certificate",
            attempt: Attempt::NoCertificate,
            client_sees: "",
            peer_logs: &["mTLS handshake failed", "no certificates"],
        },
        Refusal {
            // Both dev CAs have the same name, so the verifier finds the
            // issuer by name and the signature fails.
            who: "a certificate from another CA",
            attempt: Attempt::Raft(issuer.signed_by_another_ca(
                IssueRequest::new(Identity::Peer(2), vec![]),
                "foreign-peer-2",
            )),
            client_sees: "",
            peer_logs: &["mTLS handshake failed", "invalid peer certificate"],
        },
        Refusal {
            who: "an expired certificate",
            attempt: Attempt::Raft(issuer.signed_by_the_cluster_ca(expired, "expired-peer-3")),
            client_sees: "",
            peer_logs: &["mTLS handshake failed", "expired"],
        },
        Refusal {
            who: "a node certificate on the Raft service",
            attempt: Attempt::Raft(issuer.signed_by_the_cluster_ca(
                IssueRequest::new(Identity::Node("gpu-1".into()), vec![]),
                "node-gpu-1",
            )),
            client_sees: "PermissionDenied",
            peer_logs: &["refused a Raft RPC", "node gpu-1"],
        },
        Refusal {
            who: "node A's certificate registering as node B",
            attempt: Attempt::Register {
                tls: issuer.signed_by_the_cluster_ca(
                    IssueRequest::new(Identity::Node("node-a".into()), vec![]),
                    "node-a",
                ),
                node: "node-b",
            },
            client_sees: "PermissionDenied",
            peer_logs: &["refused a node registration", "node-b"],
        },
        Refusal {
            who: "a revoked certificate (after the peer reloaded its CRL)",
            attempt: Attempt::RaftOnceRevoked(revoked),
            client_sees: "",
            peer_logs: &["mTLS handshake failed", "Revoked"],
        },
    ]
}

/// Makes the row's attempt on peer 1 at `addr`: it must be refused as the
/// row says, and the peer must log it.
async fn refused_and_logged(cluster: &Cluster, addr: &str, trust: &Path, row: Refusal) {
    let refused = match &row.attempt {
        Attempt::NoCertificate => handshake_without_certificate(addr, trust).await,
        Attempt::Raft(tls) => raft_status(addr, tls).await.err().unwrap_or_default(),
        Attempt::RaftOnceRevoked(tls) => {
            cluster
                .eventually("the peer refuses the revoked certificate", || async {
                    match raft_status(addr, tls).await {
                        Err(why) => Ok(why),
                        Ok(()) => Err("still accepted".to_owned()),
                    }
                })
                .await
        }
        Attempt::Register { tls, node } => register_as(addr, tls, node).await,
    };
    assert!(!refused.is_empty(), "{}: accepted", row.who);
    assert!(
        refused.contains(row.client_sees),
        "{}: the client saw {refused}",
        row.who
    );
    cluster.wait_log(1, row.peer_logs).await;
}

/// A TLS handshake that offers no client certificate; why it failed, or
/// empty if the peer talked.
async fn handshake_without_certificate(addr: &str, trust: &Path) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in llmgw_tls::read_certificates("CA", trust).unwrap() {
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut no_cert = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    no_cert.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    // With TLS 1.3 the client finishes first; the refusal arrives on read.
    match tokio_rustls::TlsConnector::from(Arc::new(no_cert))
        .connect(name, tcp)
        .await
    {
        Err(e) => format!("handshake: {e}"),
        Ok(mut stream) => {
            let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
            let mut buf = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
                .await
                .expect("the peer answers or closes");
            match read {
                Err(e) => format!("read: {e}"),
                Ok(0) => "closed".to_owned(),
                Ok(_) => String::new(),
            }
        }
    }
}

/// `AgentService.Connect` with a `Register` for `node`; why it failed, or
/// empty if it was taken.
async fn register_as(addr: &str, tls: &Tls, node: &str) -> String {
    use llmgw_proto::agent::agent_message::Body as Up;
    use llmgw_proto::agent::agent_service_client::AgentServiceClient;
    use llmgw_proto::agent::{AgentMessage, Register};
    let endpoint = llmgw_tls::endpoint(addr)
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let channel = match llmgw_tls::connect(&endpoint, Some(tls)).await {
        Ok(channel) => channel,
        Err(e) => return format!("connect: {e:?}"),
    };
    let register = AgentMessage {
        body: Some(Up::Register(Register {
            node_id: node.into(),
            mgmt_addr: "127.0.0.1".into(),
            ..Register::default()
        })),
    };
    match AgentServiceClient::new(channel)
        .connect(tokio_stream::iter([register]))
        .await
    {
        Ok(_) => String::new(),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// The serial number of the certificate `addr` serves now.
async fn served_serial(addr: &str, tls: &Tls) -> Result<Vec<u8>, String> {
    let chain = llmgw_tls::probe(addr, tls)
        .await
        .map_err(|e| e.to_string())?;
    let first = chain.first().ok_or("no certificate served")?;
    let parsed = webpki::EndEntityCert::try_from(first).map_err(|e| e.to_string())?;
    Ok(parsed.serial().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_peer_certificate_is_served_without_a_restart() {
    let cluster = Cluster::start_tls("");
    cluster.wait_leader().await;
    let addr = cluster.grpc(1);
    let ca_dir = cluster.tls_dir();
    let trust = certs::ca_files(&ca_dir).0;
    let scratch = tempfile::tempdir().unwrap();
    let client = client_material(
        &ca_dir,
        scratch.path(),
        &trust,
        IssueRequest::new(Identity::Peer(8), vec![]),
        "peer-8",
    );
    let before = served_serial(&addr, &client).await.unwrap();
    let key_path = ca_dir.join("peer-1.key");

    // A broken key is refused, and the old material stays in use.
    let good_key = std::fs::read(&key_path).unwrap();
    std::fs::write(&key_path, b"-----BEGIN PRIVATE KEY-----\nnot a key\n").unwrap();
    cluster
        .wait_log(1, &["do not load", "keeping the previous certificate"])
        .await;
    assert_eq!(served_serial(&addr, &client).await.unwrap(), before);
    std::fs::write(&key_path, good_key).unwrap();

    // A new certificate and key for peer 1, written over the old files.
    let request = IssueRequest::new(
        Identity::Peer(1),
        vec!["127.0.0.1".into(), "localhost".into()],
    );
    certs::issue(&ca_dir, &ca_dir, &request).unwrap();
    let started = Instant::now();
    let after = cluster
        .eventually("peer 1 serves its new certificate", || async {
            let serial = served_serial(&addr, &client).await?;
            if serial == before {
                Err("still the old serial".to_owned())
            } else {
                Ok(serial)
            }
        })
        .await;
    assert_ne!(after, before);
    eprintln!("rotation took effect after {:?}", started.elapsed());
    cluster.wait_log(1, &["mTLS material reloaded"]).await;

    // Peer 1 keeps working with its new certificate: a write through it
    // reaches everyone.
    let (status, body) = cluster.put_model(1, "after-rotation").await.unwrap();
    assert_eq!(status, 200, "{body}");
    cluster.wait_converged().await;
}

// The guard only keeps other clusters of this binary from starting; it is
// held for the whole test on purpose, as `Cluster` holds its own.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llmgw_dev_comes_up_with_mtls_links_and_an_https_admin_api_with_tokens() {
    let _serial = one_cluster_at_a_time();
    let work = tempfile::tempdir().unwrap();
    // No demo catalog: agents connect, but no engine is started.
    let llmgw_dev = Dev::start(work.path(), &["--no-demo"]);
    let up = three_nodes_connected_to_the_leader(&llmgw_dev).await;
    assert!(!up.cluster.insecure, "{:?}", up.cluster);

    the_admin_api_refuses_what_lacks_a_token_https_or_trust(&up).await;
    ctl_works_as_printed_and_says_when_the_ca_is_missing(&llmgw_dev, &up).await;
    let servers: Vec<&llmgw_dev::DevProcess> = up
        .dev
        .processes
        .iter()
        .filter(|p| p.role == "server")
        .collect();
    assert_eq!(servers.len(), 3);
    every_written_config_uses_tls(work.path(), &servers);
    for server in servers {
        plaintext_grpc_is_refused_and_logged(work.path(), server).await;
    }
}

/// `llmgw dev` up, as a client of its admin API sees it.
struct DevUp {
    dev: llmgw_dev::DevFile,
    cluster: ClusterView,
    /// Trusts the dev CA.
    http: reqwest::Client,
    read_token: String,
}

impl DevUp {
    fn api(&self) -> &str {
        &self.dev.api[0]
    }
}

/// Polls dev.json and the admin API until the leader has all three
/// simulated nodes ready and connected, over mTLS.
async fn three_nodes_connected_to_the_leader(llmgw_dev: &Dev) -> DevUp {
    let started = Instant::now();
    let mut http = None;
    let mut read_token = String::new();
    loop {
        assert!(
            started.elapsed() < DEADLINE,
            "llmgw dev did not come up: {}",
            llmgw_dev.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(dev) = llmgw_dev.dev_file() else {
            continue;
        };
        // The admin API is HTTPS with the dev CA, and needs a token.
        let http = http.get_or_insert_with(|| {
            let ca = dev.ca.as_deref().expect("dev.json names the CA");
            let token_file = dev
                .read_token_file
                .as_deref()
                .expect("dev.json names the read token");
            read_token = std::fs::read_to_string(token_file)
                .unwrap()
                .trim()
                .to_owned();
            admin_client(Some(Path::new(ca)))
        });
        let api = dev.api[0].clone();
        assert!(api.starts_with("https://"), "{api}");
        let url = format!("{api}{}", paths::CLUSTER);
        let Ok(view) = get_json::<ClusterView>(http, &url, Some(&read_token)).await else {
            continue;
        };
        let Some(leader) = view.leader_id else {
            continue;
        };
        if connected_nodes(http, &dev, leader, &read_token).await == 3 {
            return DevUp {
                dev,
                cluster: view,
                http: http.clone(),
                read_token,
            };
        }
    }
}

/// Simulated nodes ready and connected to `leader`; 0 while it cannot say.
async fn connected_nodes(
    http: &reqwest::Client,
    dev: &llmgw_dev::DevFile,
    leader: u64,
    read_token: &str,
) -> usize {
    let leader_api = dev
        .processes
        .iter()
        .find(|p| p.role == "server" && p.id.as_u64() == Some(leader))
        .and_then(|p| p.api.clone())
        .unwrap();
    let url = format!("{leader_api}{}", paths::NODES);
    let nodes: Vec<NodeView> = get_json(http, &url, Some(read_token))
        .await
        .unwrap_or_default();
    nodes
        .iter()
        .filter(|n| {
            n.record.status == NodeStatus::Ready
                && n.stream.as_ref().is_some_and(|stream| stream.connected)
        })
        .count()
}

async fn the_admin_api_refuses_what_lacks_a_token_https_or_trust(up: &DevUp) {
    let api = up.api();
    // Without a token the admin API says what to send.
    let response = up
        .http
        .get(format!("{api}/api/v1/nodes"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    // Plain HTTP to the HTTPS port gets a 400 that says to use https://.
    let plain = api.replace("https://", "http://");
    let response = reqwest::get(format!("{plain}/api/v1/cluster"))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(
        text.contains("HTTPS") && text.contains("https://"),
        "{text}"
    );
    // A client that does not trust the dev CA is refused by its own TLS.
    let untrusting = reqwest::Client::new();
    let error = untrusting
        .get(format!("{api}/api/v1/cluster"))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
}

/// `llmgw dev` printed how to point `llmgw ctl` at it, and that works.
async fn ctl_works_as_printed_and_says_when_the_ca_is_missing(llmgw_dev: &Dev, up: &DevUp) {
    for line in [
        "export LLMGW_API=https://",
        "export LLMGW_CA=",
        "export LLMGW_TOKEN=$(cat ",
    ] {
        llmgw_dev.wait_printed(line, DEADLINE).await;
    }
    let ca = up.dev.ca.clone().unwrap();
    let ctl = |with_ca: bool, token: &str| {
        let mut command = std::process::Command::new(llmgw_bin());
        command
            .args(["ctl", "--api", up.api(), "nodes"])
            .env("LLMGW_TOKEN", token);
        command.env_remove("LLMGW_CA").env_remove("LLMGW_API");
        if with_ca {
            command.args(["--ca", &ca]);
        }
        command.output().unwrap()
    };
    let out = ctl(true, &up.read_token);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("h100-1"), "{stdout}");
    let out = ctl(false, &up.read_token);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("--ca"),
        "ctl without the CA says what to do: {stderr}"
    );
}

fn every_written_config_uses_tls(work: &Path, servers: &[&llmgw_dev::DevProcess]) {
    for agent in ["h100-1", "h100-2", "l40s-1"] {
        let yaml = std::fs::read_to_string(work.join(format!("agent-{agent}.yaml"))).unwrap();
        assert!(
            yaml.contains("tls:") && !yaml.contains("insecure"),
            "agent-{agent}.yaml: {yaml}"
        );
    }
    for server in servers {
        let id = server.id.as_u64().unwrap();
        let yaml = std::fs::read_to_string(work.join(format!("server-{id}.yaml"))).unwrap();
        assert!(
            yaml.contains("tls:") && !yaml.contains("insecure"),
            "server-{id}.yaml: {yaml}"
        );
    }
}

/// Plaintext HTTP/2 to the server's gRPC port is refused, and logged.
async fn plaintext_grpc_is_refused_and_logged(work: &Path, server: &llmgw_dev::DevProcess) {
    let id = server.id.as_u64().unwrap();
    let grpc = server.grpc.as_deref().unwrap();
    let mut tcp = tokio::net::TcpStream::connect(grpc).await.unwrap();
    let _ = tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
    let log_path = work.join(format!("server-{id}.log"));
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("mTLS material loaded") && log.contains("mTLS handshake failed") {
            break;
        }
        assert!(Instant::now() < deadline, "server-{id}.log: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
