//! The client against scripted engines: every framing, reuse of kept-alive
//! connections, and engines that close at awkward moments.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::header::HeaderMap;
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{IDLE_CLOSE_RACE, Upstream, UpstreamError};

/// Reads one request (head and `content-length` body) off `stream`; None
/// when the client closed instead.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buffer = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buffer).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buffer.len() >= end + 4 + length {
                return Some(text);
            }
        }
    }
}

/// An engine that answers each connection's requests with the given raw
/// responses in turn, then closes; reports each connection's peer port.
async fn scripted(
    connections: Vec<Vec<&'static [u8]>>,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for answers in connections {
            let (mut stream, peer) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                for answer in answers {
                    let Some(request) = read_request(&mut stream).await else {
                        return;
                    };
                    let _ = seen.send(format!("{} {request}", peer.port()));
                    for piece in answer.split_inclusive(|&b| b == b'|') {
                        let piece = piece.strip_suffix(b"|").unwrap_or(piece);
                        stream.write_all(piece).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            });
        }
    });
    (addr, requests)
}

async fn post(
    upstream: &Upstream,
    addr: SocketAddr,
) -> Result<(StatusCode, String), UpstreamError> {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    let response = upstream
        .send(
            &Method::POST,
            &addr.to_string(),
            "/v1/completions",
            &headers,
            b"{\"a\":1}",
        )
        .await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec()).unwrap()))
}

const SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";

#[tokio::test]
async fn kept_alive_connection_carries_the_next_request() {
    let (addr, mut requests) = scripted(vec![vec![SHORT, SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(
        post(&upstream, addr).await.unwrap(),
        (StatusCode::OK, "hello".into())
    );
    assert_eq!(
        post(&upstream, addr).await.unwrap(),
        (StatusCode::OK, "hello".into())
    );
    let first = requests.recv().await.unwrap();
    let second = requests.recv().await.unwrap();
    assert_eq!(
        first.split(' ').next(),
        second.split(' ').next(),
        "one connection"
    );
    assert!(first.contains("POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:"));
    assert!(first.contains("content-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"));
}

#[tokio::test]
async fn chunked_body_is_decoded_across_reads() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel|lo\r\n7;ext=1\r\n wor|ld!\r\n0\r\nx-trailer: 1\r\n|\r\n";
    let (addr, _requests) = scripted(vec![vec![answer, SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello world!");
    // The trailers were consumed: the connection is clean for the next one.
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
}

#[tokio::test]
async fn body_without_length_ends_when_the_engine_closes() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nuntil|close";
    let (addr, _requests) = scripted(vec![vec![answer], vec![SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "untilclose");
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
}

#[tokio::test]
async fn interim_answers_are_skipped() {
    let answer: &[u8] =
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
    let (addr, _requests) = scripted(vec![vec![answer]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(
        post(&upstream, addr).await.unwrap(),
        (StatusCode::CREATED, "ok".into())
    );
}

#[tokio::test]
async fn an_idle_connection_the_engine_closed_is_replaced() {
    // The first connection answers once and closes (as uvicorn does after
    // its keep-alive timeout); the request that finds it closed goes out
    // again on a fresh one.
    let (addr, mut requests) = scripted(vec![vec![SHORT], vec![SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    let first = requests.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    let second = requests.recv().await.unwrap();
    assert_ne!(first.split(' ').next(), second.split(' ').next());
}

#[tokio::test]
async fn a_close_after_an_interim_answer_is_not_sent_again() {
    // The engine acknowledged the request (100 Continue) and then closed:
    // it read the request, so it must not go out a second time.
    let continue_then_close: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
    let (addr, mut requests) = scripted(vec![vec![SHORT, continue_then_close], vec![SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    assert!(matches!(
        post(&upstream, addr).await,
        Err(UpstreamError::Closed)
    ));
    requests.recv().await.unwrap();
    requests.recv().await.unwrap();
    assert!(requests.try_recv().is_err(), "the request was sent twice");
}

#[tokio::test]
async fn a_close_long_after_the_request_is_not_sent_again() {
    // The engine read the second request, worked on it and died without a
    // word: sending it again would run it twice.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, mut requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            // Each connection answers its first request; the second is
            // read, met with silence, and the connection closed.
            tokio::spawn(async move {
                if read_request(&mut stream).await.is_none() {
                    return;
                }
                let _ = seen.send(());
                stream.write_all(SHORT).await.unwrap();
                if read_request(&mut stream).await.is_some() {
                    let _ = seen.send(());
                    tokio::time::sleep(IDLE_CLOSE_RACE + Duration::from_millis(300)).await;
                }
            });
        }
    });
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    assert!(matches!(
        post(&upstream, addr).await,
        Err(UpstreamError::Closed)
    ));
    requests.recv().await.unwrap();
    requests.recv().await.unwrap();
    assert!(requests.try_recv().is_err(), "the request was sent twice");
}

#[tokio::test]
async fn a_body_cut_short_is_an_error() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nonly this";
    let (addr, _requests) = scripted(vec![vec![answer]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    let error = post(&upstream, addr).await.unwrap_err();
    assert!(matches!(error, UpstreamError::Closed), "{error}");
}

#[tokio::test]
async fn dropping_the_body_closes_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let engine = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_request(&mut stream).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
            .await
            .unwrap();
        // The router's drop is the only way this read ends.
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.unwrap();
        rest.len()
    });
    let upstream = Upstream::new(Duration::from_secs(2));
    let response = upstream
        .send(
            &Method::POST,
            &addr.to_string(),
            "/",
            &HeaderMap::new(),
            b"{}",
        )
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"hi");
    drop(body);
    let leftover = tokio::time::timeout(Duration::from_secs(10), engine)
        .await
        .expect("the engine saw the connection close")
        .unwrap();
    assert_eq!(leftover, 0);
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let upstream = Upstream::new(Duration::from_secs(2));
    let error = post(&upstream, addr).await.unwrap_err();
    assert!(matches!(error, UpstreamError::Connect { .. }), "{error}");
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}

#[tokio::test]
async fn idle_connections_are_closed_by_the_sweep() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let engine = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_request(&mut stream).await.unwrap();
        stream.write_all(SHORT).await.unwrap();
        // Only the router closing its idle connection ends this read.
        read_request(&mut stream).await
    });
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    upstream.close_idle(Duration::from_secs(60));
    assert_eq!(known_hosts(&upstream), 1, "a fresh connection stays");
    upstream.close_idle(Duration::ZERO);
    let next = tokio::time::timeout(Duration::from_secs(10), engine)
        .await
        .expect("the engine saw the idle connection close")
        .unwrap();
    assert_eq!(next, None);
    assert_eq!(known_hosts(&upstream), 0, "the host is forgotten");
}

fn known_hosts(upstream: &Upstream) -> usize {
    upstream
        .hosts
        .lock()
        .unwrap()
        .iter()
        .map(|hosts| hosts.len())
        .sum()
}

/// Bytes an engine sends after a complete answer (a late error, a second
/// response) belong to no request: the connection holding them is closed,
/// never handed to the next request, which would read them as its answer.
#[tokio::test]
async fn a_connection_holding_bytes_nobody_asked_for_is_not_reused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (answered, mut answered_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (stray_sent, mut stray_sent_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let engine = tokio::spawn(async move {
        let (mut first, _) = listener.accept().await.unwrap();
        read_request(&mut first).await.unwrap();
        first.write_all(SHORT).await.unwrap();
        // Once the client has read its answer, a second one nobody asked for.
        answered_rx.recv().await.unwrap();
        first
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")
            .await
            .unwrap();
        stray_sent.send(()).unwrap();
        let (mut second, _) = listener.accept().await.unwrap();
        read_request(&mut second).await.unwrap();
        second
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh")
            .await
            .unwrap();
        // Both connections stay open: only the stray bytes tell them apart.
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop((first, second));
    });
    let upstream = Upstream::new(Duration::from_secs(2));
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    answered.send(()).unwrap();
    stray_sent_rx.recv().await.unwrap();
    assert_eq!(post(&upstream, addr).await.unwrap().1, "fresh");
    engine.abort();
}

/// A broken chunk-size line fails the body, even when it arrives with the
/// chunk before it (read ahead while that chunk is handed out).
#[tokio::test]
async fn a_bad_chunk_size_fails_the_body() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n3\r\nabc\r\n0\r\n\r\n";
    let (addr, _requests) = scripted(vec![vec![answer], vec![SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    let outcome = post(&upstream, addr).await;
    assert!(outcome.is_err(), "{outcome:?}");
    // The broken connection was not pooled: the next request opens another.
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
}

/// Both framings named: the body is read as chunked, the client is not
/// given a length that does not match it, and the connection is not reused.
#[tokio::test]
async fn a_length_beside_chunked_is_dropped_and_the_connection_closed() {
    let answer: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let (addr, mut requests) = scripted(vec![vec![answer, SHORT], vec![SHORT]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    let response = upstream
        .send(&Method::GET, &addr.to_string(), "/", &HeaderMap::new(), &[])
        .await
        .unwrap();
    assert_eq!(response.headers().get("content-length"), None);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello");
    assert_eq!(post(&upstream, addr).await.unwrap().1, "hello");
    let first = requests.recv().await.unwrap();
    let second = requests.recv().await.unwrap();
    assert_ne!(
        first.split(' ').next(),
        second.split(' ').next(),
        "one connection per answer"
    );
}

#[tokio::test]
async fn endless_interim_answers_are_refused() {
    let flood: &'static [u8] = "HTTP/1.1 100 Continue\r\n\r\n".repeat(20).leak().as_bytes();
    let (addr, _requests) = scripted(vec![vec![flood]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    let error = post(&upstream, addr).await.unwrap_err().to_string();
    assert!(error.contains("interim (1xx) answers"), "{error}");
}

#[tokio::test]
async fn a_get_reads_at_most_its_limit() {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
        super::GET_TEXT_LIMIT + 1
    );
    let big: &'static [u8] = (head + &"x".repeat(super::GET_TEXT_LIMIT + 1))
        .leak()
        .as_bytes();
    let (addr, _requests) = scripted(vec![vec![big]]).await;
    let upstream = Upstream::new(Duration::from_secs(2));
    let error = upstream
        .get_text(&format!("http://{addr}/metrics"), Duration::from_secs(20))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("body longer than"), "{error}");
}
