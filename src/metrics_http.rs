//! The `[metrics]` listener: a small HTTP/1.1 server (axum) apart from the
//! mail ports, meant for loopback or a private network.
//!
//! - `GET /metrics`: every family of [`crate::metrics`] in the
//!   OpenMetrics/Prometheus text format; the queue's depth is read from the
//!   store at each scrape.
//! - `GET /healthz`: `200 ok` while the process serves requests.
//! - `GET /readyz`: `200 ready` when the store commits a trivial write
//!   transaction through its writer ([`Store::ready`]), else `503` with the
//!   reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::metrics::{self, QUEUE_STATES};
use crate::store::Store;

/// Longest a probe or a scrape waits for the store; a store that does not
/// answer within this is not ready.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// What Prometheus asks for and prometheus-client writes (`# EOF` ended).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `addr` and serves until [`MetricsServer::shutdown`].
    pub async fn start(
        addr: SocketAddr,
        store: Arc<dyn Store>,
    ) -> Result<MetricsServer, MetricsHttpError> {
        let bind_failed = |source| MetricsHttpError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_failed)?;
        let addr = listener.local_addr().map_err(bind_failed)?;
        let app = router(store);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "metrics listener stopped");
            }
        });
        tracing::info!(%addr, "metrics listening");
        Ok(MetricsServer { addr, stop, task })
    }

    /// Stops accepting and waits for requests under way (at most a few
    /// seconds: every handler is bounded by `STORE_TIMEOUT`).
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let task = self.task;
        if tokio::time::timeout(STORE_TIMEOUT * 2, task).await.is_err() {
            tracing::warn!("metrics listener did not stop in time");
        }
    }
}

fn router(store: Arc<dyn Store>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(store)
}

async fn scrape(State(store): State<Arc<dyn Store>>) -> Response {
    let m = metrics::global();
    // A store that cannot be read leaves the last values in place (its
    // trouble shows on /readyz and in the submission outcomes).
    match tokio::time::timeout(STORE_TIMEOUT, store.queue_depth()).await {
        Ok(Ok(depth)) => {
            let counts: Vec<(&'static str, u64)> = depth
                .counts
                .iter()
                .map(|(state, n)| (state.as_str(), *n))
                .filter(|(state, _)| QUEUE_STATES.contains(state))
                .collect();
            // Milliseconds to seconds: exact far beyond any queue's age.
            #[allow(clippy::cast_precision_loss)]
            let oldest = depth.oldest_age_ms.map_or(0.0, |ms| ms as f64 / 1000.0);
            m.queue_depth(&counts, oldest);
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "metrics: cannot read the queue depth"),
        Err(_) => tracing::debug!("metrics: queue depth read timed out"),
    }
    match m.render() {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn ready(State(store): State<Arc<dyn Store>>) -> Response {
    match tokio::time::timeout(STORE_TIMEOUT, store.ready()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready\n").into_response(),
        Ok(Err(e)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response()
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the store did not answer within {}s\n",
                STORE_TIMEOUT.as_secs()
            ),
        )
            .into_response(),
    }
}
