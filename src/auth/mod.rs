//! Who may submit: accounts with argon2id passwords, trusted networks, and
//! the sender addresses each account may use; and the defences around
//! password checks (bounded hashing, throttling, bans).

mod accounts;
mod cache;
mod networks;
mod senders;
mod throttle;
mod verifier;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argon2::{Argon2, PasswordHasher};

pub use accounts::{Account, Submitter};
pub use networks::Cidr;
pub use senders::SenderPattern;
pub use throttle::ThrottleSettings;
pub use verifier::HashError;

use crate::metrics::{AuthFailure, Channel};
use cache::SuccessCache;
use throttle::{Admission, InFlight, Throttle};
use verifier::{HashPool, StoredHash};

/// How long an attempt waits for its address's (or account's) checks in
/// flight to finish before it gets a 454, and how often it looks.
const ADMISSION_WAIT: Duration = Duration::from_secs(30);
const ADMISSION_POLL: Duration = Duration::from_millis(50);
/// The name API-key failures are counted under in the throttle (no
/// account name contains parentheses or spaces, so none is locked by it).
const API_KEY_ACCOUNT: &str = "(api key)";

fn refused(refusal: Admission, peer: IpAddr, username: &str) -> Verdict {
    let metrics = crate::metrics::global();
    if refusal == Admission::IpBanned {
        metrics.auth_failure(Channel::Smtp, AuthFailure::IpBanned);
        tracing::warn!(%peer, user = ?username, "authentication refused: address banned after too many failures");
        Verdict::now(AuthOutcome::IpBanned)
    } else {
        metrics.auth_failure(Channel::Smtp, AuthFailure::AccountLocked);
        tracing::warn!(%peer, user = ?username, "authentication refused: account locked after too many failures");
        Verdict::now(AuthOutcome::AccountLocked)
    }
}

/// What an AUTH attempt came to; the session turns it into a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Success(Arc<Account>),
    /// Wrong user name or password.
    Invalid,
    /// The check could not be made now (hashing queue full).
    TemporaryFailure,
    /// Too many failures for this account from addresses it has not
    /// logged in from recently.
    AccountLocked,
    /// Too many failures from this client address: close the connection.
    IpBanned,
}

/// The outcome, and how long the driver waits before replying (the
/// failure delay; it holds no hashing thread while it waits).
#[derive(Debug)]
pub struct Verdict {
    pub outcome: AuthOutcome,
    pub reply_delay: Duration,
}

impl Verdict {
    fn now(outcome: AuthOutcome) -> Self {
        Self {
            outcome,
            reply_delay: Duration::ZERO,
        }
    }
}

/// `[auth]` settings beyond `allow_plaintext`.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// Threads that run argon2 checks, each with its own reused memory.
    pub hash_threads: usize,
    /// Checks that may wait for a thread; more get a 454.
    pub hash_queue: usize,
    pub throttle: ThrottleSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("user {user:?}: password_hash: {source}")]
    Hash { user: String, source: HashError },
    #[error("cannot start the password hashing threads: {0}")]
    Threads(std::io::Error),
}

/// Checks that a `password_hash` is an argon2 PHC string we can verify.
pub fn check_password_hash(hash: &str) -> Result<(), String> {
    StoredHash::parse(hash)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Produces the PHC string for `[[user]].password_hash`.
pub fn hash_password(password: &str) -> Result<String, String> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// One `[[user]]`, as the authenticator takes it.
pub struct NewAccount {
    pub name: String,
    pub password_hash: String,
    pub workspace: String,
    pub allowed_senders: Option<Vec<SenderPattern>>,
}

struct Credential {
    account: Arc<Account>,
    hash: Arc<StoredHash>,
}

/// Verified against for unknown user names, so the timing does not reveal
/// which names exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c210cC1vbmNlLWR1bW15$0t3pQH7kC2RVH1xvH3lqJm3nqAqRxdKjD0z6SgY0V3A";

/// The account directory and everything that guards password checks.
pub struct Authenticator {
    accounts: HashMap<String, Credential>,
    dummy: Arc<StoredHash>,
    trusted: Vec<(Cidr, String)>,
    pool: HashPool,
    cache: SuccessCache,
    throttle: Throttle,
}

impl Authenticator {
    /// The directory of `accounts`, the `trusted` networks (CIDR and
    /// workspace, first match wins) and the `[auth]` settings.
    pub fn new(
        accounts: Vec<NewAccount>,
        trusted: Vec<(Cidr, String)>,
        settings: &AuthSettings,
    ) -> Result<Self, AuthError> {
        let mut directory = HashMap::new();
        for u in accounts {
            let hash = StoredHash::parse(&u.password_hash).map_err(|source| AuthError::Hash {
                user: u.name.clone(),
                source,
            })?;
            let account = Arc::new(Account {
                name: u.name.clone(),
                workspace: u.workspace,
                allowed_senders: u.allowed_senders,
            });
            directory.insert(
                u.name,
                Credential {
                    account,
                    hash: Arc::new(hash),
                },
            );
        }
        let dummy = StoredHash::parse(DUMMY_HASH).map_err(|source| AuthError::Hash {
            user: "(built-in dummy)".into(),
            source,
        })?;
        Ok(Self {
            accounts: directory,
            dummy: Arc::new(dummy),
            trusted,
            pool: HashPool::start(settings.hash_threads, settings.hash_queue)
                .map_err(AuthError::Threads)?,
            cache: SuccessCache::new(),
            throttle: Throttle::new(settings.throttle.clone()),
        })
    }

    /// The workspace of the first trusted network containing `ip`.
    pub fn trusted_workspace(&self, ip: IpAddr) -> Option<String> {
        self.trusted
            .iter()
            .find(|(cidr, _)| cidr.contains(ip))
            .map(|(_, ws)| ws.clone())
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|(cidr, _)| cidr.contains(ip))
    }

    /// `ip` is banned after too many failures; refuse it at connect time.
    pub fn is_banned(&self, ip: IpAddr) -> bool {
        !self.is_trusted(ip) && self.throttle.is_banned(ip, Instant::now())
    }

    /// A wrong or missing API key from `peer` (HTTP): counted in the same
    /// per-address throttle as AUTH failures, so guesses slow down and
    /// end in the same ban on every channel. Returns how long to wait
    /// before answering.
    pub fn api_key_failed(&self, peer: IpAddr) -> Duration {
        crate::metrics::global().auth_failure(Channel::Http, AuthFailure::Invalid);
        if self.is_trusted(peer) {
            return Duration::ZERO;
        }
        self.throttle.failed(peer, API_KEY_ACCOUNT, Instant::now())
    }

    /// A banned address's request on a connection opened before the ban.
    pub fn api_key_refused_banned(&self, peer: IpAddr) -> bool {
        let banned = self.is_banned(peer);
        if banned {
            crate::metrics::global().auth_failure(Channel::Http, AuthFailure::IpBanned);
        }
        banned
    }

    /// Checks a login from `peer`: bans, then the cache of recent
    /// successes, then an argon2 check on a hashing thread. Logs every
    /// refusal with the peer address (client strings escaped).
    pub async fn authenticate(&self, peer: IpAddr, username: &str, password: &str) -> Verdict {
        let throttled = !self.is_trusted(peer);
        if throttled && let Some(refusal) = self.throttle.refusal(peer, username, Instant::now()) {
            return refused(refusal, peer, username);
        }
        // A name and password seen to succeed moments ago is no guess: no
        // in-flight budget, no hashing (a client opening many connections at
        // once).
        if let Some(account) = self.cache.get(username, password, Instant::now()) {
            if throttled {
                self.throttle.remember_login(peer, username, Instant::now());
            }
            tracing::info!(%peer, user = ?username, "authenticated");
            return Verdict::now(AuthOutcome::Success(account));
        }
        let ticket = if throttled {
            match self.admit(peer, username).await {
                Ok(ticket) => Some(ticket),
                Err(verdict) => return verdict,
            }
        } else {
            None
        };
        let matched = match self.check(username, password).await {
            Ok(matched) => matched,
            // The ticket's drop gives its place back: not the client's fault.
            Err(verifier::Busy) => {
                tracing::warn!(%peer, user = ?username, "authentication deferred: password hashing queue full");
                return Verdict::now(AuthOutcome::TemporaryFailure);
            }
        };
        match matched {
            Some(account) => {
                if let Some(ticket) = ticket {
                    ticket.succeeded(Instant::now());
                }
                tracing::info!(%peer, user = ?username, "authenticated");
                Verdict::now(AuthOutcome::Success(account))
            }
            None => {
                let reply_delay =
                    ticket.map_or(Duration::ZERO, |ticket| ticket.failed(Instant::now()));
                crate::metrics::global().auth_failure(Channel::Smtp, AuthFailure::Invalid);
                tracing::info!(%peer, user = ?username, "authentication failed");
                Verdict {
                    outcome: AuthOutcome::Invalid,
                    reply_delay,
                }
            }
        }
    }

    /// Waits (at most [`ADMISSION_WAIT`]) until the address's and account's
    /// budgets have room for one more check, and takes it.
    async fn admit(&self, peer: IpAddr, username: &str) -> Result<InFlight<'_>, Verdict> {
        let waiting_since = Instant::now();
        loop {
            match self.throttle.admit(peer, username, Instant::now()) {
                Admission::Allowed => return Ok(self.throttle.in_flight(peer, username)),
                Admission::Wait if waiting_since.elapsed() < ADMISSION_WAIT => {
                    tokio::time::sleep(ADMISSION_POLL).await;
                }
                Admission::Wait => {
                    tracing::warn!(%peer, user = ?username, "authentication deferred: too many checks in flight for this address or account");
                    return Err(Verdict::now(AuthOutcome::TemporaryFailure));
                }
                refusal @ (Admission::IpBanned | Admission::AccountLocked) => {
                    return Err(refused(refusal, peer, username));
                }
            }
        }
    }

    /// The account if the password is right.
    async fn check(
        &self,
        username: &str,
        password: &str,
    ) -> Result<Option<Arc<Account>>, verifier::Busy> {
        let credential = self.accounts.get(username);
        let hash = credential.map_or(&self.dummy, |c| &c.hash).clone();
        let ok = self.pool.verify(hash, password).await?;
        match credential {
            Some(c) if ok => {
                self.cache
                    .insert(username, password, c.account.clone(), Instant::now());
                Ok(Some(c.account.clone()))
            }
            _ => Ok(None),
        }
    }
}

/// The front door turns banned addresses away on every listener, and lets
/// trusted networks past the per-address cap.
impl crate::front_door::ClientPolicy for Authenticator {
    fn is_banned(&self, ip: IpAddr) -> bool {
        Authenticator::is_banned(self, ip)
    }

    fn is_exempt(&self, ip: IpAddr) -> bool {
        self.is_trusted(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip() {
        let hash = hash_password("s3cret").unwrap();
        assert!(check_password_hash(&hash).is_ok());
        assert!(check_password_hash("plain").is_err());
        assert!(check_password_hash(DUMMY_HASH).is_ok());
    }
}
