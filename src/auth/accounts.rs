//! Who a message is submitted as: an account, or a trusted network.

use std::sync::Arc;

use super::SenderPattern;
use crate::address::ReversePath;

/// The identity a message is submitted under; its workspace scopes
/// idempotency keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitter {
    Account(Arc<Account>),
    TrustedNetwork { workspace: String },
}

impl Submitter {
    pub fn workspace(&self) -> &str {
        match self {
            Submitter::Account(a) => &a.workspace,
            Submitter::TrustedNetwork { workspace } => workspace,
        }
    }

    /// How the account is named in logs and the `Received:` header.
    pub fn name(&self) -> &str {
        match self {
            Submitter::Account(a) => &a.name,
            Submitter::TrustedNetwork { .. } => "(trusted network)",
        }
    }

    pub fn is_authenticated(&self) -> bool {
        matches!(self, Submitter::Account(_))
    }

    pub fn may_send_as(&self, address: &str) -> bool {
        match self {
            Submitter::Account(a) => a.may_send_as(address),
            Submitter::TrustedNetwork { .. } => true,
        }
    }

    /// The envelope sender check: see [`SenderPattern::matches_path`].
    pub fn may_send_as_path(&self, path: &ReversePath) -> bool {
        match self {
            Submitter::Account(a) => a.may_send_as_path(path),
            Submitter::TrustedNetwork { .. } => true,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub workspace: String,
    pub allowed_senders: Option<Vec<SenderPattern>>,
}

impl Account {
    pub fn may_send_as(&self, address: &str) -> bool {
        match &self.allowed_senders {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches(address)),
        }
    }

    pub fn may_send_as_path(&self, path: &ReversePath) -> bool {
        match &self.allowed_senders {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches_path(path)),
        }
    }
}
