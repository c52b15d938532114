//! The SQLite ledger's lookup key: a 64-bit hash of (workspace, key).
//!
//! Rows are appended in acceptance order and found through an index of
//! this hash (schema migration 4): an index entry is 16 bytes whatever the
//! key's length, so the tree that random keys write into stays small. Two
//! keys may share a hash; every query also compares workspace and key.

use sha2::{Digest, Sha256};

pub(super) fn hash(workspace: &str, key: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(workspace.as_bytes());
    // A separator no workspace name holds: ("ab", "c") and ("a", "bc")
    // hash apart.
    h.update([0u8]);
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_separated() {
        assert_eq!(hash("default", "k"), hash("default", "k"));
        assert_ne!(hash("ab", "c"), hash("a", "bc"));
        assert_ne!(hash("default", "k1"), hash("default", "k2"));
    }
}
