//! The limits on a misbehaving client: over-long lines, commands out of
//! sequence, bad commands (`max_bad_commands`) and commands that carry no
//! mail (`max_junk_commands`), each counted, and the `421` that ends the
//! session past a limit. Also the one wording of the size limit.

use super::{Action, Session, State};
use crate::smtp::reply::Reply;

impl Session {
    pub(super) fn line_too_long(&mut self) -> Option<Action> {
        self.state = State::Command;
        tracing::info!(peer = %self.peer, "command line too long");
        self.write(Reply::new(500, "5.5.2", "Line too long"));
        self.count_bad_command()
    }

    pub(super) fn bad_sequence(&mut self, text: &str) -> Option<Action> {
        self.write(Reply::new(503, "5.5.1", text));
        self.count_bad_command()
    }

    pub(super) fn too_big_reply(&self) -> Reply {
        Reply::new(
            552,
            "5.3.4",
            &format!(
                "Message size exceeds fixed maximum of {} bytes",
                self.config.max_message_size
            ),
        )
    }

    /// Counts a command that carries no mail; past the limit, the session
    /// ends (Postfix `smtpd_junk_command_limit`): a client that never sends
    /// a message must not hold a connection with NOOPs forever.
    pub(super) fn junk_limit_reached(&mut self) -> bool {
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
    pub(super) fn count_junk(&mut self) -> Option<Action> {
        if self.junk_limit_reached() {
            return Some(Action::Close);
        }
        None
    }

    pub(super) fn count_bad_command(&mut self) -> Option<Action> {
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
}
