//! Issue 22 items 1-2: one conformance suite for `QueueAdmin`. Every body
//! below runs on SQLite and on PostgreSQL (the real server at
//! 127.0.0.1:5432, a fresh database per test), seeded through the stores'
//! own `Store::commit` and `DeliveryQueue::claim/record`, so a behaviour is
//! never tested on one backend only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::admin::{AdminAction, AdminError, ListFilter, QueueAdmin};
use super::postgres::{PgOptions, PgQueueAdmin, PgStore};
use super::sqlite::{SqliteQueueAdmin, SqliteStore};
use super::{
    Acceptance, AttemptOutcome, AttemptRow, CommitOutcome, DeliveryQueue, MessageState, NewMessage,
    Store, now_millis,
};

trait Seeder: Store + DeliveryQueue {}
impl<T: Store + DeliveryQueue> Seeder for T {}

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
                    created_at: now_millis(),
                }),
                events: Vec::new(),
            })
            .await
            .expect("commit");
        assert_eq!(outcome, CommitOutcome::Committed);
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
    show_with_history,
    hold_then_release,
    retry_of_a_deferred_message,
    retry_all_makes_waiting_messages_due,
    delete_removes_message_and_history,
    delete_refused_under_a_live_lease,
    unknown_ids_are_not_found,
);
