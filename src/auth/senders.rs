//! `allowed_senders` patterns: which sender addresses an account may use.

use crate::address::ReversePath;

/// A sender address pattern: `*` matches any run of characters, compared
/// case-insensitively (`*@example.test`, `billing@acme.test`, `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderPattern(String);

impl SenderPattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let p = pattern.trim();
        let valid = p == "*" || (p.matches('@').count() == 1 && !p.ends_with('@'));
        if p.is_empty() || !valid || p.contains(char::is_whitespace) {
            return Err(format!(
                "{pattern:?} is not a sender pattern like \"*@example.test\" or \"*\""
            ));
        }
        Ok(Self(p.to_ascii_lowercase()))
    }

    pub fn matches(&self, address: &str) -> bool {
        glob_match(self.0.as_bytes(), address.to_ascii_lowercase().as_bytes())
    }

    /// An envelope sender, split at its real `@` (the one outside quotes):
    /// the pattern's domain must match the domain as written, and its local
    /// part the local part's value (`"a@b> x"@d` has the value `a@b> x` and
    /// the domain `d`; `"bob"@d` is `bob@d`). Both ignore ASCII case. So a
    /// quoted local part can never move an address into another domain.
    ///
    /// The null reverse-path `<>` (bounces, DSNs, read receipts: what a
    /// Postfix in front sends when it gives up on a message) names no
    /// sender to impersonate, so every pattern allows it; the `From:`
    /// header is still checked against the patterns on its own.
    pub fn matches_path(&self, path: &ReversePath) -> bool {
        let ReversePath::Mailbox(address) = path else {
            return true;
        };
        let Some((local, domain)) = self.0.split_once('@') else {
            // `*`: any sender.
            return glob_match(self.0.as_bytes(), address.as_smtp().as_bytes());
        };
        glob_match(
            domain.as_bytes(),
            address.domain().to_ascii_lowercase().as_bytes(),
        ) && glob_match(
            local.as_bytes(),
            address.local_value().to_ascii_lowercase().as_bytes(),
        )
    }
}

/// Iterative `*` glob: linear backtracking to the last star.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_senders_match_by_domain_and_local_value() {
        let path = |t: &str| ReversePath::parse(t).expect(t);
        let any_in = SenderPattern::parse("*@Example.test").unwrap();
        assert!(any_in.matches_path(&path("alice@EXAMPLE.test")));
        // Quoted, it stays a mailbox in example.test whatever it contains.
        assert!(any_in.matches_path(&path("\"ceo@victim.test> ENVID=x\"@example.test")));
        assert!(!any_in.matches_path(&path("\"x@example.test\"@victim.test")));
        assert!(!any_in.matches_path(&path("a@example.test.victim.test")));
        // Issue 21 item 1: a bounce's null reverse-path is allowed.
        assert!(any_in.matches_path(&ReversePath::Null));
        assert!(!any_in.matches_path(&path("a@[127.0.0.1]")));
        let exact = SenderPattern::parse("billing@acme.test").unwrap();
        assert!(exact.matches_path(&path("Billing@acme.test")));
        assert!(exact.matches_path(&path("\"billing\"@acme.test")));
        assert!(!exact.matches_path(&path("\"billing@acme.test\"@evil.test")));
        assert!(!exact.matches_path(&path("\"billing x\"@acme.test")));
        let star = SenderPattern::parse("*").unwrap();
        assert!(star.matches_path(&ReversePath::Null));
        assert!(star.matches_path(&path("\"a b\"@c.test")));
    }

    #[test]
    fn sender_patterns() {
        let p = SenderPattern::parse("*@Example.test").unwrap();
        assert!(p.matches("alice@example.test"));
        assert!(p.matches("ALICE@EXAMPLE.TEST"));
        assert!(!p.matches("alice@example.test.evil"));
        assert!(!p.matches("alice@other.test"));
        let exact = SenderPattern::parse("billing@acme.test").unwrap();
        assert!(exact.matches("billing@acme.test"));
        assert!(!exact.matches("xbilling@acme.test"));
        assert!(SenderPattern::parse("*").unwrap().matches(""));
        assert!(SenderPattern::parse("@@").is_err());
        assert!(SenderPattern::parse("").is_err());
    }
}
