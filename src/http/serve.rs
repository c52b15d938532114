//! The API's listener: the front door's accept loop (caps, bans,
//! refusals) with each admitted connection served as HTTP/1.1, plaintext
//! or TLS with the `[tls]` certificate.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::front_door::http::HttpConnection;
use crate::front_door::{Door, Entrance, Gate, Wording};

pub(super) struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub shutdown_grace: Duration,
}

pub(super) async fn run(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    door: Arc<Door>,
    limits: Limits,
    stop: watch::Receiver<bool>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let connection = HttpConnection {
        app,
        tls: tls.clone(),
        tls_handshake_timeout: door.tls_handshake_timeout,
        header_read_timeout: limits.header_read_timeout,
        write_timeout: door.write_timeout,
    };
    let entrance = Entrance {
        name: "http",
        gate: Gate::new(limits.max_connections),
        wording: Wording::Http,
        tls,
    };
    let stopping = stop.clone();
    let handler = move |admitted| connection.clone().serve(admitted, stopping.clone());
    crate::front_door::serve(
        listener,
        door,
        entrance,
        handler,
        stop,
        limits.shutdown_grace,
    )
    .await;
}
