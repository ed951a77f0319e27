//! Admin API clients and the typed reading of its answers.

use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// An admin API client; `ca`: the CA bundle of a TLS cluster, whose peers
/// serve HTTPS.
pub fn admin_client(ca: Option<&Path>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(20));
    if let Some(ca) = ca {
        builder = builder
            .use_preconfigured_tls(llmgw_tls::https_client_config(ca).expect("trust the CA"));
    }
    builder.build().expect("an HTTP client")
}

/// `GET url` (with `token` as bearer), answered 200 with a `T`; otherwise
/// why not, with the status and body.
pub async fn get_json<T: DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Result<T, String> {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status().as_u16();
    let text = response
        .text()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if status != 200 {
        return Err(format!("GET {url}: {status} {text}"));
    }
    serde_json::from_str(&text)
        .map_err(|e| format!("GET {url}: not the expected answer: {e}: {text}"))
}

/// `value` read as the admin API type `T`; a mismatch fails the test with
/// the value.
pub fn decode<T: DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("not a {}: {e}: {value}", std::any::type_name::<T>()))
}
