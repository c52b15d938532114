//! DATA and BDAT: the commands that open a message's content, and its
//! bytes into the session's buffer under the size limit, the in-flight
//! memory budget and the content rule (no bare CR or LF, no NUL). A refused
//! message is swallowed to its end, storing nothing, before it is answered.

use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver};

use super::{Action, Refusal, Session, State};
use crate::budget::OverBudget;
use crate::content_check::{ContentCheck, ContentFault};
use crate::smtp::reply::Reply;

impl Session {
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

    pub(super) fn data(&mut self) -> Option<Action> {
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

    pub(super) fn bdat(&mut self, chunk_size: usize, is_last: bool) -> Option<Action> {
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

    pub(super) fn data_bytes(&mut self, mut receiver: DataReceiver) -> Option<Action> {
        let pending = self.input.len() - self.consumed;
        if let Err(e) = self.make_room(pending) {
            let refusal = self.over_budget(e);
            return self.refuse_data(&receiver, false, refusal);
        }
        let start = self.consumed;
        let mut bytes = self.input[start..].iter();
        let before = bytes.len();
        let done = receiver.ingest(&mut bytes, self.message.vec());
        self.consumed += before - bytes.len();
        self.content_check.feed(&self.input[start..self.consumed]);
        if done {
            self.content_check.finish();
        }
        if let Some(fault) = self.content_check.fault() {
            let refusal = self.content_refusal(fault);
            return self.refuse_data(&receiver, done, refusal);
        }
        if self.message.len() > self.config.max_message_size {
            tracing::info!(peer = %self.peer, "message rejected: larger than SIZE limit");
            let refusal = Refusal::keep_open(self.too_big_reply());
            return self.refuse_data(&receiver, done, refusal);
        }
        if done {
            return self.message_complete();
        }
        self.state = State::Data { receiver };
        Some(Action::NeedInput)
    }

    pub(super) fn data_discard_bytes(
        &mut self,
        mut receiver: DummyDataReceiver,
        mut refusal: Refusal,
    ) -> Option<Action> {
        let start = self.consumed;
        let mut bytes = self.input[start..].iter();
        let before = bytes.len();
        let done = receiver.ingest(&mut bytes);
        self.consumed += before - bytes.len();
        // Still checked: where a refused message ended can be in doubt too.
        self.content_check.feed(&self.input[start..self.consumed]);
        if !done {
            self.state = State::DataDiscard { receiver, refusal };
            return Some(Action::NeedInput);
        }
        self.content_check.finish();
        if let Some(ContentFault::BareLineEnding { offset }) = self.content_check.fault()
            && !refusal.close
        {
            tracing::warn!(
                peer = %self.peer,
                offset,
                "bare CR or LF in a refused message; closing the connection"
            );
            refusal.close = true;
        }
        self.finish_refusal(refusal)
    }

    pub(super) fn bdat_bytes(&mut self, left: usize, is_last: bool) -> Option<Action> {
        let take = left.min(self.input.len() - self.consumed);
        if let Err(e) = self.make_room(take) {
            let refusal = self.over_budget(e);
            return self.refuse_chunk(left, is_last, refusal);
        }
        let start = self.consumed;
        self.consumed += take;
        let chunk = &self.input[start..self.consumed];
        self.message.vec().extend_from_slice(chunk);
        self.content_check.feed(chunk);
        let left = left - take;
        if left == 0 && is_last {
            self.content_check.finish();
        }
        if let Some(fault) = self.content_check.fault() {
            let refusal = self.content_refusal(fault);
            return self.refuse_chunk(left, is_last, refusal);
        }
        if left > 0 {
            self.state = State::Bdat { left, is_last };
            return Some(Action::NeedInput);
        }
        if is_last {
            return self.message_complete();
        }
        let text = format!("{} octets received", self.message.len());
        self.write(Reply::new(250, "2.0.0", &text));
        None
    }

    pub(super) fn bdat_discard_bytes(&mut self, left: usize, refusal: Refusal) -> Option<Action> {
        let take = left.min(self.input.len() - self.consumed);
        self.consumed += take;
        let left = left - take;
        if left > 0 {
            self.state = State::BdatDiscard { left, refusal };
            return Some(Action::NeedInput);
        }
        self.finish_refusal(refusal)
    }

    /// Ends the transaction; the rest of the message (if not `done`) is
    /// swallowed before the reply.
    fn refuse_data(
        &mut self,
        receiver: &DataReceiver,
        done: bool,
        refusal: Refusal,
    ) -> Option<Action> {
        self.reset_transaction();
        if done {
            return self.finish_refusal(refusal);
        }
        self.state = State::DataDiscard {
            receiver: DummyDataReceiver::new_data(receiver),
            refusal,
        };
        None
    }

    /// Fails the BDAT transaction; the chunk's `left` bytes are swallowed
    /// before the reply.
    fn refuse_chunk(&mut self, left: usize, is_last: bool, refusal: Refusal) -> Option<Action> {
        if is_last || refusal.close {
            self.reset_transaction();
        } else {
            // RFC 3030 2: the client must send no more chunks; any it does
            // get 503 until RSET.
            self.message.clear();
            self.bdat_failed = true;
        }
        if left == 0 {
            return self.finish_refusal(refusal);
        }
        self.state = State::BdatDiscard { left, refusal };
        None
    }

    fn finish_refusal(&mut self, refusal: Refusal) -> Option<Action> {
        self.write(refusal.reply);
        if refusal.close {
            self.state = State::Closed;
            return Some(Action::Close);
        }
        self.state = State::Command;
        if refusal.bad_command {
            return self.count_bad_command();
        }
        // A refused message moves no mail forward: counted like NOOP, or a
        // client could loop on it for ever. A failed BDAT transaction is
        // counted by the RSET it needs, not per pipelined chunk.
        if self.bdat_failed {
            return None;
        }
        self.count_junk()
    }

    /// Room for `incoming` more bytes, taken from the in-flight budget
    /// (the account's share too, for an authenticated session).
    fn make_room(&mut self, incoming: usize) -> Result<(), OverBudget> {
        let account = self.account.as_ref().map(|a| a.name.as_str());
        self.message.make_room(
            incoming,
            self.config.max_message_size,
            &self.config.budget,
            account,
        )
    }

    fn over_budget(&self, error: OverBudget) -> Refusal {
        tracing::warn!(
            peer = %self.peer,
            account = ?self.account.as_ref().map(|a| &a.name),
            received = self.message.len(),
            %error,
            "message refused: in-flight memory budget used up"
        );
        Refusal::keep_open(Reply::new(
            452,
            "4.3.1",
            "Insufficient system storage, try again later",
        ))
    }

    fn content_refusal(&self, fault: ContentFault) -> Refusal {
        match fault {
            ContentFault::BareLineEnding { offset } => {
                tracing::warn!(
                    peer = %self.peer,
                    offset,
                    "message refused: bare CR or LF in content; closing the connection"
                );
                Refusal {
                    reply: Reply::new(554, "5.6.0", fault.smtp_text()),
                    close: true,
                    bad_command: false,
                }
            }
            ContentFault::Nul { offset } => {
                tracing::warn!(peer = %self.peer, offset, "message refused: NUL byte in content");
                Refusal::keep_open(Reply::new(554, "5.6.0", fault.smtp_text()))
            }
        }
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
