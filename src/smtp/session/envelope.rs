//! MAIL, RCPT and RSET: the envelope of a transaction. MAIL checks who may
//! send (an authenticated account or a trusted network) and as whom; RCPT
//! collects recipients up to the limit.

use super::{Action, Envelope, Session};
use crate::auth::Submitter;
use crate::smtp::path_command::{self, CommandError};
use crate::smtp::reply::Reply;

impl Session {
    pub(super) fn submitter(&self) -> Option<Submitter> {
        match (&self.account, &self.trusted_workspace) {
            (Some(account), _) => Some(Submitter::Account(account.clone())),
            (None, Some(workspace)) => Some(Submitter::TrustedNetwork {
                workspace: workspace.clone(),
            }),
            (None, None) => None,
        }
    }

    pub(super) fn mail(&mut self, line: &[u8]) -> Option<Action> {
        let from = match path_command::parse_mail(line) {
            Ok(from) => from,
            Err(CommandError::Syntax(e)) => return self.parse_error(e),
            Err(CommandError::Path { error, text }) => {
                tracing::info!(peer = %self.peer, path = ?text, reason = %error, "MAIL refused: bad sender address");
                let text = format!("Bad sender address syntax: {error}");
                self.write(Reply::new(501, "5.1.7", &text));
                return self.count_bad_command();
            }
        };
        if from.binarymime {
            return self.refuse_binarymime();
        }
        if self.helo.is_none() {
            return self.bad_sequence("Send EHLO first");
        }
        if self.envelope.is_some() {
            return self.bad_sequence("Sender already given");
        }
        let Some(submitter) = self.submitter() else {
            tracing::info!(peer = %self.peer, "MAIL refused: not authenticated");
            self.write(Reply::new(530, "5.7.0", "Authentication required"));
            return self.count_bad_command();
        };
        if from.size > self.config.max_message_size {
            self.write(self.too_big_reply());
            return self.count_junk();
        }
        if !submitter.may_send_as_path(&from.path) {
            tracing::info!(
                peer = %self.peer,
                account = submitter.name(),
                sender = ?from.path.as_smtp(),
                "MAIL refused: sender not allowed for account"
            );
            let text = format!(
                "Sender <{}> not allowed for account {}",
                from.path,
                submitter.name()
            );
            self.write(Reply::new(553, "5.7.1", &text));
            return self.count_junk();
        }
        self.envelope = Some(Envelope {
            reverse_path: from.path.as_smtp().to_owned(),
            recipients: Vec::new(),
        });
        self.ok("2.1.0", "Ok")
    }

    pub(super) fn rcpt(&mut self, line: &[u8]) -> Option<Action> {
        let to = match path_command::parse_rcpt(line) {
            Ok(to) => to.path,
            Err(CommandError::Syntax(e)) => return self.parse_error(e),
            Err(CommandError::Path { error, text }) => {
                tracing::info!(peer = %self.peer, path = ?text, reason = %error, "RCPT refused: bad recipient address");
                let text = format!("Bad recipient address syntax: {error}");
                self.write(Reply::new(501, "5.1.3", &text));
                return self.count_bad_command();
            }
        };
        let max = self.config.max_recipients;
        let Some(envelope) = self.envelope.as_mut() else {
            return self.bad_sequence("Send MAIL first");
        };
        if envelope.recipients.iter().any(|r| r == to.as_smtp()) {
            if self.junk_limit_reached() {
                return Some(Action::Close);
            }
            return self.ok("2.1.5", "Ok (duplicate recipient)");
        }
        if envelope.recipients.len() >= max {
            tracing::info!(peer = %self.peer, max, "RCPT refused: too many recipients");
            self.write(Reply::new(452, "4.5.3", "Too many recipients"));
            return self.count_junk();
        }
        envelope.recipients.push(to.as_smtp().to_owned());
        self.ok("2.1.5", "Ok")
    }

    /// RFC 3030 BINARYMIME is not offered in EHLO: content must be lines.
    fn refuse_binarymime(&mut self) -> Option<Action> {
        // count_bad_command logs the reply.
        self.write(Reply::new(555, "5.5.4", "BODY=BINARYMIME not supported"));
        self.count_bad_command()
    }

    pub(super) fn reset_transaction(&mut self) {
        self.envelope = None;
        self.message.clear();
        self.bdat_failed = false;
    }
}
