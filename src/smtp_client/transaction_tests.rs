//! The transaction driven with bytes: what it writes, what it makes of the
//! server's replies, with no socket.

use super::*;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

const PIPELINED: Options = Options {
    pipelining: true,
    all_or_nothing: false,
};
const ONE_BY_ONE: Options = Options {
    pipelining: false,
    all_or_nothing: false,
};

fn commands(txn: &mut Transaction<'_>) -> String {
    match txn.poll() {
        Step::Commands(c) => String::from_utf8(c).expect("ASCII commands"),
        other => panic!("expected commands, got {other:?}"),
    }
}

/// Every block of the message, joined.
fn message(txn: &mut Transaction<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    while let Step::Message(block) = txn.poll() {
        out.extend_from_slice(block);
    }
    out
}

fn finished(txn: &mut Transaction<'_>) -> Finished {
    match txn.poll() {
        Step::Done(f) => f,
        other => panic!("expected the end, got {other:?}"),
    }
}

fn codes(f: &Finished) -> Vec<Option<u16>> {
    f.rcpt_replies
        .iter()
        .map(|r| r.as_ref().map(|r| r.code))
        .collect()
}

#[test]
fn pipelined_group_is_one_write_and_each_recipient_keeps_its_reply() {
    let rcpts = names(&["a@x", "b@x", "c@x"]);
    let mut txn = Transaction::new(
        "s@y",
        " SIZE=12",
        &rcpts,
        Body::Raw(b".hi\r\nthere\r\n"),
        PIPELINED,
    );
    assert_eq!(
        commands(&mut txn),
        "MAIL FROM:<s@y> SIZE=12\r\nRCPT TO:<a@x>\r\nRCPT TO:<b@x>\r\n\
         RCPT TO:<c@x>\r\nDATA\r\n"
    );
    // The replies come in pieces that cut lines and replies in two.
    txn.handle_input(b"250 2.1.0 ok\r\n250 ok\r\n550-5.1.1 no such\r\n55");
    assert!(txn.wants_reply());
    txn.handle_input(b"0 5.1.1 user\r\n250 ok\r\n35");
    txn.handle_input(b"4 go ahead\r\n");
    assert!(!txn.wants_reply());
    assert_eq!(message(&mut txn), b"..hi\r\nthere\r\n.\r\n");
    assert!(matches!(txn.poll(), Step::Await(Stage::FinalReply)));
    txn.handle_input(b"250-2.0.0 Idempotency-Replay: true\r\n");
    txn.handle_input(b"250 2.0.0 Ok: queued as 01AB\r\n");
    let f = finished(&mut txn);
    let Outcome::Sent(r) = &f.outcome else {
        panic!("{:?}", f.outcome)
    };
    assert_eq!(r.code, 250);
    assert_eq!(r.message, "Idempotency-Replay: true\nOk: queued as 01AB");
    assert_eq!(codes(&f), [Some(250), Some(550), Some(250)]);
    assert!(f.accepted(0) && !f.accepted(1) && f.accepted(2));
    assert_eq!(
        f.rcpt_replies[1].as_ref().map(|r| r.message.as_str()),
        Some("no such\nuser")
    );
}

#[test]
fn without_pipelining_each_command_waits_for_its_reply() {
    let rcpts = names(&["a@x", "b@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), ONE_BY_ONE);
    assert_eq!(commands(&mut txn), "MAIL FROM:<s@y>\r\n");
    assert!(txn.wants_reply());
    txn.handle_input(b"250 ok\r\n");
    // The RCPT is not written yet: no reply is owed until it is.
    assert!(!txn.wants_reply());
    assert_eq!(commands(&mut txn), "RCPT TO:<a@x>\r\n");
    assert!(txn.wants_reply());
    txn.handle_input(b"450 4.2.0 later\r\n");
    assert_eq!(commands(&mut txn), "RCPT TO:<b@x>\r\n");
    txn.handle_input(b"250 ok\r\n");
    assert_eq!(commands(&mut txn), "DATA\r\n");
    txn.handle_input(b"354 go\r\n");
    assert_eq!(message(&mut txn), b"m\r\n.\r\n");
    txn.handle_input(b"250 queued\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::Sent(ref r) if r.code == 250));
    assert_eq!(codes(&f), [Some(450), Some(250)]);
}

#[test]
fn all_refused_pipelined_sends_no_message() {
    let rcpts = names(&["a@x", "b@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n550 no\r\n551 no\r\n554 5.5.1 no valid recipients\r\n");
    let f = finished(&mut txn);
    assert!(
        matches!(f.outcome, Outcome::NoRecipients { data: Some(ref r) } if r.code == 554),
        "{:?}",
        f.outcome
    );
    assert_eq!(codes(&f), [Some(550), Some(551)]);
}

#[test]
fn all_refused_pipelined_with_data_opened_anyway_ends_an_empty_message() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"secret\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n550 no\r\n354 go\r\n");
    // A lone dot, never the message.
    assert_eq!(commands(&mut txn), ".\r\n");
    txn.handle_input(b"554 no recipients\r\n");
    let f = finished(&mut txn);
    assert!(matches!(
        f.outcome,
        Outcome::NoRecipients { data: Some(ref r) } if r.code == 354
    ));
}

#[test]
fn all_refused_one_by_one_never_sends_data() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), ONE_BY_ONE);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n");
    assert_eq!(commands(&mut txn), "RCPT TO:<a@x>\r\n");
    txn.handle_input(b"550 5.1.1 no\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::NoRecipients { data: None }));
}

#[test]
fn a_refusal_or_deferral_of_the_final_dot_is_the_outcome() {
    for (reply, code) in [
        (&b"451 4.3.0 try later\r\n"[..], 451),
        (b"554 5.6.0 no\r\n", 554),
    ] {
        let rcpts = names(&["a@x"]);
        let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
        commands(&mut txn);
        txn.handle_input(b"250 ok\r\n250 ok\r\n354 go\r\n");
        message(&mut txn);
        txn.handle_input(reply);
        let f = finished(&mut txn);
        assert!(matches!(f.outcome, Outcome::Sent(ref r) if r.code == code));
        assert!(f.accepted(0));
    }
}

#[test]
fn a_refused_mail_decides_and_the_rest_of_the_group_is_only_read() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"553 5.7.1 not you\r\n");
    assert!(txn.wants_reply(), "RCPT and DATA replies are still owed");
    txn.handle_input(b"503 MAIL first\r\n354 go\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::MailRefused(ref r) if r.code == 553));
    assert_eq!(codes(&f), [None]);
}

#[test]
fn a_421_to_a_recipient_stops_the_transaction() {
    let rcpts = names(&["a@x", "b@x", "c@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n421 4.4.2 bye\r\n250 ok\r\n354 go\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::RcptRefused { index: 1, ref reply } if reply.code == 421));
    assert_eq!(codes(&f), [Some(250), Some(421), None]);
}

#[test]
fn all_or_nothing_stops_at_the_first_refusal() {
    let rcpts = names(&["a@x", "b@x"]);
    let options = Options {
        pipelining: false,
        all_or_nothing: true,
    };
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), options);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n");
    assert_eq!(commands(&mut txn), "RCPT TO:<a@x>\r\n");
    txn.handle_input(b"550 5.1.1 no\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::RcptRefused { index: 0, ref reply } if reply.code == 550));
    assert_eq!(codes(&f), [Some(550), None]);
}

#[test]
fn a_refused_data_is_the_outcome() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n451 4.3.0 not now\r\n");
    let f = finished(&mut txn);
    assert!(matches!(f.outcome, Outcome::DataRefused(ref r) if r.code == 451));
}

#[test]
fn a_hang_up_is_placed_at_the_first_reply_missing() {
    let rcpts = names(&["a@x", "b@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n550 no\r\n");
    txn.handle_error(ClientError::NoReply);
    let f = finished(&mut txn);
    assert!(
        matches!(
            f.outcome,
            Outcome::Lost {
                stage: Stage::Rcpt(1),
                ..
            }
        ),
        "{:?}",
        f.outcome
    );
    assert_eq!(codes(&f), [Some(550), None]);
}

#[test]
fn garbage_in_a_reply_loses_the_connection() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), ONE_BY_ONE);
    commands(&mut txn);
    txn.handle_input(b"hello there\r\n");
    let f = finished(&mut txn);
    assert!(matches!(
        f.outcome,
        Outcome::Lost {
            stage: Stage::Mail,
            error: ClientError::NoReply
        }
    ));
}

#[test]
fn a_failure_writing_the_last_block_is_a_failed_transfer_not_a_missing_reply() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n354 go\r\n");
    assert!(matches!(txn.poll(), Step::Message(b"m\r\n.\r\n")));
    txn.handle_error(ClientError::Timeout);
    let f = finished(&mut txn);
    assert!(matches!(
        f.outcome,
        Outcome::Lost {
            stage: Stage::Message,
            error: ClientError::Timeout
        }
    ));
}

#[test]
fn no_reply_to_the_final_dot_is_lost_after_the_message() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n354 go\r\n");
    message(&mut txn);
    txn.handle_error(ClientError::Timeout);
    let f = finished(&mut txn);
    assert!(matches!(
        f.outcome,
        Outcome::Lost {
            stage: Stage::FinalReply,
            ..
        }
    ));
}

#[test]
fn a_large_message_goes_in_blocks_and_a_stuffed_one_as_it_is() {
    let content = vec![b'a'; MESSAGE_BLOCK * 2 + 10];
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(&content), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n354 go\r\n");
    let mut sizes = Vec::new();
    while let Step::Message(block) = txn.poll() {
        sizes.push(block.len());
    }
    assert_eq!(sizes, [MESSAGE_BLOCK, MESSAGE_BLOCK, 10 + 5]);

    let stuffed = b"..x\r\n.\r\n";
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Stuffed(stuffed), PIPELINED);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 ok\r\n354 go\r\n");
    assert_eq!(message(&mut txn), stuffed);
}

#[test]
fn bytes_past_the_replies_owed_are_dropped() {
    let rcpts = names(&["a@x"]);
    let mut txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), ONE_BY_ONE);
    commands(&mut txn);
    txn.handle_input(b"250 ok\r\n250 stray\r\n");
    assert_eq!(commands(&mut txn), "RCPT TO:<a@x>\r\n");
    txn.handle_input(b"550 no\r\n");
    let f = finished(&mut txn);
    assert_eq!(codes(&f), [Some(550)]);
}
