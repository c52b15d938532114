//! Client TLS for the next hop, always with rustls' `ring` provider.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::TlsConnector;

use crate::config::TlsTrust;

/// The certificates of a PEM file, as trust roots.
pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", path.display()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A connector that verifies the server as `trust` says.
pub fn connector(trust: &TlsTrust) -> Result<TlsConnector, String> {
    match trust {
        TlsTrust::CaFile(path) => {
            let roots = load_roots(path)?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("tls: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(TlsConnector::from(Arc::new(config)))
        }
        // mail-send's connectors use the process-wide provider: make sure
        // it is ring's.
        TlsTrust::System => {
            crate::server::tls::install_crypto_provider();
            mail_send::smtp::tls::build_tls_connector(false)
        }
        TlsTrust::InsecureSkipVerify => unverified(),
    }
}

/// Opportunistic TLS to MX hosts (RFC 7435): encryption without
/// authentication, which beats plaintext, the only alternative.
pub fn unverified() -> Result<TlsConnector, String> {
    crate::server::tls::install_crypto_provider();
    mail_send::smtp::tls::build_tls_connector(true)
}

#[cfg(test)]
mod tests {
    /// mail-send's connectors need a process-wide provider; ours installs it.
    #[test]
    fn connectors_build_without_a_provider_set_up_by_the_caller() {
        super::connector(&crate::config::TlsTrust::System).expect("system roots");
        super::unverified().expect("unverified");
    }
}
