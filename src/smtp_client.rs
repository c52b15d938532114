//! What the two SMTP client sides (delivery and `smtp-once send`, both on
//! mail-send) share: the next server's replies as one line of text, the
//! MAIL FROM parameters a message needs, and the message transfer itself.

use std::time::Duration;

use smtp_proto::{EXT_8BIT_MIME, EXT_SIZE, EXT_SMTP_UTF8, EhloResponse, Response};
use tokio::io::{AsyncWrite, AsyncWriteExt};

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
pub fn mail_params(
    caps: &EhloResponse<String>,
    from: &str,
    rcpts: &[String],
    content: &[u8],
) -> String {
    let mut params = String::new();
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

/// SMTP DATA transparency (RFC 5321 4.5.2): a leading `.` on a line is
/// doubled, the content ends with CRLF, then the `.` terminator.
pub fn dot_stuffed(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + content.len() / 64 + 8);
    let mut line_start = true;
    for &b in content {
        if line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        line_start = b == b'\n';
    }
    if !content.is_empty() && !content.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// Sends `content` dot-stuffed after a `354`, in 64 KiB blocks, each within
/// `timeout`. An error here means the final dot may or may not have gone
/// out.
pub async fn send_content<S: AsyncWrite + Unpin>(
    stream: &mut S,
    content: &[u8],
    timeout: Duration,
) -> Result<(), mail_send::Error> {
    for block in dot_stuffed(content).chunks(64 * 1024) {
        tokio::time::timeout(timeout, async {
            stream.write_all(block).await?;
            stream.flush().await
        })
        .await
        .map_err(|_| mail_send::Error::Timeout)??;
    }
    Ok(())
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

    #[test]
    fn dot_stuffing() {
        assert_eq!(
            dot_stuffed(b".a\r\nb\r\n..c\r\n"),
            b"..a\r\nb\r\n...c\r\n.\r\n"
        );
        assert_eq!(
            dot_stuffed(b".a\r\nb.\r\n..\r\n"),
            b"..a\r\nb.\r\n...\r\n.\r\n"
        );
        assert_eq!(dot_stuffed(b"a"), b"a\r\n.\r\n");
        assert_eq!(dot_stuffed(b"a.\r\n"), b"a.\r\n.\r\n");
    }
}
