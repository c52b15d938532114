use super::*;
use mail_parser::{Message, PartType};
use proptest::prelude::*;

fn shape(m: &[u8]) -> MimeShape {
    check(m, &MimeLimits::default())
        .expect("within the limits")
        .shape()
}

fn limits(max_depth: usize, max_parts: usize) -> MimeLimits {
    MimeLimits {
        max_depth,
        max_parts,
    }
}

/// mail-parser's own view: (parts in all messages, deepest container).
fn parsed_shape(m: &[u8]) -> (usize, usize) {
    fn walk(msg: &Message<'_>, id: usize, parts: &mut usize) -> usize {
        let Some(part) = msg.parts.get(id) else {
            return 0;
        };
        match &part.body {
            PartType::Multipart(children) => {
                1 + children
                    .iter()
                    .map(|&c| walk(msg, c as usize, parts))
                    .max()
                    .unwrap_or(0)
            }
            PartType::Message(inner) => {
                *parts += inner.parts.len();
                1 + walk(inner, 0, parts)
            }
            _ => 0,
        }
    }
    let Some(msg) = MessageParser::default().parse(m) else {
        return (0, 0);
    };
    let mut parts = msg.parts.len();
    let depth = walk(&msg, 0, &mut parts);
    (parts, depth)
}

fn multipart(boundary: &str, parts: &[&str]) -> String {
    let mut m = format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\r\n\r\n");
    for p in parts {
        m.push_str(&format!("--{boundary}\r\n{p}\r\n"));
    }
    m.push_str(&format!("--{boundary}--\r\n"));
    m
}

fn nested_rfc822(levels: usize) -> Vec<u8> {
    let mut m = b"Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\n".to_vec();
    for _ in 0..levels {
        m.extend_from_slice(b"Content-Type: message/rfc822\r\n\r\n");
    }
    m.extend_from_slice(b"\r\n--B--\r\n");
    m
}

const TEXT: &str = "Content-Type: text/plain\r\n\r\nhello";
const MSG: &str = "Content-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\ninner body";

#[test]
fn plain_message_has_no_depth() {
    assert_eq!(
        shape(b"Subject: x\r\n\r\nbody\r\n--B\r\n"),
        MimeShape { depth: 0, parts: 1 }
    );
}

#[test]
fn flat_and_nested_shapes_match_mail_parser() {
    let flat = multipart("B", &[TEXT, TEXT, TEXT]);
    assert_eq!(shape(flat.as_bytes()), MimeShape { depth: 1, parts: 4 });
    let inner = format!(
        "Content-Type: multipart/alternative; boundary=C\r\n\r\n--C\r\n{TEXT}\r\n--C\r\n{TEXT}\r\n--C--"
    );
    let nested = multipart("B", &[&inner, MSG, TEXT]);
    let s = shape(nested.as_bytes());
    assert_eq!(s, MimeShape { depth: 2, parts: 7 });
    assert_eq!(parsed_shape(nested.as_bytes()), (s.parts, s.depth));
}

#[test]
fn the_issue_reproduction_is_refused_early() {
    let m = nested_rfc822(33_000);
    assert_eq!(
        check(&m, &MimeLimits::default()).map(|w| w.shape()),
        Err(MimeLimitError::TooDeep(100))
    );
    // Exactly at the limit passes, one more level does not.
    let at = nested_rfc822(99);
    assert_eq!(shape(&at).depth, 100);
    // mail-parser loses a level on the way out of this malformed nesting.
    assert!(parsed_shape(&at).1 <= 100);
    assert!(check(&nested_rfc822(100), &MimeLimits::default()).is_err());
}

#[test]
fn nested_multiparts_count_as_depth() {
    let mut m = String::new();
    for i in 0..150 {
        m.push_str(&format!(
            "Content-Type: multipart/mixed; boundary=b{i}\r\n\r\n--b{i}\r\n"
        ));
    }
    m.push_str("\r\nleaf\r\n");
    for i in (0..150).rev() {
        m.push_str(&format!("--b{i}--\r\n"));
    }
    assert_eq!(
        check(m.as_bytes(), &limits(149, 10_000)).map(|w| w.shape()),
        Err(MimeLimitError::TooDeep(149))
    );
    assert_eq!(shape_with(m.as_bytes(), limits(150, 10_000)).depth, 150);
}

fn shape_with(m: &[u8], l: MimeLimits) -> MimeShape {
    check(m, &l).expect("within").shape()
}

#[test]
fn too_many_parts_is_refused_after_the_limit() {
    let parts = vec!["\r\nx"; 20_001];
    let m = multipart("B", &parts);
    assert_eq!(
        check(m.as_bytes(), &MimeLimits::default()).map(|w| w.shape()),
        Err(MimeLimitError::TooManyParts(10_000))
    );
    let ok = multipart("B", &parts[..9_999]);
    assert_eq!(shape(ok.as_bytes()).parts, 10_000);
}

#[test]
fn digest_parts_without_content_type_are_messages() {
    let m = "Content-Type: multipart/digest; boundary=D\r\n\r\n--D\r\n\r\n\
             Content-Type: message/rfc822\r\n\r\nSubject: x\r\n\r\nbody\r\n--D--\r\n";
    let s = shape(m.as_bytes());
    assert_eq!((s.parts, s.depth), parsed_shape(m.as_bytes()));
    assert_eq!(s.depth, 3);
}

#[test]
fn encoded_messages_are_looked_into() {
    use base64::Engine;
    let inner = nested_rfc822(150);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&inner);
    let m = format!(
        "Content-Type: multipart/mixed; boundary=E\r\n\r\n--E\r\n\
         Content-Type: message/rfc822\r\nContent-Transfer-Encoding: base64\r\n\r\n\
         {encoded}\r\n--E--\r\n"
    );
    assert_eq!(
        check(m.as_bytes(), &MimeLimits::default()).map(|w| w.shape()),
        Err(MimeLimitError::TooDeep(100))
    );
    let small = format!(
        "Content-Type: multipart/mixed; boundary=E\r\n\r\n--E\r\n\
         Content-Type: message/rfc822\r\nContent-Transfer-Encoding: base64\r\n\r\n\
         {}\r\n--E--\r\n",
        base64::engine::general_purpose::STANDARD.encode(nested_rfc822(3))
    );
    let s = shape(small.as_bytes());
    let (parts, depth) = parsed_shape(small.as_bytes());
    assert!(
        s.parts >= parts && s.depth >= depth,
        "{s:?} {parts} {depth}"
    );
    assert_eq!(s.depth, 6);
}

#[test]
fn long_boundaries_and_missing_boundaries_are_refused() {
    let long = "x".repeat(MAX_BOUNDARY_LEN + 1);
    let m = multipart(&long, &[TEXT]);
    assert_eq!(
        check(m.as_bytes(), &MimeLimits::default()).map(|w| w.shape()),
        Err(MimeLimitError::BoundaryTooLong)
    );
    // Thousands of multiparts whose boundary never occurs, then a long tail:
    // each one would send mail-parser to the end of the message and back.
    let mut m = String::from("Content-Type: multipart/mixed; boundary=B\r\n\r\n");
    for _ in 0..2_000 {
        m.push_str("--B\r\nContent-Type: multipart/mixed; boundary=nowhere\r\n\r\nx\r\n");
    }
    m.push_str("--B\r\n\r\n");
    m.push_str(&"y".repeat(100_000));
    m.push_str("\r\n--B--\r\n");
    assert_eq!(
        check(m.as_bytes(), &MimeLimits::default()).map(|w| w.shape()),
        Err(MimeLimitError::TooCostly)
    );
    // One such multipart in a normal message is fine.
    let one = multipart(
        "B",
        &[
            "Content-Type: multipart/mixed; boundary=nowhere\r\n\r\nx",
            TEXT,
        ],
    );
    assert_eq!(shape(one.as_bytes()).parts, 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the bytes, the walk never counts fewer parts or less depth
    /// than mail-parser builds: the limits hold for the real parse.
    #[test]
    fn never_below_mail_parser(
        tail in proptest::collection::vec(
            prop_oneof![
                Just(b"--B".to_vec()), Just(b"--B--".to_vec()), Just(b"\r\n".to_vec()),
                Just(b"\n".to_vec()), Just(b" ".to_vec()),
                Just(b"Content-Type: multipart/mixed; boundary=C\r\n".to_vec()),
                Just(b"Content-Type: multipart/digest; boundary=D\r\n".to_vec()),
                Just(b"Content-Type: message/rfc822\r\n".to_vec()),
                Just(b"Content-Transfer-Encoding: base64\r\n".to_vec()),
                Just(b"Content-Transfer-Encoding: quoted-printable\r\n".to_vec()),
                Just(b"--C".to_vec()), Just(b"--D".to_vec()), Just(b"--C--".to_vec()),
                Just(b"Q29udGVudC1UeXBlOiBtZXNzYWdlL3JmYzgyMg0KDQo=".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..8),
            ],
            0..60,
        )
    ) {
        let mut m = b"Content-Type: multipart/mixed; boundary=B\r\n\r\n".to_vec();
        m.extend(tail.concat());
        let ours = check(&m, &limits(10_000, 100_000)).expect("small input").shape();
        let (parts, depth) = parsed_shape(&m);
        prop_assert!(ours.parts >= parts, "parts {} < {} in {:?}", ours.parts, parts, String::from_utf8_lossy(&m));
        prop_assert!(ours.depth >= depth, "depth {} < {} in {:?}", ours.depth, depth, String::from_utf8_lossy(&m));
    }
}
