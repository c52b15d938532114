//! The budget of message bytes held in memory by all sessions together and
//! by each account's sessions (`limits.max_bytes_in_flight` and
//! `limits.max_bytes_in_flight_per_account`). Without it, 1,000 connections
//! may each hold a message just under the size limit at once.
//!
//! Pure bookkeeping, no I/O: a session holds a [`Reservation`] that grows
//! with its message buffer and gives everything back when dropped, so no
//! path (submission, RSET, disconnect, task abort) can leak bytes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A reservation was refused: the bytes would exceed a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("the global in-flight budget of {limit} bytes is used up")]
    Global { limit: usize },
    #[error("the account's in-flight budget of {limit} bytes is used up")]
    Account { limit: usize },
}

pub struct InFlightBudget {
    global_limit: usize,
    account_limit: usize,
    global_used: AtomicUsize,
    /// Bytes per account name; entries at zero are removed.
    accounts: Mutex<HashMap<Arc<str>, usize>>,
}

impl fmt::Debug for InFlightBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightBudget")
            .field("global_limit", &self.global_limit)
            .field("account_limit", &self.account_limit)
            .field("global_used", &self.in_use())
            .finish_non_exhaustive()
    }
}

impl InFlightBudget {
    pub fn new(global_limit: usize, account_limit: usize) -> Arc<Self> {
        Arc::new(Self {
            global_limit,
            account_limit,
            global_used: AtomicUsize::new(0),
            accounts: Mutex::new(HashMap::new()),
        })
    }

    /// No limit worth the name: for tests and tools that don't care.
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, usize::MAX)
    }

    /// Bytes reserved by all sessions.
    pub fn in_use(&self) -> usize {
        self.global_used.load(Ordering::Relaxed)
    }

    /// Bytes reserved by one account's sessions.
    pub fn account_in_use(&self, account: &str) -> usize {
        self.lock_accounts().get(account).copied().unwrap_or(0)
    }

    /// A reservation of zero bytes, counted against `account` (if any) and
    /// the global budget as it grows.
    pub fn reservation(self: &Arc<Self>, account: Option<Arc<str>>) -> Reservation {
        Reservation {
            budget: self.clone(),
            account,
            bytes: 0,
        }
    }

    fn lock_accounts(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, usize>> {
        // The map holds plain counters: a panic elsewhere can't leave it
        // half-updated in a way that matters more than losing the budget.
        self.accounts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, account: Option<&Arc<str>>, bytes: usize) -> Result<(), OverBudget> {
        let limit = self.global_limit;
        self.global_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= limit)
            })
            .map_err(|_| OverBudget::Global { limit })?;
        let Some(account) = account else {
            return Ok(());
        };
        let mut accounts = self.lock_accounts();
        let used = accounts.entry(account.clone()).or_insert(0);
        match used.checked_add(bytes).filter(|&n| n <= self.account_limit) {
            Some(n) => {
                *used = n;
                Ok(())
            }
            None => {
                if *used == 0 {
                    accounts.remove(account);
                }
                drop(accounts);
                self.global_used.fetch_sub(bytes, Ordering::AcqRel);
                Err(OverBudget::Account {
                    limit: self.account_limit,
                })
            }
        }
    }

    fn give_back(&self, account: Option<&Arc<str>>, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.global_used.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(account) = account {
            let mut accounts = self.lock_accounts();
            if let Some(used) = accounts.get_mut(account) {
                *used = used.saturating_sub(bytes);
                if *used == 0 {
                    accounts.remove(account);
                }
            }
        }
    }
}

/// Bytes one session holds against the budget; returned on drop.
pub struct Reservation {
    budget: Arc<InFlightBudget>,
    account: Option<Arc<str>>,
    bytes: usize,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("account", &self.account)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Reservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Makes the reservation `total` bytes (never shrinks it). On refusal
    /// the reservation keeps what it had.
    pub fn grow_to(&mut self, total: usize) -> Result<(), OverBudget> {
        let more = total.saturating_sub(self.bytes);
        if more > 0 {
            self.budget.take(self.account.as_ref(), more)?;
            self.bytes = total;
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.account.as_ref(), self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_limit_is_shared_and_returned_on_drop() {
        let budget = InFlightBudget::new(100, 1000);
        let mut a = budget.reservation(None);
        let mut b = budget.reservation(None);
        assert_eq!(a.grow_to(60), Ok(()));
        assert_eq!(b.grow_to(50), Err(OverBudget::Global { limit: 100 }));
        assert_eq!(b.bytes(), 0, "a refused reservation keeps what it had");
        assert_eq!(b.grow_to(40), Ok(()));
        assert_eq!(budget.in_use(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 40);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn account_limit_applies_per_account_and_refunds_the_global_part() {
        let budget = InFlightBudget::new(1000, 100);
        let alice: Arc<str> = Arc::from("alice");
        let mut a1 = budget.reservation(Some(alice.clone()));
        let mut a2 = budget.reservation(Some(alice.clone()));
        let mut bob = budget.reservation(Some(Arc::from("bob")));
        let mut trusted = budget.reservation(None);
        assert_eq!(a1.grow_to(70), Ok(()));
        assert_eq!(a2.grow_to(40), Err(OverBudget::Account { limit: 100 }));
        assert_eq!(budget.in_use(), 70, "the refused account part is refunded");
        assert_eq!(bob.grow_to(90), Ok(()));
        assert_eq!(trusted.grow_to(500), Ok(()), "no account: global only");
        assert_eq!(budget.account_in_use("alice"), 70);
        drop(a1);
        assert_eq!(budget.account_in_use("alice"), 0);
        assert_eq!(a2.grow_to(100), Ok(()));
        drop((a2, bob, trusted));
        assert_eq!(budget.in_use(), 0);
        assert!(budget.lock_accounts().is_empty(), "no entries left behind");
    }

    #[test]
    fn grow_to_never_shrinks() {
        let budget = InFlightBudget::new(100, 100);
        let mut r = budget.reservation(None);
        assert_eq!(r.grow_to(50), Ok(()));
        assert_eq!(r.grow_to(10), Ok(()));
        assert_eq!(r.bytes(), 50);
        assert_eq!(budget.in_use(), 50);
    }
}
