//! MTA-STS (RFC 8461): a domain's published promise that its MX hosts
//! take verified TLS. Looked up per delivery, behind the TXT record's id:
//!
//! - a valid `_mta-sts` TXT id that differs from the cached policy's (or
//!   no cached policy): the policy is fetched ([`fetch`]), cached for its
//!   `max_age` and written to `<data_dir>/mta-sts-policies.json`, so a
//!   restart keeps it;
//! - the same id: the cached policy, no fetch;
//! - no TXT record, a DNS failure, or a fetch that fails: the cached policy
//!   while it has not expired (an attacker who blocks DNS or HTTPS must not
//!   turn enforcement off), else none. A failed fetch is not repeated for
//!   [`RETRY_FAILED_FETCH`].

pub mod fetch;
pub mod policy;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::resolver::Resolver;
use fetch::Fetcher;
pub use policy::{Mode, Policy};

/// Domains whose policy is kept; beyond, the soonest to expire go.
pub const MAX_CACHED: usize = 10_000;
/// A domain whose policy could not be fetched is not asked again sooner.
pub const RETRY_FAILED_FETCH: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    id: String,
    policy: Policy,
    /// Unix seconds.
    expires_at: u64,
}

pub struct MtaSts {
    resolver: Arc<dyn Resolver>,
    fetcher: Fetcher,
    cache: Mutex<HashMap<String, Entry>>,
    failed: Mutex<HashMap<String, Instant>>,
    /// Where the cache is kept across restarts (`None`: memory only).
    file: Option<PathBuf>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl MtaSts {
    pub fn new(resolver: Arc<dyn Resolver>, fetcher: Fetcher, file: Option<PathBuf>) -> Self {
        let cache = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|bytes| {
                serde_json::from_slice::<HashMap<String, Entry>>(&bytes)
                    .map_err(|e| tracing::warn!(error = %e, "MTA-STS policy cache unreadable; starting empty"))
                    .ok()
            })
            .unwrap_or_default();
        Self {
            resolver,
            fetcher,
            cache: Mutex::new(cache),
            failed: Mutex::new(HashMap::new()),
            file,
        }
    }

    /// The policy that applies to mail for `domain` now, if any.
    pub async fn policy_for(&self, domain: &str) -> Option<Policy> {
        let cached = self
            .cache
            .lock()
            .ok()
            .and_then(|c| c.get(domain).cloned())
            .filter(|e| e.expires_at > now());
        let txt = self.resolver.txt(&format!("_mta-sts.{domain}")).await;
        let id = match txt {
            Ok(records) => policy::txt_id(&records.value),
            Err(e) => {
                tracing::debug!(%domain, error = %e, "MTA-STS TXT lookup failed; cached policy applies");
                None
            }
        };
        let Some(id) = id else {
            return cached.map(|e| e.policy);
        };
        if cached.as_ref().is_some_and(|e| e.id == id) {
            return cached.map(|e| e.policy);
        }
        let recently_failed = self
            .failed
            .lock()
            .ok()
            .and_then(|f| f.get(domain).copied())
            .is_some_and(|at| at.elapsed() < RETRY_FAILED_FETCH);
        if recently_failed {
            return cached.map(|e| e.policy);
        }
        match self.fetch(domain).await {
            Ok(policy) => {
                tracing::info!(%domain, %id, mode = ?policy.mode, mx = %policy.patterns(), max_age = policy.max_age, "MTA-STS policy fetched");
                self.keep(
                    domain,
                    Entry {
                        id,
                        expires_at: now().saturating_add(policy.max_age),
                        policy: policy.clone(),
                    },
                )
                .await;
                Some(policy)
            }
            Err(e) => {
                tracing::warn!(%domain, error = %e, cached = cached.is_some(), "MTA-STS policy could not be fetched");
                if let Ok(mut f) = self.failed.lock() {
                    if f.len() >= MAX_CACHED {
                        f.clear();
                    }
                    f.insert(domain.to_owned(), Instant::now());
                }
                cached.map(|e| e.policy)
            }
        }
    }

    async fn fetch(&self, domain: &str) -> Result<Policy, String> {
        let host = format!("mta-sts.{domain}");
        let ips = self
            .resolver
            .ips(&host)
            .await
            .map_err(|e| format!("{host}: {e}"))?;
        self.fetcher.fetch(domain, &ips.value).await
    }

    async fn keep(&self, domain: &str, entry: Entry) {
        let snapshot = {
            let Ok(mut cache) = self.cache.lock() else {
                return;
            };
            let t = now();
            cache.retain(|_, e| e.expires_at > t);
            while cache.len() >= MAX_CACHED {
                let Some(soonest) = cache
                    .iter()
                    .min_by_key(|(_, e)| e.expires_at)
                    .map(|(d, _)| d.clone())
                else {
                    break;
                };
                cache.remove(&soonest);
            }
            cache.insert(domain.to_owned(), entry);
            serde_json::to_vec(&*cache)
        };
        let (Some(file), Ok(bytes)) = (self.file.clone(), snapshot) else {
            return;
        };
        // Written whole and renamed into place: a crash leaves the old file.
        let written = tokio::task::spawn_blocking(move || {
            let tmp = file.with_extension("json.tmp");
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &file)
        })
        .await;
        if let Ok(Err(e)) = written {
            tracing::warn!(error = %e, "MTA-STS policy cache not saved");
        }
    }
}
