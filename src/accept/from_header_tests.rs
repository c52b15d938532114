use super::*;
use crate::auth::SenderPattern;

fn alice() -> Account {
    Account {
        name: "alice".into(),
        workspace: "acme".into(),
        allowed_senders: Some(vec![
            SenderPattern::parse("*@example.test").expect("pattern"),
        ]),
    }
}

fn check_headers(headers: &str) -> Result<(), FromError> {
    check(
        &alice(),
        format!("{headers}Subject: x\r\n\r\nbody\r\n").as_bytes(),
    )
}

#[test]
fn plain_forms_are_read() {
    for ok in [
        "From: alice@example.test\r\n",
        "From: Alice <alice@example.test>\r\n",
        "From: \"Smith, Alice\" <alice@example.test>\r\n",
        "From: Alice Q. Public <alice@example.test>\r\n",
        "From: alice@example.test (Alice (the (real) one))\r\n",
        "From: =?utf-8?q?Al=C3=AFce?= <alice@example.test>\r\n",
        "From: Alice <alice@example.test>,\r\n\tBob <bob@example.test>\r\n",
        "From:<alice@EXAMPLE.test>\r\n",
        "From : alice@example.test\r\n",
        "FROM: \"a\\\"b\"@example.test\r\n",
        "From: Åsa <åsa@example.test>\r\n",
    ] {
        assert_eq!(check_headers(ok), Ok(()), "{ok:?}");
    }
}

#[test]
fn mailboxes_are_split_exactly() {
    assert_eq!(
        mailboxes(b" \"x, y\" <a@b.test>, c@[127.0.0.1] (z)"),
        Ok(vec!["a@b.test".to_string(), "c@[127.0.0.1]".to_string()])
    );
    assert_eq!(
        mailboxes(b"\"evil@victim.test\"@example.test"),
        Ok(vec!["\"evil@victim.test\"@example.test".to_string()])
    );
}

#[test]
fn the_issue_tricks_are_refused() {
    assert_eq!(
        check_headers("From: evil@victim.test\r\nFrom: a@example.test\r\n"),
        Err(FromError::Repeated(2))
    );
    assert_eq!(
        check_headers("From: evil@victim.test\0a@example.test\r\n"),
        Err(FromError::Malformed("control character"))
    );
    assert!(matches!(
        check_headers("From: evil@victim.test@example.test\r\n"),
        Err(FromError::Malformed(_))
    ));
}

#[test]
fn every_from_like_header_counts() {
    for two in [
        "from: a@example.test\r\nFROM: evil@victim.test\r\n",
        "From: a@example.test\r\nFr om : evil@victim.test\r\n",
        "From: a@example.test\r\n:From: evil@victim.test\r\n",
        "From: a@example.test\r\n\tFrom: continuation is fine\r\nFrom: b@example.test\r\n",
    ] {
        assert_eq!(check_headers(two), Err(FromError::Repeated(2)), "{two:?}");
    }
    // A From: after the header section is body text.
    let body = check(
        &alice(),
        b"From: a@example.test\r\n\r\nFrom: evil@victim.test\r\n",
    );
    assert_eq!(body, Ok(()));
    assert_eq!(
        check(&alice(), b"To: a@example.test\r\n\r\n"),
        Err(FromError::Missing)
    );
}

#[test]
fn malformed_values_are_refused() {
    for bad in [
        "From: Alice\r\n",
        "From: <evil@victim.test>a@example.test\r\n",
        "From: a@example.test\x01\r\n",
        "From: undisclosed:;\r\n",
        "From: a@example.test, \r\n",
        "From: a@@example.test\r\n",
        "From: a..b@example.test\r\n",
        "From: a @ example.test\r\n",
        "From: <@route:a@example.test>\r\n",
        "From: <a@example.test\r\n",
        "From: \"unclosed <a@example.test>\r\n",
        "From: (unclosed <a@example.test>\r\n",
        "From: evil@victim.test <a@example.test>\r\n",
        "From: a@example.test\r\r\n",
    ] {
        assert!(
            matches!(check_headers(bad), Err(FromError::Malformed(_))),
            "{bad:?}: {:?}",
            check_headers(bad)
        );
    }
    assert_eq!(check_headers("From: \r\n"), Err(FromError::NoAddress));
    assert_eq!(
        check_headers("From: (just a comment)\r\n"),
        Err(FromError::NoAddress)
    );
}

#[test]
fn every_mailbox_must_be_allowed() {
    assert_eq!(
        check_headers("From: Alice <alice@example.test>, Mallory <evil@victim.test>\r\n"),
        Err(FromError::NotAllowed("evil@victim.test".into()))
    );
}

#[test]
fn replies_name_the_account_and_the_reason() {
    let sub = Submitter::Account(std::sync::Arc::new(alice()));
    let refusal = rejection(&sub, b"From: a@x.test\r\nFrom: b@x.test\r\n\r\n").expect("refused");
    assert_eq!(refusal.error, FromError::Repeated(2));
    let text = refusal.words();
    assert!(
        text.starts_with("Message has more than one From: header"),
        "{text}"
    );
    assert!(text.contains("account alice"), "{text}");
    // Accounts without allowed_senders are not checked.
    let free = Submitter::Account(std::sync::Arc::new(Account {
        allowed_senders: None,
        ..alice()
    }));
    assert!(rejection(&free, b"From: a@x\r\nFrom: b@y\r\n\r\n").is_none());
}

proptest::proptest! {
    #[test]
    fn any_bytes_are_answered_without_panic(
        value in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::sample::select(b"<>()\"\\@.,:; \tab\x00\x01\xc3".to_vec()),
                proptest::prelude::any::<u8>(),
            ],
            0..40,
        )
    ) {
        let mut m = b"From:".to_vec();
        m.extend(value);
        m.extend_from_slice(b"\r\n\r\n");
        let _ = check(&alice(), &m);
    }
}

#[test]
fn the_signing_domain_is_the_first_mailboxs() {
    let domain =
        |headers: &str| first_domain(format!("{headers}Subject: x\r\n\r\nbody\r\n").as_bytes());
    assert_eq!(
        domain("From: Alice <alice@Mail.Example.test>\r\n"),
        Ok("Mail.Example.test".into())
    );
    assert_eq!(
        domain("From: \"a@b\"@example.test, bob@other.test\r\n"),
        Ok("example.test".into())
    );
    assert_eq!(domain("From: x@[192.0.2.1]\r\n"), Ok("[192.0.2.1]".into()));
    assert_eq!(domain("To: x@example.test\r\n"), Err(FromError::Missing));
    assert_eq!(
        domain("From: a@example.test\r\nFrom: b@example.test\r\n"),
        Err(FromError::Repeated(2))
    );
    assert!(domain("From: undisclosed:;\r\n").is_err());
}
