//! `[http]`: the HTTP submission and status API's listener (its keys are
//! `[[user]] api_key_hash`, in `users.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::problems::Problems;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub addr: String,
    /// Serve HTTPS with the `[tls]` certificate.
    #[serde(default)]
    pub tls: bool,
    /// A request body must start arriving within this, ...
    #[serde(default = "default_body_timeout")]
    pub body_timeout: String,
    /// ... and each further `min_body_rate` bytes buy one more second
    /// (Apache's `RequestReadTimeout body=20,MinRate=500` shape).
    #[serde(default = "default_min_body_rate")]
    pub min_body_rate: u64,
    /// Serve the web console under `/console` on this listener (same
    /// front door, TLS, deadlines and budget as the API).
    #[serde(default)]
    pub console: bool,
}

fn default_body_timeout() -> String {
    "20s".into()
}

fn default_min_body_rate() -> u64 {
    // 8 KiB/s: a 25 MiB message over a link of ~64 kbit/s still goes
    // through; a trickle of bytes does not hold a connection.
    8 * 1024
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    pub tls: bool,
    pub body_timeout: Duration,
    pub min_body_rate: u64,
    pub console: bool,
}

pub(super) fn check(
    raw: Option<&RawHttp>,
    has_tls: bool,
    p: &mut Problems,
) -> Option<HttpSettings> {
    let raw = raw?;
    let addr = match raw.addr.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            p.add(
                "http.addr",
                format!("{:?} is not an address like 127.0.0.1:8025", raw.addr),
            );
            return None;
        }
    };
    if raw.tls && !has_tls {
        p.add("http.tls", "needs a [tls] section with cert and key");
    }
    let body_timeout = p.duration("http.body_timeout", &raw.body_timeout);
    if body_timeout.is_zero() {
        p.add("http.body_timeout", "must be greater than 0");
    }
    if raw.min_body_rate == 0 {
        p.add(
            "http.min_body_rate",
            "must be greater than 0 (bytes per second)",
        );
    }
    Some(HttpSettings {
        addr,
        tls: raw.tls,
        body_timeout,
        min_body_rate: raw.min_body_rate,
        console: raw.console,
    })
}
