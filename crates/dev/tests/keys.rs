//! API keys as an operator runs them on `llmgw dev`, seen from two
//! standalone routers that follow the control plane: open until the first
//! key exists, then a key is required everywhere; a key's models and
//! per-minute limit hold (429 with OpenAI's rate-limit headers, no refusal
//! below the limit); a rotated secret and a revoked key are refused by
//! both routers, the revocation while both carry load. A router charges
//! the key the tokens its engine reported, and reports them to the
//! control plane, which `llmgw ctl usage` reads; a day's token budget
//! holds on every router against that fleet-wide spend.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llmgw_api::ClusterView;
use llmgw_api::keys::{IssuedKey, KeyView};
use llmgw_api::paths;
use llmgw_api::usage::UsageDay;
use llmgw_test_kit::dev::{Dev, DevAdmin, peer_pid};
use llmgw_test_kit::process::signal_pid;
use llmgw_test_kit::{DEADLINE, eventually, free_port, llmgw_bin};
use reqwest::Method;
use serde_json::{Value, json};

const MODEL: &str = "qwen";

/// A chat through `router` with `key` (none: no Authorization header):
/// status, headers and body.
async fn chat_as(
    http: &reqwest::Client,
    router: &str,
    model: &str,
    key: Option<&str>,
) -> Result<(u16, reqwest::header::HeaderMap, Value), String> {
    let mut request = http
        .post(format!("{router}/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 4
        }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| format!("{router}: {e}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response
        .text()
        .await
        .map_err(|e| format!("{router}: {e}"))?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, headers, body))
}

/// The error code of an answer, or `ok` for a 200.
async fn outcome(
    http: &reqwest::Client,
    router: &str,
    key: Option<&str>,
) -> Result<String, String> {
    let (status, _, body) = chat_as(http, router, MODEL, key).await?;
    Ok(match status {
        200 => "ok".to_owned(),
        _ => format!("{status} {}", body["error"]["code"].as_str().unwrap_or("?")),
    })
}

/// Replaces key `ci`'s settings: team `search`, the model, these limits.
async fn set_ci_limits(admin: &DevAdmin, limits: Value) {
    let (status, body) = admin
        .send(
            Method::PUT,
            &paths::key("ci"),
            Some(json!({"team": "search", "models": [MODEL], "limits": limits}).to_string()),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "limits {limits}: {body}");
}

/// Waits until every router answers `want`.
async fn every_router_answers(
    http: &reqwest::Client,
    routers: &[String],
    key: Option<&str>,
    want: &str,
) {
    for router in routers {
        eventually(&format!("{router} answers {want}"), DEADLINE, || async {
            let got = outcome(http, router, key).await?;
            if got == want { Ok(()) } else { Err(got) }
        })
        .await;
    }
}

/// Another standalone router on the same control plane, from the router
/// config `llmgw dev` wrote, on a port of its own, with `extra` config.
struct SecondRouter {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl SecondRouter {
    fn start(work: &std::path::Path) -> SecondRouter {
        Self::named(work, "router-b", "")
    }

    fn named(work: &std::path::Path, name: &str, extra: &str) -> SecondRouter {
        let first =
            std::fs::read_to_string(work.join("dev/router.yaml")).expect("dev's router.yaml");
        let port = free_port();
        let listen = first
            .lines()
            .find(|l| l.starts_with("listen:"))
            .expect("router.yaml has listen:");
        let config = work.join(format!("{name}.yaml"));
        let text = first.replace(listen, &format!("listen: 127.0.0.1:{port}")) + extra;
        std::fs::write(&config, text).unwrap();
        let log_path = work.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(llmgw_bin())
            .args(["router", "--config"])
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("llmgw router starts");
        SecondRouter {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log: log_path,
        }
    }
}

impl SecondRouter {
    /// This router's share in a key's `shares`, found by its process id
    /// (a router reports as `router@HOST/PID-STARTED`).
    fn share_in(&self, shares: &std::collections::BTreeMap<String, f64>) -> Option<f64> {
        let pid = format!("/{}-", self.child.id());
        shares
            .iter()
            .find_map(|(name, share)| name.contains(&pid).then_some(*share))
    }
}

impl Drop for SecondRouter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_limited_rotated_and_revoked_on_every_router() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("dev"), &[]);
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(240))
        .await;
    let dev_file = dev.dev_file().expect("dev.json once dev is ready");
    let admin = DevAdmin::new(&dev_file);
    let second = SecondRouter::start(dir.path());
    let routers = vec![
        dev_file.router.clone().expect("dev.json names the router"),
        second.url.clone(),
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // No key exists: the routers ask for none.
    every_router_answers(&http, &routers, None, "ok").await;

    let (status, body) = admin
        .send(
            Method::POST,
            paths::KEYS,
            Some(
                json!({"name": "ci", "team": "search", "models": [MODEL],
                       "limits": {"requests_per_minute": 5}})
                .to_string(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "create: {body}");
    let issued: IssuedKey = serde_json::from_value(body).unwrap();
    assert!(issued.secret.starts_with("sk-llmgw-"), "{}", issued.secret);
    let listed: Vec<Value> = admin.get(paths::KEYS).await.unwrap();
    assert!(
        !listed
            .iter()
            .any(|k| k.to_string().contains(&issued.secret)),
        "the control plane never answers a secret: {listed:?}"
    );
    let (status, body) = admin
        .send(
            Method::POST,
            paths::KEYS,
            Some(json!({"name": "ci"}).to_string()),
        )
        .await
        .unwrap();
    assert_eq!(status, 409, "a live name is not created twice: {body}");

    // From the first key on, every router wants one.
    every_router_answers(&http, &routers, None, "401 missing_api_key").await;
    every_router_answers(
        &http,
        &routers,
        Some("sk-llmgw-guessed"),
        "401 invalid_api_key",
    )
    .await;
    let (status, _, body) = chat_as(&http, &routers[0], "llama-70b", Some(&issued.secret))
        .await
        .unwrap();
    assert_eq!(status, 403, "the key may use {MODEL} only: {body}");

    // The per-minute limit on router A: every request below it is
    // admitted, the one over it refused, with OpenAI's headers. Router B
    // keeps a bucket of its own.
    let started = Instant::now();
    // The first is a stream whose client did not ask for usage: the
    // router asks the engine for it, charges it, and keeps the extra
    // event from the client.
    let streamed = http
        .post(format!("{}/v1/chat/completions", routers[0]))
        .bearer_auth(&issued.secret)
        .json(&json!({"model": MODEL, "stream": true, "max_tokens": 4,
                      "messages": [{"role": "user", "content": "Say hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let events = streamed.text().await.unwrap();
    assert!(events.trim_end().ends_with("data: [DONE]"), "{events}");
    assert!(
        !events.contains("\"usage\":{"),
        "usage the client did not ask for: {events}"
    );
    let mut admitted = 1u32;
    let refusal = loop {
        let (status, headers, body) = chat_as(&http, &routers[0], MODEL, Some(&issued.secret))
            .await
            .unwrap();
        match status {
            200 => {
                admitted += 1;
                assert_eq!(headers["x-ratelimit-limit-requests"], "5");
            }
            429 => break (headers, body),
            other => panic!("HTTP {other}: {body}"),
        }
        assert!(admitted <= 100, "the limit of 5 a minute never refused");
    };
    // The bucket refills one request every 12 s.
    let refilled = (started.elapsed().as_secs() / 12) as u32 + 1;
    assert!(
        (5..=5 + refilled).contains(&admitted),
        "{admitted} admitted under a limit of 5 a minute"
    );
    let (headers, body) = refusal;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("`ci`"),
        "{body}"
    );
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=12).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        outcome(&http, &routers[1], Some(&issued.secret))
            .await
            .unwrap(),
        "ok"
    );

    // Router A charged the key for what the engine reported: the admitted
    // chats, their prompt and completion tokens, nothing estimated (the
    // stream's usage too).
    // Each is recorded once its answer's body is dropped, just after the
    // client read its end.
    let account = "key=\"ci\",team=\"search\",model=\"qwen-0.5b\"";
    let completed = format!("llmgw_router_key_requests_total{{{account},outcome=\"completed\"}}");
    let page = eventually("the admitted chats charged", DEADLINE, || async {
        let page = http
            .get(format!("{}/metrics", routers[0]))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        match llmgw_test_kit::metric(&page, &completed) {
            Some(n) if n == f64::from(admitted) => Ok(page),
            other => Err(format!("{completed} = {other:?}, {admitted} admitted")),
        }
    })
    .await;
    let series = |name: &str| {
        llmgw_test_kit::metric(&page, name).unwrap_or_else(|| panic!("no {name} in\n{page}"))
    };
    assert!(
        series(&format!(
            "llmgw_router_key_tokens_total{{{account},kind=\"prompt\"}}"
        )) > 0.0
    );
    assert!(
        series(&format!(
            "llmgw_router_key_tokens_total{{{account},kind=\"completion\"}}"
        )) > 0.0
    );
    assert_eq!(
        series(&format!(
            "llmgw_router_key_estimated_requests_total{{{account}}}"
        )),
        0.0
    );

    // Both routers reported it to the control plane, where it is kept per
    // key, model and minute: router A's admitted chats and router B's one.
    eventually("the key's usage in the control plane", DEADLINE, || async {
        let days: Vec<UsageDay> = admin.get(paths::USAGE).await?;
        let used: Vec<&UsageDay> = days.iter().filter(|d| d.key == "ci").collect();
        let completed: u64 = used.iter().map(|d| d.totals.completed).sum();
        let prompt: u64 = used.iter().map(|d| d.totals.prompt_tokens).sum();
        match used.first() {
            Some(day) if completed == u64::from(admitted) + 1 && prompt > 0 => {
                assert_eq!(
                    (day.team.as_str(), day.model.as_str()),
                    ("search", "qwen-0.5b")
                );
                Ok(())
            }
            _ => Err(format!("{used:?}")),
        }
    })
    .await;

    // A budget in money: once the model has a price, what the key's
    // tokens cost is summed by the control plane and the budget holds on
    // every router. (Usage before the price cost nothing.)
    const SERVED: &str = "qwen-0.5b"; // the entry `qwen` is an alias of
    let mut entry: Value = admin.get(&paths::model(SERVED)).await.unwrap();
    entry["price"] = json!({"input_per_million": 1000.0, "output_per_million": 1000.0});
    let (status, body) = admin
        .send(Method::PUT, &paths::model(SERVED), Some(entry.to_string()))
        .await
        .unwrap();
    assert_eq!(status, 200, "a price: {body}");
    set_ci_limits(&admin, json!({"usd_per_day": 0.01})).await;
    // Each chat's few dozen tokens at $1,000 a million cost cents: once
    // one is counted, the key is over a cent.
    eventually("a priced chat is counted", DEADLINE, || async {
        let got = outcome(&http, &routers[0], Some(&issued.secret)).await?;
        let keys: Vec<KeyView> = admin.get(paths::KEYS).await?;
        let spent = keys
            .iter()
            .find(|k| k.key.name == "ci")
            .map(|k| k.spent.day_cost)
            .unwrap_or_default();
        if spent >= llmgw_api::keys::Usd::from_dollars(0.01).unwrap() {
            Ok(())
        } else {
            Err(format!("last answer {got}; the key spent {spent} today"))
        }
    })
    .await;
    every_router_answers(
        &http,
        &routers,
        Some(&issued.secret),
        "429 insufficient_quota",
    )
    .await;

    // A day's budget holds on every router, against what the key spent
    // over all of them: router B served one request and A the rest.
    set_ci_limits(&admin, json!({"tokens_per_day": 1})).await;
    every_router_answers(
        &http,
        &routers,
        Some(&issued.secret),
        "429 insufficient_quota",
    )
    .await;

    // A rotated secret: the old one is refused everywhere, the new one works.
    let (status, body) = admin
        .send(Method::POST, &paths::rotate_key("ci"), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "rotate: {body}");
    let rotated: IssuedKey = serde_json::from_value(body).unwrap();
    set_ci_limits(&admin, json!({})).await;
    every_router_answers(&http, &routers, Some(&issued.secret), "401 invalid_api_key").await;
    every_router_answers(&http, &routers, Some(&rotated.secret), "ok").await;

    // Revoked under load: two clients per router send until refused.
    let secret = Arc::new(rotated.secret.clone());
    let mut clients = Vec::new();
    for router in &routers {
        for _ in 0..2 {
            let (http, router, secret) = (http.clone(), router.clone(), Arc::clone(&secret));
            clients.push(tokio::spawn(async move {
                let mut served = 0u32;
                let deadline = Instant::now() + DEADLINE;
                while Instant::now() < deadline {
                    match outcome(&http, &router, Some(&secret)).await {
                        Ok(got) if got == "ok" => served += 1,
                        Ok(got) if got == "401 revoked_api_key" => {
                            return Ok((served, Instant::now()));
                        }
                        Ok(got) => {
                            return Err(format!("{router}: {got} before the revocation held"));
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(format!("{router} still admits the key after {DEADLINE:?}"))
            }));
        }
    }
    // Let every client get some answers first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, body) = admin
        .send(Method::DELETE, &paths::key("ci"), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "revoke: {body}");
    let revoked_at = Instant::now();
    for client in clients {
        let (served, refused_at) = client.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert!(served > 0, "a client had answers before the revocation");
        println!(
            "revocation held after {:?} (served {served} before)",
            refused_at.saturating_duration_since(revoked_at)
        );
    }

    // `llmgw ctl usage` sums it by team, as CSV.
    let csv = ctl(&dev_file, &["usage", "--by", "team", "--csv"]);
    assert!(csv.starts_with("team,requests,"), "{csv}");
    assert!(csv.lines().any(|l| l.starts_with("search,")), "{csv}");

    // `llmgw ctl keys` names it revoked.
    let listing = ctl(&dev_file, &["keys"]);
    let row = listing
        .lines()
        .find(|l| l.starts_with("ci "))
        .unwrap_or_else(|| panic!("no row for ci in\n{listing}"));
    assert!(row.contains("search") && row.contains("revoked"), "{row}");
}

/// What `llmgw ctl ARGS` prints, with the dev cluster's CA and read token.
fn ctl(dev_file: &llmgw_dev::DevFile, args: &[&str]) -> String {
    let token = std::fs::read_to_string(dev_file.read_token_file.as_deref().unwrap()).unwrap();
    let run = Command::new(llmgw_bin())
        .arg("ctl")
        .args(args)
        .args(["--api", &dev_file.api.join(",")])
        .env("LLMGW_CA", dev_file.ca.as_deref().unwrap_or(""))
        .env("LLMGW_TOKEN", token.trim())
        .output()
        .expect("llmgw ctl runs");
    let printed = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "llmgw ctl {args:?}: {printed}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    printed
}

/// What every router charged a key, summed over the routers' `/metrics`.
async fn charged_by_routers(http: &reqwest::Client, routers: &[String], key: &str) -> f64 {
    let mut total = 0.0;
    for router in routers {
        let page = http
            .get(format!("{router}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        total += llmgw_test_kit::metric(
            &page,
            &format!(
                "llmgw_router_key_requests_total{{key=\"{key}\",team=\"\",model=\"qwen-0.5b\",outcome=\"completed\"}}"
            ),
        )
        .unwrap_or(0.0);
    }
    total
}

/// `llmgw dev` with two routers of our own reporting every `reporting`
/// (router.yaml `usage_report_interval`), and a key created as `key`
/// (the admin API's `POST /api/v1/keys` body), which both routers want.
struct TwoRouters {
    // Dropped last: the routers go first.
    a: SecondRouter,
    b: SecondRouter,
    dev_file: llmgw_dev::DevFile,
    admin: DevAdmin,
    http: reqwest::Client,
    secret: String,
    _dev: Dev,
    _dir: tempfile::TempDir,
}

impl TwoRouters {
    async fn start(reporting: &str, key: serde_json::Value) -> TwoRouters {
        let dir = tempfile::tempdir().unwrap();
        let dev = Dev::start(&dir.path().join("dev"), &[]);
        dev.wait_printed("Press Ctrl-C", Duration::from_secs(240))
            .await;
        let dev_file = dev.dev_file().expect("dev.json once dev is ready");
        let admin = DevAdmin::new(&dev_file);
        let config = format!("usage_report_interval: {reporting}\n");
        let a = SecondRouter::named(dir.path(), "router-a", &config);
        let b = SecondRouter::named(dir.path(), "router-b", &config);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let (status, body) = admin
            .send(Method::POST, paths::KEYS, Some(key.to_string()))
            .await
            .unwrap();
        assert_eq!(status, 201, "create: {body}");
        let secret = serde_json::from_value::<IssuedKey>(body).unwrap().secret;
        let routers = TwoRouters {
            a,
            b,
            dev_file,
            admin,
            http,
            secret,
            _dev: dev,
            _dir: dir,
        };
        every_router_answers(&routers.http, &routers.urls(), None, "401 missing_api_key").await;
        routers
    }

    fn urls(&self) -> Vec<String> {
        vec![self.a.url.clone(), self.b.url.clone()]
    }
}

/// Routers report every 200 ms while chats with a key run through both
/// and the control plane loses its quorum for 12 s: reports fail and are
/// sent again, and the control plane's usage ends equal to the answers the
/// clients got, each counted once, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_counted_once_through_a_lost_quorum() {
    let two = TwoRouters::start("200ms", json!({"name": "load"})).await;
    let (http, admin, dev_file) = (&two.http, &two.admin, &two.dev_file);
    let (a, b, issued_secret) = (&two.a, &two.b, two.secret.clone());
    let routers = two.urls();
    every_router_answers(http, &routers, Some(&issued_secret), "ok").await;

    // Two clients per router until told to stop; each counts its answers.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for router in &routers {
        for _ in 0..2 {
            let (http, router, secret, stop) = (
                http.clone(),
                router.clone(),
                issued_secret.clone(),
                Arc::clone(&stop),
            );
            clients.push(tokio::spawn(async move {
                let (mut ok, mut other) = (0u64, Vec::new());
                let deadline = Instant::now() + DEADLINE;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline
                {
                    match outcome(&http, &router, Some(&secret)).await {
                        Ok(got) if got == "ok" => ok += 1,
                        Ok(got) => other.push(got),
                        Err(e) => other.push(e),
                    }
                }
                (ok, other)
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The leader and one follower paused: no quorum, so no report can be
    // written for longer than a router waits on all three peers (3 s
    // each). Reports appended but not committed when the pause began may
    // still commit after it: their senders retry them all the same.
    let cluster: ClusterView = admin.get(paths::CLUSTER).await.unwrap();
    let leader = cluster.leader_id.expect("a leader");
    let follower = cluster
        .peers
        .iter()
        .map(|p| p.id)
        .find(|id| *id != leader)
        .expect("a follower");
    let paused = [peer_pid(dev_file, leader), peer_pid(dev_file, follower)];
    for pid in paused {
        assert!(signal_pid(pid, libc::SIGSTOP));
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    for pid in paused {
        assert!(signal_pid(pid, libc::SIGCONT));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // One answer each router gave `every_router_answers` above.
    let mut answered = routers.len() as u64;
    for client in clients {
        let (ok, other) = client.await.unwrap();
        assert!(other.is_empty(), "answers other than 200: {other:?}");
        answered += ok;
    }

    // Each router charged what its clients got; the control plane holds
    // exactly the sum, through the leader's death.
    let answered = answered as f64;
    eventually("every answer charged by the routers", DEADLINE, || async {
        let charged = charged_by_routers(http, &routers, "load").await;
        if charged == answered {
            Ok(())
        } else {
            Err(format!("{charged} of {answered}"))
        }
    })
    .await;
    eventually(
        "every answer counted once in the control plane",
        DEADLINE,
        || async {
            let days: Vec<UsageDay> = admin.get(paths::USAGE).await?;
            let counted: u64 = days
                .iter()
                .filter(|d| d.key == "load")
                .map(|d| d.totals.completed)
                .sum();
            if counted as f64 == answered {
                Ok(())
            } else {
                Err(format!("{counted} counted, {answered} answered"))
            }
        },
    )
    .await;
    let retried: usize = [&a.log, &b.log]
        .iter()
        .map(|log| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .matches("usage report not taken")
                .count()
        })
        .sum();
    println!(
        "{answered} answers, all counted once; reports that failed and were sent again: {retried}"
    );
    assert!(
        retried > 0,
        "the lost quorum failed no report: the fault did not take effect"
    );
}

/// The limit a router held a request to, from its `x-ratelimit-limit-
/// requests` header.
async fn limit_on(http: &reqwest::Client, router: &str, secret: &str) -> Result<u32, String> {
    let (status, headers, body) = chat_as(http, router, MODEL, Some(secret)).await?;
    if status != 200 {
        return Err(format!("HTTP {status}: {body}"));
    }
    // None until the router has read the key.
    headers
        .get("x-ratelimit-limit-requests")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no x-ratelimit-limit-requests".to_owned())
}

/// Chats through `router` with `secret` until `stop` is set (or the
/// deadline passes): traffic that a router's share follows.
fn busy(
    http: &reqwest::Client,
    router: &str,
    secret: &str,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let (http, router, secret, stop) = (
        http.clone(),
        router.to_owned(),
        secret.to_owned(),
        Arc::clone(stop),
    );
    tokio::spawn(async move {
        let deadline = Instant::now() + DEADLINE;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
            let _ = chat_as(&http, &router, MODEL, Some(&secret)).await;
        }
    })
}

/// Waits until `router` holds the key to a per-minute limit in `range`,
/// asking once a second (each ask is a request of its own, and demand).
async fn holds(
    http: &reqwest::Client,
    router: &str,
    secret: &str,
    range: std::ops::Range<u32>,
) -> u32 {
    llmgw_test_kit::poll_until_ok(DEADLINE, Duration::from_secs(1), || async {
        let limit = limit_on(http, router, secret).await?;
        if range.contains(&limit) {
            Ok(limit)
        } else {
            Err(format!("{router} holds the key to {limit} a minute"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{router}'s part never came in {range:?}: {e}"))
}

/// A key's per-minute limit split by traffic between the routers that
/// serve it: `llmgw dev`'s own router (idle throughout) and two more, A and
/// B. The one that carries the traffic gets most, the idle ones keep a
/// small part, and the parts sum to the limit; with traffic on A and B
/// alike, they split most of it evenly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_minute_limits_are_shared_by_traffic_across_routers() {
    let two = TwoRouters::start(
        "500ms",
        json!({"name": "shared", "limits": {"requests_per_minute": 6000}}),
    )
    .await;
    let (http, admin, secret) = (&two.http, &two.admin, two.secret.clone());
    let (a, b) = (&two.a, &two.b);

    // Traffic through A: A's part grows to most of the limit, B's and dev's
    // own router's stay small, and the control plane's shares sum to one.
    // An idle router reports too (its share keeps room for a burst), so all
    // three count once each has reported.
    let stop_a = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_a = busy(http, &a.url, &secret, &stop_a);
    eventually(
        "dev's router, A and B with shares summing to one, most of it A's",
        DEADLINE,
        || async {
            let keys: Vec<KeyView> = admin.get(paths::KEYS).await?;
            let shares = &keys.iter().find(|k| k.key.name == "shared").unwrap().shares;
            let sum: f64 = shares.values().sum();
            let (share_a, share_b) = (a.share_in(shares), b.share_in(shares));
            if shares.len() == 3
                && (sum - 1.0).abs() < 1e-6
                && share_a.is_some_and(|s| s > 0.8)
                && share_b.is_some()
            {
                Ok(())
            } else {
                Err(format!("shares {shares:?}"))
            }
        },
    )
    .await;
    let busy_part = holds(http, &a.url, &secret, 4_800..6_000).await;
    let idle_part = holds(http, &b.url, &secret, 300..2_000).await;
    println!("traffic through A: A holds {busy_part}, B {idle_part} of 6000 a minute");

    // Traffic through both alike: they split it about evenly.
    let stop_b = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_b = busy(http, &b.url, &secret, &stop_b);
    let part_a = holds(http, &a.url, &secret, 2_000..4_000).await;
    let part_b = holds(http, &b.url, &secret, 2_000..4_000).await;
    println!("traffic through both: A holds {part_a}, B {part_b} of 6000 a minute");
    for (stop, client) in [(stop_a, on_a), (stop_b, on_b)] {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        client.await.unwrap();
    }
}
