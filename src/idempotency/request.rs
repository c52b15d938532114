//! An HTTP request's key and identity, the seeds' rules for every mutating
//! request (a submission or an operation on a message): the key is the
//! `Idempotency-Key` header, and the request is its method, path, query and
//! body, so the same key on another route, with other parameters or another
//! body, is a different request.

use sha2::{Digest, Sha256};

use super::fingerprint::Fingerprint;
use crate::message::key_header::{IdempotencyKeyError, MAX_KEY_CHARS};

/// The key of `Idempotency-Key: <raw>`: `None` when absent or blank, an
/// error when over [`MAX_KEY_CHARS`] characters.
pub fn request_key(raw: Option<&str>) -> Result<Option<String>, IdempotencyKeyError> {
    let Some(key) = raw.map(str::trim).filter(|k| !k.is_empty()) else {
        return Ok(None);
    };
    let chars = key.chars().count();
    if chars > MAX_KEY_CHARS {
        return Err(IdempotencyKeyError::TooLong {
            header: "Idempotency-Key".into(),
            chars,
        });
    }
    Ok(Some(key.to_owned()))
}

/// The identity of a request: its request line (`METHOD /path?query`)
/// with `body`, a fingerprint of what it carries (the body's hash, or the
/// message's fingerprint when the body is the message).
pub fn request_fingerprint(line: &str, body: &Fingerprint) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(b"smtp-once http request\0");
    h.update(line.as_bytes());
    h.update(b"\0");
    h.update(body);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_identities() {
        assert_eq!(request_key(None).ok(), Some(None));
        assert_eq!(request_key(Some("  ")).ok(), Some(None));
        assert_eq!(request_key(Some(" k1 ")).ok(), Some(Some("k1".into())));
        assert!(request_key(Some(&"é".repeat(255))).is_ok());
        assert!(matches!(
            request_key(Some(&"k".repeat(256))),
            Err(IdempotencyKeyError::TooLong { chars: 256, .. })
        ));
        let body = [1; 32];
        let a = request_fingerprint("POST /v1/messages/Q1/hold?", &body);
        assert_ne!(a, request_fingerprint("POST /v1/messages/Q2/hold?", &body));
        assert_ne!(
            a,
            request_fingerprint("POST /v1/messages/Q1/hold?", &[2; 32])
        );
        assert_eq!(a, request_fingerprint("POST /v1/messages/Q1/hold?", &body));
    }
}
