//! A small HTTP/1.1 client over real TCP for the API tests: one request
//! per connection (`Connection: close`), the whole response read back.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn is_replay(&self) -> bool {
        self.header("idempotency-replay") == Some("true")
    }
}

pub(crate) struct Request<'a> {
    pub method: &'a str,
    pub target: &'a str,
    pub headers: Vec<(&'a str, String)>,
    pub body: Vec<u8>,
}

impl<'a> Request<'a> {
    pub(crate) fn new(method: &'a str, target: &'a str) -> Self {
        Self {
            method,
            target,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub(crate) fn bearer(mut self, token: &str) -> Self {
        self.headers
            .push(("Authorization", format!("Bearer {token}")));
        self
    }

    pub(crate) fn header(mut self, name: &'a str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub(crate) fn body(mut self, content_type: &str, body: &[u8]) -> Self {
        self.headers.push(("Content-Type", content_type.to_owned()));
        self.body = body.to_vec();
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.method,
            self.target,
            self.body.len()
        );
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }

    pub(crate) async fn send(&self, addr: SocketAddr) -> Response {
        let mut stream = TcpStream::connect(addr).await.expect("connect to the API");
        stream.write_all(&self.bytes()).await.expect("send request");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read response");
        parse(&raw)
    }

    /// Over TLS, trusting the dev certificate in `certs/`.
    pub(crate) async fn send_tls(&self, addr: SocketAddr) -> Response {
        let tcp = TcpStream::connect(addr).await.expect("connect to the API");
        let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
        let mut stream = super::tls_connector()
            .connect(name, tcp)
            .await
            .expect("TLS handshake");
        stream.write_all(&self.bytes()).await.expect("send request");
        let mut raw = Vec::new();
        // A peer may close without close_notify; what was read counts.
        let _ = stream.read_to_end(&mut raw).await;
        parse(&raw)
    }

    /// Sends the request and returns the open connection without reading
    /// the answer: a client whose response gets lost. (Closing instead would
    /// cancel the request, which is then not processed at all.)
    pub(crate) async fn send_and_hold(&self, addr: SocketAddr) -> TcpStream {
        let mut stream = TcpStream::connect(addr).await.expect("connect to the API");
        stream.write_all(&self.bytes()).await.expect("send request");
        stream
    }
}

fn parse(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[end + 2..end + 2 + size]);
        data = &data[end + 2 + size + 2..];
    }
}

/// Submits a raw message through the API as `user`, from `from` to `to`
/// (with `key` as its `Idempotency-Key` if given); the queue id of the
/// `202` it must get.
pub(crate) async fn submit_raw(
    api: SocketAddr,
    user: &str,
    (from, to): (&str, &str),
    key: Option<&str>,
    message: &[u8],
) -> String {
    let target = format!(
        "/v1/messages?from={}&to={}",
        from.replace('@', "%40"),
        to.replace('@', "%40")
    );
    let mut request = Request::new("POST", &target).bearer(&super::api_token(user));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let r = request.body("message/rfc822", message).send(api).await;
    assert_eq!(r.status, 202, "{r:?}");
    r.json()["id"].as_str().expect("id").to_owned()
}
