//! A queued message as the transports see it: loaded by the queue, sent by
//! every relay mode. Its own module so the modes and the dispatcher in
//! `transport.rs` share it without depending on each other.

use super::content;
use crate::message::key_header::KeyHeaders;
use crate::submission::MailOptions;

/// A queued message, as loaded for delivery.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub id: String,
    pub reverse_path: String,
    /// Every recipient it was accepted for (delivered ones included).
    pub recipients: Vec<String>,
    pub idempotency_key: Option<String>,
    pub trace: String,
    pub body: Vec<u8>,
    /// REQUIRETLS, as accepted.
    pub options: MailOptions,
    /// `[idempotency] key_headers`: the key headers the relayed copy
    /// replaces with one `X-Bird-Idempotency-Key`.
    pub key_headers: KeyHeaders,
}

impl Outgoing {
    /// `TLS-Required: No` in the header (RFC 8689 5): the sender would
    /// rather the message arrive than the recipient's TLS policy hold.
    pub fn tls_not_required(&self) -> bool {
        crate::message::headers::top_level_headers(&self.body).any(|(name, value)| {
            name.eq_ignore_ascii_case(b"TLS-Required")
                && value.trim_ascii().eq_ignore_ascii_case(b"No")
        })
    }

    /// The bytes relayed in a transaction to `subset` of the recipients.
    pub fn bytes_for(&self, subset: &[String]) -> Vec<u8> {
        content::relayed(
            &self.id,
            &self.trace,
            &self.body,
            self.idempotency_key.as_deref(),
            &self.recipients,
            subset,
            &self.key_headers,
        )
    }
}
