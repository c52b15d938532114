//! MX hosts for the DNS rig: small SMTP servers on 127.0.0.x that can
//! greet with any code, offer STARTTLS with a certificate of the test's
//! choosing (or drop it from EHLO, as an attacker on the path would), and
//! record every message with whether it came over TLS.
//! Certificates come from a test CA made per run ([`TestCa`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use sha2::{Digest, Sha256, Sha512};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::Io;

/// A certificate and key for one MX host, and the TLSA data of both.
#[derive(Clone)]
pub(crate) struct HostCert {
    pub chain_pem: String,
    pub key_pem: String,
    /// DER of the end-entity certificate.
    pub der: Vec<u8>,
    /// DER of its SubjectPublicKeyInfo.
    pub spki: Vec<u8>,
}

impl HostCert {
    /// `3 1 1 <sha256 of the key>`: the usual DANE-EE record.
    pub(crate) fn tlsa_ee_spki_sha256(&self) -> String {
        format!("3 1 1 {}", hex(&Sha256::digest(&self.spki)))
    }

    /// `3 0 2 <sha512 of the certificate>`.
    pub(crate) fn tlsa_ee_cert_sha512(&self) -> String {
        format!("3 0 2 {}", hex(&Sha512::digest(&self.der)))
    }

    pub(crate) fn server_config(&self) -> Arc<rustls::ServerConfig> {
        use rustls_pki_types::pem::PemObject;
        let certs = rustls_pki_types::CertificateDer::pem_slice_iter(self.chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("chain");
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("server config"),
        )
    }
}

/// A CA that signs host certificates; its own certificate is what a
/// DANE-TA record (`2 0 1`) or `mx_ca_file` names.
pub(crate) struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
    der: Vec<u8>,
}

impl TestCa {
    pub(crate) fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA cert");
        TestCa {
            pem: cert.pem(),
            der: cert.der().to_vec(),
            issuer: Issuer::new(params, key),
        }
    }

    /// `2 0 1 <sha256 of the CA certificate>`.
    pub(crate) fn tlsa_ta_cert_sha256(&self) -> String {
        format!("2 0 1 {}", hex(&Sha256::digest(&self.der)))
    }

    /// A certificate for `names`, chained to this CA (the chain includes
    /// the CA, as RFC 7672 asks of a DANE-TA server).
    pub(crate) fn issue(&self, names: &[&str]) -> HostCert {
        let key = KeyPair::generate().expect("host key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("host params");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("host cert");
        HostCert {
            chain_pem: format!("{}{}", cert.pem(), self.pem),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            spki: rcgen::PublicKeyData::subject_public_key_info(&key),
        }
    }

    pub(crate) fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("test-ca.pem");
        std::fs::write(&path, &self.pem).expect("write CA");
        path
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One message as an MX host received it.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// The MAIL FROM line as sent.
    pub mail: String,
    pub rcpts: Vec<String>,
    pub data: Vec<u8>,
    pub tls: bool,
}

/// How an MX host behaves.
#[derive(Clone)]
pub(crate) struct Behaviour {
    pub greeting: String,
    /// Offer STARTTLS with this certificate; `None`: no STARTTLS in EHLO.
    pub tls: Option<HostCert>,
    /// Offer REQUIRETLS (RFC 8689) once TLS is on.
    pub requiretls: bool,
}

impl Behaviour {
    pub(crate) fn plain() -> Self {
        Self {
            greeting: "220 mx ESMTP".into(),
            tls: None,
            requiretls: false,
        }
    }

    pub(crate) fn tls(cert: &HostCert) -> Self {
        Self {
            greeting: "220 mx ESMTP".into(),
            tls: Some(cert.clone()),
            requiretls: false,
        }
    }

    /// `tls`, offering REQUIRETLS after STARTTLS.
    pub(crate) fn requiretls(cert: &HostCert) -> Self {
        Self {
            requiretls: true,
            ..Self::tls(cert)
        }
    }

    pub(crate) fn greeting(code: &str) -> Self {
        Self {
            greeting: code.into(),
            tls: None,
            requiretls: false,
        }
    }
}

pub(crate) struct MxHost {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    /// Connections seen (including refused greetings).
    connections: Arc<Mutex<usize>>,
}

impl MxHost {
    pub(crate) fn start(addr: SocketAddr, behaviour: Behaviour) -> MxHost {
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (r, c) = (received.clone(), connections.clone());
        let addr = super::spawn_server(addr, move |stream| {
            let (b, r, c) = (behaviour.clone(), r.clone(), c.clone());
            async move {
                *c.lock().expect("lock") += 1;
                let _ = session(Box::new(stream), b, r).await;
            }
        });
        MxHost {
            addr,
            received,
            connections,
        }
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    pub(crate) fn connections(&self) -> usize {
        *self.connections.lock().expect("lock")
    }
}

async fn session(
    mut io: Box<dyn Io>,
    b: Behaviour,
    received: Arc<Mutex<Vec<Received>>>,
) -> std::io::Result<()> {
    io.write_all(format!("{}\r\n", b.greeting).as_bytes())
        .await?;
    if !b.greeting.starts_with("220") {
        return Ok(());
    }
    let mut tls = false;
    'session: loop {
        let mut r = BufReader::new(io);
        let mut rcpts = Vec::new();
        let mut mail = String::new();
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            let verb = line.get(..4).unwrap_or_default().to_ascii_uppercase();
            let reply = match verb.as_str() {
                "EHLO" if b.tls.is_some() && !tls => {
                    "250-mx\r\n250-8BITMIME\r\n250 STARTTLS".into()
                }
                "EHLO" if tls && b.requiretls => "250-mx\r\n250-8BITMIME\r\n250 REQUIRETLS".into(),
                "EHLO" => "250-mx\r\n250 8BITMIME".to_string(),
                "STAR" if !tls => match &b.tls {
                    Some(cert) => {
                        r.get_mut().write_all(b"220 2.0.0 go ahead\r\n").await?;
                        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
                        let plain = r.into_inner();
                        match acceptor.accept(plain).await {
                            Ok(stream) => {
                                io = Box::new(stream);
                                tls = true;
                                continue 'session;
                            }
                            Err(_) => return Ok(()),
                        }
                    }
                    None => "502 5.5.1 no STARTTLS here".into(),
                },
                "MAIL" => {
                    rcpts.clear();
                    mail = line.clone();
                    "250 2.1.0 Ok".into()
                }
                "RCPT" => {
                    let start = line.find('<').map_or(0, |i| i + 1);
                    let end = line.rfind('>').unwrap_or(line.len());
                    rcpts.push(line.get(start..end).unwrap_or_default().to_string());
                    "250 2.1.5 Ok".into()
                }
                "DATA" => {
                    r.get_mut().write_all(b"354 go ahead\r\n").await?;
                    let Some(data) = super::read_data_body(&mut r).await? else {
                        return Ok(());
                    };
                    received.lock().expect("lock").push(Received {
                        mail: mail.clone(),
                        rcpts: std::mem::take(&mut rcpts),
                        data,
                        tls,
                    });
                    "250 2.0.0 mx queued".into()
                }
                "RSET" | "NOOP" => "250 2.0.0 Ok".into(),
                "QUIT" => {
                    r.get_mut().write_all(b"221 2.0.0 Bye\r\n").await?;
                    return Ok(());
                }
                _ => "502 5.5.1 Unknown command".into(),
            };
            r.get_mut()
                .write_all(format!("{reply}\r\n").as_bytes())
                .await?;
        }
    }
}
