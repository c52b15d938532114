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

/// The stored reply, byte for byte, preceded by the replay marker line in
/// the stored reply's own code, so a client reading only the last line sees
/// exactly what it saw the first time.
pub fn replay_reply(stored: &[u8]) -> Vec<u8> {
    let code = stored.get(..3).unwrap_or(b"250");
    let esc = stored
        .get(4..)
        .and_then(|rest| rest.split(|&b| b == b' ' || b == b'\r').next())
        .filter(|esc| is_enhanced_code(esc))
        .unwrap_or(b"2.0.0");
    let mut out = Vec::with_capacity(stored.len() + 40);
    out.extend_from_slice(code);
    out.push(b'-');
    out.extend_from_slice(esc);
    out.extend_from_slice(b" Idempotency-Replay: true\r\n");
    out.extend_from_slice(stored);
    out
}

/// `550 5.6.0 E01005`, naming what the key already belongs to (in the
/// submitter's own workspace: the lookup is per workspace), so that an
/// application can reconcile: the queue id of the first message, or the code
/// of the stored rejection.
pub fn conflict_reply(entry: &LedgerEntry) -> Vec<u8> {
    let what = match &entry.queue_id {
        Some(id) => format!("a different message (queued as {id})"),
        None => match entry
            .reply
            .get(..3)
            .filter(|c| c.iter().all(u8::is_ascii_digit))
        {
            Some(code) => format!(
                "a message that was rejected ({})",
                String::from_utf8_lossy(code)
            ),
            None => "a message that was rejected".to_owned(),
        },
    };
    format!("550 5.6.0 E01005 IdempotencyKeyReuse: key already used for {what}\r\n").into_bytes()
}

fn is_enhanced_code(s: &[u8]) -> bool {
    let parts: Vec<&[u8]> = s.split(|&b| b == b'.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fp: u8) -> LedgerEntry {
        LedgerEntry {
            fingerprint: [fp; 32],
            reply: b"250 2.0.0 Ok: queued as X\r\n".to_vec(),
            queue_id: Some("X".into()),
            created_at: 0,
            expires_at: 1,
        }
    }

    #[test]
    fn decides_execute_replay_conflict() {
        let e = entry(1);
        assert_eq!(decide(None, &[1; 32]), Decision::Execute);
        assert_eq!(decide(Some(&e), &[1; 32]), Decision::Replay(&e));
        assert_eq!(decide(Some(&e), &[2; 32]), Decision::Conflict(&e));
    }

    #[test]
    fn conflict_names_the_queue_id_or_the_rejection() {
        assert_eq!(
            conflict_reply(&entry(1)),
            b"550 5.6.0 E01005 IdempotencyKeyReuse: key already used for a different message (queued as X)\r\n"
        );
        let rejected = LedgerEntry {
            reply: b"553 5.7.1 From not allowed\r\n".to_vec(),
            queue_id: None,
            ..entry(1)
        };
        assert_eq!(
            conflict_reply(&rejected),
            b"550 5.6.0 E01005 IdempotencyKeyReuse: key already used for a message that was rejected (553)\r\n"
        );
    }

    #[test]
    fn replay_marker_takes_the_stored_code() {
        assert_eq!(
            replay_reply(b"250 2.0.0 Ok: queued as X\r\n"),
            b"250-2.0.0 Idempotency-Replay: true\r\n250 2.0.0 Ok: queued as X\r\n"
        );
        assert_eq!(
            replay_reply(b"553 5.7.1 From not allowed\r\n"),
            b"553-5.7.1 Idempotency-Replay: true\r\n553 5.7.1 From not allowed\r\n"
        );
    }
}
