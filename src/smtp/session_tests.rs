//! The session state machine, driven with bytes and no sockets.

use std::sync::Arc;

use super::session::{Action, Session, SessionConfig, find_bare_cr_or_lf};
use crate::auth::{Account, AuthOutcome};

fn config() -> Arc<SessionConfig> {
    Arc::new(SessionConfig {
        hostname: "relay.test".into(),
        max_message_size: 1000,
        max_recipients: 2,
        max_bad_commands: 3,
        allow_plaintext_auth: false,
        starttls_offered: true,
    })
}

fn session(trusted: bool) -> Session {
    let mut s = Session::new(
        config(),
        "127.0.0.1:5000".parse().expect("addr"),
        trusted.then(|| "local".to_string()),
        false,
    );
    s.greet();
    s.take_output();
    s
}

/// Feeds bytes, runs until the session wants input or an action.
fn feed(s: &mut Session, bytes: &[u8]) -> (String, Action) {
    s.input().extend_from_slice(bytes);
    let action = s.advance();
    (
        String::from_utf8_lossy(&s.take_output()).into_owned(),
        action,
    )
}

fn codes(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.as_bytes().get(3) == Some(&b' '))
        .map(|l| &l[..3])
        .collect()
}

fn account() -> Arc<Account> {
    Arc::new(Account {
        name: "alice".into(),
        workspace: "acme".into(),
        allowed_senders: Some(vec![
            crate::auth::SenderPattern::parse("*@example.test").expect("pattern"),
        ]),
    })
}

#[test]
fn greeting_and_ehlo_capabilities() {
    let mut s = Session::new(config(), "127.0.0.1:1".parse().expect("a"), None, false);
    s.greet();
    assert!(String::from_utf8_lossy(&s.take_output()).starts_with("220 relay.test ESMTP"));
    let (out, action) = feed(&mut s, b"EHLO me\r\n");
    assert!(matches!(action, Action::NeedInput));
    assert!(out.lines().any(|l| &l[4..] == "STARTTLS"), "{out}");
    assert!(out.contains("SIZE 1000"));
    assert!(!out.contains("AUTH"), "no AUTH offered in plaintext: {out}");
}

#[test]
fn pipelined_transaction_yields_one_submission() {
    let mut s = session(true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nRCPT TO:<e@f.test>\r\nDATA\r\nSubject: x\r\n\r\n..dot\r\n.\r\nNOOP\r\n",
    );
    assert_eq!(codes(&out), ["250", "250", "250", "250", "354"]);
    let Action::Submit(sub) = action else {
        panic!("expected Submit, got {action:?}");
    };
    assert_eq!(sub.reverse_path, "a@b.test");
    assert_eq!(sub.recipients, ["c@d.test", "e@f.test"]);
    assert_eq!(sub.content, b"Subject: x\r\n\r\n.dot\r\n", "dot-unstuffed");
    assert_eq!(sub.submitter.workspace(), "local");
    // The pipelined NOOP is answered after the submission's reply.
    s.submission_done(b"250 2.0.0 Ok: queued as X\r\n");
    let (out, action) = feed(&mut s, b"");
    assert!(matches!(action, Action::NeedInput));
    assert_eq!(codes(&out), ["250", "250"]);
    assert!(out.starts_with("250 2.0.0 Ok: queued as X\r\n"));
}

#[test]
fn message_split_across_reads() {
    let mut s = session(true);
    feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nDATA\r\n",
    );
    for chunk in [&b"Subject: x\r\n\r\nbo"[..], b"dy\r", b"\n.", b"\r"] {
        let (_, action) = feed(&mut s, chunk);
        assert!(matches!(action, Action::NeedInput));
    }
    let (_, action) = feed(&mut s, b"\n");
    let Action::Submit(sub) = action else {
        panic!("expected Submit");
    };
    assert_eq!(sub.content, b"Subject: x\r\n\r\nbody\r\n");
}

#[test]
fn mail_requires_auth_or_trusted_network() {
    let mut s = session(false);
    let (out, _) = feed(&mut s, b"EHLO me\r\nMAIL FROM:<a@b.test>\r\n");
    assert_eq!(codes(&out), ["250", "530"]);
}

#[test]
fn mail_requires_helo() {
    let mut s = session(true);
    let (out, _) = feed(&mut s, b"MAIL FROM:<a@b.test>\r\n");
    assert_eq!(codes(&out), ["503"]);
}

#[test]
fn auth_needs_tls_then_works_after_starttls() {
    let mut s = session(false);
    let (out, _) = feed(&mut s, b"EHLO me\r\nAUTH PLAIN AGFsaWNlAHB3\r\n");
    assert_eq!(codes(&out), ["250", "538"]);
    // Plaintext pipelined after STARTTLS is discarded, never executed.
    let (out, action) = feed(&mut s, b"STARTTLS\r\nMAIL FROM:<injected@x>\r\n");
    assert_eq!(codes(&out), ["220"]);
    assert!(matches!(action, Action::StartTls));
    s.tls_started();
    let (out, action) = feed(&mut s, b"");
    assert!(out.is_empty(), "injected command was answered: {out}");
    assert!(matches!(action, Action::NeedInput));
    let (out, _) = feed(&mut s, b"EHLO me\r\n");
    assert!(out.contains("AUTH PLAIN LOGIN") && !out.contains("STARTTLS"));
    let (_, action) = feed(&mut s, b"AUTH PLAIN AGFsaWNlAHB3\r\n");
    let Action::Authenticate { username, password } = action else {
        panic!("expected Authenticate");
    };
    assert_eq!((username.as_str(), password.as_str()), ("alice", "pw"));
    s.auth_result(AuthOutcome::Success(account()));
    let (out, _) = feed(
        &mut s,
        b"MAIL FROM:<alice@example.test>\r\nRSET\r\nMAIL FROM:<x@evil.test>\r\n",
    );
    assert_eq!(codes(&out), ["235", "250", "250", "553"]);
}

#[test]
fn auth_login_exchange_and_cancel() {
    let mut s = session(false);
    feed(&mut s, b"STARTTLS\r\n");
    s.tls_started();
    let (out, _) = feed(&mut s, b"EHLO me\r\nAUTH LOGIN\r\n");
    assert!(out.ends_with("334 VXNlcm5hbWU6\r\n"));
    let (out, _) = feed(&mut s, b"*\r\n");
    assert_eq!(codes(&out), ["501"]);
    feed(&mut s, b"AUTH LOGIN\r\n");
    let (out, _) = feed(&mut s, b"Ym9i\r\n");
    assert!(out.starts_with("334 UGFzc3dvcmQ6"));
    let (_, action) = feed(&mut s, b"cHc=\r\n");
    assert!(
        matches!(action, Action::Authenticate { ref username, ref password } if username == "bob" && password == "pw")
    );
    s.auth_result(AuthOutcome::Invalid);
    assert_eq!(codes(&String::from_utf8_lossy(&s.take_output())), ["535"]);
}

#[test]
fn limits_have_clear_replies() {
    let mut s = session(true);
    let long = format!("NOOP {}\r\n", "x".repeat(600));
    let (out, _) = feed(&mut s, long.as_bytes());
    assert!(out.starts_with("500 5.5.2"), "{out}");
    let (out, _) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test> SIZE=5000\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<1@x.test>\r\nRCPT TO:<2@x.test>\r\nRCPT TO:<3@x.test>\r\n",
    );
    assert_eq!(codes(&out), ["250", "552", "250", "250", "250", "452"]);
}

#[test]
fn endless_line_is_not_buffered() {
    let mut s = session(true);
    for _ in 0..10 {
        feed(&mut s, &[b'a'; 4096]);
    }
    assert!(s.input().len() < 20_000, "buffered {}", s.input().len());
    let (out, _) = feed(&mut s, b"\r\nNOOP\r\n");
    assert_eq!(codes(&out), ["500", "250"]);
}

#[test]
fn oversized_data_is_discarded_then_rejected() {
    let mut s = session(true);
    feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nDATA\r\n",
    );
    let line = [b'x'; 98];
    for _ in 0..30 {
        let mut chunk = line.to_vec();
        chunk.extend_from_slice(b"\r\n");
        let (out, action) = feed(&mut s, &chunk);
        assert!(out.is_empty() && matches!(action, Action::NeedInput));
    }
    let (out, action) = feed(&mut s, b".\r\n");
    assert!(out.starts_with("552 5.3.4"), "{out}");
    assert!(matches!(action, Action::NeedInput));
}

#[test]
fn bdat_chunks_collect_and_bad_bdat_is_consumed() {
    let mut s = session(true);
    let (out, _) = feed(&mut s, b"EHLO me\r\nBDAT 4\r\nabcdNOOP\r\n");
    assert_eq!(codes(&out), ["250", "503", "250"]);
    let (out, action) = feed(
        &mut s,
        b"MAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nBDAT 4\r\nab\r\nBDAT 2 LAST\r\n\ncd",
    );
    assert_eq!(codes(&out), ["250", "250", "250"]);
    let Action::Submit(sub) = action else {
        panic!("expected Submit, got {action:?}");
    };
    assert_eq!(sub.content, b"ab\r\n\nc");
    s.submission_done(b"250 ok\r\n");
    let (out, _) = feed(&mut s, b"");
    assert!(out.starts_with("250 ok"));
    // The trailing "d" plus more is now a command line.
}

#[test]
fn bdat_over_size_limit_fails_the_transaction() {
    let mut s = session(true);
    let (out, _) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nBDAT 2000\r\n",
    );
    assert_eq!(codes(&out), ["250", "250", "250"]);
    let (out, _) = feed(&mut s, &[b'z'; 2000]);
    assert!(out.starts_with("552"), "{out}");
    let (out, _) = feed(&mut s, b"BDAT 1 LAST\r\nzRSET\r\n");
    assert_eq!(codes(&out), ["503", "250"]);
}

#[test]
fn too_many_bad_commands_closes() {
    let mut s = session(true);
    let (out, action) = feed(&mut s, b"X\r\nY\r\nZ\r\nW\r\nNOOP\r\n");
    assert_eq!(codes(&out), ["500", "500", "500", "500", "421"]);
    assert!(matches!(action, Action::Close));
}

#[test]
fn quit_and_timeout() {
    let mut s = session(true);
    let (out, action) = feed(&mut s, b"QUIT\r\nNOOP\r\n");
    assert_eq!(codes(&out), ["221"]);
    assert!(matches!(action, Action::Close));
    let mut s = session(true);
    s.timed_out();
    assert!(String::from_utf8_lossy(&s.take_output()).starts_with("421 4.4.2"));
    assert!(s.is_closed());
}

#[test]
fn bare_line_endings_are_found() {
    assert_eq!(find_bare_cr_or_lf(b"a\r\nb\r\n"), None);
    assert_eq!(find_bare_cr_or_lf(b"a\nb"), Some(1));
    assert_eq!(find_bare_cr_or_lf(b"a\rb"), Some(1));
    assert_eq!(find_bare_cr_or_lf(b"a\r\r\n"), Some(1));
    assert_eq!(find_bare_cr_or_lf(b"abc\r"), Some(3));
}

#[test]
fn help_vrfy_and_unimplemented() {
    let mut s = session(true);
    let (out, _) = feed(&mut s, b"HELP\r\nVRFY bob\r\nEXPN list\r\n");
    assert_eq!(codes(&out), ["214", "252", "502"]);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Runs a whole input through a session, split at `cuts`, answering every
    /// action the way the driver would; returns the output and submissions.
    fn run(input: &[u8], cuts: &[usize]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut s = session(true);
        let mut out = Vec::new();
        let mut subs = Vec::new();
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        bounds.push(input.len());
        bounds.sort_unstable();
        let mut start = 0;
        for end in bounds {
            s.input().extend_from_slice(&input[start..end]);
            start = end;
            loop {
                match s.advance() {
                    Action::NeedInput => break,
                    Action::Close => {
                        out.extend(s.take_output());
                        return (out, subs);
                    }
                    Action::Submit(sub) => {
                        subs.push(sub.content);
                        s.submission_done(b"250 2.0.0 Ok: queued as X\r\n");
                    }
                    Action::StartTls => s.tls_started(),
                    Action::Authenticate { .. } => s.auth_result(AuthOutcome::Invalid),
                }
            }
            out.extend(s.take_output());
        }
        (out, subs)
    }

    fn replies_are_well_formed(out: &[u8]) -> bool {
        out.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .all(|l| {
                l.len() >= 5
                    && l[..3].iter().all(u8::is_ascii_digit)
                    && (l[3] == b' ' || l[3] == b'-')
                    && l.ends_with(b"\r")
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes in arbitrary chunks never panic, and every byte
        /// the server sends is a well-formed reply line.
        #[test]
        fn arbitrary_input_never_panics(
            input in proptest::collection::vec(any::<u8>(), 0..2048),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let (out, _) = run(&input, &cuts);
            prop_assert!(replies_are_well_formed(&out), "{}", String::from_utf8_lossy(&out));
        }

        /// Command-shaped noise (the bytes the parser branches on) too.
        #[test]
        fn command_noise_never_panics(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(&b"EHLO x\r\n"[..]), Just(&b"MAIL FROM:<a@b.test>\r\n"[..]),
                    Just(&b"RCPT TO:<c@d.test>\r\n"[..]), Just(&b"DATA\r\n"[..]),
                    Just(&b"BDAT 3\r\n"[..]), Just(&b"BDAT 2 LAST\r\n"[..]),
                    Just(&b".\r\n"[..]), Just(&b"\r\n"[..]), Just(&b"\n"[..]),
                    Just(&b"AUTH LOGIN\r\n"[..]), Just(&b"RSET\r\n"[..]),
                    Just(&b"STARTTLS\r\n"[..]), Just(&b"x"[..]), Just(&b"\r"[..]),
                ],
                0..40,
            ),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let input: Vec<u8> = parts.concat();
            let (out, _) = run(&input, &cuts);
            prop_assert!(replies_are_well_formed(&out), "{}", String::from_utf8_lossy(&out));
        }

        /// How the network splits a pipelined session never changes what
        /// the server answers or what it accepts.
        #[test]
        fn chunking_does_not_change_the_outcome(
            body in "[a-z .]{0,200}",
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let message = format!("Subject: p\r\n\r\n{}\r\n", body.replace(' ', "\r\n"));
            let stuffed = message.replace("\r\n.", "\r\n..");
            let input = format!(
                "EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nDATA\r\n{stuffed}.\r\nNOOP\r\nQUIT\r\n"
            );
            let whole = run(input.as_bytes(), &[]);
            let split = run(input.as_bytes(), &cuts);
            prop_assert_eq!(&whole, &split);
            prop_assert_eq!(whole.1.len(), 1);
            prop_assert_eq!(&whole.1[0], &message.into_bytes());
        }
    }
}
