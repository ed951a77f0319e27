//! HTTP/1.1 as clients actually speak it, byte for byte on a raw socket:
//! pipelining, chunked request bodies, `expect: 100-continue`, HTTP/1.0,
//! and heads the router must refuse (with a reason, then closing).

use std::time::Duration;

use llmgw_router::{Endpoint, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// One answer as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads answers from a connection, keeping what is past the current one.
struct Wire {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Wire {
    async fn connect(router: &TestRouter) -> Wire {
        let stream = TcpStream::connect(router.running.local_addr())
            .await
            .expect("connect");
        Wire {
            stream,
            buffer: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Reads more; false when the router closed the connection.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(30), self.stream.read(&mut chunk))
            .await
            .expect("the router answers within 30 s")
            .unwrap_or(0);
        self.buffer.extend_from_slice(&chunk[..n]);
        n > 0
    }

    async fn answer(&mut self) -> Answer {
        let (status, headers, head_len) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(len) = parsed.parse(&self.buffer).expect("valid head")
            {
                let headers = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value).into_owned();
                        (h.name.to_ascii_lowercase(), value)
                    })
                    .collect::<Vec<_>>();
                break (parsed.code.unwrap(), headers, len);
            }
            assert!(
                self.fill().await,
                "closed before a whole head: {:?}",
                self.text()
            );
        };
        self.buffer.drain(..head_len);
        let mut answer = Answer {
            status,
            headers,
            body: String::new(),
        };
        if status == 100 {
            return answer;
        }
        if let Some(length) = answer.header("content-length") {
            let length: usize = length.parse().expect("a number");
            while self.buffer.len() < length {
                assert!(self.fill().await, "closed inside the body");
            }
            let body: Vec<u8> = self.buffer.drain(..length).collect();
            answer.body = String::from_utf8(body).expect("utf-8");
        } else if answer.header("transfer-encoding") == Some("chunked") {
            answer.body = self.chunked_body().await;
        } else {
            while self.fill().await {}
            answer.body = String::from_utf8(std::mem::take(&mut self.buffer)).expect("utf-8");
        }
        answer
    }

    async fn chunked_body(&mut self) -> String {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(self.fill().await, "closed inside a chunk line");
            };
            let size = usize::from_str_radix(&self.text()[..line_end], 16).expect("hex size");
            while self.buffer.len() < line_end + 2 + size + 2 {
                assert!(self.fill().await, "closed inside a chunk");
            }
            body.extend_from_slice(&self.buffer[line_end + 2..line_end + 2 + size]);
            self.buffer.drain(..line_end + 2 + size + 2);
            if size == 0 {
                return String::from_utf8(body).expect("utf-8");
            }
        }
    }

    /// True when the router closes the connection with nothing more sent.
    async fn closed(&mut self) -> bool {
        !self.fill().await && self.buffer.is_empty()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer).into_owned()
    }
}

async fn router_with_engine() -> (Sim, TestRouter) {
    let sim = Sim::start(SMALL, &["m"], &[]);
    sim.wait_ready().await;
    let router = TestRouter::start(
        test_settings(),
        vec![model("m", &[], vec![Endpoint::ready(sim.url())])],
    )
    .await;
    (sim, router)
}

fn post_head(path: &str, extra: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n{extra}\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_speaking_http_1_1_every_way_are_answered() {
    let (_sim, router) = router_with_engine().await;

    // Three requests in one write: answered in order on one connection.
    let chat = chat_body("m", false, 4);
    let mut wire = Wire::connect(&router).await;
    let pipelined = format!(
        "GET /health HTTP/1.1\r\nhost: r\r\n\r\n{}{chat}GET /nowhere HTTP/1.1\r\nhost: r\r\n\r\n",
        post_head(
            "/v1/chat/completions",
            &format!("content-length: {}\r\n", chat.len())
        ),
    );
    wire.send(pipelined.as_bytes()).await;
    let health = wire.answer().await;
    assert_eq!(health.status, 200);
    assert!(health.header("date").is_some(), "{health:?}");
    let completion = wire.answer().await;
    assert_eq!(completion.status, 200, "{}", completion.body);
    let completion: serde_json::Value = serde_json::from_str(&completion.body).expect("JSON");
    assert_eq!(completion["usage"]["completion_tokens"], 4);
    let unknown = wire.answer().await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.contains("/nowhere"), "{}", unknown.body);

    // A chunked body after `100 Continue`, then a streamed answer.
    let stream_chat = chat_body("m", true, 3);
    let head = post_head(
        "/v1/chat/completions",
        "transfer-encoding: chunked\r\nexpect: 100-continue\r\n",
    );
    wire.send(head.as_bytes()).await;
    assert_eq!(wire.answer().await.status, 100);
    let (first, rest) = stream_chat.split_at(10);
    let chunked = format!(
        "{:x}\r\n{first}\r\n{:x};ext=1\r\n{rest}\r\n0\r\n\r\n",
        first.len(),
        rest.len()
    );
    wire.send(chunked.as_bytes()).await;
    let streamed = wire.answer().await;
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert_eq!(streamed.header("transfer-encoding"), Some("chunked"));
    let read = read_stream(&streamed.body);
    assert!(read.done, "{}", streamed.body);
    assert_eq!(read.finish_reason.as_deref(), Some("length"));

    // An HTTP/1.0 client gets its answer and the connection closes.
    let mut old = Wire::connect(&router).await;
    old.send(b"GET /health HTTP/1.0\r\n\r\n").await;
    let answer = old.answer().await;
    assert_eq!(answer.status, 200);
    assert!(old.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_a_proxy_must_not_guess_at_are_refused_with_a_reason() {
    let (_sim, router) = router_with_engine().await;
    let long_header = format!("x-long: {}\r\n", "a".repeat(70 * 1024));
    let cases: [(&str, String, u16, &str); 5] = [
        (
            "smuggling shape",
            post_head(
                "/v1/chat/completions",
                "transfer-encoding: chunked\r\ncontent-length: 5\r\n",
            ),
            400,
            "both transfer-encoding and content-length",
        ),
        (
            "two lengths",
            post_head(
                "/v1/chat/completions",
                "content-length: 5\r\ncontent-length: 6\r\n",
            ),
            400,
            "differing content-lengths",
        ),
        (
            "a coding the router cannot read",
            post_head(
                "/v1/chat/completions",
                "transfer-encoding: gzip, chunked\r\n",
            ),
            501,
            "gzip",
        ),
        (
            "not HTTP",
            "GET /health HTTP/1.1\r\nno colon here\r\n\r\n".to_string(),
            400,
            "malformed request head",
        ),
        (
            "a head without end",
            format!("GET /health HTTP/1.1\r\n{long_header}\r\n"),
            431,
            "longer than",
        ),
    ];
    for (what, head, status, reason) in cases {
        let mut wire = Wire::connect(&router).await;
        wire.send(head.as_bytes()).await;
        let answer = wire.answer().await;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert!(answer.body.contains(reason), "{what}: {}", answer.body);
        assert_eq!(answer.header("connection"), Some("close"), "{what}");
        assert!(wire.closed().await, "{what}: the connection stays open");
    }

    // Broken chunked framing: refused, and the connection closes.
    let mut wire = Wire::connect(&router).await;
    let head = post_head("/v1/chat/completions", "transfer-encoding: chunked\r\n");
    wire.send(format!("{head}zz\r\n").as_bytes()).await;
    let answer = wire.answer().await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("bad chunk size"), "{}", answer.body);
    assert!(wire.closed().await);

    // The router still serves.
    let mut wire = Wire::connect(&router).await;
    wire.send(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n").await;
    assert_eq!(wire.answer().await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_let_go() {
    let settings = Settings {
        client_read_timeout: Duration::from_millis(300),
        client_idle_timeout: Duration::from_millis(500),
        ..test_settings()
    };
    let router = TestRouter::start(settings, Vec::new()).await;

    // A head that stops half-way is refused once it is overdue.
    let mut wire = Wire::connect(&router).await;
    wire.send(b"GET /health HTTP/1.1\r\nhost: r\r\nx-half")
        .await;
    let answer = wire.answer().await;
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(
        answer.body.contains("timeouts.client_read"),
        "{}",
        answer.body
    );
    assert!(wire.closed().await);

    // So is a body that stops arriving.
    let mut wire = Wire::connect(&router).await;
    wire.send(post_head("/v1/chat/completions", "content-length: 100\r\n").as_bytes())
        .await;
    wire.send(b"{\"model\":").await;
    let answer = wire.answer().await;
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(answer.body.contains("body paused"), "{}", answer.body);
    assert!(wire.closed().await);

    // A kept-alive connection is served, then closed once idle.
    let mut wire = Wire::connect(&router).await;
    wire.send(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n").await;
    assert_eq!(wire.answer().await.status, 200);
    assert!(wire.closed().await, "an idle connection stayed open");
}
