//! The `[metrics]` listener: a small HTTP/1.1 server (axum) apart from the
//! mail ports, meant for loopback or a private network.
//!
//! - `GET /metrics`: every family of [`crate::metrics`] in OpenMetrics
//!   text for a client that asks for it (Prometheus), else in the
//!   Prometheus text format 0.0.4. A scrape only renders: the queue's depth
//!   by state is counted in the background ([`crate::queue_count`]), so a
//!   scrape costs the same with an empty queue or a million messages, and
//!   never waits for the store.
//! - `GET /healthz`: `200 ok` while the process serves requests.
//! - `GET /readyz`: `200 ready` when the store commits a trivial write
//!   transaction through its writer ([`Store::ready`]), else `503` with the
//!   reason. The answer is kept for [`READY_CACHE`], so probes in numbers
//!   cost the writer one write a second at most.
//!
//! It sits behind the same front door as the other listeners (its own
//! small connection cap, the per-address cap, bans, a header deadline),
//! and `/metrics` can want a bearer token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

use crate::front_door::http::HttpConnection;
use crate::front_door::{Door, Entrance, Gate, Wording};
use crate::metrics;
use crate::store::Store;

/// Connections at once: scrapers and probes, a handful in practice.
const MAX_CONNECTIONS: usize = 32;
/// A request's headers must arrive within this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `/readyz` answer is given again without asking the store.
pub const READY_CACHE: Duration = Duration::from_secs(1);

/// The listener's settings, in plain values.
pub struct MetricsOptions {
    pub addr: SocketAddr,
    /// `/metrics` wants `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
}

struct Shared {
    store: Arc<dyn Store>,
    token: Option<String>,
    /// The last readiness answer and when it was taken; the lock also
    /// makes concurrent probes share one store round trip.
    ready: Mutex<Option<(Instant, Result<(), String>)>>,
}

/// Longest a probe or a scrape waits for the store; a store that does not
/// answer within this is not ready.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MetricsHttpError {
    #[error("cannot listen on {addr} (metrics.addr): {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The running listener.
pub struct MetricsServer {
    /// The bound address (the real port when the config said `:0`).
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `options.addr` and serves until [`MetricsServer::shutdown`].
    pub async fn start(
        options: MetricsOptions,
        store: Arc<dyn Store>,
        door: Arc<Door>,
    ) -> Result<MetricsServer, MetricsHttpError> {
        let addr = options.addr;
        let bind_failed = |source| MetricsHttpError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_failed)?;
        let addr = listener.local_addr().map_err(bind_failed)?;
        let (stop, stopped) = watch::channel(false);
        let app = router(Arc::new(Shared {
            store,
            token: options.token,
            ready: Mutex::new(None),
        }));
        let connection = HttpConnection {
            app,
            tls: None,
            tls_handshake_timeout: door.tls_handshake_timeout,
            header_read_timeout: HEADER_READ_TIMEOUT,
            write_timeout: door.write_timeout,
        };
        let entrance = Entrance {
            name: "metrics",
            gate: Gate::new(MAX_CONNECTIONS),
            wording: Wording::Http,
            tls: None,
        };
        let stopping = stopped.clone();
        let handler = move |admitted| connection.clone().serve(admitted, stopping.clone());
        let task = tokio::spawn(crate::front_door::serve(
            listener,
            door,
            entrance,
            handler,
            stopped,
            STORE_TIMEOUT,
        ));
        tracing::info!(%addr, "metrics listening");
        Ok(MetricsServer { addr, stop, task })
    }

    /// Stops accepting and waits for requests under way (at most a few
    /// seconds: every handler is bounded by `STORE_TIMEOUT`).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let task = self.task;
        if tokio::time::timeout(STORE_TIMEOUT * 2, task).await.is_err() {
            tracing::warn!("metrics listener did not stop in time");
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(shared)
}

/// Whether `headers` carry the configured token (compared in constant
/// time); always true without one.
fn authorized(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(expected) = token else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn scrape(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorized(shared.token.as_deref(), &headers) {
        tracing::info!("metrics scrape refused: bad or missing token");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a token is required: Authorization: Bearer <token>\n",
        )
            .into_response();
    }
    let m = metrics::global();
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = metrics::Format::from_accept(accept);
    match m.render_as(format) {
        Ok(text) => (
            [
                (header::CONTENT_TYPE, format.content_type()),
                // The body depends on Accept: a cache in between must know.
                (header::VARY, "Accept"),
            ],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let mut last = shared.ready.lock().await;
    let answer = match &*last {
        Some((at, answer)) if at.elapsed() < READY_CACHE => answer.clone(),
        _ => {
            let answer = match tokio::time::timeout(STORE_TIMEOUT, shared.store.ready()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "the store did not answer within {}s",
                    STORE_TIMEOUT.as_secs()
                )),
            };
            *last = Some((Instant::now(), answer.clone()));
            answer
        }
    };
    drop(last);
    match answer {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response(),
    }
}
