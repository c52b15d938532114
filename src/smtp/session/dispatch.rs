//! The input loop: each step either feeds the bytes of a message body to
//! `intake` or takes one line, checks its length and hands it to its verb's
//! handler (or to the SASL exchange under way). The verbs with nothing to
//! remember (NOOP, HELP, VRFY, QUIT) are answered here, and so are parse
//! errors.

use std::borrow::Cow;

use smtp_proto::{Error as ParseError, Request};

use super::{Action, MAX_AUTH_LINE, MAX_COMMAND_LINE, Session, State};
use crate::smtp::path_command::{self, Verb};
use crate::smtp::reply::Reply;

impl Session {
    /// Processes buffered input until it is drained or an action is needed.
    pub fn advance(&mut self) -> Action {
        let action = loop {
            if let Some(action) = self.step() {
                break action;
            }
        };
        if matches!(action, Action::NeedInput) {
            // Compact once per read rather than once per command.
            self.input.drain(..self.consumed);
            self.consumed = 0;
        }
        action
    }

    /// One unit of work; `None` means "call again".
    fn step(&mut self) -> Option<Action> {
        match std::mem::replace(&mut self.state, State::Command) {
            State::Closed => {
                self.state = State::Closed;
                Some(Action::Close)
            }
            State::Waiting => {
                self.state = State::Waiting;
                Some(Action::NeedInput)
            }
            State::Data { receiver } => self.data_bytes(receiver),
            State::DataDiscard { receiver, refusal } => self.data_discard_bytes(receiver, refusal),
            State::Bdat { left, is_last } => self.bdat_bytes(left, is_last),
            State::BdatDiscard { left, refusal } => self.bdat_discard_bytes(left, refusal),
            state @ (State::Command
            | State::SaslPlain
            | State::SaslLoginUser
            | State::SaslLoginPassword { .. }) => {
                self.state = state;
                self.next_line()
            }
        }
    }

    /// Takes one line from the input and handles it.
    fn next_line(&mut self) -> Option<Action> {
        let pending = &self.input[self.consumed..];
        let Some(newline) = pending.iter().position(|&b| b == b'\n') else {
            if pending.len() > MAX_AUTH_LINE {
                // Don't hold an endless line in memory; skip to its end.
                self.consumed = self.input.len();
                self.skipping_long_line = true;
            }
            return Some(Action::NeedInput);
        };
        let start = self.consumed;
        let end = start + newline + 1;
        self.consumed = end;
        if std::mem::take(&mut self.skipping_long_line) {
            return self.line_too_long();
        }
        // Borrow the line from the buffer without copying it: the buffer is
        // moved out while the line is handled, then put back.
        let input = std::mem::take(&mut self.input);
        let line = &input[start..end];
        let limit = if matches!(self.state, State::Command) && !starts_with_auth(line) {
            MAX_COMMAND_LINE
        } else {
            MAX_AUTH_LINE
        };
        let action = if line.len() > limit {
            self.line_too_long()
        } else {
            match std::mem::replace(&mut self.state, State::Command) {
                State::SaslPlain => self.sasl_plain(trim_crlf(line)),
                State::SaslLoginUser => self.sasl_login_user(trim_crlf(line)),
                State::SaslLoginPassword { username } => {
                    self.sasl_login_password(username, trim_crlf(line))
                }
                _ => self.command(line),
            }
        };
        self.input = input;
        if std::mem::take(&mut self.discard_input) {
            self.input.clear();
            self.consumed = 0;
        }
        action
    }

    fn command(&mut self, line: &[u8]) -> Option<Action> {
        // MAIL and RCPT paths are read byte-exact by `path_command`, never
        // by smtp-proto's parser, which unquotes local parts.
        match path_command::verb(line) {
            Some(Verb::Mail) => return self.mail(line),
            Some(Verb::Rcpt) => return self.rcpt(line),
            None => {}
        }
        let request = match Request::parse(&mut line.iter()) {
            Ok(r) => r,
            Err(e) if is_bdat(line) => return self.malformed_bdat(e),
            Err(e) => return self.parse_error(e),
        };
        if is_junk(&request) && self.junk_limit_reached() {
            return Some(Action::Close);
        }
        match request {
            Request::Ehlo { host } => self.ehlo(host, true),
            Request::Helo { host } => self.ehlo(host, false),
            Request::Mail { .. } => self.mail(line),
            Request::Rcpt { .. } => self.rcpt(line),
            Request::Data => self.data(),
            Request::Bdat {
                chunk_size,
                is_last,
            } => self.bdat(chunk_size, is_last),
            Request::Rset => {
                self.reset_transaction();
                self.ok("2.0.0", "Ok")
            }
            Request::Noop { .. } => self.ok("2.0.0", "Ok"),
            Request::Quit => {
                self.write(Reply::new(221, "2.0.0", "Bye"));
                self.state = State::Closed;
                Some(Action::Close)
            }
            Request::Help { .. } => {
                self.write(Reply::new(
                    214,
                    "2.0.0",
                    "Commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP QUIT HELP VRFY STARTTLS AUTH",
                ));
                None
            }
            Request::Vrfy { .. } => {
                self.write(Reply::new(
                    252,
                    "2.5.0",
                    "Cannot VRFY user, but will accept message and attempt delivery",
                ));
                None
            }
            Request::StartTls => self.starttls(),
            Request::Auth {
                mechanism,
                initial_response,
            } => self.auth(mechanism, initial_response),
            Request::Expn { .. }
            | Request::Etrn { .. }
            | Request::Atrn { .. }
            | Request::Burl { .. }
            | Request::Lhlo { .. } => {
                self.write(Reply::new(502, "5.5.1", "Command not implemented"));
                self.count_bad_command()
            }
        }
    }

    pub(super) fn parse_error(&mut self, error: ParseError) -> Option<Action> {
        let reply = match error {
            ParseError::UnknownCommand => Reply::new(500, "5.5.1", "Unknown command"),
            ParseError::InvalidSenderAddress => Reply::new(501, "5.1.7", "Invalid sender address"),
            ParseError::InvalidRecipientAddress => {
                Reply::new(501, "5.1.3", "Invalid recipient address")
            }
            ParseError::SyntaxError { syntax } => {
                Reply::new(501, "5.5.4", &format!("Syntax: {syntax}"))
            }
            ParseError::InvalidParameter { param } => {
                Reply::new(501, "5.5.4", &format!("Invalid parameter {param}"))
            }
            ParseError::UnsupportedParameter { param } => {
                Reply::new(504, "5.5.4", &format!("Unsupported parameter {param}"))
            }
            _ => Reply::new(500, "5.5.2", "Syntax error"),
        };
        self.write(reply);
        self.count_bad_command()
    }

    /// A BDAT whose chunk size can't be read: the chunk follows all the
    /// same and where it ends is unknown, so close rather than run the
    /// client's message as commands.
    fn malformed_bdat(&mut self, error: ParseError) -> Option<Action> {
        let action = self.parse_error(error);
        if self.is_closed() {
            return action;
        }
        tracing::warn!(peer = %self.peer, "malformed BDAT; closing the connection");
        self.state = State::Closed;
        Some(Action::Close)
    }
}

/// Commands that move no mail forward; their count is limited per session.
fn is_junk(request: &Request<Cow<'_, str>>) -> bool {
    matches!(
        request,
        Request::Noop { .. }
            | Request::Rset
            | Request::Vrfy { .. }
            | Request::Help { .. }
            | Request::Ehlo { .. }
            | Request::Helo { .. }
    )
}

fn is_bdat(line: &[u8]) -> bool {
    line.get(..4)
        .is_some_and(|verb| verb.eq_ignore_ascii_case(b"BDAT"))
        && line.get(4).is_none_or(u8::is_ascii_whitespace)
}

fn starts_with_auth(line: &[u8]) -> bool {
    line.len() >= 4 && line[..4].eq_ignore_ascii_case(b"AUTH")
}

fn trim_crlf(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}
