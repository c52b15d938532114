//! Connections at once per client address, so that one address cannot take
//! the whole `max_connections` cap (Postfix: `smtpd_client_connection_count_limit`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Who counts as "one client": an IPv4 address, or an IPv6 /64 (the
/// smallest block a subscriber is usually given, so rotating through its
/// addresses doesn't multiply the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    V4(u32),
    V6Prefix(u64),
}

impl ClientKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(u32::from(v4)),
                None => Self::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Counts open connections per [`ClientKey`].
pub struct PerIpLimit {
    max: usize,
    counts: Arc<Mutex<HashMap<ClientKey, usize>>>,
}

/// One counted connection; the count drops with it.
pub struct PerIpSlot {
    key: ClientKey,
    counts: Arc<Mutex<HashMap<ClientKey, usize>>>,
}

impl PerIpLimit {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            counts: Arc::default(),
        }
    }

    /// A slot for `ip`, or `None` when it already has `max` connections.
    pub fn try_acquire(&self, ip: IpAddr) -> Option<PerIpSlot> {
        let key = ClientKey::of(ip);
        // The map holds only plain counts: a panic elsewhere cannot leave
        // it inconsistent, so a poisoned lock is still usable.
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PerIpSlot {
            key,
            counts: self.counts.clone(),
        })
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.counts.lock().map(|c| c.len()).unwrap_or(0)
    }
}

impl Drop for PerIpSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                // Forget idle addresses so the map stays as small as the
                // set of connected clients.
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn limits_each_address_and_frees_on_drop() {
        let limit = PerIpLimit::new(2);
        let a1 = limit.try_acquire(ip("192.0.2.1")).unwrap();
        let _a2 = limit.try_acquire(ip("192.0.2.1")).unwrap();
        assert!(limit.try_acquire(ip("192.0.2.1")).is_none());
        let _b = limit.try_acquire(ip("192.0.2.2")).unwrap();
        drop(a1);
        assert!(limit.try_acquire(ip("192.0.2.1")).is_some());
    }

    #[test]
    fn forgets_addresses_with_no_connection() {
        let limit = PerIpLimit::new(1);
        drop(limit.try_acquire(ip("192.0.2.1")));
        assert_eq!(limit.tracked(), 0);
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let limit = PerIpLimit::new(1);
        let _a = limit.try_acquire(ip("2001:db8:1:2::1")).unwrap();
        assert!(limit.try_acquire(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(limit.try_acquire(ip("2001:db8:1:3::1")).is_some());
        let _v4 = limit.try_acquire(ip("192.0.2.7")).unwrap();
        assert!(limit.try_acquire(ip("::ffff:192.0.2.7")).is_none());
    }
}
