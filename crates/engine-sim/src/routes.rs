//! The engines' HTTP routes: OpenAI-compatible ones and each engine's own,
//! with each engine's auth rules and error shapes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request};
use tokio::sync::mpsc;

use crate::generate::{self, Stop};
use crate::http::{self, Handler, HandlerResult, SimResponse, StreamCut};
use crate::knobs::Fault;
use crate::persona::Engine;
use crate::plan::{self, Rejection};
use crate::state::{EngineState, Phase};
use crate::wire::{self, Route};

/// The full server of a serving engine process.
pub struct EngineApp {
    pub state: Arc<EngineState>,
}

/// SGLang's non-zero ranks: `/health`, `/health_generate`, `/ping` always 200.
pub struct DummyHealthApp {
    pub state: Arc<EngineState>,
}

const NOT_FOUND: &str = "{\"detail\":\"Not Found\"}";
const METHOD_NOT_ALLOWED: &str = "{\"detail\":\"Method Not Allowed\"}";
const UNAUTHORIZED: &str = "{\"error\":\"Unauthorized\"}";
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Handler for DummyHealthApp {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> HandlerResult {
        Ok(match http::path_of(&req) {
            "/health" | "/health_generate" | "/ping" => http::empty(200),
            "/metrics" if self.state.cfg.enable_metrics => http::text(
                200,
                PROMETHEUS,
                self.state
                    .metrics
                    .render_sglang(self.state.cfg.first_name(), self.state.gauges()),
            ),
            _ => http::json(404, NOT_FOUND),
        })
    }
}

impl Handler for EngineApp {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> HandlerResult {
        let engine = self.state.cfg.persona.engine;
        if !self.authorised(&req) {
            return Ok(http::json(401, UNAUTHORIZED));
        }
        let path = http::path_of(&req).to_string();
        let method = req.method().clone();
        match engine {
            Engine::Vllm => self.vllm_route(&method, &path, req).await,
            Engine::Sglang => self.sglang_route(&method, &path, req).await,
        }
    }
}

impl EngineApp {
    /// vLLM guards only `/v1/*`; SGLang everything but health and metrics.
    fn authorised(&self, req: &Request<Incoming>) -> bool {
        let keys = &self.state.cfg.api_keys;
        if keys.is_empty() {
            return true;
        }
        let path = http::path_of(req);
        let guarded = match self.state.cfg.persona.engine {
            Engine::Vllm => path.starts_with("/v1"),
            Engine::Sglang => !(path.starts_with("/health") || path == "/metrics"),
        };
        !guarded || http::bearer(req).is_some_and(|token| keys.iter().any(|k| k == token))
    }

    fn error(&self, rejection: &Rejection) -> SimResponse {
        http::json(
            rejection.status,
            wire::error_body(
                self.state.cfg.persona.engine,
                &rejection.message,
                rejection.kind,
                rejection.status,
            ),
        )
    }

    async fn vllm_route(
        &self,
        method: &Method,
        path: &str,
        req: Request<Incoming>,
    ) -> HandlerResult {
        let s = &self.state;
        let get = method == Method::GET;
        let post = method == Method::POST;
        Ok(match path {
            "/health" if get => self.health().await,
            "/ping" if get || post => self.health().await,
            "/version" if get => http::json(
                200,
                format!("{{\"version\":\"{}\"}}", s.cfg.persona.version_string()),
            ),
            "/load" if get => {
                let load = if s.cfg.enable_load_tracking {
                    s.in_flight()
                } else {
                    0
                };
                http::json(200, format!("{{\"server_load\":{load}}}"))
            }
            "/metrics" if get && s.cfg.knobs.faults.contains(&Fault::MetricsError) => {
                http::text(500, "text/plain", "Internal Server Error")
            }
            "/metrics" if get => http::text(
                200,
                PROMETHEUS,
                s.metrics.render_vllm(
                    s.cfg.first_name(),
                    s.gauges(),
                    s.cfg.show_hidden_metrics,
                    !s.cfg.persona.at_least((0, 12, 0)),
                ),
            ),
            "/v1/models" if get => http::json(200, self.models_body()),
            // vLLM's development endpoints: sleep mode.
            "/sleep" if post && s.cfg.dev_mode => {
                let query = req.uri().query().unwrap_or("").to_owned();
                crate::sleep::sleep(s, &query).await
            }
            "/wake_up" if post && s.cfg.dev_mode => crate::sleep::wake_up(s).await,
            "/is_sleeping" if get && s.cfg.dev_mode => crate::sleep::is_sleeping(s),
            "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings"
                if post && crate::sleep::is_asleep(s) =>
            {
                crate::sleep::refused_while_asleep()
            }
            "/v1/chat/completions" if post => return self.generate(Route::Chat, req).await,
            "/v1/completions" if post => return self.generate(Route::Completion, req).await,
            "/v1/embeddings" if post => return self.embeddings(req).await,
            "/tokenize" if post => return self.tokenize(req).await,
            "/health"
            | "/ping"
            | "/version"
            | "/load"
            | "/metrics"
            | "/v1/models"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings" => http::json(405, METHOD_NOT_ALLOWED),
            _ => http::json(404, NOT_FOUND),
        })
    }

    async fn sglang_route(
        &self,
        method: &Method,
        path: &str,
        req: Request<Incoming>,
    ) -> HandlerResult {
        let s = &self.state;
        let get = method == Method::GET;
        let post = method == Method::POST;
        Ok(match path {
            "/health" | "/health_generate" if get => self.health().await,
            "/ping" if get => http::empty(200),
            "/version" if get => http::json(
                200,
                format!("{{\"version\":\"{}\"}}", s.cfg.persona.version_string()),
            ),
            "/model_info" | "/get_model_info" if get => http::json(200, self.model_info()),
            "/server_info" | "/get_server_info" if get => http::json(200, self.server_info()),
            "/get_load" | "/v1/loads" if get => {
                let g = s.gauges();
                http::json(
                    200,
                    format!(
                        "[{{\"num_reqs\":{},\"num_waiting_reqs\":{},\"num_tokens\":{},\"dp_rank\":0}}]",
                        g.running, g.waiting, g.kv_tokens_used
                    ),
                )
            }
            "/flush_cache" if get || post => {
                if s.in_flight() == 0 {
                    s.clear_prefix_caches();
                }
                http::text(
                    200,
                    "text/plain",
                    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n",
                )
            }
            "/metrics" if get && s.cfg.knobs.faults.contains(&Fault::MetricsError) => {
                http::text(500, "text/plain", "Internal Server Error")
            }
            "/metrics" if get && s.cfg.enable_metrics => http::text(
                200,
                PROMETHEUS,
                s.metrics.render_sglang(s.cfg.first_name(), s.gauges()),
            ),
            "/v1/models" if get => http::json(200, self.models_body()),
            "/v1/chat/completions" if post => return self.generate(Route::Chat, req).await,
            "/v1/completions" if post => return self.generate(Route::Completion, req).await,
            "/v1/embeddings" if post => return self.embeddings(req).await,
            "/tokenize" | "/v1/tokenize" if post => return self.tokenize(req).await,
            _ => http::json(404, NOT_FOUND),
        })
    }

    /// `/health`: 200 with an empty body, 503 while starting, draining or dead.
    async fn health(&self) -> SimResponse {
        let s = &self.state;
        let faults = &s.cfg.knobs.faults;
        match s.phase() {
            Phase::Serving if faults.contains(&crate::knobs::Fault::Unhealthy) => http::empty(503),
            Phase::Serving => {
                if s.cfg.persona.engine == Engine::Sglang
                    && faults.contains(&crate::knobs::Fault::Stall)
                {
                    // SGLang's health check generates one token; a stalled
                    // scheduler never answers, so it times out and the
                    // server marks itself UnHealthy.
                    let timeout = std::env::var("SGLANG_HEALTH_CHECK_TIMEOUT")
                        .ok()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(20.0);
                    let wait =
                        Duration::try_from_secs_f64(timeout).unwrap_or(Duration::from_secs(20));
                    tokio::time::sleep(wait).await;
                    s.log.sglang(
                        None,
                        &format!("Health check failed. Server couldn't get a response from detokenizer for last {timeout} seconds. tic start time: 0. last_heartbeat time: 0"),
                    );
                    s.set_phase(Phase::Unhealthy);
                    return http::empty(503);
                }
                http::empty(200)
            }
            Phase::Starting | Phase::Draining | Phase::Dead | Phase::Unhealthy => http::empty(503),
        }
    }

    fn models_body(&self) -> String {
        let s = &self.state;
        let cards: Vec<String> = s
            .cfg
            .served_names
            .iter()
            .map(|name| match s.cfg.persona.engine {
                Engine::Vllm => format!(
                    "{{\"id\":{},\"object\":\"model\",\"created\":{},\"owned_by\":\"vllm\",\"root\":{},\"parent\":null,\"max_model_len\":{},\"permission\":[{{\"id\":\"modelperm-{:032x}\",\"object\":\"model_permission\",\"created\":{},\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,\"is_blocking\":false}}]}}",
                    wire::js(name),
                    s.created_unix,
                    wire::js(&s.cfg.model),
                    s.max_model_len,
                    s.cfg.knobs.seed as u128 ^ name.len() as u128,
                    s.created_unix
                ),
                Engine::Sglang => format!(
                    "{{\"id\":{},\"object\":\"model\",\"created\":{},\"owned_by\":\"sglang\",\"root\":{},\"max_model_len\":{}}}",
                    wire::js(name),
                    s.created_unix,
                    wire::js(&s.cfg.model),
                    s.max_model_len
                ),
            })
            .collect();
        format!("{{\"object\":\"list\",\"data\":[{}]}}", cards.join(","))
    }

    fn model_info(&self) -> String {
        let s = &self.state;
        let spec = crate::models::find(&s.cfg.model);
        let (model_type, arch) = spec
            .map(|m| (m.model_type, m.architecture))
            .unwrap_or_default();
        format!(
            "{{\"model_path\":{},\"tokenizer_path\":{},\"is_generation\":{},\"preferred_sampling_params\":null,\"weight_version\":\"default\",\"has_image_understanding\":false,\"has_audio_understanding\":false,\"model_type\":{},\"architectures\":[{}]}}",
            wire::js(&s.cfg.model),
            wire::js(&s.cfg.model),
            !s.embedding_only(),
            wire::js(&model_type),
            wire::js(&arch)
        )
    }

    fn server_info(&self) -> String {
        let s = &self.state;
        let c = &s.cfg;
        let g = s.gauges();
        serde_json::json!({
            "model_path": c.model,
            "tokenizer_path": c.model,
            "host": c.host,
            "port": c.port,
            "served_model_name": c.first_name(),
            "tp_size": c.tp,
            "pp_size": c.pp,
            "dp_size": c.dp,
            "nnodes": c.nnodes,
            "node_rank": c.node_rank,
            "dist_init_addr": c.rendezvous,
            "mem_fraction_static": c.memory_fraction,
            "max_running_requests": c.max_num_seqs,
            "context_length": s.max_model_len,
            "enable_metrics": c.enable_metrics,
            "skip_server_warmup": c.skip_warmup,
            "api_key": if c.api_keys.is_empty() { serde_json::Value::Null } else { "******".into() },
            "max_total_num_tokens": s.kv_capacity,
            "internal_states": [{
                "max_total_num_tokens": s.kv_capacity,
                "num_running_reqs": g.running,
                "num_waiting_reqs": g.waiting,
                "token_usage": g.kv_usage,
                "last_gen_throughput": g.gen_throughput,
            }],
            "version": c.persona.version_string(),
        })
        .to_string()
    }

    async fn generate(&self, route: Route, req: Request<Incoming>) -> HandlerResult {
        let s = &self.state;
        if s.phase() == Phase::Dead {
            return Ok(http::empty(500));
        }
        let body = match http::read_body(req.into_body()).await {
            Ok(b) => b,
            Err(message) => return Ok(self.error(&Rejection::bad_request(message))),
        };
        if s.embedding_only() {
            return Ok(self.error(&Rejection::bad_request(
                "The model does not support Chat Completions API".to_string(),
            )));
        }
        let plan = match plan::plan(s, route, &body) {
            Ok(plan) => plan,
            Err(rejection) => return Ok(self.error(&rejection)),
        };
        if plan.stream {
            let (tx, rx) = mpsc::channel(16);
            tokio::spawn(generate::run_stream(s.clone(), plan, tx));
            let content_type = match s.cfg.persona.engine {
                Engine::Vllm => "text/event-stream; charset=utf-8",
                Engine::Sglang => "text/event-stream",
            };
            let guard = crate::state::OpenStream::new(s.clone());
            return Ok(http::event_stream(content_type, rx, Some(Box::new(guard))));
        }
        match generate::run_full(s.clone(), plan).await {
            Ok(body) => Ok(http::json(200, body)),
            // The engine died under the request: vLLM answers 500, empty.
            Err(Stop::EngineDead) => Ok(http::empty(500)),
            Err(stop) => Err(StreamCut(stop)),
        }
    }

    /// `/tokenize`: a chat's or a prompt's token ids as the model sees
    /// them, in the shape both engines answer.
    async fn tokenize(&self, req: Request<Incoming>) -> HandlerResult {
        let s = &self.state;
        let body = match http::read_body(req.into_body()).await {
            Ok(b) => b,
            Err(message) => return Ok(self.error(&Rejection::bad_request(message))),
        };
        let request: plan::GenRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return Ok(self.error(&Rejection::bad_request(format!("JSON decode error: {e}"))));
            }
        };
        let ids = match plan::prompt_token_ids(s, &request, &body) {
            Ok(ids) => ids,
            Err(rejection) => return Ok(self.error(&rejection)),
        };
        let mut answer = serde_json::json!({
            "count": ids.len(),
            "max_model_len": s.max_model_len,
            "tokens": ids,
        });
        if s.cfg.persona.is_vllm() {
            answer["token_strs"] = serde_json::Value::Null;
        }
        Ok(http::json(200, answer.to_string()))
    }

    async fn embeddings(&self, req: Request<Incoming>) -> HandlerResult {
        let s = &self.state;
        let body = match http::read_body(req.into_body()).await {
            Ok(b) => b,
            Err(message) => return Ok(self.error(&Rejection::bad_request(message))),
        };
        if !s.embedding_only() {
            return Ok(self.error(&Rejection::bad_request(
                "The model does not support Embeddings API",
            )));
        }
        match crate::embed::respond(s, &body) {
            Ok(body) => {
                s.metrics.requests_total.fetch_add(1, Ordering::Relaxed);
                Ok(http::json(200, body))
            }
            Err(rejection) => Ok(self.error(&rejection)),
        }
    }
}
