//! Which keys sign a message, and the signing itself.
//!
//! The signing domain follows the `From:` domain (what DMARC aligns with):
//! the exact name first, then each parent down to a two-label name, so
//! `mail.example.com` is signed by an `example.com` key when it has none of
//! its own. Several entries for one domain (an RSA and an Ed25519 selector,
//! RFC 8463) all sign.
//!
//! Headers that smtp-once itself writes per hop are never signed:
//! `X-Bird-Idempotency-Key` (rewritten for a partial retry) and our
//! `Received:`, and neither are the `DKIM-Signature`s and the
//! `Return-Path` a later hop adds.

use std::fmt;
use std::sync::Arc;

use mail_auth::common::headers::HeaderWriter;
use mail_auth::dkim::{Canonicalization, DkimSigner, Done};

use super::key::SigningKey;

/// RFC 6376 section 5.4.1's list, with the MIME headers that change what a
/// reader sees. A name absent from a message is still listed in `h=`, so
/// nobody can add it later without breaking the signature.
pub const DEFAULT_HEADERS: [&str; 25] = [
    "From",
    "Reply-To",
    "Subject",
    "Date",
    "To",
    "Cc",
    "Resent-Date",
    "Resent-From",
    "Resent-To",
    "Resent-Cc",
    "In-Reply-To",
    "References",
    "List-Id",
    "List-Help",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "List-Subscribe",
    "List-Post",
    "List-Owner",
    "List-Archive",
    "Message-ID",
    "MIME-Version",
    "Content-Type",
    "Content-Transfer-Encoding",
    "Sender",
];

/// Written or rewritten after signing, per hop: signing them would break
/// the signature at the next attempt or the next hop.
const NEVER_SIGNED: [&str; 4] = [
    "X-Bird-Idempotency-Key",
    "Received",
    "DKIM-Signature",
    "Return-Path",
];

#[derive(Debug, thiserror::Error)]
#[error("DKIM signing as {label} failed: {reason}")]
pub struct SignError {
    pub label: String,
    pub reason: String,
}

/// One `[[dkim]]` entry, ready to sign.
#[derive(Clone)]
pub struct DomainSigner {
    domain: String,
    selector: String,
    /// The workspaces whose mail it signs; empty: every workspace (the
    /// config allows that only when there is one).
    workspaces: Vec<String>,
    key: SigningKey,
    /// Built once: domain, selector, h= list, relaxed/relaxed.
    signer: Arc<DkimSigner<SigningKey, Done>>,
}

impl fmt::Debug for DomainSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainSigner")
            .field("domain", &self.domain)
            .field("selector", &self.selector)
            .field("workspaces", &self.workspaces)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl DomainSigner {
    /// `domain` and `selector` as checked by [`check_domain`] and
    /// [`check_selector`]; `headers` as checked by [`check_header`]
    /// (`None`: [`DEFAULT_HEADERS`]). `From` is signed whatever the list
    /// says, and oversigned. `workspaces`: whose mail it signs (empty:
    /// everyone's).
    pub fn new(
        domain: &str,
        selector: &str,
        key: SigningKey,
        headers: Option<&[String]>,
        workspaces: &[String],
    ) -> Self {
        let domain = domain.to_ascii_lowercase();
        let signer = DkimSigner::from_key(key.clone())
            .domain(domain.clone())
            .selector(selector)
            .headers(signed_headers(headers))
            .header_canonicalization(Canonicalization::Relaxed)
            .body_canonicalization(Canonicalization::Relaxed);
        Self {
            domain,
            selector: selector.to_owned(),
            workspaces: workspaces.to_vec(),
            key,
            signer: Arc::new(signer),
        }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    pub fn selector(&self) -> &str {
        &self.selector
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// `domain/selector`, for logs.
    pub fn label(&self) -> String {
        format!("{}/{}", self.domain, self.selector)
    }

    /// The `DKIM-Signature:` header for `content` (a whole message, header
    /// section and body), folded, ending in CRLF.
    pub fn sign(&self, content: &[u8]) -> Result<String, SignError> {
        self.signer
            .sign(content)
            .map(|s| s.to_header())
            .map_err(|e| SignError {
                label: self.label(),
                reason: e.to_string(),
            })
    }

    fn serves(&self, domain: &str, workspace: &str) -> bool {
        self.domain == domain
            && (self.workspaces.is_empty() || self.workspaces.iter().any(|w| w == workspace))
    }
}

/// The h= list given to mail-auth: the configured names once each, `From`
/// first, then `From` again. mail-auth matches a message's header to the
/// first place of its name in the list and lists every place it did not
/// fill after the ones it did, so the second `From` always lands in `h=`
/// one more time than the message has `From:` headers: oversigned, so a
/// second `From:` cannot be added below the signature.
fn signed_headers(headers: Option<&[String]>) -> Vec<String> {
    let configured: Vec<&str> = match headers {
        Some(list) => list.iter().map(String::as_str).collect(),
        None => DEFAULT_HEADERS.to_vec(),
    };
    let mut out = vec!["From".to_owned()];
    for name in configured {
        if !out.iter().any(|o| o.eq_ignore_ascii_case(name)) {
            out.push(name.to_owned());
        }
    }
    out.push("From".to_owned());
    out
}

/// Every `[[dkim]]` entry of the node.
#[derive(Debug, Clone, Default)]
pub struct Signers(Vec<DomainSigner>);

impl Signers {
    pub fn new(entries: Vec<DomainSigner>) -> Self {
        Self(entries)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries that sign mail from `from_domain` submitted in
    /// `workspace`: at the first level of the name (exact, then each parent
    /// with at least two labels) where any entry serves, all of that
    /// level's entries that do. Empty: the message goes unsigned.
    pub fn for_message(&self, from_domain: &str, workspace: &str) -> Vec<&DomainSigner> {
        let domain = from_domain.trim_end_matches('.').to_ascii_lowercase();
        let mut level = domain.as_str();
        loop {
            let found: Vec<&DomainSigner> = self
                .0
                .iter()
                .filter(|s| s.serves(level, workspace))
                .collect();
            if !found.is_empty() {
                return found;
            }
            match level.split_once('.') {
                Some((_, parent)) if parent.contains('.') => level = parent,
                _ => return Vec::new(),
            }
        }
    }
}

/// Every signature of `signers` over `content`, in their order: the text
/// stored with the message after our `Received:`.
pub fn sign_all(signers: &[&DomainSigner], content: &[u8]) -> Result<String, SignError> {
    let mut out = String::new();
    for s in signers {
        out.push_str(&s.sign(content)?);
    }
    Ok(out)
}

/// A signing domain: a host name (letters, digits, hyphens; labels of 1-63
/// characters; 253 at most), lowercased.
pub fn check_domain(domain: &str) -> Result<String, String> {
    let lower = domain.to_ascii_lowercase();
    if lower.is_empty() || lower.len() > 253 || !lower.split('.').all(is_ldh_label) {
        return Err(format!(
            "{domain:?} is not a host name (letters, digits and hyphens in dot-separated \
             labels, no trailing dot)"
        ));
    }
    Ok(lower)
}

/// A selector: one or more DNS labels (RFC 6376 section 3.1).
pub fn check_selector(selector: &str) -> Result<(), String> {
    if selector.is_empty() || selector.len() > 63 * 4 || !selector.split('.').all(is_ldh_label) {
        return Err(format!(
            "{selector:?} is not a selector (DNS labels: letters, digits and hyphens)"
        ));
    }
    Ok(())
}

/// A header name that may be in `headers`.
pub fn check_header(name: &str) -> Result<(), String> {
    let field_name = !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b':');
    if !field_name {
        return Err(format!(
            "{name:?} is not a header name (printable ASCII, no spaces or colon)"
        ));
    }
    if let Some(own) = NEVER_SIGNED.iter().find(|n| n.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "{own} cannot be signed: it is added or rewritten per hop after signing, \
             which would break the signature"
        ));
    }
    Ok(())
}

fn is_ldh_label(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

#[cfg(test)]
#[path = "signer_tests.rs"]
mod tests;
