use super::*;
use proptest::prelude::*;

fn ok(text: &str) -> Address {
    Address::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

fn err(text: &str) -> AddressError {
    match Address::parse(text) {
        Ok(a) => panic!("{text:?} should be refused, got {a:?}"),
        Err(e) => e,
    }
}

#[test]
fn mailboxes_keep_their_exact_text() {
    for text in [
        "alice@example.test",
        "Alice.B+tag@Example.TEST",
        "!#$%&'*+-/=?^_`{|}~@x.test",
        "\"ceo@victim.test> ENVID=x\"@example.test",
        "\"a\\\"b\\\\c\"@example.test",
        "\" \"@example.test",
        "\"<>\"@example.test",
        "a@[127.0.0.1]",
        "a@[IPv6:::1]",
        "a@[ipv6:2001:db8::1]",
        "孫子@áéíóú.org",
        "\"孫 子\"@example.test",
        "a@my_host.example.test",
        "a@1.2.3.4",
    ] {
        let a = ok(text);
        assert_eq!(a.as_smtp(), text);
        assert_eq!(a.to_string(), text);
    }
}

#[test]
fn parts() {
    let a = ok("\"ceo@victim.test> ENVID=x\"@Example.test");
    assert_eq!(a.local_part(), "\"ceo@victim.test> ENVID=x\"");
    assert_eq!(a.domain(), "Example.test");
    assert!(a.is_quoted());
    assert_eq!(a.local_value(), "ceo@victim.test> ENVID=x");
    assert_eq!(ok("\"a\\\"b\\\\c\"@d").local_value(), "a\"b\\c");
    assert_eq!(ok("billing@d").local_value(), "billing");
    assert_eq!(ok("a@[127.0.0.1]").domain(), "[127.0.0.1]");
}

#[test]
fn unsafe_or_malformed_addresses_are_refused() {
    use AddressError::*;
    let cases: &[(&str, AddressError)] = &[
        ("", Empty),
        ("\"x\rRSET\"@example.test", Control),
        ("\"x\nRSET\"@example.test", Control),
        ("\"x\0\"@example.test", Control),
        ("\"x\ty\"@example.test", Control),
        ("a\r@example.test", Control),
        ("a\u{85}b@example.test", Control),
        ("a b@example.test", BadLocalPart),
        ("a>b@example.test", BadLocalPart),
        ("a<b@example.test", BadLocalPart),
        ("a\"b@example.test", BadLocalPart),
        ("\"abc@example.test", UnbalancedQuote),
        ("\"abc\\\"@example.test", UnbalancedQuote),
        ("\"abc\"x@example.test", BadLocalPart),
        ("\"\"@example.test", EmptyLocalPart),
        ("@example.test", EmptyLocalPart),
        (".a@example.test", BadLocalPart),
        ("a.@example.test", BadLocalPart),
        ("a..b@example.test", BadLocalPart),
        ("a@@example.test", BadDomain),
        ("a@b@example.test", BadDomain),
        ("alice", NoDomain),
        ("alice@", NoDomain),
        ("a@example..test", BadDomain),
        ("a@example.test.", BadDomain),
        ("a@-example.test", BadDomain),
        ("a@example.test>", BadDomain),
        ("a@exa mple.test", BadDomain),
        ("a@[127.0.0.1", BadLiteral),
        ("a@[300.0.0.1]", BadLiteral),
        ("a@[IPv6:nope]", BadLiteral),
        ("a@[tag:whatever]", BadLiteral),
        ("a@[127.0.0.1]x", BadLiteral),
    ];
    for (text, want) in cases {
        assert_eq!(err(text), *want, "{text:?}");
    }
}

#[test]
fn lengths() {
    let local = "a".repeat(64);
    ok(&format!("{local}@example.test"));
    assert_eq!(
        err(&format!("a{local}@example.test")),
        AddressError::LocalPartTooLong
    );
    // 254 octets between the brackets is the most a path may hold.
    let domain = format!("{}.test", vec!["b".repeat(60); 4].join("."));
    let fits = format!("{}@{}", "a".repeat(254 - 1 - domain.len()), domain);
    assert_eq!(fits.len(), 254);
    ok(&fits);
    assert_eq!(err(&format!("a{fits}")), AddressError::TooLong);
    assert_eq!(
        err(&format!("a@{}.test", "b".repeat(64))),
        AddressError::BadDomain
    );
}

#[test]
fn paths() {
    assert_eq!(ReversePath::parse(""), Ok(ReversePath::Null));
    assert_eq!(ReversePath::Null.as_smtp(), "");
    assert_eq!(
        ReversePath::parse("postmaster"),
        Err(AddressError::PostmasterSender)
    );
    assert_eq!(ForwardPath::parse(""), Err(AddressError::Empty));
    for p in ["postmaster", "Postmaster", "POSTMASTER"] {
        assert_eq!(ForwardPath::parse(p), Ok(ForwardPath::Postmaster(p.into())));
    }
    assert_eq!(
        ForwardPath::parse("postmaster@example.test").map(|p| p.to_string()),
        Ok("postmaster@example.test".into())
    );
    // A source route is accepted and dropped (RFC 5321 4.1.1.3).
    assert_eq!(
        ForwardPath::parse("@a.test,@b.test:user@d.test").map(|p| p.to_string()),
        Ok("user@d.test".into())
    );
    assert_eq!(
        ReversePath::parse("@a.test:\"x y\"@d.test").map(|p| p.to_string()),
        Ok("\"x y\"@d.test".into())
    );
    for bad in ["@a.test", "@a.test,b.test:u@d", "@:u@d", "@a..b:u@d"] {
        assert_eq!(
            ForwardPath::parse(bad),
            Err(AddressError::BadSourceRoute),
            "{bad:?}"
        );
    }
}

#[test]
fn bracketed_paths_end_at_the_unquoted_close() {
    let (inner, rest) =
        split_bracketed(b"<\"ceo@victim.test> ENVID=x\"@example.test> SIZE=10\r\n").unwrap();
    assert_eq!(inner, "\"ceo@victim.test> ENVID=x\"@example.test");
    assert_eq!(rest, b" SIZE=10\r\n");
    let (inner, rest) = split_bracketed(b"<\"a\\\">\"@d>\r\n").unwrap();
    assert_eq!((inner, rest), ("\"a\\\">\"@d", &b"\r\n"[..]));
    assert_eq!(split_bracketed(b"<>\r\n").unwrap(), ("", &b"\r\n"[..]));
    assert_eq!(split_bracketed(b"a@b\r\n"), Err(AddressError::NotBracketed));
    assert_eq!(split_bracketed(b"<a@b\r\n"), Err(AddressError::Unclosed));
    assert_eq!(
        split_bracketed(b"<\"a@b>\r\n"),
        Err(AddressError::UnbalancedQuote)
    );
    assert_eq!(
        split_bracketed(b"<\"x\rRSET\"@d>\r\n"),
        Err(AddressError::Control)
    );
    assert_eq!(split_bracketed(b"<a\0@d>\r\n"), Err(AddressError::Control));
    assert_eq!(split_bracketed(b"<\xff@d>\r\n"), Err(AddressError::NotUtf8));
}

/// Where a quote-aware reader (the next hop) thinks the path ends, and
/// whether anything that could end a command line or start a parameter
/// sits outside quotes.
fn unquoted_hazard(text: &str) -> Option<char> {
    let mut in_quote = false;
    let mut escaped = false;
    for c in text.chars() {
        if matches!(c, '\r' | '\n' | '\0') {
            return Some(c);
        }
        if escaped {
            escaped = false;
        } else if in_quote && c == '\\' {
            escaped = true;
        } else if c == '"' {
            in_quote = !in_quote;
        } else if !in_quote && matches!(c, ' ' | '>' | '<' | '\t') {
            return Some(c);
        }
    }
    in_quote.then_some('"')
}

fn local_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]{1,10}(\\.[a-z0-9]{1,5}){0,2}",
        // Quoted strings over the hazardous characters, escapes included.
        proptest::collection::vec(
            prop_oneof![
                Just("@".to_string()),
                Just(">".to_string()),
                Just("<".to_string()),
                Just(" ".to_string()),
                Just("\\\"".to_string()),
                Just("\\\\".to_string()),
                Just("\"".to_string()),
                Just("\r".to_string()),
                Just("\n".to_string()),
                Just("\\\r".to_string()),
                Just("ENVID=x".to_string()),
                Just("é".to_string()),
                "[ -~]{1,3}",
            ],
            0..8
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat())),
        "[ -~]{0,12}",
    ]
}

fn domain_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]{1,8}(\\.[a-z0-9-]{1,8}){0,3}",
        Just("[127.0.0.1]".to_string()),
        Just("[IPv6:::1]".to_string()),
        "[ -~]{0,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever we accept, we emit unchanged; it parses back to the same
    /// address; and inside `<...>` it never adds a parameter or a line.
    #[test]
    fn accepted_addresses_round_trip_and_never_add_a_parameter(
        local in local_strategy(),
        domain in domain_strategy(),
        params in "( [A-Z]{1,6}=[a-z0-9]{1,4}){0,2}",
    ) {
        let text = format!("{local}@{domain}");
        if let Ok(a) = Address::parse(&text) {
            prop_assert_eq!(a.as_smtp(), text.as_str());
            prop_assert_eq!(Address::parse(a.as_smtp()), Ok(a.clone()));
            prop_assert_eq!(unquoted_hazard(a.as_smtp()), None);
            let line = format!("<{a}>{params}\r\n");
            let (inner, rest) = split_bracketed(line.as_bytes()).expect("own output splits");
            prop_assert_eq!(inner, a.as_smtp());
            let want_rest = format!("{params}\r\n");
            prop_assert_eq!(rest, want_rest.as_bytes());
            for path in [
                ForwardPath::parse(inner).map(|p| p.to_string()),
                ReversePath::parse(inner).map(|p| p.to_string()),
            ] {
                prop_assert_eq!(path, Ok(text.clone()));
            }
        }
    }

    /// Arbitrary input never panics, and anything accepted is safe.
    #[test]
    fn arbitrary_text_is_refused_or_safe(text in "\\PC{0,40}|[\\x00-\\x7f]{0,40}") {
        if let Ok(a) = Address::parse(&text) {
            prop_assert_eq!(a.as_smtp(), text.as_str());
            prop_assert_eq!(unquoted_hazard(&text), None);
        }
        if let Ok((inner, _)) = split_bracketed(text.as_bytes())
            && let Ok(p) = ForwardPath::parse(inner)
        {
            prop_assert_eq!(unquoted_hazard(p.as_smtp()), None);
        }
    }
}
