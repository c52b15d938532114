//! The HTTPS GET of a policy (RFC 8461 3.3): `https://mta-sts.<domain>/
//! .well-known/mta-sts.txt`, the certificate verified for that name, no
//! redirect followed, `text/plain`, at most 64 KiB, all within one
//! deadline. A server that stalls, redirects or sends gigabytes costs one
//! deadline and is refused by name.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;

use super::policy::{self, Policy};
use crate::delivery::https;

/// RFC 8461 3.2 leaves the size to the sender; a real policy is < 1 KiB.
pub const MAX_POLICY_BYTES: usize = 64 * 1024;

pub struct Fetcher {
    pub tls: tokio_rustls::TlsConnector,
    /// 443; another one only for tests.
    pub port: u16,
    pub deadline: Duration,
}

impl Fetcher {
    /// The policy of `domain` from the first of `ips` that answers.
    pub async fn fetch(&self, domain: &str, ips: &[IpAddr]) -> Result<Policy, String> {
        let host = format!("mta-sts.{domain}");
        let mut last = format!("{host}: no address");
        for ip in ips {
            let addr = SocketAddr::new(*ip, self.port);
            match tokio::time::timeout(self.deadline, self.get(&host, addr)).await {
                Ok(Ok(text)) => return policy::parse(&text).map_err(|e| format!("{host}: {e}")),
                Ok(Err(e)) => last = format!("{host} [{addr}]: {e}"),
                Err(_) => last = format!("{host} [{addr}]: no policy within {:?}", self.deadline),
            }
        }
        Err(last)
    }

    async fn get(&self, host: &str, addr: SocketAddr) -> Result<String, String> {
        let request = hyper::Request::get("/.well-known/mta-sts.txt")
            .header("host", host)
            .header(
                "user-agent",
                concat!("smtp-once/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("request: {e}"))?;
        let answer = https::request(&self.tls, host, addr, request, MAX_POLICY_BYTES).await?;
        if answer.status.is_redirection() {
            return Err(format!(
                "HTTP {}: redirects are not followed (RFC 8461 3.3)",
                answer.status
            ));
        }
        if answer.status != hyper::StatusCode::OK {
            return Err(format!("HTTP {}", answer.status));
        }
        let text_plain = answer
            .content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("text/plain");
        if !text_plain {
            return Err("Content-Type is not text/plain".into());
        }
        String::from_utf8(answer.body).map_err(|_| "policy is not UTF-8".to_string())
    }
}
