//! The acceptance pipeline: what happens between the final `.` (or `BDAT
//! LAST`) and the reply. Key, fingerprint, claim, ledger lookup, decision,
//! then one atomic commit of ledger entry and queue row. The reply is built
//! only from what was committed: never a `250` before COMMIT returned.

use std::sync::Arc;
use std::time::Duration;

use mail_parser::MessageParser;

use crate::auth::Submitter;
use crate::idempotency::claims::Claims;
use crate::idempotency::decision::{Decision, decide, replay_reply};
use crate::idempotency::fingerprint::{Fingerprint, fingerprint};
use crate::idempotency::key::extract_key;
use crate::idempotency::key_hash;
use crate::smtp::reply::Reply;
use crate::smtp::session::Submission;
use crate::store::{
    Acceptance, CommitOutcome, LedgerEntry, NewLedgerEntry, NewMessage, Store, StoreError,
    UnixMillis, now_millis, queue_id,
};
use crate::trace::received_header;

pub struct Acceptor {
    store: Arc<dyn Store>,
    claims: Claims,
    retention: Duration,
    hostname: String,
}

/// A key that passed validation, with the request's fingerprint.
struct Keyed {
    key: String,
    hash: String,
    fingerprint: Fingerprint,
}

impl Acceptor {
    pub fn new(store: Arc<dyn Store>, retention: Duration, hostname: String) -> Self {
        Self {
            store,
            claims: Claims::default(),
            retention,
            hostname,
        }
    }

    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// Returns the complete reply (CRLF-terminated lines) for the message.
    pub async fn accept(&self, sub: Submission) -> Vec<u8> {
        let workspace = sub.submitter.workspace().to_owned();
        let key = match extract_key(&sub.content) {
            Ok(Some(key)) => key,
            Ok(None) => return self.execute(sub, None).await,
            Err(e) => {
                tracing::info!(%workspace, peer = %sub.peer, error = %e, "rejected E01001");
                return Reply::new(554, "5.6.0", &format!("E01001 ValidationError: {e}"))
                    .to_bytes();
            }
        };
        let hash = key_hash(&workspace, &key);
        let Some(_claim) = self.claims.try_claim(&workspace, &key) else {
            tracing::info!(%workspace, key = %hash, "refused E01004: key in progress");
            return in_progress_reply();
        };
        let keyed = Keyed {
            fingerprint: fingerprint(&sub.reverse_path, &sub.recipients, &sub.content),
            key,
            hash,
        };
        let existing = match self
            .store
            .lookup(&workspace, &keyed.key, now_millis())
            .await
        {
            Ok(existing) => existing,
            Err(e) => {
                tracing::error!(%workspace, key = %keyed.hash, error = %e, "refused E01033: ledger unavailable");
                return unavailable_reply();
            }
        };
        match decide(existing.as_ref(), &keyed.fingerprint) {
            Decision::Execute => self.execute(sub, Some(keyed)).await,
            Decision::Replay(entry) => {
                tracing::info!(
                    %workspace, key = %keyed.hash, queue_id = entry.queue_id.as_deref().unwrap_or("-"),
                    "replayed stored reply"
                );
                replay_reply(&entry.reply)
            }
            Decision::Conflict(entry) => {
                tracing::info!(
                    %workspace, key = %keyed.hash, queue_id = entry.queue_id.as_deref().unwrap_or("-"),
                    "refused E01005: key reused for a different message"
                );
                Reply::new(
                    550,
                    "5.6.0",
                    "E01005 IdempotencyKeyReuse: key already used for a different message",
                )
                .to_bytes()
            }
        }
        // `_claim` drops here, after the commit resolved either way.
    }

    /// Processes the message as a new operation: a permanent rejection or a
    /// queue row, recorded under the key if there is one.
    async fn execute(&self, sub: Submission, keyed: Option<Keyed>) -> Vec<u8> {
        let workspace = sub.submitter.workspace().to_owned();
        let key_log = keyed.as_ref().map_or("-", |k| k.hash.as_str()).to_owned();
        let now = now_millis();

        if let Some(rejection) = from_header_rejection(&sub.submitter, &sub.content) {
            let reply = rejection.to_bytes();
            tracing::info!(%workspace, key = %key_log, code = rejection.code(), "rejected: From: header not allowed");
            if let Some(k) = keyed {
                // A permanent decision is stored, so an identical retry
                // gets the same answer and a corrected one needs a new key.
                let acceptance = Acceptance {
                    ledger: Some(self.ledger_entry(&workspace, k, reply.clone(), None, now)),
                    message: None,
                };
                return match self.store.commit(acceptance).await {
                    Ok(CommitOutcome::Committed) => reply,
                    Ok(CommitOutcome::KeyTaken) => in_progress_reply(),
                    Err(e) => {
                        tracing::warn!(%workspace, key = %key_log, error = %e, "rejection not stored");
                        storage_failure_reply(&e)
                    }
                };
            }
            return reply;
        }

        let id = queue_id::next();
        let reply = Reply::new(250, "2.0.0", &format!("Ok: queued as {id}")).to_bytes();
        let trace = received_header(&sub, &self.hostname, &id, now);
        let idempotency_key = keyed.as_ref().map(|k| k.key.clone());
        let ledger =
            keyed.map(|k| self.ledger_entry(&workspace, k, reply.clone(), Some(id.clone()), now));
        let recipients = sub.recipients.len();
        let acceptance = Acceptance {
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
                created_at: now,
            }),
        };
        match self.store.commit(acceptance).await {
            Ok(CommitOutcome::Committed) => {
                tracing::info!(%workspace, key = %key_log, queue_id = %id, recipients, "accepted");
                reply
            }
            // Another writer (another node) committed the key first; the
            // client's retry will be answered from its entry.
            Ok(CommitOutcome::KeyTaken) => {
                tracing::info!(%workspace, key = %key_log, "refused E01004: key committed concurrently");
                in_progress_reply()
            }
            Err(e) => {
                tracing::error!(%workspace, key = %key_log, error = %e, "not accepted: commit failed");
                storage_failure_reply(&e)
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

fn in_progress_reply() -> Vec<u8> {
    Reply::new(
        451,
        "4.5.0",
        "E01004 RequestInProgress: try again shortly with the same key and message",
    )
    .to_bytes()
}

fn unavailable_reply() -> Vec<u8> {
    Reply::new(
        451,
        "4.3.0",
        "E01033 IdempotencyUnavailable: message not accepted, retry",
    )
    .to_bytes()
}

fn storage_failure_reply(e: &StoreError) -> Vec<u8> {
    match e {
        StoreError::Unavailable(_) => unavailable_reply(),
        _ => Reply::new(
            451,
            "4.3.0",
            "Temporary storage failure: message not accepted, retry",
        )
        .to_bytes(),
    }
}

/// For accounts limited to some senders, every `From:` address must match.
fn from_header_rejection(submitter: &Submitter, content: &[u8]) -> Option<Reply> {
    let Submitter::Account(account) = submitter else {
        return None;
    };
    account.allowed_senders.as_ref()?;
    let parsed = MessageParser::new().parse_headers(content);
    let addresses: Vec<String> = parsed
        .as_ref()
        .and_then(|m| m.from())
        .map(|from| {
            from.iter()
                .filter_map(|a| a.address().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if addresses.is_empty() {
        return Some(Reply::new(
            553,
            "5.7.1",
            &format!(
                "Message has no From: address; account {} must send as an allowed sender",
                account.name
            ),
        ));
    }
    let denied = addresses.iter().find(|a| !account.may_send_as(a))?;
    Some(Reply::new(
        553,
        "5.7.1",
        &format!(
            "From: address <{denied}> not allowed for account {}",
            account.name
        ),
    ))
}
