//! MAIL, RCPT and RSET: the envelope of a transaction. MAIL checks who may
//! send (an authenticated account or a trusted network) and as whom; RCPT
//! collects recipients up to the limit.

use super::{Action, Envelope, Session};
use crate::auth::Submitter;
use crate::smtp::params::{self, Extension};
use crate::smtp::path_command::{self, CommandError};
use crate::smtp::reply::Reply;
use crate::submission::MailOptions;

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
        if let Some((param, ext)) = params::first_refused(&from.params, self.tls) {
            return self.refuse_param(param, ext);
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
            options: MailOptions {
                require_tls: from.require_tls,
            },
        });
        self.ok("2.1.0", "Ok")
    }

    pub(super) fn rcpt(&mut self, line: &[u8]) -> Option<Action> {
        let to = match path_command::parse_rcpt(line) {
            Ok(to) => match params::first_refused(&to.params, self.tls) {
                Some((param, ext)) => return self.refuse_param(param, ext),
                None => to.path,
            },
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

    /// A parameter of an extension this session does not offer (RFC 5321
    /// 4.1.1.11): the command is refused, the transaction goes on as if
    /// it had not been sent.
    fn refuse_param(&mut self, param: &str, ext: Extension) -> Option<Action> {
        let why = if ext == Extension::RequireTls {
            format!(
                "{param} not supported: {} is offered only after STARTTLS",
                ext.keyword()
            )
        } else {
            format!("{param} not supported: {} is not offered", ext.keyword())
        };
        tracing::info!(peer = %self.peer, %param, "refused: parameter of an extension not offered");
        self.write(Reply::new(555, "5.5.4", &why));
        self.count_bad_command()
    }

    pub(super) fn reset_transaction(&mut self) {
        self.envelope = None;
        self.message.clear();
        self.bdat_failed = false;
    }
}
