//! What every SMTP client side (delivery, `smtp-once send`, the bench)
//! shares: one mail transaction as a state machine without I/O
//! ([`transaction`]), driven over any stream by [`io`]; replies read from
//! bytes ([`reply`]); DATA transparency ([`dot`]); the next server's reply
//! as one line of text, and the MAIL FROM parameters a message needs.
//! Session setup (connect, TLS, EHLO, AUTH) stays with each side: delivery
//! and `send` on mail-send, the bench by hand.

pub mod dot;
pub mod io;
pub mod reply;
pub mod transaction;

use smtp_proto::{EXT_8BIT_MIME, EXT_SIZE, EXT_SMTP_UTF8, EhloResponse, Response};

/// Why a transaction's connection failed. The words are those mail-send
/// gives the same failures (and `describe` the closed connection), so the
/// records of the queue read as before.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("Connection timeout")]
    Timeout,
    /// The server hung up, or wrote something that is not a reply.
    #[error("connection closed or unparseable reply")]
    NoReply,
}

/// `250 2.0.0 text`, lines joined with ` / `, control characters escaped:
/// the text is the other server's, and it ends up in logs, the queue and
/// a user's terminal.
pub fn format_reply(r: &Response<String>) -> String {
    let text: String = r
        .message
        .trim()
        .replace("\r\n", " / ")
        .replace('\n', " / ")
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect();
    if r.esc == [0, 0, 0] {
        format!("{} {text}", r.code)
    } else {
        format!("{} {}.{}.{} {text}", r.code, r.esc[0], r.esc[1], r.esc[2])
    }
}

/// A mail-send error in words: the server's reply where there is one.
pub fn describe(e: &mail_send::Error) -> String {
    match e {
        mail_send::Error::UnexpectedReply(r) | mail_send::Error::AuthenticationFailed(r) => {
            format_reply(r)
        }
        mail_send::Error::UnparseableReply => "connection closed or unparseable reply".into(),
        other => other.to_string(),
    }
}

/// The MAIL FROM parameters for `content` from `from` to `rcpts`, as far
/// as the server offers them: SIZE, BODY=8BITMIME for 8-bit content,
/// SMTPUTF8 for a UTF-8 envelope.
/// `require_tls`: the message was accepted with REQUIRETLS (RFC 8689),
/// which a hop that offers it is told of.
pub fn mail_params(
    caps: &EhloResponse<String>,
    from: &str,
    rcpts: &[String],
    content: &[u8],
    require_tls: bool,
) -> String {
    let mut params = String::new();
    if require_tls && caps.has_capability(smtp_proto::EXT_REQUIRE_TLS) {
        params.push_str(" REQUIRETLS");
    }
    if caps.has_capability(EXT_SIZE) {
        params.push_str(&format!(" SIZE={}", content.len()));
    }
    if caps.has_capability(EXT_8BIT_MIME) && !content.is_ascii() {
        params.push_str(" BODY=8BITMIME");
    }
    let utf8_envelope = !from.is_ascii() || rcpts.iter().any(|r| !r.is_ascii());
    if caps.has_capability(EXT_SMTP_UTF8) && utf8_envelope {
        params.push_str(" SMTPUTF8");
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_with_controls_escaped() {
        let r = Response {
            code: 550,
            esc: [5, 1, 1],
            message: "no such user\r\nsecond\x1b[31m line".to_string(),
        };
        assert_eq!(
            format_reply(&r),
            "550 5.1.1 no such user / second\\u{1b}[31m line"
        );
    }
}
