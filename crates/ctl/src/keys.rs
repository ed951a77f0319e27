//! `llmgw ctl keys`: API keys as an operator manages them.

use llmgw_api::keys::{ApiKeyRecord, IssuedKey, KeyRequest, KeyView};
use llmgw_api::paths;
use llmgw_api::usage::KeySpend;
use reqwest::Method;

use crate::args::{KeyAction, KeyFlags, OutputFormat};
use crate::client::{AdminClient, CtlError};
use crate::run::{json_body, or_dash, show};
use crate::table::Table;

pub async fn run(
    client: &AdminClient,
    output: OutputFormat,
    action: Option<KeyAction>,
) -> Result<String, CtlError> {
    let now = now_ms();
    match action {
        None => {
            let answer = client.call(Method::GET, paths::KEYS, None).await?;
            show(output, &answer, |keys: &Vec<ApiKeyRecord>| {
                render_keys(keys, now)
            })
        }
        Some(KeyAction::Get { name }) => {
            let answer = client.call(Method::GET, &paths::key(&name), None).await?;
            show(output, &answer, |key: &KeyView| {
                render_views(std::slice::from_ref(key), now)
            })
        }
        Some(KeyAction::Create { name, settings }) => {
            let mut request = KeyRequest {
                name,
                ..KeyRequest::default()
            };
            settings.apply_to(&mut request, now);
            let answer = client
                .call(Method::POST, paths::KEYS, Some(json_body(&request)?))
                .await?;
            show(output, &answer, |issued: &IssuedKey| {
                issued_text("created", issued, now)
            })
        }
        Some(KeyAction::Update { name, settings }) => {
            let current: KeyView = client.get(&paths::key(&name)).await?;
            let mut request = KeyRequest::from_record(&current.key);
            settings.apply_to(&mut request, now);
            let answer = client
                .call(Method::PUT, &paths::key(&name), Some(json_body(&request)?))
                .await?;
            show(output, &answer, |key: &ApiKeyRecord| {
                format!(
                    "key {name} updated\n{}",
                    render_keys(std::slice::from_ref(key), now)
                )
            })
        }
        Some(KeyAction::Rotate { name }) => {
            let answer = client
                .call(Method::POST, &paths::rotate_key(&name), None)
                .await?;
            show(output, &answer, |issued: &IssuedKey| {
                issued_text(
                    "rotated; the old secret is refused from now on",
                    issued,
                    now,
                )
            })
        }
        Some(KeyAction::Revoke { name }) => {
            let answer = client
                .call(Method::DELETE, &paths::key(&name), None)
                .await?;
            show(output, &answer, |_: &ApiKeyRecord| {
                format!("key {name} revoked: every router refuses it within a second\n")
            })
        }
    }
}

impl KeyFlags {
    /// The request with what the flags say changed.
    fn apply_to(&self, request: &mut KeyRequest, now_ms: u64) {
        if let Some(team) = &self.team {
            request.team = team.clone();
        }
        if !self.models.is_empty() {
            request.models = self.models.clone();
        }
        if self.all_models {
            request.models.clear();
        }
        if let Some(after) = self.expires_in {
            request.expires_at_ms = Some(now_ms + after.as_millis() as u64);
        }
        if self.never_expires {
            request.expires_at_ms = None;
        }
        let positive = |n: u32| (n > 0).then_some(n);
        if let Some(n) = self.requests_per_minute {
            request.limits.requests_per_minute = positive(n);
        }
        if let Some(n) = self.max_concurrent {
            request.limits.max_concurrent_requests = positive(n);
        }
        if let Some(n) = self.tokens_per_minute {
            request.limits.tokens_per_minute = positive(n);
        }
        let positive = |n: u64| (n > 0).then_some(n);
        if let Some(n) = self.tokens_per_day {
            request.limits.tokens_per_day = positive(n);
        }
        if let Some(n) = self.tokens_per_month {
            request.limits.tokens_per_month = positive(n);
        }
        let some_money = |usd: llmgw_api::keys::Usd| (!usd.is_zero()).then_some(usd);
        if let Some(usd) = self.usd_per_day {
            request.limits.usd_per_day = some_money(usd);
        }
        if let Some(usd) = self.usd_per_month {
            request.limits.usd_per_month = some_money(usd);
        }
        if self.shadow {
            request.limits.shadow = true;
        }
        if self.enforce {
            request.limits.shadow = false;
        }
    }
}

fn issued_text(what: &str, issued: &IssuedKey, now: u64) -> String {
    format!(
        "key {} {what}.\nIts secret, shown this once (clients send it as `Authorization: Bearer ...`):\n\n  {}\n\n{}",
        issued.key.name,
        issued.secret,
        render_keys(std::slice::from_ref(&issued.key), now)
    )
}

fn render_views(keys: &[KeyView], now: u64) -> String {
    let records: Vec<(ApiKeyRecord, Option<KeySpend>)> = keys
        .iter()
        .map(|v| (v.key.clone(), Some(v.spent)))
        .collect();
    render_rows(&records, now)
}

fn render_keys(keys: &[ApiKeyRecord], now: u64) -> String {
    let records: Vec<(ApiKeyRecord, Option<KeySpend>)> =
        keys.iter().map(|k| (k.clone(), None)).collect();
    render_rows(&records, now)
}

fn render_rows(keys: &[(ApiKeyRecord, Option<KeySpend>)], now: u64) -> String {
    let mut table = Table::new(&[
        "NAME",
        "TEAM",
        "SECRET",
        "MODELS",
        "RPM",
        "TPM",
        "CONCURRENT",
        "TOKENS TODAY",
        "EXPIRES",
        "STATUS",
    ]);
    for (key, spent) in keys {
        let s = &key.settings;
        let status = if key.is_revoked() {
            "revoked"
        } else if key.expired_at(now) {
            "expired"
        } else if s.limits.shadow && !s.limits.is_unlimited() {
            "live (limits in shadow mode)"
        } else {
            "live"
        };
        table.row(vec![
            key.name.clone(),
            if s.team.is_empty() {
                "-".into()
            } else {
                s.team.clone()
            },
            format!("{}...", key.secret_prefix),
            if s.models.is_empty() {
                "all".into()
            } else {
                s.models.join(",")
            },
            or_dash(s.limits.requests_per_minute),
            or_dash(s.limits.tokens_per_minute),
            or_dash(s.limits.max_concurrent_requests),
            budget_cell(spent.map(|s| s.day_tokens), s.limits.tokens_per_day),
            s.expires_at_ms
                .map_or("never".into(), |at| relative(at, now)),
            status.into(),
        ]);
    }
    table.render()
}

/// Tokens spent today, of the day's budget when there is one.
fn budget_cell(spent: Option<u64>, budget: Option<u64>) -> String {
    match (spent, budget) {
        (Some(spent), Some(budget)) => format!("{spent}/{budget}"),
        (Some(spent), None) => spent.to_string(),
        (None, Some(budget)) => format!("-/{budget}"),
        (None, None) => "-".into(),
    }
}

/// `in 29d23h`, or `3h ago`.
fn relative(at_ms: u64, now_ms: u64) -> String {
    let (span, past) = if at_ms >= now_ms {
        (at_ms - now_ms, false)
    } else {
        (now_ms - at_ms, true)
    };
    let secs = span / 1000;
    let text = match secs {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    };
    if past {
        format!("{text} ago")
    } else {
        format!("in {text}")
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_api::keys::{KeyLimits, KeySettings};

    #[test]
    fn update_flags_change_only_what_they_name() {
        let mut request = KeyRequest {
            name: "ci".into(),
            team: "search".into(),
            models: vec!["llama".into()],
            expires_at_ms: Some(5),
            limits: KeyLimits {
                requests_per_minute: Some(60),
                max_concurrent_requests: Some(4),
                shadow: true,
                ..KeyLimits::default()
            },
        };
        let flags = KeyFlags {
            requests_per_minute: Some(0),
            enforce: true,
            never_expires: true,
            ..KeyFlags::default()
        };
        flags.apply_to(&mut request, 1_000);
        assert_eq!(request.team, "search");
        assert_eq!(request.models, vec!["llama".to_string()]);
        assert_eq!(request.expires_at_ms, None);
        assert_eq!(request.limits.requests_per_minute, None);
        assert_eq!(request.limits.max_concurrent_requests, Some(4));
        assert!(!request.limits.shadow);
    }

    #[test]
    fn the_listing_shows_limits_expiry_and_status() {
        let key = ApiKeyRecord {
            name: "ci".into(),
            settings: KeySettings {
                team: "search".into(),
                models: Vec::new(),
                expires_at_ms: Some(90_000_000 + 1_000),
                limits: KeyLimits {
                    requests_per_minute: Some(600),
                    ..KeyLimits::default()
                },
            },
            secret_sha256: String::new(),
            secret_prefix: "sk-llmgw-ab12".into(),
            created_at_ms: 0,
            rotated_at_ms: None,
            revoked_at_ms: Some(7),
        };
        let text = render_keys(&[key], 1_000);
        let row = text.lines().nth(1).unwrap();
        for cell in [
            "ci",
            "search",
            "sk-llmgw-ab12...",
            "all",
            "600",
            "in 1d1h",
            "revoked",
        ] {
            assert!(row.contains(cell), "{cell} missing from {row}");
        }
    }
}
