//! The HTTPS GET of a policy (RFC 8461 3.3): `https://mta-sts.<domain>/
//! .well-known/mta-sts.txt`, the certificate verified for that name, no
//! redirect followed, `text/plain`, at most 64 KiB, all within one
//! deadline. A server that stalls, redirects or sends gigabytes costs one
//! deadline and is refused by name.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use super::policy::{self, Policy};

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
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("name: {e}"))?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let result = async {
            let request = hyper::Request::get("/.well-known/mta-sts.txt")
                .header("host", host)
                .header(
                    "user-agent",
                    concat!("smtp-once/", env!("CARGO_PKG_VERSION")),
                )
                .body(Empty::<Bytes>::new())
                .map_err(|e| format!("request: {e}"))?;
            let response = send
                .send_request(request)
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
            let status = response.status();
            if status.is_redirection() {
                return Err(format!(
                    "HTTP {status}: redirects are not followed (RFC 8461 3.3)"
                ));
            }
            if status != hyper::StatusCode::OK {
                return Err(format!("HTTP {status}"));
            }
            let text_plain = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| {
                    v.trim_start()
                        .to_ascii_lowercase()
                        .starts_with("text/plain")
                });
            if !text_plain {
                return Err("Content-Type is not text/plain".into());
            }
            let body = http_body_util::Limited::new(response.into_body(), MAX_POLICY_BYTES)
                .collect()
                .await
                .map_err(|e| format!("body (at most {MAX_POLICY_BYTES} bytes): {e}"))?
                .to_bytes();
            String::from_utf8(body.to_vec()).map_err(|_| "policy is not UTF-8".to_string())
        }
        .await;
        driver.abort();
        result
    }
}
