//! Standard Webhooks signatures: `v1,` + base64 of HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{payload}`, one per secret
//! (space-separated) while a secret rotates.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The `webhook-signature` header value.
pub fn signature(secrets: &[Vec<u8>], id: &str, timestamp: i64, payload: &str) -> String {
    let mut out = Vec::with_capacity(secrets.len());
    for secret in secrets {
        // HMAC takes a key of any length.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
            continue;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(payload.as_bytes());
        let tag = mac.finalize().into_bytes();
        out.push(format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        ));
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks reference test vector (its libraries' tests).
    #[test]
    fn matches_the_reference_vector() {
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("base64");
        let sig = signature(
            &[secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn one_signature_per_secret() {
        let sig = signature(&[vec![1; 24], vec![2; 24]], "msg_1", 1, "{}");
        let parts: Vec<_> = sig.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_ne!(parts[0], parts[1]);
    }
}
