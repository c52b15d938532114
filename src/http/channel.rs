//! The HTTP wording of the acceptance pipeline's outcomes. A response is
//! kept as `<status>\n<json body>`: that is what the ledger stores for an
//! HTTP request (a `202`, or a `403` for a refused `From:`: 4xx are stored,
//! 5xx never), and what a replay gives back byte for byte.

use serde_json::json;

use crate::accept::channel::ChannelWording;
use crate::accept::from_header::SenderRefusal;
use crate::content_check::ContentFault;
use crate::message::key_header::IdempotencyKeyError;
use crate::message::mime_limits::MimeLimitError;
use crate::store::LedgerEntry;

/// A response from the pipeline, decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub replay: bool,
}

const REPLAY_MARK: &[u8] = b"replay ";

pub fn encode(status: u16, body: &serde_json::Value) -> Vec<u8> {
    let mut out = format!("{status}\n").into_bytes();
    out.extend_from_slice(body.to_string().as_bytes());
    out
}

pub fn error(status: u16, code: &str, message: &str) -> Vec<u8> {
    encode(status, &json!({ "code": code, "message": message }))
}

pub fn decode(bytes: &[u8]) -> Answer {
    let (replay, rest) = match bytes.strip_prefix(REPLAY_MARK) {
        Some(rest) => (true, rest),
        None => (false, bytes),
    };
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let status = std::str::from_utf8(&rest[..split])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    Answer {
        status,
        body: rest.get(split + 1..).unwrap_or_default().to_vec(),
        replay,
    }
}

pub struct Http;

impl ChannelWording for Http {
    fn metric(&self) -> crate::metrics::Channel {
        crate::metrics::Channel::Http
    }

    fn accepted(&self, queue_id: &str) -> Vec<u8> {
        encode(202, &json!({ "id": queue_id, "status": "queued" }))
    }

    fn sender_refused(&self, refusal: &SenderRefusal) -> Vec<u8> {
        error(403, "SenderNotAllowed", &refusal.words())
    }

    fn replay(&self, stored: &[u8]) -> Vec<u8> {
        // Ours: three digits and a newline ("202\n{...}"); an SMTP reply
        // has a space or dash after its code.
        let ours =
            stored.len() > 3 && stored[..3].iter().all(u8::is_ascii_digit) && stored[3] == b'\n';
        if ours {
            let mut out = REPLAY_MARK.to_vec();
            out.extend_from_slice(stored);
            out
        } else {
            // Stored by SMTP: its fingerprints never match an HTTP
            // request's, so this cannot happen; answer a conflict.
            error(
                409,
                "E01005",
                "idempotency key already used for a different request",
            )
        }
    }

    fn conflict(&self, entry: &LedgerEntry) -> Vec<u8> {
        let what = match &entry.queue_id {
            Some(id) => format!("a different request (message {id})"),
            None => "a different request, which was refused".to_owned(),
        };
        error(
            409,
            "E01005",
            &format!("idempotency key already used for {what}"),
        )
    }

    fn in_progress(&self) -> Vec<u8> {
        error(
            409,
            "E01004",
            "a request with this idempotency key is in progress; retry shortly",
        )
    }

    fn unavailable(&self) -> Vec<u8> {
        error(
            503,
            "E01033",
            "idempotency store unavailable: nothing was done, retry",
        )
    }

    fn storage_failure(&self) -> Vec<u8> {
        error(
            503,
            "StorageFailure",
            "temporary storage failure: nothing was done, retry",
        )
    }

    fn bad_key(&self, error_: &IdempotencyKeyError) -> Vec<u8> {
        let message = match error_ {
            IdempotencyKeyError::TooLong { chars, .. } => {
                format!("Idempotency-Key is longer than 255 characters ({chars})")
            }
            IdempotencyKeyError::Repeated { .. } | IdempotencyKeyError::Conflicting { .. } => {
                "Idempotency-Key is given twice with different values".into()
            }
            IdempotencyKeyError::NotUtf8 { .. } => "Idempotency-Key is not valid UTF-8".into(),
        };
        error(422, "E01001", &message)
    }

    fn over_limits(&self, error_: &MimeLimitError) -> Vec<u8> {
        error(
            422,
            "MimeLimits",
            &format!("message refused: {error_} (server limit)"),
        )
    }

    fn too_many_hops(&self, count: usize, limit: usize) -> Vec<u8> {
        error(
            422,
            "TooManyHops",
            &format!(
                "message refused: {count} Received: header fields, the limit is {limit} (mail loop?)"
            ),
        )
    }

    fn content_refused(&self, fault: &ContentFault) -> Vec<u8> {
        error(422, "BadContent", &format!("message refused: {fault}"))
    }

    fn analysis_failed(&self) -> Vec<u8> {
        error(
            503,
            "AnalysisFailed",
            "temporary failure analysing the message, retry",
        )
    }

    fn signing_failed(&self) -> Vec<u8> {
        error(
            503,
            "SigningFailed",
            "temporary failure signing the message (DKIM): nothing was done, retry",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_answers_come_back_byte_for_byte_marked_as_replays() {
        let stored = Http.accepted("Q1");
        let first = decode(&stored);
        assert_eq!(first.status, 202);
        assert!(!first.replay);
        let again = decode(&Http.replay(&stored));
        assert_eq!(
            (again.status, &again.body, again.replay),
            (202, &first.body, true)
        );
        let body: serde_json::Value = serde_json::from_slice(&first.body).expect("json");
        assert_eq!(body, json!({"id": "Q1", "status": "queued"}));
    }

    #[test]
    fn errors_carry_the_seeds_codes() {
        for (bytes, status, code) in [
            (Http.in_progress(), 409, "E01004"),
            (Http.unavailable(), 503, "E01033"),
            (
                Http.bad_key(&IdempotencyKeyError::TooLong {
                    header: "Idempotency-Key".into(),
                    chars: 300,
                }),
                422,
                "E01001",
            ),
            (Http.replay(b"250 2.0.0 Ok\r\n"), 409, "E01005"),
        ] {
            let a = decode(&bytes);
            let body: serde_json::Value = serde_json::from_slice(&a.body).expect("json");
            assert_eq!((a.status, body["code"].as_str()), (status, Some(code)));
        }
    }
}
