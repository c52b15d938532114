//! The reporting task: every `relay.tls_rpt_interval` (a day), what the
//! collector counted goes to each domain that asks for it in its
//! `_smtp._tls` TXT record: by mail through this relay's own queue
//! (`mailto:`), or POSTed gzipped to an `https:` address with its
//! certificate verified. A domain that publishes no address gets nothing;
//! a report that could not be sent is logged and dropped (the next one
//! starts afresh, as RFC 8460 expects of a daily aggregate).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::sync::watch;

use super::Collector;
use super::report::{self, Rua};
use crate::delivery::https;
use crate::delivery::resolver::Resolver;
use crate::store::{Acceptance, CommitOutcome, NewMessage, Store, queue_id};

/// The queue rows of reports belong to no tenant.
pub const REPORT_WORKSPACE: &str = "_tls-rpt";

pub struct Settings {
    pub interval: Duration,
    /// `server.hostname`: the submitter's name in every report.
    pub hostname: String,
    /// One POST, whole.
    pub deadline: Duration,
}

/// What the task needs, which the MX transport already has.
pub struct Parts {
    pub collector: Arc<Collector>,
    pub resolver: Arc<dyn Resolver>,
    pub tls: tokio_rustls::TlsConnector,
}

pub struct Reporter {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Reporter {
    pub fn start(parts: Parts, store: Arc<dyn Store>, settings: Settings) -> Reporter {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut start = now_ms();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(settings.interval) => {}
                    _ = stopped.changed() => break,
                }
                let end = now_ms();
                send_all(&parts, &*store, &settings, start, end).await;
                start = end;
            }
        });
        Reporter { stop, task }
    }

    /// Stops the task; what was counted since the last report is not sent.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn send_all(parts: &Parts, store: &dyn Store, s: &Settings, start: i64, end: i64) {
    for (domain, counts) in parts.collector.take() {
        let txt = parts.resolver.txt(&format!("_smtp._tls.{domain}")).await;
        let ruas = match txt {
            Ok(records) => report::rua(&records.value),
            Err(e) => {
                tracing::info!(%domain, error = %e, "TLS-RPT: no report address (DNS)");
                continue;
            }
        };
        if ruas.is_empty() {
            continue;
        }
        let report_id = format!(
            "{}.{}@{}",
            start / 1000,
            uuid::Uuid::new_v4().simple(),
            s.hostname
        );
        let json = report::json(&domain, &counts, &s.hostname, &report_id, start, end);
        let gz = match report::gzip(&json) {
            Ok(gz) => gz,
            Err(e) => {
                tracing::warn!(%domain, error = %e, "TLS-RPT: report not compressed");
                continue;
            }
        };
        for rua in ruas {
            let sent = match &rua {
                Rua::Mailto(to) => {
                    enqueue(store, s, &domain, to, &report_id, &gz, (start, end)).await
                }
                Rua::Https(url) => post(parts, s, url, &gz).await,
            };
            match sent {
                Ok(()) => {
                    tracing::info!(%domain, rua = ?rua, report_id = %report_id, policies = ?report::kinds(&counts), "TLS-RPT report sent")
                }
                Err(e) => {
                    tracing::warn!(%domain, rua = ?rua, error = %e, "TLS-RPT report not sent")
                }
            }
        }
    }
}

/// Queued like any message (the worker relays it), under the reports'
/// own workspace, from the null sender so that it never bounces back.
async fn enqueue(
    store: &dyn Store,
    s: &Settings,
    domain: &str,
    to: &str,
    report_id: &str,
    gz: &[u8],
    range: (i64, i64),
) -> Result<(), String> {
    let now = now_ms();
    let id = queue_id::next();
    let trace = format!(
        "Received: by {} (smtp-once) id {id};\r\n\t{}\r\n",
        s.hostname,
        crate::time::rfc5322_date(now / 1000)
    );
    let body = report::mail(domain, to, &s.hostname, report_id, gz, now / 1000, range);
    let message = NewMessage {
        id,
        workspace: REPORT_WORKSPACE.into(),
        account: "MAILER-DAEMON".into(),
        reverse_path: String::new(),
        recipients: vec![to.to_owned()],
        idempotency_key: None,
        trace,
        body,
        mail_params: None,
        created_at: now,
    };
    let acceptance = Acceptance {
        ledger: None,
        message: Some(message),
        events: Vec::new(),
    };
    match store.commit(acceptance).await {
        Ok(CommitOutcome::Committed) => Ok(()),
        Ok(other) => Err(format!("not queued: {other:?}")),
        Err(e) => Err(format!("not queued: {e}")),
    }
}

/// POST `application/tlsrpt+gzip` (RFC 8460 5.4); any 2xx is taken.
async fn post(parts: &Parts, s: &Settings, url: &str, gz: &[u8]) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("{url}: no host"))?
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let ips = parts
        .resolver
        .ips(&host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    let mut last = format!("{host}: no address");
    for ip in ips.value {
        let request = hyper::Request::post(path.as_str())
            .header("host", &host)
            .header("content-type", "application/tlsrpt+gzip")
            .header(
                "user-agent",
                concat!("smtp-once/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::copy_from_slice(gz)))
            .map_err(|e| format!("request: {e}"))?;
        let addr = std::net::SocketAddr::new(ip, port);
        match tokio::time::timeout(
            s.deadline,
            https::request(&parts.tls, &host, addr, request, 4096),
        )
        .await
        {
            Ok(Ok(a)) if a.status.is_success() => return Ok(()),
            Ok(Ok(a)) => last = format!("{url} [{addr}]: HTTP {}", a.status),
            Ok(Err(e)) => last = format!("{url} [{addr}]: {e}"),
            Err(_) => last = format!("{url} [{addr}]: no answer within {:?}", s.deadline),
        }
    }
    Err(last)
}
