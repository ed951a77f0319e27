//! Requests for a model scaled to zero: held while a replica starts, not
//! refused. The router asks the control plane for a replica (through the
//! [`ModelWaker`] it was given) and waits for one to be ready in its
//! routing table, up to `hold_for_replica`; past `max_held_requests` held
//! at once, or past the wait, the client gets a 503 with `Retry-After`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hyper::StatusCode;

use crate::openai::ApiError;
use crate::service::Shared;
use crate::table::RoutingTable;

/// Asks the control plane for a replica of a model scaled to zero. Called
/// for every held request: implementations coalesce.
pub trait ModelWaker: Send + Sync + 'static {
    fn wake(&self, model: &str);
}

/// Seconds a client is told to wait before trying again.
const RETRY_AFTER_S: u64 = 10;

/// Holds the request until `model` has a ready replica: the routing table
/// that has it, or the refusal to send.
pub(crate) async fn until_ready(
    shared: &Shared,
    model: &str,
) -> Result<Arc<RoutingTable>, ApiError> {
    let held = shared.held_requests.fetch_add(1, Ordering::Relaxed) + 1;
    let _release = Release(shared);
    let limit = shared.settings.max_held_requests;
    if held > limit {
        return Err(unavailable(format!(
            "model `{model}` is starting from zero replicas and {limit} requests already wait for it; retry in {RETRY_AFTER_S}s"
        )));
    }
    match &shared.waker {
        Some(waker) => waker.wake(model),
        None => tracing::debug!(
            model,
            "holding a request for a model scaled to zero; this router cannot ask for a replica, others may"
        ),
    }
    tracing::info!(
        model,
        held,
        "holding a request while a replica of the model starts (scaled to zero)"
    );
    let mut table = shared.table.clone();
    let deadline = tokio::time::Instant::now() + shared.settings.hold_for_replica;
    loop {
        let now = Arc::clone(&table.borrow_and_update());
        match now.resolve(model) {
            Some(routed) if routed.ready_endpoints().next().is_some() => return Ok(now),
            Some(_) => {}
            None => return Err(ApiError::model_not_found(model)),
        }
        if tokio::time::timeout_at(deadline, table.changed())
            .await
            .map_or(true, |changed| changed.is_err())
        {
            return Err(unavailable(format!(
                "no replica of model `{model}` became ready within {}s of this request (it was scaled to zero); retry in {RETRY_AFTER_S}s",
                shared.settings.hold_for_replica.as_secs()
            )));
        }
    }
}

fn unavailable(message: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_starting", message)
        .retry_after(RETRY_AFTER_S)
}

/// Counts a held request out when it stops waiting.
struct Release<'a>(&'a Shared);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.held_requests.fetch_sub(1, Ordering::Relaxed);
    }
}
