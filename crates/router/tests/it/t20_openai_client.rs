//! The official `openai` Python package against the router: what a client
//! application sees. One script (tests/openai_client.py) holds every check;
//! it prints one line per check and exits non-zero if any failed.

use std::path::Path;
use std::time::Duration;

use llmgw_router::{Endpoint, KeyGrant, RoutedModel, Settings};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_sees_an_openai_api() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = tokio::process::Command::new(root.join("scripts/python-venv"))
        .output()
        .await
        .expect("run scripts/python-venv");
    assert!(
        venv.status.success(),
        "cannot make the Python venv with the `openai` package (scripts/python-venv):\n{}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout)
        .expect("utf-8 path")
        .trim()
        .to_string();

    let chat = Sim::start(SMALL, &["qwen", "q", "resumed"], &[]);
    let embed = Sim::start(EMBED, &["embed"], &[]);
    let cut = Sim::start(
        SMALL,
        &["cut", "resumed"],
        &[("LLMGW_SIM_FAULT", "crash_mid_stream:cut@3")],
    );
    for sim in [&chat, &embed, &cut] {
        sim.wait_ready().await;
    }
    let mut nowhere = model("nowhere", &[], vec![]);
    nowhere.unavailable_reason =
        Some("0/3 nodes fit nowhere profile tp8: 3 have 2 free GPUs (need 8)".into());
    let models = |_: ()| -> Vec<RoutedModel> {
        vec![
            model("qwen", &["q"], vec![Endpoint::ready(chat.url())]),
            model("embed", &[], vec![Endpoint::ready(embed.url())]),
            model("cut", &[], vec![Endpoint::ready(cut.url())]),
            model(
                "resumed",
                &[],
                vec![Endpoint::ready(cut.url()), Endpoint::ready(chat.url())],
            ),
            nowhere.clone(),
        ]
    };
    let settings = Settings {
        max_body_bytes: 64 * 1024,
        ..test_settings()
    };
    let open = TestRouter::start(settings.clone(), models(())).await;
    let keyed_settings = Settings {
        api_keys: vec![
            KeyGrant {
                name: "team-a".into(),
                key: "sk-team-a".into(),
                models: vec!["qwen".into()],
            },
            KeyGrant {
                name: "team-b".into(),
                key: "sk-team-b".into(),
                models: vec!["embed".into()],
            },
        ],
        ..settings
    };
    let keyed = TestRouter::start(keyed_settings, models(())).await;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .env("ROUTER_URL", open.url())
        .env("KEYED_ROUTER_URL", keyed.url())
        .env("REFERENCE_ENGINE_URL", chat.url())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the client script did not finish within 180 s")
        .expect("run the client script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(
        output.status.success(),
        "openai client checks failed:\n{text}"
    );
    assert!(text.contains("0 failed"), "{text}");
    let (_, metrics) = get(&format!("{}/metrics", open.url())).await.unwrap();
    let resumed = metric(
        &metrics,
        "llmgw_router_stream_resumptions_total{model=\"resumed\",outcome=\"resumed\"}",
    );
    assert!(
        resumed.is_some_and(|n| n >= 1.0),
        "no stream of `resumed` started on the cutting replica:\n{metrics}"
    );
}
