//! `smtp-once serve`, the composition root: config, then the store, then
//! one node built on it (delivery worker, webhook sender, front door,
//! authenticator, in-flight budget, acceptor, `[metrics]`, `[http]` and the
//! SMTP listeners, the ledger purge), run until SIGTERM or SIGINT and shut
//! down in order. Also `check-config`, which loads the config as `serve`
//! does and stops there.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use super::LogFormat;
use super::housekeeping::LedgerPurge;
use crate::accept::Acceptor;
use crate::auth::{AuthError, Authenticator, NewAccount};
use crate::backlog::Backlog;
use crate::config::{Config, StoreBackend};
use crate::delivery::Worker;
use crate::metrics_http::MetricsServer;
use crate::queue_count::QueueCount;
use crate::server::Server;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::sqlite::SqliteStore;
use crate::store::{DeliveryQueue, StatusReader, Store, WebhookOutbox};

pub(super) fn serve(path: PathBuf, log_format: LogFormat) -> Result<(), String> {
    super::logging::init(log_format);
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    match crate::fd_limit::raise_to_hard_limit() {
        Ok(limit) => {
            if let Some(warning) = crate::fd_limit::shortfall(limit, config.max_connections) {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    tracing::info!(node_id = %config.node_id, "starting");
    match &config.store {
        StoreBackend::Sqlite => {
            let store = Arc::new(SqliteStore::open(&config.data_dir).map_err(|e| e.to_string())?);
            tracing::info!(db = %store.db_path().display(), "ledger and queue open");
            runtime.block_on(run_node(&config, store.clone()))?;
            drop(runtime);
            match Arc::try_unwrap(store) {
                Ok(store) => store.close(),
                Err(_) => tracing::warn!("store still in use at exit"),
            }
        }
        StoreBackend::Postgres(pg) => runtime.block_on(async {
            let store = Arc::new(
                PgStore::open(PgOptions {
                    url: &pg.url,
                    pool_size: pg.pool_size,
                    ca_file: pg.ca_file.as_deref(),
                    node_id: &config.node_id,
                })
                .await
                .map_err(|e| e.to_string())?,
            );
            run_node(&config, store.clone()).await?;
            store.close();
            Ok::<(), String>(())
        })?,
    }
    tracing::info!("stopped");
    Ok(())
}

/// The web console's state (`[http] console = true`): who is an operator,
/// the store for the ledger and the queue's depth, and its own connection
/// to the webhook outbox, as `smtp-once webhooks` opens one.
async fn console<S: Store>(
    config: &Config,
    store: Arc<S>,
) -> Result<Arc<crate::console::Console>, String> {
    let outbox: Arc<dyn crate::store::outbox::OutboxAdmin + Send + Sync> = match &config.store {
        StoreBackend::Sqlite => Arc::new(
            crate::store::sqlite::OutboxDb::open(&config.data_dir)
                .map_err(|e| format!("cannot open the outbox for the console: {e}"))?,
        ),
        StoreBackend::Postgres(pg) => Arc::new(
            crate::store::postgres::PgOutboxAdmin::connect(&pg.url, pg.ca_file.as_deref())
                .await
                .map_err(|e| format!("cannot open the outbox for the console: {e}"))?,
        ),
    };
    let operators = config
        .users
        .iter()
        .filter(|u| u.operator)
        .map(|u| u.name.clone())
        .collect();
    let endpoints = config.webhooks.iter().map(|w| w.name.clone()).collect();
    Ok(crate::console::Console::start(
        operators, store, outbox, endpoints,
    ))
}

/// Runs the delivery worker and the server on one store until a signal.
async fn run_node<S: Store + DeliveryQueue + StatusReader + WebhookOutbox>(
    config: &Config,
    store: Arc<S>,
) -> Result<(), String> {
    // Producers hand fresh events to this node's sender through it.
    let (handoff, inbox) = crate::webhook::handoff::open(&config.webhooks);
    let router = crate::webhook::Router::new(&config.webhooks).with_handoff(handoff);
    // The worker first: a delivery setting that cannot work (DNS, TLS
    // roots, outbox folder) stops the daemon before it accepts mail.
    let backlog = Arc::new(Backlog::new(
        config.delivery.max_backlog,
        config.delivery.in_flow_delay,
    ));
    let mut worker = Worker::start(config, store.clone(), router.clone(), backlog.clone())
        .await
        .map_err(|e| e.to_string())?;
    // TLS-RPT reports go through the store's queue like any message.
    let tls_reports = worker.take_tls_reporting().map(|parts| {
        crate::delivery::tls_rpt::reporter::Reporter::start(
            parts,
            store.clone(),
            crate::delivery::tls_rpt::reporter::Settings {
                interval: config.delivery.tls_rpt_interval,
                hostname: config.hostname.clone(),
                deadline: config
                    .delivery
                    .timeout
                    .min(std::time::Duration::from_secs(60)),
            },
        )
    });
    let webhooks = crate::webhook::Sender::start(
        &config.webhooks,
        store.clone(),
        config.delivery.keep_finished,
        inbox,
    )
    .await
    .map_err(|e| e.to_string())?;
    // One front door for every listener: failed logins and wrong API keys
    // feed the same bans, and every message body counts against one budget.
    let auth = Arc::new(authenticator(config).map_err(|e| e.to_string())?);
    let door = crate::front_door::Door::new(
        auth.clone(),
        config.limits.max_connections_per_ip,
        config.limits.tls_handshake_timeout,
        config.limits.write_timeout,
    );
    let budget = crate::budget::InFlightBudget::new(
        config.limits.max_bytes_in_flight,
        config.limits.max_bytes_in_flight_per_account,
    );
    // One count of the queue for the gauges and the backlog bound, first
    // before the metrics listener, so a first scrape shows the real queue.
    let counting = if config.metrics.is_some() || backlog.limit() > 0 {
        Some(QueueCount::start(store.clone(), backlog.clone()).await)
    } else {
        None
    };
    let metrics = match &config.metrics {
        Some(settings) => Some(
            MetricsServer::start(
                crate::metrics_http::MetricsOptions {
                    addr: settings.addr,
                    token: settings.token.clone(),
                },
                store.clone(),
                door.clone(),
            )
            .await
            .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let acceptor =
        Arc::new(acceptor(config, store.clone(), router.clone())?.with_backlog(backlog.clone()));
    let http = match &config.http {
        Some(settings) => {
            // The API's queue actions on their own connection, as the
            // CLI's: a long action never waits behind acceptances.
            let admin = super::queue::open(config)
                .await
                .map_err(|e| format!("cannot open the queue for the API's actions: {e}"))?;
            // The console is mounted here, beside the API: the HTTP module
            // serves its routes without knowing them.
            let pages = if settings.console {
                let state: Arc<dyn std::any::Any + Send + Sync> =
                    console(config, store.clone()).await?;
                Some(crate::http::Pages {
                    routes: crate::console::routes(),
                    state,
                })
            } else {
                None
            };
            let front = crate::http::Front {
                door: door.clone(),
                auth: auth.clone(),
                budget: budget.clone(),
                admin: Arc::from(admin),
                webhooks: router,
                pages,
            };
            Some(
                crate::http::start(config, settings, acceptor.clone(), store.clone(), front)
                    .await?,
            )
        }
        None => None,
    };
    let server = Server::start(config, acceptor, auth, door, budget).await?;
    let purge = LedgerPurge::start(store, config.purge_interval);
    // Registered before the lines below: a SIGTERM sent as soon as a script
    // sees them must stop us gracefully, not kill us by the default action.
    let stop = stop_signal();
    if let Some(metrics) = &metrics {
        // Before the listening lines, which tests and scripts wait for.
        println!("smtp-once metrics on {}", metrics.addr);
    }
    for (addr, listener) in server.addrs.iter().zip(&config.listeners) {
        // A stable line on stdout that scripts and tests wait for.
        println!("smtp-once listening on {addr} ({:?})", listener.tls);
    }
    if let Some(http) = &http {
        println!("smtp-once http on {}", http.addr);
    }
    let _ = std::io::stdout().flush();
    stop.await;
    tracing::info!("stopping: finishing in-flight transactions and deliveries");
    if let Some(counting) = counting {
        counting.shutdown().await;
    }
    let http_stopped = async {
        if let Some(http) = http {
            http.shutdown().await;
        }
    };
    let reports_stopped = async {
        if let Some(r) = tls_reports {
            r.shutdown().await;
        }
    };
    tokio::join!(
        server.shutdown(),
        purge.shutdown(),
        worker.shutdown(),
        http_stopped,
        reports_stopped
    );
    // After the worker: its last records may have written events.
    if let Some(webhooks) = webhooks {
        webhooks.shutdown().await;
    }
    // Last, so /readyz and /metrics see the whole shutdown.
    if let Some(metrics) = metrics {
        metrics.shutdown().await;
    }
    Ok(())
}

/// The acceptance pipeline for a node's configuration, shared by every
/// channel; `webhooks` routes its `message.accepted` events.
pub fn acceptor(
    config: &Config,
    store: Arc<dyn Store>,
    webhooks: crate::webhook::Router,
) -> Result<Acceptor, String> {
    Acceptor::new(
        store,
        config.retention,
        config.hostname.clone(),
        &config.limits,
        crate::idempotency::volatile::VolatileHeaders::new(config.volatile_headers.iter().cloned()),
    )
    .map(|a| {
        a.with_webhooks(webhooks)
            .with_dkim(crate::dkim::Signers::new(config.dkim.clone()))
            .with_transit(crate::idempotency::transit::TransitHeaders::new(
                config.transit_headers.iter().cloned(),
            ))
            .with_trace(crate::accept::TraceOptions {
                auth: config.received_auth_header,
            })
            .with_key_headers(crate::message::key_header::KeyHeaders::new(
                config.key_headers.iter().cloned(),
            ))
    })
}

/// The account directory from `[[user]]`, `[[trusted_network]]` and
/// `[auth]`: one per node, shared by every channel so that failures on
/// any of them feed the same bans.
fn authenticator(config: &Config) -> Result<Authenticator, AuthError> {
    let accounts = config
        .users
        .iter()
        .map(|u| NewAccount {
            name: u.name.clone(),
            password_hash: u.password_hash.clone(),
            workspace: u.workspace.clone(),
            allowed_senders: u.allowed_senders.clone(),
        })
        .collect();
    let trusted = config
        .trusted_networks
        .iter()
        .map(|t| (t.cidr, t.workspace.clone()))
        .collect();
    Authenticator::new(accounts, trusted, &config.auth)
}

/// Resolves at SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when it is first polled.
fn stop_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

pub(super) fn check_config(path: PathBuf) -> Result<(), String> {
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    println!(
        "{}: ok ({} listener(s), {} user(s), {} trusted network(s), {} DKIM key(s), data in {})",
        path.display(),
        config.listeners.len(),
        config.users.len(),
        config.trusted_networks.len(),
        config.dkim.len(),
        config.data_dir.display()
    );
    Ok(())
}
