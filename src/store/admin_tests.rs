//! Issue 22 items 1-2: one conformance suite for `QueueAdmin`. Every body
//! below runs on SQLite and on PostgreSQL (the real server at
//! 127.0.0.1:5432, a fresh database per test), seeded through the stores'
//! own `Store::commit` and `DeliveryQueue::claim/record`, so a behaviour is
//! never tested on one backend only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::admin::{AdminAction, AdminError, Change, Done, ListFilter, QueueAdmin, Record};
use super::postgres::{PgOptions, PgQueueAdmin, PgStore};
use super::sqlite::{SqliteQueueAdmin, SqliteStore};
use super::{
    Acceptance, AttemptOutcome, AttemptRow, CommitOutcome, DeliveryQueue, LedgerEntry,
    MessageState, NewEvent, NewLedgerEntry, NewMessage, Store, WebhookOutbox, now_millis,
};

trait Seeder: Store + DeliveryQueue + WebhookOutbox {}
impl<T: Store + DeliveryQueue + WebhookOutbox> Seeder for T {}

/// A store to seed through and the admin under test, on one database.
struct Bed {
    store: Arc<dyn Seeder>,
    admin: Box<dyn QueueAdmin>,
    _dir: Option<tempfile::TempDir>,
    pg: Option<String>,
}

const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

async fn pg_admin_client() -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(&format!("{SERVER}/postgres"), tokio_postgres::NoTls)
            .await
            .expect("connect (is PostgreSQL running on 127.0.0.1:5432?)");
    tokio::spawn(conn);
    client
}

impl Bed {
    fn sqlite() -> Bed {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path()).expect("open store");
        let admin = SqliteQueueAdmin::open(dir.path()).expect("open admin");
        Bed {
            store: Arc::new(store),
            admin: Box::new(admin),
            _dir: Some(dir),
            pg: None,
        }
    }

    async fn postgres() -> Bed {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "smtp_once_admin_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let sql = pg_admin_client().await;
        for s in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            sql.batch_execute(&s).await.expect("create database");
        }
        let url = format!("{SERVER}/{name}");
        let store = PgStore::open(PgOptions {
            url: &url,
            pool_size: 4,
            ca_file: None,
            node_id: "node-a",
        })
        .await
        .expect("open store");
        let admin = PgQueueAdmin::connect(&url, None).await.expect("admin");
        Bed {
            store: Arc::new(store),
            admin: Box::new(admin),
            _dir: None,
            pg: Some(name),
        }
    }

    async fn finish(self) {
        let Bed {
            store, admin, pg, ..
        } = self;
        drop((store, admin));
        if let Some(name) = pg {
            let _ = pg_admin_client()
                .await
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }

    async fn seed(&self, id: &str, workspace: &str) {
        let outcome = self
            .store
            .commit(Acceptance {
                ledger: None,
                message: Some(NewMessage {
                    id: id.into(),
                    workspace: workspace.into(),
                    account: "bob".into(),
                    reverse_path: "bob@example.test".into(),
                    recipients: vec!["a@example.net".into(), "b@example.net".into()],
                    idempotency_key: None,
                    trace: "Received: test\r\n".into(),
                    body: b"Subject: t\r\n\r\nhi\r\n".to_vec(),
                    mail_params: None,
                    created_at: now_millis(),
                }),
                events: Vec::new(),
            })
            .await
            .expect("commit");
        assert_eq!(outcome, CommitOutcome::Committed);
    }

    /// How many bodies the store holds for `id` (0 or 1).
    async fn bodies(&self, id: &str) -> i64 {
        match (&self._dir, &self.pg) {
            (Some(dir), _) => rusqlite::Connection::open(dir.path().join("smtp-once.db"))
                .expect("open")
                .query_row(
                    "SELECT COUNT(*) FROM message_body WHERE queue_id = ?1",
                    [id],
                    |r| r.get(0),
                )
                .expect("count"),
            (None, Some(name)) => {
                let (client, conn) =
                    tokio_postgres::connect(&format!("{SERVER}/{name}"), tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                tokio::spawn(conn);
                client
                    .query_one(
                        "SELECT COUNT(*) FROM message_body WHERE queue_id = $1",
                        &[&id],
                    )
                    .await
                    .expect("count")
                    .get(0)
            }
            (None, None) => unreachable!("a bed has a store"),
        }
    }

    /// One attempt that finishes `id`: both recipients delivered.
    async fn deliver(&self, id: &str, keep_body: bool) {
        self.claim(id).await;
        let now = now_millis();
        let row = |rcpt: &str| AttemptRow {
            recipient: rcpt.into(),
            outcome: "delivered",
            reply: "250 ok".into(),
            next_hop: None,
        };
        self.store
            .record(AttemptOutcome {
                id: id.into(),
                at: now,
                rows: vec![row("a@example.net"), row("b@example.net")],
                state: MessageState::Delivered,
                next_attempt_at: None,
                last_error: None,
                bounce: None,
                events: Vec::new(),
                keep_body,
            })
            .await
            .expect("record");
    }

    /// Claims `id` (alone in the queue's due set) for a minute.
    async fn claim(&self, id: &str) {
        let now = now_millis();
        let claimed = self
            .store
            .claim(now, now + 60_000, 10, Vec::new())
            .await
            .expect("claim");
        assert!(claimed.iter().any(|m| m.id == id), "{id} not claimed");
    }

    /// One attempt: `a@` delivered, `b@` deferred for an hour.
    async fn defer(&self, id: &str) {
        self.claim(id).await;
        let now = now_millis();
        let row = |rcpt: &str, outcome: &'static str, reply: &str| AttemptRow {
            recipient: rcpt.into(),
            outcome,
            reply: reply.into(),
            next_hop: Some("mx.example.net".into()),
        };
        self.store
            .record(AttemptOutcome {
                id: id.into(),
                at: now,
                rows: vec![
                    row("a@example.net", "delivered", "250 ok"),
                    row("b@example.net", "deferred", "451 later"),
                ],
                state: MessageState::Deferred,
                next_attempt_at: Some(now + 3_600_000),
                last_error: Some("451 later".into()),
                bounce: None,
                events: Vec::new(),
                keep_body: true,
            })
            .await
            .expect("record");
    }
}

fn ids(list: &[super::MessageStatus]) -> Vec<&str> {
    list.iter().map(|m| m.id.as_str()).collect()
}

async fn list_filters_and_paging(bed: &Bed) {
    for (id, ws) in [("Q1", "w1"), ("Q2", "w2"), ("Q3", "w1")] {
        bed.seed(id, ws).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    bed.seed("Q4", "w1").await;
    bed.defer("Q1").await;
    let admin = &bed.admin;
    let all = |f: ListFilter| async move { admin.list(f).await.expect("list") };
    let page = ListFilter {
        limit: 2,
        ..ListFilter::default()
    };
    assert_eq!(ids(&all(page.clone()).await), ["Q1", "Q2"]);
    let next = ListFilter {
        after: Some("Q2".into()),
        ..page.clone()
    };
    assert_eq!(ids(&all(next).await), ["Q3", "Q4"]);
    let w1 = ListFilter {
        workspace: Some("w1".into()),
        limit: 10,
        ..ListFilter::default()
    };
    assert_eq!(ids(&all(w1.clone()).await), ["Q1", "Q3", "Q4"]);
    let deferred = ListFilter {
        state: Some(MessageState::Deferred),
        ..w1.clone()
    };
    let listed = all(deferred).await;
    assert_eq!(ids(&listed), ["Q1"]);
    assert_eq!(listed[0].attempts, 1);
    assert_eq!(listed[0].last_error.as_deref(), Some("451 later"));
    // Age: Q4 was accepted after the others, by the store's clock.
    let q4_at = all(w1.clone()).await[2].created_at;
    let before = ListFilter {
        created_before: Some(q4_at),
        ..w1.clone()
    };
    assert_eq!(ids(&all(before).await), ["Q1", "Q3"]);
    let from = ListFilter {
        created_from: Some(q4_at),
        ..w1
    };
    assert_eq!(ids(&all(from).await), ["Q4"]);
}

/// A message with its own key, sender and recipient (the console's
/// filters), accepted as `accept` does: with its ledger entry.
async fn seed_keyed(bed: &Bed, id: &str, workspace: &str, key: &str, from: &str, to: &str) {
    let mut entry = ledger(key, format!("250 queued as {id}").as_bytes());
    entry.workspace = workspace.into();
    entry.entry.queue_id = Some(id.into());
    let outcome = bed
        .store
        .commit(Acceptance {
            ledger: Some(entry),
            message: Some(NewMessage {
                id: id.into(),
                workspace: workspace.into(),
                account: "bob".into(),
                reverse_path: from.into(),
                recipients: vec!["first@example.net".into(), to.into()],
                idempotency_key: Some(key.into()),
                trace: "Received: test\r\nDKIM-Signature: v=1; d=example.test\r\n".into(),
                body: b"Subject: <b>t</b>\r\n\r\nhi\r\n".to_vec(),
                mail_params: None,
                created_at: now_millis(),
            }),
            events: Vec::new(),
        })
        .await
        .expect("commit");
    assert_eq!(outcome, CommitOutcome::Committed);
}

async fn console_filters_newest_first_and_content(bed: &Bed) {
    seed_keyed(
        bed,
        "Q1",
        "w1",
        "k-1",
        "Alice@Example.test",
        "x@one.example",
    )
    .await;
    seed_keyed(bed, "Q2", "w2", "k-1", "bob@example.test", "y@two.example").await;
    seed_keyed(
        bed,
        "Q3",
        "w1",
        "k-3",
        "carol@example.test",
        "Z@One.example",
    )
    .await;
    bed.seed("Q4", "w1").await;
    let admin = &bed.admin;
    let all = |f: ListFilter| async move { admin.list(f).await.expect("list") };
    let newest = ListFilter {
        newest_first: true,
        limit: 2,
        ..ListFilter::default()
    };
    assert_eq!(ids(&all(newest.clone()).await), ["Q4", "Q3"]);
    let older = ListFilter {
        after: Some("Q3".into()),
        ..newest.clone()
    };
    assert_eq!(ids(&all(older).await), ["Q2", "Q1"]);
    let by_key = ListFilter {
        key: Some("k-1".into()),
        limit: 10,
        ..newest.clone()
    };
    assert_eq!(ids(&all(by_key.clone()).await), ["Q2", "Q1"]);
    let key_in_w1 = ListFilter {
        workspace: Some("w1".into()),
        ..by_key
    };
    assert_eq!(ids(&all(key_in_w1).await), ["Q1"]);
    // Recipient and sender: a part of the address, ASCII case ignored.
    let to_one = ListFilter {
        recipient: Some("@one.EXAMPLE".into()),
        limit: 10,
        ..newest.clone()
    };
    assert_eq!(ids(&all(to_one).await), ["Q3", "Q1"]);
    let from_alice = ListFilter {
        sender: Some("alice@".into()),
        limit: 10,
        ..newest
    };
    assert_eq!(ids(&all(from_alice).await), ["Q1"]);
    let content = admin.content("Q1").await.expect("content").expect("found");
    assert_eq!(content.idempotency_key.as_deref(), Some("k-1"));
    assert!(content.trace.contains("DKIM-Signature"));
    assert!(content.body.starts_with(b"Subject: <b>t</b>") && content.body_kept);
    assert!(admin.content("nope").await.expect("content").is_none());
}

async fn show_with_history(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.defer("Q1").await;
    let (m, attempts) = bed.admin.show("Q1").await.expect("show");
    assert_eq!(m.state, MessageState::Deferred);
    assert_eq!(m.recipients, ["a@example.net", "b@example.net"]);
    assert_eq!((m.workspace.as_str(), m.account.as_str()), ("w1", "bob"));
    let history: Vec<_> = attempts
        .iter()
        .map(|a| (a.recipient.as_str(), a.outcome.as_str(), a.reply.as_str()))
        .collect();
    assert_eq!(
        history,
        [
            ("a@example.net", "delivered", "250 ok"),
            ("b@example.net", "deferred", "451 later")
        ]
    );
    assert_eq!(attempts[0].next_hop.as_deref(), Some("mx.example.net"));
}

async fn hold_then_release(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.seed("Q2", "w1").await;
    bed.defer("Q1").await;
    let admin = &bed.admin;
    assert_eq!(admin.hold("Q1").await.expect("hold"), MessageState::Held);
    // Held again: still held, no error.
    assert_eq!(admin.hold("Q1").await.expect("hold"), MessageState::Held);
    let (m, _) = admin.show("Q1").await.expect("show");
    assert_eq!(m.state, MessageState::Held);
    assert!(matches!(
        admin.retry("Q1").await,
        Err(AdminError::State {
            state: MessageState::Held,
            action: AdminAction::Retry,
            ..
        })
    ));
    // A held message is never claimed.
    let now = now_millis();
    let claimed = bed.store.claim(now, now + 1000, 10, Vec::new()).await;
    assert!(claimed.expect("claim").iter().all(|c| c.id != "Q1"));
    assert!(matches!(
        admin.release("Q2").await,
        Err(AdminError::State {
            action: AdminAction::Release,
            ..
        })
    ));
    // Attempted before: back as deferred, due now.
    let before = now_millis();
    assert_eq!(
        admin.release("Q1").await.expect("release"),
        MessageState::Deferred
    );
    let (m, _) = admin.show("Q1").await.expect("show");
    assert_eq!(m.state, MessageState::Deferred);
    let due = m.next_attempt_at.expect("due");
    assert!(due <= now_millis() + 1000 && due >= before - 1000, "{due}");
}

async fn retry_of_a_deferred_message(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.defer("Q1").await;
    let (m, _) = bed.admin.show("Q1").await.expect("show");
    assert!(m.next_attempt_at.expect("due") > now_millis() + 3_000_000);
    assert_eq!(
        bed.admin.retry("Q1").await.expect("retry"),
        MessageState::Deferred
    );
    let (m, _) = bed.admin.show("Q1").await.expect("show");
    assert!(m.next_attempt_at.expect("due") <= now_millis() + 1000);
    // Due now: the worker claims it at once.
    let now = now_millis();
    let claimed = bed.store.claim(now, now + 1000, 10, Vec::new()).await;
    assert_eq!(claimed.expect("claim").len(), 1);
    // Nothing left that waits: retry --all changes none.
    assert_eq!(bed.admin.retry_all().await.expect("retry all"), 0);
}

async fn retry_all_makes_waiting_messages_due(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.defer("Q1").await;
    bed.seed("Q2", "w1").await;
    bed.defer("Q2").await;
    assert_eq!(bed.admin.retry_all().await.expect("retry all"), 2);
}

async fn delete_removes_message_and_history(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.seed("Q2", "w1").await;
    bed.defer("Q1").await;
    bed.admin.delete("Q1").await.expect("delete");
    assert!(matches!(
        bed.admin.show("Q1").await,
        Err(AdminError::NotFound(id)) if id == "Q1"
    ));
    let left = bed.admin.list(ListFilter {
        limit: 10,
        ..ListFilter::default()
    });
    assert_eq!(ids(&left.await.expect("list")), ["Q2"]);
}

async fn delete_refused_under_a_live_lease(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.claim("Q1").await;
    match bed.admin.delete("Q1").await {
        Err(AdminError::LiveLease { id, until, .. }) => {
            assert_eq!(id, "Q1");
            assert!(until > now_millis(), "{until}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        bed.admin.show("Q1").await.expect("show").0.state,
        MessageState::Delivering
    );
    // Held first, it may go: its attempt will find no row to record.
    bed.admin.hold("Q1").await.expect("hold");
    bed.admin.delete("Q1").await.expect("delete");
}

async fn unknown_ids_are_not_found(bed: &Bed) {
    let admin = &bed.admin;
    let nf = |r: Result<MessageState, AdminError>| matches!(r, Err(AdminError::NotFound(_)));
    assert!(nf(admin.retry("NOPE").await));
    assert!(nf(admin.hold("NOPE").await));
    assert!(nf(admin.release("NOPE").await));
    assert!(matches!(
        admin.delete("NOPE").await,
        Err(AdminError::NotFound(_))
    ));
    assert!(matches!(
        admin.show("NOPE").await,
        Err(AdminError::NotFound(_))
    ));
}

/// A change by `actor` within `workspace`, recording nothing.
fn change(action: AdminAction, id: &str, workspace: Option<&str>) -> Change {
    Change {
        action,
        id: id.into(),
        workspace: workspace.map(str::to_owned),
        actor: "api:alice".into(),
        recorder: None,
    }
}

/// A ledger entry under `(w1, key)` whose reply is `reply`.
fn ledger(key: &str, reply: &[u8]) -> NewLedgerEntry {
    let now = now_millis();
    NewLedgerEntry {
        workspace: "w1".into(),
        key: key.into(),
        entry: LedgerEntry {
            fingerprint: [7; 32],
            reply: reply.to_vec(),
            queue_id: None,
            created_at: now,
            expires_at: now + 3_600_000,
        },
    }
}

async fn cancel_keeps_delivered_recipients(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.defer("Q1").await;
    let done = bed
        .admin
        .apply(change(AdminAction::Cancel, "Q1", Some("w1")))
        .await
        .expect("store")
        .expect("cancel");
    assert_eq!(
        (done.before, done.state, done.workspace.as_str()),
        (MessageState::Deferred, MessageState::Cancelled, "w1")
    );
    assert_eq!(done.pending, ["b@example.net"]);
    assert!(done.changed());
    let (m, attempts) = bed.admin.show("Q1").await.expect("show");
    assert_eq!(m.state, MessageState::Cancelled);
    let last: Vec<_> = attempts
        .iter()
        .map(|a| (a.recipient.as_str(), a.outcome.as_str(), a.reply.as_str()))
        .collect();
    assert_eq!(
        last,
        [
            ("a@example.net", "delivered", "250 ok"),
            ("b@example.net", "deferred", "451 later"),
            ("b@example.net", "cancelled", "cancelled by api:alice"),
        ]
    );
    // Never claimed again, even when it would be due.
    assert!(matches!(
        bed.admin.retry("Q1").await,
        Err(AdminError::State { .. })
    ));
    let now = now_millis();
    let claimed = bed
        .store
        .claim(now + 7_200_000, now + 7_300_000, 10, Vec::new())
        .await;
    assert!(claimed.expect("claim").is_empty());
    // Cancelled again: nothing changes, nothing stopped.
    let again = bed
        .admin
        .apply(change(AdminAction::Cancel, "Q1", None))
        .await
        .expect("store")
        .expect("cancel");
    assert!(!again.changed() && again.pending.is_empty());
    for action in [AdminAction::Hold, AdminAction::Release, AdminAction::Retry] {
        let r = bed
            .admin
            .apply(change(action, "Q1", None))
            .await
            .expect("store");
        assert!(matches!(r, Err(AdminError::State { .. })), "{action:?}");
    }
}

async fn cancel_refused_under_a_live_lease_and_sticks_after_one(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.claim("Q1").await;
    let r = bed
        .admin
        .apply(change(AdminAction::Cancel, "Q1", None))
        .await;
    assert!(matches!(
        r.expect("store"),
        Err(AdminError::LiveLease { .. })
    ));
    assert_eq!(
        bed.admin.show("Q1").await.expect("show").0.state,
        MessageState::Delivering
    );
    // A lease that ran out: the cancel goes through, and the late
    // attempt's record leaves the message cancelled.
    bed.seed("Q2", "w1").await;
    let now = now_millis();
    let claimed = bed.store.claim(now, now + 100, 10, Vec::new()).await;
    assert!(claimed.expect("claim").iter().any(|m| m.id == "Q2"));
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    bed.admin
        .apply(change(AdminAction::Cancel, "Q2", None))
        .await
        .expect("store")
        .expect("cancel after the lease ran out");
    bed.store
        .record(AttemptOutcome {
            id: "Q2".into(),
            at: now_millis(),
            rows: Vec::new(),
            state: MessageState::Deferred,
            next_attempt_at: Some(now_millis()),
            last_error: Some("451 later".into()),
            bounce: None,
            events: Vec::new(),
            keep_body: true,
        })
        .await
        .expect("record");
    assert_eq!(
        bed.admin.show("Q2").await.expect("show").0.state,
        MessageState::Cancelled
    );
}

async fn another_workspace_is_not_found_and_the_refusal_is_recorded(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    let mut c = change(AdminAction::Hold, "Q1", Some("w2"));
    c.recorder = Some(Box::new(|outcome: &Result<Done, AdminError>| {
        assert!(matches!(outcome, Err(AdminError::NotFound(_))));
        Record {
            ledger: Some(ledger("k-404", b"404\n{}")),
            events: Vec::new(),
        }
    }));
    let r = bed.admin.apply(c).await.expect("store");
    assert!(matches!(r, Err(AdminError::NotFound(_))));
    assert_eq!(
        bed.admin.show("Q1").await.expect("show").0.state,
        MessageState::Queued
    );
    let stored = bed.store.lookup("w1", "k-404", now_millis()).await;
    assert_eq!(stored.expect("lookup").expect("entry").reply, b"404\n{}");
}

async fn a_change_commits_with_its_record_or_not_at_all(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    let mut c = change(AdminAction::Hold, "Q1", Some("w1"));
    c.recorder = Some(Box::new(|outcome: &Result<Done, AdminError>| {
        let done = outcome.as_ref().expect("held");
        Record {
            ledger: Some(ledger("k-1", b"200\n{}")),
            events: vec![NewEvent {
                webhook_id: "msg_held_1".into(),
                endpoint: "ops".into(),
                event_type: "message.held".into(),
                at: done.at,
                workspace: done.workspace.clone(),
                queue_id: Some(done.id.clone()),
                payload: "{}".into(),
                lease_ms: None,
            }],
        }
    }));
    bed.admin.apply(c).await.expect("store").expect("hold");
    let now = now_millis();
    let events = bed
        .store
        .claim_events(now + 1000, now + 60_000, 10, vec!["ops".into()])
        .await
        .expect("claim events");
    assert_eq!(
        events
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["message.held"]
    );
    // The key is taken now: a second change under it is rolled back, its
    // event never written.
    let mut c = change(AdminAction::Release, "Q1", Some("w1"));
    c.recorder = Some(Box::new(|_: &Result<Done, AdminError>| Record {
        ledger: Some(ledger("k-1", b"200\n{\"other\":1}")),
        events: Vec::new(),
    }));
    let r = bed.admin.apply(c).await.expect("store");
    assert!(matches!(r, Err(AdminError::KeyTaken)), "{r:?}");
    assert_eq!(
        bed.admin.show("Q1").await.expect("show").0.state,
        MessageState::Held
    );
}

async fn a_body_leaves_with_the_last_recipient_unless_kept(bed: &Bed) {
    bed.seed("Q1", "w1").await;
    bed.defer("Q1").await;
    // Deferred: the body is still needed.
    assert_eq!(bed.bodies("Q1").await, 1);
    bed.admin.retry("Q1").await.expect("due now");
    bed.deliver("Q1", false).await;
    assert_eq!(bed.bodies("Q1").await, 0, "delivered: body removed");
    let (m, attempts) = bed.admin.show("Q1").await.expect("show");
    assert_eq!(m.state, MessageState::Delivered);
    assert_eq!(attempts.len(), 4, "the history stays");
    bed.seed("Q2", "w1").await;
    bed.deliver("Q2", true).await;
    assert_eq!(bed.bodies("Q2").await, 1, "relay.keep_bodies keeps it");
}

/// A `#[tokio::test]` per backend for each body.
macro_rules! conformance {
    ($($body:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    let bed = super::Bed::sqlite();
                    super::$body(&bed).await;
                    bed.finish().await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    let bed = super::Bed::postgres().await;
                    super::$body(&bed).await;
                    bed.finish().await;
                }
            )*
        }
    };
}

conformance!(
    list_filters_and_paging,
    console_filters_newest_first_and_content,
    show_with_history,
    hold_then_release,
    retry_of_a_deferred_message,
    retry_all_makes_waiting_messages_due,
    delete_removes_message_and_history,
    delete_refused_under_a_live_lease,
    unknown_ids_are_not_found,
    cancel_keeps_delivered_recipients,
    cancel_refused_under_a_live_lease_and_sticks_after_one,
    another_workspace_is_not_found_and_the_refusal_is_recorded,
    a_change_commits_with_its_record_or_not_at_all,
    a_body_leaves_with_the_last_recipient_unless_kept,
);
