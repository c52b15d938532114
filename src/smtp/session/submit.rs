//! The hand-off: a complete message and its envelope leave the session as
//! [`Action::Submit`], and the acceptance pipeline's reply comes back
//! through [`Session::submission_done`].

use super::{Action, Session, State};
use crate::smtp::reply::Reply;
use crate::submission::Submission;

impl Session {
    /// The whole message is in (final dot or last chunk) and passed the
    /// content check.
    pub(super) fn message_complete(&mut self) -> Option<Action> {
        self.state = State::Command;
        if self.message.is_empty() {
            tracing::info!(peer = %self.peer, "message rejected: empty");
            self.write(Reply::new(554, "5.6.0", "Message is empty"));
            self.reset_transaction();
            return self.count_junk();
        }
        self.submit()
    }

    fn submit(&mut self) -> Option<Action> {
        let (Some(envelope), Some(submitter)) = (self.envelope.take(), self.submitter()) else {
            return self.bad_sequence("Send MAIL first");
        };
        self.state = State::Waiting;
        Some(Action::Submit(Box::new(Submission {
            submitter,
            helo: self.helo.clone().unwrap_or_default(),
            peer: self.peer,
            tls: self.tls,
            reverse_path: envelope.reverse_path,
            recipients: envelope.recipients,
            // The buffer keeps the bytes reserved until `submission_done`.
            content: self.message.take(),
            options: envelope.options,
        })))
    }

    /// `reply` is the full reply (one or more CRLF-terminated lines) the
    /// acceptance pipeline decided on.
    pub fn submission_done(&mut self, reply: &[u8]) {
        // An accepted message shows a real client: its junk allowance
        // starts again (as Postfix does).
        let accepted = reply.starts_with(b"250");
        if accepted {
            self.junk_commands = 0;
        }
        self.output.extend_from_slice(reply);
        self.reset_transaction();
        self.state = State::Command;
        // A refused message moves no mail forward either: a client must
        // not loop on MAIL, RCPT, DATA for ever (junk_limit_reached closes).
        if !accepted {
            self.junk_limit_reached();
        }
    }
}
