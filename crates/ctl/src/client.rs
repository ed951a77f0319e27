//! Talking to the admin API of whichever configured peer answers.

use std::time::Duration;

use llmgw_api::{ClusterView, ErrorBody, paths};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "no peer reachable at {tried}; is `llmgw server` running? Pass --api URL (or set \
         LLMGW_API) to name a running peer. tried: {details}"
    )]
    Unreachable { tried: String, details: String },
    /// The API answered with an error.
    #[error("{url}: {status}: {message}")]
    Api {
        url: String,
        status: StatusCode,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

/// An admin API client over several peer URLs.
pub struct AdminClient {
    bases: Vec<String>,
    http: reqwest::Client,
    /// Whether a CA bundle was given (for hints on certificate errors).
    has_ca: bool,
    /// Sent as `Authorization: Bearer`; never printed.
    token: Option<String>,
}

impl AdminClient {
    /// `ca`: the CA bundle that signed the peers' certificates, trusted
    /// instead of the system's roots for https:// peers.
    pub fn new(
        bases: Vec<String>,
        token: Option<String>,
        ca: Option<&std::path::Path>,
    ) -> Result<Self, CtlError> {
        let bases: Vec<String> = bases
            .into_iter()
            .map(|b| b.trim().trim_end_matches('/').to_owned())
            .filter(|b| !b.is_empty())
            .collect();
        if bases.is_empty() {
            return Err(CtlError::Usage(
                "no admin API URL given; pass --api URL".to_owned(),
            ));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(70));
        if let Some(ca) = ca {
            let tls = llmgw_tls::https_client_config(ca)
                .map_err(|e| CtlError::Usage(format!("--ca: {e}")))?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| CtlError::Usage(format!("cannot build an HTTP client: {e}")))?;
        let token = token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        Ok(Self {
            bases,
            http,
            has_ca: ca.is_some(),
            token,
        })
    }

    /// Sends the request to each peer in turn until one answers; returns
    /// the body of a successful answer as the peer sent it (null for an
    /// empty one).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Answer, CtlError> {
        let mut failures = Vec::new();
        for base in &self.bases {
            let url = format!("{base}{path}");
            let mut request = self.http.request(method.clone(), &url);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            if let Some((content_type, bytes)) = &body {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, *content_type)
                    .body(bytes.clone());
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => {
                    failures.push(format!("{base} ({})", describe(&error, self.has_ca)));
                    continue;
                }
            };
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status.is_success() {
                if text.trim().is_empty() {
                    return Ok(Answer {
                        url,
                        status,
                        body: Value::Null,
                    });
                }
                return match serde_json::from_str(&text) {
                    Ok(body) => Ok(Answer { url, status, body }),
                    Err(e) => Err(CtlError::Api {
                        url,
                        status,
                        message: format!("the answer is not JSON: {e}"),
                    }),
                };
            }
            let mut message = serde_json::from_str::<ErrorBody>(&text)
                .map(|body| body.error.message)
                .unwrap_or(text);
            if status == StatusCode::UNAUTHORIZED && self.token.is_none() {
                message.push_str(" (no token was sent: set LLMGW_TOKEN or pass --token)");
            }
            return Err(CtlError::Api {
                url,
                status,
                message,
            });
        }
        Err(CtlError::Unreachable {
            tried: self.bases.join(", "),
            details: failures.join("; "),
        })
    }

    /// `GET path`, read through the admin API's contract.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CtlError> {
        self.call(Method::GET, path, None).await?.decode()
    }

    /// Asks the leader when it can be found: only the leader holds the
    /// agents' streams, so only it knows heartbeats. Falls back to any peer.
    pub async fn get_from_leader(&self, path: &str) -> Result<Answer, CtlError> {
        if let Ok(cluster) = self.get::<ClusterView>(paths::CLUSTER).await
            && let Some(leader) = cluster.leader()
            && !leader.admin.is_empty()
        {
            let leader_client = AdminClient {
                bases: vec![leader.admin.trim_end_matches('/').to_owned()],
                http: self.http.clone(),
                has_ca: self.has_ca,
                token: self.token.clone(),
            };
            if let Ok(answer) = leader_client.call(Method::GET, path, None).await {
                return Ok(answer);
            }
        }
        self.call(Method::GET, path, None).await
    }
}

/// A successful answer of the admin API.
#[derive(Debug)]
pub struct Answer {
    pub url: String,
    pub status: StatusCode,
    /// The body as the peer sent it: `-o json` and `-o yaml` print this,
    /// so they show exactly what the API said.
    pub body: Value,
}

impl Answer {
    /// The body read through the admin API's contract (`llmgw-api`).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, CtlError> {
        T::deserialize(&self.body).map_err(|e| CtlError::Api {
            url: self.url.clone(),
            status: self.status,
            message: format!("the answer does not match the admin API: {e}"),
        })
    }
}

/// Why a request got no answer, with what to do about it.
fn describe(error: &reqwest::Error, has_ca: bool) -> String {
    if error.is_timeout() {
        return "timed out".to_owned();
    }
    let mut innermost = error.to_string();
    let mut whole = innermost.clone();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        innermost = cause.to_string();
        whole.push_str(": ");
        whole.push_str(&innermost);
        source = cause.source();
    }
    if whole.contains("certificate") {
        let hint = if has_ca {
            "is --ca the CA bundle that signed the peers' certificates, and does the peer's \
             certificate name the host in the URL?"
        } else {
            "the peers' certificates are signed by the cluster's own CA: pass --ca FILE or set \
             LLMGW_CA to its CA bundle (the `ca` of server.yaml)"
        };
        return format!("{innermost}; {hint}");
    }
    if whole.contains("corrupt message") {
        return format!(
            "{innermost}; the peer seems to speak plain HTTP (`insecure: true`): use http://"
        );
    }
    if error.is_connect() {
        return format!("cannot connect: {innermost}");
    }
    whole
}
