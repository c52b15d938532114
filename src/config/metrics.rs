//! `[metrics]`: the listener for /metrics, /healthz and /readyz (no
//! section: no metrics listener).

use std::net::SocketAddr;

use serde::Deserialize;

use super::problems::Problems;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub addr: String,
    /// When set, `/metrics` wants `Authorization: Bearer <token>`
    /// (`/healthz` and `/readyz` stay open for probes).
    #[serde(default)]
    pub token: Option<String>,
}

/// `[metrics]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

pub(super) fn check(raw: Option<&RawMetrics>, p: &mut Problems) -> Option<MetricsSettings> {
    let m = raw?;
    let addr = m.addr.parse::<SocketAddr>();
    if addr.is_err() {
        p.add(
            "metrics.addr",
            format!("{:?} is not an address like 127.0.0.1:9187", m.addr),
        );
    }
    if let Some(token) = &m.token
        && (token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()))
    {
        p.add(
            "metrics.token",
            "must be at least 16 visible ASCII characters (no spaces)",
        );
    }
    addr.ok().map(|addr| MetricsSettings {
        addr,
        token: m.token.clone(),
    })
}
