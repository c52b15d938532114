//! Operator actions on one message (`smtp-once retry|hold|release|delete`).
//! They run from the CLI while the daemon runs: each is one short
//! transaction on the queue row, and none of them races the worker into
//! sending a message twice.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::DeliveryError;
use super::queue::QueueDb;
use crate::store::{MessageState, UnixMillis};

fn refused(id: &str, reason: impl Into<String>) -> DeliveryError {
    DeliveryError::Refused {
        id: id.to_owned(),
        reason: reason.into(),
    }
}

fn finished(id: &str, state: MessageState) -> DeliveryError {
    refused(
        id,
        format!("is {}: nothing left to deliver", state.as_str()),
    )
}

impl QueueDb {
    /// Runs `f` on the message's current state and lease inside a write
    /// transaction.
    fn with_state<T>(
        &self,
        id: &str,
        f: impl FnOnce(
            &rusqlite::Transaction<'_>,
            MessageState,
            Option<UnixMillis>,
        ) -> Result<T, DeliveryError>,
    ) -> Result<T, DeliveryError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let row: Option<(String, Option<UnixMillis>)> = tx
            .query_row(
                "SELECT state, lease_until FROM queue WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (state, lease) = row.ok_or_else(|| DeliveryError::NotFound(id.to_owned()))?;
        let state = MessageState::parse(&state)
            .ok_or_else(|| refused(id, format!("has an unknown state {state:?}")))?;
        let result = f(&tx, state, lease)?;
        tx.commit()?;
        Ok(result)
    }

    /// Makes a queued or deferred message due now.
    pub fn retry_now(&self, id: &str, now: UnixMillis) -> Result<MessageState, DeliveryError> {
        self.with_state(id, |tx, state, _| match state {
            MessageState::Queued | MessageState::Deferred => {
                tx.execute(
                    "UPDATE queue SET next_attempt_at = ?2, updated_at = ?2 WHERE id = ?1",
                    params![id, now],
                )?;
                Ok(state)
            }
            MessageState::Delivering => Err(refused(id, "is being delivered right now")),
            MessageState::Held => Err(refused(id, "is held; release it to deliver it")),
            done => Err(finished(id, done)),
        })
    }

    /// Makes every queued and deferred message due now; returns how many.
    pub fn retry_all_now(&self, now: UnixMillis) -> Result<usize, DeliveryError> {
        Ok(self.conn().execute(
            "UPDATE queue SET next_attempt_at = ?1, updated_at = ?1
             WHERE state IN ('queued', 'deferred') AND next_attempt_at > ?1",
            [now],
        )?)
    }

    /// Stops delivery attempts until `release`. An attempt in flight
    /// finishes; if it leaves recipients pending, the message stays held.
    pub fn hold(&self, id: &str, now: UnixMillis) -> Result<MessageState, DeliveryError> {
        self.with_state(id, |tx, state, _| match state {
            MessageState::Queued | MessageState::Deferred | MessageState::Delivering => {
                tx.execute(
                    "UPDATE queue SET state = 'held', updated_at = ?2 WHERE id = ?1",
                    params![id, now],
                )?;
                Ok(MessageState::Held)
            }
            MessageState::Held => Ok(MessageState::Held),
            done => Err(finished(id, done)),
        })
    }

    /// Puts a held message back in the queue, due now (or when an attempt
    /// still in flight would have lost its lease, so two never overlap).
    pub fn release(&self, id: &str, now: UnixMillis) -> Result<MessageState, DeliveryError> {
        self.with_state(id, |tx, state, lease| match state {
            MessageState::Held => {
                let back = if tx.query_row("SELECT attempts FROM queue WHERE id = ?1", [id], |r| r.get::<_, i64>(0))? > 0 {
                    MessageState::Deferred
                } else {
                    MessageState::Queued
                };
                let due = lease.map_or(now, |l| l.max(now));
                tx.execute(
                    "UPDATE queue SET state = ?2, next_attempt_at = ?3, updated_at = ?4 WHERE id = ?1",
                    params![id, back.as_str(), due, now],
                )?;
                Ok(back)
            }
            other => Err(refused(id, format!("is {}, not held", other.as_str()))),
        })
    }

    /// Removes the message, its body and its attempts.
    pub fn delete(&self, id: &str, now: UnixMillis) -> Result<(), DeliveryError> {
        self.with_state(id, |tx, state, lease| {
            if state == MessageState::Delivering && lease.is_some_and(|l| l > now) {
                return Err(refused(id, "is being delivered right now; hold it first"));
            }
            tx.execute("DELETE FROM delivery_attempt WHERE queue_id = ?1", [id])?;
            tx.execute("DELETE FROM message_body WHERE queue_id = ?1", [id])?;
            tx.execute("DELETE FROM queue WHERE id = ?1", [id])?;
            Ok(())
        })
    }
}
