//! API keys: created, listed, changed, rotated and revoked here, enforced
//! by every router from the replicated record.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use bytes::Bytes;
use llmgw_api::keys::{
    ApiKeyRecord, IssuedKey, KeyRequest, KeyView, SECRET_PREFIX, secret_digest, shown_prefix,
};
use llmgw_raft::now_ms;
use llmgw_state::{Command, check_key_name};
use rand::Rng;

use super::{ApiError, ApiState, ReadQuery};

/// Every key, revoked ones included. Digests only: a read token (which
/// routers hold) can check a presented secret but not recover one.
pub async fn list(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<Vec<KeyView>>, ApiError> {
    state.before_read(&query).await?;
    let now_ms = now_ms();
    Ok(Json(state.control.read(|fleet| {
        fleet
            .api_keys
            .values()
            .map(|key| view(fleet, key, now_ms))
            .collect()
    })))
}

pub async fn get_one(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<KeyView>, ApiError> {
    state.before_read(&query).await?;
    let now_ms = now_ms();
    state
        .control
        .read(|fleet| {
            fleet
                .api_keys
                .get(&name)
                .map(|key| view(fleet, key, now_ms))
        })
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("there is no API key {name}")))
}

/// The key with what it spent today and this month.
fn view(fleet: &llmgw_state::FleetState, key: &ApiKeyRecord, now_ms: u64) -> KeyView {
    KeyView {
        key: key.clone(),
        spent: fleet.usage.spent(&key.name, now_ms),
        shares: fleet.usage.shares(&key.name, now_ms),
    }
}

pub async fn create(
    State(state): State<ApiState>,
    body: Bytes,
) -> Result<(StatusCode, Json<IssuedKey>), ApiError> {
    let request = parse("POST /api/v1/keys", &body)?;
    if let Some(why) = check_key_name(&request.name) {
        return Err(ApiError::bad_request(format!(
            "POST /api/v1/keys: name: {why}"
        )));
    }
    let secret = new_secret();
    let key = ApiKeyRecord {
        name: request.name.clone(),
        settings: request.settings(),
        secret_sha256: secret_digest(&secret),
        secret_prefix: shown_prefix(&secret),
        created_at_ms: now_ms(),
        rotated_at_ms: None,
        revoked_at_ms: None,
    };
    state
        .control
        .write(Command::CreateApiKey {
            key: key.clone(),
            at_ms: key.created_at_ms,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(IssuedKey { secret, key })))
}

pub async fn update(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<ApiKeyRecord>, ApiError> {
    let what = format!("PUT /api/v1/keys/{name}");
    let request = parse(&what, &body)?;
    if !request.name.is_empty() && request.name != name {
        return Err(ApiError::bad_request(format!(
            "{what}: the body names key {}; a key is not renamed",
            request.name
        )));
    }
    state
        .control
        .write(Command::UpdateApiKey {
            name: name.clone(),
            settings: request.settings(),
            at_ms: now_ms(),
        })
        .await?;
    read_back(&state, &name)
}

pub async fn rotate(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<IssuedKey>, ApiError> {
    let secret = new_secret();
    state
        .control
        .write(Command::RotateApiKey {
            name: name.clone(),
            secret_sha256: secret_digest(&secret),
            secret_prefix: shown_prefix(&secret),
            at_ms: now_ms(),
        })
        .await?;
    let Json(key) = read_back(&state, &name)?;
    Ok(Json(IssuedKey { secret, key }))
}

pub async fn revoke(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<ApiKeyRecord>, ApiError> {
    state
        .control
        .write(Command::RevokeApiKey {
            name: name.clone(),
            at_ms: now_ms(),
        })
        .await?;
    read_back(&state, &name)
}

fn parse(what: &str, body: &[u8]) -> Result<KeyRequest, ApiError> {
    KeyRequest::from_json(body).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// The key as this peer applied it: a write returns once applied here.
fn read_back(state: &ApiState, name: &str) -> Result<Json<ApiKeyRecord>, ApiError> {
    state
        .control
        .read(|fleet| fleet.api_keys.get(name).cloned())
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("there is no API key {name}")))
}

/// 256 random bits from the thread's CSPRNG (seeded by the OS), in hex.
fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    let mut secret = String::from(SECRET_PREFIX);
    for byte in bytes {
        secret.push_str(&format!("{byte:02x}"));
    }
    secret
}
