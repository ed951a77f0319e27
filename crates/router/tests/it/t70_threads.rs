//! The router on threads of its own, as `llmgw router` serves: every
//! connection is answered whichever thread accepted it, and dropping the
//! router stops its threads and closes its port.

use std::num::NonZeroUsize;
use std::sync::Arc;

use llmgw_router::{Endpoint, Router, RoutingTable};
use llmgw_test_kit::DEADLINE;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::common::*;

const THREADS: usize = 2;

/// Threads of this test process named as the router names its own.
fn router_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("llmgw-router-"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_on_its_own_threads_answers_every_connection_and_stops_when_dropped() {
    let sim = Sim::start(SMALL, &["m"], &[]);
    sim.wait_ready().await;
    let (table, _) = watch::channel(Arc::new(RoutingTable {
        keys: Default::default(),
        models: vec![model("m", &[], vec![Endpoint::ready(sim.url())])],
    }));
    let running = Router::new(test_settings(), &table)
        .bind_threads(
            "127.0.0.1:0".parse().expect("address"),
            NonZeroUsize::new(THREADS).expect("non-zero"),
        )
        .expect("bind");
    // A thread names itself once it runs.
    let named = wait_until(DEADLINE, || async { router_threads() == THREADS }).await;
    assert!(
        named,
        "{} router threads, expected {THREADS}",
        router_threads()
    );
    let addr = running.local_addr();
    let url = format!("http://{addr}/v1/chat/completions");

    // Each client has connections of its own, which the kernel spreads
    // over the router's listening sockets.
    let mut clients = JoinSet::new();
    for i in 0..16 {
        let url = url.clone();
        clients.spawn(async move {
            let c = client();
            let mut answers = Vec::new();
            for j in 0..4 {
                let stream = (i + j) % 2 == 0;
                answers.push((stream, post(&c, &url, chat_body("m", stream, 8), &[]).await));
            }
            answers
        });
    }
    let mut answered = 0;
    while let Some(answers) = clients.join_next().await {
        for (stream, answer) in answers.expect("client task") {
            let (status, body) = answer.expect("answered");
            assert_eq!(status, 200, "{body}");
            if stream {
                let read = read_stream(&body);
                assert!(read.done && read.error.is_none(), "{body}");
            } else {
                assert!(body.contains("\"finish_reason\""), "{body}");
            }
            answered += 1;
        }
    }
    assert_eq!(answered, 64);

    drop(running);
    let stopped = wait_until(DEADLINE, || async {
        router_threads() == 0 && tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(
        stopped,
        "{} router threads still running or {addr} still accepting after the router was dropped",
        router_threads()
    );
}
