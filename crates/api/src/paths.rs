//! Where each resource lives, relative to a peer's admin base URL.

pub const CLUSTER: &str = "/api/v1/cluster";
pub const CLUSTER_PEERS: &str = "/api/v1/cluster/peers";
pub const NODES: &str = "/api/v1/nodes";
pub const REPLICAS: &str = "/api/v1/replicas";
pub const MODELS: &str = "/api/v1/models";
/// `GET` lists API keys (digests, never secrets); `POST` creates one.
pub const KEYS: &str = "/api/v1/keys";
/// `GET` API keys' usage per day (`?days=N`); `POST` a router's report.
pub const USAGE: &str = "/api/v1/usage";
pub const SNAPSHOT: &str = "/api/v1/snapshot";
pub const EVENTS: &str = "/api/v1/events";
pub const READYZ: &str = "/readyz";
pub const HEALTHZ: &str = "/healthz";
pub const METRICS: &str = "/metrics";

pub fn node(id: &str) -> String {
    format!("{NODES}/{id}")
}

/// `action` is `cordon`, `uncordon` or `drain`.
pub fn node_action(id: &str, action: &str) -> String {
    format!("{NODES}/{id}/{action}")
}

pub fn model(name: &str) -> String {
    format!("{MODELS}/{name}")
}

pub fn rollout(name: &str) -> String {
    format!("{MODELS}/{name}/rollout")
}

pub fn rollback(name: &str) -> String {
    format!("{MODELS}/{name}/rollback")
}

/// `POST`: a request waits for the model, scaled to zero; a read token
/// may ask (routers hold one).
pub fn wake(name: &str) -> String {
    format!("{MODELS}/{name}/wake")
}

/// `GET`: an autoscaled model's load and replicas over the last hour.
pub fn model_load(name: &str) -> String {
    format!("{MODELS}/{name}/load")
}

pub fn explain(name: &str) -> String {
    format!("{MODELS}/{name}/explain")
}

pub fn peer(id: u64) -> String {
    format!("{CLUSTER_PEERS}/{id}")
}

/// `GET`, `PUT` (new settings) and `DELETE` (revokes) one API key.
pub fn key(name: &str) -> String {
    format!("{KEYS}/{name}")
}

/// `POST`: a new secret for the key; the old one stops working.
pub fn rotate_key(name: &str) -> String {
    format!("{KEYS}/{name}/rotate")
}
