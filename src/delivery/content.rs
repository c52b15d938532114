//! The bytes relayed for one transaction: our trace headers (`Received:`
//! and any `DKIM-Signature:` made at acceptance), the
//! `X-Bird-Idempotency-Key` the next hop deduplicates on, and the body as
//! accepted. The key header is never in a signature's `h=`, so rewriting it
//! here leaves the signature valid.
//!
//! The key must name exactly one envelope at the next hop. A transaction to
//! every recipient carries the submitter's key unchanged (or
//! `smtp-once-<queue-id>` when there was none). A transaction to only some of
//! them (a retry of the deferred ones, one MX domain of several) carries
//! `<key>/<hash of those recipients>`: with the bare key, the next hop would
//! see a second envelope under a used key and refuse it (E01005). Every
//! value is a function of the stored message and the recipient set only, so
//! a retry after a crash sends the same bytes and is replayed, not
//! delivered twice.
//!
//! The stored key is the key of the ledger entry, whichever channel it came
//! from; the body's own key header is kept only when it says the same. An
//! HTTP submission's key is its `Idempotency-Key` request header: a JSON
//! body has no key header at all, and a raw body's may say anything (or be
//! there without a request key). Either way the next hop gets the ledger's
//! key (or `smtp-once-<queue-id>`), never one the client chose apart from
//! it. Over SMTP the stored key is read from the body, so its bytes go out
//! unchanged when it came in `X-Bird-Idempotency-Key` alone.
//!
//! Whatever header the key came in (`[idempotency] key_headers`:
//! `X-Idempotency-Key`, `Idempotency-Key`...), it leaves in
//! `X-Bird-Idempotency-Key`, and every configured key header of the body is
//! left out: the next hop, whatever names it reads, sees one key.

use sha2::{Digest, Sha256};

use crate::message::headers::field_spans;
use crate::message::key_header::{HEADER_NAME, KeyHeaders, MAX_KEY_CHARS, extract_key};

/// The key for a transaction to `subset` of the message's `all` recipients.
pub fn hop_key(
    queue_id: &str,
    submitter_key: Option<&str>,
    all: &[String],
    subset: &[String],
) -> String {
    let base = submitter_key.map_or_else(|| format!("smtp-once-{queue_id}"), str::to_owned);
    if same_set(all, subset) {
        return base;
    }
    let suffix = subset_hash(subset);
    let key = format!("{base}/{suffix}");
    if key.chars().count() <= MAX_KEY_CHARS {
        key
    } else {
        format!("smtp-once-{queue_id}/{suffix}")
    }
}

/// The message as relayed to `subset` of the recipients; `key_headers`
/// are the names the key may have come in (`[idempotency] key_headers`).
pub fn relayed(
    queue_id: &str,
    trace: &str,
    body: &[u8],
    submitter_key: Option<&str>,
    all: &[String],
    subset: &[String],
    key_headers: &KeyHeaders,
) -> Vec<u8> {
    let key = hop_key(queue_id, submitter_key, all, subset);
    let mut out = Vec::with_capacity(trace.len() + key.len() + body.len() + 32);
    out.extend_from_slice(trace.as_bytes());
    if submitter_key == Some(key.as_str()) && carries_only(body, &key, key_headers) {
        // The body carries the key already, byte for byte as submitted.
        out.extend_from_slice(body);
        return out;
    }
    out.extend_from_slice(format!("{HEADER_NAME}: {key}\r\n").as_bytes());
    // Any key header of the body (empty, the submitter's key that this
    // transaction replaces, or the key under another configured name) goes,
    // so the next hop sees exactly one key.
    let mut pos = 0;
    for field in field_spans(body) {
        let is_key = body
            .get(field.name.clone())
            .is_some_and(|n| key_headers.is_removed_on_relay(n));
        if !is_key {
            continue;
        }
        out.extend_from_slice(body.get(pos..field.name.start).unwrap_or_default());
        let rest = body.get(field.value.end..).unwrap_or_default();
        let line_break = if rest.starts_with(b"\r\n") {
            2
        } else {
            usize::from(rest.starts_with(b"\n"))
        };
        pos = field.value.end + line_break;
    }
    out.extend_from_slice(body.get(pos..).unwrap_or_default());
    out
}

/// Whether the body names `key` in `X-Bird-Idempotency-Key` and in no
/// other key header: then it can go out as it is.
fn carries_only(body: &[u8], key: &str, key_headers: &KeyHeaders) -> bool {
    let other_names = field_spans(body).any(|f| {
        body.get(f.name).is_some_and(|n| {
            key_headers.is_removed_on_relay(n) && !n.eq_ignore_ascii_case(HEADER_NAME.as_bytes())
        })
    });
    !other_names && extract_key(body).ok().flatten().as_deref() == Some(key)
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut b: Vec<&str> = b.iter().map(String::as_str).collect();
    a.sort_unstable();
    a.dedup();
    b.sort_unstable();
    b.dedup();
    a == b
}

fn subset_hash(subset: &[String]) -> String {
    let mut sorted: Vec<&str> = subset.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut h = Sha256::new();
    for r in sorted {
        h.update(r.as_bytes());
        h.update(b"\n");
    }
    h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::key_header::extract_key;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    const TRACE: &str = "Received: from x by y; date\r\n";

    #[test]
    fn a_full_transaction_keeps_the_submitters_bytes() {
        let body = b"X-Bird-Idempotency-Key: k1\r\nSubject: s\r\n\r\nhi\r\n";
        let all = v(&["a@x", "b@y"]);
        let out = relayed(
            "Q1",
            TRACE,
            body,
            Some("k1"),
            &all,
            &v(&["b@y", "a@x"]),
            &KeyHeaders::default(),
        );
        assert_eq!(out, [TRACE.as_bytes(), body].concat());
    }

    #[test]
    fn without_a_key_one_is_derived_from_the_queue_id() {
        let body = b"X-Bird-Idempotency-Key:  \r\nSubject: s\r\n\r\nhi\r\n";
        let all = v(&["a@x"]);
        let out = relayed("Q1", TRACE, body, None, &all, &all, &KeyHeaders::default());
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with(TRACE), "{text}");
        assert_eq!(extract_key(&out), Ok(Some("smtp-once-Q1".into())));
        assert!(
            text.ends_with("X-Bird-Idempotency-Key: smtp-once-Q1\r\nSubject: s\r\n\r\nhi\r\n"),
            "{text}"
        );
    }

    #[test]
    fn a_partial_transaction_gets_its_own_stable_key() {
        let body = b"Subject: s\r\nx-bird-idempotency-key: k1\r\n\tfolded\r\n\r\nhi\r\n";
        let all = v(&["a@x", "b@y", "c@z"]);
        let first = relayed(
            "Q1",
            TRACE,
            body,
            Some("k1 folded"),
            &all,
            &v(&["b@y", "c@z"]),
            &KeyHeaders::default(),
        );
        let again = relayed(
            "Q1",
            TRACE,
            body,
            Some("k1 folded"),
            &all,
            &v(&["c@z", "b@y"]),
            &KeyHeaders::default(),
        );
        let other = relayed(
            "Q1",
            TRACE,
            body,
            Some("k1 folded"),
            &all,
            &v(&["c@z"]),
            &KeyHeaders::default(),
        );
        assert_eq!(first, again);
        let k1 = extract_key(&first).unwrap().unwrap();
        let k2 = extract_key(&other).unwrap().unwrap();
        assert!(k1.starts_with("k1 folded/") && k1 != k2, "{k1} {k2}");
        let text = String::from_utf8(first).unwrap();
        assert_eq!(text.matches("dempotency-Key").count(), 1, "{text}");
        assert!(text.ends_with("Subject: s\r\n\r\nhi\r\n"), "{text}");
    }

    #[test]
    fn a_stored_key_the_body_does_not_carry_is_written() {
        // HTTP: the key came from `Idempotency-Key`; a JSON-built body has
        // no key header, a raw one may name another key.
        let all = v(&["a@x"]);
        for body in [
            &b"Subject: s\r\n\r\nhi\r\n"[..],
            b"X-Bird-Idempotency-Key: theirs\r\nSubject: s\r\n\r\nhi\r\n",
            b"X-Bird-Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: theirs\r\n\r\nhi\r\n",
        ] {
            let out = relayed(
                "Q1",
                TRACE,
                body,
                Some("k1"),
                &all,
                &all,
                &KeyHeaders::default(),
            );
            let text = String::from_utf8(out.clone()).unwrap();
            assert_eq!(extract_key(&out), Ok(Some("k1".into())), "{text}");
            assert_eq!(text.matches("dempotency-Key").count(), 1, "{text}");
            assert!(text.ends_with("\r\n\r\nhi\r\n"), "{text}");
        }
    }

    /// Issue 21 item 2: a key that came in another configured header leaves
    /// in X-Bird-Idempotency-Key alone.
    #[test]
    fn a_key_from_another_header_leaves_in_ours_alone() {
        let headers = KeyHeaders::new([HEADER_NAME, "X-Idempotency-Key", "Idempotency-Key"]);
        let all = v(&["a@x"]);
        for body in [
            &b"X-Idempotency-Key: k1\r\nSubject: s\r\n\r\nhi\r\n"[..],
            b"Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: k1\r\nSubject: s\r\n\r\nhi\r\n",
            b"x-idempotency-key:\r\n k1\r\nIdempotency-Key: k1\r\nSubject: s\r\n\r\nhi\r\n",
        ] {
            let out = relayed("Q1", TRACE, body, Some("k1"), &all, &all, &headers);
            let text = String::from_utf8(out.clone()).unwrap();
            assert_eq!(
                text,
                format!("{TRACE}X-Bird-Idempotency-Key: k1\r\nSubject: s\r\n\r\nhi\r\n")
            );
            assert_eq!(headers.extract(&out), Ok(Some("k1".into())), "{text}");
        }
        // The default list leaves an unlisted Idempotency-Key alone.
        let body = b"Idempotency-Key: app\r\nX-Bird-Idempotency-Key: k1\r\n\r\nhi\r\n";
        let out = relayed(
            "Q1",
            TRACE,
            body,
            Some("k1"),
            &all,
            &all,
            &KeyHeaders::default(),
        );
        assert_eq!(out, [TRACE.as_bytes(), body].concat());
    }

    #[test]
    fn a_long_key_falls_back_to_the_queue_id() {
        let long = "k".repeat(MAX_KEY_CHARS);
        let key = hop_key("Q1", Some(&long), &v(&["a@x", "b@y"]), &v(&["a@x"]));
        assert!(key.starts_with("smtp-once-Q1/"), "{key}");
    }
}
