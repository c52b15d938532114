//! DKIM private keys from PEM files: PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8
//! (`PRIVATE KEY`), RSA of at least 2048 bits or Ed25519. What is wrong with
//! a file is said in words, since `check-config` shows it by key.

use std::fmt;
use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mail_auth::common::crypto::{Algorithm, DkimKey, Ed25519Key, RsaKey, Sha256};
use mail_auth::common::headers::Writable;
use rsa::pkcs8::ObjectIdentifier;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// RFC 8301 section 3.2: signers MUST use RSA keys of at least 1024 bits
/// and SHOULD use 2048; the large mailbox providers treat shorter ones as
/// unsigned, so a shorter key is a mistake worth stopping at.
pub const MIN_RSA_BITS: usize = 2048;

const ED25519_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error(
        "is readable by its group or others (mode {mode:04o}); a signing key is its owner's \
         only (OpenDKIM refuses such keys too): chmod 600 {}",
        path.display()
    )]
    Exposed { mode: u32, path: PathBuf },
    #[error("holds no private key (expected a PEM block PRIVATE KEY or RSA PRIVATE KEY)")]
    NoKey,
    #[error("is not valid PEM: {0}")]
    Pem(String),
    #[error("holds an EC key; DKIM keys are RSA (2048 bits or more) or Ed25519")]
    Ec,
    #[error("holds a PKCS#8 key of another algorithm (OID {0}); DKIM keys are RSA or Ed25519")]
    OtherAlgorithm(String),
    #[error(
        "is an RSA key of {0} bits; DKIM needs at least {MIN_RSA_BITS} \
         (make one with smtp-once dkim-keygen)"
    )]
    TooSmall(usize),
    #[error("is not a usable {what} key: {reason}")]
    Invalid { what: &'static str, reason: String },
}

/// A loaded key, cheap to clone (shared by every message it signs).
#[derive(Clone)]
pub struct SigningKey(Arc<Loaded>);

struct Loaded {
    key: DkimKey,
    /// RSA modulus size; 0 for Ed25519.
    bits: usize,
}

impl SigningKey {
    /// RSA-2048's private-key operation takes about half a millisecond
    /// (ring, release build), so its signatures are made off the async
    /// workers; an Ed25519 signature takes about 20 microseconds.
    pub fn is_rsa(&self) -> bool {
        matches!(self.0.key, DkimKey::Rsa(_))
    }

    /// `rsa-2048` or `ed25519`, for logs.
    pub fn describe(&self) -> String {
        match self.0.key {
            DkimKey::Rsa(_) => format!("rsa-{}", self.0.bits),
            DkimKey::Ed25519(_) => "ed25519".into(),
        }
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key material.
        write!(f, "SigningKey({})", self.describe())
    }
}

impl mail_auth::common::crypto::SigningKey for SigningKey {
    type Hasher = Sha256;

    fn sign(&self, input: impl Writable) -> mail_auth::Result<Vec<u8>> {
        self.0.key.sign(input)
    }

    fn algorithm(&self) -> Algorithm {
        self.0.key.algorithm()
    }
}

/// Reads the private key in the PEM file at `path`, which only its owner
/// may read: a key others can read may have been copied, and whoever has
/// it signs as the domain.
pub fn load(path: &Path) -> Result<SigningKey, SigningKeyError> {
    let file = std::fs::File::open(path).map_err(SigningKeyError::Read)?;
    // The mode of the file opened (a symlink's target), not of the name.
    let mode = file
        .metadata()
        .map_err(SigningKeyError::Read)?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(SigningKeyError::Exposed {
            mode,
            path: path.to_path_buf(),
        });
    }
    let der = PrivateKeyDer::from_pem_reader(BufReader::new(file)).map_err(|e| match e {
        pem::Error::Io(e) => SigningKeyError::Read(e),
        pem::Error::NoItemsFound => SigningKeyError::NoKey,
        other => SigningKeyError::Pem(other.to_string()),
    })?;
    from_der(der)
}

/// The key in `pem` (a file's text), as `load` reads it.
pub fn from_pem(pem: &[u8]) -> Result<SigningKey, SigningKeyError> {
    let der = PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        pem::Error::NoItemsFound => SigningKeyError::NoKey,
        other => SigningKeyError::Pem(other.to_string()),
    })?;
    from_der(der)
}

fn from_der(der: PrivateKeyDer<'_>) -> Result<SigningKey, SigningKeyError> {
    let (key, bits) = match der {
        PrivateKeyDer::Pkcs1(k) => {
            let der = PrivateKeyDer::Pkcs1(k.clone_key());
            rsa_key(k.secret_pkcs1_der(), der)?
        }
        PrivateKeyDer::Pkcs8(k) => pkcs8_key(k)?,
        PrivateKeyDer::Sec1(_) => return Err(SigningKeyError::Ec),
        _ => return Err(SigningKeyError::NoKey),
    };
    Ok(SigningKey(Arc::new(Loaded { key, bits })))
}

fn pkcs8_key(k: PrivatePkcs8KeyDer<'_>) -> Result<(DkimKey, usize), SigningKeyError> {
    let info = rsa::pkcs8::PrivateKeyInfo::try_from(k.secret_pkcs8_der()).map_err(|e| {
        SigningKeyError::Invalid {
            what: "PKCS#8",
            reason: e.to_string(),
        }
    })?;
    let oid = info.algorithm.oid;
    if oid == rsa::pkcs1::ALGORITHM_OID {
        let pkcs1 = info.private_key;
        rsa_key(pkcs1, PrivateKeyDer::Pkcs8(k.clone_key()))
    } else if oid == ED25519_OID {
        // `maybe_unchecked`: OpenSSL writes version 1 files (without the
        // public key), which ring's checked reader refuses.
        let key =
            Ed25519Key::from_pkcs8_maybe_unchecked_der(k.secret_pkcs8_der()).map_err(|e| {
                SigningKeyError::Invalid {
                    what: "Ed25519",
                    reason: e.to_string(),
                }
            })?;
        Ok((DkimKey::Ed25519(key), 0))
    } else {
        Err(SigningKeyError::OtherAlgorithm(oid.to_string()))
    }
}

/// `pkcs1` is the RSAPrivateKey structure, read first for its size so that
/// a short key is named as such (ring would only say it was rejected).
fn rsa_key(pkcs1: &[u8], der: PrivateKeyDer<'_>) -> Result<(DkimKey, usize), SigningKeyError> {
    let invalid = |reason: String| SigningKeyError::Invalid {
        what: "RSA",
        reason,
    };
    let parsed = rsa::pkcs1::RsaPrivateKey::try_from(pkcs1).map_err(|e| invalid(e.to_string()))?;
    let bits = uint_bits(parsed.modulus.as_bytes());
    if bits < MIN_RSA_BITS {
        return Err(SigningKeyError::TooSmall(bits));
    }
    let key = RsaKey::<Sha256>::from_key_der(der).map_err(|e| invalid(e.to_string()))?;
    Ok((DkimKey::Rsa(key), bits))
}

/// Bits of a big-endian unsigned integer without leading zero bytes.
fn uint_bits(bytes: &[u8]) -> usize {
    match bytes.first() {
        None => 0,
        Some(&top) => bytes.len() * 8 - top.leading_zeros() as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_of_a_modulus() {
        assert_eq!(uint_bits(&[]), 0);
        assert_eq!(uint_bits(&[1]), 1);
        assert_eq!(uint_bits(&[0x80, 0]), 16);
        assert_eq!(uint_bits(&[0x7f; 256]), 2047);
    }

    #[test]
    fn garbage_and_other_keys_are_named() {
        let err = |pem: &str| {
            from_pem(pem.as_bytes())
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        assert!(err("not a key at all\n").contains("holds no private key"));
        let ec = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAoAoGCCqGSM49\n-----END EC PRIVATE KEY-----\n";
        assert!(err(ec).contains("EC key"), "{}", err(ec));
        let broken = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
        assert!(
            err(broken).contains("not a usable PKCS#8 key"),
            "{}",
            err(broken)
        );
        let missing = load(Path::new("/nonexistent/dkim.pem"))
            .map(|_| ())
            .unwrap_err();
        assert!(
            missing.to_string().starts_with("cannot read it: "),
            "{missing}"
        );
    }

    /// Issue 20 finding 11: a key file its group or others can read is
    /// refused, with the command that fixes it; 0600 (and 0400) load.
    #[test]
    fn a_key_others_can_read_is_refused() {
        use crate::dkim::keygen::{self, Algorithm};
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("k.pem");
        keygen::write(&keygen::generate(Algorithm::Ed25519).expect("key"), &path).expect("write");
        let chmod = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        for mode in [0o600, 0o400] {
            chmod(mode);
            assert!(load(&path).is_ok(), "{mode:o}");
        }
        for mode in [0o644, 0o640, 0o604, 0o660] {
            chmod(mode);
            let err = load(&path).map(|_| ()).unwrap_err().to_string();
            assert!(
                err.contains(&format!("(mode {mode:04o})"))
                    && err.ends_with(&format!("chmod 600 {}", path.display())),
                "{err}"
            );
        }
    }
}
