//! The web console at `/ui`, served by every peer: its assets and event
//! stream over HTTP, then the whole console in headless Chromium against
//! `llmgw dev` (console_browser.py): the demo fleet on every page, a
//! leader killed under an open page, a drain started and followed from the
//! console, a read token refused, an autoscaled model's load drawn. Without Chromium, chromedriver or
//! Selenium the browser part prints `SKIPPED:` and why.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use llmgw_api::StateEvent;
use llmgw_test_kit::dev::Dev;
use llmgw_test_kit::{Cluster, one_cluster_at_a_time};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_peer_serves_the_console_and_its_event_stream() {
    let mut cluster = Cluster::start(
        "admin:\n  tokens:\n    - { name: ops, role: write, token: \"console-test-write-token\" }\n",
    );
    cluster.token = Some("console-test-write-token".to_owned());
    let leader = cluster.wait_leader().await;
    for id in 1..=3 {
        // The assets need no token: they hold no data.
        let page = reqwest::get(format!("{}/ui/", cluster.admin(id)))
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        let csp = page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(csp.contains("default-src 'self'"), "{csp}");
        let html = page.text().await.unwrap();
        assert!(html.contains("<script src=\"/ui/app.js\">"), "{html}");
        let js = reqwest::get(format!("{}/ui/app.js", cluster.admin(id)))
            .await
            .unwrap();
        assert_eq!(
            js.headers()["content-type"],
            "text/javascript; charset=utf-8"
        );
        // The data does.
        let events = reqwest::get(format!("{}/api/v1/events", cluster.admin(id)))
            .await
            .unwrap();
        assert_eq!(events.status(), 401);
    }
    // The event stream says who leads at once, then again on a change.
    let mut events = cluster
        .http
        .get(format!("{}/api/v1/events", cluster.admin(1)))
        .bearer_auth("console-test-write-token")
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let first = tokio::time::timeout(Duration::from_secs(10), events.chunk())
        .await
        .expect("a first event at once")
        .unwrap()
        .unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    // Wire format: an SSE event named `state` whose data is one JSON line.
    let data = first
        .strip_prefix("event: state\ndata: ")
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("not a state event: {first}"));
    let event: StateEvent = serde_json::from_str(data).expect("a state event");
    assert_eq!(event.leader_id, Some(leader), "{first}");
    cluster.put_model(1, "after-the-first-event").await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), events.chunk())
        .await
        .expect("an event after a write")
        .unwrap()
        .unwrap();
    // Wire format: the event names the applied index the console shows.
    assert!(String::from_utf8_lossy(&next).contains("applied_index"));
}

/// Why the browser test cannot run here, if it cannot.
fn browser_unavailable() -> Option<String> {
    for tool in ["chromium", "chromedriver"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map_or(true, |o| !o.status.success())
        {
            return Some(format!(
                "{tool} is not installed (scripts/setup --test installs it)"
            ));
        }
    }
    None
}

// The guard only keeps other clusters of this binary from starting; it is
// held for the whole test on purpose, as `Cluster` holds its own.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser_follows_a_failover_and_a_drain() {
    if let Some(why) = browser_unavailable() {
        llmgw_test_kit::skipped("console in a browser", &why);
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = Command::new(root.join("scripts/python-venv"))
        .arg("selenium=selenium")
        .output()
        .unwrap();
    if !venv.status.success() {
        let why = format!("no Selenium: {}", String::from_utf8_lossy(&venv.stderr));
        llmgw_test_kit::skipped("console in a browser", &why);
        return;
    }
    let python = String::from_utf8_lossy(&venv.stdout).trim().to_owned();
    let _serial = one_cluster_at_a_time();
    let work = tempfile::tempdir().unwrap();
    let dev = Dev::start(work.path(), &["--nodes", "4"]);
    dev.wait_printed("Press Ctrl-C", Duration::from_secs(240))
        .await;
    assert!(
        dev.output().contains("console: https://127.0.0.1:"),
        "{}",
        dev.output()
    );

    let shots = std::env::var_os("LLMGW_CONSOLE_SCREENSHOTS")
        .map_or_else(|| work.path().join("screenshots"), Into::into);
    std::fs::create_dir_all(&shots).unwrap();
    let out = tokio::task::spawn_blocking({
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console_browser.py");
        let dev_json = work.path().join("dev.json");
        let shots = shots.clone();
        move || {
            Command::new(python)
                .arg(script)
                .arg(dev_json)
                .arg(shots)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("CONSOLE_OK"),
        "the browser test failed:\n{text}\nllmgw dev:\n{}",
        dev.output()
    );
    for shot in [
        "cluster",
        "nodes",
        "models",
        "new-leader",
        "read-token-refused",
        "draining",
        "drained",
        "model-load",
    ] {
        assert!(shots.join(format!("{shot}.png")).exists(), "no {shot}.png");
    }
}
