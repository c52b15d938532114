//! The idempotency decision, given what the ledger holds for a key.

use crate::store::LedgerEntry;

use super::fingerprint::Fingerprint;

#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// No live entry: process the message as a new operation.
    Execute,
    /// The same request again: answer with the stored reply.
    Replay(&'a LedgerEntry),
    /// The key was used for a different request.
    Conflict(&'a LedgerEntry),
}

pub fn decide<'a>(existing: Option<&'a LedgerEntry>, fingerprint: &Fingerprint) -> Decision<'a> {
    match existing {
        None => Decision::Execute,
        Some(entry) if entry.fingerprint == *fingerprint => Decision::Replay(entry),
        Some(entry) => Decision::Conflict(entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fp: u8) -> LedgerEntry {
        LedgerEntry::queued_as_x(fp)
    }

    #[test]
    fn decides_execute_replay_conflict() {
        let e = entry(1);
        assert_eq!(decide(None, &[1; 32]), Decision::Execute);
        assert_eq!(decide(Some(&e), &[1; 32]), Decision::Replay(&e));
        assert_eq!(decide(Some(&e), &[2; 32]), Decision::Conflict(&e));
    }
}
