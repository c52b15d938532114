//! The seeds' idempotency steps for a mutating request that is not a
//! submission (the API's operations on a message): the same claims, ledger
//! and answers as the acceptance pipeline, around the caller's own change.
//! The caller writes the answer into the ledger in its change's own
//! transaction (a [`LedgerSlot`]), so an answer is never stored without its
//! change, nor a change made without its answer stored.

use std::future::Future;

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::Acceptor;
use super::channel::ChannelWording;
use crate::clock::Clock;
use crate::idempotency::decision::{Decision, decide};
use crate::idempotency::fingerprint::Fingerprint;
use crate::idempotency::key_hash;
use crate::idempotency::request::{request_fingerprint, request_key};
use crate::store::{LedgerEntry, NewLedgerEntry};

/// A request as its identity sees it.
pub struct Operation<'a> {
    pub workspace: &'a str,
    /// The `Idempotency-Key` header as sent (not yet validated).
    pub key: Option<&'a str>,
    /// `METHOD /path?query`.
    pub line: &'a str,
    pub body: &'a [u8],
}

/// Where a keyed operation's answer goes: the ledger entry to write with
/// its change.
#[derive(Debug, Clone)]
pub struct LedgerSlot {
    workspace: String,
    key: String,
    fingerprint: Fingerprint,
    retention_ms: i64,
    /// The acceptor's clock: the entry is stamped when it is written.
    clock: Arc<dyn Clock>,
}

impl LedgerSlot {
    /// The entry that stores `reply` (what a replay gives back).
    pub fn entry(&self, reply: Vec<u8>, queue_id: Option<String>) -> NewLedgerEntry {
        let now = self.clock.now_millis();
        NewLedgerEntry {
            workspace: self.workspace.clone(),
            key: self.key.clone(),
            entry: LedgerEntry {
                fingerprint: self.fingerprint,
                reply,
                queue_id,
                created_at: now,
                expires_at: now.saturating_add(self.retention_ms),
            },
        }
    }
}

impl Acceptor {
    /// Runs `execute` once per key: a new key (or none) executes, the same
    /// request again is answered from the ledger, a different one under the
    /// key is `E01005`, one still running `E01004`, and a ledger that cannot
    /// be read `E01033` before anything executes. `execute` gets the slot
    /// to store its answer in when the request has a key.
    pub async fn once<F, Fut>(
        &self,
        op: Operation<'_>,
        channel: &dyn ChannelWording,
        execute: F,
    ) -> Vec<u8>
    where
        F: FnOnce(Option<LedgerSlot>) -> Fut,
        Fut: Future<Output = Vec<u8>>,
    {
        let workspace = op.workspace;
        let key = match request_key(op.key) {
            Ok(Some(key)) => key,
            Ok(None) => return execute(None).await,
            Err(e) => {
                tracing::info!(%workspace, request = op.line, error = %e, "rejected E01001");
                return channel.bad_key(&e);
            }
        };
        let hash = key_hash(workspace, &key);
        let body: Fingerprint = Sha256::digest(op.body).into();
        let fingerprint = request_fingerprint(op.line, &body);
        let Some(_claim) = self.claims.try_claim(workspace, &key) else {
            tracing::info!(%workspace, key = %hash, request = op.line, "refused E01004: key in progress");
            return channel.in_progress();
        };
        let existing = match self
            .store
            .lookup(workspace, &key, self.clock.now_millis())
            .await
        {
            Ok(existing) => existing,
            Err(e) => {
                tracing::error!(%workspace, key = %hash, error = %e, "refused E01033: ledger unavailable");
                return channel.unavailable();
            }
        };
        match decide(existing.as_ref(), &fingerprint) {
            Decision::Execute => {
                let slot = LedgerSlot {
                    workspace: workspace.to_owned(),
                    key,
                    fingerprint,
                    retention_ms: i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX),
                    clock: Arc::clone(&self.clock),
                };
                execute(Some(slot)).await
            }
            Decision::Replay(entry) => {
                tracing::info!(%workspace, key = %hash, request = op.line, "replayed stored answer");
                channel.replay(&entry.reply)
            }
            Decision::Conflict(entry) => {
                tracing::info!(%workspace, key = %hash, request = op.line, "refused E01005: key reused for a different request");
                channel.conflict(entry)
            }
        }
        // `_claim` drops here, after the change committed or failed.
    }
}
