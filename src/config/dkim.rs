//! `[[dkim]]`: the keys that sign accepted mail, chosen by the `From:`
//! domain. Each key file is loaded here, so `check-config` reports a
//! missing, unreadable or too short key by its entry.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Problems, check_label, resolve};
use crate::dkim::{self, DomainSigner};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDkim {
    /// The `d=` domain; signs mail whose `From:` is this domain or below it.
    pub domain: String,
    /// The `s=` selector: the key's DNS record is `<selector>._domainkey.<domain>`.
    pub selector: String,
    /// PEM file (PKCS#1 or PKCS#8): RSA of 2048 bits or more, or Ed25519.
    pub private_key: PathBuf,
    /// Headers to sign (default: `dkim::signer::DEFAULT_HEADERS`); `From`
    /// is always signed.
    pub headers: Option<Vec<String>>,
    /// Only this workspace's mail (default: every workspace).
    pub workspace: Option<String>,
}

pub(super) fn validate_dkim(raw: &[RawDkim], base: &Path, p: &mut Problems) -> Vec<DomainSigner> {
    let mut pairs = HashSet::new();
    let mut out = Vec::new();
    for (i, d) in raw.iter().enumerate() {
        let key = |field: &str| format!("dkim[{i}].{field}");
        let domain = dkim::signer::check_domain(&d.domain)
            .map_err(|e| p.add(key("domain"), e))
            .ok();
        let selector_ok = dkim::signer::check_selector(&d.selector)
            .map_err(|e| p.add(key("selector"), e))
            .is_ok();
        if let Some(domain) = &domain
            && selector_ok
            && !pairs.insert((domain.clone(), d.selector.to_ascii_lowercase()))
        {
            p.add(
                key("selector"),
                format!(
                    "{domain}/{} is used by another [[dkim]] entry (one DNS record, one key)",
                    d.selector
                ),
            );
        }
        let mut headers_ok = true;
        for (j, name) in d.headers.iter().flatten().enumerate() {
            if let Err(e) = dkim::signer::check_header(name) {
                p.add(format!("dkim[{i}].headers[{j}]"), e);
                headers_ok = false;
            }
        }
        if let Some(w) = &d.workspace
            && let Err(e) = check_label(w)
        {
            p.add(key("workspace"), e);
        }
        let path = resolve(base, &d.private_key);
        let signing_key = dkim::key::load(&path)
            .map_err(|e| p.add(key("private_key"), format!("{}: {e}", path.display())))
            .ok();
        if let (Some(domain), true, true, Some(signing_key)) =
            (domain, selector_ok, headers_ok, signing_key)
        {
            out.push(DomainSigner::new(
                &domain,
                &d.selector,
                signing_key,
                d.headers.as_deref(),
                d.workspace.as_deref(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ConfigError};
    use crate::dkim::keygen::{self, Algorithm};
    use std::path::Path;

    const BASE: &str = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                        [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";

    fn load(dir: &Path, extra: &str) -> Result<Config, ConfigError> {
        Config::from_toml(&dir.join("smtp-once.toml"), &format!("{BASE}{extra}"))
    }

    #[test]
    fn keys_load_relative_to_the_config_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let key = keygen::generate(Algorithm::Ed25519).expect("key");
        keygen::write(&key, &dir.path().join("ed.pem")).expect("write");
        let config = load(
            dir.path(),
            "[[dkim]]\ndomain = \"Example.TEST\"\nselector = \"ed\"\nprivate_key = \"ed.pem\"\nworkspace = \"w\"\n",
        )
        .map_err(|e| e.to_string())
        .expect("valid");
        let [entry] = config.dkim.as_slice() else {
            panic!("{:?}", config.dkim);
        };
        assert_eq!(entry.label(), "example.test/ed");
        assert_eq!(entry.key().describe(), "ed25519");
    }

    #[test]
    fn problems_are_reported_by_key() {
        let dir = tempfile::tempdir().expect("tmp");
        let key = keygen::generate(Algorithm::Ed25519).expect("key");
        keygen::write(&key, &dir.path().join("ed.pem")).expect("write");
        std::fs::write(dir.path().join("junk.pem"), "junk\n").expect("write");
        let entry = |domain: &str, selector: &str, file: &str, extra: &str| {
            format!(
                "[[dkim]]\ndomain = \"{domain}\"\nselector = \"{selector}\"\nprivate_key = \"{file}\"\n{extra}"
            )
        };
        let text = [
            entry("example.test", "s1", "ed.pem", ""),
            entry("EXAMPLE.test", "s1", "ed.pem", ""),
            entry("bad_domain.", "s 2", "missing.pem", ""),
            entry("example.test", "s3", "junk.pem", ""),
            entry(
                "example.test",
                "s4",
                "ed.pem",
                "headers = [\"Subject\", \"X-Bird-Idempotency-Key\"]\nworkspace = \"a b\"\n",
            ),
        ]
        .concat();
        let err = load(dir.path(), &text).map(|_| ()).unwrap_err().to_string();
        let missing = dir.path().join("missing.pem");
        let junk = dir.path().join("junk.pem");
        for needle in [
            "dkim[1].selector: example.test/s1 is used by another [[dkim]] entry".to_owned(),
            "dkim[2].domain: \"bad_domain.\" is not a host name".to_owned(),
            "dkim[2].selector: \"s 2\" is not a selector".to_owned(),
            format!(
                "dkim[2].private_key: {}: cannot read it: ",
                missing.display()
            ),
            format!(
                "dkim[3].private_key: {}: holds no private key",
                junk.display()
            ),
            "dkim[4].headers[1]: X-Bird-Idempotency-Key cannot be signed".to_owned(),
            "dkim[4].workspace: \"a b\" must not contain".to_owned(),
        ] {
            assert!(err.contains(&needle), "{needle:?} missing from {err}");
        }
        assert!(!err.contains("dkim[0]"), "{err}");
    }
}
