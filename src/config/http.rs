//! `[http]` (the HTTP submission and status API) and `[[user]]
//! api_key_hash`.

use std::net::SocketAddr;

use serde::Deserialize;

use super::Problems;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub addr: String,
    /// Serve HTTPS with the `[tls]` certificate.
    #[serde(default)]
    pub tls: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    pub tls: bool,
}

pub(super) fn validate_http(
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
    Some(HttpSettings { addr, tls: raw.tls })
}

/// `api_key_hash`: the SHA-256 of the token, 64 hex digits, as
/// `smtp-once new-api-key` prints it.
pub(super) fn parse_api_key_hash(value: &str) -> Result<[u8; 32], String> {
    let bytes = value.as_bytes();
    if bytes.len() != 64 {
        return Err("must be 64 hexadecimal digits (from `smtp-once new-api-key`)".into());
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| "not hexadecimal".to_owned())?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| "not hexadecimal".to_owned())?;
    }
    Ok(out)
}
