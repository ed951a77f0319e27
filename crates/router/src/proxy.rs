//! Forwarding one OpenAI request to an engine: choose an endpoint, send the
//! client's bytes unchanged, and move to another endpoint when the attempt
//! fails before anything reached the client (connection failure, 5xx, 429,
//! or a body cut before its first byte).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Body;
use hyper::header::{CONTENT_TYPE, HeaderMap};
use hyper::http::uri::PathAndQuery;
use hyper::{Method, Response, StatusCode};

use crate::balance::{Affinity, choose};
use crate::endpoints::EndpointStats;
use crate::openai::ApiError;
use crate::relay::{Finish, Relay, ResponseBody};
use crate::resume::{Resumable, route_of};
use crate::service::Shared;
use crate::table::RoutedModel;
use crate::upstream::UpstreamBody;

/// What the router needs to know about the client's request.
pub struct Outgoing<'a> {
    pub path: PathAndQuery,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub prefix: Option<&'a str>,
    /// The prompt's token ids, under `cache_aware` when an engine of the
    /// model publishes KV events.
    pub tokens: Option<Vec<u32>>,
    /// The client asked for server-sent events.
    pub stream: bool,
    /// The client did not turn mid-stream failover off.
    pub resume: bool,
}

/// Headers that describe one connection, not the message; never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

enum Attempt {
    /// Hand this to the client.
    Answer(Response<ResponseBody>),
    /// Try another endpoint; this is why, and what to say if none is left.
    Retry(&'static str, ApiError),
}

pub async fn forward(
    shared: &Arc<Shared>,
    model: &RoutedModel,
    outgoing: Outgoing<'_>,
) -> Response<ResponseBody> {
    let settings = &shared.settings;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + settings.request_timeout;
    let mut pool = candidates(shared, model, &[]);
    if pool.is_empty() {
        let reason = model.unavailable_reason.clone().unwrap_or_else(|| {
            if model.endpoints.is_empty() {
                "no replica is placed yet".to_string()
            } else {
                format!("all {} replicas are draining", model.endpoints.len())
            }
        });
        shared.metrics.request_refused(&model.name, 503);
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_ready_replica",
            format!("No ready replica of model `{}`: {reason}", model.name),
        )
        .into_response();
    }
    if let Some(most) = model.max_requests_per_replica
        && pool.iter().any(|e| e.outstanding() < most)
    {
        // Balanced among the replicas with room, so none gets more than
        // its share while another has places free.
        pool.retain(|e| e.outstanding() < most);
    }
    shared.metrics.request_started(&model.name);
    let attempts = settings.max_retries as usize + 1;
    let mut last_error = None;
    for attempt in 0..attempts {
        let deciding = Instant::now();
        let uncached = outgoing
            .tokens
            .as_deref()
            .and_then(|tokens| crate::kv::uncached_tokens(shared, &pool, tokens));
        let affinity = match (&uncached, outgoing.prefix) {
            (Some(uncached), _) => Affinity::Cache {
                uncached,
                load_weight_tokens: settings.load_weight_tokens,
            },
            (None, Some(prefix)) => Affinity::Prefix(prefix),
            (None, None) => Affinity::None,
        };
        let Some(index) = choose(settings.policy, &pool, affinity, settings.load_factor) else {
            break;
        };
        if let (Some(uncached), Some(tokens), 0) = (&uncached, &outgoing.tokens, attempt) {
            crate::kv::count_decision(
                shared,
                tokens.len() as u64,
                uncached[index],
                deciding.elapsed(),
            );
        }
        let endpoint = pool.swap_remove(index);
        let result = tokio::time::timeout_at(
            deadline,
            attempt_once(shared, model, &outgoing, &endpoint, started, deadline),
        )
        .await;
        match result {
            Ok(Attempt::Answer(response)) => return response,
            Ok(Attempt::Retry(reason, error)) => {
                if attempt + 1 < attempts && !pool.is_empty() {
                    shared.metrics.retry(&model.name, reason);
                    tracing::debug!(model = %model.name, endpoint = %endpoint.url, reason, "retrying on another endpoint");
                }
                last_error = Some(error);
            }
            Err(_elapsed) => {
                last_error = Some(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    format!(
                        "no answer from the engines of `{}` within the request deadline ({:?})",
                        model.name, settings.request_timeout
                    ),
                ));
                break;
            }
        }
    }
    let error = last_error.unwrap_or_else(|| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unavailable",
            "no endpoint could be tried",
        )
    });
    shared.metrics.request_finished(
        &model.name,
        crate::metrics::NO_ENDPOINT,
        error.status.as_u16(),
        started.elapsed(),
    );
    error.into_response()
}

/// The ready endpoints of `model` not in `exclude`. Ejected endpoints are
/// left out while any healthy one is left; when all are ejected they are
/// still tried rather than refusing outright.
pub(crate) fn candidates(
    shared: &Shared,
    model: &RoutedModel,
    exclude: &[String],
) -> Vec<Arc<EndpointStats>> {
    let ready: Vec<Arc<EndpointStats>> = model
        .ready_endpoints()
        .filter(|e| !exclude.contains(&e.url))
        .map(|e| shared.registry.get(&e.url))
        .collect();
    if ready.iter().all(|e| e.is_ejected()) {
        return ready;
    }
    ready.into_iter().filter(|e| !e.is_ejected()).collect()
}

async fn attempt_once(
    shared: &Arc<Shared>,
    model: &RoutedModel,
    outgoing: &Outgoing<'_>,
    endpoint: &Arc<EndpointStats>,
    started: Instant,
    deadline: tokio::time::Instant,
) -> Attempt {
    let settings = &shared.settings;
    let in_flight = endpoint.start_request();
    let response = match send_to(
        shared,
        endpoint,
        &outgoing.path,
        &outgoing.headers,
        &outgoing.body,
        outgoing.stream.then_some(settings.stall_timeout),
    )
    .await
    {
        Ok(response) => response,
        Err((reason, error)) => return Attempt::Retry(reason, error),
    };
    let status = response.status();
    let fail = |code: &'static str, message: String| failure(shared, endpoint, code, message);
    // A 4xx is the request's fault, not the engine's: it never counts
    // towards ejection, and proves the engine alive.
    let (parts, mut body) = response.into_parts();
    let first = if body.is_end_stream() {
        None
    } else {
        let wait = tokio::time::timeout(settings.stall_timeout, body.frame()).await;
        match wait {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                let message = format!(
                    "the engine at {} closed before answering: {e}",
                    endpoint.url
                );
                return Attempt::Retry(
                    "cut_before_first_byte",
                    fail("upstream_unavailable", message),
                );
            }
            Err(_) => {
                let message = format!(
                    "the engine at {} sent no data for {:?} (stall timeout)",
                    endpoint.url, settings.stall_timeout
                );
                return Attempt::Retry(
                    "stall_before_first_byte",
                    fail("upstream_timeout", message),
                );
            }
        }
    };
    if first.is_some() {
        shared.metrics.first_token(&model.name, started.elapsed());
    }
    let sse = answers_with_events(status, &parts.headers, outgoing.stream);
    let finish = Finish {
        metrics: Arc::clone(&shared.metrics),
        model: model.name.clone(),
        status: status.as_u16(),
        started,
        in_flight,
        failure_threshold: settings.consecutive_failures,
    };
    let resume = resumable(shared, model, outgoing, sse);
    let relay = Relay::new(
        first,
        body,
        settings.stall_timeout,
        deadline,
        sse,
        resume,
        finish,
    );
    let mut response = Response::from_parts(parts, relay.boxed_unsync());
    strip_hop_by_hop(response.headers_mut());
    Attempt::Answer(response)
}

/// Whether the engine answered with a stream of events: a success that says
/// so, or says nothing to a request that asked for a stream. An error (a
/// prompt too long, an unknown model) to a streamed request is one JSON
/// document and passes to the client as it came.
fn answers_with_events(status: StatusCode, headers: &HeaderMap, asked_for_stream: bool) -> bool {
    if !status.is_success() {
        return false;
    }
    match headers.get(CONTENT_TYPE) {
        Some(value) => value
            .as_bytes()
            .get(..17)
            .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream")),
        None => asked_for_stream,
    }
}

/// The resumption state for a stream that may be continued elsewhere if
/// its engine fails; None for answers that cannot be.
fn resumable(
    shared: &Arc<Shared>,
    model: &RoutedModel,
    outgoing: &Outgoing<'_>,
    sse: bool,
) -> Option<Box<Resumable>> {
    if !(shared.settings.resume.enabled && outgoing.resume && outgoing.stream && sse) {
        return None;
    }
    let route = route_of(outgoing.path.path())?;
    match Resumable::new(
        shared,
        &model.name,
        route,
        &outgoing.path,
        &outgoing.headers,
        &outgoing.body,
    ) {
        Ok(resumable) => Some(Box::new(resumable)),
        Err(reason) => {
            shared.metrics.resumption(&model.name, reason);
            None
        }
    }
}

/// Counts a failure against `endpoint` (ejecting it after enough in a
/// row) and says what went wrong.
fn failure(
    shared: &Shared,
    endpoint: &EndpointStats,
    code: &'static str,
    message: String,
) -> ApiError {
    let threshold = shared.settings.consecutive_failures;
    if endpoint.record_failure(threshold) {
        shared.metrics.ejection(&endpoint.url);
        tracing::warn!(endpoint = %endpoint.url, "endpoint ejected after {threshold} consecutive failures");
    }
    ApiError::new(StatusCode::BAD_GATEWAY, code, message)
}

/// Sends one POST to `endpoint`. An answer that makes another endpoint
/// worth trying (no connection, 5xx, 429, no head within `head_within`)
/// is an Err with the reason for the retry metric. A streamed answer's
/// head comes before its first token, so a stream's head is bounded by
/// the stall timeout; a whole answer's head comes with the answer, which
/// only the deadline bounds.
pub(crate) async fn send_to(
    shared: &Shared,
    endpoint: &EndpointStats,
    path: &PathAndQuery,
    headers: &HeaderMap,
    body: &[u8],
    head_within: Option<std::time::Duration>,
) -> Result<Response<UpstreamBody>, (&'static str, ApiError)> {
    let Some(authority) = endpoint.authority.as_deref() else {
        return Err((
            "bad_endpoint",
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unavailable",
                format!("endpoint {:?} is not a plain http URL", endpoint.url),
            ),
        ));
    };
    let send = shared
        .upstream
        .send(&Method::POST, authority, path.as_str(), headers, body);
    let sent = match head_within {
        None => send.await,
        Some(limit) => match tokio::time::timeout(limit, send).await {
            Ok(sent) => sent,
            Err(_) => {
                let message = format!(
                    "the engine at {} sent no response head for {limit:?} (stall timeout)",
                    endpoint.url
                );
                return Err((
                    "stall_before_first_byte",
                    failure(shared, endpoint, "upstream_timeout", message),
                ));
            }
        },
    };
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            let message = format!(
                "could not reach the engine at {}: {}",
                endpoint.url,
                error_chain(&e)
            );
            return Err((
                "connect",
                failure(shared, endpoint, "upstream_unavailable", message),
            ));
        }
    };
    let status = response.status();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        let body = response.into_body();
        // Error bodies are small; the cap keeps a misbehaving engine from
        // making the router buffer a stream.
        let read = Limited::new(body, 64 * 1024).collect();
        let bytes = tokio::time::timeout(shared.settings.stall_timeout, read)
            .await
            .ok()
            .and_then(Result::ok)
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let reason = if status.is_server_error() {
            failure(shared, endpoint, "upstream_error", String::new());
            "status_5xx"
        } else {
            "status_429"
        };
        let mut error = ApiError::new(
            status,
            "upstream_error",
            format!("the engine at {} answered {status}", endpoint.url),
        );
        // Keep the engine's own error text for the client if this was the
        // last try (vLLM answers 500 with an empty body when its engine
        // dies).
        if !bytes.is_empty()
            && let Ok(text) = std::str::from_utf8(&bytes)
        {
            error.message = format!("the engine at {} answered {status}: {text}", endpoint.url);
        }
        return Err((reason, error));
    }
    Ok(response)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
