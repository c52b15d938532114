//! `[[listener]]` (the SMTP ports and their TLS mode) and `[tls]` (the
//! certificate they, and the HTTP API, serve). Only names and files: the
//! listeners themselves are `server/`'s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::problems::Problems;
use super::resolve;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub addr: String,
    #[serde(default = "default_tls_mode")]
    pub tls: String,
}

// `addr` is required, so the entry has no `Default`.
fn default_tls_mode() -> String {
    "none".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How an SMTP connection gets TLS (`none`, `starttls`, `implicit`): a
/// listener's `tls` and the smarthost's `[relay] tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpTls {
    None,
    StartTls,
    Implicit,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: SmtpTls,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `none`, `starttls` or `implicit` (a listener's `tls`, and `relay.tls`).
pub(super) fn parse_tls_mode(value: &str) -> Option<SmtpTls> {
    match value {
        "none" => Some(SmtpTls::None),
        "starttls" => Some(SmtpTls::StartTls),
        "implicit" => Some(SmtpTls::Implicit),
        _ => None,
    }
}

pub(super) fn check_listeners(
    raw: &[RawListener],
    has_tls: bool,
    p: &mut Problems,
) -> Vec<Listener> {
    if raw.is_empty() {
        p.add("listener", "at least one [[listener]] is required");
    }
    let mut listeners = Vec::new();
    for (i, l) in raw.iter().enumerate() {
        let addr = l.addr.parse::<SocketAddr>();
        let tls = parse_tls_mode(&l.tls);
        if addr.is_err() {
            p.add(
                format!("listener[{i}].addr"),
                format!("{:?} is not an address like 127.0.0.1:2587", l.addr),
            );
        }
        if tls.is_none() {
            p.add(
                format!("listener[{i}].tls"),
                format!("{:?} must be none, starttls or implicit", l.tls),
            );
        }
        if let (Ok(addr), Some(tls)) = (addr, tls) {
            if tls != SmtpTls::None && !has_tls {
                p.add(
                    format!("listener[{i}].tls"),
                    "needs a [tls] section with cert and key",
                );
            }
            listeners.push(Listener { addr, tls });
        }
    }
    listeners
}

/// `[tls]`: the files are loaded, so a bad one is named here and not at
/// the first handshake.
pub(super) fn check_tls(raw: Option<&RawTls>, base: &Path, p: &mut Problems) -> Option<TlsFiles> {
    let files = raw.map(|t| TlsFiles {
        cert: resolve(base, &t.cert),
        key: resolve(base, &t.key),
    })?;
    if let Err(e) = crate::tls::load_server_config(&files.cert, &files.key) {
        p.add("tls", e);
    }
    Some(files)
}
