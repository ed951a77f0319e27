//! The router's HTTP surface: OpenAI routes, `/v1/models`, `/metrics` and
//! `/health`. Requests are checked in the order a client can fix them:
//! route, key, body size, JSON, model, permission, then forwarded.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

use llmgw_config::BalancePolicy;

use crate::auth::{authenticate, forbidden, may_use};
use crate::endpoints::Registry;
use crate::front::RequestBody;
use crate::metrics::Metrics;
use crate::openai::{ApiError, json_response};
use crate::peek::{PeekError, peek, prefix};
use crate::proxy::{Outgoing, forward, strip_hop_by_hop};
use crate::relay::ResponseBody;
use crate::resume::ResumeMemory;
use crate::settings::Settings;
use crate::table::RoutingTable;
use crate::upstream::Upstream;

/// Everything requests share.
pub struct Shared {
    pub settings: Settings,
    /// The prefix index and its counters (filled under `cache_aware`).
    pub kv: Arc<crate::kv::KvState>,
    /// What resumable streams hold, against `resume.memory_cap_bytes`.
    pub resume_memory: Arc<ResumeMemory>,
    pub upstream: Upstream,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub table: watch::Receiver<Arc<RoutingTable>>,
    /// Asks the control plane for a replica of a model scaled to zero.
    pub waker: Option<Arc<dyn crate::wake::ModelWaker>>,
    /// Requests waiting for such a replica now.
    pub held_requests: std::sync::atomic::AtomicUsize,
    /// Requests waiting for a replica with room.
    pub queues: crate::queue::Queues,
    /// Per-key limits.
    pub limiter: Arc<crate::limits::Limiter>,
    /// What each key used.
    pub usage: Arc<crate::usage::UsageLedger>,
}

/// `x-llmgw-resume: off` turns mid-stream failover off for one request.
const RESUME_HEADER: &str = "x-llmgw-resume";

const PROXIED: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

pub async fn handle(shared: &Arc<Shared>, request: Request<RequestBody>) -> Response<ResponseBody> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::GET, "/health") => text_response(StatusCode::OK, "text/plain", String::new()),
        (&Method::GET, "/metrics") => text_response(StatusCode::OK, "text/plain; version=0.0.4", {
            let mut page = shared
                .metrics
                .render(&shared.registry, &shared.resume_memory);
            shared.kv.render(&mut page, &shared.settings.tokenizers);
            shared.limiter.render(&mut page);
            shared.usage.render(&mut page);
            page
        }),
        (&Method::GET, "/v1/models") => list_models(shared, &request),
        (&Method::POST, p) if PROXIED.contains(&p) => proxy(shared, request).await,
        (_, p) if PROXIED.contains(&p) || p == "/v1/models" => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on {p}", request.method()),
        )
        .into_response(),
        (_, p) => ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_url",
            format!("Unknown request URL: {} {p}", request.method()),
        )
        .into_response(),
    }
}

fn text_response(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<ResponseBody> {
    let mut response = json_response(status, body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn list_models(shared: &Shared, request: &Request<RequestBody>) -> Response<ResponseBody> {
    let table = Arc::clone(&shared.table.borrow());
    let grant = match authenticate(&shared.settings, &table.keys, request.headers(), now_ms()) {
        Ok(grant) => grant,
        Err(e) => return e.into_response(),
    };
    let data: Vec<_> = table
        .models
        .iter()
        .filter(|m| may_use(grant.as_deref(), m))
        .map(|m| {
            serde_json::json!({
                "id": m.name,
                "object": "model",
                "created": 0,
                "owned_by": "llmgw",
                "aliases": m.aliases,
                "ready_endpoints": m.ready_endpoints().count(),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}

async fn proxy(shared: &Arc<Shared>, request: Request<RequestBody>) -> Response<ResponseBody> {
    let (parts, body) = request.into_parts();
    let mut table = Arc::clone(&shared.table.borrow());
    let grant = match authenticate(&shared.settings, &table.keys, &parts.headers, now_ms()) {
        Ok(grant) => grant,
        Err(e) => return e.into_response(),
    };
    let limit = shared.settings.max_body_bytes;
    let too_large = || {
        let mut response = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("The request body is larger than this router's limit of {limit} bytes (max_body_bytes)."),
        )
        .into_response();
        // The rest of the body stays unread, so this connection cannot carry
        // another request: a client told otherwise pools it and its next
        // request fails with "server disconnected".
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    };
    let bytes = match body {
        RequestBody::Complete(bytes) => bytes,
        RequestBody::TooLarge => return too_large(),
    };
    let peeked = match peek(&bytes) {
        Ok(p) => p,
        Err(PeekError::MissingModel) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_model",
                PeekError::MissingModel.to_string(),
            )
            .param("model")
            .into_response();
        }
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
                .into_response();
        }
    };
    let Some(model) = table.resolve(&peeked.model) else {
        shared.metrics.request_refused(&peeked.model, 404);
        return ApiError::model_not_found(&peeked.model).into_response();
    };
    let admitted = match &grant {
        None => crate::limits::Admitted::default(),
        Some(grant) if !may_use(Some(grant), model) => {
            shared.metrics.request_refused(&model.name, 403);
            return forbidden(grant, &peeked.model).into_response();
        }
        Some(grant) => match shared
            .limiter
            .admit(grant, tokio::time::Instant::now(), now_ms())
        {
            Ok(admitted) => admitted,
            Err(refusal) => {
                shared.metrics.request_refused(&model.name, 429);
                return refusal.into_response();
            }
        },
    };
    let limited = model.max_requests_per_replica.is_some();
    if model.wakes_on_request && model.ready_endpoints().next().is_none() {
        let name = model.name.clone();
        if peeked.stream && !shared.settings.held_keep_alive.is_zero() {
            // The client hears from the router while the replica starts.
            let held = crate::wake::HeldRequest {
                parts,
                bytes: bytes.clone(),
                grant,
                admitted,
            };
            return crate::wake::held_stream(Arc::clone(shared), name, held);
        }
        match crate::wake::until_ready(shared, &name).await {
            Ok(ready) => table = ready,
            Err(refusal) => {
                shared
                    .metrics
                    .request_refused(&name, refusal.status.as_u16());
                return refusal.into_response();
            }
        }
    }
    let (table, place) = if limited {
        crate::queue::wait_for_room(shared, &peeked.model, table).await
    } else {
        (table, None)
    };
    let response = dispatch(shared, &table, parts, &bytes, &peeked, grant, admitted).await;
    match place {
        Some(place) => crate::relay::holding(response, place),
        None => response,
    }
}

/// Sends an admitted request to one of its model's engines in `table`,
/// metered and limited as its key says.
pub(crate) async fn dispatch(
    shared: &Arc<Shared>,
    table: &RoutingTable,
    mut parts: hyper::http::request::Parts,
    bytes: &bytes::Bytes,
    peeked: &crate::peek::Peeked<'_>,
    grant: Option<Arc<crate::keys::Grant>>,
    admitted: crate::limits::Admitted,
) -> Response<ResponseBody> {
    let Some(model) = table.resolve(&peeked.model) else {
        return ApiError::model_not_found(&peeked.model).into_response();
    };
    strip_hop_by_hop(&mut parts.headers);
    let resume = parts
        .headers
        .remove(RESUME_HEADER)
        .is_none_or(|v| !matches!(v.as_bytes(), b"off" | b"false" | b"0"));
    parts.headers.remove(HOST);
    parts.headers.remove(CONTENT_LENGTH);
    if grant.is_some() {
        // The router's keys are not the engines'.
        parts.headers.remove(AUTHORIZATION);
    }
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| hyper::http::uri::PathAndQuery::from_static("/"));
    let affinity = peeked
        .prompt
        .map(|p| prefix(p, shared.settings.prefix_bytes));
    let body = if model.maps(&peeked.model) {
        match renamed(bytes, &model.name) {
            Some(body) => body,
            None => bytes.clone(),
        }
    } else {
        bytes.clone()
    };
    // A keyed stream is charged what its engine counted: ask for usage
    // when the client did not, and keep the extra event from the client.
    let mut usage_asked = false;
    let body = if grant.is_some() && peeked.stream {
        match crate::usage::ask_for_usage(&body) {
            Some(asked) => {
                usage_asked = true;
                asked
            }
            None => body,
        }
    } else {
        body
    };
    let tokens = if shared.settings.policy == BalancePolicy::CacheAware {
        crate::kv::request_tokens(shared, model, bytes, &[]).await
    } else {
        None
    };
    let outgoing = Outgoing {
        path,
        headers: parts.headers,
        body,
        prefix: affinity,
        tokens,
        stream: peeked.stream,
        resume,
    };
    let response = forward(shared, model, outgoing).await;
    let response = match &grant {
        None => response,
        Some(grant) => {
            let status = response.status().as_u16();
            response.map(|body| {
                let charge = grant
                    .limits
                    .tokens_per_minute
                    .map(|_| Arc::clone(&shared.limiter));
                shared
                    .usage
                    .meter(&grant.name, &grant.team, &model.name, status, body)
                    .charging(charge)
                    .stripping_usage(usage_asked && status == 200)
                    .boxed_unsync()
            })
        }
    };
    admitted.attach(response)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The request with its `model` set to `name`: for an alias the engine was
/// launched without. Only such requests pay for the rewrite.
fn renamed(body: &[u8], name: &str) -> Option<bytes::Bytes> {
    let mut request: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).ok()?;
    request.insert(
        "model".to_owned(),
        serde_json::Value::String(name.to_owned()),
    );
    serde_json::to_vec(&request).ok().map(bytes::Bytes::from)
}
