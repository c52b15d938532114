//! One HTTPS request from the delivery side (an MTA-STS policy GET, a
//! TLS-RPT report POST): connect to one address, TLS verified for `host`,
//! HTTP/1.1 on hyper's connection API, the body read up to `max_body`.
//! The caller puts its deadline around it.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

/// The answer: status, Content-Type, and the body (at most `max_body`).
pub struct Answer {
    pub status: hyper::StatusCode,
    pub content_type: String,
    pub body: Vec<u8>,
}

pub async fn request(
    tls: &tokio_rustls::TlsConnector,
    host: &str,
    addr: SocketAddr,
    request: hyper::Request<Full<Bytes>>,
    max_body: usize,
) -> Result<Answer, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("name: {e}"))?;
    let stream = tls
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let result = async {
        let response = send
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        // Nothing is read past a redirect or an error: only its status counts.
        if !status.is_success() {
            return Ok(Answer {
                status,
                content_type,
                body: Vec::new(),
            });
        }
        let body = http_body_util::Limited::new(response.into_body(), max_body)
            .collect()
            .await
            .map_err(|e| format!("body (at most {max_body} bytes): {e}"))?
            .to_bytes()
            .to_vec();
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }
    .await;
    driver.abort();
    result
}
