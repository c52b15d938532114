//! `allowed_senders` patterns: which sender addresses an account may use.

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
