//! TLS client setup for the bench.
//!
//! DANGER, bench-only: the connector accepts ANY server certificate
//! (the dev certificate is self-signed). It still checks handshake signatures,
//! so the server must hold the key for whatever certificate it presents, but
//! there is no authentication of who that server is. Never reuse this for
//! real mail submission.

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::BenchError;

/// Accepts any certificate (`tls::encrypt_only_config`), with an explicit
/// ring provider, so it works whether or not the process has installed a
/// default provider.
pub(super) fn insecure_connector() -> Result<TlsConnector, BenchError> {
    Ok(TlsConnector::from(Arc::new(
        smtp_once::tls::encrypt_only_config()?,
    )))
}

/// SNI / server name from the host part of `host:port` (IPs are allowed; the
/// verifier ignores the name anyway).
pub(super) fn server_name(host: &str) -> Result<ServerName<'static>, BenchError> {
    ServerName::try_from(host.to_string())
        .map_err(|_| BenchError::InvalidArgs(format!("invalid TLS server name {host:?}")))
}
