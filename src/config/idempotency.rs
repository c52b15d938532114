//! `[idempotency]`: how long keys are remembered, and which headers name a
//! message's key or stay out of its fingerprint and identity.

use std::time::Duration;

use serde::Deserialize;

use super::problems::Problems;

/// Every key is optional: the defaults are `RawIdempotency::default()`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawIdempotency {
    pub retention: String,
    pub purge_interval: String,
    /// Top-level headers whose values the fingerprint leaves out.
    pub volatile_headers: Vec<String>,
    /// Top-level trace fields a keyed message's identity leaves out.
    pub transit_headers: Vec<String>,
    /// Headers an SMTP message's key is read from, first present wins.
    pub key_headers: Vec<String>,
}

impl Default for RawIdempotency {
    fn default() -> Self {
        Self {
            retention: "3h".into(),
            purge_interval: "60s".into(),
            volatile_headers: vec!["Date".into(), "Message-ID".into()],
            transit_headers: crate::idempotency::transit::DEFAULT_TRANSIT_HEADERS
                .map(String::from)
                .to_vec(),
            key_headers: vec!["X-Bird-Idempotency-Key".into()],
        }
    }
}

/// `[idempotency]`, checked (the `Config` carries these as its own fields).
pub(super) struct Idempotency {
    pub(super) retention: Duration,
    pub(super) purge_interval: Duration,
    /// Valid field names.
    pub(super) volatile_headers: Vec<String>,
    /// Each a valid field name, or a valid prefix with a trailing `*`.
    pub(super) transit_headers: Vec<String>,
    /// Valid field names, at least one, no two alike (case-insensitively),
    /// in priority order.
    pub(super) key_headers: Vec<String>,
}

pub(super) fn check(raw: &RawIdempotency, p: &mut Problems) -> Idempotency {
    let retention = p.duration("idempotency.retention", &raw.retention);
    if retention.is_zero() {
        p.add("idempotency.retention", "must be greater than 0");
    }
    let purge_interval = p.duration("idempotency.purge_interval", &raw.purge_interval);
    for name in &raw.volatile_headers {
        if !is_field_name(name) {
            p.add(
                "idempotency.volatile_headers",
                format!("{name:?} is not a header name (printable ASCII, no spaces or colon)"),
            );
        }
    }
    check_key_headers(p, &raw.key_headers);
    for name in &raw.transit_headers {
        if !is_field_name(name.strip_suffix('*').unwrap_or(name)) {
            p.add(
                "idempotency.transit_headers",
                format!(
                    "{name:?} is not a header name or a prefix with a trailing * \
                     (printable ASCII, no spaces or colon)"
                ),
            );
        }
    }
    Idempotency {
        retention,
        purge_interval,
        volatile_headers: raw.volatile_headers.clone(),
        transit_headers: raw.transit_headers.clone(),
        key_headers: raw.key_headers.clone(),
    }
}

/// `key_headers`: a client migrating from another provider keeps sending
/// its own key header (issue 21 item 2).
fn check_key_headers(p: &mut Problems, names: &[String]) {
    const KEY: &str = "idempotency.key_headers";
    if names.is_empty() {
        p.add(
            KEY,
            "must name at least one header (the default is [\"X-Bird-Idempotency-Key\"])",
        );
    }
    for (i, name) in names.iter().enumerate() {
        if !is_field_name(name) {
            p.add(
                KEY,
                format!("{name:?} is not a header name (printable ASCII, no spaces or colon)"),
            );
        } else if names.iter().take(i).any(|n| n.eq_ignore_ascii_case(name)) {
            p.add(KEY, format!("{name:?} is listed twice"));
        }
    }
}

/// Whether `name` can be a header field name (RFC 5322: printable ASCII
/// except the colon, at least one character).
fn is_field_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b':')
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn transit_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.transit_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()).map(|d| d.join(",")),
            Ok(
                "Received,Return-Path,X-Received,Delivered-To,X-Original-To,\
                DKIM-Signature,ARC-*,Authentication-Results"
                    .to_owned()
            )
        );
        let none = load("[idempotency]\ntransit_headers = []\n").map(|c| c.transit_headers);
        assert_eq!(none.ok(), Some(Vec::new()));
        let err =
            load("[idempotency]\ntransit_headers = [\"X-Trace-*\", \"*\", \"A B\", \"X:*\"]\n")
                .map(|_| ())
                .unwrap_err()
                .to_string();
        for bad in ["\"*\" is not", "\"A B\" is not", "\"X:*\" is not"] {
            assert!(
                err.contains(&format!("idempotency.transit_headers: {bad}")),
                "{bad} missing from {err}"
            );
        }
        assert!(!err.contains("X-Trace-*\" is not"), "{err}");
    }

    #[test]
    fn volatile_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.volatile_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()),
            Ok(vec!["Date".into(), "Message-ID".into()])
        );
        let strict = load("[idempotency]\nvolatile_headers = []\n").map(|c| c.volatile_headers);
        assert_eq!(strict.ok(), Some(Vec::new()));
        let err =
            load("[idempotency]\nvolatile_headers = [\"Date\", \"Message ID\", \"X:Y\", \"\"]\n")
                .map(|_| ())
                .unwrap_err()
                .to_string();
        for bad in ["\"Message ID\" is not", "\"X:Y\" is not", "\"\" is not"] {
            assert!(
                err.contains(&format!("idempotency.volatile_headers: {bad}")),
                "{bad} missing from {err}"
            );
        }
        assert!(!err.contains("\"Date\" is not"), "{err}");
    }

    /// Issue 21 item 2: `[idempotency] key_headers` defaults to ours and is
    /// checked by key.
    #[test]
    fn key_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.key_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()),
            Ok(vec!["X-Bird-Idempotency-Key".into()])
        );
        let ok =
            load("[idempotency]\nkey_headers = [\"X-Idempotency-Key\", \"Idempotency-Key\"]\n");
        assert_eq!(
            ok.map(|c| c.key_headers).map_err(|e| e.to_string()),
            Ok(vec!["X-Idempotency-Key".into(), "Idempotency-Key".into()])
        );
        let err = |extra: &str| load(extra).map(|_| ()).unwrap_err().to_string();
        let empty = err("[idempotency]\nkey_headers = []\n");
        assert!(
            empty.contains("idempotency.key_headers: must name at least one header"),
            "{empty}"
        );
        let bad = err(
            "[idempotency]\nkey_headers = [\"Idempotency-Key\", \"Idempotency Key\", \"\", \"idempotency-key\"]\n",
        );
        for needle in [
            "idempotency.key_headers: \"Idempotency Key\" is not a header name",
            "idempotency.key_headers: \"\" is not a header name",
            "idempotency.key_headers: \"idempotency-key\" is listed twice",
        ] {
            assert!(bad.contains(needle), "{needle} missing from {bad}");
        }
        assert!(!bad.contains("\"Idempotency-Key\" is"), "{bad}");
        // A listed key header leaves the relayed copy: it cannot be signed.
        let signed = err(
            "[idempotency]\nkey_headers = [\"X-Bird-Idempotency-Key\", \"X-Idempotency-Key\"]\n\
             [[dkim]]\ndomain = \"example.test\"\nselector = \"s\"\nprivate_key = \"missing.pem\"\n\
             headers = [\"Subject\", \"x-idempotency-key\"]\n",
        );
        assert!(
            signed.contains("dkim[0].headers[1]: x-idempotency-key cannot be signed"),
            "{signed}"
        );
    }
}
