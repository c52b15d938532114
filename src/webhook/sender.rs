//! The webhook sender: claims due events from the outbox, POSTs each to its
//! endpoint with Standard Webhooks headers, and records the answer. Runs
//! beside acceptance and delivery and never blocks them: they only write
//! outbox rows in their own transactions; a slow endpoint holds only its
//! own `max_in_flight` slots.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

use super::policy::{self, Answer};
use crate::config::WebhookEndpoint;
use crate::store::outbox::{EventAttempt, EventNext, OutboxEvent, WebhookOutbox};
use crate::store::{StoreError, UnixMillis, now_millis};

/// A claimed event stays ours this long; its POST is cut off at the
/// endpoint's timeout, well within it.
const LEASE: Duration = Duration::from_secs(300);
/// Without a wake-up (events written by another node or a redelivery
/// from the CLI on SQLite), the outbox is looked at this often.
const POLL: Duration = Duration::from_secs(1);
const RECORD_RETRY_MAX: Duration = Duration::from_secs(5);
const PURGE_EVERY: Duration = Duration::from_secs(60);
const PURGE_BATCH: usize = 1000;

/// A running sender.
pub struct Sender {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

struct Endpoint {
    config: WebhookEndpoint,
    client: reqwest::Client,
    /// POSTs at once (`max_in_flight`).
    slots: Arc<Semaphore>,
    /// Events claimed and not yet recorded: a few times `max_in_flight`,
    /// so a slot never waits for the next claim's commit.
    window: Arc<Semaphore>,
    /// OPEN, DISABLING (this process saw a 410; the record is on its way)
    /// or DISABLED: claimed events still waiting for a slot are given back
    /// untried instead of meeting the 410 too.
    state: AtomicU8,
}

impl Endpoint {
    /// Claims come in batches of at least `max_in_flight` (or whatever is
    /// free once the window is empty): one claim per recorded event would
    /// cost a writer transaction per event.
    fn room_to_claim(&self) -> bool {
        let free = self.window.available_permits();
        free > 0
            && (free >= self.config.max_in_flight
                || free == self.config.max_in_flight * WINDOW_FACTOR)
    }
}

const OPEN: u8 = 0;
const DISABLING: u8 = 1;
const DISABLED: u8 = 2;

/// Claimed events per endpoint, in units of `max_in_flight`.
const WINDOW_FACTOR: usize = 4;

struct Ctx {
    outbox: Arc<dyn WebhookOutbox>,
    /// An event was recorded and left the window: claim more at once.
    window_freed: Notify,
    endpoints: HashMap<String, Endpoint>,
    /// Delivered and failed events are kept this long (`relay.keep_finished`).
    keep: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error("webhook {name}: {message}")]
    Client { name: String, message: String },
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn client_for(e: &WebhookEndpoint) -> Result<reqwest::Client, SenderError> {
    let fail = |message: String| SenderError::Client {
        name: e.name.clone(),
        message,
    };
    let tls = crate::tls::client_config(e.ca_file.as_deref()).map_err(fail)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(e.timeout)
        .connect_timeout(e.timeout)
        // A redirect is an answer like any other non-2xx: never followed
        // with the signed body.
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(e.max_in_flight)
        .user_agent(concat!("smtp-once/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|err| fail(err.to_string()))
}

impl Sender {
    /// Starts sending for `endpoints` (none: no sender at all).
    pub async fn start(
        endpoints: &[WebhookEndpoint],
        outbox: Arc<dyn WebhookOutbox>,
        keep: Duration,
    ) -> Result<Option<Sender>, SenderError> {
        if endpoints.is_empty() {
            return Ok(None);
        }
        let mut map = HashMap::new();
        for e in endpoints {
            map.insert(
                e.name.clone(),
                Endpoint {
                    client: client_for(e)?,
                    slots: Arc::new(Semaphore::new(e.max_in_flight)),
                    window: Arc::new(Semaphore::new(e.max_in_flight * WINDOW_FACTOR)),
                    state: AtomicU8::new(OPEN),
                    config: e.clone(),
                },
            );
        }
        let ctx = Arc::new(Ctx {
            outbox,
            window_freed: Notify::new(),
            endpoints: map,
            keep,
        });
        // Leases a previous run of this node left: its POSTs are gone.
        if let Err(e) = ctx.outbox.release_events(now_millis()).await {
            tracing::warn!(error = %e, "webhooks: cannot take back earlier leases; they expire");
        }
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(ctx, stop_rx));
        Ok(Some(Sender { stop, task }))
    }

    /// Stops claiming and waits for the POSTs in flight (each within its
    /// endpoint's timeout) and their records.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let mut in_flight = JoinSet::new();
    let mut last_purge = tokio::time::Instant::now();
    loop {
        if *stop.borrow() {
            break;
        }
        // Finished tasks' results are kept until joined.
        while in_flight.try_join_next().is_some() {}
        let mut claimed_any = false;
        for (name, endpoint) in &ctx.endpoints {
            let free = endpoint.window.available_permits();
            if !endpoint.room_to_claim() || !may_claim(&ctx, name, endpoint).await {
                continue;
            }
            let now = now_millis();
            match ctx
                .outbox
                .claim_events(now, now + millis(LEASE), free, vec![name.clone()])
                .await
            {
                Ok(events) => {
                    for event in events {
                        claimed_any = true;
                        let Ok(claimed) = endpoint.window.clone().try_acquire_owned() else {
                            break;
                        };
                        let ctx = ctx.clone();
                        in_flight.spawn(async move {
                            send_one(&ctx, event).await;
                            drop(claimed);
                            ctx.window_freed.notify_one();
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!(endpoint = %name, error = %e, "webhooks: cannot claim events")
                }
            }
        }
        if last_purge.elapsed() >= PURGE_EVERY {
            last_purge = tokio::time::Instant::now();
            purge(&ctx).await;
        }
        if claimed_any {
            // More may be due at once; the window permitting, claim again.
            tokio::task::yield_now().await;
            continue;
        }
        // Only endpoints with room in their window can take an event now;
        // with none, the next recorded event is the wake-up.
        let open: Vec<String> = ctx
            .endpoints
            .iter()
            .filter(|(_, e)| e.room_to_claim())
            .map(|(name, _)| name.clone())
            .collect();
        let wait = if open.is_empty() {
            Duration::from_secs(3600)
        } else {
            match ctx.outbox.next_event_due(open).await {
                Ok(Some(due)) => until(due).min(POLL),
                _ => POLL,
            }
        };
        tokio::select! {
            _ = stop.changed() => {}
            () = ctx.outbox.events_queued() => {}
            () = ctx.window_freed.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
    while in_flight.join_next().await.is_some() {}
    if let Err(e) = ctx.outbox.release_events(now_millis()).await {
        tracing::warn!(error = %e, "webhooks: cannot release leases at shutdown; they expire");
    }
}

/// False while this process is disabling the endpoint, or knows it
/// disabled; once the outbox shows it due again (`webhooks enable`), open.
async fn may_claim(ctx: &Ctx, name: &str, endpoint: &Endpoint) -> bool {
    match endpoint.state.load(Ordering::Acquire) {
        OPEN => true,
        DISABLING => false,
        _ => {
            // Disabled endpoints' events never count as due.
            let due = ctx.outbox.next_event_due(vec![name.to_owned()]).await;
            let enabled = matches!(due, Ok(Some(_)));
            if enabled {
                endpoint.state.store(OPEN, Ordering::Release);
                tracing::info!(endpoint = %name, "webhook endpoint enabled again");
            }
            enabled
        }
    }
}

async fn purge(ctx: &Ctx) {
    let before = now_millis().saturating_sub(millis(ctx.keep));
    if let Err(e) = ctx.outbox.purge_events(before, PURGE_BATCH).await {
        tracing::warn!(error = %e, "webhooks: purge of old events failed");
    }
}

/// One POST of one event (within one of the endpoint's slots), then its
/// record.
async fn send_one(ctx: &Ctx, event: OutboxEvent) {
    let Some(endpoint) = ctx.endpoints.get(&event.endpoint) else {
        return;
    };
    let Ok(slot) = endpoint.slots.clone().acquire_owned().await else {
        return;
    };
    if endpoint.state.load(Ordering::Acquire) != OPEN {
        if let Err(err) = ctx.outbox.unclaim_event(event.row_id).await {
            tracing::warn!(row = event.row_id, error = %err, "webhooks: cannot give an event back; its lease expires");
        }
        return;
    }
    let e = &endpoint.config;
    let timestamp = now_millis() / 1000;
    let signature =
        super::sign::signature(&e.secrets, &event.webhook_id, timestamp, &event.payload);
    let answer = match endpoint
        .client
        .post(&e.url)
        .header("content-type", "application/json")
        .header("webhook-id", &event.webhook_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(event.payload.clone())
        .send()
        .await
    {
        Ok(response) => {
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(policy::parse_retry_after);
            Answer::Status {
                code: response.status().as_u16(),
                retry_after,
            }
        }
        Err(err) => Answer::NoAnswer(describe(&err)),
    };
    let now = now_millis();
    let (next, disable) = policy::judge(
        &answer,
        event.attempts,
        &e.retry_schedule,
        now,
        policy::jitter(),
    );
    if disable.is_some() {
        // Before the slot is free: the next event waiting for it sees this.
        endpoint.state.store(DISABLING, Ordering::Release);
    }
    drop(slot);
    let (status, error) = match &answer {
        Answer::Status { code, .. } if (200..300).contains(code) => (Some(*code), None),
        Answer::Status { code, .. } => (Some(*code), Some(format!("HTTP {code}"))),
        Answer::NoAnswer(why) => (None, Some(why.clone())),
    };
    crate::metrics::global().webhook_attempt(match next {
        EventNext::Delivered => "delivered",
        EventNext::RetryAt(_) => "retry",
        EventNext::Failed => "failed",
    });
    log_attempt(&event, &next, status, error.as_deref());
    if let Some(reason) = &disable {
        tracing::warn!(endpoint = %e.name, reason = %reason, "webhook endpoint disabled; `smtp-once webhooks enable` turns it back on");
    }
    let attempt = EventAttempt {
        row_id: event.row_id,
        endpoint: event.endpoint.clone(),
        at: now,
        status,
        error,
        next,
        disable,
    };
    let recorded = record(ctx, attempt).await;
    if endpoint.state.load(Ordering::Acquire) == DISABLING {
        endpoint.state.store(DISABLED, Ordering::Release);
    }
    let Some(health) = recorded else {
        return;
    };
    if !health.disabled && policy::failing_too_long(health.failing_since, now, e.disable_after) {
        let reason = format!(
            "every attempt failed for {} h",
            e.disable_after.as_secs() / 3600
        );
        tracing::warn!(endpoint = %e.name, reason = %reason, "webhook endpoint disabled; `smtp-once webhooks enable` turns it back on");
        if let Err(err) = ctx
            .outbox
            .disable_endpoint(e.name.clone(), now, reason)
            .await
        {
            tracing::warn!(endpoint = %e.name, error = %err, "webhooks: cannot disable the endpoint");
        } else {
            endpoint.state.store(DISABLED, Ordering::Release);
        }
    }
}

fn log_attempt(event: &OutboxEvent, next: &EventNext, status: Option<u16>, error: Option<&str>) {
    let attempt = event.attempts + 1;
    match next {
        EventNext::Delivered => tracing::debug!(
            webhook_id = %event.webhook_id, endpoint = %event.endpoint, attempt, "webhook delivered"
        ),
        EventNext::RetryAt(at) => tracing::info!(
            webhook_id = %event.webhook_id, endpoint = %event.endpoint, attempt, ?status,
            error = error.unwrap_or("-"), retry_in_ms = at.saturating_sub(now_millis()),
            "webhook not delivered; will retry"
        ),
        EventNext::Failed => tracing::warn!(
            webhook_id = %event.webhook_id, endpoint = %event.endpoint, attempt, ?status,
            error = error.unwrap_or("-"),
            "webhook failed for good (schedule exhausted); `smtp-once webhooks redeliver` sends it again"
        ),
    }
}

/// The cause of a failed request, in one line (reqwest's own message names
/// only the outer layer).
fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut text = kind.to_owned();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Writes the attempt, retrying until it lands or a shutdown is near: an
/// unrecorded success is sent again after its lease, with the same
/// `webhook-id`, which receivers deduplicate.
async fn record(ctx: &Ctx, attempt: EventAttempt) -> Option<crate::store::outbox::EndpointHealth> {
    let mut delay = Duration::from_millis(50);
    for _ in 0..20 {
        match ctx.outbox.record_event(attempt.clone()).await {
            Ok(health) => return Some(health),
            Err(StoreError::NotFound(_)) => return None,
            Err(e) => {
                tracing::warn!(row = attempt.row_id, error = %e, "webhooks: cannot record an attempt; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RECORD_RETRY_MAX);
            }
        }
    }
    tracing::error!(
        row = attempt.row_id,
        "webhooks: attempt not recorded; the event is sent again when its lease ends"
    );
    None
}

/// Due time as a wait from now (0 if already due).
fn until(due: UnixMillis) -> Duration {
    Duration::from_millis(u64::try_from(due.saturating_sub(now_millis())).unwrap_or(0))
}
