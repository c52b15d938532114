//! The key makers: `dkim-keygen` (a signing key and the DNS record to
//! publish), `hash-password` (an account's argon2id PHC string) and
//! `new-api-key` (an API token and the hash the config keeps).

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

/// `dkim-keygen --algorithm`: RSA for every verifier, Ed25519 (RFC 8463)
/// as a second signature beside it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    Rsa,
    Ed25519,
}

pub(super) fn dkim_keygen(
    domain: &str,
    selector: &str,
    algorithm: KeyAlgorithm,
    bits: Option<usize>,
    out: Option<PathBuf>,
) -> Result<(), String> {
    use crate::dkim::keygen::{self, Algorithm};
    let domain = crate::dkim::signer::check_domain(domain).map_err(|e| format!("--domain {e}"))?;
    crate::dkim::signer::check_selector(selector).map_err(|e| format!("--selector {e}"))?;
    let algorithm = match (algorithm, bits) {
        (KeyAlgorithm::Rsa, bits) => Algorithm::Rsa {
            bits: bits.unwrap_or(2048),
        },
        (KeyAlgorithm::Ed25519, None) => Algorithm::Ed25519,
        (KeyAlgorithm::Ed25519, Some(_)) => {
            return Err("--bits is for RSA keys; Ed25519 keys have one size".into());
        }
    };
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{selector}.{domain}.pem")));
    let key = keygen::generate(algorithm).map_err(|e| e.to_string())?;
    keygen::write(&key, &out).map_err(|e| e.to_string())?;
    // The config reads a relative path from its own folder, which is
    // rarely where this ran: give it the absolute one.
    let path = std::fs::canonicalize(&out).unwrap_or(out);
    let path_toml = toml::Value::String(path.display().to_string());
    println!(
        "wrote the private key to {} (mode 0600)\n\n\
         publish this DNS TXT record:\n\n{}\n\n\
         and add to the config:\n\n\
         [[dkim]]\ndomain = \"{domain}\"\nselector = \"{selector}\"\nprivate_key = {path_toml}",
        path.display(),
        keygen::zone_record(&domain, selector, &key.record),
    );
    Ok(())
}

pub(super) fn hash_password() -> Result<(), String> {
    let stdin = std::io::stdin();
    // On a terminal: no echo, and typed twice since it cannot be seen.
    // Otherwise (`echo -n pw | smtp-once hash-password`): one plain line.
    let password = if stdin.is_terminal() {
        let hidden = |prompt| {
            crate::terminal::read_hidden_line(prompt)
                .map_err(|e| format!("cannot read the password without echo: {e}"))
        };
        let first = hidden("Password: ")?;
        if first.is_empty() {
            return Err("empty password".into());
        }
        if hidden("Again: ")? != first {
            return Err("the two passwords differ; nothing printed".into());
        }
        first
    } else {
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("cannot read password from stdin: {e}"))?;
        let password = line.trim_end_matches(['\r', '\n']).to_string();
        if password.is_empty() {
            return Err("empty password on stdin".into());
        }
        password
    };
    println!("{}", crate::auth::hash_password(&password)?);
    Ok(())
}

/// The token is printed once: the config keeps only its hash.
pub(super) fn new_api_key() -> Result<(), String> {
    let (token, hash) = crate::http::keys::new_token();
    println!("token (shown once; the config keeps only its hash):\n  {token}");
    println!("add to the account's [[user]] section:\n  api_key_hash = \"{hash}\"");
    Ok(())
}
