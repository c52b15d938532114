//! Extraction of the idempotency key header from a raw message: by default
//! `X-Bird-Idempotency-Key`, or any of the names in `[idempotency]
//! key_headers` ([`KeyHeaders`]), so a client written for another provider
//! keeps its keys.
//!
//! The fields come from the ground floor's header scanner
//! (`message::headers`): cheap, and safe on arbitrary bytes. Only a folded
//! value allocates, when it is unfolded.

use std::borrow::Cow;
use std::sync::Arc;

use crate::message::headers::top_level_headers;

/// Longest accepted key, counted in Unicode scalar values (chars), not bytes.
pub const MAX_KEY_CHARS: usize = 255;
/// The header that carries the idempotency key (matched case-insensitively),
/// and the one smtp-once always writes for the next hop.
pub const HEADER_NAME: &str = "X-Bird-Idempotency-Key";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdempotencyKeyError {
    #[error("{header} is longer than 255 characters ({chars})")]
    TooLong { header: String, chars: usize },
    #[error("{header} appears more than once with different values")]
    Repeated { header: String },
    /// Two of the configured key headers name different keys.
    #[error("{first} and {second} carry different keys")]
    Conflicting { first: String, second: String },
    #[error("{header} is not valid UTF-8")]
    NotUtf8 { header: String },
}

/// The header names a key is read from (`[idempotency] key_headers`),
/// matched ASCII case-insensitively. Cheap to clone: shared by every
/// acceptance and every delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHeaders {
    names: Arc<[String]>,
}

impl Default for KeyHeaders {
    fn default() -> Self {
        Self::new([HEADER_NAME])
    }
}

impl KeyHeaders {
    /// `names` in priority order; the config has checked that they are
    /// field names, not empty and without duplicates.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The list position of `name`, if it is a key header.
    fn position(&self, name: &[u8]) -> Option<usize> {
        self.names
            .iter()
            .position(|n| n.as_bytes().eq_ignore_ascii_case(name))
    }

    /// Whether a relayed copy must drop a field named `name`: any key
    /// header, and always `X-Bird-Idempotency-Key` (the one written for the
    /// next hop, which must be the only key it sees).
    pub fn is_removed_on_relay(&self, name: &[u8]) -> bool {
        self.position(name).is_some() || name.eq_ignore_ascii_case(HEADER_NAME.as_bytes())
    }

    /// Extracts the idempotency key from the message's top-level header
    /// section, from the first listed name that is present (list order, not
    /// message order).
    ///
    /// `Ok(None)`: no listed header, or only empty ones (no deduplication).
    /// `Ok(Some(key))`: the unfolded value with surrounding whitespace trimmed.
    ///
    /// - Folding: a line break followed by SP/HT is removed, the SP/HT is kept.
    /// - Trimming: SP, HT, CR and LF around the value are removed (not other
    ///   Unicode whitespace: the key is compared byte for byte afterwards).
    /// - Several occurrences, under one listed name or under several: fine
    ///   when every non-empty one has the same value, an error otherwise
    ///   ([`IdempotencyKeyError::Repeated`], [`IdempotencyKeyError::Conflicting`]): a message that
    ///   names two keys is refused rather than deduplicated on a guess. So the
    ///   list order decides only which name a refusal names first. Empty
    ///   occurrences are ignored: an empty header carries no key, so it
    ///   neither asks for deduplication nor contradicts a key given elsewhere.
    /// - Errors are reported for the first offending occurrence in header order.
    pub fn extract(&self, message: &[u8]) -> Result<Option<String>, IdempotencyKeyError> {
        // (list position, value) of the first occurrence: every later one
        // must agree, so which one is kept does not change the key.
        let mut key: Option<(usize, Cow<'_, str>)> = None;
        for (name, raw) in top_level_headers(message) {
            let Some(at) = self.position(name) else {
                continue;
            };
            let header = || self.names.get(at).cloned().unwrap_or_default();
            let value = unfold(trim_wsp(raw));
            if value.is_empty() {
                continue;
            }
            let value =
                into_str(value).ok_or_else(|| IdempotencyKeyError::NotUtf8 { header: header() })?;
            let chars = value.chars().count();
            if chars > MAX_KEY_CHARS {
                return Err(IdempotencyKeyError::TooLong {
                    header: header(),
                    chars,
                });
            }
            match &key {
                None => key = Some((at, value)),
                Some((_, prev)) if *prev == value => {}
                Some((first, _)) if *first == at => {
                    return Err(IdempotencyKeyError::Repeated { header: header() });
                }
                Some((first, _)) => {
                    let (a, b) = ((*first).min(at), (*first).max(at));
                    let name = |i: usize| self.names.get(i).cloned().unwrap_or_default();
                    return Err(IdempotencyKeyError::Conflicting {
                        first: name(a),
                        second: name(b),
                    });
                }
            }
        }
        Ok(key.map(|(_, k)| k.into_owned()))
    }
}

/// The key of `X-Bird-Idempotency-Key` alone (the default `key_headers`);
/// see [`KeyHeaders::extract`].
pub fn extract_key(message: &[u8]) -> Result<Option<String>, IdempotencyKeyError> {
    KeyHeaders::default().extract(message)
}

/// Trims SP, HT, CR and LF from both ends.
fn trim_wsp(v: &[u8]) -> &[u8] {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let start = v.iter().position(|b| !ws(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !ws(b)).map_or(start, |i| i + 1);
    v.get(start..end).unwrap_or_default()
}

/// Removes folding line breaks ("\r\n" or "\n"; the SP/HT after them stays).
/// Borrows when the value is not folded, which is the common case.
fn unfold(v: &[u8]) -> Cow<'_, [u8]> {
    if !v.contains(&b'\n') {
        return Cow::Borrowed(v);
    }
    let mut out = Vec::with_capacity(v.len());
    let mut bytes = v.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        match b {
            b'\n' => {}
            b'\r' if bytes.peek() == Some(&b'\n') => {}
            _ => out.push(b),
        }
    }
    Cow::Owned(out)
}

fn into_str(v: Cow<'_, [u8]>) -> Option<Cow<'_, str>> {
    match v {
        Cow::Borrowed(b) => std::str::from_utf8(b).ok().map(Cow::Borrowed),
        Cow::Owned(b) => String::from_utf8(b).ok().map(Cow::Owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(msg: &str) -> Result<Option<String>, IdempotencyKeyError> {
        extract_key(msg.as_bytes())
    }

    #[test]
    fn absent() {
        assert_eq!(key("From: a@b\r\nSubject: hi\r\n\r\nbody\r\n"), Ok(None));
        assert_eq!(key(""), Ok(None));
    }

    #[test]
    fn empty_is_absent() {
        assert_eq!(key("X-Bird-Idempotency-Key:\r\n\r\n"), Ok(None));
        assert_eq!(key("X-Bird-Idempotency-Key:   \t \r\n\r\n"), Ok(None));
        // A whitespace-only continuation line is still empty.
        assert_eq!(
            key("X-Bird-Idempotency-Key: \r\n \r\nA: b\r\n\r\n"),
            Ok(None)
        );
    }

    #[test]
    fn simple_and_trimmed() {
        assert_eq!(
            key("From: a@b\r\nX-Bird-Idempotency-Key:   abc-123 \t\r\n\r\nbody"),
            Ok(Some("abc-123".into()))
        );
        assert_eq!(
            key("X-Bird-Idempotency-Key:abc\r\n\r\n"),
            Ok(Some("abc".into()))
        );
        // Inner whitespace is part of the key.
        assert_eq!(
            key("X-Bird-Idempotency-Key: a  b\r\n\r\n"),
            Ok(Some("a  b".into()))
        );
    }

    #[test]
    fn folded() {
        assert_eq!(
            key("X-Bird-Idempotency-Key: abc\r\n def\r\n\tghi\r\nSubject: x\r\n\r\n"),
            Ok(Some("abc def\tghi".into()))
        );
        // Value starting on the continuation line.
        assert_eq!(
            key("X-Bird-Idempotency-Key:\r\n   abc\r\n\r\n"),
            Ok(Some("abc".into()))
        );
        // LF-only line endings.
        assert_eq!(
            key("X-Bird-Idempotency-Key: abc\n def\n\nX-Bird-Idempotency-Key: zzz\n"),
            Ok(Some("abc def".into()))
        );
    }

    #[test]
    fn case_insensitive_name() {
        assert_eq!(
            key("x-bird-idempotency-key: k1\r\n\r\n"),
            Ok(Some("k1".into()))
        );
        assert_eq!(
            key("X-BIRD-IDEMPOTENCY-KEY : k1\r\n\r\n"),
            Ok(Some("k1".into()))
        );
        // Value is case-sensitive.
        assert_eq!(
            key("X-Bird-Idempotency-Key: K1\r\nx-bird-idempotency-key: k1\r\n\r\n"),
            Err(IdempotencyKeyError::Repeated {
                header: HEADER_NAME.into()
            })
        );
    }

    #[test]
    fn similar_names_ignored() {
        assert_eq!(
            key("X-Bird-Idempotency-Keys: a\r\nX-Bird-Idempotency: b\r\n\r\n"),
            Ok(None)
        );
    }

    #[test]
    fn duplicates() {
        assert_eq!(
            key("X-Bird-Idempotency-Key: k\r\nA: b\r\nX-Bird-Idempotency-Key:  k \r\n\r\n"),
            Ok(Some("k".into()))
        );
        // Same value once folded, once not: equal after unfolding.
        assert_eq!(
            key("X-Bird-Idempotency-Key: a b\r\nX-Bird-Idempotency-Key: a\r\n b\r\n\r\n"),
            Ok(Some("a b".into()))
        );
        assert_eq!(
            key("X-Bird-Idempotency-Key: k\r\nX-Bird-Idempotency-Key: j\r\n\r\n"),
            Err(IdempotencyKeyError::Repeated {
                header: HEADER_NAME.into()
            })
        );
        // Empty occurrences are ignored, not a conflict.
        assert_eq!(
            key("X-Bird-Idempotency-Key:\r\nX-Bird-Idempotency-Key: k\r\n\r\n"),
            Ok(Some("k".into()))
        );
    }

    #[test]
    fn length_counts_chars() {
        let ok = "é".repeat(MAX_KEY_CHARS);
        assert_eq!(
            key(&format!("X-Bird-Idempotency-Key: {ok}\r\n\r\n")),
            Ok(Some(ok.clone()))
        );
        let ok = "日".repeat(MAX_KEY_CHARS);
        assert_eq!(ok.len(), 3 * MAX_KEY_CHARS);
        assert_eq!(
            key(&format!("X-Bird-Idempotency-Key: {ok}\r\n\r\n")),
            Ok(Some(ok.clone()))
        );
        let long = "日".repeat(MAX_KEY_CHARS + 1);
        assert_eq!(
            key(&format!("X-Bird-Idempotency-Key: {long}\r\n\r\n")),
            Err(IdempotencyKeyError::TooLong {
                header: HEADER_NAME.into(),
                chars: 256
            })
        );
        // Surrounding whitespace does not count.
        let ascii = "a".repeat(MAX_KEY_CHARS);
        assert_eq!(
            key(&format!("X-Bird-Idempotency-Key:    {ascii}   \r\n\r\n")),
            Ok(Some(ascii))
        );
    }

    #[test]
    fn not_utf8() {
        assert_eq!(
            extract_key(b"X-Bird-Idempotency-Key: ab\xff\xfe\r\n\r\n"),
            Err(IdempotencyKeyError::NotUtf8 {
                header: HEADER_NAME.into()
            })
        );
        // Invalid bytes in other headers or in the body do not matter.
        assert_eq!(
            extract_key(b"Subject: \xff\r\nX-Bird-Idempotency-Key: k\r\n\r\n\xff"),
            Ok(Some("k".into()))
        );
    }

    #[test]
    fn only_top_level_headers() {
        let msg = "Content-Type: multipart/mixed; boundary=B\r\n\
                   \r\n\
                   --B\r\n\
                   X-Bird-Idempotency-Key: inner\r\n\
                   \r\n\
                   body\r\n\
                   X-Bird-Idempotency-Key: body-line\r\n\
                   --B--\r\n";
        assert_eq!(key(msg), Ok(None));
        assert_eq!(key("A: b\r\n\r\nX-Bird-Idempotency-Key: k\r\n"), Ok(None));
        // Message that is only headers, without a blank line.
        assert_eq!(
            key("A: b\r\nX-Bird-Idempotency-Key: k"),
            Ok(Some("k".into()))
        );
    }

    #[test]
    fn malformed_lines_skipped() {
        assert_eq!(
            key(
                " orphan continuation\r\nno colon here\r\n: empty name\r\nbad name: x\r\nX-Bird-Idempotency-Key: k\r\n\r\n"
            ),
            Ok(Some("k".into()))
        );
    }

    /// Issue 21 item 2: `[idempotency] key_headers` as a team migrating
    /// from JetEmail or EmailEngine would set it.
    fn migrating() -> KeyHeaders {
        KeyHeaders::new([HEADER_NAME, "X-Idempotency-Key", "Idempotency-Key"])
    }

    #[test]
    fn any_listed_name_carries_the_key() {
        let h = migrating();
        let m = |s: &str| h.extract(s.as_bytes());
        assert_eq!(m("X-Idempotency-Key: k1\r\n\r\n"), Ok(Some("k1".into())));
        assert_eq!(m("Idempotency-Key: k2\r\n\r\n"), Ok(Some("k2".into())));
        // Names match case-insensitively.
        assert_eq!(m("x-IDEMPOTENCY-key: k3\r\n\r\n"), Ok(Some("k3".into())));
        // Folded values unfold as under the default name.
        assert_eq!(
            m("Subject: s\r\nIdempotency-Key: abc\r\n def\r\n\r\n"),
            Ok(Some("abc def".into()))
        );
        // Not listed: not a key.
        assert_eq!(m("X-EE-Idempotency-Key: k4\r\n\r\n"), Ok(None));
        // The default list reads X-Bird-Idempotency-Key only.
        assert_eq!(key("X-Idempotency-Key: k1\r\n\r\n"), Ok(None));
        assert_eq!(key("Idempotency-Key: k1\r\n\r\n"), Ok(None));
    }

    #[test]
    fn first_listed_wins_and_the_same_value_agrees() {
        let h = migrating();
        // The same key under several names, in any message order: one key.
        for msg in [
            "Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: k1\r\n\r\n",
            "X-Bird-Idempotency-Key: k1\r\nX-Idempotency-Key:\r\n k1\r\n\r\n",
            // An empty listed header is no key and no conflict.
            "X-Bird-Idempotency-Key:\r\nIdempotency-Key: k1\r\n\r\n",
        ] {
            assert_eq!(h.extract(msg.as_bytes()), Ok(Some("k1".into())), "{msg}");
        }
        // Only the first name listed is a key header here.
        let only = KeyHeaders::new(["Idempotency-Key"]);
        assert_eq!(
            only.extract(b"X-Bird-Idempotency-Key: other\r\nIdempotency-Key: k1\r\n\r\n"),
            Ok(Some("k1".into()))
        );
    }

    #[test]
    fn different_values_under_two_names_are_refused() {
        let h = migrating();
        let err = h
            .extract(b"Idempotency-Key: k2\r\nX-Idempotency-Key: k1\r\n\r\n")
            .unwrap_err();
        // Named in list order, whatever the message order.
        assert_eq!(
            err,
            IdempotencyKeyError::Conflicting {
                first: "X-Idempotency-Key".into(),
                second: "Idempotency-Key".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "X-Idempotency-Key and Idempotency-Key carry different keys"
        );
        assert_eq!(
            h.extract(b"X-Idempotency-Key: a\r\nx-idempotency-key: b\r\n\r\n"),
            Err(IdempotencyKeyError::Repeated {
                header: "X-Idempotency-Key".into()
            })
        );
        // Errors name the header the bad value came under.
        let long = format!("Idempotency-Key: {}\r\n\r\n", "k".repeat(256));
        assert_eq!(
            h.extract(long.as_bytes()).map_err(|e| e.to_string()),
            Err("Idempotency-Key is longer than 255 characters (256)".into())
        );
        assert_eq!(
            h.extract(b"X-Idempotency-Key: \xff\r\n\r\n"),
            Err(IdempotencyKeyError::NotUtf8 {
                header: "X-Idempotency-Key".into()
            })
        );
    }

    #[test]
    fn relay_removes_every_key_header_and_always_ours() {
        let only = KeyHeaders::new(["Idempotency-Key"]);
        assert!(only.is_removed_on_relay(b"idempotency-key"));
        assert!(only.is_removed_on_relay(b"X-BIRD-IDEMPOTENCY-KEY"));
        assert!(!only.is_removed_on_relay(b"X-Idempotency-Key"));
        assert!(!KeyHeaders::default().is_removed_on_relay(b"Idempotency-Key"));
    }

    #[test]
    fn garbage_never_panics() {
        for s in crate::message::headers::tests::GARBAGE {
            let _ = extract_key(s);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = extract_key(&bytes);
        }

        #[test]
        fn header_like_bytes_never_panic(
            lines in proptest::collection::vec("[ \t]?[A-Za-z:-]{0,30}[ \t:]{0,3}[\\x00-\\x7f]{0,20}(\r\n|\n|\r)?", 0..12)
        ) {
            let msg = lines.concat();
            let _ = extract_key(msg.as_bytes());
        }

        #[test]
        fn key_round_trips(
            key in "[!-~]([ -~]{0,40}[!-~])?",
            before in proptest::collection::vec("[A-Z][a-z]{0,8}: [ -~]{0,20}", 0..4),
            after in proptest::collection::vec("[A-Z][a-z]{0,8}: [ -~]{0,20}", 0..4),
        ) {
            let mut msg = String::new();
            for h in &before { msg.push_str(h); msg.push_str("\r\n"); }
            msg.push_str("X-Bird-Idempotency-Key: ");
            msg.push_str(&key);
            msg.push_str("\r\n");
            for h in &after { msg.push_str(h); msg.push_str("\r\n"); }
            msg.push_str("\r\nX-Bird-Idempotency-Key: body\r\n");
            prop_assert_eq!(extract_key(msg.as_bytes()), Ok(Some(key)));
        }
    }
}
