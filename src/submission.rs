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
}
