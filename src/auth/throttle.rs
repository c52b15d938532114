//! Brute-force throttling: a reply delay that grows with a client's recent
//! failures, and temporary bans per client address and per account name.
//!
//! An attempt is charged as a failure *before* the password is checked and
//! refunded if it succeeds, so parallel connections from one address cannot
//! all slip past the budget while their checks are in flight.
//!
//! An account ban would let anyone lock a real user out by failing on their
//! name, so it does not apply to addresses that logged in as that account
//! successfully within [`KNOWN_ADDRESS_MEMORY`].

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::networks::client_key;

/// Client addresses (or IPv6 /64s) tracked at most. Each is ~64 bytes.
pub const MAX_TRACKED_CLIENTS: usize = 65_536;
/// Account names tracked at most (unknown names too, so that the replies
/// don't reveal which names exist).
pub const MAX_TRACKED_ACCOUNTS: usize = 16_384;
/// How long a successful login exempts an address from its account's ban.
pub const KNOWN_ADDRESS_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Addresses remembered per account.
const KNOWN_ADDRESSES_PER_ACCOUNT: usize = 16;

/// `[auth]` throttling settings.
#[derive(Debug, Clone)]
pub struct ThrottleSettings {
    pub failure_delay: Duration,
    pub max_failure_delay: Duration,
    pub max_failures_per_ip: u32,
    pub max_failures_per_account: u32,
    pub ban_time: Duration,
}

/// Whether an AUTH attempt may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    IpBanned,
    AccountLocked,
}

pub struct Throttle {
    settings: ThrottleSettings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    clients: HashMap<IpAddr, Record>,
    accounts: HashMap<String, Record>,
    known: HashMap<String, Vec<(IpAddr, Instant)>>,
}

/// Failures of one client or account. The count is forgotten after
/// `ban_time` without a failure, or when a ban ends.
struct Record {
    failures: u32,
    last: Instant,
    banned_until: Option<Instant>,
}

impl Record {
    fn new(now: Instant) -> Self {
        Self {
            failures: 0,
            last: now,
            banned_until: None,
        }
    }

    fn banned(&self, now: Instant) -> bool {
        self.banned_until.is_some_and(|until| until > now)
    }

    /// Nothing left to remember at `now`.
    fn stale(&self, now: Instant, ban_time: Duration) -> bool {
        match self.banned_until {
            Some(until) => until <= now,
            None => now.saturating_duration_since(self.last) >= ban_time,
        }
    }

    fn refresh(&mut self, now: Instant, ban_time: Duration) {
        if self.stale(now, ban_time) {
            *self = Record::new(now);
        }
    }
}

/// The record for `key`, made room for within `cap` entries: stale ones go
/// first, then the least recently active.
fn record<'a, K: Hash + Eq + Clone>(
    map: &'a mut HashMap<K, Record>,
    key: &K,
    now: Instant,
    cap: usize,
    ban_time: Duration,
) -> &'a mut Record {
    if !map.contains_key(key) && map.len() >= cap {
        map.retain(|_, r| !r.stale(now, ban_time));
        if map.len() >= cap
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, r)| r.last)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
    let r = map.entry(key.clone()).or_insert_with(|| Record::new(now));
    r.refresh(now, ban_time);
    r
}

impl Throttle {
    pub fn new(settings: ThrottleSettings) -> Self {
        Self {
            settings,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `ip` is banned right now (checked when it connects).
    pub fn is_banned(&self, ip: IpAddr, now: Instant) -> bool {
        self.state()
            .clients
            .get(&client_key(ip))
            .is_some_and(|r| r.banned(now))
    }

    /// Decides on an attempt and, if it may go ahead, charges it.
    pub fn admit(&self, ip: IpAddr, user: &str, now: Instant) -> Admission {
        let s = &self.settings;
        let ip = client_key(ip);
        let mut guard = self.state();
        let state = &mut *guard;
        let client = record(
            &mut state.clients,
            &ip,
            now,
            MAX_TRACKED_CLIENTS,
            s.ban_time,
        );
        // Attempts still in flight count: they are charged already.
        if client.banned(now) || client.failures >= s.max_failures_per_ip {
            return Admission::IpBanned;
        }
        client.failures += 1;
        client.last = now;
        let known = state.known.get(user).is_some_and(|list| {
            list.iter().any(|(a, at)| {
                *a == ip && now.saturating_duration_since(*at) < KNOWN_ADDRESS_MEMORY
            })
        });
        let account = record(
            &mut state.accounts,
            &user.to_owned(),
            now,
            MAX_TRACKED_ACCOUNTS,
            s.ban_time,
        );
        if account.banned(now) && !known {
            // Not a guess after all: give the charge back.
            if let Some(client) = state.clients.get_mut(&ip) {
                client.failures = client.failures.saturating_sub(1);
            }
            return Admission::AccountLocked;
        }
        account.failures += 1;
        account.last = now;
        Admission::Allowed
    }

    /// The attempt succeeded: refund its charge and remember the address.
    pub fn succeeded(&self, ip: IpAddr, user: &str, now: Instant) {
        let ip = client_key(ip);
        self.refund(ip, user);
        let mut state = self.state();
        let list = state.known.entry(user.to_owned()).or_default();
        list.retain(|(a, at)| {
            *a != ip && now.saturating_duration_since(*at) < KNOWN_ADDRESS_MEMORY
        });
        if list.len() >= KNOWN_ADDRESSES_PER_ACCOUNT {
            list.remove(0);
        }
        list.push((ip, now));
    }

    /// The attempt could not be checked (server busy): not the client's fault.
    pub fn not_checked(&self, ip: IpAddr, user: &str) {
        self.refund(client_key(ip), user);
    }

    fn refund(&self, ip: IpAddr, user: &str) {
        let mut state = self.state();
        if let Some(r) = state.clients.get_mut(&ip) {
            r.failures = r.failures.saturating_sub(1);
        }
        if let Some(r) = state.accounts.get_mut(user) {
            r.failures = r.failures.saturating_sub(1);
        }
    }

    /// The password was wrong. Starts bans when a budget is used up and
    /// returns how long to wait before replying.
    pub fn failed(&self, peer: IpAddr, user: &str, now: Instant) -> Duration {
        let s = &self.settings;
        let ip = client_key(peer);
        let mut guard = self.state();
        let state = &mut *guard;
        let client = record(
            &mut state.clients,
            &ip,
            now,
            MAX_TRACKED_CLIENTS,
            s.ban_time,
        );
        client.failures = client.failures.max(1);
        client.last = now;
        let failures = client.failures;
        if failures >= s.max_failures_per_ip && !client.banned(now) {
            client.banned_until = Some(now + s.ban_time);
            tracing::warn!(
                peer = %peer,
                failures,
                ban_time = ?s.ban_time,
                "client address banned: too many authentication failures"
            );
        }
        let account = record(
            &mut state.accounts,
            &user.to_owned(),
            now,
            MAX_TRACKED_ACCOUNTS,
            s.ban_time,
        );
        account.failures = account.failures.max(1);
        account.last = now;
        if account.failures >= s.max_failures_per_account && !account.banned(now) {
            account.banned_until = Some(now + s.ban_time);
            tracing::warn!(
                user = ?user,
                peer = %peer,
                failures = account.failures,
                ban_time = ?s.ban_time,
                "account locked for addresses it has not logged in from: too many authentication failures"
            );
        }
        self.delay(failures)
    }

    /// `failure_delay` doubled for each earlier failure, at most
    /// `max_failure_delay` (Dovecot's scheme).
    fn delay(&self, failures: u32) -> Duration {
        let s = &self.settings;
        let doublings = failures.saturating_sub(1).min(31);
        s.failure_delay
            .saturating_mul(1u32 << doublings)
            .min(s.max_failure_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> Throttle {
        Throttle::new(ThrottleSettings {
            failure_delay: Duration::from_secs(2),
            max_failure_delay: Duration::from_secs(15),
            max_failures_per_ip: 3,
            max_failures_per_account: 4,
            ban_time: Duration::from_secs(60),
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn delay_doubles_up_to_the_cap() {
        let t = throttle();
        let d: Vec<u64> = (1..=6).map(|n| t.delay(n).as_secs()).collect();
        assert_eq!(d, [2, 4, 8, 15, 15, 15]);
    }

    #[test]
    fn client_is_banned_after_its_budget_and_released_after_ban_time() {
        let t = throttle();
        let now = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..3 {
            assert_eq!(t.admit(a, "x", now), Admission::Allowed);
            t.failed(a, "x", now);
        }
        assert_eq!(t.admit(a, "x", now), Admission::IpBanned);
        assert!(t.is_banned(a, now));
        assert!(!t.is_banned(ip("192.0.2.2"), now));
        let later = now + Duration::from_secs(61);
        assert!(!t.is_banned(a, later));
        assert_eq!(t.admit(a, "x", later), Admission::Allowed);
    }

    #[test]
    fn parallel_attempts_cannot_exceed_the_budget() {
        let t = throttle();
        let now = Instant::now();
        let a = ip("192.0.2.1");
        let admitted = (0..10)
            .filter(|_| t.admit(a, "x", now) == Admission::Allowed)
            .count();
        assert_eq!(admitted, 3);
    }

    #[test]
    fn success_refunds_and_protects_from_the_account_lock() {
        let t = throttle();
        let now = Instant::now();
        let owner = ip("198.51.100.7");
        assert_eq!(t.admit(owner, "bob", now), Admission::Allowed);
        t.succeeded(owner, "bob", now);
        for i in 0..4 {
            let attacker = ip(&format!("203.0.113.{i}"));
            assert_eq!(t.admit(attacker, "bob", now), Admission::Allowed);
            t.failed(attacker, "bob", now);
        }
        assert_eq!(
            t.admit(ip("203.0.113.99"), "bob", now),
            Admission::AccountLocked
        );
        assert_eq!(t.admit(owner, "bob", now), Admission::Allowed);
        assert_eq!(t.admit(owner, "alice", now), Admission::Allowed);
    }

    #[test]
    fn tables_stay_bounded() {
        let t = throttle();
        let now = Instant::now();
        for i in 0..(MAX_TRACKED_CLIENTS as u32 + 100) {
            let a = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            t.admit(a, "x", now);
        }
        assert!(t.state().clients.len() <= MAX_TRACKED_CLIENTS);
    }
}
