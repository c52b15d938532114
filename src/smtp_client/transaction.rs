//! One SMTP client transaction as a state machine with no I/O: it says
//! which bytes to write next ([`Transaction::poll`]), takes the bytes the
//! server wrote back ([`Transaction::handle_input`]) or the news that the
//! connection failed ([`Transaction::handle_error`]), and ends with an
//! [`Outcome`] and every recipient's own reply. `io::run` drives it over a
//! stream; the tests drive it with bytes.
//!
//! With PIPELINING (RFC 2920) MAIL, every RCPT and DATA go in one write
//! and their replies are read in order: one round trip instead of two.
//! The message waits for them, so none is sent to a transaction that lost
//! its recipients. Replies are looked at in order; once one decides the
//! transaction, the rest of the group is read but not looked at.

use std::borrow::Cow;
use std::collections::VecDeque;

use super::ClientError;
use super::dot::dot_stuffed;
use super::reply::{Reply, ReplyReader};

/// The message is written in blocks of this size (each within the
/// command timeout).
pub const MESSAGE_BLOCK: usize = 64 * 1024;

/// 421: the server is closing the connection (RFC 5321 3.8).
pub const CLOSING: u16 = 421;

/// What a reply answers, or where the transaction stood when the
/// connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Mail,
    /// The recipient at this index.
    Rcpt(usize),
    Data,
    /// The lone `.` that ends a message a pipelined DATA opened with no
    /// recipient accepted.
    EmptyMessage,
    /// Writing the message: the final dot may or may not have gone out.
    Message,
    /// The reply to the final dot.
    FinalReply,
}

/// How the transaction ended. Every recipient's reply, where there is
/// one, is in [`Finished::rcpt_replies`].
#[derive(Debug)]
pub enum Outcome {
    /// MAIL FROM was not accepted (a 421 included).
    MailRefused(Reply),
    /// A recipient's reply ended the transaction before DATA: a 421, or
    /// any refusal under [`Options::all_or_nothing`]. Replies after it are
    /// not looked at.
    RcptRefused { index: usize, reply: Reply },
    /// No recipient was accepted: no message went out. `data` is the reply
    /// to a pipelined DATA (a `354` was answered with a lone `.`).
    NoRecipients { data: Option<Reply> },
    /// DATA was answered with something other than `354`.
    DataRefused(Reply),
    /// The reply to the final dot.
    Sent(Reply),
    /// The connection failed (I/O error, timeout, hang-up, unparseable
    /// reply) at `stage`.
    Lost { stage: Stage, error: ClientError },
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The server offers PIPELINING and the client wants it.
    pub pipelining: bool,
    /// The first refused recipient ends the transaction (`smtp-once send`:
    /// a retry must send the same envelope).
    pub all_or_nothing: bool,
}

/// The message to send after `354`.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// Dot-stuffed here, and only if the server takes it.
    Raw(&'a [u8]),
    /// Already dot-stuffed and ended with `.\r\n` (the bench's templates).
    Stuffed(&'a [u8]),
}

/// What the driver does next.
#[derive(Debug)]
pub enum Step<'t> {
    /// Write these commands, then read while [`Transaction::wants_reply`]:
    /// one round trip, one timeout.
    Commands(Vec<u8>),
    /// Write this block of the message.
    Message(&'t [u8]),
    /// Read while [`Transaction::wants_reply`]; the stage is the first
    /// reply owed (the reply to the final dot may take longer than others).
    Await(Stage),
    Done(Finished),
}

/// The end of a transaction.
#[derive(Debug)]
pub struct Finished {
    pub outcome: Outcome,
    /// Per recipient, in envelope order: its RCPT reply, `None` if none was
    /// read or looked at.
    pub rcpt_replies: Vec<Option<Reply>>,
}

impl Finished {
    /// Whether the recipient at `index` got a 2xx to its RCPT.
    pub fn accepted(&self, index: usize) -> bool {
        matches!(self.rcpt_replies.get(index), Some(Some(r)) if positive(r))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Envelope,
    EmptyMessage,
    Message,
    FinalReply,
    Done,
}

pub struct Transaction<'a> {
    options: Options,
    recipients: &'a [String],
    body: Body<'a>,
    /// Commands not yet handed out, and the stages they will owe.
    commands: Vec<u8>,
    queued: Vec<Stage>,
    /// The stages whose replies are owed by commands handed out, in order.
    awaited: VecDeque<Stage>,
    reader: ReplyReader,
    rcpt_replies: Vec<Option<Reply>>,
    /// A pipelined DATA's `354` while no recipient was accepted.
    data_reply: Option<Reply>,
    /// Dot-stuffed, from the `354` on; `written` bytes of it handed out.
    message: Cow<'a, [u8]>,
    written: usize,
    state: State,
    outcome: Option<Outcome>,
}

fn positive(r: &Reply) -> bool {
    (200..300).contains(&r.code)
}

impl<'a> Transaction<'a> {
    /// A transaction for `MAIL FROM:<from>` with `mail_params` (as
    /// `crate::smtp_client::mail_params` gives them, each with its leading
    /// space) to `recipients`.
    pub fn new(
        from: &str,
        mail_params: &str,
        recipients: &'a [String],
        body: Body<'a>,
        options: Options,
    ) -> Self {
        let mut txn = Self {
            options,
            recipients,
            body,
            commands: Vec::new(),
            queued: Vec::new(),
            awaited: VecDeque::new(),
            reader: ReplyReader::default(),
            rcpt_replies: vec![None; recipients.len()],
            data_reply: None,
            message: Cow::Borrowed(&[]),
            written: 0,
            state: State::Envelope,
            outcome: None,
        };
        txn.queue(
            format!("MAIL FROM:<{from}>{mail_params}\r\n").as_bytes(),
            Stage::Mail,
        );
        if options.pipelining {
            for index in 0..recipients.len() {
                txn.queue_rcpt(index);
            }
            txn.queue(b"DATA\r\n", Stage::Data);
        }
        txn
    }

    fn queue(&mut self, command: &[u8], stage: Stage) {
        self.commands.extend_from_slice(command);
        self.queued.push(stage);
    }

    fn queue_rcpt(&mut self, index: usize) {
        let rcpt = &self.recipients[index];
        let command = format!("RCPT TO:<{rcpt}>\r\n");
        self.queue(command.as_bytes(), Stage::Rcpt(index));
    }

    /// Whether replies are owed: the driver reads and calls
    /// [`handle_input`](Self::handle_input) until they are all in.
    pub fn wants_reply(&self) -> bool {
        !self.awaited.is_empty()
    }

    /// What to do next. Call again after each step is carried out.
    pub fn poll(&mut self) -> Step<'_> {
        if !self.commands.is_empty() {
            self.awaited.extend(self.queued.drain(..));
            return Step::Commands(std::mem::take(&mut self.commands));
        }
        if self.state == State::Message {
            if self.written < self.message.len() {
                let start = self.written;
                self.written = (start + MESSAGE_BLOCK).min(self.message.len());
                return Step::Message(&self.message[start..self.written]);
            }
            // Only now: a failure writing the last block is a failure of
            // the message transfer, not a missing reply.
            self.state = State::FinalReply;
            self.awaited.push_back(Stage::FinalReply);
        }
        if let Some(&stage) = self.awaited.front() {
            return Step::Await(stage);
        }
        // Every path that leaves nothing owed and nothing to write has
        // decided the outcome; a driver calling again after `Done` gets a
        // lost connection rather than a panic.
        let outcome = self.outcome.take().unwrap_or(Outcome::Lost {
            stage: Stage::Message,
            error: ClientError::NoReply,
        });
        self.state = State::Done;
        Step::Done(Finished {
            outcome,
            rcpt_replies: std::mem::take(&mut self.rcpt_replies),
        })
    }

    /// Bytes the server wrote. Bytes past the replies owed are dropped, as
    /// mail-send does: a server may not speak out of turn.
    pub fn handle_input(&mut self, mut bytes: &[u8]) {
        while let Some(&stage) = self.awaited.front() {
            match self.reader.next(&mut bytes) {
                Ok(Some(reply)) => {
                    self.awaited.pop_front();
                    if self.outcome.is_none() {
                        self.on_reply(stage, reply);
                    }
                }
                Ok(None) => return,
                Err(_) => return self.handle_error(ClientError::NoReply),
            }
        }
    }

    /// The connection failed (or a step timed out): the transaction ends
    /// here, with the outcome already decided if there is one.
    pub fn handle_error(&mut self, error: ClientError) {
        let stage = match self.state {
            State::Message => Stage::Message,
            _ => self.awaited.front().copied().unwrap_or(Stage::Message),
        };
        self.awaited.clear();
        self.commands.clear();
        self.queued.clear();
        self.state = State::Done;
        if self.outcome.is_none() {
            self.outcome = Some(Outcome::Lost { stage, error });
        }
    }

    fn any_accepted(&self) -> bool {
        self.rcpt_replies.iter().flatten().any(positive)
    }

    fn end(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    fn on_reply(&mut self, stage: Stage, reply: Reply) {
        match stage {
            Stage::Mail if !positive(&reply) => self.end(Outcome::MailRefused(reply)),
            Stage::Mail => self.next_rcpt(0),
            Stage::Rcpt(index) => {
                let stop =
                    reply.code == CLOSING || (self.options.all_or_nothing && !positive(&reply));
                if stop {
                    self.rcpt_replies[index] = Some(reply.clone());
                    self.end(Outcome::RcptRefused { index, reply });
                } else {
                    self.rcpt_replies[index] = Some(reply);
                    self.next_rcpt(index + 1);
                }
            }
            Stage::Data if !self.any_accepted() => {
                if reply.code == 354 {
                    // A server that opens DATA anyway gets an empty message
                    // ended at once.
                    self.data_reply = Some(reply);
                    self.state = State::EmptyMessage;
                    self.queue(b".\r\n", Stage::EmptyMessage);
                } else {
                    self.end(Outcome::NoRecipients { data: Some(reply) });
                }
            }
            Stage::Data if reply.code == 354 => {
                self.message = match self.body {
                    Body::Raw(content) => Cow::Owned(dot_stuffed(content)),
                    Body::Stuffed(stuffed) => Cow::Borrowed(stuffed),
                };
                self.state = State::Message;
            }
            Stage::Data => self.end(Outcome::DataRefused(reply)),
            // The reply to the lone dot is not looked at.
            Stage::EmptyMessage => {
                let data = self.data_reply.take();
                self.end(Outcome::NoRecipients { data });
            }
            Stage::FinalReply => self.end(Outcome::Sent(reply)),
            // No reply is owed while the message is written.
            Stage::Message => {}
        }
    }

    /// One at a time without PIPELINING: the next RCPT, then DATA if any
    /// recipient was accepted. With it, everything is already written.
    fn next_rcpt(&mut self, index: usize) {
        if self.options.pipelining {
            return;
        }
        if index < self.recipients.len() {
            self.queue_rcpt(index);
        } else if self.any_accepted() {
            self.queue(b"DATA\r\n", Stage::Data);
        } else {
            self.end(Outcome::NoRecipients { data: None });
        }
    }
}

#[cfg(test)]
#[path = "transaction_tests.rs"]
mod tests;
