//! The SQLite ledger's lookup key: a 64-bit hash of the idempotency key.
//!
//! Rows are appended in acceptance order and found through an index of
//! this hash (schema migration 4): an index entry is 16 bytes whatever the
//! key's length, so the tree that random keys write into stays small. Two
//! keys may share a hash; every query also compares the key (and the
//! workspace, except an operator's search across workspaces, which the
//! workspace-free hash serves from the same index).

use sha2::{Digest, Sha256};

pub(super) fn hash(key: &str) -> i64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_spread() {
        assert_eq!(hash("k"), hash("k"));
        assert_ne!(hash("k1"), hash("k2"));
    }
}
