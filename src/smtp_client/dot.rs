//! SMTP DATA transparency (RFC 5321 4.5.2).

/// `content` as it goes after a `354`: a leading `.` on a line is doubled,
/// the content ends with CRLF, then the `.` terminator.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_dot_is_doubled_on_every_line() {
        assert_eq!(
            dot_stuffed(b".a\r\nb\r\n..c\r\n"),
            b"..a\r\nb\r\n...c\r\n.\r\n"
        );
        assert_eq!(
            dot_stuffed(b".a\r\nb.\r\n..\r\n"),
            b"..a\r\nb.\r\n...\r\n.\r\n"
        );
    }

    #[test]
    fn the_content_is_ended_with_crlf_before_the_terminator() {
        assert_eq!(dot_stuffed(b"a"), b"a\r\n.\r\n");
        assert_eq!(dot_stuffed(b"a.\r\n"), b"a.\r\n.\r\n");
        assert_eq!(dot_stuffed(b""), b".\r\n");
    }

    #[test]
    fn a_line_that_is_only_a_dot_does_not_end_the_message() {
        assert_eq!(dot_stuffed(b"a\r\n.\r\nb\r\n"), b"a\r\n..\r\nb\r\n.\r\n");
    }
}
