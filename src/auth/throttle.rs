//! Brute-force throttling: a reply delay that grows with a client's recent
//! failures, and temporary bans per client address and per account name.
//!
//! Checks still in flight count against the budget with the failures, so
//! parallel connections from one address cannot all slip past it before a
//! failure is recorded: an attempt beyond it waits for the others to finish
//! ([`Admission::Wait`]). Only real failures ban, so a client that logs in
//! on many connections at once is slowed for a moment, never banned.
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
pub(super) const MAX_TRACKED_CLIENTS: usize = 65_536;
/// Account names tracked at most (unknown names too, so that the replies
/// don't reveal which names exist).
pub(super) const MAX_TRACKED_ACCOUNTS: usize = 16_384;
/// How long a successful login exempts an address from its account's ban.
pub(super) const KNOWN_ADDRESS_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Addresses remembered per account.
const KNOWN_ADDRESSES_PER_ACCOUNT: usize = 16;
/// No account name is longer (config's `check_label`).
const LONGEST_ACCOUNT_NAME: usize = 255;
/// The one record for all longer names: none of them is an account, and
/// AUTH names of kilobytes must not fill the table with kilobyte keys.
/// (No account name contains a space.)
const LONG_NAME: &str = "(names over 255 bytes)";

/// The name an attempt is counted under.
fn account_key(user: &str) -> &str {
    if user.len() > LONGEST_ACCOUNT_NAME {
        LONG_NAME
    } else {
        user
    }
}

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
pub(super) enum Admission {
    Allowed,
    /// The budget is taken by checks still in flight: ask again shortly.
    Wait,
    IpBanned,
    AccountLocked,
}

pub(super) struct Throttle {
    settings: ThrottleSettings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    clients: HashMap<IpAddr, Record>,
    accounts: HashMap<String, Record>,
    known: HashMap<String, Vec<(IpAddr, Instant)>>,
}

/// An admitted check: counted in flight until it is settled, or until it is
/// dropped (a cancelled task) so that no path can leave it counted.
pub(super) struct InFlight<'a> {
    throttle: &'a Throttle,
    ip: IpAddr,
    user: String,
    settled: bool,
}

impl InFlight<'_> {
    pub(super) fn succeeded(mut self, now: Instant) {
        self.settled = true;
        self.throttle.succeeded(self.ip, &self.user, now);
    }

    /// Returns how long to wait before replying.
    pub(super) fn failed(mut self, now: Instant) -> Duration {
        self.settled = true;
        self.throttle.failed(self.ip, &self.user, now)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.throttle.not_checked(self.ip, &self.user);
        }
    }
}

impl State {
    /// `ip` (a client key) logged in as `user` recently.
    fn is_known(&self, ip: IpAddr, user: &str, now: Instant) -> bool {
        self.known.get(user).is_some_and(|list| {
            list.iter().any(|(a, at)| {
                *a == ip && now.saturating_duration_since(*at) < KNOWN_ADDRESS_MEMORY
            })
        })
    }
}

/// Failures of one client or account. The count is forgotten after
/// `ban_time` without a failure, or when a ban ends.
struct Record {
    failures: u32,
    /// Admitted checks not yet finished.
    in_flight: u32,
    last: Instant,
    banned_until: Option<Instant>,
}

impl Record {
    fn new(now: Instant) -> Self {
        Self {
            failures: 0,
            in_flight: 0,
            last: now,
            banned_until: None,
        }
    }

    fn banned(&self, now: Instant) -> bool {
        self.banned_until.is_some_and(|until| until > now)
    }

    /// Nothing left to remember at `now`.
    fn stale(&self, now: Instant, ban_time: Duration) -> bool {
        if self.in_flight > 0 {
            return false;
        }
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

    fn budget_taken(&self, max: u32) -> bool {
        self.failures.saturating_add(self.in_flight) >= max
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
    pub(super) fn new(settings: ThrottleSettings) -> Self {
        Self {
            settings,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `ip` is banned right now (checked when it connects).
    pub(super) fn is_banned(&self, ip: IpAddr, now: Instant) -> bool {
        self.state()
            .clients
            .get(&client_key(ip))
            .is_some_and(|r| r.banned(now))
    }

    /// A ban on the address, or a lock on the account for this address,
    /// whatever the password: checked before anything else, the success
    /// cache included, or a banned guesser could still learn when a guess
    /// was right.
    pub(super) fn refusal(&self, ip: IpAddr, user: &str, now: Instant) -> Option<Admission> {
        let user = account_key(user);
        let ip = client_key(ip);
        let state = self.state();
        if state.clients.get(&ip).is_some_and(|r| r.banned(now)) {
            return Some(Admission::IpBanned);
        }
        let locked = state.accounts.get(user).is_some_and(|r| r.banned(now));
        (locked && !state.is_known(ip, user, now)).then_some(Admission::AccountLocked)
    }

    /// Decides on an attempt and, if it may go ahead, counts it in flight
    /// until [`Throttle::succeeded`], [`Throttle::failed`] or
    /// [`Throttle::not_checked`].
    pub(super) fn admit(&self, ip: IpAddr, user: &str, now: Instant) -> Admission {
        let user = account_key(user);
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
        if client.banned(now) {
            return Admission::IpBanned;
        }
        if client.budget_taken(s.max_failures_per_ip) {
            return Admission::Wait;
        }
        let known = state.is_known(ip, user, now);
        let account = record(
            &mut state.accounts,
            &user.to_owned(),
            now,
            MAX_TRACKED_ACCOUNTS,
            s.ban_time,
        );
        if !known {
            if account.banned(now) {
                return Admission::AccountLocked;
            }
            if account.budget_taken(s.max_failures_per_account) {
                return Admission::Wait;
            }
        }
        account.in_flight += 1;
        account.last = now;
        if let Some(client) = state.clients.get_mut(&ip) {
            client.in_flight += 1;
            client.last = now;
        }
        Admission::Allowed
    }

    /// The in-flight ticket for an attempt [`Throttle::admit`] allowed.
    pub(super) fn in_flight(&self, ip: IpAddr, user: &str) -> InFlight<'_> {
        let user = account_key(user);
        InFlight {
            throttle: self,
            ip,
            user: user.to_owned(),
            settled: false,
        }
    }

    /// The attempt succeeded: it is no longer in flight; remember the
    /// address as one the account logs in from.
    pub(super) fn succeeded(&self, ip: IpAddr, user: &str, now: Instant) {
        let user = account_key(user);
        self.finished(client_key(ip), user);
        self.remember_login(ip, user, now);
    }

    /// A login known good without a check (the success cache): nothing was
    /// admitted, but the address is remembered all the same.
    pub(super) fn remember_login(&self, ip: IpAddr, user: &str, now: Instant) {
        let user = account_key(user);
        let ip = client_key(ip);
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
    pub(super) fn not_checked(&self, ip: IpAddr, user: &str) {
        let user = account_key(user);
        self.finished(client_key(ip), user);
    }

    fn finished(&self, ip: IpAddr, user: &str) {
        let mut state = self.state();
        if let Some(r) = state.clients.get_mut(&ip) {
            r.in_flight = r.in_flight.saturating_sub(1);
        }
        if let Some(r) = state.accounts.get_mut(user) {
            r.in_flight = r.in_flight.saturating_sub(1);
        }
    }

    /// The password was wrong. Starts bans when a budget is used up and
    /// returns how long to wait before replying.
    pub(super) fn failed(&self, peer: IpAddr, user: &str, now: Instant) -> Duration {
        let user = account_key(user);
        let s = &self.settings;
        let ip = client_key(peer);
        self.finished(ip, user);
        let mut guard = self.state();
        let state = &mut *guard;
        let client = record(
            &mut state.clients,
            &ip,
            now,
            MAX_TRACKED_CLIENTS,
            s.ban_time,
        );
        client.failures = client.failures.saturating_add(1);
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
        account.failures = account.failures.saturating_add(1);
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
        let answers: Vec<Admission> = (0..10).map(|_| t.admit(a, "x", now)).collect();
        assert_eq!(answers[..3], [Admission::Allowed; 3]);
        assert!(
            answers[3..].iter().all(|x| *x == Admission::Wait),
            "{answers:?}"
        );
        // In flight is not failed: nobody is banned for waiting.
        assert!(!t.is_banned(a, now));
    }

    #[test]
    fn many_parallel_successes_never_ban() {
        let t = throttle();
        let now = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..20 {
            let admitted: Vec<Admission> = (0..3).map(|_| t.admit(a, "bob", now)).collect();
            assert_eq!(admitted, [Admission::Allowed; 3]);
            for _ in 0..3 {
                t.succeeded(a, "bob", now);
            }
        }
        assert!(!t.is_banned(a, now));
        assert_eq!(t.admit(a, "bob", now), Admission::Allowed);
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

    #[test]
    fn long_user_names_share_one_small_record() {
        // No account name is over 255 bytes; kilobyte guesses, one per
        // address, must not fill the table with kilobyte keys.
        let t = throttle();
        let now = Instant::now();
        for i in 0..4u32 {
            let a = IpAddr::from(std::net::Ipv4Addr::from(0xc000_0200 + i));
            let name = format!("{i}{}", "x".repeat(9000));
            assert_eq!(t.admit(a, &name, now), Admission::Allowed, "{i}");
            t.failed(a, &name, now);
        }
        let state = t.state();
        let key_bytes: usize = state.accounts.keys().map(String::len).sum();
        assert!(key_bytes <= 256, "{key_bytes} bytes of keys");
    }
}
