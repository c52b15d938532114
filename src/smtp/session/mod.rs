//! The SMTP session as a state machine, free of I/O: the connection driver
//! appends received bytes to [`Session::input`], calls [`Session::advance`],
//! writes [`Session::take_output`] to the socket and carries out the
//! returned [`Action`]. Everything the protocol decides is decided here, so
//! it is tested without sockets.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver};
use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN, Error as ParseError, Request};

use crate::auth::{Account, AuthOutcome, Submitter};
use crate::budget::InFlightBudget;
use crate::content_check::ContentCheck;
use crate::smtp::message_buffer::MessageBuffer;
use crate::smtp::path_command::{self, CommandError, Verb};
use crate::smtp::reply::Reply;
use crate::submission::Submission;

mod intake;

/// RFC 5321 4.5.3.1.4: a command line is at most 512 octets with CRLF.
pub const MAX_COMMAND_LINE: usize = 512;
/// RFC 4954 4: AUTH lines (with their base64 payload) may be up to 12288.
pub const MAX_AUTH_LINE: usize = 12288;

/// Settings a session needs, shared by every session of a listener.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub hostname: String,
    pub max_message_size: usize,
    pub max_recipients: usize,
    pub max_bad_commands: u32,
    pub allow_plaintext_auth: bool,
    /// The listener offers STARTTLS (plaintext listener with a certificate).
    pub starttls_offered: bool,
    /// NOOP, RSET, VRFY, HELP, EHLO and HELO allowed between accepted
    /// messages (`limits.max_junk_commands`).
    pub max_junk_commands: u32,
    /// Message bytes in memory, shared by every listener's sessions.
    pub budget: Arc<InFlightBudget>,
}

/// What the driver must do before calling [`Session::advance`] again.
#[derive(Debug)]
pub enum Action {
    /// Flush the output and read more input.
    NeedInput,
    /// Flush the output (it ends with `220`), run the TLS handshake, then
    /// call [`Session::tls_started`].
    StartTls,
    /// Verify the credentials, then call [`Session::auth_result`].
    Authenticate { username: String, password: String },
    /// Run the acceptance pipeline, then call [`Session::submission_done`].
    Submit(Box<Submission>),
    /// Flush the output and close the connection.
    Close,
}

#[derive(Debug)]
struct Envelope {
    reverse_path: String,
    recipients: Vec<String>,
}

enum State {
    Command,
    Data {
        receiver: DataReceiver,
    },
    /// The message was refused: swallow the rest of it, then answer.
    DataDiscard {
        receiver: DummyDataReceiver,
        refusal: Refusal,
    },
    /// `left` bytes of the current chunk are still to come.
    Bdat {
        left: usize,
        is_last: bool,
    },
    BdatDiscard {
        left: usize,
        refusal: Refusal,
    },
    SaslPlain,
    SaslLoginUser,
    SaslLoginPassword {
        username: String,
    },
    /// An action is out; input waits until the driver reports back.
    Waiting,
    Closed,
}

/// The answer to a refused message, given once its last byte is read.
struct Refusal {
    reply: Reply,
    /// The client can't be trusted to agree with us on where the message
    /// ended: close after the reply, so nothing pipelined behind runs.
    close: bool,
    /// A command out of sequence (BDAT without a transaction): counted
    /// like DATA's, or a client could repeat it for ever.
    bad_command: bool,
}

impl Refusal {
    fn keep_open(reply: Reply) -> Self {
        Self {
            reply,
            close: false,
            bad_command: false,
        }
    }
}

pub struct Session {
    config: Arc<SessionConfig>,
    peer: SocketAddr,
    trusted_workspace: Option<String>,
    tls: bool,
    state: State,
    helo: Option<String>,
    account: Option<Arc<Account>>,
    envelope: Option<Envelope>,
    /// DATA or BDAT content collected so far.
    message: MessageBuffer,
    /// Bare CR/LF and NUL check over the current message's bytes.
    content_check: ContentCheck,
    /// A BDAT chunk overflowed the size limit: the transaction is dead.
    bdat_failed: bool,
    /// An over-long command line is being skipped up to its newline.
    skipping_long_line: bool,
    bad_commands: u32,
    /// Commands that carry no mail, since the last accepted message.
    junk_commands: u32,
    /// Set by STARTTLS: whatever was pipelined after it is dropped.
    discard_input: bool,
    input: Vec<u8>,
    consumed: usize,
    output: Vec<u8>,
}

impl Session {
    pub fn new(
        config: Arc<SessionConfig>,
        peer: SocketAddr,
        trusted_workspace: Option<String>,
        implicit_tls: bool,
    ) -> Self {
        Self {
            config,
            peer,
            trusted_workspace,
            tls: implicit_tls,
            state: State::Command,
            helo: None,
            account: None,
            envelope: None,
            message: MessageBuffer::new(),
            content_check: ContentCheck::new(),
            bdat_failed: false,
            skipping_long_line: false,
            bad_commands: 0,
            junk_commands: 0,
            discard_input: false,
            input: Vec::with_capacity(8192),
            consumed: 0,
            output: Vec::with_capacity(1024),
        }
    }

    /// The `220` banner, queued for the first flush.
    pub fn greet(&mut self) {
        let text = format!("{} ESMTP smtp-once", self.config.hostname);
        self.write(Reply::new(220, "", &text));
    }

    /// Buffer that the driver reads socket bytes into (append only).
    pub fn input(&mut self) -> &mut Vec<u8> {
        &mut self.input
    }

    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// The session is inside a message body (the data timeout applies).
    pub fn in_data(&self) -> bool {
        matches!(
            self.state,
            State::Data { .. }
                | State::DataDiscard { .. }
                | State::Bdat { .. }
                | State::BdatDiscard { .. }
        )
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Bytes of an unfinished command line are buffered or being skipped
    /// (the command time limit is running, the client is not idle).
    pub fn has_partial_command(&self) -> bool {
        !self.in_data() && (self.consumed < self.input.len() || self.skipping_long_line)
    }

    /// A message is under way: inside a DATA or BDAT body, or between the
    /// BDAT chunks of one message (the message time limit is running).
    pub fn in_message(&self) -> bool {
        self.in_data() || !self.message.is_empty() || self.bdat_failed
    }

    /// Idle limit reached.
    pub fn timed_out(&mut self) {
        self.write(Reply::new(421, "4.4.2", "Idle timeout, closing connection"));
        self.state = State::Closed;
    }

    /// The daemon is stopping and this session is idle between commands.
    pub fn shutting_down(&mut self) {
        self.write(Reply::new(
            421,
            "4.3.2",
            "Service shutting down, try again later",
        ));
        self.state = State::Closed;
    }

    pub fn tls_started(&mut self) {
        // RFC 3207 4.2: forget everything learned before the handshake.
        self.tls = true;
        self.helo = None;
        self.account = None;
        self.reset_transaction();
        self.state = State::Command;
    }

    /// The client's address, for the driver's AUTH throttling.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn auth_result(&mut self, outcome: AuthOutcome) {
        self.state = State::Command;
        match outcome {
            AuthOutcome::Success(account) => {
                self.account = Some(account);
                self.write(Reply::new(235, "2.7.0", "Authentication successful"));
            }
            AuthOutcome::Invalid => {
                self.write(Reply::new(
                    535,
                    "5.7.8",
                    "Authentication credentials invalid",
                ));
                self.count_bad_command();
            }
            // No hash was checked for these: counted, or AUTH could be
            // repeated for ever against a locked account or a full queue.
            AuthOutcome::TemporaryFailure => {
                self.write(Reply::new(
                    454,
                    "4.7.0",
                    "Temporary authentication failure, try again later",
                ));
                self.junk_limit_reached();
            }
            AuthOutcome::AccountLocked => {
                self.write(Reply::new(
                    454,
                    "4.7.0",
                    "Too many failed logins for this account, try again later",
                ));
                self.junk_limit_reached();
            }
            AuthOutcome::IpBanned => {
                self.write(Reply::new(
                    421,
                    "4.7.0",
                    "Too many failed logins from your address, closing connection",
                ));
                self.state = State::Closed;
            }
        }
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

    fn line_too_long(&mut self) -> Option<Action> {
        self.state = State::Command;
        tracing::info!(peer = %self.peer, "command line too long");
        self.write(Reply::new(500, "5.5.2", "Line too long"));
        self.count_bad_command()
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

    fn parse_error(&mut self, error: ParseError) -> Option<Action> {
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

    /// Counts a command that carries no mail; past the limit, the session
    /// ends (Postfix `smtpd_junk_command_limit`): a client that never sends
    /// a message must not hold a connection with NOOPs forever.
    fn junk_limit_reached(&mut self) -> bool {
        self.junk_commands += 1;
        if self.junk_commands <= self.config.max_junk_commands {
            return false;
        }
        tracing::warn!(
            peer = %self.peer,
            limit = self.config.max_junk_commands,
            "too many commands without a message, disconnecting"
        );
        self.write(Reply::new(
            421,
            "4.7.0",
            "Too many commands, closing connection",
        ));
        self.state = State::Closed;
        true
    }

    /// A refused MAIL/RCPT moves no mail forward; a client could loop on
    /// it forever, so it counts like NOOP (after its own reply).
    fn count_junk(&mut self) -> Option<Action> {
        if self.junk_limit_reached() {
            return Some(Action::Close);
        }
        None
    }

    /// RFC 3030 BINARYMIME is not offered in EHLO: content must be lines.
    fn refuse_binarymime(&mut self) -> Option<Action> {
        // count_bad_command logs the reply.
        self.write(Reply::new(555, "5.5.4", "BODY=BINARYMIME not supported"));
        self.count_bad_command()
    }

    fn count_bad_command(&mut self) -> Option<Action> {
        self.bad_commands += 1;
        // The reply just queued is the last line of the output.
        let body = self.output.strip_suffix(b"\r\n").unwrap_or(&self.output);
        let start = body
            .windows(2)
            .rposition(|w| w == b"\r\n")
            .map_or(0, |i| i + 2);
        tracing::info!(
            peer = %self.peer,
            count = self.bad_commands,
            reply = ?String::from_utf8_lossy(&body[start..]),
            "bad command"
        );
        if self.bad_commands > self.config.max_bad_commands {
            tracing::warn!(peer = %self.peer, "too many bad commands, disconnecting");
            self.write(Reply::new(
                421,
                "4.7.0",
                "Too many errors, closing connection",
            ));
            self.state = State::Closed;
            return Some(Action::Close);
        }
        None
    }

    fn ehlo(&mut self, host: Cow<'_, str>, extended: bool) -> Option<Action> {
        self.reset_transaction();
        self.helo = Some(host.into_owned());
        let hostname = self.config.hostname.clone();
        if !extended {
            return self.ok("", &hostname);
        }
        let mut lines = vec![
            format!("{hostname} greets {}", self.peer.ip()),
            "PIPELINING".to_string(),
            format!("SIZE {}", self.config.max_message_size),
            "8BITMIME".to_string(),
            "SMTPUTF8".to_string(),
            "ENHANCEDSTATUSCODES".to_string(),
            "CHUNKING".to_string(),
        ];
        if self.config.starttls_offered && !self.tls {
            lines.push("STARTTLS".to_string());
        }
        if self.auth_allowed() && self.account.is_none() {
            lines.push("AUTH PLAIN LOGIN".to_string());
        }
        self.write(Reply::multiline(250, &lines));
        None
    }

    fn auth_allowed(&self) -> bool {
        self.tls || self.config.allow_plaintext_auth
    }

    fn submitter(&self) -> Option<Submitter> {
        match (&self.account, &self.trusted_workspace) {
            (Some(account), _) => Some(Submitter::Account(account.clone())),
            (None, Some(workspace)) => Some(Submitter::TrustedNetwork {
                workspace: workspace.clone(),
            }),
            (None, None) => None,
        }
    }

    fn mail(&mut self, line: &[u8]) -> Option<Action> {
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

    fn rcpt(&mut self, line: &[u8]) -> Option<Action> {
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

    fn transaction_ready(&mut self) -> Result<(), Option<Action>> {
        match &self.envelope {
            None => Err(self.bad_sequence("Send MAIL first")),
            Some(e) if e.recipients.is_empty() => {
                self.write(Reply::new(554, "5.5.1", "No valid recipients"));
                Err(self.count_bad_command())
            }
            Some(_) => Ok(()),
        }
    }

    fn data(&mut self) -> Option<Action> {
        if !self.message.is_empty() {
            return self.bad_sequence("DATA not allowed after BDAT");
        }
        if let Err(action) = self.transaction_ready() {
            return action;
        }
        self.write(Reply::new(354, "", "End data with <CR><LF>.<CR><LF>"));
        self.content_check = ContentCheck::new();
        self.state = State::Data {
            receiver: data_receiver(),
        };
        None
    }

    fn bdat(&mut self, chunk_size: usize, is_last: bool) -> Option<Action> {
        // An empty chunk that is not the last carries nothing: junk.
        if chunk_size == 0 && !is_last && self.junk_limit_reached() {
            return Some(Action::Close);
        }
        // The chunk follows the command whatever we answer: always consume it.
        let refuse = if self.bdat_failed {
            Some(Reply::new(503, "5.5.1", "Transaction failed, send RSET"))
        } else if self.envelope.is_none() {
            Some(Reply::new(503, "5.5.1", "Send MAIL first"))
        } else if self
            .envelope
            .as_ref()
            .is_some_and(|e| e.recipients.is_empty())
        {
            Some(Reply::new(554, "5.5.1", "No valid recipients"))
        } else {
            None
        };
        if let Some(reply) = refuse {
            self.state = State::BdatDiscard {
                left: chunk_size,
                refusal: Refusal {
                    // Chunks pipelined behind a failed one are expected
                    // (and bounded by the message time limit); a BDAT with
                    // no transaction is the client's error, as for DATA.
                    bad_command: !self.bdat_failed,
                    ..Refusal::keep_open(reply)
                },
            };
            return None;
        }
        if self.message.is_empty() && self.message.reserved() == 0 {
            // The first chunk of a message.
            self.content_check = ContentCheck::new();
        }
        if self.message.len().saturating_add(chunk_size) > self.config.max_message_size {
            tracing::info!(peer = %self.peer, chunk_size, "BDAT rejected: larger than SIZE limit");
            let refusal = Refusal::keep_open(self.too_big_reply());
            return self.refuse_chunk(chunk_size, is_last, refusal);
        }
        // No memory for the announced size: the buffer grows with the bytes
        // that actually arrive (see `bdat_bytes`).
        self.state = State::Bdat {
            left: chunk_size,
            is_last,
        };
        None
    }

    /// The whole message is in (final dot or last chunk) and passed the
    /// content check.
    fn message_complete(&mut self) -> Option<Action> {
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
        })))
    }

    fn starttls(&mut self) -> Option<Action> {
        if self.tls {
            return self.bad_sequence("TLS already active");
        }
        if !self.config.starttls_offered {
            self.write(Reply::new(454, "4.7.0", "TLS not available"));
            // Else STARTTLS could be repeated for ever.
            return self.count_junk();
        }
        self.write(Reply::new(220, "2.0.0", "Ready to start TLS"));
        // Plaintext pipelined after STARTTLS must not survive into the TLS
        // session (CVE-2011-0411 style command injection).
        self.discard_input = true;
        self.state = State::Waiting;
        Some(Action::StartTls)
    }

    fn auth(&mut self, mechanism: u64, initial: Cow<'_, str>) -> Option<Action> {
        if self.account.is_some() {
            return self.bad_sequence("Already authenticated");
        }
        if self.envelope.is_some() {
            return self.bad_sequence("AUTH not allowed during a mail transaction");
        }
        if !self.auth_allowed() {
            self.write(Reply::new(
                538,
                "5.7.11",
                "Encryption required for requested authentication mechanism",
            ));
            return self.count_bad_command();
        }
        match mechanism {
            AUTH_PLAIN if initial.is_empty() => {
                self.write(Reply::new(334, "", ""));
                self.state = State::SaslPlain;
                None
            }
            AUTH_PLAIN => self.sasl_plain(initial.as_bytes()),
            AUTH_LOGIN if initial.is_empty() => {
                self.write(Reply::new(334, "", "VXNlcm5hbWU6"));
                self.state = State::SaslLoginUser;
                None
            }
            AUTH_LOGIN => self.sasl_login_user(initial.as_bytes()),
            _ => {
                self.write(Reply::new(
                    504,
                    "5.5.4",
                    "Unrecognized authentication mechanism",
                ));
                self.count_bad_command()
            }
        }
    }

    fn sasl_plain(&mut self, response: &[u8]) -> Option<Action> {
        let decoded = match self.decode_sasl(response) {
            Ok(d) => d,
            Err(action) => return action,
        };
        // authzid NUL authcid NUL password; we ignore authzid.
        let mut fields = decoded.split(|&b| b == 0);
        let (Some(_), Some(user), Some(pass), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            self.write(Reply::new(501, "5.5.2", "Malformed AUTH PLAIN response"));
            return self.count_bad_command();
        };
        self.authenticate(user, pass)
    }

    fn sasl_login_user(&mut self, response: &[u8]) -> Option<Action> {
        let user = match self.decode_sasl(response) {
            Ok(d) => d,
            Err(action) => return action,
        };
        let username = String::from_utf8_lossy(&user).into_owned();
        self.write(Reply::new(334, "", "UGFzc3dvcmQ6"));
        self.state = State::SaslLoginPassword { username };
        None
    }

    fn sasl_login_password(&mut self, username: String, response: &[u8]) -> Option<Action> {
        match self.decode_sasl(response) {
            Ok(pass) => self.authenticate(username.as_bytes(), &pass),
            Err(action) => action,
        }
    }

    fn decode_sasl(&mut self, response: &[u8]) -> Result<Vec<u8>, Option<Action>> {
        if response == b"*" {
            self.write(Reply::new(501, "5.7.0", "Authentication cancelled"));
            // Moves nothing forward: without a count, AUTH and `*` could
            // be repeated for ever.
            return Err(self.count_junk());
        }
        if response == b"=" {
            return Ok(Vec::new());
        }
        BASE64.decode(response).map_err(|_| {
            self.write(Reply::new(501, "5.5.2", "Invalid base64 in AUTH response"));
            self.count_bad_command()
        })
    }

    fn authenticate(&mut self, user: &[u8], pass: &[u8]) -> Option<Action> {
        let (Ok(username), Ok(password)) = (std::str::from_utf8(user), std::str::from_utf8(pass))
        else {
            self.write(Reply::new(
                535,
                "5.7.8",
                "Authentication credentials invalid",
            ));
            return self.count_bad_command();
        };
        self.state = State::Waiting;
        Some(Action::Authenticate {
            username: username.to_owned(),
            password: password.to_owned(),
        })
    }

    fn bad_sequence(&mut self, text: &str) -> Option<Action> {
        self.write(Reply::new(503, "5.5.1", text));
        self.count_bad_command()
    }

    fn too_big_reply(&self) -> Reply {
        Reply::new(
            552,
            "5.3.4",
            &format!(
                "Message size exceeds fixed maximum of {} bytes",
                self.config.max_message_size
            ),
        )
    }

    fn ok(&mut self, esc: &str, text: &str) -> Option<Action> {
        self.write(Reply::new(250, esc, text));
        None
    }

    fn reset_transaction(&mut self) {
        self.envelope = None;
        self.message.clear();
        self.bdat_failed = false;
    }

    fn write(&mut self, reply: Reply) {
        reply.write_to(&mut self.output);
    }
}

/// A receiver that knows a line just ended (the DATA command's CRLF), so a
/// `.` on the very first line is seen: `.\r\n` at once is an empty message
/// rather than content, and a stuffed `..` first line is unstuffed.
fn data_receiver() -> DataReceiver {
    let mut receiver = DataReceiver::new();
    receiver.ingest(&mut b"\r\n".iter(), &mut Vec::new());
    receiver
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
