//! DKIM signing of a message about to be queued (see [`crate::dkim`]).
//!
//! RSA-2048's private-key operation costs about half a millisecond of CPU,
//! so it runs on the parse pool like the other whole-message work, never on
//! an async worker; an Ed25519 signature of a small message costs about 30
//! microseconds and is made inline (on the pool it measured no faster).

use std::sync::Arc;

use super::{Acceptor, INLINE_MAX, from_header};
use crate::dkim::signer::sign_all;
use crate::dkim::{DomainSigner, SignError, Signers};
use crate::submission::Submission;

use super::parse_pool::ParsePoolError;

/// What signing adds to the message.
pub(super) struct Signed {
    /// The `DKIM-Signature:` headers (CRLF-terminated), or empty.
    pub headers: String,
    /// `domain/selector` of each signature, `-` for none (for the log).
    pub labels: String,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum SigningFailed {
    #[error(transparent)]
    Sign(#[from] SignError),
    #[error(transparent)]
    ParsePool(#[from] ParsePoolError),
}

impl Acceptor {
    /// Whether `sub` would be signed (a key for its `From:` domain).
    pub(super) fn would_sign(&self, sub: &Submission) -> bool {
        !self.dkim.is_empty() && !choose(&self.dkim, sub).is_empty()
    }

    /// The signatures for `sub` as it will be stored (its dot-unstuffed
    /// content), by the keys its `From:` domain and workspace choose.
    pub(super) async fn sign(
        &self,
        sub: Submission,
    ) -> Result<(Submission, Signed), SigningFailed> {
        if self.dkim.is_empty() {
            return Ok((sub, unsigned()));
        }
        if sub.content.len() <= INLINE_MAX {
            let chosen = choose(&self.dkim, &sub);
            if !chosen.iter().any(|s| s.key().is_rsa()) {
                let signed = sign_with(&chosen, &sub.content)?;
                return Ok((sub, signed));
            }
        }
        let dkim = Arc::clone(&self.dkim);
        let (sub, signed) = self
            .pool
            .run(move || {
                let signed = sign_with(&choose(&dkim, &sub), &sub.content);
                (sub, signed)
            })
            .await?;
        Ok((sub, signed?))
    }
}

fn unsigned() -> Signed {
    Signed {
        headers: String::new(),
        labels: "-".into(),
    }
}

/// The entries for the message's `From:` domain; none (unsigned) without a
/// single parsable `From:`.
fn choose<'a>(dkim: &'a Signers, sub: &Submission) -> Vec<&'a DomainSigner> {
    match from_header::first_domain(&sub.content) {
        Ok(domain) => dkim.for_message(&domain, sub.submitter.workspace()),
        Err(reason) => {
            tracing::debug!(
                workspace = %sub.submitter.workspace(), %reason,
                "not DKIM-signed: no single From: address to choose a key by"
            );
            Vec::new()
        }
    }
}

fn sign_with(chosen: &[&DomainSigner], content: &[u8]) -> Result<Signed, SignError> {
    if chosen.is_empty() {
        return Ok(unsigned());
    }
    Ok(Signed {
        headers: sign_all(chosen, content)?,
        labels: chosen
            .iter()
            .map(|s| s.label())
            .collect::<Vec<_>>()
            .join(","),
    })
}
