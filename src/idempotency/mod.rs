//! Exactly-once acceptance, apart from storage: reading the key, the
//! fingerprint of "the same request", the in-memory in-progress claims, and
//! the decision between a new operation, a replay and a conflict.

pub mod claims;
pub mod decision;
pub mod fingerprint;
pub mod request;
pub mod transit;
pub mod volatile;

use sha2::{Digest, Sha256};

/// A short, non-reversible name for a key in logs: the key itself may carry
/// customer data and is never logged.
pub fn key_hash(workspace: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(workspace.as_bytes());
    h.update([0u8]);
    h.update(key.as_bytes());
    let digest = h.finalize();
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}
