//! Admin API tokens, with real `llmgw server` processes and `llmgw ctl`:
//! no token is 401, a read token on a write is 403, a write token works,
//! and no secret shows up in a log or an answer.

use std::process::Command;

use llmgw_api::{ClusterView, ErrorBody};
use llmgw_test_kit::{Cluster, decode, llmgw_bin};
use reqwest::Method;
use serde_json::Value;

const READ_TOKEN: &str = "read-token-5f1c2a9e7b3d4c60";
const WRITE_TOKEN: &str = "write-token-8a7e6d5c4b3a2910";

const ADMIN_YAML: &str = "admin:\n  tokens:\n    \
    - { name: ops-read, role: read, token: \"read-token-5f1c2a9e7b3d4c60\" }\n    \
    - { name: ops-write, role: write, token_file: write.token }\n";

async fn call(
    cluster: &Cluster,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = cluster
        .http
        .request(method, format!("{}{path}", cluster.admin(1)));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the admin API answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn ctl(cluster: &Cluster, token: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut command = Command::new(llmgw_bin());
    command
        .args(["ctl", "--api", &cluster.admin(1)])
        .args(args)
        .env_remove("LLMGW_TOKEN");
    if let Some(token) = token {
        command.env("LLMGW_TOKEN", token);
    }
    let out = command.output().expect("run llmgw ctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_a_write_token_and_reads_a_token() {
    // Tokens from server.yaml and from a file next to it.
    let mut cluster = Cluster::start_with(false, ADMIN_YAML, |dir| {
        std::fs::write(dir.join("write.token"), format!("{WRITE_TOKEN}\n")).unwrap();
    });
    let model = serde_json::json!({"name": "m1", "endpoints": ["http://10.1.2.3:8000"]});
    cluster.token = Some(READ_TOKEN.to_owned());
    cluster.wait_leader().await;

    // Probes stay open.
    let (status, _) = call(&cluster, Method::GET, "/healthz", None, None).await;
    assert_eq!(status, 200);

    // Reads: no token is 401, either token works.
    let (status, body) = call(&cluster, Method::GET, "/api/v1/cluster", None, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        decode::<ErrorBody>(&body).error.kind,
        "unauthorized",
        "{body}"
    );
    let (status, body) = call(
        &cluster,
        Method::GET,
        "/api/v1/cluster",
        Some("wrong-token-000000000000"),
        None,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = call(
        &cluster,
        Method::GET,
        "/api/v1/cluster",
        Some(READ_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(decode::<ClusterView>(&body).insecure, "{body}");

    // Writes: no token 401, read token 403, write token 200.
    let put = "/api/v1/models/m1";
    let (status, body) = call(&cluster, Method::PUT, put, None, Some(model.clone())).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = call(
        &cluster,
        Method::PUT,
        put,
        Some(READ_TOKEN),
        Some(model.clone()),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let refusal = decode::<ErrorBody>(&body).error;
    assert_eq!(refusal.kind, "forbidden", "{body}");
    let message = refusal.message;
    assert!(
        message.contains("ops-read") && message.contains("write token"),
        "{message}"
    );
    let (status, body) = call(
        &cluster,
        Method::PUT,
        put,
        Some(WRITE_TOKEN),
        Some(model.clone()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&cluster, Method::DELETE, put, Some(READ_TOKEN), None).await;
    assert_eq!(status, 403, "{body}");

    // llmgw ctl sends LLMGW_TOKEN.
    let (ok, out) = ctl(&cluster, None, &["cluster"]);
    assert!(!ok, "{out}");
    assert!(out.contains("401") && out.contains("LLMGW_TOKEN"), "{out}");
    let (ok, out) = ctl(&cluster, Some(READ_TOKEN), &["cluster"]);
    assert!(ok, "{out}");
    assert!(out.contains("transport: INSECURE"), "{out}");
    let (ok, out) = ctl(&cluster, Some(READ_TOKEN), &["models", "delete", "m1"]);
    assert!(!ok && out.contains("403"), "{out}");
    let (ok, out) = ctl(&cluster, Some(WRITE_TOKEN), &["models", "delete", "m1"]);
    assert!(ok, "{out}");

    // The refusals were logged, without a secret anywhere.
    cluster
        .wait_log(1, &["admin request refused", "ops-read"])
        .await;
    for id in 1..=3 {
        let log = cluster.log_text(id);
        for secret in [READ_TOKEN, WRITE_TOKEN, "wrong-token-000000000000"] {
            assert!(!log.contains(secret), "peer {id} logged a token");
        }
    }
}

#[test]
fn a_server_yaml_with_bad_tokens_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    let peers = "id: 1\ninsecure: true\npeers:\n  - {id: 1, grpc: \"127.0.0.1:1\", admin: \"http://127.0.0.1:2\"}\n";
    let run = |yaml: &str| {
        std::fs::write(&config, format!("{peers}{yaml}")).unwrap();
        refused_to_start(&config)
    };
    let err =
        run("admin:\n  tokens:\n    - { name: a, role: admin, token: \"0123456789abcdefXYZ\" }\n");
    assert!(
        err.contains("admin.tokens[0].role") && err.contains("`read` or `write`"),
        "{err}"
    );
    assert!(
        !err.contains("0123456789abcdefXYZ"),
        "the token was echoed: {err}"
    );
    let err = run("admin:\n  tokens:\n    - { name: a, role: read, token: \"short\" }\n");
    assert!(err.contains("shorter than 16"), "{err}");
    let err = run("admin:\n  tokens:\n    - { name: a, role: read, token_file: missing.token }\n");
    assert!(
        err.contains("missing.token") && err.contains("\"a\""),
        "{err}"
    );
    let err = run("admin:\n  tokens:\n    - { name: a, role: read }\n");
    assert!(err.contains("token_file"), "{err}");
}

#[test]
fn an_open_admin_api_off_loopback_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let files = llmgw_dev::certs::peer_tls(dir.path(), 1).unwrap();
    let config = dir.path().join("server.yaml");
    let write = |transport: &str, admin: &str| {
        let yaml = format!(
            "id: 1\ndata_dir: {}\n{transport}admin_listen: \"{admin}\"\nrouter_listen: null\n\
             peers:\n  - {{id: 1, grpc: \"127.0.0.1:1\", admin: \"https://127.0.0.1:2\"}}\n",
            dir.path().join("data").display()
        );
        std::fs::write(&config, yaml).unwrap();
    };
    let refused = || refused_to_start(&config);
    // mTLS on gRPC, no admin tokens, the admin API on every address.
    write(&llmgw_dev::certs::tls_yaml(&files), "0.0.0.0:0");
    let err = refused();
    assert!(
        err.contains("without `admin.tokens`") && err.contains("0.0.0.0:0"),
        "{err}"
    );
    // `config check` says the same before anyone starts it.
    let out = Command::new(llmgw_bin())
        .args(["config", "check"])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("refuses to start"), "{text}");
}

/// Starts `llmgw server --config CONFIG`, which must refuse; its stderr.
fn refused_to_start(config: &std::path::Path) -> String {
    let out = Command::new(llmgw_bin())
        .args(["server", "--config"])
        .arg(config)
        .output()
        .expect("run llmgw server");
    assert!(!out.status.success(), "the server started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
