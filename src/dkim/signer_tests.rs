use super::*;
use crate::dkim::key;
use crate::dkim::keygen::{self, Algorithm};

fn ed25519() -> SigningKey {
    let new = keygen::generate(Algorithm::Ed25519).expect("key");
    key::from_pem(new.pem.as_bytes()).expect("loads")
}

fn entry(domain: &str, selector: &str, workspaces: &[&str]) -> DomainSigner {
    let workspaces: Vec<String> = workspaces.iter().map(|w| (*w).to_owned()).collect();
    DomainSigner::new(domain, selector, ed25519(), None, &workspaces)
}

/// The `h=` names of a `DKIM-Signature:` header, lowercased.
fn h_tag(header: &str) -> Vec<String> {
    let unfolded: String = header
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n' | '\t' | ' '))
        .collect();
    let h = unfolded
        .split(';')
        .find_map(|tag| tag.strip_prefix("h="))
        .expect("h= tag");
    h.split(':').map(str::to_ascii_lowercase).collect()
}

const MESSAGE: &[u8] = b"From: a@example.test\r\nTo: b@example.net\r\nSubject: hi\r\n\
X-Bird-Idempotency-Key: k1\r\nReceived: from x by y; date\r\n\r\nbody\r\n";

#[test]
fn from_is_oversigned_and_per_hop_headers_are_not_signed() {
    let header = entry("example.test", "s1", &[])
        .sign(MESSAGE)
        .expect("signed");
    assert!(
        header.starts_with(
            "DKIM-Signature: v=1; a=ed25519-sha256; s=s1; d=example.test; c=relaxed/relaxed;"
        ),
        "{header}"
    );
    assert!(header.ends_with(";\r\n"), "{header:?}");
    let h = h_tag(&header);
    assert_eq!(h.iter().filter(|n| *n == "from").count(), 2, "{h:?}");
    for own in ["x-bird-idempotency-key", "received", "dkim-signature"] {
        assert!(!h.contains(&own.to_owned()), "{own} in {h:?}");
    }
    for present in ["to", "subject"] {
        assert!(
            h.contains(&present.to_owned()),
            "{present} missing from {h:?}"
        );
    }

    // Two From: headers are both signed, and one more besides.
    let two = [b"From: c@example.test\r\n".as_slice(), MESSAGE].concat();
    let h = h_tag(&entry("example.test", "s1", &[]).sign(&two).expect("signed"));
    assert_eq!(h.iter().filter(|n| *n == "from").count(), 3, "{h:?}");
}

#[test]
fn a_header_list_without_from_still_signs_it() {
    let list = vec!["Subject".to_owned(), "subject".to_owned()];
    let s = DomainSigner::new("example.test", "s1", ed25519(), Some(&list), &[]);
    let h = h_tag(&s.sign(MESSAGE).expect("signed"));
    assert_eq!(h, ["subject", "from", "from"]);
}

#[test]
fn the_from_domain_picks_the_nearest_level_with_keys() {
    let signers = Signers::new(vec![
        entry("example.test", "rsa", &[]),
        entry("example.test", "ed", &[]),
        entry("mail.example.test", "m", &["acme"]),
        entry("test", "tld", &[]),
    ]);
    let labels = |domain: &str, ws: &str| -> Vec<String> {
        signers
            .for_message(domain, ws)
            .iter()
            .map(|s| s.label())
            .collect()
    };
    assert_eq!(
        labels("example.test", "w"),
        ["example.test/rsa", "example.test/ed"]
    );
    assert_eq!(
        labels("EXAMPLE.Test.", "w"),
        ["example.test/rsa", "example.test/ed"]
    );
    assert_eq!(
        labels("a.b.example.test", "w"),
        ["example.test/rsa", "example.test/ed"]
    );
    assert_eq!(labels("mail.example.test", "acme"), ["mail.example.test/m"]);
    // Another workspace skips the filtered entry and goes on to the parent.
    assert_eq!(
        labels("x.mail.example.test", "globex"),
        ["example.test/rsa", "example.test/ed"]
    );
    // Never down to a one-label name, and never to a sibling.
    assert!(labels("other.test", "w").is_empty());
    assert_eq!(
        labels("test", "w"),
        ["test/tld"],
        "an exact match is still one"
    );
    assert!(labels("example.net", "w").is_empty());
    assert!(labels("", "w").is_empty());
}

/// Issue 20 finding 7: a bound key never signs another workspace's mail,
/// even when that workspace's account may use any `From:`.
#[test]
fn a_bound_key_signs_only_for_its_workspaces() {
    let signers = Signers::new(vec![
        entry("a.test", "s", &["wa"]),
        entry("b.test", "s", &["wa", "wb"]),
    ]);
    let labels = |domain: &str, ws: &str| -> Vec<String> {
        signers
            .for_message(domain, ws)
            .iter()
            .map(|s| s.label())
            .collect()
    };
    assert_eq!(labels("a.test", "wa"), ["a.test/s"]);
    assert!(labels("a.test", "wc").is_empty());
    assert!(labels("x.a.test", "wb").is_empty());
    assert_eq!(labels("b.test", "wa"), ["b.test/s"]);
    assert_eq!(labels("b.test", "wb"), ["b.test/s"]);
    assert!(labels("b.test", "wc").is_empty());
}

#[test]
fn dual_signing_writes_one_header_per_key() {
    let (a, b) = (
        entry("example.test", "a", &[]),
        entry("example.test", "b", &[]),
    );
    let both = sign_all(&[&a, &b], MESSAGE).expect("signed");
    assert_eq!(both.matches("DKIM-Signature: ").count(), 2, "{both}");
    assert!(both.contains("s=a;") && both.contains("s=b;"), "{both}");
}

#[test]
fn names_are_checked() {
    assert_eq!(check_domain("Example.TEST"), Ok("example.test".into()));
    for bad in [
        "",
        "example.test.",
        "-x.test",
        "a..b",
        "a_b.test",
        "é.test",
        &"a".repeat(64),
    ] {
        assert!(check_domain(bad).is_err(), "{bad:?}");
    }
    assert!(check_selector("s2026.eu").is_ok());
    for bad in ["", "a b", "a_b", "x."] {
        assert!(check_selector(bad).is_err(), "{bad:?}");
    }
    assert!(check_header("List-Id").is_ok());
    for bad in [
        "x-bird-idempotency-key",
        "Received",
        "DKIM-Signature",
        "return-path",
    ] {
        let e = check_header(bad).unwrap_err();
        assert!(e.contains("cannot be signed"), "{e}");
    }
    assert!(check_header("Bad Name").is_err());
    assert!(check_header("").is_err());
}
