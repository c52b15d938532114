//! The node's housekeeping loop started by `serve`: expired ledger entries
//! purged every `purge_interval`, in small batches, until shutdown.
//! (The delivery worker and the webhook sender purge their own finished
//! rows.)

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{Store, now_millis};

/// The running purge loop and the switch that stops it.
pub(super) struct LedgerPurge {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl LedgerPurge {
    pub(super) fn start(store: Arc<dyn Store>, interval: Duration) -> LedgerPurge {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(purge_loop(store, interval, stopped));
        LedgerPurge { stop, task }
    }

    /// Returns once the loop has ended: at most the batch in progress is
    /// finished.
    pub(super) async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "ledger purge task ended abnormally");
        }
    }
}

async fn purge_loop(
    store: Arc<dyn Store>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    const BATCH: usize = 500;
    let interval = interval.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // Small batches keep each write transaction short, so acceptances
        // never queue behind a large delete.
        let started = tokio::time::Instant::now();
        let mut purged = 0usize;
        loop {
            match store.purge_expired(now_millis(), BATCH).await {
                Ok(n) if n > 0 => {
                    purged += n;
                    crate::metrics::global().ledger_purged(n);
                }
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "ledger purge failed");
                    break;
                }
            }
            if *shutdown.borrow() {
                return;
            }
        }
        if purged > 0 {
            let seconds = started.elapsed().as_secs_f64();
            tracing::info!(purged, seconds, "expired ledger entries removed");
        }
    }
}
