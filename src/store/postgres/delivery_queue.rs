//! The delivery queue on PostgreSQL, shared by every node: claims take due
//! rows with `FOR UPDATE SKIP LOCKED` and stamp them with this node's lease
//! (database time), which the worker renews while it delivers; a killed
//! node's messages are claimed by the others when its leases end.

use std::collections::HashMap;

use super::housekeeping::age_of;
use super::outbox::insert_events;
use super::{PgStore, i64_of, insert_message, writer::Job};
use crate::store::delivery_queue::{after_attempt, is_final};
use crate::store::{
    AttemptOutcome, BoxFuture, ClaimedMessage, DeliveryQueue, MessageState, StoreError, UnixMillis,
    now_millis,
};

impl DeliveryQueue for PgStore {
    fn claim(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<ClaimedMessage>, StoreError>> {
        let lease = (lease_until - now).max(1);
        let node = self.node_id.clone();
        let limit = i64_of(limit);
        let claimed = self.submit(Job::new(false, String::new(), move |c| {
            let (node, skip) = (node.clone(), skip.clone());
            Box::pin(async move {
                // Due first, then expired leases (another node's, killed).
                // A due row can still carry a live lease: held while a node
                // delivered it and released, it stays that node's until its
                // record lands or the lease (which that node renews) ends.
                let due = c
                    .prepare_cached(
                        "UPDATE queue SET state = 'delivering', lease_until = smtp_once_now() + $1,
                            leased_by = $2, updated_at = smtp_once_now()
                         WHERE id IN (SELECT id FROM queue
                           WHERE state IN ('queued', 'deferred') AND next_attempt_at <= smtp_once_now()
                             AND (lease_until IS NULL OR lease_until <= smtp_once_now())
                             AND NOT (id = ANY($3))
                           ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                         RETURNING id",
                    )
                    .await?;
                let mut ids: Vec<String> = c
                    .query(&due, &[&lease, &node, &skip, &limit])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let left = limit - i64_of(ids.len());
                if left > 0 {
                    let expired = c
                        .prepare_cached(
                            "UPDATE queue SET lease_until = smtp_once_now() + $1, leased_by = $2,
                                updated_at = smtp_once_now()
                             WHERE id IN (SELECT id FROM queue
                               WHERE state = 'delivering' AND lease_until <= smtp_once_now()
                                 AND NOT (id = ANY($3))
                               ORDER BY lease_until LIMIT $4 FOR UPDATE SKIP LOCKED)
                             RETURNING id",
                        )
                        .await?;
                    let rows = c.query(&expired, &[&lease, &node, &skip, &left]).await?;
                    ids.extend(rows.iter().map(|r| r.get::<_, String>(0)));
                }
                Ok(ids)
            })
        }));
        let pool = self.pool.clone();
        Box::pin(async move {
            let ids = claimed.await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // A message that fails to load keeps its lease and is tried
            // when it expires.
            let c = PgStore::reader(&pool).await?;
            load(&c, &ids).await.map_err(|e| super::classify(&e))
        })
    }

    fn record(
        &self,
        outcome: AttemptOutcome,
    ) -> BoxFuture<'static, Result<Option<MessageState>, StoreError>> {
        let queues_mail = outcome.bounce.is_some();
        let queues_events = !outcome.events.is_empty();
        let outcome = std::sync::Arc::new(outcome);
        let node = std::sync::Arc::new(self.node_id.clone());
        self.submit(Job::with_events(Job::new(queues_mail, String::new(), move |c| {
            let (o, node) = (outcome.clone(), node.clone());
            Box::pin(async move {
                let current: Option<String> = c
                    .query_opt(
                        &c.prepare_cached("SELECT state FROM queue WHERE id = $1 FOR UPDATE")
                            .await?,
                        &[&o.id],
                    )
                    .await?
                    .map(|r| r.get(0));
                let Some(current) = current else {
                    return Ok(None);
                };
                let insert = c
                    .prepare_cached(
                        "INSERT INTO delivery_attempt (queue_id, recipient, at, outcome, reply, next_hop)
                         VALUES ($1, $2, smtp_once_now(), $3, $4, $5)",
                    )
                    .await?;
                for row in &o.rows {
                    c.execute(
                        &insert,
                        &[&o.id, &row.recipient, &row.outcome, &row.reply, &row.next_hop],
                    )
                    .await?;
                }
                let state = after_attempt(o.state, &current);
                // The node's next-attempt time, as a wait from its clock,
                // becomes a time on the database's.
                let wait = o.next_attempt_at.map(|t| t - o.at);
                c.execute(
                    &c.prepare_cached(
                        "UPDATE queue SET state = $2, attempts = attempts + 1,
                            next_attempt_at = smtp_once_now() + $3,
                            last_error = CASE WHEN $4::text IS NOT NULL THEN $4
                                              WHEN $2 = 'delivered' THEN NULL ELSE last_error END,
                            lease_until = NULL, leased_by = NULL, updated_at = smtp_once_now()
                         WHERE id = $1",
                    )
                    .await?,
                    &[&o.id, &state.as_str(), &wait, &o.last_error],
                )
                .await?;
                // Finished: nothing will send it again (`relay.keep_bodies`).
                if is_final(state) && !o.keep_body {
                    c.execute(
                        &c.prepare_cached("DELETE FROM message_body WHERE queue_id = $1")
                            .await?,
                        &[&o.id],
                    )
                    .await?;
                }
                if let Some(bounce) = &o.bounce {
                    insert_message(c, bounce).await?;
                }
                // Only here, where the row still exists: a deleted
                // message's attempt reports nothing.
                insert_events(c, &o.events, &node).await?;
                Ok(Some(state))
            })
        }), queues_events))
    }

    fn renew(
        &self,
        ids: Vec<String>,
        now: UnixMillis,
        lease_until: UnixMillis,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        let lease = (lease_until - now).max(1);
        let node = self.node_id.clone();
        self.submit(Job::new(false, String::new(), move |c| {
            let (ids, node) = (ids.clone(), node.clone());
            Box::pin(async move {
                let n = c
                    .execute(
                        "UPDATE queue SET lease_until = smtp_once_now() + $1
                         WHERE id = ANY($2) AND leased_by = $3 AND lease_until IS NOT NULL",
                        &[&lease, &ids, &node],
                    )
                    .await?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
        }))
    }

    fn next_due(
        &self,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let c = PgStore::reader(&pool).await?;
            let row = c
                .query_one(
                    "SELECT LEAST(
                       (SELECT MIN(next_attempt_at) FROM queue WHERE state IN ('queued', 'deferred')),
                       (SELECT MIN(lease_until) FROM queue WHERE state = 'delivering'
                          AND NOT (id = ANY($1)))) - smtp_once_now()",
                    &[&skip],
                )
                .await
                .map_err(|e| super::classify(&e))?;
            // In: how long from now, on the database's clock.
            let wait: Option<i64> = row.get(0);
            Ok(wait.map(|w| now_millis().saturating_add(w)))
        })
    }

    /// This node's leases only: the others' belong to live nodes.
    fn release_all(&self, _now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>> {
        let node = self.node_id.clone();
        self.submit(Job::new(false, String::new(), move |c| {
            let node = node.clone();
            Box::pin(async move {
                c.execute(
                    "UPDATE queue SET lease_until = NULL, leased_by = NULL
                     WHERE state = 'held' AND leased_by = $1",
                    &[&node],
                )
                .await?;
                let n = c
                    .execute(
                        "UPDATE queue SET state = CASE WHEN attempts > 0 THEN 'deferred' ELSE 'queued' END,
                            lease_until = NULL, leased_by = NULL,
                            next_attempt_at = smtp_once_now(), updated_at = smtp_once_now()
                         WHERE state = 'delivering' AND leased_by = $1",
                        &[&node],
                    )
                    .await?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
        }))
    }

    fn purge_finished(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        // Bodies and attempts go with their rows (ON DELETE CASCADE).
        self.purge(
            "DELETE FROM queue WHERE id IN (SELECT id FROM queue
               WHERE state IN ('delivered', 'failed', 'expired', 'cancelled')
                 AND updated_at <= smtp_once_now() - $1 LIMIT $2)",
            vec![age_of(before), i64_of(limit)],
        )
    }

    fn queued(&self) -> BoxFuture<'static, ()> {
        let queued = self.wakers.mail.clone();
        Box::pin(async move { queued.notified().await })
    }
}

async fn load(
    c: &deadpool_postgres::ClientWrapper,
    ids: &[String],
) -> Result<Vec<ClaimedMessage>, tokio_postgres::Error> {
    let rows = c
        .query(
            &c.prepare_cached(
                "SELECT q.id, q.reverse_path, q.recipients, q.idempotency_key, q.workspace,
                        q.created_at, q.attempts, b.trace, b.body, b.mail_params
                 FROM queue q JOIN message_body b ON b.queue_id = q.id WHERE q.id = ANY($1)",
            )
            .await?,
            &[&ids],
        )
        .await?;
    let mut latest: HashMap<String, HashMap<String, String>> = HashMap::new();
    for r in c
        .query(
            &c.prepare_cached(
                "SELECT queue_id, recipient, outcome FROM delivery_attempt
                 WHERE queue_id = ANY($1) ORDER BY id",
            )
            .await?,
            &[&ids],
        )
        .await?
    {
        latest
            .entry(r.get(0))
            .or_default()
            .insert(r.get(1), r.get(2));
    }
    let mut out: Vec<ClaimedMessage> = rows
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            let recipients: String = r.get(2);
            let attempts: i32 = r.get(6);
            ClaimedMessage {
                latest_outcomes: latest.remove(&id).unwrap_or_default().into_iter().collect(),
                id,
                reverse_path: r.get(1),
                recipients: recipients.lines().map(str::to_owned).collect(),
                idempotency_key: r.get(3),
                workspace: r.get(4),
                created_at: r.get(5),
                attempts: u32::try_from(attempts).unwrap_or(0),
                trace: r.get(7),
                body: r.get(8),
                mail_params: r.get(9),
            }
        })
        .collect();
    // Oldest claimed first, as claimed.
    out.sort_by_key(|m| ids.iter().position(|i| *i == m.id));
    Ok(out)
}
