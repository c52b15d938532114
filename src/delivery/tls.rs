//! Client TLS for the next hop, always with rustls' `ring` provider.

use tokio_rustls::TlsConnector;

use crate::config::TlsTrust;

/// A connector that verifies the server as `trust` says.
pub fn connector(trust: &TlsTrust) -> Result<TlsConnector, String> {
    match trust {
        TlsTrust::CaFile(path) => crate::tls::client_connector(Some(path)),
        TlsTrust::System => crate::tls::client_connector(None),
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
