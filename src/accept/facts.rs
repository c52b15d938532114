//! One look at a submitted message, on a pool thread: the key, the MIME
//! limits, the fingerprint and the `From:` check. Everything here reads the
//! whole content and costs CPU in proportion to its size, so none of it runs
//! on an async worker.

use crate::idempotency::fingerprint::{Fingerprint, fingerprint_checked, keyed_fingerprint};
use crate::idempotency::request::{request_fingerprint, request_key};
use crate::idempotency::transit::TransitHeaders;
use crate::idempotency::volatile::VolatileHeaders;
use crate::message::key_header::{IdempotencyKeyError, KeyHeaders};
use crate::message::mime_limits::{self, MimeLimitError, MimeLimits};
use crate::submission::{MailOptions, Submission};
use sha2::{Digest, Sha256};

use super::channel::KeySource;
use super::from_header::{self, SenderRefusal};

/// What decides the path through the acceptance pipeline.
pub(super) enum Verdict {
    /// More `Received:` fields than `limits.max_hops`: the message is
    /// looping between relays (RFC 5321 6.3).
    TooManyHops { count: usize, limit: usize },
    /// The key header is invalid (`E01001`).
    BadKey(IdempotencyKeyError),
    /// The MIME structure is over the limits; the message was not parsed.
    OverLimits {
        error: MimeLimitError,
        key: Option<String>,
    },
    /// No key: processed without deduplication.
    Unkeyed,
    /// A valid key and the request's fingerprint.
    Keyed(String, Fingerprint),
}

/// What decides a message's identity: the MIME limits within which it is
/// parsed, and which headers carry the key or stay out of the fingerprint.
#[derive(Debug, Clone)]
pub(super) struct IdentityRules {
    pub limits: MimeLimits,
    pub volatile: VolatileHeaders,
    pub transit: TransitHeaders,
    pub key_headers: KeyHeaders,
    /// More `Received:` fields than this: a loop (`limits.max_hops`).
    pub max_hops: usize,
}

pub(super) struct Facts {
    pub verdict: Verdict,
    /// Why the `From:` header is refused, if it is.
    pub from_rejection: Option<SenderRefusal>,
}

impl Facts {
    pub(super) fn of(sub: &Submission, source: &KeySource, rules: &IdentityRules) -> Facts {
        let IdentityRules {
            limits,
            volatile,
            transit,
            key_headers,
            max_hops,
        } = rules;
        let hops = crate::message::headers::received_count(&sub.content);
        let verdict = match key_of(sub, source, key_headers) {
            _ if hops > *max_hops => Verdict::TooManyHops {
                count: hops,
                limit: *max_hops,
            },
            Err(e) => Verdict::BadKey(e),
            Ok(key) => match (mime_limits::check(&sub.content, limits), key) {
                (Err(error), key) => Verdict::OverLimits { error, key },
                (Ok(_), None) => Verdict::Unkeyed,
                (Ok(within), Some(key)) => Verdict::Keyed(
                    key,
                    identity(
                        source,
                        keyed_fingerprint(
                            &sub.reverse_path,
                            &sub.recipients,
                            &within,
                            limits,
                            volatile,
                            transit,
                        ),
                        sub.options,
                    ),
                ),
            },
        };
        Facts {
            verdict,
            from_rejection: from_header::rejection(&sub.submitter, &sub.content),
        }
    }
}

/// The fingerprints this message had under the earlier rules, where they
/// differ from today's: every header counting (before volatile headers, or
/// under `volatile_headers = []`), and the volatile values left out but the
/// transit fields counting (before transit headers). An entry stored under
/// one of them within the retention window still replays for a
/// byte-identical retry after an upgrade or a config change. Empty if the
/// content is over the limits (it passed them once, so never here).
pub(super) fn earlier_fingerprints(
    sub: &Submission,
    source: &KeySource,
    rules: &IdentityRules,
) -> Vec<Fingerprint> {
    let IdentityRules {
        limits,
        volatile,
        transit,
        ..
    } = rules;
    let Ok(within) = mime_limits::check(&sub.content, limits) else {
        return Vec::new();
    };
    let with = |v: &VolatileHeaders| {
        identity(
            source,
            fingerprint_checked(&sub.reverse_path, &sub.recipients, &within, v),
            sub.options,
        )
    };
    let mut earlier = Vec::with_capacity(2);
    if !volatile.is_empty() {
        earlier.push(with(&VolatileHeaders::none()));
    }
    // Without a transit field the volatile-only rule is today's.
    if transit.occur_in(&sub.content) {
        earlier.push(with(volatile));
    }
    earlier
}

/// The MAIL parameters that change how a message travels are part of what
/// was asked: the same message under its key with REQUIRETLS and without
/// is two requests. Without any, the fingerprint is the message's alone,
/// as it always was (stored entries keep replaying).
fn with_options(message: Fingerprint, options: MailOptions) -> Fingerprint {
    if options == MailOptions::default() {
        return message;
    }
    let mut h = Sha256::new();
    h.update(b"smtp-once mail options\0");
    h.update(message);
    h.update(options.to_stored().unwrap_or_default().as_bytes());
    h.finalize().into()
}

/// SMTP reads the key from the message's configured key headers
/// (`[idempotency] key_headers`); HTTP from its request header.
fn key_of(
    sub: &Submission,
    source: &KeySource,
    key_headers: &KeyHeaders,
) -> Result<Option<String>, IdempotencyKeyError> {
    match source {
        KeySource::MessageHeader => key_headers.extract(&sub.content),
        KeySource::Request { key, .. } => request_key(key.as_deref()),
    }
}

/// An HTTP request's identity is its request line with the message's
/// fingerprint: the same message sent to another path, with other query
/// parameters, or over SMTP under the same key is a different request.
fn identity(source: &KeySource, message: Fingerprint, options: MailOptions) -> Fingerprint {
    match source {
        KeySource::MessageHeader => with_options(message, options),
        KeySource::Request { line, body, .. } => {
            request_fingerprint(line, &body.unwrap_or(message))
        }
    }
}
