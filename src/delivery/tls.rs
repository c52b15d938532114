//! Client TLS for the next hop, always with rustls' `ring` provider.

use std::sync::Arc;

use tokio_rustls::TlsConnector;

use crate::config::TlsTrust;

/// A connector that verifies the server as `trust` says.
pub fn connector(trust: &TlsTrust) -> Result<TlsConnector, String> {
    match trust {
        TlsTrust::CaFile(path) => {
            let roots = crate::tls::load_roots(path)?;
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
            crate::tls::install_crypto_provider();
            mail_send::smtp::tls::build_tls_connector(false)
        }
        TlsTrust::InsecureSkipVerify => unverified(),
    }
}

/// Opportunistic TLS to MX hosts (RFC 7435): encryption without
/// authentication, which beats plaintext, the only alternative.
pub fn unverified() -> Result<TlsConnector, String> {
    crate::tls::install_crypto_provider();
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
