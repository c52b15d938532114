//! The relay modes behind one interface: which destination a recipient
//! belongs to (the unit of per-destination concurrency and of one SMTP
//! transaction), and delivery of a message to a destination's recipients.

use super::file::FileTransport;
use super::mx::{MxTransport, SystemResolver};
use super::smarthost::SmarthostTransport;
use super::smtp::ClientSettings;
use super::{DeliveryError, RcptResult, content, domain_of};
use crate::config::{Config, Relay};

/// A queued message, as loaded for delivery.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub id: String,
    pub reverse_path: String,
    /// Every recipient it was accepted for (delivered ones included).
    pub recipients: Vec<String>,
    pub idempotency_key: Option<String>,
    pub trace: String,
    pub body: Vec<u8>,
}

impl Outgoing {
    /// The bytes relayed in a transaction to `subset` of the recipients.
    pub fn bytes_for(&self, subset: &[String]) -> Vec<u8> {
        content::relayed(
            &self.id,
            &self.trace,
            &self.body,
            self.idempotency_key.as_deref(),
            &self.recipients,
            subset,
        )
    }
}

pub enum Transport {
    File(FileTransport),
    Smarthost(SmarthostTransport),
    Mx(MxTransport),
}

impl Transport {
    pub fn from_config(config: &Config) -> Result<Self, DeliveryError> {
        let settings = ClientSettings {
            helo: config.hostname.clone(),
            timeout: config.delivery.timeout,
        };
        Ok(match &config.relay {
            Relay::File { dir } => Transport::File(FileTransport::new(dir)?),
            Relay::Smarthost {
                host,
                tls,
                username,
                password,
            } => Transport::Smarthost(SmarthostTransport::new(
                host,
                *tls,
                username.clone().zip(password.clone()),
                &config.delivery.smarthost_trust,
                settings,
            )?),
            Relay::Mx => {
                let resolver = SystemResolver::new().map_err(DeliveryError::Setup)?;
                Transport::Mx(MxTransport::new(
                    std::sync::Arc::new(resolver),
                    config.delivery.mx_port,
                    settings,
                )?)
            }
        })
    }

    /// Recipients with the same destination go in one transaction and
    /// share its concurrency limit.
    pub fn destination(&self, recipient: &str) -> String {
        match self {
            Transport::File(_) => "file".into(),
            Transport::Smarthost(s) => s.name().to_owned(),
            Transport::Mx(_) => domain_of(recipient).unwrap_or_default(),
        }
    }

    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        match self {
            Transport::File(t) => t.deliver(msg, recipients).await,
            Transport::Smarthost(t) => t.deliver(msg, recipients).await,
            Transport::Mx(t) => t.deliver(msg, recipients).await,
        }
    }
}
