//! The webhook sender: claims due events from the outbox, POSTs each to its
//! endpoint with Standard Webhooks headers, and records the answer. Runs
//! beside acceptance and delivery and never blocks them: they only write
//! outbox rows in their own transactions; a slow endpoint holds only its
//! own `max_in_flight` slots. Fresh events of this node come over the
//! `handoff` inbox; claims take the rest (retries, other nodes' events,
//! redeliveries, events written while the window was full).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use super::handoff::{DISABLED, DISABLING, Direct, Inbox, LEASE, Lane, OPEN, WINDOW_FACTOR};
use super::http::{EndpointClient, Reply};
use super::policy::{self, Answer};
use crate::config::WebhookEndpoint;
use crate::store::outbox::{EventAttempt, EventNext, OutboxEvent, WebhookOutbox};
use crate::store::{StoreError, UnixMillis, now_millis};

/// Without a wake-up (events written by another node or a redelivery
/// from the CLI on SQLite), the outbox is looked at this often.
const POLL: Duration = Duration::from_secs(1);
/// After a wake-up for events written elsewhere, how soon to look.
const NOTIFIED_LOOK: Duration = Duration::from_millis(50);
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
    client: EndpointClient,
    /// POSTs at once (`max_in_flight`).
    slots: Arc<Semaphore>,
    /// The window (events claimed or handed over, not yet recorded) and
    /// the state, shared with the producers. While DISABLING or DISABLED,
    /// events still waiting for a slot are given back untried instead of
    /// meeting the 410 too.
    lane: Arc<Lane>,
}

impl Endpoint {
    /// Claims come in batches of at least `max_in_flight` (or whatever is
    /// free once the window is empty): one claim per recorded event would
    /// cost a writer transaction per event.
    fn room_to_claim(&self) -> bool {
        let free = self.lane.window.available_permits();
        free > 0
            && (free >= self.config.max_in_flight
                || free == self.config.max_in_flight * WINDOW_FACTOR)
    }
}

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

/// HTTPS endpoints are verified against the system's roots, or `ca_file`.
/// A redirect is an answer like any other non-2xx: never followed with the
/// signed body.
fn client_for(e: &WebhookEndpoint) -> Result<EndpointClient, SenderError> {
    EndpointClient::new(&e.url, e.ca_file.as_deref(), e.timeout, e.max_in_flight).map_err(
        |message| SenderError::Client {
            name: e.name.clone(),
            message,
        },
    )
}

impl Sender {
    /// Starts sending for `endpoints` (none: no sender at all), with the
    /// inbox of `handoff::open(endpoints)`.
    pub async fn start(
        endpoints: &[WebhookEndpoint],
        outbox: Arc<dyn WebhookOutbox>,
        keep: Duration,
        inbox: Inbox,
    ) -> Result<Option<Sender>, SenderError> {
        if endpoints.is_empty() {
            return Ok(None);
        }
        let mut map = HashMap::new();
        for e in endpoints {
            let lane = inbox
                .lanes
                .get(&e.name)
                .cloned()
                .ok_or_else(|| SenderError::Client {
                    name: e.name.clone(),
                    message: "no handoff lane (inbox of other endpoints)".into(),
                })?;
            map.insert(
                e.name.clone(),
                Endpoint {
                    lane,
                    client: client_for(e)?,
                    slots: Arc::new(Semaphore::new(e.max_in_flight)),
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
        let task = tokio::spawn(run(ctx, stop_rx, inbox.from_producers));
        Ok(Some(Sender { stop, task }))
    }

    /// Stops claiming and waits for the POSTs in flight (each within its
    /// endpoint's timeout) and their records.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Fresh events of this node arrive over `handed` and are sent at once.
/// The outbox is claimed from only when something there can be due: at
/// start, once the next due time (a retry, an expired lease) or the poll
/// interval comes, and while a lane has a backlog (events written
/// `pending` for want of room). Claiming on every commit would cost a
/// writer transaction per batch for nothing: this node's fresh events are
/// not in the outbox to be claimed.
async fn run(
    ctx: Arc<Ctx>,
    mut stop: watch::Receiver<bool>,
    mut handed: mpsc::UnboundedReceiver<Direct>,
) {
    let mut in_flight = JoinSet::new();
    let mut last_purge = tokio::time::Instant::now();
    let mut next_look = tokio::time::Instant::now();
    loop {
        if *stop.borrow() {
            break;
        }
        // Finished tasks' results are kept until joined.
        while in_flight.try_join_next().is_some() {}
        while let Ok(direct) = handed.try_recv() {
            spawn_send(&ctx, &mut in_flight, direct.event, direct.permit);
        }
        let looking = tokio::time::Instant::now() >= next_look;
        let backlog = ctx
            .endpoints
            .values()
            .any(|e| e.lane.backlog.load(Ordering::Acquire));
        if looking || backlog {
            if claim_all(&ctx, &mut in_flight).await {
                // More may be due at once; the window permitting, claim again.
                tokio::task::yield_now().await;
                continue;
            }
            if looking {
                next_look = tokio::time::Instant::now() + next_wait(&ctx).await;
            }
        }
        if last_purge.elapsed() >= PURGE_EVERY {
            last_purge = tokio::time::Instant::now();
            purge(&ctx).await;
        }
        tokio::select! {
            _ = stop.changed() => {}
            Some(direct) = handed.recv() => {
                spawn_send(&ctx, &mut in_flight, direct.event, direct.permit);
            }
            // Another node's or an operator's events (PostgreSQL NOTIFY), or
            // our own `pending` ones: look soon, in one pass for many.
            () = ctx.outbox.events_queued() => {
                next_look = next_look.min(tokio::time::Instant::now() + NOTIFIED_LOOK);
            }
            // A place came free: a backlog can move on.
            () = ctx.window_freed.notified() => {}
            () = tokio::time::sleep_until(next_look) => {}
        }
    }
    while in_flight.join_next().await.is_some() {}
    if let Err(e) = ctx.outbox.release_events(now_millis()).await {
        tracing::warn!(error = %e, "webhooks: cannot release leases at shutdown; they expire");
    }
}

/// One claim per endpoint with room; true if any event was claimed.
async fn claim_all(ctx: &Arc<Ctx>, in_flight: &mut JoinSet<()>) -> bool {
    let mut claimed_any = false;
    for (name, endpoint) in &ctx.endpoints {
        if !endpoint.room_to_claim() || !may_claim(ctx, name, endpoint).await {
            continue;
        }
        // The places first, since producers take them too: a claimed event
        // without one would wait for its lease to end.
        let places: Vec<_> =
            std::iter::from_fn(|| endpoint.lane.window.clone().try_acquire_owned().ok())
                .take(endpoint.config.max_in_flight * WINDOW_FACTOR)
                .collect();
        if places.is_empty() {
            continue;
        }
        let now = now_millis();
        match ctx
            .outbox
            .claim_events(now, now + millis(LEASE), places.len(), vec![name.clone()])
            .await
        {
            Ok(events) => {
                if events.len() < places.len() {
                    // Nothing more is due: fresh events may go straight to
                    // the sender again.
                    endpoint.lane.backlog.store(false, Ordering::Release);
                }
                for (event, place) in events.into_iter().zip(places) {
                    claimed_any = true;
                    spawn_send(ctx, in_flight, event, place);
                }
            }
            Err(e) => tracing::warn!(endpoint = %name, error = %e, "webhooks: cannot claim events"),
        }
    }
    claimed_any
}

/// Until the next look at the outbox: the next due event of an endpoint
/// with room, at most the poll interval.
async fn next_wait(ctx: &Ctx) -> Duration {
    let open: Vec<String> = ctx
        .endpoints
        .iter()
        .filter(|(_, e)| e.room_to_claim())
        .map(|(name, _)| name.clone())
        .collect();
    if open.is_empty() {
        // A full window: the next recorded event wakes the loop.
        return POLL;
    }
    match ctx.outbox.next_event_due(open).await {
        Ok(Some(due)) => until(due).min(POLL),
        _ => POLL,
    }
}

/// One event's POST and record, holding its place in the window.
fn spawn_send(
    ctx: &Arc<Ctx>,
    in_flight: &mut JoinSet<()>,
    event: OutboxEvent,
    place: tokio::sync::OwnedSemaphorePermit,
) {
    let ctx = ctx.clone();
    in_flight.spawn(async move {
        send_one(&ctx, event).await;
        drop(place);
        ctx.window_freed.notify_one();
    });
}

/// False while this process is disabling the endpoint, or knows it
/// disabled; once the outbox shows it due again (`webhooks enable`), open.
async fn may_claim(ctx: &Ctx, name: &str, endpoint: &Endpoint) -> bool {
    match endpoint.lane.state.load(Ordering::Acquire) {
        OPEN => true,
        DISABLING => false,
        _ => {
            // Disabled endpoints' events never count as due.
            let due = ctx.outbox.next_event_due(vec![name.to_owned()]).await;
            let enabled = matches!(due, Ok(Some(_)));
            if enabled {
                endpoint.lane.state.store(OPEN, Ordering::Release);
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
async fn send_one(ctx: &Ctx, mut event: OutboxEvent) {
    let Some(endpoint) = ctx.endpoints.get(&event.endpoint) else {
        return;
    };
    let Ok(slot) = endpoint.slots.clone().acquire_owned().await else {
        return;
    };
    if endpoint.lane.state.load(Ordering::Acquire) != OPEN {
        if let Err(err) = ctx
            .outbox
            .unclaim_event(event.webhook_id.clone(), event.endpoint.clone())
            .await
        {
            tracing::warn!(webhook_id = %event.webhook_id, error = %err, "webhooks: cannot give an event back; its lease expires");
        }
        return;
    }
    let e = &endpoint.config;
    let timestamp = now_millis() / 1000;
    let signature =
        super::sign::signature(&e.secrets, &event.webhook_id, timestamp, &event.payload);
    let headers = [
        ("content-type", "application/json".to_owned()),
        ("webhook-id", event.webhook_id.clone()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ];
    let answer = match endpoint
        .client
        .post(&headers, std::mem::take(&mut event.payload))
        .await
    {
        Reply::Status { code, retry_after } => Answer::Status {
            code,
            retry_after: retry_after.as_deref().and_then(policy::parse_retry_after),
        },
        Reply::NoAnswer(why) => Answer::NoAnswer(why),
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
        endpoint.lane.state.store(DISABLING, Ordering::Release);
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
        webhook_id: event.webhook_id.clone(),
        endpoint: event.endpoint.clone(),
        at: now,
        status,
        error,
        next,
        disable,
    };
    let recorded = record(ctx, attempt).await;
    if endpoint.lane.state.load(Ordering::Acquire) == DISABLING {
        endpoint.lane.state.store(DISABLED, Ordering::Release);
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
            endpoint.lane.state.store(DISABLED, Ordering::Release);
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
                tracing::warn!(webhook_id = %attempt.webhook_id, error = %e, "webhooks: cannot record an attempt; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RECORD_RETRY_MAX);
            }
        }
    }
    tracing::error!(
        webhook_id = %attempt.webhook_id,
        "webhooks: attempt not recorded; the event is sent again when its lease ends"
    );
    None
}

/// Due time as a wait from now (0 if already due).
fn until(due: UnixMillis) -> Duration {
    Duration::from_millis(u64::try_from(due.saturating_sub(now_millis())).unwrap_or(0))
}
