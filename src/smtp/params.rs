//! Which `MAIL` and `RCPT` parameters belong to which SMTP extension, and
//! which extensions a session offers. A parameter is honoured only when its
//! extension is offered on that session; any other is answered
//! `555 5.5.4` naming it (RFC 5321 4.1.1.11), so that no `250` promises
//! what the relay would not do. One table: `mail_params` and `rcpt_params`
//! name every parameter smtp-proto parses, `Extension::offered` says which
//! are on.

use std::borrow::Cow;

use smtp_proto::{MailFrom, RcptTo};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension {
    Size,
    EightBitMime,
    BinaryMime,
    SmtpUtf8,
    Auth,
    RequireTls,
    Dsn,
    DeliverBy,
    Mtrk,
    FutureRelease,
    MtPriority,
    Rrvs,
    ConPerm,
    ConNeg,
    NoSoliciting,
    TransId,
}

impl Extension {
    /// The EHLO keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Size => "SIZE",
            Self::EightBitMime => "8BITMIME",
            Self::BinaryMime => "BINARYMIME",
            Self::SmtpUtf8 => "SMTPUTF8",
            Self::Auth => "AUTH",
            Self::RequireTls => "REQUIRETLS",
            Self::Dsn => "DSN",
            Self::DeliverBy => "DELIVERBY",
            Self::Mtrk => "MTRK",
            Self::FutureRelease => "FUTURERELEASE",
            Self::MtPriority => "MT-PRIORITY",
            Self::Rrvs => "RRVS",
            Self::ConPerm => "CONPERM",
            Self::ConNeg => "CONNEG",
            Self::NoSoliciting => "NO-SOLICITING",
            Self::TransId => "TRANSID",
        }
    }

    /// Offered on a session (`tls`: after STARTTLS or on implicit TLS).
    /// `AUTH=` (RFC 4954 5) is informational and taken everywhere;
    /// REQUIRETLS only over TLS (RFC 8689 3).
    pub fn offered(self, tls: bool) -> bool {
        match self {
            Self::Size | Self::EightBitMime | Self::SmtpUtf8 | Self::Auth => true,
            Self::RequireTls => tls,
            Self::BinaryMime
            | Self::Dsn
            | Self::DeliverBy
            | Self::Mtrk
            | Self::FutureRelease
            | Self::MtPriority
            | Self::Rrvs
            | Self::ConPerm
            | Self::ConNeg
            | Self::NoSoliciting
            | Self::TransId => false,
        }
    }
}

/// Every parameter of a parsed `MAIL FROM`, by name, with its extension.
pub fn mail_params(from: &MailFrom<Cow<'_, str>>) -> Vec<(&'static str, Extension)> {
    use smtp_proto::*;
    let mut p = Vec::new();
    let flag = |bits: u64| from.flags & bits != 0;
    if from.size != 0 {
        p.push(("SIZE", Extension::Size));
    }
    if flag(MAIL_BODY_7BIT | MAIL_BODY_8BITMIME) {
        p.push(("BODY", Extension::EightBitMime));
    }
    if flag(MAIL_BODY_BINARYMIME) {
        p.push(("BODY=BINARYMIME", Extension::BinaryMime));
    }
    if flag(MAIL_SMTPUTF8) {
        p.push(("SMTPUTF8", Extension::SmtpUtf8));
    }
    if from.auth.is_some() {
        p.push(("AUTH", Extension::Auth));
    }
    if flag(MAIL_REQUIRETLS) {
        p.push(("REQUIRETLS", Extension::RequireTls));
    }
    if flag(MAIL_RET_FULL | MAIL_RET_HDRS) {
        p.push(("RET", Extension::Dsn));
    }
    if from.env_id.is_some() {
        p.push(("ENVID", Extension::Dsn));
    }
    if from.by != 0 || flag(MAIL_BY_NOTIFY | MAIL_BY_RETURN | MAIL_BY_TRACE) {
        p.push(("BY", Extension::DeliverBy));
    }
    if from.mtrk.is_some() {
        p.push(("MTRK", Extension::Mtrk));
    }
    if from.hold_for != 0 {
        p.push(("HOLDFOR", Extension::FutureRelease));
    }
    if from.hold_until != 0 {
        p.push(("HOLDUNTIL", Extension::FutureRelease));
    }
    if from.mt_priority != 0 {
        p.push(("MT-PRIORITY", Extension::MtPriority));
    }
    if flag(MAIL_CONPERM) {
        p.push(("CONPERM", Extension::ConPerm));
    }
    if from.solicit.is_some() {
        p.push(("SOLICIT", Extension::NoSoliciting));
    }
    if from.trans_id.is_some() {
        p.push(("TRANSID", Extension::TransId));
    }
    p
}

/// Every parameter of a parsed `RCPT TO`, by name, with its extension.
pub fn rcpt_params(to: &RcptTo<Cow<'_, str>>) -> Vec<(&'static str, Extension)> {
    use smtp_proto::*;
    let mut p = Vec::new();
    let flag = |bits: u64| to.flags & bits != 0;
    if flag(RCPT_NOTIFY_SUCCESS | RCPT_NOTIFY_FAILURE | RCPT_NOTIFY_DELAY | RCPT_NOTIFY_NEVER) {
        p.push(("NOTIFY", Extension::Dsn));
    }
    if to.orcpt.is_some() {
        p.push(("ORCPT", Extension::Dsn));
    }
    if to.rrvs != 0 || flag(RCPT_RRVS_REJECT | RCPT_RRVS_CONTINUE) {
        p.push(("RRVS", Extension::Rrvs));
    }
    if flag(RCPT_CONNEG) {
        p.push(("CONNEG", Extension::ConNeg));
    }
    p
}

/// The first parameter whose extension is not offered, if any.
pub fn first_refused(
    params: &[(&'static str, Extension)],
    tls: bool,
) -> Option<(&'static str, Extension)> {
    params.iter().copied().find(|(_, e)| !e.offered(tls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smtp_proto::Request;

    fn mail(line: &str) -> Vec<(&'static str, Extension)> {
        match Request::parse(&mut line.as_bytes().iter()) {
            Ok(Request::Mail { from }) => mail_params(&from),
            other => panic!("{line}: {other:?}"),
        }
    }

    fn rcpt(line: &str) -> Vec<(&'static str, Extension)> {
        match Request::parse(&mut line.as_bytes().iter()) {
            Ok(Request::Rcpt { to }) => rcpt_params(&to),
            other => panic!("{line}: {other:?}"),
        }
    }

    /// Every parameter smtp-proto parses is named, and only SIZE, BODY,
    /// SMTPUTF8, AUTH and (over TLS) REQUIRETLS are offered.
    #[test]
    fn every_parameter_the_parser_knows_is_in_the_table() {
        let cases: &[(&str, &str, Extension, bool)] = &[
            ("MAIL FROM:<a@b> SIZE=10\r\n", "SIZE", Extension::Size, true),
            (
                "MAIL FROM:<a@b> BODY=8BITMIME\r\n",
                "BODY",
                Extension::EightBitMime,
                true,
            ),
            (
                "MAIL FROM:<a@b> BODY=7BIT\r\n",
                "BODY",
                Extension::EightBitMime,
                true,
            ),
            (
                "MAIL FROM:<a@b> BODY=BINARYMIME\r\n",
                "BODY=BINARYMIME",
                Extension::BinaryMime,
                false,
            ),
            (
                "MAIL FROM:<a@b> SMTPUTF8\r\n",
                "SMTPUTF8",
                Extension::SmtpUtf8,
                true,
            ),
            ("MAIL FROM:<a@b> AUTH=<>\r\n", "AUTH", Extension::Auth, true),
            (
                "MAIL FROM:<a@b> REQUIRETLS\r\n",
                "REQUIRETLS",
                Extension::RequireTls,
                false,
            ),
            ("MAIL FROM:<a@b> RET=HDRS\r\n", "RET", Extension::Dsn, false),
            (
                "MAIL FROM:<a@b> ENVID=x1\r\n",
                "ENVID",
                Extension::Dsn,
                false,
            ),
            (
                "MAIL FROM:<a@b> BY=120;R\r\n",
                "BY",
                Extension::DeliverBy,
                false,
            ),
            (
                "MAIL FROM:<a@b> MTRK=abc:60\r\n",
                "MTRK",
                Extension::Mtrk,
                false,
            ),
            (
                "MAIL FROM:<a@b> HOLDFOR=60\r\n",
                "HOLDFOR",
                Extension::FutureRelease,
                false,
            ),
            (
                "MAIL FROM:<a@b> HOLDUNTIL=2026-12-08T10:00:00Z\r\n",
                "HOLDUNTIL",
                Extension::FutureRelease,
                false,
            ),
            (
                "MAIL FROM:<a@b> MT-PRIORITY=3\r\n",
                "MT-PRIORITY",
                Extension::MtPriority,
                false,
            ),
            (
                "MAIL FROM:<a@b> CONPERM\r\n",
                "CONPERM",
                Extension::ConPerm,
                false,
            ),
            (
                "MAIL FROM:<a@b> SOLICIT=org.example:x\r\n",
                "SOLICIT",
                Extension::NoSoliciting,
                false,
            ),
            (
                "MAIL FROM:<a@b> TRANSID=<x@y>\r\n",
                "TRANSID",
                Extension::TransId,
                false,
            ),
        ];
        for (line, name, ext, offered) in cases {
            let params = mail(line);
            assert_eq!(params.first(), Some(&(*name, *ext)), "{line}");
            assert_eq!(ext.offered(false), *offered, "{line}");
        }
        assert!(Extension::RequireTls.offered(true));
        let rcpts: &[(&str, &str)] = &[
            ("RCPT TO:<a@b> NOTIFY=NEVER\r\n", "NOTIFY"),
            ("RCPT TO:<a@b> NOTIFY=SUCCESS,FAILURE,DELAY\r\n", "NOTIFY"),
            ("RCPT TO:<a@b> ORCPT=rfc822;a@b\r\n", "ORCPT"),
            ("RCPT TO:<a@b> RRVS=2026-12-08T10:00:00Z\r\n", "RRVS"),
            ("RCPT TO:<a@b> CONNEG\r\n", "CONNEG"),
        ];
        for (line, name) in rcpts {
            let params = rcpt(line);
            let refused = first_refused(&params, true);
            assert_eq!(refused.map(|(n, _)| n), Some(*name), "{line}");
        }
        assert!(mail("MAIL FROM:<a@b>\r\n").is_empty());
        assert!(rcpt("RCPT TO:<a@b>\r\n").is_empty());
    }
}
