//! Persistent outbound connections: a few open SMTP sessions per
//! destination (a smarthost's `host:port`, an MX host), each carrying
//! message after message, as Postfix's connection cache does. Saves the
//! connect, greeting, TLS, EHLO, AUTH and QUIT of every message but one.
//!
//! The exactly-once rule for a reused session: it may have died while it
//! sat idle (the next hop timed it out, restarted, answered 421), which
//! shows only when the next command fails. Such a failure before any byte
//! of the message was written cannot have delivered anything, so the
//! transaction is repeated once on a fresh connection within the same
//! attempt. After the message bytes went out it never is: the next hop may
//! have the message, and only one that honours the idempotency key would
//! drop a second copy. That outcome is recorded as deferred, as before.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::RcptResult;
use super::smtp::{Session, Transaction};

#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Open sessions kept per destination (`relay.pool_size`).
    pub max_idle: usize,
    /// Transactions on one session before it is closed
    /// (`relay.max_messages_per_connection`; 1 turns reuse off).
    pub max_messages: usize,
    /// An unused session is closed after this long
    /// (`relay.connection_idle_timeout`).
    pub idle_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_idle: 4,
            max_messages: 100,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// An open, greeted session to one address of a destination.
pub struct Conn {
    session: Session,
    /// The host name and address it is connected to, and how it was
    /// secured, for the record.
    hop: String,
    timeout: Duration,
    transactions: usize,
}

impl Conn {
    /// `hop`: `host [addr]`, and how the session is secured.
    pub fn new(session: Session, hop: &str, timeout: Duration) -> Self {
        Self {
            session,
            hop: hop.to_owned(),
            timeout,
            transactions: 0,
        }
    }

    async fn transact(&mut self, mail: &Mail<'_>) -> Transaction {
        self.transactions += 1;
        let mut t = self.session.transact(mail, self.timeout).await;
        t.results = t
            .results
            .into_iter()
            .map(|r| r.via(Some(self.hop.clone())))
            .collect();
        t
    }
}

/// One transaction's envelope and bytes.
pub struct Mail<'a> {
    pub from: &'a str,
    pub recipients: &'a [String],
    pub content: &'a [u8],
    /// REQUIRETLS: passed on to a hop that offers it.
    pub require_tls: bool,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

struct Inner {
    settings: PoolSettings,
    idle: Mutex<HashMap<String, Vec<Idle>>>,
    /// Set at shutdown: sessions handed back afterwards are closed.
    closed: AtomicBool,
}

pub struct ConnectionPool {
    inner: Arc<Inner>,
}

impl ConnectionPool {
    /// A pool; inside a Tokio runtime it also starts the sweep that closes
    /// idle sessions (it ends with the pool).
    pub fn new(settings: PoolSettings) -> Self {
        let inner = Arc::new(Inner {
            settings,
            idle: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep(Arc::downgrade(&inner)));
        }
        Self { inner }
    }

    /// One transaction to destination `key`: on an idle session of the
    /// pool if there is one, else on a fresh one from `open`. `Err` is
    /// `open`'s error: no transaction started.
    pub async fn send<O, F>(
        &self,
        key: &str,
        mail: &Mail<'_>,
        open: O,
    ) -> Result<Vec<RcptResult>, String>
    where
        O: FnOnce() -> F,
        F: Future<Output = Result<Conn, String>>,
    {
        if let Some(mut conn) = self.checkout(key) {
            let t = conn.transact(mail).await;
            if !t.lost_before_data {
                self.checkin(key, conn, t.reusable).await;
                return Ok(t.results);
            }
            // Dropped: the socket closes without QUIT, it is broken anyway.
            let why = t.results.first().map_or("", |r| r.reply.as_str());
            tracing::info!(
                destination = ?key, reason = ?why,
                "pooled connection failed before the message was sent; retrying on a new connection"
            );
        }
        let mut conn = open().await?;
        let t = conn.transact(mail).await;
        self.checkin(key, conn, t.reusable).await;
        Ok(t.results)
    }

    /// Closes every idle session with QUIT; later ones are closed when
    /// handed back.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let all: Vec<Conn> = {
            let mut idle = self.inner.lock();
            idle.drain()
                .flat_map(|(_, list)| list.into_iter().map(|i| i.conn))
                .collect()
        };
        quit_all(all).await;
    }

    /// The most recently used live session, so the others age out.
    fn checkout(&self, key: &str) -> Option<Conn> {
        let (found, expired) = {
            let mut idle = self.inner.lock();
            let list = idle.get_mut(key)?;
            let mut expired = Vec::new();
            let mut found = None;
            while let Some(i) = list.pop() {
                if i.since.elapsed() >= self.inner.settings.idle_timeout {
                    expired.push(i.conn);
                } else {
                    found = Some(i.conn);
                    break;
                }
            }
            if list.is_empty() {
                idle.remove(key);
            }
            (found, expired)
        };
        if !expired.is_empty() {
            tokio::spawn(quit_all(expired));
        }
        found
    }

    /// Keeps a session for the next message, or closes it: broken, used up,
    /// one too many, or shutting down.
    async fn checkin(&self, key: &str, conn: Conn, reusable: bool) {
        if !reusable {
            return; // dropped
        }
        let s = &self.inner.settings;
        let conn =
            if conn.transactions < s.max_messages && !self.inner.closed.load(Ordering::SeqCst) {
                let mut idle = self.inner.lock();
                let list = idle.entry(key.to_owned()).or_default();
                if list.len() < s.max_idle {
                    list.push(Idle {
                        conn,
                        since: Instant::now(),
                    });
                    return;
                }
                conn
            } else {
                conn
            };
        conn.session.quit().await;
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Idle>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn quit_all(conns: Vec<Conn>) {
    let mut set = tokio::task::JoinSet::new();
    for c in conns {
        set.spawn(c.session.quit());
    }
    while set.join_next().await.is_some() {}
}

/// Closes sessions idle past the timeout, whether or not another message
/// comes for their destination.
async fn sweep(pool: Weak<Inner>) {
    let every = match pool.upgrade() {
        Some(p) => {
            (p.settings.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
        }
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = pool.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let expired: Vec<Conn> = {
            let mut idle = inner.lock();
            let limit = inner.settings.idle_timeout;
            let mut out = Vec::new();
            for list in idle.values_mut() {
                let (old, fresh): (Vec<Idle>, Vec<Idle>) =
                    list.drain(..).partition(|i| i.since.elapsed() >= limit);
                *list = fresh;
                out.extend(old.into_iter().map(|i| i.conn));
            }
            idle.retain(|_, list| !list.is_empty());
            out
        };
        drop(inner);
        if !expired.is_empty() {
            tracing::debug!(closed = expired.len(), "idle outbound connections closed");
            quit_all(expired).await;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The retry rule against a scripted loopback server that offers
    //! PIPELINING.
    use super::*;
    use crate::delivery::Status;
    use crate::delivery::smtp::{self, ClientSettings, Security};
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[derive(Clone, Copy, PartialEq)]
    enum Step {
        Accept,
        Refuse421AtMail,
        VanishAfterDot,
        /// 550 to every RCPT; the pipelined DATA gets 554.
        RefuseRecipients,
        /// 550 to every RCPT, yet 354 to DATA (a broken next hop).
        RefuseRecipientsTakeData,
    }

    /// What the server does with transaction `txn` (from 1) on connection
    /// `conn` (from 1).
    type Script = fn(usize, usize) -> Step;

    struct Server {
        addr: SocketAddr,
        conns: Arc<AtomicUsize>,
        dots: Arc<AtomicUsize>,
        /// Lines of message content received, over all transactions.
        content_lines: Arc<AtomicUsize>,
    }

    async fn server(script: Script) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let conns = Arc::new(AtomicUsize::new(0));
        let dots = Arc::new(AtomicUsize::new(0));
        let content_lines = Arc::new(AtomicUsize::new(0));
        let (c, d, l) = (conns.clone(), dots.clone(), content_lines.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let conn = c.fetch_add(1, Ordering::SeqCst) + 1;
                let (dots, lines) = (d.clone(), l.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, conn, script, dots, lines).await;
                });
            }
        });
        Server {
            addr,
            conns,
            dots,
            content_lines,
        }
    }

    async fn serve(
        stream: tokio::net::TcpStream,
        conn: usize,
        script: Script,
        dots: Arc<AtomicUsize>,
        content_lines: Arc<AtomicUsize>,
    ) -> std::io::Result<()> {
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        w.write_all(b"220 s\r\n").await?;
        let mut txn = 0;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let reply = match line.get(..4).unwrap_or_default() {
                "MAIL" => {
                    txn += 1;
                    if script(conn, txn) == Step::Refuse421AtMail {
                        w.write_all(b"421 4.3.2 closing\r\n").await?;
                        return Ok(());
                    }
                    "250 ok"
                }
                "RCPT"
                    if matches!(
                        script(conn, txn),
                        Step::RefuseRecipients | Step::RefuseRecipientsTakeData
                    ) =>
                {
                    "550 5.1.1 no such user"
                }
                "DATA" if script(conn, txn) == Step::RefuseRecipients => {
                    "554 5.5.1 no valid recipients"
                }
                "DATA" => {
                    w.write_all(b"354 go\r\n").await?;
                    loop {
                        line.clear();
                        if r.read_line(&mut line).await? == 0 {
                            return Ok(());
                        }
                        if line == ".\r\n" {
                            break;
                        }
                        content_lines.fetch_add(1, Ordering::SeqCst);
                    }
                    dots.fetch_add(1, Ordering::SeqCst);
                    if script(conn, txn) == Step::VanishAfterDot {
                        return Ok(());
                    }
                    "250 queued"
                }
                // Pipelined MAIL, RCPT and DATA here (the integration
                // sink takes them one by one).
                "EHLO" => "250-s\r\n250 PIPELINING",
                "QUIT" => return w.write_all(b"221 bye\r\n").await,
                _ => "250 ok",
            };
            w.write_all(format!("{reply}\r\n").as_bytes()).await?;
        }
    }

    async fn send(pool: &ConnectionPool, addr: SocketAddr) -> Vec<RcptResult> {
        let rcpts = vec!["r@example.net".to_string()];
        let mail = Mail {
            from: "s@example.test",
            recipients: &rcpts,
            content: b"Subject: t\r\n\r\nbody\r\n",
            require_tls: false,
        };
        let settings = ClientSettings {
            helo: "relay.test".into(),
            timeout: Duration::from_secs(10),
        };
        let open = || async {
            smtp::open(addr, "sink", &Security::Plain, None, &settings)
                .await
                .map(|s| Conn::new(s, &format!("sink [{addr}]"), settings.timeout))
                .map_err(|e| e.message)
        };
        pool.send("sink", &mail, open).await.expect("opened")
    }

    fn status(results: &[RcptResult]) -> Status {
        results[0].status
    }

    #[tokio::test]
    async fn a_fresh_session_that_fails_is_not_retried() {
        let s = server(|_, _| Step::Refuse421AtMail).await;
        let pool = ConnectionPool::new(PoolSettings::default());
        let r = send(&pool, s.addr).await;
        assert_eq!(status(&r), Status::Deferred, "{r:?}");
        assert!(r[0].reply.starts_with("421"), "{r:?}");
        assert_eq!(s.conns.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_reused_session_that_fails_before_the_message_is_retried_once() {
        // Every connection takes one message and refuses the next.
        let s = server(|_, txn| {
            if txn == 1 {
                Step::Accept
            } else {
                Step::Refuse421AtMail
            }
        })
        .await;
        let pool = ConnectionPool::new(PoolSettings::default());
        for n in 1..=3 {
            let r = send(&pool, s.addr).await;
            assert_eq!(status(&r), Status::Delivered, "{r:?}");
            assert_eq!(s.conns.load(Ordering::SeqCst), n);
        }
        assert_eq!(s.dots.load(Ordering::SeqCst), 3);

        // Only once: a fresh connection that fails too ends the attempt.
        let s = server(|conn, txn| match (conn, txn) {
            (1, 1) => Step::Accept,
            _ => Step::Refuse421AtMail,
        })
        .await;
        let pool = ConnectionPool::new(PoolSettings::default());
        assert_eq!(status(&send(&pool, s.addr).await), Status::Delivered);
        let r = send(&pool, s.addr).await;
        assert_eq!(status(&r), Status::Deferred, "{r:?}");
        assert_eq!(s.conns.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_reused_session_lost_after_the_dot_is_not_retried() {
        let s = server(|_, txn| {
            if txn == 1 {
                Step::Accept
            } else {
                Step::VanishAfterDot
            }
        })
        .await;
        let pool = ConnectionPool::new(PoolSettings::default());
        assert_eq!(status(&send(&pool, s.addr).await), Status::Delivered);
        let r = send(&pool, s.addr).await;
        assert_eq!(status(&r), Status::Deferred, "{r:?}");
        assert!(r[0].reply.starts_with("after DATA"), "{r:?}");
        assert_eq!(s.conns.load(Ordering::SeqCst), 1, "no second connection");
        assert_eq!(s.dots.load(Ordering::SeqCst), 2, "sent once each");
    }

    /// DATA goes out with MAIL and RCPT; the content only after a 354 and
    /// an accepted recipient, so a refused transaction never carries it.
    #[tokio::test]
    async fn refused_recipients_never_get_the_content_with_data_pipelined() {
        let s = server(|_, _| Step::RefuseRecipients).await;
        let pool = ConnectionPool::new(PoolSettings::default());
        let r = send(&pool, s.addr).await;
        assert_eq!(status(&r), Status::Failed, "{r:?}");
        assert!(r[0].reply.starts_with("550"), "{r:?}");
        let r = send(&pool, s.addr).await;
        assert_eq!(status(&r), Status::Failed, "{r:?}");
        assert_eq!(
            s.conns.load(Ordering::SeqCst),
            1,
            "the session stays usable"
        );
        assert_eq!(s.content_lines.load(Ordering::SeqCst), 0);

        // A next hop that takes DATA anyway gets an empty message ended at
        // once, and its session is not reused.
        let s = server(|_, _| Step::RefuseRecipientsTakeData).await;
        let pool = ConnectionPool::new(PoolSettings::default());
        for _ in 0..2 {
            let r = send(&pool, s.addr).await;
            assert_eq!(status(&r), Status::Failed, "{r:?}");
        }
        assert_eq!(s.content_lines.load(Ordering::SeqCst), 0);
        assert_eq!(s.conns.load(Ordering::SeqCst), 2, "not trusted again");
    }
}
