//! What each fuzz target does with one input, shared by the cargo-fuzz
//! targets (`fuzz/fuzz_targets/`) and the regression replay
//! (`tests/fuzz_regressions.rs`, which includes this file by path). Every
//! function runs in-process without I/O and panics when an invariant breaks.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use smtp_once::address::parse as parse_address;
use smtp_once::auth::{Account, AuthOutcome, SenderPattern, Submitter};
use smtp_once::budget::InFlightBudget;
use smtp_once::config::Config;
use smtp_once::content_check::check_content;
use smtp_once::http::compose::from_json as compose_json;
use smtp_once::idempotency::fingerprint::fingerprint as message_fingerprint;
use smtp_once::idempotency::volatile::VolatileHeaders;
use smtp_once::message::headers::{header_section_len, top_level_headers};
use smtp_once::message::key_header::{MAX_KEY_CHARS, extract_key};
use smtp_once::smtp::path_command::{parse_mail, parse_rcpt};
use smtp_once::smtp::session::{Action, Session, SessionConfig};
use smtp_once::submission::Submission;

// ---------------------------------------------------------------- session

/// First input byte of the `session` target: listener and limits.
const IMPLICIT_TLS: u8 = 1;
const TRUSTED_NETWORK: u8 = 1 << 1;
const PLAINTEXT_AUTH: u8 = 1 << 2;
const STARTTLS_OFFERED: u8 = 1 << 3;
const SMALL_LIMITS: u8 = 1 << 4;
/// The top three bits pick how the rest is cut into reads: 0 cuts at every
/// 0xFF byte (dropped, so a seed file shows its reads), the others cut into
/// reads of a fixed size (0xFF then stays in the data).
const CHUNK_SHIFT: u8 = 5;
const CHUNK_SIZES: [usize; 8] = [0, 1, 2, 5, 16, 100, 1000, usize::MAX];
const READ_MARK: u8 = 0xFF;

/// The SMTP session fed arbitrary reads, driven as src/server/connection.rs
/// drives it. Checks: no panic, every flushed reply is well formed, nothing
/// pipelined before STARTTLS is answered after it, and each submission fits
/// the envelope limits and comes from an authenticated or trusted client.
pub(crate) fn session(data: &[u8]) {
    let Some((&flags, script)) = data.split_first() else {
        return;
    };
    let config = session_config(flags);
    let mut driver = Driver {
        session: Session::new(
            config.clone(),
            SocketAddr::from(([127, 0, 0, 1], 40000)),
            (flags & TRUSTED_NETWORK != 0).then(|| "local".to_string()),
            flags & IMPLICIT_TLS != 0,
        ),
        config,
        trusted: flags & TRUSTED_NETWORK != 0,
        tls: flags & IMPLICIT_TLS != 0,
        authenticated: false,
    };
    driver.session.greet();
    for read in reads(flags, script) {
        trace("C:", read);
        driver.session.input().extend_from_slice(read);
        if !driver.run() {
            return;
        }
    }
}

fn session_config(flags: u8) -> Arc<SessionConfig> {
    let small = flags & SMALL_LIMITS != 0;
    Arc::new(SessionConfig {
        hostname: "relay.fuzz.test".into(),
        max_message_size: if small { 64 } else { 100_000 },
        max_recipients: if small { 2 } else { 100 },
        max_bad_commands: if small { 3 } else { 20 },
        allow_plaintext_auth: flags & PLAINTEXT_AUTH != 0,
        starttls_offered: flags & STARTTLS_OFFERED != 0,
        max_junk_commands: if small { 5 } else { 100 },
        budget: if small {
            InFlightBudget::new(128, 96)
        } else {
            InFlightBudget::new(1 << 20, 1 << 19)
        },
    })
}

fn reads(flags: u8, script: &[u8]) -> Box<dyn Iterator<Item = &[u8]> + '_> {
    match CHUNK_SIZES[usize::from(flags >> CHUNK_SHIFT)] {
        0 => Box::new(script.split(|&b| b == READ_MARK)),
        usize::MAX => Box::new(std::iter::once(script)),
        size => Box::new(script.chunks(size)),
    }
}

/// What the connection driver knows, to check the session against.
struct Driver {
    session: Session,
    config: Arc<SessionConfig>,
    trusted: bool,
    tls: bool,
    authenticated: bool,
}

impl Driver {
    /// Runs the session until it wants the next read; `false` once it closed.
    /// The glue to adapt when the session's API changes is here and in
    /// [`Driver::authenticate`].
    fn run(&mut self) -> bool {
        loop {
            match self.session.advance() {
                Action::NeedInput => {
                    self.flush();
                    return true;
                }
                Action::StartTls => {
                    assert!(!self.tls, "STARTTLS on a TLS session");
                    assert!(self.config.starttls_offered, "STARTTLS not offered");
                    let out = self.flush();
                    let last = out
                        .strip_suffix(b"\r\n")
                        .and_then(|o| o.rsplit(|&b| b == b'\n').next());
                    assert!(
                        last.is_some_and(|l| l.starts_with(b"220 ")),
                        "STARTTLS without a 220 last: {:?}",
                        String::from_utf8_lossy(&out)
                    );
                    self.session.tls_started();
                    self.tls = true;
                    self.authenticated = false;
                    // Bytes pipelined after STARTTLS were plaintext: they
                    // must be gone, not answered inside TLS.
                    let action = self.session.advance();
                    assert!(matches!(action, Action::NeedInput), "{action:?} after TLS");
                    let out = self.session.take_output();
                    assert!(out.is_empty(), "answered plaintext after STARTTLS: {out:?}");
                }
                Action::Authenticate { username, password } => {
                    trace("auth:", format!("{username:?} {password:?}").as_bytes());
                    assert!(!self.authenticated, "AUTH while authenticated");
                    self.authenticate(&username, &password);
                }
                Action::Submit(submission) => {
                    trace("submit:", &submission.content);
                    self.check_submission(&submission);
                    self.session.submission_done(b"250 2.0.0 Ok\r\n");
                }
                Action::Close => {
                    self.flush();
                    return false;
                }
            }
        }
    }

    /// Even-length passwords succeed, so the fuzzer gets past AUTH; an
    /// odd-length user name gets an account limited to `*@example.test`.
    /// Account names come from the config in the daemon, not from the
    /// client, hence fixed names here.
    fn authenticate(&mut self, username: &str, password: &str) {
        let account = (password.len().is_multiple_of(2)).then(|| {
            let restricted = !username.len().is_multiple_of(2);
            let allowed_senders = restricted.then(|| {
                SenderPattern::parse("*@example.test")
                    .into_iter()
                    .collect::<Vec<_>>()
            });
            Arc::new(Account {
                name: if restricted { "restricted" } else { "any" }.into(),
                workspace: "fuzz".into(),
                allowed_senders,
            })
        });
        self.authenticated = account.is_some();
        self.session.auth_result(match account {
            Some(account) => AuthOutcome::Success(account),
            None => AuthOutcome::Invalid,
        });
    }

    fn check_submission(&self, s: &Submission) {
        assert!(!s.recipients.is_empty(), "submission without recipients");
        assert!(s.recipients.len() <= self.config.max_recipients);
        assert!(s.content.len() <= self.config.max_message_size);
        // Issue 8 (smuggling): one rule for DATA and BDAT, bare CR or LF
        // (and NUL) anywhere in the content is refused.
        assert_eq!(
            check_content(&s.content),
            Ok(()),
            "bare CR, LF or NUL in submitted content: {:?}",
            String::from_utf8_lossy(&s.content)
        );
        assert!(!s.content.is_empty(), "empty message submitted");
        assert_eq!(s.tls, self.tls);
        match &s.submitter {
            Submitter::Account(_) => assert!(self.authenticated, "account not authenticated"),
            Submitter::TrustedNetwork { .. } => {
                assert!(self.trusted && !self.authenticated, "untrusted submitter")
            }
        }
    }

    /// What the driver would write to the socket now: checked, returned.
    fn flush(&mut self) -> Vec<u8> {
        let out = self.session.take_output();
        if !out.is_empty() {
            trace("S:", &out);
        }
        check_replies(&out);
        out
    }
}

/// `SMTP_ONCE_FUZZ_TRACE=1` prints the dialogue, to read what a
/// regression input does (`cargo test --test fuzz_regressions -- --nocapture`).
fn trace(what: &str, bytes: &[u8]) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SMTP_ONCE_FUZZ_TRACE").is_some()) {
        eprintln!("{what} {:?}", String::from_utf8_lossy(bytes));
    }
}

/// Every line is `NNN SP text CRLF` or `NNN - text CRLF` (RFC 5321 4.2) with
/// a 2xx..5xx code, the text has no CR or LF, a multiline reply keeps its code
/// and the output ends with a reply's last line.
fn check_replies(out: &[u8]) {
    assert!(
        out.is_empty() || out.ends_with(b"\r\n"),
        "output ends mid-line: {:?}",
        String::from_utf8_lossy(out)
    );
    let mut open: Option<&[u8]> = None;
    for line in out.split_inclusive(|&b| b == b'\n') {
        let shown = String::from_utf8_lossy(line);
        let body = line
            .strip_suffix(b"\r\n")
            .unwrap_or_else(|| panic!("line without CRLF: {shown:?}"));
        assert!(
            !body.contains(&b'\r'),
            "bare CR inside a reply line: {shown:?}"
        );
        assert!(body.len() >= 4, "short reply line: {shown:?}");
        let (code, sep) = (&body[..3], body[3]);
        assert!(
            (b'2'..=b'5').contains(&code[0])
                && code[1..].iter().all(u8::is_ascii_digit)
                && (sep == b' ' || sep == b'-'),
            "malformed reply line: {shown:?}"
        );
        if let Some(open) = open {
            assert_eq!(open, code, "multiline reply changes code: {shown:?}");
        }
        open = (sep == b'-').then_some(code);
    }
    assert!(open.is_none(), "multiline reply left open");
}

// ---------------------------------------------------------------- key

/// Key extraction on arbitrary content: no panic, and a key is non-empty,
/// at most `MAX_KEY_CHARS` chars and trimmed.
pub(crate) fn key(data: &[u8]) {
    if let Ok(Some(key)) = extract_key(data) {
        assert!(!key.is_empty(), "empty key returned as a key");
        assert!(key.chars().count() <= MAX_KEY_CHARS);
        let trimmed = key.trim_matches([' ', '\t', '\r', '\n']);
        assert_eq!(trimmed, key, "key not trimmed");
    }
    assert!(header_section_len(data) <= data.len());
    for (name, _value) in top_level_headers(data) {
        assert!(!name.is_empty(), "header with an empty name");
    }
}

// ---------------------------------------------------------------- fingerprint

/// The fingerprint on arbitrary MIME, with the default volatile headers and
/// strict: no panic, and deterministic.
pub(crate) fn fingerprint(data: &[u8]) {
    let recipients = ["b@example.test".to_string(), "a@example.test".to_string()];
    for volatile in [VolatileHeaders::default(), VolatileHeaders::none()] {
        let first = message_fingerprint("s@example.test", &recipients, data, &volatile);
        let again = message_fingerprint("s@example.test", &recipients, data, &volatile);
        assert_eq!(first, again, "fingerprint not deterministic");
    }
}

// ---------------------------------------------------------------- config

/// The config loader on arbitrary text: no panic, and its error prints.
/// Relative paths resolve under a folder that does not exist. Text naming
/// a device or pseudo-file is skipped: `cert = "/dev/zero"` makes the loader
/// read forever, which is the operator's doing, not a parser bug.
pub(crate) fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if ["/dev", "/proc", "/sys"].iter().any(|p| text.contains(p)) {
        return;
    }
    let path = Path::new("/nonexistent/smtp-once-fuzz/smtp-once.toml");
    if let Err(e) = Config::from_toml(path, &text) {
        assert!(!e.to_string().is_empty());
    }
}

// ---------------------------------------------------------------- address

/// MAIL and RCPT paths from arbitrary bytes. Whatever a client sends, what
/// we would re-emit (`MAIL FROM:<{path}>` at the next hop, `for <{path}>` in
/// `Received:`) has no CR, LF or NUL, parses back to the same path, and
/// never adds a parameter: a `SIZE=` we put after it is still the one and
/// only parameter the next hop sees.
pub(crate) fn address(data: &[u8]) {
    let mut line = b"MAIL FROM:".to_vec();
    line.extend_from_slice(data);
    line.extend_from_slice(b"\r\n");
    if let Ok(mail) = parse_mail(&line) {
        let emitted = mail.path.as_smtp().to_owned();
        check_emitted(&emitted);
        let again = parse_mail(format!("MAIL FROM:<{emitted}> SIZE=77\r\n").as_bytes())
            .unwrap_or_else(|e| panic!("re-emitted {emitted:?} does not parse: {e:?}"));
        assert_eq!(again.path, mail.path, "round trip changed the path");
        assert_eq!(
            again.size, 77,
            "re-emitted {emitted:?} changed the parameters"
        );
    }
    let mut line = b"RCPT TO:".to_vec();
    line.extend_from_slice(data);
    line.extend_from_slice(b"\r\n");
    if let Ok(rcpt) = parse_rcpt(&line) {
        let emitted = rcpt.path.as_smtp().to_owned();
        check_emitted(&emitted);
        let again = parse_rcpt(format!("RCPT TO:<{emitted}> NOTIFY=NEVER\r\n").as_bytes())
            .unwrap_or_else(|e| panic!("re-emitted {emitted:?} does not parse: {e:?}"));
        assert_eq!(again.path, rcpt.path, "round trip changed the path");
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(address) = parse_address(text)
    {
        check_emitted(address.as_smtp());
        assert_eq!(parse_address(address.as_smtp()).as_ref(), Ok(&address));
    }
}

fn check_emitted(path: &str) {
    assert!(
        !path.contains(['\r', '\n', '\0']),
        "CR, LF or NUL re-emitted: {path:?}"
    );
    // Outside quotes: no space, `<` or `>` that a next hop would read as
    // the end of the path.
    let mut in_quote = false;
    let mut escaped = false;
    for c in path.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quote => escaped = true,
            '"' => in_quote = !in_quote,
            ' ' | '<' | '>' if !in_quote => panic!("{c:?} outside quotes in {path:?}"),
            _ => {}
        }
    }
    assert!(!in_quote, "unbalanced quote re-emitted: {path:?}");
}

// ---------------------------------------------------------------- compose

/// First input byte of the `compose` target: which fields the request has.
/// A field not fuzzed gets a valid fixed value, so most inputs reach the
/// builder instead of stopping at address validation.
const FUZZED_FROM: u8 = 1;
const HAS_SUBJECT: u8 = 1 << 1;
const HAS_TEXT: u8 = 1 << 2;
const HAS_HTML: u8 = 1 << 3;
const FUZZED_TO: u8 = 1 << 4;
const HAS_CC: u8 = 1 << 5;
const HAS_BCC: u8 = 1 << 6;
/// The rest is the request body as it is (the JSON parser's side).
const RAW_JSON: u8 = 1 << 7;
/// Fields are cut at this byte (never in UTF-8, so any text fits between).
const FIELD_MARK: u8 = 0xFF;

/// Headers the composer writes from the fields, whatever the input.
const COMPOSED_HEADERS: &[&str] = &[
    "from",
    "to",
    "cc",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "content-type",
    "content-transfer-encoding",
];

/// The HTTP API's JSON composer (`http::compose::from_json`) on requests
/// built from arbitrary bytes: the first byte says which fields there are,
/// the rest is cut at every 0xFF into their text (lossy UTF-8, so any
/// control character can appear), in the order from, to, cc, bcc, subject,
/// text, html, then name and value of each custom header. Checks (issue 20
/// finding 1): whatever it accepts has no header the input did not name,
/// exactly one `From`, `Date`, `Message-ID` and `MIME-Version`, no `Bcc`,
/// and no bare CR, bare LF or NUL anywhere.
pub(crate) fn compose(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let body = if flags & RAW_JSON != 0 {
        rest.to_vec()
    } else {
        compose_request(flags, rest).to_string().into_bytes()
    };
    trace("json:", &body);
    let Ok(composed) = compose_json(&body, "relay.fuzz.test") else {
        return;
    };
    let out = &composed.content;
    trace("built:", out);
    if let Err(fault) = check_content(out) {
        panic!("{fault:?} in {:?}", String::from_utf8_lossy(out));
    }
    let named: Vec<String> = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("headers").and_then(|h| h.as_object()).cloned())
        .map(|h| h.keys().map(|k| k.to_ascii_lowercase()).collect())
        .unwrap_or_default();
    let end = memchr_find(out, b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header section end: {:?}", String::from_utf8_lossy(out)));
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for line in out[..end].split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if matches!(line.first(), Some(b' ' | b'\t')) {
            continue;
        }
        let colon = line.iter().position(|&b| b == b':').unwrap_or_else(|| {
            panic!(
                "header line without a colon {:?} in {:?}",
                String::from_utf8_lossy(line),
                String::from_utf8_lossy(out)
            )
        });
        let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
        assert!(
            COMPOSED_HEADERS.contains(&name.as_str()) || named.contains(&name),
            "header {name:?} the input did not name: {:?}",
            String::from_utf8_lossy(out)
        );
        *counts.entry(name).or_default() += 1;
    }
    for once in ["from", "date", "message-id", "mime-version"] {
        assert_eq!(
            counts.get(once),
            Some(&1),
            "{once} not exactly once: {:?}",
            String::from_utf8_lossy(out)
        );
    }
    assert!(!counts.contains_key("bcc"), "Bcc in the headers");
}

fn compose_request(flags: u8, rest: &[u8]) -> serde_json::Value {
    let mut fields = rest
        .split(|&b| b == FIELD_MARK)
        .map(|f| String::from_utf8_lossy(f).into_owned());
    let mut next = || fields.next().unwrap_or_default();
    let mut request = serde_json::Map::new();
    let from = if flags & FUZZED_FROM != 0 {
        next()
    } else {
        "app@example.test".into()
    };
    request.insert("from".into(), from.into());
    let to = if flags & FUZZED_TO != 0 {
        next()
    } else {
        "b@example.test".into()
    };
    request.insert("to".into(), serde_json::json!([to]));
    for (flag, field) in [
        (HAS_CC, "cc"),
        (HAS_BCC, "bcc"),
        (HAS_SUBJECT, "subject"),
        (HAS_TEXT, "text"),
        (HAS_HTML, "html"),
    ] {
        if flags & flag != 0 {
            let value = next();
            let value = match field {
                "cc" | "bcc" => serde_json::json!([value]),
                _ => value.into(),
            };
            request.insert(field.into(), value);
        }
    }
    let mut headers = serde_json::Map::new();
    let rest: Vec<String> = fields.collect();
    for pair in rest.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        headers.insert(pair[0].clone(), value.into());
    }
    if !headers.is_empty() {
        request.insert("headers".into(), headers.into());
    }
    serde_json::Value::Object(request)
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
