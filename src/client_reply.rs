//! The next server's replies as one line of text, for the two SMTP client
//! sides (delivery and `smtp-once send`), both on mail-send.

use smtp_proto::Response;

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
