//! DKIM signing (RFC 6376, Ed25519 per RFC 8463), made once per message at
//! acceptance so that every relay attempt sends the same bytes.
//!
//! Ground floor: plain values in (paths, names, bytes), no config struct,
//! and nothing of the server, SMTP, delivery or store. `key` reads private
//! keys, `signer` picks the signing domains of a message and signs it,
//! `keygen` makes a key pair and the DNS record to publish.

pub mod key;
pub mod keygen;
pub mod signer;

pub use key::{SigningKey, SigningKeyError};
pub use signer::{DomainSigner, SignError, Signers};
