//! The routing table: which endpoints serve which model, as the router sees
//! it at one moment. Sources publish whole tables through a `watch` channel,
//! so a request always reads one consistent version.

use std::sync::Arc;

use llmgw_catalog::Catalog;
use tokio::sync::watch;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutingTable {
    pub models: Vec<RoutedModel>,
    /// The control plane's API keys (empty for a router on its own).
    pub keys: crate::keys::KeyRing,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutedModel {
    pub name: String,
    pub aliases: Vec<String>,
    /// Aliases some engine of the model was launched without (added to the
    /// catalog since it started): a request naming one is sent under the
    /// model's name, which every engine serves, so an alias needs no
    /// restart.
    pub mapped_aliases: Vec<String>,
    pub endpoints: Vec<Endpoint>,
    /// Why no replica is ready (the placement explanation), shown to clients
    /// in the 503 when `endpoints` has no ready entry.
    pub unavailable_reason: Option<String>,
    /// The model scales to zero: with no ready replica a request is held
    /// (and the control plane asked for one) instead of refused.
    pub wakes_on_request: bool,
    /// Requests this router sends one ready replica at a time; the rest
    /// wait at the router for a replica with room (see `queue`).
    pub max_requests_per_replica: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL of the engine's HTTP server, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    pub state: EndpointState,
    /// Where each of the engine's data-parallel ranks publishes its KV
    /// events, rank `r` at index `r`; empty when it does not (or is not
    /// known to), and the router routes to it by load alone.
    pub kv_events: Vec<llmgw_kv_events::Endpoints>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// Takes new requests.
    Ready,
    /// Finishes what it has; gets no new requests.
    Draining,
}

impl RoutingTable {
    /// The model a client's `model` field names, by name or alias.
    pub fn resolve(&self, name: &str) -> Option<&RoutedModel> {
        self.models
            .iter()
            .find(|m| m.name == name || m.aliases.iter().any(|a| a == name))
    }
}

impl RoutedModel {
    /// Notes the names one of the model's engines was launched to serve
    /// (none known: all of the model's names).
    pub fn note_served_names(&mut self, served: Option<&[String]>) {
        let Some(served) = served else {
            return;
        };
        for alias in &self.aliases {
            if !served.contains(alias) && !self.mapped_aliases.contains(alias) {
                self.mapped_aliases.push(alias.clone());
            }
        }
    }

    /// Whether a request naming `requested` must be sent under the model's
    /// own name.
    pub fn maps(&self, requested: &str) -> bool {
        requested != self.name && self.mapped_aliases.iter().any(|a| a == requested)
    }

    pub fn ready_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints
            .iter()
            .filter(|e| e.state == EndpointState::Ready)
    }
}

impl Endpoint {
    pub fn ready(url: impl Into<String>) -> Self {
        Endpoint {
            url: normalize_url(&url.into()),
            state: EndpointState::Ready,
            kv_events: Vec::new(),
        }
    }

    pub fn draining(url: impl Into<String>) -> Self {
        Endpoint {
            url: normalize_url(&url.into()),
            state: EndpointState::Draining,
            kv_events: Vec::new(),
        }
    }

    /// An engine with one publishing rank.
    pub fn with_kv_events(mut self, kv_events: Option<llmgw_kv_events::Endpoints>) -> Self {
        self.kv_events = kv_events.into_iter().collect();
        self
    }

    /// An engine whose data-parallel ranks publish, rank `r` at index `r`.
    pub fn with_kv_event_ranks(mut self, ranks: Vec<llmgw_kv_events::Endpoints>) -> Self {
        self.kv_events = ranks;
        self
    }
}

/// Base URLs compare equal whatever trailing slash or `/v1` suffix the
/// operator wrote, so metrics and ejection state key on one spelling.
pub(crate) fn normalize_url(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string()
}

/// Anything that publishes routing tables. `llmgw server` implements it over
/// its replicated state; `llmgw router` uses a static table or
/// [`crate::ControlPlaneWatcher`].
pub trait EndpointSource: Send + Sync + 'static {
    fn subscribe(&self) -> watch::Receiver<Arc<RoutingTable>>;
}

impl EndpointSource for watch::Receiver<Arc<RoutingTable>> {
    fn subscribe(&self) -> watch::Receiver<Arc<RoutingTable>> {
        self.clone()
    }
}

impl EndpointSource for watch::Sender<Arc<RoutingTable>> {
    fn subscribe(&self) -> watch::Receiver<Arc<RoutingTable>> {
        self.subscribe()
    }
}

/// The table of a static catalog: router-only models with their endpoints.
/// Managed models appear with no endpoint and say why: a standalone router
/// without `control_plane` cannot know where their replicas run.
pub fn static_table(catalog: &Catalog) -> RoutingTable {
    RoutingTable {
        keys: Default::default(),
        models: catalog
            .models
            .iter()
            .map(|m| RoutedModel {
                name: m.name.clone(),
                aliases: m.aliases.clone(),
                mapped_aliases: Vec::new(),
                endpoints: m.static_endpoints().iter().map(Endpoint::ready).collect(),
                unavailable_reason: m.managed().map(|_| {
                    format!(
                        "model `{}` is run by the control plane, and this router has no `control_plane` peers to learn its replicas from",
                        m.name
                    )
                }),
                wakes_on_request: false,
                max_requests_per_replica: None,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_normalize_to_one_spelling() {
        assert_eq!(normalize_url("http://h:1/"), "http://h:1");
        assert_eq!(normalize_url("http://h:1/v1/"), "http://h:1");
        assert_eq!(normalize_url("http://h:1"), "http://h:1");
    }

    #[test]
    fn resolve_by_alias() {
        let table = RoutingTable {
            keys: Default::default(),
            models: vec![RoutedModel {
                name: "llama".into(),
                aliases: vec!["l3".into()],
                mapped_aliases: Vec::new(),
                endpoints: vec![
                    Endpoint::ready("http://a:1"),
                    Endpoint::draining("http://b:1"),
                ],
                unavailable_reason: None,
                wakes_on_request: false,
                max_requests_per_replica: None,
            }],
        };
        assert_eq!(table.resolve("l3").unwrap().name, "llama");
        assert!(table.resolve("other").is_none());
        let ready: Vec<_> = table.resolve("llama").unwrap().ready_endpoints().collect();
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].url, "http://a:1");
    }
}
