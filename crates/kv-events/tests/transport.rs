//! The ZMQ links: a subscriber against the exact frames the real engines'
//! publishers sent (recorded from the wheels' own ZmqEventPublisher), and
//! against llmgw's publisher with gaps and restarts.

use std::net::SocketAddr;
use std::time::Duration;

use llmgw_kv_events::zmtp::{Connection, Incoming, SocketType};
use llmgw_kv_events::{Delivery, Endpoints, Publisher, PublisherConfig, Subscriber};
use serde_json::Value;
use tokio::net::TcpListener;

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn frames(message: &Value) -> Vec<Vec<u8>> {
    message["frames_hex"]
        .as_array()
        .expect("frames_hex")
        .iter()
        .map(|f| hex(f.as_str().expect("frame")))
        .collect()
}

async fn send(conn: &mut Connection, frames: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    conn.send(&refs).await.expect("send");
}

/// Plays an engine from a recording: its PUB sends the live messages to
/// the first subscriber, its ROUTER answers every replay request with the
/// recorded reply.
async fn recorded_engine(file: &str) -> (Endpoints, Vec<(u64, Vec<u8>)>) {
    let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
    let recording: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json");
    let live: Vec<Vec<Vec<u8>>> = recording["live"]
        .as_array()
        .expect("live")
        .iter()
        .map(frames)
        .collect();
    let replies: Vec<Vec<Vec<u8>>> = recording["replay"][0]["reply_messages"]
        .as_array()
        .expect("reply_messages")
        .iter()
        .map(frames)
        .collect();
    let topic = String::from_utf8(live[0][0].clone()).expect("topic");
    let published = live
        .iter()
        .map(|f| {
            (
                u64::from_be_bytes(f[1].clone().try_into().expect("seq")),
                f[2].clone(),
            )
        })
        .collect();
    let stream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let replay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoints = Endpoints {
        stream: stream.local_addr().expect("addr").to_string(),
        replay: Some(replay.local_addr().expect("addr").to_string()),
        topic,
    };
    tokio::spawn(async move {
        let (socket, _) = stream.accept().await.expect("accept");
        let mut conn = Connection::handshake(socket, SocketType::Pub)
            .await
            .expect("handshake");
        // The subscription comes first.
        let Incoming::Message(subscription) = conn.recv().await.expect("subscription") else {
            panic!("expected a subscription message");
        };
        assert_eq!(subscription[0][0], 1, "a subscribe message starts with 1");
        for message in &live {
            send(&mut conn, message).await;
        }
        std::future::pending::<()>().await;
    });
    tokio::spawn(async move {
        loop {
            let (socket, _) = replay.accept().await.expect("accept");
            let mut conn = Connection::handshake(socket, SocketType::Router)
                .await
                .expect("handshake");
            let Incoming::Message(request) = conn.recv().await.expect("request") else {
                panic!("expected a replay request");
            };
            assert_eq!(
                request.len(),
                2,
                "a DEALER sends the empty delimiter and the seq"
            );
            for reply in &replies {
                send(&mut conn, reply).await;
            }
        }
    });
    (endpoints, published)
}

async fn next(subscriber: &mut Subscriber) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), subscriber.next())
        .await
        .expect("a delivery within 10s")
        .expect("the stream stays up")
}

async fn replays_and_follows(file: &str) {
    let (endpoints, published) = recorded_engine(file).await;
    let mut subscriber = Subscriber::connect(endpoints).await.expect("connect");
    // The replay delivers the buffered batches; their live copies are
    // skipped, so each seq arrives once and in order.
    for (seq, payload) in &published {
        assert_eq!(
            next(&mut subscriber).await,
            Delivery::Batch {
                seq: *seq,
                payload: payload.clone()
            },
            "{file}"
        );
    }
}

#[tokio::test]
async fn a_vllm_0_11_engine_is_replayed_and_followed() {
    replays_and_follows("vllm-0.11-zmq.json").await;
}

#[tokio::test]
async fn a_vllm_0_34_engine_is_replayed_and_followed() {
    replays_and_follows("vllm-0.34-zmq.json").await;
}

#[tokio::test]
async fn an_sglang_engine_is_replayed_and_followed() {
    replays_and_follows("sglang-0.5.23-zmq.json").await;
}

async fn publisher(hwm: usize, replay_topic_frame: bool) -> (Publisher, Endpoints) {
    let stream = free_addr().await;
    let replay = free_addr().await;
    let publisher = Publisher::bind(
        stream,
        Some(replay),
        PublisherConfig {
            topic: "kv".into(),
            buffer_steps: 1000,
            hwm,
            replay_topic_frame,
        },
    )
    .await
    .expect("publisher");
    let endpoints = Endpoints {
        stream: stream.to_string(),
        replay: Some(replay.to_string()),
        topic: "kv".into(),
    };
    (publisher, endpoints)
}

async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr")
}

#[tokio::test]
async fn messages_a_slow_subscriber_missed_are_replayed_in_order() {
    for replay_topic_frame in [false, true] {
        let (publisher, endpoints) = publisher(2, replay_topic_frame).await;
        publisher.publish(b"before".to_vec());
        let mut subscriber = Subscriber::connect(endpoints).await.expect("connect");
        assert_eq!(
            next(&mut subscriber).await,
            Delivery::Batch {
                seq: 0,
                payload: b"before".to_vec()
            }
        );
        // Wait until the subscription is live: a message published now arrives.
        let mut seq = 1;
        loop {
            publisher.publish(format!("m{seq}").into_bytes());
            let got = tokio::time::timeout(Duration::from_millis(200), subscriber.next()).await;
            seq += 1;
            if got.is_ok() {
                break;
            }
        }
        let caught_up = seq - 1;
        // A burst past the high-water mark while the subscriber reads nothing.
        for _ in 0..200 {
            publisher.publish(format!("m{seq}").into_bytes());
            seq += 1;
        }
        publisher.publish(b"last".to_vec());
        let mut expected = caught_up + 1;
        loop {
            match next(&mut subscriber).await {
                Delivery::Batch { seq: got, payload } => {
                    assert_eq!(got, expected, "seqs arrive in order, each once");
                    expected += 1;
                    if payload == b"last" {
                        break;
                    }
                }
                other => panic!("nothing was lost beyond the buffer, got {other:?}"),
            }
        }
        assert!(
            subscriber.replayed() > 1,
            "the burst never overran the high-water mark: nothing was replayed"
        );
    }
}

#[tokio::test]
async fn a_sequence_that_goes_back_is_a_restart_and_a_jump_without_replay_is_missed() {
    let stream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoints = Endpoints {
        stream: stream.local_addr().expect("addr").to_string(),
        replay: None,
        topic: String::new(),
    };
    tokio::spawn(async move {
        let (socket, _) = stream.accept().await.expect("accept");
        let mut conn = Connection::handshake(socket, SocketType::Pub)
            .await
            .expect("handshake");
        let _subscription = conn.recv().await.expect("subscription");
        for (seq, payload) in [(0u64, b"a"), (1, b"b"), (5, b"c"), (0, b"d")] {
            conn.send(&[b"", &seq.to_be_bytes(), payload])
                .await
                .expect("send");
        }
        std::future::pending::<()>().await;
    });
    let mut subscriber = Subscriber::connect(endpoints).await.expect("connect");
    let batch = |seq: u64, payload: &[u8]| Delivery::Batch {
        seq,
        payload: payload.to_vec(),
    };
    assert_eq!(next(&mut subscriber).await, batch(0, b"a"));
    assert_eq!(next(&mut subscriber).await, batch(1, b"b"));
    assert_eq!(
        next(&mut subscriber).await,
        Delivery::Missed { from: 2, to: 4 }
    );
    assert_eq!(next(&mut subscriber).await, batch(5, b"c"));
    assert_eq!(next(&mut subscriber).await, Delivery::Restarted);
    assert_eq!(next(&mut subscriber).await, batch(0, b"d"));
}
