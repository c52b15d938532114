//! A minimal, scriptable SMTP server for the delivery tests: the reply to
//! each `RCPT TO` (and, if asked, to each message's end of DATA) comes from
//! the test, and every transaction it read is kept.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Clone)]
pub(crate) struct Txn {
    pub from: String,
    pub rcpts: Vec<String>,
    pub data: Vec<u8>,
    /// What the server answered to the end of DATA.
    pub reply: String,
}

/// The reply to `RCPT TO:<rcpt>` the `nth` time this recipient is seen.
pub(crate) type Rule = Arc<dyn Fn(&str, usize) -> String + Send + Sync>;

/// The reply to the end of the `nth` DATA (from 1), across connections.
pub(crate) type DataRule = Arc<dyn Fn(usize) -> String + Send + Sync>;

/// A minimal SMTP server on its own thread and runtime (so blocking test
/// code never stalls it), recording every transaction whose data it read.
pub(crate) struct Tiny {
    pub addr: SocketAddr,
    txns: Arc<Mutex<Vec<Txn>>>,
    pub data_started: Arc<AtomicUsize>,
}

impl Tiny {
    /// Every message's data is answered `250`.
    pub(crate) fn start(bind: SocketAddr, rule: Rule, data_delay: Duration) -> Tiny {
        Self::start_with(
            bind,
            rule,
            Arc::new(|_| "250 2.0.0 tiny queued".to_string()),
            data_delay,
        )
    }

    pub(crate) fn start_with(
        bind: SocketAddr,
        rule: Rule,
        data_rule: DataRule,
        data_delay: Duration,
    ) -> Tiny {
        let txns = Arc::new(Mutex::new(Vec::new()));
        let data_started = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let (t, started) = (txns.clone(), data_started.clone());
        let addr = super::spawn_server(bind, move |stream| {
            let session = Session {
                rule: rule.clone(),
                data_rule: data_rule.clone(),
                seen: seen.clone(),
                txns: t.clone(),
                data_started: started.clone(),
                data_delay,
            };
            async move {
                let _ = session.run(stream).await;
            }
        });
        Tiny {
            addr,
            txns,
            data_started,
        }
    }

    pub(crate) fn txns(&self) -> Vec<Txn> {
        self.txns.lock().expect("lock").clone()
    }
}

pub(crate) fn accept_all() -> Rule {
    Arc::new(|_, _| "250 2.1.5 Ok".to_string())
}

fn angle(line: &str) -> String {
    let start = line.find('<').map_or(0, |i| i + 1);
    let end = line.rfind('>').unwrap_or(line.len());
    line.get(start..end).unwrap_or_default().to_string()
}

struct Session {
    rule: Rule,
    data_rule: DataRule,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    txns: Arc<Mutex<Vec<Txn>>>,
    data_started: Arc<AtomicUsize>,
    data_delay: Duration,
}

impl Session {
    async fn run(self, stream: tokio::net::TcpStream) -> std::io::Result<()> {
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        w.write_all(b"220 tiny ESMTP\r\n").await?;
        let (mut from, mut rcpts) = (String::new(), Vec::new());
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            let verb = line.get(..4).unwrap_or_default().to_ascii_uppercase();
            let reply = match verb.as_str() {
                "EHLO" => "250-tiny\r\n250-8BITMIME\r\n250 SIZE 100000000".to_string(),
                "MAIL" => {
                    from = angle(&line);
                    rcpts.clear();
                    "250 2.1.0 Ok".into()
                }
                "RCPT" => {
                    let rcpt = angle(&line);
                    let nth = {
                        let mut seen = self.seen.lock().expect("lock");
                        let n = seen.entry(rcpt.clone()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    let reply = (self.rule)(&rcpt, nth);
                    if reply.starts_with('2') {
                        rcpts.push(rcpt);
                    }
                    reply
                }
                "DATA" if rcpts.is_empty() => "554 5.5.1 No valid recipients".into(),
                "DATA" => {
                    w.write_all(b"354 go ahead\r\n").await?;
                    let nth = self.data_started.fetch_add(1, Ordering::SeqCst) + 1;
                    let Some(data) = super::read_data_body(&mut r).await? else {
                        return Ok(());
                    };
                    tokio::time::sleep(self.data_delay).await;
                    let reply = (self.data_rule)(nth);
                    self.txns.lock().expect("lock").push(Txn {
                        from: from.clone(),
                        rcpts: std::mem::take(&mut rcpts),
                        data,
                        reply: reply.clone(),
                    });
                    reply
                }
                "RSET" | "NOOP" => "250 2.0.0 Ok".into(),
                "QUIT" => {
                    w.write_all(b"221 2.0.0 Bye\r\n").await?;
                    return Ok(());
                }
                _ => "502 5.5.1 Unknown command".into(),
            };
            w.write_all(format!("{reply}\r\n").as_bytes()).await?;
        }
    }
}
