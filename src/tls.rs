//! TLS helpers on the ground floor, shared by the listeners, the delivery
//! side and configuration checks: rustls with the `ring` provider, PEM
//! through `rustls-pki-types`. They take paths, never config structs.

use std::path::Path;
use std::sync::Arc;

use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Installs `ring` as the process-wide provider; harmless when already done.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate found", path.display()));
    }
    Ok(certs)
}

/// A server configuration from a PEM certificate chain and its key.
pub fn load_server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let certs = load_certs(cert).map_err(|e| format!("cert {e}"))?;
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| format!("cert/key {}: {e}", key.display()))?;
    Ok(Arc::new(config))
}

/// The certificates of a PEM file, as trust roots.
pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A client connector that verifies servers against the certificates in
/// `ca_file`, or the system's roots without one.
pub fn client_connector(ca_file: Option<&Path>) -> Result<tokio_rustls::TlsConnector, String> {
    // mail-send's system-roots connector uses the process-wide provider:
    // make sure it is ring's.
    install_crypto_provider();
    match ca_file {
        None => mail_send::smtp::tls::build_tls_connector(false),
        Some(path) => Ok(tokio_rustls::TlsConnector::from(Arc::new(
            verifying_config(path)?,
        ))),
    }
}

/// A rustls client configuration (ring) for the PostgreSQL store, with
/// libpq's meaning of `sslmode=prefer`/`require`: with `ca_file`, the
/// server's certificate must chain to it; without one the connection is
/// encrypted but the certificate not checked (as libpq does unless told
/// `verify-full`, which tokio-postgres does not parse).
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    install_crypto_provider();
    match ca_file {
        Some(path) => verifying_config(path),
        None => encrypt_only_config().map_err(|e| format!("tls: {e}")),
    }
}

/// Servers must present a certificate that chains to `ca_file`.
fn verifying_config(ca_file: &Path) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_root_certificates(load_roots(ca_file)?)
        .with_no_client_auth())
}

/// DANGER: any server certificate is accepted (see `EncryptOnly`). For
/// libpq-style `sslmode=prefer` and for `smtp-once bench` against a
/// self-signed dev certificate; never for verifying a next hop.
pub fn encrypt_only_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth(),
    )
}

/// Accepts any certificate, still checking the handshake's signatures:
/// encryption against passive eavesdroppers, nothing more.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
