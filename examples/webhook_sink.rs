//! The webhook endpoint of `benches/webhooks.sh`: answers every POST `204`
//! at once over keep-alive HTTP/1.1 and measures, per event, the time from
//! the state change (the payload's `timestamp`) to its arrival here.
//!
//! ```sh
//! cargo run --release --example webhook_sink -- --port 0 --stats stats.json
//! ```
//!
//! Prints `listening on HOST:PORT`; on SIGTERM or SIGINT writes the stats as
//! JSON (events, distinct webhook-ids, per type, delay p50/p90/p99/max in
//! ms). No signature check: it measures the sender, not a receiver. One
//! thread, so that on a small machine it takes as little CPU from the relay
//! it measures as it can (the Python sink it replaces took about a third
//! of the sender's cost again).
#![allow(clippy::unwrap_used, clippy::expect_used)] // an example: a failed step ends it with the reason

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use smtp_once::store::now_millis;
use smtp_once::time::parse_rfc3339_utc;

#[derive(Default)]
struct Stats {
    delays_ms: Vec<i64>,
    ids: HashSet<String>,
    per_type: BTreeMap<String, u64>,
}

impl Stats {
    fn note(&mut self, webhook_id: Option<String>, body: &[u8]) {
        let arrived = now_millis();
        if let Ok(event) = serde_json::from_slice::<Value>(body) {
            if let Some(at) = event["timestamp"].as_str().and_then(parse_rfc3339_utc) {
                self.delays_ms.push(arrived - at);
            }
            if let Some(kind) = event["type"].as_str() {
                *self.per_type.entry(kind.to_owned()).or_default() += 1;
            }
        }
        if let Some(id) = webhook_id {
            self.ids.insert(id);
        }
    }

    fn report(&mut self) -> Value {
        self.delays_ms.sort_unstable();
        let pct = |p: f64| {
            let n = self.delays_ms.len();
            // Truncation is the percentile's rank, as in the Python sink.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let rank = ((n as f64) * p) as usize;
            self.delays_ms.get(rank.min(n.saturating_sub(1))).copied()
        };
        json!({
            "events": self.delays_ms.len(),
            "distinct_ids": self.ids.len(),
            "per_type": self.per_type,
            "latency_ms": {
                "p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99),
                "max": self.delays_ms.last(),
            },
        })
    }
}

async fn handle(
    stats: Arc<Mutex<Stats>>,
    req: Request<Incoming>,
) -> Result<Response<String>, Infallible> {
    use http_body_util::BodyExt;
    let webhook_id = req
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    if let Ok(mut s) = stats.lock() {
        s.note(webhook_id, &body);
    }
    Ok(status(StatusCode::NO_CONTENT))
}

fn status(code: StatusCode) -> Response<String> {
    let mut r = Response::new(String::new());
    *r.status_mut() = code;
    r
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut host = "127.0.0.1".to_owned();
    let mut port = "0".to_owned();
    let mut stats_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--host" => host = args.next().ok_or("--host needs a value")?,
            "--port" => port = args.next().ok_or("--port needs a value")?,
            "--stats" => stats_path = Some(args.next().ok_or("--stats needs a path")?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let stats_path = stats_path.ok_or("--stats FILE is required")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(serve(&host, &port, &stats_path))
}

async fn serve(host: &str, port: &str, stats_path: &str) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::signal::unix::{SignalKind, signal};
    let listener = tokio::net::TcpListener::bind(format!("{host}:{port}")).await?;
    println!("listening on {}", listener.local_addr()?);
    let stats = Arc::new(Mutex::new(Stats::default()));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let stats = stats.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(stats.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
    let report = stats.lock().map_err(|_| "stats poisoned")?.report();
    std::fs::write(stats_path, report.to_string())?;
    Ok(())
}
