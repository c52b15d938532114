//! An HTTPS server for MTA-STS policies (`mta-sts.<domain>` on 127.0.x.y),
//! with a certificate from the rig's test CA, that serves a policy or
//! misbehaves as a hostile one would: redirects, sends gigabytes, stalls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::mx_host::HostCert;

#[derive(Clone)]
pub(crate) enum Serve {
    Policy(String),
    /// `301` to another policy host.
    Redirect,
    /// A `text/plain` body that never ends (megabytes until the client hangs up).
    Endless,
    /// Accepts TLS, then says nothing.
    Stall,
    /// A policy, as `text/html`.
    WrongType(String),
    /// A TLS-RPT collector: every request body kept, `202` to each.
    Collect,
}

/// What a `Collect` server kept: each request's head and body.
type Kept = Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

pub(crate) struct PolicyServer {
    pub addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    bodies: Kept,
}

impl PolicyServer {
    pub(crate) fn start(addr: SocketAddr, cert: &HostCert, serve: Serve) -> PolicyServer {
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
        let requests = Arc::new(AtomicUsize::new(0));
        let bodies: Kept = Arc::default();
        let counter = requests.clone();
        let kept = bodies.clone();
        let addr = super::spawn_server(addr, move |tcp| {
            let (acceptor, serve, counter) = (acceptor.clone(), serve.clone(), counter.clone());
            let kept = kept.clone();
            async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16_384 {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let reply = |ctype: &str, body: &str| {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = match serve {
                    Serve::Policy(text) => tls.write_all(reply("text/plain", &text).as_bytes()).await,
                    Serve::WrongType(text) => tls.write_all(reply("text/html", &text).as_bytes()).await,
                    Serve::Redirect => {
                        tls.write_all(
                            b"HTTP/1.1 301 Moved\r\nLocation: https://evil.example/\r\nContent-Length: 0\r\n\r\n",
                        )
                        .await
                    }
                    Serve::Endless => {
                        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nversion: STSv1\r\n";
                        let _ = tls.write_all(head).await;
                        let chunk = vec![b'x'; 64 * 1024];
                        loop {
                            if tls.write_all(&chunk).await.is_err() {
                                break Ok(());
                            }
                        }
                    }
                    Serve::Collect => {
                        let end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
                        let head = String::from_utf8_lossy(&request[..end]).to_string();
                        let len = head
                            .lines()
                            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                            .unwrap_or(0);
                        let mut body = request[end..].to_vec();
                        while body.len() < len {
                            match tls.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => body.extend_from_slice(&buf[..n]),
                            }
                        }
                        kept.lock().expect("lock").push((head, body));
                        tls.write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await
                    }
                    Serve::Stall => {
                        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                        Ok(())
                    }
                };
                let _ = tls.shutdown().await;
            }
        });
        PolicyServer {
            addr,
            requests,
            bodies,
        }
    }

    /// `Collect`: each request's head and body.
    pub(crate) fn bodies(&self) -> Vec<(String, Vec<u8>)> {
        self.bodies.lock().expect("lock").clone()
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}
