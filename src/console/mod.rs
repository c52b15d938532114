//! The web console (`[http] console = true`): server-rendered pages under
//! `/console` on the HTTP API's listener, so it has the API's front door
//! (caps, bans, deadlines, TLS), authenticator, budget and workspace
//! isolation, and no listener of its own to defend.
//!
//! A front like `http/`: it reads through the store's traits (`QueueAdmin`,
//! `StatusReader`, `Store`, `OutboxAdmin`), acts through the API's own
//! `http::actions::perform`, signs in through `auth`, and samples
//! `metrics`. The store knows nothing of it.
//!
//! Files: `session.rs` (sessions, form tokens), `form.rs` (who is signed
//! in, bounded form bodies, the token check), `login.rs`, `overview.rs`,
//! `rates.rs` (the sampler and its chart), `messages.rs` (the list),
//! `message.rs` (one message), `actions.rs` (confirm, then act),
//! `webhooks.rs`, `layout.rs` (page shell, error pages, headers),
//! `assets/` (CSS and the list's refresh script, embedded).

mod actions;
mod form;
mod layout;
mod login;
mod message;
mod messages;
mod overview;
pub mod rates;
pub mod session;
mod webhooks;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::http::Api;
use crate::store::outbox::OutboxAdmin;
use crate::store::{QueueDepth, Store};
use rates::Rates;
use session::Sessions;

/// How often the sampler reads the counters and the queue's depth.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// The console's own state beside the API's.
pub struct Console {
    pub sessions: Sessions,
    /// Accounts with `role = "operator"` (a password sign-in learns the
    /// role here; an API key carries it).
    pub operators: HashSet<String>,
    /// The ledger (a message's entry and its expiry) and the queue's depth.
    pub store: Arc<dyn Store>,
    /// Webhook endpoints and deliveries (the operators' own connection).
    pub outbox: Arc<dyn OutboxAdmin + Send + Sync>,
    /// The configured endpoints' names.
    pub endpoints: Vec<String>,
    pub rates: Rates,
    /// The queue's depth as last sampled, and when (Unix ms).
    depth: Mutex<Option<(QueueDepth, i64)>>,
}

impl Console {
    /// The console's state, its sampler running until the state is dropped.
    pub fn start(
        operators: HashSet<String>,
        store: Arc<dyn Store>,
        outbox: Arc<dyn OutboxAdmin + Send + Sync>,
        endpoints: Vec<String>,
    ) -> Arc<Self> {
        let console = Arc::new(Self {
            sessions: Sessions::default(),
            operators,
            store,
            outbox,
            endpoints,
            rates: Rates::default(),
            depth: Mutex::new(None),
        });
        tokio::spawn(sample(Arc::downgrade(&console)));
        console
    }

    pub fn depth(&self) -> Option<(QueueDepth, i64)> {
        self.depth.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Every `SAMPLE_EVERY`: the counters into the ring, and the queue's depth
/// (`Store::queue_depth`, the read `/metrics` samples too).
async fn sample(console: Weak<Console>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(c) = console.upgrade() else { return };
        let now = crate::store::now_millis();
        c.rates.record(now, crate::metrics::global().totals());
        let read = c.store.queue_depth();
        drop(c);
        let depth = read.await;
        let Some(c) = console.upgrade() else { return };
        match depth {
            Ok(depth) => *c.depth.lock().unwrap_or_else(|e| e.into_inner()) = Some((depth, now)),
            Err(e) => tracing::warn!(error = %e, "console: the queue's depth cannot be read"),
        }
    }
}

/// The console's routes, merged into the API's router when enabled.
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/console", get(|| async { layout::see_other("/console/") }))
        .route("/console/", get(overview::page))
        .route("/console/login", get(login::form).post(login::submit))
        .route("/console/logout", post(login::logout))
        .route("/console/messages", get(messages::page))
        .route("/console/messages/{id}", get(message::page))
        .route(
            "/console/messages/{id}/{action}",
            get(actions::confirm).post(actions::act),
        )
        .route("/console/webhooks", get(webhooks::page))
        .route("/console/webhooks/{name}/enable", post(webhooks::enable))
        .route(
            "/console/webhooks/deliveries/{webhook_id}/redeliver",
            post(webhooks::redeliver),
        )
        .route(
            "/console/static/console.css",
            get(|| async { asset("text/css; charset=utf-8", CSS) }),
        )
        .route(
            "/console/static/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", JS) }),
        )
        .route("/console/{*rest}", get(form::unknown_page))
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

fn asset(content_type: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}
