//! SMTP reply lines (RFC 5321 4.2) with enhanced status codes (RFC 3463).

use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    code: u16,
    lines: Vec<String>,
}

impl Reply {
    /// A one-line reply; `esc` is the enhanced status code, or "" for none.
    pub fn new(code: u16, esc: &str, text: &str) -> Self {
        let line = match (esc.is_empty(), text.is_empty()) {
            (true, _) => text.to_string(),
            (false, true) => esc.to_string(),
            (false, false) => format!("{esc} {text}"),
        };
        Self {
            code,
            lines: vec![line],
        }
    }

    pub fn multiline(code: u16, lines: &[String]) -> Self {
        Self {
            code,
            lines: lines.to_vec(),
        }
    }

    pub fn code(&self) -> u16 {
        self.code
    }

    pub fn write_to(&self, out: &mut Vec<u8>) {
        let last = self.lines.len().saturating_sub(1);
        for (i, line) in self.lines.iter().enumerate() {
            let sep = if i == last { ' ' } else { '-' };
            let mut s = String::with_capacity(line.len() + 6);
            // Writing to a String cannot fail.
            let _ = write!(s, "{}{}{}\r\n", self.code, sep, line);
            out.extend_from_slice(s.as_bytes());
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_single_and_multi_line() {
        assert_eq!(
            Reply::new(250, "2.0.0", "Ok").to_bytes(),
            b"250 2.0.0 Ok\r\n"
        );
        assert_eq!(Reply::new(354, "", "Go").to_bytes(), b"354 Go\r\n");
        let m = Reply::multiline(250, &["a".into(), "b".into()]);
        assert_eq!(m.to_bytes(), b"250-a\r\n250 b\r\n");
    }
}
