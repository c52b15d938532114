//! `[[webhook]]`: endpoints that receive delivery-status events, signed per
//! the Standard Webhooks spec.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;

use super::problems::Problems;
use super::{parse_duration, resolve};
use crate::event_type::EventType;

/// The spec's schedule: immediately, then 5 s, 5 min, 30 min, 2 h, 5 h,
/// 10 h, 14 h, 20 h and 24 h after each failure (ten attempts).
pub(super) const DEFAULT_RETRY_SCHEDULE: [&str; 10] = [
    "0s", "5s", "5m", "30m", "2h", "5h", "10h", "14h", "20h", "24h",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWebhook {
    /// How operators and the outbox name it; default: the URL without its
    /// query (see [`redacted_url`]).
    pub name: Option<String>,
    pub url: String,
    /// `whsec_` + base64 of 24-64 random bytes.
    pub secret: String,
    /// Secrets still signed with while receivers move to `secret`.
    #[serde(default)]
    pub previous_secrets: Vec<String>,
    /// Event types sent (default: all).
    pub events: Option<Vec<String>>,
    /// Only this workspace's events (default: all).
    pub workspace: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout: String,
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// An endpoint whose every attempt failed for this long is disabled.
    #[serde(default = "default_disable_after")]
    pub disable_after: String,
    /// Wait before each attempt (the first is usually 0s).
    pub retry_schedule: Option<Vec<String>>,
    /// Roots for an `https` endpoint with a private CA (default: the
    /// system's).
    pub ca_file: Option<PathBuf>,
}

fn default_timeout() -> String {
    "15s".into()
}
/// At a few thousand events a second and a round trip of a few ms, 16
/// POSTs at once fall behind (measured: `benches/webhooks.sh`); 64 keep up
/// on keep-alive connections.
fn default_max_in_flight() -> usize {
    64
}
fn default_disable_after() -> String {
    "5d".into()
}

/// One validated endpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub name: String,
    pub url: String,
    /// Decoded secrets, the current one first.
    pub secrets: Vec<Vec<u8>>,
    /// `None`: every event type.
    pub events: Option<Vec<EventType>>,
    pub workspace: Option<String>,
    pub timeout: Duration,
    pub max_in_flight: usize,
    pub disable_after: Duration,
    pub retry_schedule: Vec<Duration>,
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for WebhookEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets, nor a token in the URL's query.
        f.debug_struct("WebhookEndpoint")
            .field("name", &self.name)
            .field("url", &redacted_url(&self.url))
            .field("events", &self.events)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

impl WebhookEndpoint {
    /// Does this endpoint want `event` of `workspace`?
    pub fn wants(&self, event: EventType, workspace: &str) -> bool {
        self.events.as_ref().is_none_or(|e| e.contains(&event))
            && self.workspace.as_deref().is_none_or(|w| w == workspace)
    }
}

/// `whsec_<base64>` with 24 to 64 bytes behind it.
pub(super) fn parse_secret(value: &str) -> Result<Vec<u8>, String> {
    let encoded = value
        .strip_prefix("whsec_")
        .ok_or("must start with whsec_ (then base64 of 24-64 random bytes)")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "is not whsec_ followed by standard base64".to_owned())?;
    if !(24..=64).contains(&bytes.len()) {
        return Err(format!(
            "decodes to {} bytes; must be 24 to 64 bytes",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// `url` as logs, `webhooks list` and error messages show it, and the
/// default `name`: scheme, host, port and path. The query and fragment
/// (where receivers put tokens: `?token=...`) and any user info
/// (`user:password@`) are left out.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    // User info is whatever comes before the last `@` ahead of the path,
    // even past a `?`: when in doubt, show less.
    let head_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..head_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    format!("{scheme}{}", &rest[..end])
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with http:// or https://")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let head = rest.split('/').next().unwrap_or("");
    if host.is_empty() || head.contains('@') {
        return Err(
            "needs a host, and no user:password@ (nor an @ before the path: write %40)".into(),
        );
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters".into());
    }
    Ok(())
}

pub(super) fn check(raw: &[RawWebhook], base: &Path, p: &mut Problems) -> Vec<WebhookEndpoint> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, w) in raw.iter().enumerate() {
        let key = |field: &str| format!("webhook[{i}].{field}");
        // The URL may carry a token or a password: shown redacted.
        if let Err(e) = check_url(&w.url) {
            p.add(key("url"), format!("{:?} {e}", redacted_url(&w.url)));
        }
        let name = w.name.clone().unwrap_or_else(|| redacted_url(&w.url));
        if name.is_empty() || name.contains(['\n', '\r']) {
            p.add(key("name"), "must be non-empty and on one line");
        } else if !names.insert(name.clone()) {
            p.add(
                key("name"),
                format!(
                    "{name:?} is used by another [[webhook]] (set distinct names; a name \
                     taken from the URL leaves out its query)"
                ),
            );
        }
        let secrets = check_secrets(w, i, p);
        let events = w
            .events
            .as_ref()
            .map(|names| check_events(names, &key("events"), p));
        let timeout = p.duration(&key("timeout"), &w.timeout);
        if timeout.is_zero() {
            p.add(key("timeout"), "must be greater than 0");
        }
        if w.max_in_flight == 0 || w.max_in_flight > 1024 {
            p.add(key("max_in_flight"), "must be between 1 and 1024");
        }
        let disable_after = p.duration(&key("disable_after"), &w.disable_after);
        let retry_schedule = check_retry_schedule(w, &key("retry_schedule"), p);
        let ca_file = w.ca_file.as_ref().map(|f| resolve(base, f));
        if let Some(f) = &ca_file
            && let Err(e) = crate::tls::load_roots(f)
        {
            p.add(key("ca_file"), e);
        }
        out.push(WebhookEndpoint {
            name,
            url: w.url.clone(),
            secrets,
            events,
            workspace: w.workspace.clone(),
            timeout,
            max_in_flight: w.max_in_flight,
            disable_after,
            retry_schedule,
            ca_file,
        });
    }
    out
}

/// `secret`, then `previous_secrets`, decoded: the current one first.
fn check_secrets(w: &RawWebhook, i: usize, p: &mut Problems) -> Vec<Vec<u8>> {
    let mut secrets = Vec::new();
    match parse_secret(&w.secret) {
        Ok(s) => secrets.push(s),
        Err(e) => p.add(format!("webhook[{i}].secret"), e),
    }
    for (j, s) in w.previous_secrets.iter().enumerate() {
        match parse_secret(s) {
            Ok(s) => secrets.push(s),
            Err(e) => p.add(format!("webhook[{i}].previous_secrets[{j}]"), e),
        }
    }
    secrets
}

fn check_events(names: &[String], key: &str, p: &mut Problems) -> Vec<EventType> {
    names
        .iter()
        .filter_map(|n| {
            let t = EventType::parse(n);
            if t.is_none() {
                let known: Vec<_> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                p.add(key, format!("{n:?} is not one of {}", known.join(", ")));
            }
            t
        })
        .collect()
}

/// `retry_schedule`, or the spec's when it is not set.
fn check_retry_schedule(w: &RawWebhook, key: &str, p: &mut Problems) -> Vec<Duration> {
    let schedule_text: Vec<String> = match &w.retry_schedule {
        Some(s) => s.clone(),
        None => DEFAULT_RETRY_SCHEDULE
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
    };
    if schedule_text.is_empty() {
        p.add(key, "needs at least one entry");
    }
    schedule_text
        .iter()
        .filter_map(|s| parse_duration(s).map_err(|e| p.add(key, e)).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_need_the_prefix_and_24_to_64_bytes() {
        let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
        assert_eq!(
            parse_secret(&format!("whsec_{}", b64(32))),
            Ok(vec![7u8; 32])
        );
        assert!(parse_secret(&format!("whsec_{}", b64(23))).is_err());
        assert!(parse_secret(&format!("whsec_{}", b64(65))).is_err());
        assert!(parse_secret(&b64(32)).is_err());
        assert!(parse_secret("whsec_not base64!").is_err());
    }

    #[test]
    fn urls_need_http_and_a_host() {
        assert!(check_url("https://app.example.net/hooks").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        assert!(check_url("ftp://x").is_err());
        assert!(check_url("https:///path").is_err());
        assert!(check_url("https://u:p@host/").is_err());
        assert!(check_url("https://host/a b").is_err());
        assert!(check_url("https://host?to=a@b/c").is_err());
        assert!(check_url("https://host/p?to=a@b").is_ok());
    }

    /// Issue 20 finding 10: what is shown of a URL has no query, fragment
    /// or user info.
    #[test]
    fn urls_are_shown_without_query_or_user_info() {
        for (url, shown) in [
            (
                "https://app.example.net/hooks",
                "https://app.example.net/hooks",
            ),
            (
                "http://127.0.0.1:8080/h?token=s3cret",
                "http://127.0.0.1:8080/h",
            ),
            ("https://host?token=s3cret", "https://host"),
            ("https://host/p#frag", "https://host/p"),
            ("https://user:pw@host:8443/p?t=1", "https://host:8443/p"),
            ("https://u:p?w@host/p", "https://host/p"),
            ("user:pw@host/p?t=1", "host/p"),
            ("https://host/p?to=a@b", "https://host/p"),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
    }

    #[test]
    fn the_default_name_is_the_redacted_url() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let secret = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 32])
        );
        let hook = |url: &str| format!("[[webhook]]\nurl = \"{url}\"\nsecret = \"{secret}\"\n");
        let config = super::super::Config::from_toml(
            Path::new("/tmp/c.toml"),
            &format!("{base}{}", hook("http://127.0.0.1:9/h?token=s3cret")),
        )
        .map_err(|e| e.to_string())
        .expect("valid");
        assert_eq!(config.webhooks[0].name, "http://127.0.0.1:9/h");
        assert!(!format!("{:?}", config.webhooks).contains("s3cret"));

        let err = super::super::Config::from_toml(
            Path::new("/tmp/c.toml"),
            &format!(
                "{base}{}{}",
                hook("http://u:pw@127.0.0.1:9/h?token=s3cret"),
                hook("http://127.0.0.1:9/h?token=other")
            ),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(!err.contains("s3cret") && !err.contains("pw"), "{err}");
        assert!(
            err.contains("webhook[0].url: \"http://127.0.0.1:9/h\" needs a host"),
            "{err}"
        );
    }
}
