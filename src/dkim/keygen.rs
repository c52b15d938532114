//! `smtp-once dkim-keygen`: a new private key in a 0600 PEM file, and the
//! DNS TXT record that publishes its public half.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use mail_auth::dkim::generate::DkimKeyPair;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::EncodePublicKey;

use crate::private_fs;

/// RSA sizes offered: 2048 is what every verifier takes; beyond 4096 the
/// record outgrows many DNS hosting panels and signing slows down sharply.
pub const RSA_BITS: std::ops::RangeInclusive<usize> = 2048..=4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Rsa { bits: usize },
    Ed25519,
}

#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error("RSA keys are 2048 to 4096 bits, not {0}")]
    Bits(usize),
    #[error("cannot make the key: {0}")]
    Generate(String),
    #[error("{path} exists; not overwritten (remove it or choose another --out)")]
    Exists { path: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the key written to {path} does not load back: {reason}")]
    SelfCheck { path: String, reason: String },
}

/// A new key pair: the private key's PEM text and the TXT record's value.
pub struct NewKey {
    pub pem: String,
    /// `v=DKIM1; k=...; p=...`
    pub record: String,
}

pub fn generate(algorithm: Algorithm) -> Result<NewKey, KeygenError> {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let failed = |e: &dyn std::fmt::Display| KeygenError::Generate(e.to_string());
    match algorithm {
        Algorithm::Rsa { bits } => {
            if !RSA_BITS.contains(&bits) {
                return Err(KeygenError::Bits(bits));
            }
            let pair = DkimKeyPair::generate_rsa(bits).map_err(|e| failed(&e))?;
            // mail-auth gives PKCS#1; DNS records carry the
            // SubjectPublicKeyInfo (what OpenDKIM and most tools publish).
            let spki = rsa::RsaPublicKey::from_pkcs1_der(pair.public_key())
                .and_then(|k| {
                    k.to_public_key_der()
                        .map_err(|e| rsa::pkcs1::Error::Pkcs8(e.into()))
                })
                .map_err(|e| failed(&e))?;
            Ok(NewKey {
                pem: pem("RSA PRIVATE KEY", pair.private_key()),
                record: format!("v=DKIM1; k=rsa; p={}", b64(spki.as_bytes())),
            })
        }
        Algorithm::Ed25519 => {
            let pair = DkimKeyPair::generate_ed25519().map_err(|e| failed(&e))?;
            let v1 = pkcs8_v1(pair.private_key()).map_err(|e| failed(&e))?;
            // RFC 8463: the bare 32-byte public key.
            Ok(NewKey {
                pem: pem("PRIVATE KEY", &v1),
                record: format!("v=DKIM1; k=ed25519; p={}", b64(pair.public_key())),
            })
        }
    }
}

/// Writes `key` to a new 0600 file at `path` (never over an existing one)
/// and checks that it loads back as a signing key.
pub fn write(key: &NewKey, path: &Path) -> Result<(), KeygenError> {
    let shown = path.display().to_string();
    let mut file = private_fs::create_new_file(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            KeygenError::Exists {
                path: shown.clone(),
            }
        } else {
            KeygenError::Write {
                path: shown.clone(),
                source,
            }
        }
    })?;
    file.write_all(key.pem.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| KeygenError::Write {
            path: shown.clone(),
            source,
        })?;
    super::key::load(path)
        .map(|_| ())
        .map_err(|e| KeygenError::SelfCheck {
            path: shown,
            reason: e.to_string(),
        })
}

/// The record as a zone-file line: `selector._domainkey.domain.`, the
/// value cut into quoted strings of at most 255 characters (a TXT string's
/// limit; resolvers join them).
pub fn zone_record(domain: &str, selector: &str, value: &str) -> String {
    let strings: Vec<String> = value
        .as_bytes()
        .chunks(255)
        .map(|c| format!("\"{}\"", String::from_utf8_lossy(c)))
        .collect();
    format!(
        "{selector}._domainkey.{domain}. IN TXT ( {} )",
        strings.join("\n    ")
    )
}

/// ring writes PKCS#8 version 2 (the public key included), which OpenSSL 3
/// does not read; other tools (OpenDKIM, rspamd) take keys through it, so
/// the file is the version 1 form that `openssl genpkey` writes.
fn pkcs8_v1(v2: &[u8]) -> Result<Vec<u8>, rsa::pkcs8::Error> {
    use rsa::pkcs8::der::Encode;
    let info = rsa::pkcs8::PrivateKeyInfo::try_from(v2)?;
    Ok(rsa::pkcs8::PrivateKeyInfo::new(info.algorithm, info.private_key).to_der()?)
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_records_are_cut_into_strings_of_255() {
        let value = format!("v=DKIM1; k=rsa; p={}", "A".repeat(400));
        let line = zone_record("example.test", "s1", &value);
        assert!(
            line.starts_with("s1._domainkey.example.test. IN TXT ( \""),
            "{line}"
        );
        let strings: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        assert_eq!(strings.len(), 2, "{line}");
        assert_eq!(strings[0].len(), 255);
        assert_eq!(strings.concat(), value);
    }

    #[test]
    fn ed25519_keys_load_back_and_publish_32_bytes() {
        let key = generate(Algorithm::Ed25519).expect("key");
        assert!(key.pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let loaded = super::super::key::from_pem(key.pem.as_bytes()).expect("loads");
        assert_eq!(loaded.describe(), "ed25519");
        let p = key
            .record
            .strip_prefix("v=DKIM1; k=ed25519; p=")
            .expect("p=");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(p)
            .expect("base64");
        assert_eq!(raw.len(), 32);
    }

    #[test]
    fn rsa_records_carry_the_subject_public_key_info() {
        let key = generate(Algorithm::Rsa { bits: 2048 }).expect("key");
        let loaded = super::super::key::from_pem(key.pem.as_bytes()).expect("loads");
        assert_eq!(loaded.describe(), "rsa-2048");
        let p = key.record.strip_prefix("v=DKIM1; k=rsa; p=").expect("p=");
        let der = base64::engine::general_purpose::STANDARD
            .decode(p)
            .expect("base64");
        use rsa::pkcs8::DecodePublicKey;
        let public = rsa::RsaPublicKey::from_public_key_der(&der).expect("SPKI");
        use rsa::traits::PublicKeyParts;
        assert_eq!(public.size() * 8, 2048);
        assert!(matches!(
            generate(Algorithm::Rsa { bits: 1024 }),
            Err(KeygenError::Bits(1024))
        ));
    }
}
