//! "In progress" lives only in memory: a claim is held from the end of DATA
//! until the commit (or failure) completes, and a crash or kill -9 releases
//! every claim by itself, so no key can be stuck in progress.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Claims {
    held: Arc<Mutex<HashSet<(String, String)>>>,
}

/// Releases its claim when dropped, on every path out of the pipeline.
pub struct ClaimGuard {
    held: Arc<Mutex<HashSet<(String, String)>>>,
    id: (String, String),
}

impl Claims {
    /// `None` if the key is already being processed in this workspace.
    pub fn try_claim(&self, workspace: &str, key: &str) -> Option<ClaimGuard> {
        let id = (workspace.to_owned(), key.to_owned());
        // A poisoned lock only means another task panicked mid-insert; the
        // set itself is still consistent.
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(id.clone()) {
            return None;
        }
        Some(ClaimGuard {
            held: self.held.clone(),
            id,
        })
    }

    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_is_exclusive_per_workspace_and_released_on_drop() {
        let claims = Claims::default();
        let a = claims.try_claim("w1", "k").expect("first claim");
        assert!(claims.try_claim("w1", "k").is_none());
        let b = claims.try_claim("w2", "k").expect("other workspace");
        drop(a);
        assert!(claims.try_claim("w1", "k").is_some());
        drop(b);
        assert!(claims.is_empty());
    }
}
