//! The delivery worker: claims due messages with a lease, delivers each one
//! (one transaction per destination, a bounded number per destination),
//! records the outcome, and stops cleanly.
//!
//! Exactly once per hop: a recipient is recorded as delivered in the same
//! transaction that ends the attempt, and is never sent to again. The gap
//! between the next hop's `250` and that commit (a crash, a kill) repeats
//! the attempt with identical bytes and key, which an idempotent next hop
//! replays instead of delivering twice.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use super::attempt::{self, Loaded};
use super::dsn::{self, Bounce};
use super::outgoing::Outgoing;
use super::plan::{self, Outcome, Plan, Policy};
use super::transport::Transport;
use super::{DeliveryError, RcptResult, Status};
use crate::backlog::Backlog;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::message::key_header::KeyHeaders;
use crate::store::{
    AttemptOutcome, DeliveryQueue, MessageState, NewMessage, StoreError, UnixMillis, queue_id,
};
use crate::webhook::Router;
use crate::webhook::route::Attempted;

/// A running worker.
pub struct Worker {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// For the TLS-RPT reporter, until `serve` takes it.
    tls_reporting: Option<super::tls_rpt::reporter::Parts>,
}

struct Ctx {
    queue: Arc<dyn DeliveryQueue>,
    transport: Transport,
    policy: Policy,
    hostname: String,
    workers: usize,
    /// `relay.paused`: claim nothing.
    paused: bool,
    lease: Duration,
    poll_interval: Duration,
    keep_finished: Duration,
    /// `relay.keep_bodies`: keep finished messages' bodies.
    keep_bodies: bool,
    limiter: Limiter,
    /// Messages with an attempt under way here, until its outcome is
    /// recorded: never claimed again meanwhile, even past their lease (a
    /// record that waits for a full disk can outlast it).
    in_flight: Mutex<HashSet<String>>,
    /// TEST ONLY: see `relay.delivery_test_pause_after_send`.
    test_pause: Duration,
    /// `[[webhook]]` filters: each attempt's events join its record.
    webhooks: Router,
    /// `[idempotency] key_headers`: what the relayed copy replaces.
    key_headers: KeyHeaders,
    /// "Now" for claims, leases, attempt times and the retry schedule.
    /// The loop's waits stay on tokio's timer.
    clock: Arc<dyn Clock>,
    /// The relay's backlog: each attempt that takes a message out of
    /// `queued`/`delivering` makes room for an acceptance.
    backlog: Arc<Backlog>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    /// Takes back leases a previous process left in `queue`, and starts
    /// delivering.
    /// `webhooks` routes each attempt's events (`Router::new(&[])`: none).
    pub async fn start(
        config: &Config,
        queue: Arc<dyn DeliveryQueue>,
        webhooks: Router,
        backlog: Arc<Backlog>,
    ) -> Result<Worker, DeliveryError> {
        Self::start_with_clock(config, queue, webhooks, backlog, Arc::new(SystemClock)).await
    }

    /// `start`, reading "now" from `clock` (tests drive leases and the
    /// retry schedule with a `ManualClock`; the loop still polls on
    /// tokio's timer, at most every `relay.poll_interval`).
    pub async fn start_with_clock(
        config: &Config,
        queue: Arc<dyn DeliveryQueue>,
        webhooks: Router,
        backlog: Arc<Backlog>,
        clock: Arc<dyn Clock>,
    ) -> Result<Worker, DeliveryError> {
        let transport = Transport::from_config(config)?;
        let tls_reporting = transport.tls_reporting();
        let d = &config.delivery;
        let ctx = Arc::new(Ctx {
            queue,
            transport,
            policy: Policy {
                retry_schedule: d.retry_schedule.clone(),
                max_age: d.max_age,
            },
            hostname: config.hostname.clone(),
            workers: d.workers,
            paused: d.paused,
            lease: d.lease,
            poll_interval: d.poll_interval,
            keep_finished: d.keep_finished,
            keep_bodies: d.keep_bodies,
            limiter: Limiter::new(d.max_per_destination),
            in_flight: Mutex::new(HashSet::new()),
            test_pause: d.test_pause_after_send,
            webhooks,
            key_headers: KeyHeaders::new(config.key_headers.iter().cloned()),
            clock,
            backlog,
        });
        if !ctx.test_pause.is_zero() {
            tracing::warn!(pause = ?ctx.test_pause, "relay.delivery_test_pause_after_send is set: TEST ONLY");
        }
        let (stop, stop_rx) = watch::channel(false);
        // The store holds this data directory's lock, so any lease in it
        // belongs to a process that is gone: no need to wait for expiry.
        // On a full disk this write fails; the daemon still starts (and
        // answers 451) and the loop takes the leases back once it can.
        let released = take_back_leases(&ctx, true).await;
        let task = tokio::spawn(run(ctx, stop_rx, config.shutdown_grace, released));
        Ok(Worker {
            stop,
            task,
            tls_reporting,
        })
    }

    /// What the TLS-RPT reporter needs (`relay.tls_rpt` in `mx` mode),
    /// once.
    pub fn take_tls_reporting(&mut self) -> Option<super::tls_rpt::reporter::Parts> {
        self.tls_reporting.take()
    }

    /// Stops claiming, lets deliveries in flight finish within the grace
    /// period given at start, then hands back the leases of the rest.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Releases every lease a previous run left; false if it could not (said
/// once, at start; the loop's retries are quiet).
async fn take_back_leases(ctx: &Arc<Ctx>, first: bool) -> bool {
    match ctx.queue.release_all(ctx.now()).await {
        Ok(0) => true,
        Ok(released) => {
            tracing::info!(released, "took back messages a previous run was delivering");
            true
        }
        Err(e) if first => {
            tracing::error!(error = %e, "cannot take back the previous run's leases; delivery waits until it can");
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "still cannot take back the previous run's leases");
            false
        }
    }
}

async fn run(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>, grace: Duration, mut released: bool) {
    if ctx.paused {
        tracing::warn!("relay.paused is set: mail is accepted and queued, nothing is delivered");
        let _ = stop.wait_for(|s| *s).await;
        return;
    }
    let permits = Arc::new(Semaphore::new(ctx.workers));
    let mut tasks = JoinSet::new();
    let mut next_purge = tokio::time::Instant::now();
    let mut paused = false;
    // While deliveries run, claim once this many workers are free rather
    // than once per finished delivery: claims go in batches.
    let batch_at = (ctx.workers / 4).max(1);
    // Leases of running attempts are renewed at a third of their length,
    // so a slow delivery is never claimed by another node meanwhile.
    let renew_every = (ctx.lease / 3).max(Duration::from_millis(100));
    let mut next_renew = tokio::time::Instant::now() + renew_every;
    while !*stop.borrow() {
        while tasks.try_join_next().is_some() {}
        if tokio::time::Instant::now() >= next_purge {
            next_purge += PURGE_EVERY;
            purge_finished(&ctx).await;
        }
        if tokio::time::Instant::now() >= next_renew {
            next_renew = tokio::time::Instant::now() + renew_every;
            renew_leases(&ctx).await;
        }
        let free = permits.available_permits();
        let busy = free < batch_at && !tasks.is_empty();
        let (mut claimed, mut failed) = (0, false);
        // Claims skip leased messages, so the previous run's leases go
        // first or those messages would wait for them to expire.
        if !released {
            released = take_back_leases(&ctx, false).await;
            failed = !released;
        }
        if free > 0 && !busy && released {
            let now = ctx.now();
            let lease_until = now.saturating_add(millis(ctx.lease));
            match ctx
                .queue
                .claim(now, lease_until, free, ctx.in_flight_ids())
                .await
            {
                Ok(messages) => {
                    if paused {
                        tracing::warn!("the queue database is back; delivery resumed");
                        paused = false;
                    }
                    claimed = messages.len();
                    for msg in messages {
                        let Ok(permit) = permits.clone().try_acquire_owned() else {
                            break;
                        };
                        let guard = InFlight::new(&ctx, &msg.id);
                        let mut loaded = Loaded::from(msg);
                        loaded.msg.key_headers = ctx.key_headers.clone();
                        tasks.spawn(deliver_one(ctx.clone(), loaded, permit, guard));
                    }
                }
                Err(StoreError::Unavailable(why)) => {
                    if !paused {
                        tracing::error!("delivery paused, nothing is claimed: {why}");
                        paused = true;
                    }
                    failed = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim messages");
                    failed = true;
                }
            }
        }
        if claimed > 0 && claimed == free {
            continue; // maybe more are due
        }
        // Busy: a finished delivery wakes the loop. Idle: newly queued mail
        // does, or the next due time (a retry, an expired lease).
        let wait = if busy || free == 0 || failed {
            ctx.poll_interval
        } else {
            match ctx.queue.next_due(ctx.in_flight_ids()).await {
                Ok(Some(due)) => Duration::from_millis(u64::try_from(due - ctx.now()).unwrap_or(0))
                    .min(ctx.poll_interval),
                _ => ctx.poll_interval,
            }
        };
        let wait = wait.min(next_renew.saturating_duration_since(tokio::time::Instant::now()));
        tokio::select! {
            _ = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = ctx.queue.queued(), if !failed => {}
        }
    }
    let in_flight = tasks.len();
    if in_flight > 0 {
        tracing::info!(in_flight, "waiting for deliveries in flight");
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "shutdown grace period over; abandoning deliveries in flight"
        );
        tasks.shutdown().await;
    }
    match ctx.queue.release_all(ctx.now()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            released = n,
            "leases released; those messages are retried at next start"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot release leases; they expire by themselves"),
    }
    ctx.transport.close().await;
    tracing::info!("delivery worker stopped");
}

/// The next hop refused the submitter's key as already used for a different
/// message (E01005). Our own retries send the same bytes for the same
/// recipients, so this is someone else's message under that key there:
/// another of our workspaces (the next hop scopes keys by our one relay
/// account), or one older than our retention. Those recipients are tried
/// again at once under the key derived from the queue id, which only this
/// message has. The choice is a function of the next hop's answer, so after
/// a crash the retry takes the same path and is replayed, not sent twice.
async fn retry_key_collisions(
    transport: &Transport,
    msg: &Outgoing,
    results: &mut Vec<RcptResult>,
) {
    if msg.idempotency_key.is_none() {
        return;
    }
    let collided: Vec<String> = results
        .iter()
        .filter(|r| r.status == Status::Failed && r.reply.contains("E01005"))
        .map(|r| r.recipient.clone())
        .collect();
    if collided.is_empty() {
        return;
    }
    tracing::warn!(
        queue_id = %msg.id,
        recipients = collided.len(),
        "next hop has the key for another message (E01005); retrying under the queue-id key"
    );
    let derived = Outgoing {
        idempotency_key: None,
        ..msg.clone()
    };
    let retried = transport.deliver(&derived, &collided).await;
    results.retain(|r| !collided.contains(&r.recipient));
    results.extend(retried);
}

async fn renew_leases(ctx: &Arc<Ctx>) {
    let ids = ctx.in_flight_ids();
    if ids.is_empty() {
        return;
    }
    let now = ctx.now();
    let until = now.saturating_add(millis(ctx.lease));
    if let Err(e) = ctx.queue.renew(ids, now, until).await {
        tracing::warn!(error = %e, "cannot renew delivery leases; retried shortly");
    }
}

/// How often finished messages older than `relay.keep_finished` are removed.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// Small batches keep each write transaction short beside acceptances.
async fn purge_finished(ctx: &Arc<Ctx>) {
    const BATCH: usize = 500;
    let before = ctx.now().saturating_sub(millis(ctx.keep_finished));
    loop {
        match ctx.queue.purge_finished(before, BATCH).await {
            Ok(n) if n > 0 => {
                tracing::info!(removed = n, "finished messages removed from the queue")
            }
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove finished messages");
                return;
            }
        }
    }
}

impl Ctx {
    fn now(&self) -> UnixMillis {
        self.clock.now_millis()
    }

    fn in_flight_ids(&self) -> Vec<String> {
        let set = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        set.iter().cloned().collect()
    }
}

/// Marks a message in flight for as long as its task lives (an aborted
/// task too).
struct InFlight {
    ctx: Arc<Ctx>,
    id: String,
}

impl InFlight {
    fn new(ctx: &Arc<Ctx>, id: &str) -> Self {
        let mut set = ctx.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id.to_owned());
        Self {
            ctx: ctx.clone(),
            id: id.to_owned(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut set = self.ctx.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        set.remove(&self.id);
    }
}

async fn deliver_one(
    ctx: Arc<Ctx>,
    loaded: Loaded,
    _permit: OwnedSemaphorePermit,
    _in_flight: InFlight,
) {
    let id = loaded.msg.id.clone();
    let pending = loaded.pending();
    let msg = Arc::new(loaded.msg.clone());
    let results = deliver_to_destinations(&ctx, &msg, &pending).await;
    if !ctx.test_pause.is_zero() && results.iter().any(|r| r.status == Status::Delivered) {
        // TEST ONLY: the crash window between the next hop's 250 and our
        // record of it, widened so a test can kill the process inside it.
        tracing::warn!(queue_id = %id, "test pause after send");
        tokio::time::sleep(ctx.test_pause).await;
    }
    let now = ctx.now();
    let earlier: Vec<Outcome> = loaded.done.values().copied().collect();
    let plan = plan::plan(
        &ctx.policy,
        loaded.created_at,
        loaded.attempts + 1,
        &earlier,
        results,
        now,
    );
    for row in &plan.rows {
        crate::metrics::global().delivery_attempt(row.outcome.as_str());
        tracing::info!(
            queue_id = %id, to = ?row.recipient, outcome = row.outcome.as_str(),
            hop = row.next_hop.as_deref().unwrap_or("-"), reply = ?row.reply, "delivery attempt"
        );
    }
    let bounce = bounce_for(&ctx, &loaded, &plan, now);
    let routed = ctx.webhooks.attempted(plan.rows.iter().map(|r| Attempted {
        queue_id: &id,
        workspace: &loaded.workspace,
        idempotency_key: loaded.msg.idempotency_key.as_deref(),
        recipient: &r.recipient,
        outcome: r.outcome.as_str(),
        reply: &r.reply,
        next_hop: r.next_hop.as_deref(),
        attempt: loaded.attempts + 1,
        at: now,
    }));
    if record(
        &ctx,
        attempt::outcome(&id, &plan, now, bounce, routed.events, ctx.keep_bodies),
    )
    .await
    {
        routed.handover.committed();
    }
}

/// One transaction per destination, concurrently, each within the
/// per-destination limit and cut off at half the lease.
async fn deliver_to_destinations(
    ctx: &Arc<Ctx>,
    msg: &Arc<Outgoing>,
    pending: &[String],
) -> Vec<RcptResult> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for rcpt in pending {
        let dest = ctx.transport.destination(rcpt);
        match groups.iter_mut().find(|(d, _)| *d == dest) {
            Some((_, rcpts)) => rcpts.push(rcpt.clone()),
            None => groups.push((dest, vec![rcpt.clone()])),
        }
    }
    let mut set = JoinSet::new();
    for (dest, rcpts) in groups {
        let ctx = ctx.clone();
        let msg = msg.clone();
        set.spawn(async move {
            // The wait for a destination slot counts against the cut-off
            // too: past the lease another claim could deliver it again.
            let attempt = async {
                let _slot = ctx.limiter.acquire(&dest).await;
                let mut results = ctx.transport.deliver(&msg, &rcpts).await;
                retry_key_collisions(&ctx.transport, &msg, &mut results).await;
                results
            };
            match tokio::time::timeout(ctx.lease / 2, attempt).await {
                Ok(results) => (rcpts, Some(results)),
                Err(_) => (rcpts, None),
            }
        });
    }
    let mut results = Vec::with_capacity(pending.len());
    let mut answered: Vec<String> = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((rcpts, Some(r))) => {
                answered.extend(rcpts);
                results.extend(r);
            }
            Ok((rcpts, None)) => {
                answered.extend(rcpts.iter().cloned());
                results.extend(RcptResult::all(
                    &rcpts,
                    Status::Deferred,
                    "451 4.4.7 delivery attempt timed out",
                    None,
                ));
            }
            Err(e) => tracing::error!(error = %e, "delivery task failed"),
        }
    }
    // A recipient without a result (a task that panicked) is retried.
    let missing: Vec<String> = pending
        .iter()
        .filter(|r| !answered.contains(r))
        .cloned()
        .collect();
    results.extend(RcptResult::all(
        &missing,
        Status::Deferred,
        "451 4.3.0 internal error",
        None,
    ));
    results
}

/// The notification for recipients that failed for good in this attempt:
/// none for a message with the null reverse-path (never a bounce of a
/// bounce).
fn bounce_for(ctx: &Ctx, loaded: &Loaded, plan: &Plan, now: UnixMillis) -> Option<NewMessage> {
    let failures: Vec<_> = plan.bounced().cloned().collect();
    if failures.is_empty() || loaded.msg.reverse_path.is_empty() {
        return None;
    }
    if let Err(e) = crate::address::ForwardPath::parse(&loaded.msg.reverse_path) {
        // Delivery refused it too: no notification to an address that
        // cannot be written into a header or RCPT TO.
        tracing::warn!(queue_id = %loaded.msg.id, sender = ?loaded.msg.reverse_path, reason = %e, "no bounce: unsafe sender address");
        return None;
    }
    let dsn_id = queue_id::next();
    let mut original = loaded.msg.trace.clone().into_bytes();
    original.extend_from_slice(&loaded.msg.body);
    let body = dsn::build(&Bounce {
        hostname: &ctx.hostname,
        queue_id: &loaded.msg.id,
        sender: &loaded.msg.reverse_path,
        arrival: loaded.created_at,
        now,
        failures: &failures,
        original: &original,
        dsn_id: &dsn_id,
    });
    let trace = format!(
        "Received: by {} (smtp-once) id {dsn_id};\r\n\t{}\r\n",
        ctx.hostname,
        crate::time::rfc5322_date(now / 1000)
    );
    Some(NewMessage {
        id: dsn_id,
        workspace: loaded.workspace.clone(),
        account: "MAILER-DAEMON".into(),
        reverse_path: String::new(),
        recipients: vec![loaded.msg.reverse_path.clone()],
        idempotency_key: None,
        trace,
        body,
        // The report carries the header only, never the content
        // REQUIRETLS protected (RFC 8689 5).
        mail_params: None,
        created_at: now,
    })
}

/// The longest wait between two tries of a record.
const RECORD_RETRY_MAX: Duration = Duration::from_secs(1);
/// How often a record that keeps failing is logged again.
const RECORD_LOG_EVERY: Duration = Duration::from_secs(60);

/// Writes the attempt, retrying until it lands (a full disk, a lock held
/// too long): until then the message stays in flight here and is not
/// claimed again, so it is never sent twice because a record failed, and
/// its lease is released as soon as the disk allows. Only shutdown stops
/// the retries; the next start then repeats the attempt (the crash window).
/// True once recorded (with the attempt's events); false if the message
/// was deleted meanwhile (nothing written).
async fn record(ctx: &Arc<Ctx>, outcome: AttemptOutcome) -> bool {
    let id = outcome.id.clone();
    let mut delay = Duration::from_millis(50);
    let mut failures = 0u32;
    let mut logged: Option<tokio::time::Instant> = None;
    loop {
        match ctx.queue.record(outcome.clone()).await {
            Ok(Some(state)) => {
                if !matches!(state, MessageState::Queued | MessageState::Delivering) {
                    ctx.backlog.finished();
                }
                if failures > 0 {
                    tracing::warn!(queue_id = %id, failures, "delivery recorded after failed tries");
                }
                if let Some(dsn) = &outcome.bounce {
                    tracing::info!(queue_id = %id, dsn = %dsn.id, to = ?dsn.recipients, "delivery status notification queued");
                }
                // A message delivered to every recipient of this attempt is
                // said by its attempt lines; one line less per message.
                let all_delivered = outcome.rows.iter().all(|r| r.outcome == "delivered");
                if !(state == MessageState::Delivered && all_delivered) {
                    log_state(&id, state, outcome.next_attempt_at, ctx.now());
                }
                return true;
            }
            Ok(None) => {
                tracing::info!(queue_id = %id, "message deleted during delivery; outcome not recorded");
                return false;
            }
            Err(e) => {
                failures += 1;
                if logged.is_none_or(|at| at.elapsed() >= RECORD_LOG_EVERY) {
                    tracing::error!(
                        queue_id = %id, error = %e, failures,
                        "cannot record delivery; retrying until it lands (not claimed again meanwhile)"
                    );
                    logged = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RECORD_RETRY_MAX);
            }
        }
    }
}

fn log_state(id: &str, state: MessageState, next: Option<UnixMillis>, now: UnixMillis) {
    match next {
        Some(next) if state == MessageState::Deferred => {
            let in_ms = next - now;
            tracing::info!(queue_id = %id, state = state.as_str(), next_attempt_in_ms = in_ms, "message deferred");
        }
        _ => tracing::info!(queue_id = %id, state = state.as_str(), "message state"),
    }
}

/// At most `max` transactions at a time to one destination.
struct Limiter {
    max: usize,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Limiter {
    fn new(max: usize) -> Self {
        Self {
            max,
            slots: Mutex::new(HashMap::new()),
        }
    }

    async fn acquire(&self, destination: &str) -> Option<OwnedSemaphorePermit> {
        let semaphore = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            if slots.len() > 1024 {
                // Forget idle destinations so the map stays small.
                slots.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < self.max);
            }
            slots
                .entry(destination.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.max)))
                .clone()
        };
        semaphore.acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limiter_bounds_each_destination_separately() {
        let limiter = Limiter::new(2);
        let a1 = limiter.acquire("a").await;
        let _a2 = limiter.acquire("a").await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), limiter.acquire("a"))
                .await
                .is_err()
        );
        assert!(limiter.acquire("b").await.is_some());
        drop(a1);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), limiter.acquire("a"))
                .await
                .is_ok()
        );
    }
}
