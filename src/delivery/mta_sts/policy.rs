//! MTA-STS texts (RFC 8461): the `_mta-sts` TXT record and the policy
//! file, parsed strictly; and which MX host names a policy allows.

use serde::{Deserialize, Serialize};

/// RFC 8461 3.2: a policy is kept at most a year.
pub const MAX_MAX_AGE: u64 = 31_557_600;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Only matching MX hosts, over verified TLS; never plaintext.
    Enforce,
    /// Deliver as without a policy, and report what enforce would refuse.
    Testing,
    /// The domain has withdrawn its policy.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub mode: Mode,
    /// `mail.example.com` or `*.example.com`, lowercase.
    pub mx: Vec<String>,
    /// Seconds the policy may be cached.
    pub max_age: u64,
}

impl Policy {
    /// RFC 8461 4.1: a pattern matches the host exactly, or (`*.`) one
    /// leftmost label of it; case does not count, a trailing dot neither.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.mx.iter().any(|p| match p.strip_prefix("*.") {
            Some(suffix) => host
                .split_once('.')
                .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
            None => *p == host,
        })
    }

    /// The policy as its lines (RFC 8460 4.4 `policy-string`).
    pub fn lines(&self) -> Vec<String> {
        let mode = match self.mode {
            Mode::Enforce => "enforce",
            Mode::Testing => "testing",
            Mode::None => "none",
        };
        let mut lines = vec!["version: STSv1".to_owned(), format!("mode: {mode}")];
        lines.extend(self.mx.iter().map(|m| format!("mx: {m}")));
        lines.push(format!("max_age: {}", self.max_age));
        lines
    }

    pub fn patterns(&self) -> String {
        self.mx.join(", ")
    }
}

/// The policy id of the domain's `_mta-sts` TXT records, `None` when it
/// publishes no valid one (RFC 8461 3.1: records not starting `v=STSv1`
/// are ignored; anything but exactly one valid record means no policy).
pub fn txt_id(records: &[String]) -> Option<String> {
    let sts: Vec<&String> = records
        .iter()
        .filter(|r| r.trim_start().starts_with("v=STSv1"))
        .collect();
    let [record] = sts[..] else { return None };
    let mut id = None;
    for field in record.split(';') {
        let field = field.trim();
        if let Some(value) = field.strip_prefix("id=") {
            let ok =
                (1..=32).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_alphanumeric());
            if !ok {
                return None;
            }
            id = Some(value.to_owned());
        }
    }
    id
}

/// The policy file (RFC 8461 3.2): `key: value` lines, CRLF or LF.
pub fn parse(text: &str) -> Result<Policy, String> {
    let (mut version, mut mode, mut max_age, mut mx) = (None, None, None, Vec::new());
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!("not a key: value line: {:.60?}", line));
        };
        let value = value.trim();
        match key.trim() {
            "version" => version = Some(value.to_owned()),
            "mode" => {
                mode = Some(match value {
                    "enforce" => Mode::Enforce,
                    "testing" => Mode::Testing,
                    "none" => Mode::None,
                    other => {
                        return Err(format!("mode {other:.20?} is not enforce, testing or none"));
                    }
                })
            }
            "max_age" => {
                let age = value
                    .parse::<u64>()
                    .ok()
                    .filter(|_| value.len() <= 10)
                    .ok_or_else(|| format!("max_age {value:.20?} is not a number of seconds"))?;
                max_age = Some(age.min(MAX_MAX_AGE));
            }
            "mx" => {
                let p = value.trim_end_matches('.').to_ascii_lowercase();
                let name = p.strip_prefix("*.").unwrap_or(&p);
                let ok = !name.is_empty()
                    && name.len() <= 253
                    && name.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    });
                if !ok {
                    return Err(format!("mx {value:.60?} is not a host name pattern"));
                }
                if mx.len() < 64 && !mx.contains(&p) {
                    mx.push(p);
                }
            }
            // RFC 8461 3.2: unknown keys are ignored.
            _ => {}
        }
    }
    if version.as_deref() != Some("STSv1") {
        return Err("version is not STSv1".into());
    }
    let mode = mode.ok_or("no mode")?;
    let max_age = max_age.ok_or("no max_age")?;
    if mode != Mode::None && mx.is_empty() {
        return Err("no mx".into());
    }
    Ok(Policy { mode, mx, max_age })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_parsed_strictly() {
        let p = parse("version: STSv1\r\nmode: enforce\r\nmx: mail.example.com\r\nmx: *.Example.net.\r\nmax_age: 86400\r\n")
            .expect("valid");
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.mx, ["mail.example.com", "*.example.net"]);
        assert_eq!(p.max_age, 86400);
        assert!(parse("version: STSv1\nmode: testing\nmx: a.b\nmax_age: 99999999999\n").is_err());
        assert_eq!(
            parse("version: STSv1\nmode: testing\nmx: a.b\nmax_age: 999999999\n")
                .map(|p| p.max_age),
            Ok(MAX_MAX_AGE)
        );
        for bad in [
            "",
            "mode: enforce\nmx: a.b\nmax_age: 1\n",
            "version: STSv2\nmode: enforce\nmx: a.b\nmax_age: 1\n",
            "version: STSv1\nmode: strict\nmx: a.b\nmax_age: 1\n",
            "version: STSv1\nmode: enforce\nmax_age: 1\n",
            "version: STSv1\nmode: enforce\nmx: a b\nmax_age: 1\n",
            "version: STSv1\nmode: enforce\nmx: a.b\nmax_age: -1\n",
            "<html>not a policy</html>",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse("version: STSv1\nmode: none\nmax_age: 5\n").map(|p| p.mode),
            Ok(Mode::None)
        );
    }

    #[test]
    fn patterns_match_one_label_at_most() {
        let p = Policy {
            mode: Mode::Enforce,
            mx: vec!["mail.example.com".into(), "*.example.net".into()],
            max_age: 1,
        };
        for ok in ["mail.example.com", "MAIL.example.com.", "mx1.example.net"] {
            assert!(p.allows(ok), "{ok}");
        }
        for no in [
            "example.net",
            "a.b.example.net",
            "evil.com",
            "mail.example.com.evil",
            "xmail.example.com",
        ] {
            assert!(!p.allows(no), "{no}");
        }
    }

    #[test]
    fn exactly_one_valid_record_gives_an_id() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            txt_id(&s(&["v=STSv1; id=20261207T1;"])),
            Some("20261207T1".into())
        );
        assert_eq!(
            txt_id(&s(&["other", "v=STSv1; id=abc"])),
            Some("abc".into())
        );
        assert_eq!(txt_id(&s(&["v=STSv1; id=a", "v=STSv1; id=b"])), None);
        assert_eq!(txt_id(&s(&["v=STSv1; id=not-alnum"])), None);
        assert_eq!(txt_id(&s(&["v=STSv1;"])), None);
        assert_eq!(
            txt_id(&s(&[&format!("v=STSv1; id={}", "a".repeat(33))])),
            None
        );
    }
}
