//! The HTTP API: submission on the same acceptance pipeline, ledger and
//! queue as SMTP (`POST /v1/messages`), message status (`GET
//! /v1/messages/{id}`, `GET /v1/messages`), and its OpenAPI document.
//! Authentication by API key; the account's workspace and
//! `allowed_senders` apply as on SMTP.

pub(crate) mod actions;
pub(crate) mod body;
pub mod channel;
pub mod compose;
pub mod keys;
mod serve;
mod status;
mod submit;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::watch;

use crate::accept::Acceptor;
use crate::auth::{Authenticator, Submitter};
use crate::budget::InFlightBudget;
use crate::front_door::Door;
use crate::store::{QueueAdmin, StatusReader};
use crate::webhook::Router as Webhooks;
use body::BodyLimits;
use keys::{ApiKeys, Caller, KeyedAccount};

/// What every request handler shares.
pub struct Api {
    pub acceptor: Arc<Acceptor>,
    pub keys: ApiKeys,
    pub status: Arc<dyn StatusReader>,
    pub max_message_size: usize,
    pub max_recipients: usize,
    pub tls: bool,
    /// The node's throttle and bans: wrong API keys count with failed
    /// SMTP logins.
    pub auth: Arc<Authenticator>,
    /// The node's in-flight budget, shared with SMTP message buffers.
    pub budget: Arc<InFlightBudget>,
    pub body: BodyLimits,
    /// `server.hostname`: the right-hand side of a composed `Message-ID`.
    pub hostname: String,
    /// Operations on messages (cancel, retry, hold, release).
    pub admin: Arc<dyn QueueAdmin>,
    /// The events those operations cause.
    pub webhooks: Webhooks,
    /// The state of the pages the composition root mounts beside the API
    /// (the web console, `[http] console = true`), which their handlers
    /// downcast: this module names none of them.
    pub pages: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Their routes, merged into the API's.
    pub page_routes: Option<Router<Arc<Api>>>,
}

/// The OpenAPI document, checked in beside the code that serves it.
pub const OPENAPI: &str = include_str!("openapi.json");

impl Api {
    /// The account of `Authorization: Bearer <token>`, or the refusal,
    /// from the headers alone: no body byte is read (nor `100 Continue`
    /// sent) before this passes. A wrong key is a failure in the same
    /// throttle as SMTP AUTH: the answer waits its delay, and enough of
    /// them ban the address on every listener.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
    ) -> Result<Submitter, Box<Response>> {
        self.caller(headers, peer).await.map(|c| c.submitter)
    }

    /// [`Api::authenticate`], with the account's role.
    async fn caller(&self, headers: &HeaderMap, peer: SocketAddr) -> Result<Caller, Box<Response>> {
        if self.auth.api_key_refused_banned(peer.ip()) {
            tracing::info!(%peer, "HTTP request refused: address banned after authentication failures");
            let mut response = respond(channel::error(
                429,
                "Banned",
                "too many authentication failures from your address, try again later",
            ));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            return Err(Box::new(response));
        }
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match token.and_then(|t| self.keys.caller(t)) {
            Some(s) => Ok(s),
            None => {
                tracing::info!(
                    %peer,
                    given = token.is_some(),
                    "HTTP request refused: bad or missing API key"
                );
                // A missing key is a client's mistake, a wrong one a guess.
                if token.is_some() {
                    let delay = self.auth.api_key_failed(peer.ip());
                    tokio::time::sleep(delay).await;
                }
                let mut response = respond(channel::error(
                    401,
                    "Unauthorized",
                    "an API key is required: Authorization: Bearer <token>",
                ));
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                Err(Box::new(response))
            }
        }
    }
}

/// A pipeline answer (`status\nbody`) as a JSON response, marked as a
/// replay when it is one.
pub fn respond(encoded: Vec<u8>) -> Response {
    let answer = channel::decode(&encoded);
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if answer.replay {
        headers.insert("idempotency-replay", HeaderValue::from_static("true"));
    }
    response
}

pub fn router(api: Arc<Api>) -> Router {
    let routes = Router::new();
    // The console's pages on this listener: the same front door, TLS,
    // deadlines and budget as the API, no second surface to defend.
    let routes = match &api.page_routes {
        Some(pages) => routes.merge(pages.clone()),
        None => routes,
    };
    routes
        .route("/v1/messages", post(submit::submit).get(status::list))
        .route(
            "/v1/messages/{id}",
            get(status::one).delete(actions::cancel),
        )
        .route("/v1/messages/{id}/retry", post(actions::retry))
        .route("/v1/messages/{id}/hold", post(actions::hold))
        .route("/v1/messages/{id}/release", post(actions::release))
        .route(
            "/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        // Errors outside the routes in the same JSON shape (axum's own are
        // empty); 405 keeps its Allow header.
        .method_not_allowed_fallback(|| async {
            respond(channel::error(
                405,
                "MethodNotAllowed",
                "method not allowed on this path",
            ))
        })
        .fallback(|| async { respond(channel::error(404, "NotFound", "no such path")) })
        // Bodies are read by the handlers themselves, after authentication
        // (`body.rs`); a body no route reads is never read.
        .layer(DefaultBodyLimit::disable())
        .with_state(api)
}

/// The API for a node's configuration: its accounts with an API key, on
/// the node's acceptance pipeline and store.
pub async fn start(
    config: &crate::config::Config,
    settings: &crate::config::HttpSettings,
    acceptor: Arc<Acceptor>,
    status: Arc<dyn StatusReader>,
    front: Front,
) -> Result<HttpServer, String> {
    let accounts = config
        .users
        .iter()
        .filter_map(|u| {
            let hash = u.api_key_hash?;
            let account = crate::auth::Account {
                name: u.name.clone(),
                workspace: u.workspace.clone(),
                allowed_senders: u.allowed_senders.clone(),
            };
            Some(KeyedAccount {
                hash,
                account: Arc::new(account),
                operator: u.operator,
            })
        })
        .collect();
    let tls = match (&config.tls, settings.tls) {
        (Some(files), true) => Some(crate::tls::load_server_config(&files.cert, &files.key)?),
        (None, true) => return Err("http.tls needs a [tls] section".into()),
        _ => None,
    };
    let api = Arc::new(Api {
        acceptor,
        keys: ApiKeys::new(accounts),
        status,
        max_message_size: config.max_message_size,
        max_recipients: config.max_recipients,
        tls: settings.tls,
        auth: front.auth,
        budget: front.budget,
        body: BodyLimits {
            // Room for the JSON or MIME framing around the largest message.
            max_bytes: config.max_message_size.saturating_add(64 * 1024),
            grace: settings.body_timeout,
            min_rate: settings.min_body_rate,
        },
        hostname: config.hostname.clone(),
        admin: front.admin,
        webhooks: front.webhooks,
        pages: front.pages.as_ref().map(|p| p.state.clone()),
        page_routes: front.pages.map(|p| p.routes),
    });
    let limits = serve::Limits {
        max_connections: config.max_connections,
        // The same bound as an SMTP command line, at most 30 s.
        header_read_timeout: config.limits.command_time_limit.min(HEADER_READ_TIMEOUT),
        shutdown_grace: config.shutdown_grace,
    };
    HttpServer::start(
        settings.addr,
        api,
        tls,
        front.door,
        limits,
        config.limits.message_time_limit,
    )
    .await
}

/// What the API shares with the node's other listeners.
pub struct Front {
    pub door: Arc<Door>,
    pub auth: Arc<Authenticator>,
    pub budget: Arc<InFlightBudget>,
    /// The node's queue operations (its own connection to the store).
    pub admin: Arc<dyn QueueAdmin>,
    pub webhooks: Webhooks,
    /// Pages to serve beside the API on this listener (the console).
    pub pages: Option<Pages>,
}

/// Pages served beside the API, through the same front door (the console):
/// their routes and the state their handlers find in [`Api::pages`].
pub struct Pages {
    pub routes: Router<Arc<Api>>,
    pub state: Arc<dyn std::any::Any + Send + Sync>,
}

/// A request's headers must arrive within this, however they trickle
/// (`limits.command_time_limit` when shorter).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A running HTTP listener.
pub struct HttpServer {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    async fn start(
        addr: SocketAddr,
        api: Arc<Api>,
        tls: Option<Arc<rustls::ServerConfig>>,
        door: Arc<Door>,
        limits: serve::Limits,
        request_time_limit: Duration,
    ) -> Result<HttpServer, String> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (http): {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (stop, stopped) = watch::channel(false);
        // A whole request (its body read included) within the same limit
        // as a whole SMTP message.
        let app = router(api).layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                match tokio::time::timeout(request_time_limit, next.run(request)).await {
                    Ok(response) => response,
                    Err(_) => respond(channel::error(
                        408,
                        "RequestTimeout",
                        "the request took too long to arrive",
                    )),
                }
            },
        ));
        let secure = tls.is_some();
        let task = tokio::spawn(serve::run(listener, app, tls, door, limits, stopped));
        tracing::info!(%addr, tls = secure, "HTTP API listening");
        Ok(HttpServer { addr, stop, task })
    }

    /// Stops taking requests and lets those in flight finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
