//! The SMTP session as a state machine, free of I/O: the connection driver
//! appends received bytes to [`Session::input`], calls [`Session::advance`],
//! writes [`Session::take_output`] to the socket and carries out the
//! returned [`Action`]. Everything the protocol decides is decided here, so
//! it is tested without sockets.
//!
//! This file holds the public types, the session's state and the driver's
//! view of it; the `impl Session` is spread over one file per verb:
//! `dispatch` (the input loop and a command line to its handler), `ehlo`,
//! `starttls`, `auth`, `envelope` (MAIL, RCPT, RSET), `intake` (DATA and
//! BDAT), `submit` (the finished message handed to the driver) and `limits`
//! (the counts and replies that end a misbehaving session).

use std::net::SocketAddr;
use std::sync::Arc;

use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver};

use crate::auth::Account;
use crate::budget::InFlightBudget;
use crate::content_check::ContentCheck;
use crate::smtp::message_buffer::MessageBuffer;
use crate::smtp::reply::Reply;
use crate::submission::Submission;

mod auth;
mod dispatch;
mod ehlo;
mod envelope;
mod intake;
mod limits;
mod starttls;
mod submit;

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
    options: crate::submission::MailOptions,
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

    /// The client's address, for the driver's AUTH throttling.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn ok(&mut self, esc: &str, text: &str) -> Option<Action> {
        self.write(Reply::new(250, esc, text));
        None
    }

    fn write(&mut self, reply: Reply) {
        reply.write_to(&mut self.output);
    }
}
