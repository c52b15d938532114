//! `[[dkim]]`: the keys that sign accepted mail, chosen by the `From:`
//! domain. Each key file is loaded here, so `check-config` reports a
//! missing, unreadable, exposed or too short key by its entry.
//!
//! A key signs for the workspaces it is bound to. With several workspaces
//! an unbound key is refused: it would sign any workspace's mail that uses
//! its domain in `From:` (an account without `allowed_senders` may), so one
//! tenant's mail would pass DMARC as another tenant's domain.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::problems::Problems;
use super::resolve;
use super::users::check_label;
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
    /// Only this workspace's mail. Required (or `workspaces`) when the
    /// config has more than one workspace.
    pub workspace: Option<String>,
    /// Only these workspaces' mail (instead of `workspace`).
    pub workspaces: Option<Vec<String>>,
}

/// `workspaces`: every workspace of the config's `[[user]]` and
/// `[[trusted_network]]` entries.
pub(super) fn check(
    raw: &[RawDkim],
    base: &Path,
    workspaces: &BTreeSet<&str>,
    p: &mut Problems,
) -> Vec<DomainSigner> {
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
        let bound = bound_workspaces(d, workspaces, &key, p);
        let path = resolve(base, &d.private_key);
        let signing_key = dkim::key::load(&path)
            .map_err(|e| p.add(key("private_key"), format!("{}: {e}", path.display())))
            .ok();
        if let (Some(domain), true, true, Some(signing_key), Some(bound)) =
            (domain, selector_ok, headers_ok, signing_key, bound)
        {
            out.push(DomainSigner::new(
                &domain,
                &d.selector,
                signing_key,
                d.headers.as_deref(),
                &bound,
            ));
        }
    }
    out
}

/// A key header is removed from the relayed copy (only
/// X-Bird-Idempotency-Key goes on): a signature over one would break.
/// X-Bird-Idempotency-Key itself is refused by the signer's own check.
pub(super) fn check_unsigned_key_headers(
    dkim: &[RawDkim],
    key_headers: &[String],
    p: &mut Problems,
) {
    for (i, d) in dkim.iter().enumerate() {
        for (j, h) in d.headers.iter().flatten().enumerate() {
            let is_key = key_headers.iter().any(|k| k.eq_ignore_ascii_case(h));
            if is_key && !h.eq_ignore_ascii_case("X-Bird-Idempotency-Key") {
                p.add(
                    format!("dkim[{i}].headers[{j}]"),
                    format!(
                        "{h} cannot be signed: it is in [idempotency] key_headers, \
                         so the relayed copy leaves it out"
                    ),
                );
            }
        }
    }
}

/// The workspaces entry `d` signs for (empty: every one, allowed only when
/// the config has a single workspace); `None` after a problem.
fn bound_workspaces(
    d: &RawDkim,
    known: &BTreeSet<&str>,
    key: &dyn Fn(&str) -> String,
    p: &mut Problems,
) -> Option<Vec<String>> {
    let (field, names): (&str, Vec<String>) = match (&d.workspace, &d.workspaces) {
        (Some(_), Some(_)) => {
            p.add(key("workspaces"), "set workspace or workspaces, not both");
            return None;
        }
        (Some(w), None) => ("workspace", vec![w.clone()]),
        (None, Some(list)) if list.is_empty() => {
            p.add(
                key("workspaces"),
                "names no workspace (leave it out only when the config has one workspace)",
            );
            return None;
        }
        (None, Some(list)) => ("workspaces", list.clone()),
        (None, None) if known.len() > 1 => {
            let listed: Vec<&str> = known.iter().copied().collect();
            p.add(
                key("workspace"),
                format!(
                    "missing: the config has several workspaces ({}), and a key bound to none \
                     signs the mail of each of them whose From: is in {}; add \
                     workspace = \"<the workspace that owns {}>\" (or workspaces = [...]) \
                     to this [[dkim]] entry",
                    listed.join(", "),
                    d.domain,
                    d.domain
                ),
            );
            return None;
        }
        (None, None) => return Some(Vec::new()),
    };
    let mut ok = true;
    for (j, w) in names.iter().enumerate() {
        let at = if field == "workspace" {
            key(field)
        } else {
            format!("{}[{j}]", key(field))
        };
        if let Err(e) = check_label(w) {
            p.add(at, e);
            ok = false;
        } else if !known.contains(w.as_str()) {
            let listed: Vec<&str> = known.iter().copied().collect();
            p.add(
                at,
                format!(
                    "{w:?} is no workspace of a [[user]] or [[trusted_network]] (workspaces: {})",
                    listed.join(", ")
                ),
            );
            ok = false;
        }
    }
    ok.then_some(names)
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
        std::fs::set_permissions(
            dir.path().join("junk.pem"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
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

    /// Issue 20 finding 7: with two workspaces a key must say whose mail
    /// it signs, by a workspace the config has.
    #[test]
    fn with_several_workspaces_a_key_is_bound() {
        let dir = tempfile::tempdir().expect("tmp");
        let key = keygen::generate(Algorithm::Ed25519).expect("key");
        keygen::write(&key, &dir.path().join("ed.pem")).expect("write");
        let second = "[[trusted_network]]\ncidr = \"10.0.0.1\"\nworkspace = \"v\"\n";
        let entry = |extra: &str| {
            format!(
                "{second}[[dkim]]\ndomain = \"a.test\"\nselector = \"s\"\nprivate_key = \"ed.pem\"\n{extra}"
            )
        };
        let err = |extra: &str| {
            load(dir.path(), &entry(extra))
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let unbound = err("");
        assert!(
            unbound
                .contains("dkim[0].workspace: missing: the config has several workspaces (v, w)")
                && unbound.contains("add workspace = \"<the workspace that owns a.test>\""),
            "{unbound}"
        );
        assert!(
            err("workspace = \"x\"\n")
                .contains("dkim[0].workspace: \"x\" is no workspace of a [[user]] or [[trusted_network]] (workspaces: v, w)")
        );
        assert!(
            err("workspaces = [\"w\", \"y\"]\n")
                .contains("dkim[0].workspaces[1]: \"y\" is no workspace")
        );
        assert!(err("workspaces = []\n").contains("dkim[0].workspaces: names no workspace"));
        assert!(
            err("workspace = \"w\"\nworkspaces = [\"v\"]\n")
                .contains("dkim[0].workspaces: set workspace or workspaces, not both")
        );
        for ok in ["workspace = \"w\"\n", "workspaces = [\"v\", \"w\"]\n"] {
            load(dir.path(), &entry(ok))
                .map_err(|e| e.to_string())
                .expect(ok);
        }
        // One workspace: an unbound key can only serve it.
        load(
            dir.path(),
            "[[dkim]]\ndomain = \"a.test\"\nselector = \"s\"\nprivate_key = \"ed.pem\"\n",
        )
        .map_err(|e| e.to_string())
        .expect("one workspace");
    }
}
