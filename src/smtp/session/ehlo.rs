//! EHLO and HELO: the client's name, a fresh transaction and, for EHLO, the
//! capabilities this session offers in its current state.

use std::borrow::Cow;

use super::{Action, Session};
use crate::smtp::reply::Reply;

impl Session {
    pub(super) fn ehlo(&mut self, host: Cow<'_, str>, extended: bool) -> Option<Action> {
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
        // RFC 8689 3: offered only over TLS.
        if self.tls {
            lines.push("REQUIRETLS".to_string());
        }
        if self.auth_allowed() && self.account.is_none() {
            lines.push("AUTH PLAIN LOGIN".to_string());
        }
        self.write(Reply::multiline(250, &lines));
        None
    }
}
