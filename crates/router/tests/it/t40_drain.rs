//! A draining endpoint takes no new requests and finishes what it has.

use std::time::Duration;

use llmgw_router::{Endpoint, RoutingTable};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_endpoint_gets_nothing_new_and_finishes_its_streams() {
    let slow = [("LLMGW_SIM_ITL", "20ms")];
    let old = Sim::start(SMALL, &["m"], &slow);
    let new = Sim::start(SMALL, &["m"], &slow);
    old.wait_ready().await;
    new.wait_ready().await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(old.url())])],
    )
    .await;
    let url = format!("{}/v1/chat/completions", router.url());

    // A 60-token stream (~1.2 s) on the old endpoint.
    let long = {
        let url = url.clone();
        tokio::spawn(async move { post(&client(), &url, chat_body("m", true, 60), &[]).await })
    };
    let metrics_url = format!("{}/metrics", router.url());
    let outstanding_old = format!(
        "llmgw_router_endpoint_outstanding_requests{{endpoint=\"{}\"}}",
        old.url()
    );
    assert!(
        wait_until(Duration::from_secs(20), || async {
            get(&metrics_url)
                .await
                .is_some_and(|(_, m)| metric(&m, &outstanding_old) == Some(1.0))
        })
        .await,
        "the stream never started on the old endpoint"
    );

    router.table.send_replace(std::sync::Arc::new(RoutingTable {
        keys: Default::default(),
        models: vec![model(
            "m",
            &[],
            vec![Endpoint::draining(old.url()), Endpoint::ready(new.url())],
        )],
    }));
    let c = client();
    for i in 0..10 {
        let (status, body) = post(&c, &url, chat_body("m", false, 2), &[]).await.unwrap();
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let (status, body) = tokio::time::timeout(Duration::from_secs(60), long)
        .await
        .expect("the draining stream hung")
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        body.ends_with("data: [DONE]\n\n") && !body.contains("\"error\""),
        "{body}"
    );
    assert!(
        body.contains("\"finish_reason\":\"length\"")
            || body.contains("\"finish_reason\":\"stop\""),
        "the stream did not run to its end: {body}"
    );

    let (_, metrics) = get(&metrics_url).await.unwrap();
    let on = |url: String| {
        format!("llmgw_router_requests_total{{model=\"m\",endpoint=\"{url}\",status=\"200\"}}")
    };
    assert_eq!(
        metric(&metrics, &on(old.url())),
        Some(1.0),
        "draining endpoint got new work:\n{metrics}"
    );
    assert_eq!(metric(&metrics, &on(new.url())), Some(10.0), "{metrics}");
}
