//! The ledger, the meter and the usage the router asks for, on bodies
//! made of chosen frames.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};

use super::meter::last_usage;
use super::*;
use crate::relay::{BoxError, ResponseBody};
use http_body_util::BodyExt;

/// A body that yields `chunks`, one frame each.
struct Chunks(std::collections::VecDeque<&'static str>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(
            self.0
                .pop_front()
                .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
        )
    }
}

fn body(chunks: &[&'static str]) -> ResponseBody {
    Chunks(chunks.iter().copied().collect()).boxed_unsync()
}

fn page(ledger: &UsageLedger) -> String {
    let mut page = String::new();
    ledger.render(&mut page);
    page
}

#[tokio::test]
async fn a_whole_answer_is_charged_what_the_engine_reported() {
    let ledger = Arc::new(UsageLedger::default());
    let answer = r#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}},"kv_transfer_params":null}"#;
    let (head, rest) = answer.split_at(40);
    let metered = ledger.meter("ci", "search", "qwen", 200, body(&[head, rest]));
    metered.collect().await.unwrap();
    let text = page(&ledger);
    for line in [
        "llmgw_router_key_requests_total{key=\"ci\",team=\"search\",model=\"qwen\",outcome=\"completed\"} 1",
        "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"prompt\"} 12",
        "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"completion\"} 5",
        "llmgw_router_key_tokens_total{key=\"ci\",team=\"search\",model=\"qwen\",kind=\"cached\"} 8",
        "llmgw_router_key_estimated_requests_total{key=\"ci\",team=\"search\",model=\"qwen\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[tokio::test]
async fn a_stream_without_usage_is_estimated_and_a_cancelled_one_counted() {
    let ledger = Arc::new(UsageLedger::default());
    let events = [
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    ledger
        .meter("ci", "", "qwen", 200, body(&events))
        .collect()
        .await
        .unwrap();
    // The client reads two events and goes away.
    let mut cut = ledger.meter("ci", "", "qwen", 200, body(&events));
    for _ in 0..2 {
        cut.frame().await.unwrap().unwrap();
    }
    drop(cut);
    let text = page(&ledger);
    assert!(text.contains("outcome=\"completed\"} 1"), "{text}");
    assert!(text.contains("outcome=\"cancelled\"} 1"), "{text}");
    assert!(
        text.contains(
            "llmgw_router_key_estimated_requests_total{key=\"ci\",team=\"\",model=\"qwen\"} 2"
        ),
        "{text}"
    );
    // 3 delta events relayed whole, 2 of the cancelled one.
    assert!(text.contains("kind=\"completion\"} 5"), "{text}");
}

#[tokio::test]
async fn usage_the_client_did_not_ask_for_is_counted_and_kept_from_it() {
    let ledger = Arc::new(UsageLedger::default());
    let stream = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"cho",
        "ices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
    ];
    let seen = ledger
        .meter("ci", "", "qwen", 200, body(&stream))
        .stripping_usage(true)
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
         data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n\
         data: [DONE]\n\n"
    );
    let text = page(&ledger);
    assert!(text.contains("kind=\"prompt\"} 7"), "{text}");
    assert!(text.contains("kind=\"completion\"} 2"), "{text}");
    assert!(
        text.contains("estimated_requests_total{key=\"ci\",team=\"\",model=\"qwen\"} 0"),
        "{text}"
    );
}

#[test]
fn usage_is_asked_for_unless_the_client_did() {
    let asked = ask_for_usage(
        br#"{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}"#,
    )
    .unwrap();
    let asked: serde_json::Value = serde_json::from_slice(&asked).unwrap();
    assert_eq!(asked["stream_options"]["include_usage"], true);
    assert_eq!(asked["stream_options"]["continuous_usage_stats"], false);
    assert_eq!(
        ask_for_usage(br#"{"stream_options":{"include_usage":true}}"#),
        None
    );
}

#[test]
fn the_last_usage_wins_and_null_is_passed_over() {
    let text = br#"data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}

data: {"usage":{"prompt_tokens":9,"completion_tokens":4}}

data: {"usage":null}

data: [DONE]"#;
    let usage = last_usage(text).unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (9, 4));
    assert_eq!(last_usage(b"{\"usage\":null}"), None);
}
