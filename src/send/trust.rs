//! A server certificate we refuse to trust is our configuration (or the
//! server's), not the network: no retry changes it, so it ends the run at
//! once with words naming what to fix.

use std::error::Error as StdError;

use rustls::{CertificateError, Error as TlsError};

/// The words for a TLS failure no retry can fix (a certificate that does
/// not verify, a host that cannot be checked against one), or `None` for
/// anything else.
pub(super) fn permanent(e: &mail_send::Error, host: &str) -> Option<String> {
    match e {
        mail_send::Error::InvalidTLSName => Some(format!(
            "{host:?} is not a name a certificate can be checked against: give --server a DNS name or an IP address"
        )),
        mail_send::Error::Tls(tls) => untrusted(tls, host),
        mail_send::Error::Io(io) => find_rustls(io).and_then(|tls| untrusted(tls, host)),
        _ => None,
    }
}

/// The rustls error somewhere in `e`'s chain. An `io::Error` hides the
/// error it wraps from `source()`, so look inside it too.
fn find_rustls<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a TlsError> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<TlsError>() {
            return Some(tls);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            let inner: &(dyn StdError + 'static) = inner;
            if let Some(tls) = find_rustls(inner) {
                return Some(tls);
            }
        }
        next = e.source();
    }
    None
}

/// A certificate verification failure, in words naming the fix.
fn untrusted(e: &TlsError, host: &str) -> Option<String> {
    let TlsError::InvalidCertificate(c) = e else {
        return None;
    };
    Some(match c {
        CertificateError::UnknownIssuer => {
            "the server's certificate is not trusted (UnknownIssuer): give its CA with --ca-file PATH"
                .to_owned()
        }
        CertificateError::NotValidForName => format!(
            "the certificate is not valid for {host}: connect by a name it has (--server NAME:PORT)"
        ),
        CertificateError::NotValidForNameContext { presented, .. } => format!(
            "the certificate is not valid for {host} (it names {}): connect by a name it has (--server NAME:PORT)",
            presented.join(", ")
        ),
        CertificateError::Expired
        | CertificateError::ExpiredContext { .. }
        | CertificateError::NotValidYet
        | CertificateError::NotValidYetContext { .. } => format!(
            "the server's certificate is outside its validity period ({}): renew it on the server, or check this machine's clock",
            variant(c)
        ),
        other => format!(
            "the server's certificate does not verify ({}): give the CA that issued it with --ca-file PATH, or fix the certificate on the server",
            variant(other)
        ),
    })
}

/// `UnknownIssuer` from `UnknownIssuer`, `Expired` from `ExpiredContext {..}`.
fn variant(c: &CertificateError) -> String {
    let debug = format!("{c:?}");
    let name = debug
        .split(|ch: char| !ch.is_ascii_alphanumeric())
        .next()
        .unwrap_or_default();
    name.strip_suffix("Context").unwrap_or(name).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(c: CertificateError) -> mail_send::Error {
        mail_send::Error::Tls(Box::new(TlsError::InvalidCertificate(c)))
    }

    #[test]
    fn an_unknown_issuer_names_ca_file() {
        let why = permanent(&cert(CertificateError::UnknownIssuer), "relay.test");
        assert_eq!(
            why.as_deref(),
            Some(
                "the server's certificate is not trusted (UnknownIssuer): give its CA with --ca-file PATH"
            )
        );
    }

    #[test]
    fn a_name_mismatch_says_which_name() {
        let why = permanent(&cert(CertificateError::NotValidForName), "10.0.0.5").unwrap();
        assert!(
            why.starts_with("the certificate is not valid for 10.0.0.5: connect by a name it has"),
            "{why}"
        );
        let c = CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("10.0.0.5")
                .unwrap()
                .to_owned(),
            presented: vec!["DnsName(\"relay.test\")".into()],
        };
        let why = permanent(&cert(c), "10.0.0.5").unwrap();
        assert!(why.contains("relay.test"), "{why}");
    }

    #[test]
    fn every_certificate_error_is_permanent() {
        for c in [
            CertificateError::Expired,
            CertificateError::NotValidYet,
            CertificateError::BadSignature,
            CertificateError::BadEncoding,
            CertificateError::Revoked,
            CertificateError::InvalidPurpose,
        ] {
            let name = format!("{c:?}");
            let why = permanent(&cert(c), "h").unwrap();
            assert!(why.contains(&name), "{why}");
        }
        assert!(
            permanent(&cert(CertificateError::BadSignature), "h")
                .unwrap()
                .contains("--ca-file")
        );
    }

    #[test]
    fn a_wrapped_rustls_error_is_found() {
        let inner = TlsError::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        let wrapped = std::io::Error::other(io);
        let why = permanent(&mail_send::Error::Io(wrapped), "h").unwrap();
        assert!(why.contains("--ca-file"), "{why}");
    }

    #[test]
    fn network_and_protocol_failures_are_not() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(permanent(&mail_send::Error::Io(reset), "h"), None);
        assert_eq!(permanent(&mail_send::Error::Timeout, "h"), None);
        let alert = TlsError::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(
            permanent(&mail_send::Error::Tls(Box::new(alert)), "h"),
            None
        );
    }

    #[test]
    fn an_unusable_host_name_is_permanent() {
        let why = permanent(&mail_send::Error::InvalidTLSName, "bad_name").unwrap();
        assert!(why.contains("--server"), "{why}");
    }
}
