//! DANE for SMTP (RFC 7672): the MX host's certificate is checked against
//! its DNSSEC-validated TLSA records instead of a CA list.
//!
//! - DANE-EE (3): the end-entity certificate (selector 0) or its public key
//!   (selector 1) matches; names and dates are not checked (RFC 7672 3.1.1).
//! - DANE-TA (2): a certificate the server sent matches and becomes the one
//!   trust anchor; the chain must lead from it to a certificate for the MX
//!   host name or the next-hop domain (RFC 7672 3.1.2, 3.2.2).
//!
//! PKIX-TA (0) and PKIX-EE (1) are not used for SMTP (RFC 7672 3.1.3).

use std::sync::{Arc, OnceLock};

use der::{Decode, Encode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256, Sha512};

/// One TLSA record (RFC 6698 2.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlsa {
    pub usage: u8,
    pub selector: u8,
    pub matching: u8,
    pub data: Vec<u8>,
}

const DANE_TA: u8 = 2;
const DANE_EE: u8 = 3;

impl Tlsa {
    /// RFC 7672 3.1: only DANE-TA and DANE-EE, with known selectors and
    /// matching types, count; others are ignored as if absent.
    pub fn usable(&self) -> bool {
        matches!(self.usage, DANE_TA | DANE_EE) && self.selector <= 1 && self.matching <= 2
    }

    /// As a zone file writes it (`3 1 1 <hex>`), for TLS-RPT.
    pub fn text(&self) -> String {
        let hex: String = self.data.iter().map(|b| format!("{b:02x}")).collect();
        format!("{} {} {} {hex}", self.usage, self.selector, self.matching)
    }

    fn matches(&self, cert: &[u8]) -> bool {
        let selected = match self.selector {
            0 => cert.to_vec(),
            _ => match spki(cert) {
                Some(spki) => spki,
                None => return false,
            },
        };
        match self.matching {
            0 => selected == self.data,
            1 => Sha256::digest(&selected).as_slice() == self.data.as_slice(),
            _ => Sha512::digest(&selected).as_slice() == self.data.as_slice(),
        }
    }
}

/// The DER SubjectPublicKeyInfo of a DER certificate.
fn spki(cert: &[u8]) -> Option<Vec<u8>> {
    let cert = x509_cert::Certificate::from_der(cert).ok()?;
    cert.tbs_certificate.subject_public_key_info.to_der().ok()
}

/// How the peer was authenticated, once the handshake has passed.
pub type Matched = Arc<OnceLock<&'static str>>;

/// A connector that accepts only a chain the usable `records` vouch for;
/// `names` are the reference identifiers for DANE-TA. `matched` learns
/// which usage it was (`dane-ee` or `dane-ta`).
pub fn connector(
    records: Vec<Tlsa>,
    names: Vec<String>,
    matched: Matched,
) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let names = names
        .into_iter()
        .filter_map(|n| ServerName::try_from(n).ok())
        .collect();
    let verifier = DaneVerifier {
        records: records.into_iter().filter(Tlsa::usable).collect(),
        names,
        provider: provider.clone(),
        matched,
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[derive(Debug)]
struct DaneVerifier {
    records: Vec<Tlsa>,
    names: Vec<ServerName<'static>>,
    provider: Arc<CryptoProvider>,
    matched: Matched,
}

impl DaneVerifier {
    fn ta_chain_ok(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        ocsp: &[u8],
        now: UnixTime,
    ) -> bool {
        let mut roots = RootCertStore::empty();
        for cert in intermediates {
            let anchor = self
                .records
                .iter()
                .any(|r| r.usage == DANE_TA && r.matches(cert));
            if anchor {
                let _ = roots.add(cert.clone().into_owned());
            }
        }
        if roots.is_empty() {
            return false;
        }
        let Ok(webpki) = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build() else {
            return false;
        };
        self.names.iter().any(|name| {
            webpki
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
                .is_ok()
        })
    }
}

impl ServerCertVerifier for DaneVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ee = self
            .records
            .iter()
            .any(|r| r.usage == DANE_EE && r.matches(end_entity));
        if ee {
            let _ = self.matched.set("dane-ee");
            return Ok(ServerCertVerified::assertion());
        }
        if self.ta_chain_ok(end_entity, intermediates, ocsp, now) {
            let _ = self.matched.set("dane-ta");
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::General(
            "DANE: no TLSA record matches the certificate chain".into(),
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dane_usages_with_known_parameters_are_usable() {
        let t = |usage, selector, matching| Tlsa {
            usage,
            selector,
            matching,
            data: vec![],
        };
        assert!(t(3, 1, 1).usable() && t(2, 0, 2).usable() && t(3, 0, 0).usable());
        for bad in [t(0, 0, 1), t(1, 1, 1), t(3, 2, 1), t(3, 1, 3), t(4, 1, 1)] {
            assert!(!bad.usable(), "{bad:?}");
        }
    }

    #[test]
    fn garbage_never_matches_a_key_record() {
        let r = Tlsa {
            usage: 3,
            selector: 1,
            matching: 0,
            data: vec![],
        };
        assert!(!r.matches(b"not a certificate"));
        assert!(!r.matches(b""));
    }
}
