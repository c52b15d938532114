//! STARTTLS: the `220` that hands the socket to the driver's handshake, and
//! the clean slate after it (RFC 3207 4.2).

use super::{Action, Session, State};
use crate::smtp::reply::Reply;

impl Session {
    pub(super) fn starttls(&mut self) -> Option<Action> {
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

    pub fn tls_started(&mut self) {
        // RFC 3207 4.2: forget everything learned before the handshake.
        self.tls = true;
        self.helo = None;
        self.account = None;
        self.reset_transaction();
        self.state = State::Command;
    }
}
