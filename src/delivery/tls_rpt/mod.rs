//! TLS-RPT (RFC 8460): what every session to a domain with a TLS policy
//! (DANE or MTA-STS) came to, counted per policy, MX host and failure, and
//! sent once a day ([`reporter`]) to the addresses the domain publishes in
//! its `_smtp._tls` TXT record ([`report`]).
//!
//! Bounded: at most [`MAX_DOMAINS`] domains and [`MAX_DETAILS`] failure
//! lines a domain between two reports; beyond, sessions are still counted
//! in the totals, their details dropped.

pub mod report;
pub mod reporter;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub const MAX_DOMAINS: usize = 10_000;
pub const MAX_DETAILS: usize = 100;

/// RFC 8460 4.4 `policy-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyType {
    #[serde(rename = "tlsa")]
    Tlsa,
    #[serde(rename = "sts")]
    Sts,
}

impl PolicyType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tlsa => "tlsa",
            Self::Sts => "sts",
        }
    }
}

/// The policy a session ran under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub kind: PolicyType,
    /// The TLSA records or the MTA-STS policy's lines, as published.
    pub strings: Vec<String>,
}

/// One failed session (RFC 8460 4.3 `result-type`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    pub result_type: String,
    pub mx_host: String,
    pub ip: Option<IpAddr>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    pub successes: u64,
    pub failures: u64,
    pub details: Vec<(Failure, u64)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DomainCounts {
    /// Per policy type: the policy's strings (the latest seen) and counts.
    pub policies: Vec<(PolicyType, Vec<String>, Counts)>,
}

/// Sessions counted since the last report.
#[derive(Default)]
pub struct Collector {
    counts: Mutex<HashMap<String, DomainCounts>>,
}

/// The RFC 8460 4.3 result type of a failed handshake or STARTTLS, from
/// the policy it ran under and the error's words.
pub fn result_type(policy: PolicyType, error: &str) -> &'static str {
    let e = error.to_ascii_lowercase();
    if e.contains("starttls required but not offered") || e.contains("not offered") {
        "starttls-not-supported"
    } else if policy == PolicyType::Tlsa {
        "validation-failure"
    } else if e.contains("notvalidforname") || e.contains("not valid for name") {
        "certificate-host-mismatch"
    } else if e.contains("expired") {
        "certificate-expired"
    } else if e.contains("unknownissuer") || e.contains("unknown issuer") {
        "certificate-not-trusted"
    } else {
        "validation-failure"
    }
}

impl Collector {
    pub fn success(&self, domain: &str, policy: &Policy) {
        self.with(domain, policy, |c| c.successes += 1);
    }

    pub fn failure(&self, domain: &str, policy: &Policy, failure: Failure) {
        self.with(domain, policy, |c| {
            c.failures += 1;
            if let Some((_, n)) = c.details.iter_mut().find(|(f, _)| *f == failure) {
                *n += 1;
            } else if c.details.len() < MAX_DETAILS {
                c.details.push((failure, 1));
            }
        });
    }

    fn with(&self, domain: &str, policy: &Policy, f: impl FnOnce(&mut Counts)) {
        let Ok(mut all) = self.counts.lock() else {
            return;
        };
        if !all.contains_key(domain) && all.len() >= MAX_DOMAINS {
            return;
        }
        let d = all.entry(domain.to_ascii_lowercase()).or_default();
        let i = match d.policies.iter().position(|(k, ..)| *k == policy.kind) {
            Some(i) => i,
            None => {
                d.policies
                    .push((policy.kind, policy.strings.clone(), Counts::default()));
                d.policies.len() - 1
            }
        };
        if let Some((_, strings, counts)) = d.policies.get_mut(i) {
            strings.clone_from(&policy.strings);
            f(counts);
        }
    }

    /// Everything counted so far, and a fresh start.
    pub fn take(&self) -> HashMap<String, DomainCounts> {
        self.counts
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }

    /// Counts handed back (a report that could not be sent yet).
    pub fn restore(&self, domain: String, counts: DomainCounts) {
        if let Ok(mut all) = self.counts.lock() {
            all.entry(domain).or_insert(counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_counted_per_policy_and_failure_and_bounded() {
        let c = Collector::default();
        let sts = Policy {
            kind: PolicyType::Sts,
            strings: vec!["version: STSv1".into()],
        };
        c.success("Example.test", &sts);
        let f = |host: &str| Failure {
            result_type: "starttls-not-supported".into(),
            mx_host: host.into(),
            ip: None,
        };
        c.failure("example.test", &sts, f("mx1"));
        c.failure("example.test", &sts, f("mx1"));
        for i in 0..(MAX_DETAILS + 10) {
            c.failure("example.test", &sts, f(&format!("mx-{i}")));
        }
        let all = c.take();
        let (kind, _, counts) = &all["example.test"].policies[0];
        assert_eq!(*kind, PolicyType::Sts);
        assert_eq!(counts.successes, 1);
        assert_eq!(counts.failures, 2 + MAX_DETAILS as u64 + 10);
        assert_eq!(counts.details.len(), MAX_DETAILS);
        assert_eq!(counts.details[0].1, 2);
        assert!(c.take().is_empty());
    }

    #[test]
    fn result_types_follow_rfc_8460() {
        assert_eq!(
            result_type(PolicyType::Sts, "STARTTLS required but not offered"),
            "starttls-not-supported"
        );
        assert_eq!(
            result_type(PolicyType::Sts, "invalid peer certificate: NotValidForName"),
            "certificate-host-mismatch"
        );
        assert_eq!(
            result_type(PolicyType::Sts, "invalid peer certificate: UnknownIssuer"),
            "certificate-not-trusted"
        );
        assert_eq!(
            result_type(PolicyType::Tlsa, "DANE: no TLSA record matches"),
            "validation-failure"
        );
    }
}
