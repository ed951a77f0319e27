//! The web console at `/ui`: plain HTML, CSS and JavaScript embedded in the
//! binary, reading the admin API like any client, and `GET
//! /api/v1/events`, the server-sent events that tell it when to read again.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use futures::Stream;
use llmgw_api::StateEvent;
use llmgw_raft::WatchReceiver;

use super::ApiState;

const INDEX: &str = include_str!("console/index.html");
const APP: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// Console assets: no token needed, they hold no data.
pub fn is_asset(path: &str) -> bool {
    matches!(path, "/ui" | "/ui/" | "/ui/app.js" | "/ui/style.css")
}

pub async fn root() -> Redirect {
    Redirect::permanent("/ui/")
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

pub async fn app() -> Response {
    asset("text/javascript; charset=utf-8", APP)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Scripts from this origin only; no inline script, no framing.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Changes closer together than this go out as one event.
const COALESCE: Duration = Duration::from_millis(200);
/// Without a change, an event this often anyway: heartbeat ages and the
/// agents' streams live outside the replicated state.
const REFRESH: Duration = Duration::from_secs(5);

/// `GET /api/v1/events`: a `state` event when the leader, the term or the
/// applied index change (at most one per 200 ms), and every 5 s.
pub async fn events(
    State(state): State<ApiState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let metrics = state.control.raft().metrics();
    let stopping = state.stopping.clone();
    let start = (metrics, stopping, true);
    let stream = futures::stream::unfold(start, |(mut metrics, mut stopping, first)| async move {
        if *stopping.borrow() {
            return None;
        }
        if !first {
            tokio::select! {
                changed = metrics.changed() => {
                    changed.ok()?;
                    tokio::time::sleep(COALESCE).await;
                }
                () = tokio::time::sleep(REFRESH) => {}
                // The only change is to true: the peer stops.
                _ = stopping.changed() => return None,
            }
        }
        let now = {
            let m = metrics.borrow_and_update();
            StateEvent {
                leader_id: m.current_leader,
                term: m.current_term,
                applied_index: m.last_applied.map(|id| id.index),
            }
        };
        let event = Event::default()
            .event("state")
            .json_data(&now)
            .unwrap_or_else(|_| Event::default().event("state").data("{}"));
        Some((Ok(event), (metrics, stopping, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
