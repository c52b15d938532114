//! What every front (SMTP, the HTTP API) hands the acceptance pipeline: a
//! complete message with its envelope and who submitted it. Ground floor:
//! the fronts build it, `accept` reads it (and writes its `Received:`
//! header from it), and none of them needs to know another front for that.

use std::net::SocketAddr;

use crate::auth::Submitter;

/// A complete message with its envelope, handed to the acceptance pipeline.
#[derive(Debug, Clone)]
pub struct Submission {
    pub submitter: Submitter,
    /// The SMTP `EHLO` name, or `http` for the API.
    pub helo: String,
    pub peer: SocketAddr,
    pub tls: bool,
    pub reverse_path: String,
    pub recipients: Vec<String>,
    /// The message as received, dot-unstuffed, without our trace header.
    pub content: Vec<u8>,
    /// What the sender asked of the relay beyond the envelope.
    pub options: MailOptions,
}

/// The `MAIL FROM` parameters a message keeps until it is relayed, and
/// passes on. Stored as the text of the parameters (`REQUIRETLS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MailOptions {
    /// RFC 8689: relay only over TLS that authenticates every next hop
    /// (DANE, MTA-STS, a verified smarthost), to hops that offer REQUIRETLS.
    pub require_tls: bool,
}

impl MailOptions {
    pub fn to_stored(self) -> Option<String> {
        self.require_tls.then(|| "REQUIRETLS".to_owned())
    }

    pub fn from_stored(stored: Option<&str>) -> Self {
        Self {
            require_tls: stored.is_some_and(|s| {
                s.split_ascii_whitespace()
                    .any(|p| p.eq_ignore_ascii_case("REQUIRETLS"))
            }),
        }
    }
}
