//! The session state machine, driven with bytes and no sockets.

use std::sync::Arc;

use super::session::{Action, Session, SessionConfig};
use crate::auth::{Account, AuthOutcome};
use crate::budget::InFlightBudget;

fn config() -> Arc<SessionConfig> {
    Arc::new(SessionConfig {
        hostname: "relay.test".into(),
        max_message_size: 1000,
        max_recipients: 2,
        max_bad_commands: 3,
        allow_plaintext_auth: false,
        starttls_offered: true,
        max_junk_commands: 100,
        budget: InFlightBudget::unlimited(),
    })
}

fn session(trusted: bool) -> Session {
    session_with(config(), trusted)
}

fn session_with(config: Arc<SessionConfig>, trusted: bool) -> Session {
    let mut s = Session::new(
        config,
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

// Issue 21 item 1: the null reverse-path (a bounce from a Postfix in front)
// is accepted from an authenticated account whose `allowed_senders` do not
// say `*`, and from a trusted network; never before authentication.
#[test]
fn null_reverse_path_needs_auth_or_trust_and_nothing_more() {
    let mut s = session(false);
    let (out, _) = feed(&mut s, b"EHLO me\r\nMAIL FROM:<>\r\n");
    assert_eq!(codes(&out), ["250", "530"]);

    feed(&mut s, b"STARTTLS\r\n");
    s.tls_started();
    let (_, action) = feed(&mut s, b"EHLO me\r\nAUTH PLAIN AGFsaWNlAHB3\r\n");
    assert!(matches!(action, Action::Authenticate { .. }));
    s.auth_result(AuthOutcome::Success(account()));
    let (out, _) = feed(&mut s, b"MAIL FROM:<>\r\nRCPT TO:<c@d.test>\r\n");
    assert_eq!(codes(&out), ["235", "250", "250"], "{out}");
    // Another sender outside the account's patterns is still refused.
    let (out, _) = feed(&mut s, b"RSET\r\nMAIL FROM:<eve@other.test>\r\n");
    assert_eq!(codes(&out), ["250", "553"], "{out}");

    let mut trusted = session(true);
    let (out, _) = feed(&mut trusted, b"EHLO me\r\nMAIL FROM:<>\r\n");
    assert_eq!(codes(&out), ["250", "250"], "{out}");
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
        b"MAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nBDAT 3\r\nab\rBDAT 3 LAST\r\n\ncd",
    );
    assert_eq!(codes(&out), ["250", "250", "250"]);
    let Action::Submit(sub) = action else {
        panic!("expected Submit, got {action:?}");
    };
    assert_eq!(sub.content, b"ab\r\ncd", "a CRLF may span two chunks");
    s.submission_done(b"250 ok\r\n");
    let (out, _) = feed(&mut s, b"");
    assert!(out.starts_with("250 ok"));
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
fn help_vrfy_and_unimplemented() {
    let mut s = session(true);
    let (out, _) = feed(&mut s, b"HELP\r\nVRFY bob\r\nEXPN list\r\n");
    assert_eq!(codes(&out), ["214", "252", "502"]);
}

const OPEN: &[u8] = b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\n";

/// A session in the transaction state, ready for DATA or BDAT.
fn open_transaction(config: Arc<SessionConfig>) -> Session {
    let mut s = session_with(config, true);
    let (out, _) = feed(&mut s, OPEN);
    assert_eq!(codes(&out), ["250", "250", "250"]);
    s
}

#[test]
fn smuggled_transaction_after_dot_cr_cr_lf_is_never_run() {
    for end in [&b".\r\r\n"[..], b".\n", b"\n.\r\n", b"\r.\r\n"] {
        let mut s = open_transaction(config());
        let mut input = b"DATA\r\nSubject: x\r\n\r\nline\r\n".to_vec();
        input.extend_from_slice(end);
        input.extend_from_slice(
            b"MAIL FROM:<evil@x.test>\r\nRCPT TO:<v@y.test>\r\nDATA\r\nSmuggled\r\n.\r\nNOOP\r\n",
        );
        let (out, action) = feed(&mut s, &input);
        assert!(
            matches!(action, Action::Close),
            "{end:?}: expected Close, got {action:?}"
        );
        assert_eq!(codes(&out), ["354", "554"], "{end:?}: {out}");
        assert!(out.contains("554 5.6.0"), "{out}");
        assert!(s.is_closed());
    }
}

#[test]
fn a_refused_message_that_ends_in_doubt_still_closes() {
    // Too big, so swallowed unstored; its end is `.\r\r\n` all the same.
    let mut s = open_transaction(config());
    let mut input = b"DATA\r\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 2000));
    input.extend_from_slice(b"\r\n");
    let (out, _) = feed(&mut s, &input);
    assert_eq!(codes(&out), ["354"], "{out}");
    let (out, action) = feed(&mut s, b".\r\r\nMAIL FROM:<evil@x.test>\r\n");
    assert_eq!(codes(&out), ["552"], "{out}");
    assert!(matches!(action, Action::Close), "{action:?}");
    // A NUL first, then a bare line ending: the worse one decides.
    let mut s = open_transaction(config());
    let (out, action) = feed(
        &mut s,
        b"DATA\r\na\0b\r\n.\r\r\nMAIL FROM:<evil@x.test>\r\n",
    );
    assert_eq!(codes(&out), ["354", "554"], "{out}");
    assert!(out.contains("bare CR or LF"), "{out}");
    assert!(matches!(action, Action::Close), "{action:?}");
}

#[test]
fn bare_cr_or_lf_in_bdat_is_refused_and_closes() {
    for chunk in [&b"a\r.\r\n"[..], b"a\n", b"a\rb\r\n", b"ab\r"] {
        let mut s = open_transaction(config());
        let mut input = format!("BDAT {} LAST\r\n", chunk.len()).into_bytes();
        input.extend_from_slice(chunk);
        input.extend_from_slice(b"NOOP\r\n");
        let (out, action) = feed(&mut s, &input);
        assert!(matches!(action, Action::Close), "{chunk:?}: {action:?}");
        assert_eq!(codes(&out), ["554"], "{chunk:?}: {out}");
    }
    // In a chunk that is not the last, refused once the chunk is read.
    let mut s = open_transaction(config());
    let (out, action) = feed(&mut s, b"BDAT 4\r\na\nbc");
    assert!(matches!(action, Action::Close), "{action:?}");
    assert_eq!(codes(&out), ["554"]);
}

#[test]
fn nul_in_content_is_refused_and_the_session_goes_on() {
    let mut s = open_transaction(config());
    let (out, action) = feed(&mut s, b"DATA\r\nSubject: x\r\n\r\na\0b\r\n.\r\nNOOP\r\n");
    assert!(matches!(action, Action::NeedInput), "{action:?}");
    assert_eq!(codes(&out), ["354", "554", "250"], "{out}");
    assert!(
        out.contains("554 5.6.0 Message contains a NUL byte"),
        "{out}"
    );
    // BDAT: the chunk with the NUL fails the transaction.
    let mut s = open_transaction(config());
    let (out, _) = feed(&mut s, b"BDAT 3\r\na\0bBDAT 2 LAST\r\n\r\nRSET\r\n");
    assert_eq!(codes(&out), ["554", "503", "250"], "{out}");
}

#[test]
fn empty_messages_are_refused() {
    let mut s = open_transaction(config());
    let (out, action) = feed(&mut s, b"BDAT 0 LAST\r\n");
    assert!(matches!(action, Action::NeedInput), "{action:?}");
    assert!(out.starts_with("554 5.6.0 Message is empty"), "{out}");
    // The transaction is over: a new one can start at once.
    let (out, _) = feed(&mut s, OPEN);
    assert_eq!(codes(&out), ["250", "250", "250"]);
    let (out, _) = feed(&mut s, b"DATA\r\n.\r\n");
    assert_eq!(codes(&out), ["354", "554"]);
    // BDAT 0 LAST after real chunks ends a normal message.
    let (_, action) = feed(&mut s, OPEN);
    assert!(matches!(action, Action::NeedInput));
    let (_, action) = feed(&mut s, b"BDAT 3\r\nx\r\nBDAT 0 LAST\r\n");
    let Action::Submit(sub) = action else {
        panic!("expected Submit, got {action:?}");
    };
    assert_eq!(sub.content, b"x\r\n");
}

#[test]
fn binarymime_is_refused_other_bodies_are_accepted() {
    let mut s = session(true);
    let (out, _) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test> BODY=BINARYMIME\r\nMAIL FROM:<a@b.test> BODY=8BITMIME\r\nRSET\r\nMAIL FROM:<a@b.test> BODY=7BIT\r\n",
    );
    assert_eq!(codes(&out), ["250", "555", "250", "250", "250"], "{out}");
    assert!(out.contains("555 5.5.4 BODY=BINARYMIME not supported"));
}

fn junk_config(max: u32) -> Arc<SessionConfig> {
    let mut c = (*config()).clone();
    c.max_junk_commands = max;
    Arc::new(c)
}

#[test]
fn junk_commands_are_limited() {
    let mut s = session_with(junk_config(5), true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nNOOP\r\nRSET\r\nVRFY x\r\nHELP\r\nNOOP\r\nNOOP\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "250", "250", "252", "214", "421"],
        "{out}"
    );
    assert!(out.ends_with("421 4.7.0 Too many commands, closing connection\r\n"));
    assert!(matches!(action, Action::Close));
}

#[test]
fn looping_on_refused_or_repeated_mail_and_rcpt_counts_as_junk() {
    let mut s = session_with(junk_config(3), true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nRCPT TO:<c@d.test>\r\nRCPT TO:<c@d.test>\r\nRCPT TO:<c@d.test>\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "250", "250", "250", "250", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));

    let mut s = session_with(junk_config(2), true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test> SIZE=999999999999\r\nMAIL FROM:<a@b.test> SIZE=999999999999\r\n",
    );
    assert_eq!(codes(&out), ["250", "552", "552", "421"], "{out}");
    assert!(matches!(action, Action::Close));
}

#[test]
fn empty_bdat_chunks_count_as_junk() {
    let mut s = session_with(junk_config(3), true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nBDAT 0\r\nBDAT 0\r\nBDAT 0\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "250", "250", "250", "250", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));
}

#[test]
fn an_accepted_message_resets_the_junk_count() {
    let mut s = session_with(junk_config(3), true);
    let (_, action) = feed(
        &mut s,
        b"EHLO me\r\nNOOP\r\nNOOP\r\nMAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\nDATA\r\nx\r\n.\r\n",
    );
    assert!(matches!(action, Action::Submit(_)));
    s.submission_done(b"250 2.0.0 Ok: queued as X\r\n");
    let (out, action) = feed(&mut s, b"NOOP\r\nNOOP\r\nNOOP\r\n");
    assert_eq!(codes(&out), ["250", "250", "250", "250"], "{out}");
    assert!(matches!(action, Action::NeedInput));
    // A refused message does not.
    let (_, action) = feed(&mut s, &OPEN[9..]);
    assert!(matches!(action, Action::NeedInput));
    let (_, action) = feed(&mut s, b"DATA\r\nx\r\n.\r\n");
    assert!(matches!(action, Action::Submit(_)));
    s.submission_done(b"554 5.6.0 no\r\n");
    let (out, action) = feed(&mut s, b"NOOP\r\n");
    assert_eq!(codes(&out), ["554", "421"], "{out}");
    assert!(matches!(action, Action::Close));
}

fn budget_config(budget: Arc<InFlightBudget>) -> Arc<SessionConfig> {
    let mut c = (*config()).clone();
    c.max_message_size = 26_214_400;
    c.budget = budget;
    Arc::new(c)
}

#[test]
fn bdat_memory_grows_with_bytes_received_not_announced() {
    let budget = InFlightBudget::unlimited();
    let mut s = open_transaction(budget_config(budget.clone()));
    feed(&mut s, b"BDAT 26214000\r\n");
    let (out, action) = feed(&mut s, &[b'x'; 1000]);
    assert!(out.is_empty() && matches!(action, Action::NeedInput));
    assert!(
        budget.in_use() <= 64 * 1024,
        "reserved {} for 1000 bytes",
        budget.in_use()
    );
    drop(s);
    assert_eq!(budget.in_use(), 0, "a dropped session returns its bytes");
}

#[test]
fn over_budget_message_gets_452_at_its_end_and_the_session_goes_on() {
    let budget = InFlightBudget::new(200_000, usize::MAX);
    let mut s = open_transaction(budget_config(budget.clone()));
    feed(&mut s, b"DATA\r\n");
    let line = [&[b'y'; 998][..], b"\r\n"].concat();
    for _ in 0..300 {
        let (out, action) = feed(&mut s, &line);
        assert!(
            out.is_empty() && matches!(action, Action::NeedInput),
            "{out}"
        );
    }
    assert_eq!(budget.in_use(), 0, "the refused message holds nothing");
    let (out, action) = feed(&mut s, b".\r\nNOOP\r\n");
    assert_eq!(codes(&out), ["452", "250"], "{out}");
    assert!(out.starts_with("452 4.3.1 Insufficient system storage"));
    assert!(matches!(action, Action::NeedInput));
    // A message that fits still goes through, and holds its bytes until the
    // acceptance pipeline is done with it.
    feed(&mut s, &OPEN[9..]);
    let (_, action) = feed(&mut s, b"DATA\r\nsmall\r\n.\r\n");
    assert!(matches!(action, Action::Submit(_)));
    assert!(budget.in_use() > 0);
    s.submission_done(b"250 2.0.0 Ok: queued as X\r\n");
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn over_budget_bdat_chunk_gets_452_and_fails_the_transaction() {
    let budget = InFlightBudget::new(100_000, usize::MAX);
    let mut s = open_transaction(budget_config(budget.clone()));
    let mut input = b"BDAT 150000\r\n".to_vec();
    input.extend(std::iter::repeat_n(b'z', 150_000));
    input.extend_from_slice(b"BDAT 1 LAST\r\nzRSET\r\n");
    let (out, _) = feed(&mut s, &input);
    assert_eq!(codes(&out), ["452", "503", "250"], "{out}");
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn per_account_budget_counts_an_accounts_sessions_together() {
    let budget = InFlightBudget::new(usize::MAX, 100_000);
    let config = budget_config(budget.clone());
    let login = |s: &mut Session| {
        feed(s, b"STARTTLS\r\n");
        s.tls_started();
        let (_, action) = feed(s, b"EHLO me\r\nAUTH PLAIN AGFsaWNlAHB3\r\n");
        assert!(matches!(action, Action::Authenticate { .. }));
        s.auth_result(AuthOutcome::Success(account()));
        feed(
            s,
            b"MAIL FROM:<alice@example.test>\r\nRCPT TO:<c@d.test>\r\nBDAT 60000\r\n",
        )
    };
    let mut first = session_with(config.clone(), false);
    login(&mut first);
    let (out, _) = feed(&mut first, &[b'a'; 60_000]);
    assert!(out.contains("250 2.0.0 60000 octets received"), "{out}");
    let mut second = session_with(config.clone(), false);
    login(&mut second);
    let (out, _) = feed(&mut second, &[b'a'; 60_000]);
    assert!(out.starts_with("452 4.3.1"), "{out}");
    // A trusted-network session is not this account's.
    let mut trusted = open_transaction(config);
    let (out, _) = feed(
        &mut trusted,
        &[&b"BDAT 60000\r\n"[..], &[b'a'; 60_000]].concat(),
    );
    assert!(out.contains("60000 octets received"), "{out}");
    let alice = budget.account_in_use("alice");
    assert!(alice >= 60_000, "{alice}");
    assert!(budget.in_use() >= alice + 60_000, "trusted counts globally");
    drop((first, second, trusted));
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn a_stuffed_dot_on_the_first_line_is_unstuffed() {
    let mut s = open_transaction(config());
    let (_, action) = feed(&mut s, b"DATA\r\n..x\r\n.\r\n");
    let Action::Submit(sub) = action else {
        panic!("expected Submit, got {action:?}");
    };
    assert_eq!(sub.content, b".x\r\n");
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

#[test]
fn data_or_bdat_out_of_sequence_counts_as_a_bad_command() {
    // max_bad_commands is 3: the fourth refusal closes, whichever command.
    let mut s = session(true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nMAIL FROM:<a@b.test>\r\nDATA\r\nDATA\r\nDATA\r\nDATA\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "250", "554", "554", "554", "554", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));

    let mut s = session(true);
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nBDAT 1 LAST\r\nxBDAT 0 LAST\r\nBDAT 0 LAST\r\nBDAT 0 LAST\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "503", "503", "503", "503", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));
}

#[test]
fn looping_on_refused_messages_counts_as_junk() {
    const TX: &[u8] = b"MAIL FROM:<a@b.test>\r\nRCPT TO:<c@d.test>\r\n";
    // EHLO is the first junk command; each refused message one more.
    let mut s = session_with(junk_config(2), true);
    let mut input = b"EHLO me\r\n".to_vec();
    for _ in 0..2 {
        input.extend_from_slice(TX);
        input.extend_from_slice(b"DATA\r\n.\r\n");
    }
    let (out, action) = feed(&mut s, &input);
    assert_eq!(
        codes(&out),
        [
            "250", "250", "250", "354", "554", "250", "250", "354", "554", "421"
        ],
        "{out}"
    );
    assert!(matches!(action, Action::Close));

    let mut s = session_with(junk_config(2), true);
    let mut input = b"EHLO me\r\n".to_vec();
    for _ in 0..2 {
        input.extend_from_slice(TX);
        input.extend_from_slice(b"BDAT 3 LAST\r\na\0b");
    }
    let (out, action) = feed(&mut s, &input);
    assert_eq!(
        codes(&out),
        ["250", "250", "250", "554", "250", "250", "554", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));

    // Refused by the acceptance pipeline.
    let mut s = session_with(junk_config(2), true);
    let (_, _) = feed(&mut s, b"EHLO me\r\n");
    for round in 0..2 {
        let mut input = TX.to_vec();
        input.extend_from_slice(b"DATA\r\nx\r\n.\r\n");
        let (_, action) = feed(&mut s, &input);
        assert!(matches!(action, Action::Submit(_)), "{action:?}");
        s.submission_done(b"554 5.6.0 E01001 ValidationError: no\r\n");
        let (out, action) = feed(&mut s, b"");
        if round == 0 {
            assert_eq!(codes(&out), ["554"], "{out}");
            assert!(matches!(action, Action::NeedInput));
        } else {
            assert_eq!(codes(&out), ["554", "421"], "{out}");
            assert!(matches!(action, Action::Close));
        }
    }
}

#[test]
fn looping_on_cancelled_auth_counts_as_junk() {
    let mut s = session_with(junk_config(3), false);
    feed(&mut s, b"STARTTLS\r\n");
    s.tls_started();
    // EHLO is the first junk command; each cancelled AUTH one more.
    let (out, action) = feed(
        &mut s,
        b"EHLO me\r\nAUTH LOGIN\r\n*\r\nAUTH PLAIN\r\n*\r\nAUTH LOGIN\r\n*\r\n",
    );
    assert_eq!(
        codes(&out),
        ["250", "334", "501", "334", "501", "334", "501", "421"],
        "{out}"
    );
    assert!(matches!(action, Action::Close));
}

#[test]
fn looping_on_starttls_where_it_is_not_offered_counts_as_junk() {
    let mut c = (*junk_config(2)).clone();
    c.starttls_offered = false;
    let mut s = session_with(Arc::new(c), true);
    let (out, action) = feed(&mut s, b"EHLO me\r\nSTARTTLS\r\nSTARTTLS\r\n");
    assert_eq!(codes(&out), ["250", "454", "454", "421"], "{out}");
    assert!(matches!(action, Action::Close));
}

#[test]
fn looping_on_a_temporarily_refused_auth_counts_as_junk() {
    for outcome in [AuthOutcome::AccountLocked, AuthOutcome::TemporaryFailure] {
        let mut s = session_with(junk_config(2), false);
        feed(&mut s, b"STARTTLS\r\n");
        s.tls_started();
        let (_, _) = feed(&mut s, b"EHLO me\r\n");
        for round in 0..2 {
            let (_, action) = feed(&mut s, b"AUTH PLAIN AGJvYgBwdw==\r\n");
            assert!(matches!(action, Action::Authenticate { .. }), "{action:?}");
            s.auth_result(outcome.clone());
            let (out, action) = feed(&mut s, b"");
            if round == 0 {
                assert_eq!(codes(&out), ["454"], "{out}");
                assert!(matches!(action, Action::NeedInput));
            } else {
                assert_eq!(codes(&out), ["454", "421"], "{out}");
                assert!(matches!(action, Action::Close));
            }
        }
    }
}

#[test]
fn a_malformed_bdat_closes_so_its_chunk_never_runs_as_commands() {
    // The chunk's length can't be read, so neither can its end: what
    // follows is the client's message, never commands.
    for bdat in [
        &b"BDAT 18446744073709551616 LAST\r\n"[..],
        b"BDAT 10 LAS\r\n",
        b"BDAT x\r\n",
    ] {
        let mut s = open_transaction(config());
        let mut input = bdat.to_vec();
        input.extend_from_slice(b"RSET\r\nMAIL FROM:<a@b.test>\r\n");
        let (out, action) = feed(&mut s, &input);
        assert_eq!(codes(&out), ["501"], "{out}");
        assert!(matches!(action, Action::Close), "{action:?}");
    }
}
