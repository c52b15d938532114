//! The acceptance pipeline: what happens between the final `.` (or `BDAT
//! LAST`) and the reply. Key, MIME limits, fingerprint, claim, ledger lookup,
//! decision, then one atomic commit of ledger entry and queue row. The reply
//! is built only from what was committed: never a `250` before COMMIT
//! returned.
//!
//! Everything that reads the whole message (key, MIME limits, fingerprint,
//! `From:` check: [`facts`]) runs first, on the [`parse_pool`]'s threads,
//! never on an async worker (except for small messages, see [`INLINE_MAX`]).
//!
//! A new queue row is DKIM-signed ([`sign`]) after the decision and before
//! the commit, and the signature is stored with it: every relay attempt
//! then sends the same bytes, which the next hop deduplicates by key and
//! content. Replays and rejections are never signed.
//!
//! A small keyed message that will not be signed skips the lookup: its
//! commit checks the key under the write lock anyway, and only a held key
//! comes back to be looked up and decided (`Acceptor::run`).

pub mod channel;
mod facts;
pub mod from_header;
pub mod operation;
pub mod parse_pool;
mod received;
mod sign;

use std::sync::Arc;
use std::time::Duration;

use crate::backlog::Backlog;
use crate::clock::{Clock, SystemClock};
use crate::config::Limits;
use crate::content_check::check_content;
use crate::dkim::Signers;
use crate::idempotency::claims::Claims;
use crate::idempotency::decision::{Decision, decide};
use crate::idempotency::fingerprint::Fingerprint;
use crate::idempotency::key_hash;
use crate::idempotency::transit::TransitHeaders;
use crate::idempotency::volatile::VolatileHeaders;
use crate::message::key_header::KeyHeaders;
use crate::message::mime_limits::MimeLimits;
use crate::metrics::{self, Outcome};
use crate::store::{
    Acceptance, CommitOutcome, LedgerEntry, NewLedgerEntry, NewMessage, Store, StoreError,
    UnixMillis, queue_id,
};
use crate::submission::Submission;
use crate::webhook::Router;
use crate::webhook::route::Accepted;
use channel::{ChannelWording, KeySource};

use facts::{Facts, IdentityRules, Verdict, earlier_fingerprints};
use from_header::SenderRefusal;
use parse_pool::ParsePool;
pub use received::TraceOptions;
use received::received_header;

/// Messages up to this size are looked at on the async worker: that takes
/// microseconds, and even unchecked (32 bytes a level) they cannot nest deep
/// enough to matter for a worker's 2 MiB stack (a debug build needs under
/// 640 bytes a level). The pool's thread hop would cost them more than the
/// work itself.
const INLINE_MAX: usize = 32 * 1024;

pub struct Acceptor {
    store: Arc<dyn Store>,
    claims: Claims,
    retention: Duration,
    hostname: String,
    /// MIME limits, key headers, and the headers the fingerprint leaves
    /// out (`[limits]`, `[idempotency]`); shared with the parse pool.
    rules: Arc<IdentityRules>,
    pool: ParsePool,
    /// `[[webhook]]` filters: `message.accepted` rows join the commit.
    webhooks: Router,
    /// `[[dkim]]` keys: a new message whose `From:` domain has one is
    /// signed before its commit.
    dkim: Arc<Signers>,
    /// What the `Received:` header names (`[server] received_auth_header`).
    trace: TraceOptions,
    /// "Now" for ledger lookups and the times stamped on what is stored.
    clock: Arc<dyn Clock>,
    /// The relay's backlog: a new message waits for room before its commit.
    backlog: Arc<Backlog>,
}

/// A key that passed validation, with the request's fingerprint.
#[derive(Clone)]
struct Keyed {
    key: String,
    hash: String,
    fingerprint: Fingerprint,
}

/// Whether `execute` runs before the key was looked up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Straight to the commit: a held key comes back undecided.
    BeforeLookup,
    /// After the decision (or without a key): every outcome is answered.
    Decided,
}

/// What `execute` came to.
enum Executed {
    Answered(Vec<u8>, Outcome),
    /// Only before a lookup: the key is held (nothing was written), or
    /// the commit failed in a way a replay must not be told; look the key
    /// up and decide. (A message that goes before its lookup is one that
    /// is not signed, so signing cannot fail it.)
    Undecided,
}

impl Executed {
    /// The answer of an attempt made after the decision, which is never
    /// `Undecided`; should it be, the client is told to retry (E01004).
    fn answer(self, channel: &dyn ChannelWording) -> (Vec<u8>, Outcome) {
        match self {
            Executed::Answered(reply, outcome) => (reply, outcome),
            Executed::Undecided => (channel.in_progress(), Outcome::InProgress),
        }
    }
}

impl Acceptor {
    pub fn new(
        store: Arc<dyn Store>,
        retention: Duration,
        hostname: String,
        limits: &Limits,
        volatile: VolatileHeaders,
    ) -> Result<Self, String> {
        let pool = ParsePool::start(ParsePool::default_threads()).map_err(|e| e.to_string())?;
        Ok(Self {
            store,
            claims: Claims::default(),
            retention,
            hostname,
            rules: Arc::new(IdentityRules {
                limits: MimeLimits {
                    // config refuses a depth above MAX_MIME_DEPTH_CEILING.
                    max_depth: limits.max_mime_depth,
                    max_parts: limits.max_mime_parts,
                },
                volatile,
                transit: TransitHeaders::default(),
                key_headers: KeyHeaders::default(),
                max_hops: limits.max_hops,
            }),
            pool,
            webhooks: Router::default(),
            dkim: Arc::new(Signers::default()),
            trace: TraceOptions::default(),
            clock: Arc::new(SystemClock),
            backlog: Arc::new(Backlog::unlimited()),
        })
    }

    /// New messages wait (at most its `in_flow_delay`) while `backlog` is
    /// over its limit, and count into it once committed.
    pub fn with_backlog(mut self, backlog: Arc<Backlog>) -> Self {
        self.backlog = backlog;
        self
    }

    /// Reads "now" from `clock` instead of the system's (tests drive
    /// retention with a `ManualClock`).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The trace fields a keyed message's identity leaves out
    /// (`[idempotency] transit_headers`).
    pub fn with_transit(mut self, transit: TransitHeaders) -> Self {
        Arc::make_mut(&mut self.rules).transit = transit;
        self
    }

    /// What the `Received:` header of each new message names.
    pub fn with_trace(mut self, trace: TraceOptions) -> Self {
        self.trace = trace;
        self
    }

    /// Reads an SMTP message's key from these headers.
    pub fn with_key_headers(mut self, key_headers: KeyHeaders) -> Self {
        Arc::make_mut(&mut self.rules).key_headers = key_headers;
        self
    }

    /// Signs each new message whose `From:` domain has a key.
    pub fn with_dkim(mut self, signers: Signers) -> Self {
        self.dkim = Arc::new(signers);
        self
    }

    /// Writes a `message.accepted` event into the outbox with each
    /// acceptance, for the endpoints that want it.
    pub fn with_webhooks(mut self, webhooks: Router) -> Self {
        self.webhooks = webhooks;
        self
    }

    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// The pipeline for any channel: `channel` words the answer (each
    /// front brings its own) and `source` says where the key is.
    pub async fn accept_via(
        &self,
        sub: Submission,
        channel: &dyn ChannelWording,
        source: KeySource,
    ) -> Vec<u8> {
        let (reply, outcome) = self.run(sub, channel, source).await;
        metrics::global().submission(channel.metric(), outcome);
        reply
    }

    async fn run(
        &self,
        sub: Submission,
        channel: &dyn ChannelWording,
        source: KeySource,
    ) -> (Vec<u8>, Outcome) {
        let workspace = sub.submitter.workspace().to_owned();
        let peer = sub.peer;
        // The content rule first (every channel, the message as stored),
        // then the facts; both read the whole message.
        let look = |sub: &Submission, source: &KeySource, rules: &IdentityRules| {
            check_content(&sub.content).map(|()| Facts::of(sub, source, rules))
        };
        let looked_at = if sub.content.len() <= INLINE_MAX {
            let facts = look(&sub, &source, &self.rules);
            Ok((sub, source, facts))
        } else {
            let rules = Arc::clone(&self.rules);
            self.pool
                .run(move || {
                    let facts = look(&sub, &source, &rules);
                    (sub, source, facts)
                })
                .await
        };
        let (sub, source, facts) = match looked_at {
            Ok((sub, source, Ok(facts))) => (sub, source, facts),
            Ok((_, _, Err(fault))) => {
                tracing::info!(%workspace, %peer, %fault, "refused: content rule");
                return (channel.content_refused(&fault), Outcome::Invalid);
            }
            Err(e) => {
                tracing::error!(%workspace, %peer, error = %e, "not accepted: message analysis failed");
                return (channel.analysis_failed(), Outcome::Unavailable);
            }
        };
        let (key, fingerprint) = match facts.verdict {
            // Not stored under the key either: it depends on the bytes alone.
            Verdict::TooManyHops { count, limit } => {
                tracing::warn!(%workspace, %peer, count, limit, "refused: too many hops (mail loop?)");
                return (channel.too_many_hops(count, limit), Outcome::Invalid);
            }
            Verdict::BadKey(e) => {
                tracing::info!(%workspace, %peer, error = %e, "rejected E01001");
                return (channel.bad_key(&e), Outcome::Invalid);
            }
            // Not stored under the key: the refusal depends only on the
            // bytes and the limits, so an identical retry gets it again, and
            // no fingerprint can be taken without the parse refused here.
            Verdict::OverLimits { error, key } => {
                let key = key.map_or_else(|| "-".to_owned(), |k| key_hash(&workspace, &k));
                tracing::info!(%workspace, %key, %peer, %error, "refused: MIME limits");
                return (channel.over_limits(&error), Outcome::Invalid);
            }
            Verdict::Unkeyed => {
                return self
                    .execute(sub, channel, None, facts.from_rejection, Attempt::Decided)
                    .await
                    .answer(channel);
            }
            Verdict::Keyed(key, fingerprint) => (key, fingerprint),
        };
        let hash = key_hash(&workspace, &key);
        let Some(_claim) = self.claims.try_claim(&workspace, &key) else {
            tracing::info!(%workspace, key = %hash, "refused E01004: key in progress");
            return (channel.in_progress(), Outcome::InProgress);
        };
        let keyed = Keyed {
            fingerprint,
            key,
            hash,
        };
        // Nearly every key is new: a small message goes straight to its
        // commit, whose check of the key under the write lock answers what
        // a lookup would. Only a held key (or a failure that a replay must
        // not get) comes back to be looked up and decided. A lookup of a
        // new key on SQLite descends the key index of a fresh reader from
        // its root, costlier as the ledger grows (issue 24). Looked up
        // first: a big message (the copy kept for a held key would cost),
        // one that would wait for relay room and one that would be signed
        // (a replay neither waits nor is signed; a signature costs more
        // than the lookup).
        let straight =
            sub.content.len() <= INLINE_MAX && self.backlog.has_room() && !self.would_sign(&sub);
        let sub = if straight {
            let kept = sub.clone();
            match self
                .execute(
                    sub,
                    channel,
                    Some(keyed.clone()),
                    facts.from_rejection.clone(),
                    Attempt::BeforeLookup,
                )
                .await
            {
                Executed::Answered(reply, outcome) => return (reply, outcome),
                Executed::Undecided => kept,
            }
        } else {
            sub
        };
        let existing = match self
            .store
            .lookup(&workspace, &keyed.key, self.clock.now_millis())
            .await
        {
            Ok(existing) => existing,
            Err(e) => {
                tracing::error!(%workspace, key = %keyed.hash, error = %e, "refused E01033: ledger unavailable");
                return (channel.unavailable(), Outcome::Unavailable);
            }
        };
        match decide(existing.as_ref(), &keyed.fingerprint) {
            Decision::Execute => self
                .execute(
                    sub,
                    channel,
                    Some(keyed),
                    facts.from_rejection,
                    Attempt::Decided,
                )
                .await
                .answer(channel),
            Decision::Replay(entry) => {
                tracing::info!(
                    %workspace, key = %keyed.hash, queue_id = entry.queue_id.as_deref().unwrap_or("-"),
                    "replayed stored reply"
                );
                (channel.replay(&entry.reply), Outcome::Replayed)
            }
            Decision::Conflict(entry) => {
                if self
                    .matches_earlier_rule(sub, source, &entry.fingerprint)
                    .await
                {
                    tracing::info!(
                        %workspace, key = %keyed.hash, queue_id = entry.queue_id.as_deref().unwrap_or("-"),
                        "replayed stored reply (entry stored under an earlier identity rule)"
                    );
                    return (channel.replay(&entry.reply), Outcome::Replayed);
                }
                tracing::info!(
                    %workspace, key = %keyed.hash, queue_id = entry.queue_id.as_deref().unwrap_or("-"),
                    "refused E01005: key reused for a different message"
                );
                (channel.conflict(entry), Outcome::Conflict)
            }
        }
        // `_claim` drops here, after the commit resolved either way.
    }

    /// Whether `stored` is this message's fingerprint under an earlier
    /// rule ([`earlier_fingerprints`]: every header counting, or transit
    /// fields counting): an entry stored before an upgrade or a change of
    /// `volatile_headers` / `transit_headers` within the retention window
    /// holds that one, and a byte-identical retry of it is a replay, not a
    /// conflict. Only asked on a conflict, so the common path hashes once.
    async fn matches_earlier_rule(
        &self,
        sub: Submission,
        source: KeySource,
        stored: &Fingerprint,
    ) -> bool {
        if self.rules.volatile.is_empty() && self.rules.transit.is_empty() {
            return false;
        }
        let earlier = if sub.content.len() <= INLINE_MAX {
            earlier_fingerprints(&sub, &source, &self.rules)
        } else {
            let rules = Arc::clone(&self.rules);
            self.pool
                .run(move || earlier_fingerprints(&sub, &source, &rules))
                .await
                .unwrap_or_default()
        };
        earlier.contains(stored)
    }

    /// Processes the message as a new operation: a permanent rejection or a
    /// queue row, recorded under the key if there is one.
    async fn execute(
        &self,
        sub: Submission,
        channel: &dyn ChannelWording,
        keyed: Option<Keyed>,
        from_rejection: Option<SenderRefusal>,
        attempt: Attempt,
    ) -> Executed {
        let before_lookup = attempt == Attempt::BeforeLookup && keyed.is_some();
        let workspace = sub.submitter.workspace().to_owned();
        let key_log = keyed.as_ref().map_or("-", |k| k.hash.as_str()).to_owned();
        let now = self.clock.now_millis();

        if let Some(refusal) = from_rejection {
            let reply = channel.sender_refused(&refusal);
            tracing::info!(
                %workspace, key = %key_log, peer = %sub.peer, account = %refusal.account, reason = ?refusal.error,
                "rejected: From: header not allowed"
            );
            if let Some(k) = keyed {
                // A permanent decision is stored, so an identical retry
                // gets the same answer and a corrected one needs a new key.
                let acceptance = Acceptance {
                    ledger: Some(self.ledger_entry(&workspace, k, reply.clone(), None, now)),
                    message: None,
                    events: Vec::new(),
                };
                return match self.store.commit(acceptance).await {
                    Ok(CommitOutcome::Committed) => Executed::Answered(reply, Outcome::Rejected),
                    Ok(CommitOutcome::KeyTaken) if before_lookup => Executed::Undecided,
                    Err(ref e) if before_lookup && !unreachable(e) => Executed::Undecided,
                    Ok(CommitOutcome::KeyTaken) => {
                        Executed::Answered(channel.in_progress(), Outcome::InProgress)
                    }
                    Err(e) => {
                        tracing::warn!(%workspace, key = %key_log, error = %e, "rejection not stored");
                        Executed::Answered(storage_failure_reply(channel, &e), Outcome::Unavailable)
                    }
                };
            }
            return Executed::Answered(reply, Outcome::Rejected);
        }

        // Signed once, here: the signature is stored in the trace, so a
        // retried relay attempt carries the same `t=` and bytes.
        let (sub, signed) = match self.sign(sub).await {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(%workspace, key = %key_log, error = %e, "not accepted: DKIM signing failed");
                return Executed::Answered(channel.signing_failed(), Outcome::Unavailable);
            }
        };
        let id = queue_id::next();
        let reply = channel.accepted(&id);
        let mut trace = received_header(&sub, &self.hostname, &id, now, self.trace);
        trace.push_str(&signed.headers);
        let idempotency_key = keyed.as_ref().map(|k| k.key.clone());
        let ledger =
            keyed.map(|k| self.ledger_entry(&workspace, k, reply.clone(), Some(id.clone()), now));
        let recipients = sub.recipients.len();
        let routed = self.webhooks.accepted(&Accepted {
            queue_id: &id,
            workspace: &workspace,
            idempotency_key: idempotency_key.as_deref(),
            recipients: &sub.recipients,
            at: now,
        });
        let acceptance = Acceptance {
            events: routed.events,
            ledger,
            message: Some(NewMessage {
                id: id.clone(),
                workspace: workspace.clone(),
                account: sub.submitter.name().to_owned(),
                reverse_path: sub.reverse_path,
                recipients: sub.recipients,
                idempotency_key,
                trace,
                body: sub.content,
                mail_params: sub.options.to_stored(),
                created_at: now,
            }),
        };
        // Before the commit, not before the parse: the wait holds only this
        // client, and what it waits for is the relay, not the store.
        let waited = self.backlog.room().await;
        if !waited.is_zero() {
            metrics::global().inflow_wait(waited.as_secs_f64());
        }
        match self.store.commit(acceptance).await {
            Ok(CommitOutcome::Committed) => {
                self.backlog.accepted();
                // Only now: an event of a transaction that failed was
                // never written, and is never sent.
                routed.handover.committed();
                tracing::info!(%workspace, key = %key_log, queue_id = %id, recipients, dkim = %signed.labels, "accepted");
                Executed::Answered(reply, Outcome::Accepted)
            }
            // Held already: nothing was written; the entry decides.
            Ok(CommitOutcome::KeyTaken) if before_lookup => Executed::Undecided,
            // Another writer (another node) committed the key after our
            // lookup; the client's retry will be answered from its entry.
            Ok(CommitOutcome::KeyTaken) => {
                tracing::info!(%workspace, key = %key_log, "refused E01004: key committed concurrently");
                Executed::Answered(channel.in_progress(), Outcome::InProgress)
            }
            // The same failure after the lookup gets the same reply; but a
            // ledger that cannot be read at all is told apart there (E01033).
            Err(ref e) if before_lookup && !unreachable(e) => Executed::Undecided,
            Err(e) => {
                tracing::error!(%workspace, key = %key_log, error = %e, "not accepted: commit failed");
                Executed::Answered(storage_failure_reply(channel, &e), Outcome::Unavailable)
            }
        }
    }

    fn ledger_entry(
        &self,
        workspace: &str,
        keyed: Keyed,
        reply: Vec<u8>,
        queue_id: Option<String>,
        now: UnixMillis,
    ) -> NewLedgerEntry {
        let retention = i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX);
        NewLedgerEntry {
            workspace: workspace.to_owned(),
            key: keyed.key,
            entry: LedgerEntry {
                fingerprint: keyed.fingerprint,
                reply,
                queue_id,
                created_at: now,
                expires_at: now.saturating_add(retention),
            },
        }
    }
}

/// A store that cannot be reached at all: a lookup would fail the same way.
fn unreachable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_))
}

fn storage_failure_reply(channel: &dyn ChannelWording, e: &StoreError) -> Vec<u8> {
    match e {
        StoreError::Unavailable(_) => channel.unavailable(),
        _ => channel.storage_failure(),
    }
}
