//! The texts of TLS-RPT (RFC 8460): the `_smtp._tls` TXT record that says
//! where reports go, the JSON report (section 4), gzipped, and the mail
//! that carries it (section 5.3).

use std::io::Write;

use base64::Engine;
use serde_json::{Value, json};

use super::{DomainCounts, PolicyType};

/// Where a domain wants its reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rua {
    Mailto(String),
    Https(String),
}

/// At most this many report addresses of one domain are used.
pub const MAX_RUA: usize = 4;

/// The `rua` of the one `v=TLSRPTv1` record among `records`; empty when
/// there is not exactly one, or it names no usable address (RFC 8460 3).
pub fn rua(records: &[String]) -> Vec<Rua> {
    let rpt: Vec<&String> = records
        .iter()
        .filter(|r| r.trim_start().starts_with("v=TLSRPTv1"))
        .collect();
    let [record] = rpt[..] else { return Vec::new() };
    let Some(value) = record
        .split(';')
        .map(str::trim)
        .find_map(|f| f.strip_prefix("rua="))
    else {
        return Vec::new();
    };
    value
        .split(',')
        .filter_map(|uri| {
            let uri = uri.trim();
            if let Some(addr) = uri.strip_prefix("mailto:") {
                // Anything after `?` is a header list we do not use.
                let addr = addr.split('?').next().unwrap_or_default();
                let ok = crate::address::ForwardPath::parse(addr).is_ok() && addr.contains('@');
                ok.then(|| Rua::Mailto(addr.to_owned()))
            } else if uri.starts_with("https://") && uri.len() <= 2048 && uri.is_ascii() {
                Some(Rua::Https(uri.to_owned()))
            } else {
                None
            }
        })
        .take(MAX_RUA)
        .collect()
}

/// The report for `domain` over `[start, end]` (Unix ms).
pub fn json(
    domain: &str,
    counts: &DomainCounts,
    hostname: &str,
    report_id: &str,
    start: i64,
    end: i64,
) -> Value {
    let policies: Vec<Value> = counts
        .policies
        .iter()
        .map(|(kind, strings, c)| {
            let details: Vec<Value> = c
                .details
                .iter()
                .map(|(f, n)| {
                    let mut d = json!({
                        "result-type": f.result_type,
                        "receiving-mx-hostname": f.mx_host,
                        "failed-session-count": n,
                    });
                    if let (Some(ip), Some(map)) = (f.ip, d.as_object_mut()) {
                        map.insert("receiving-ip".into(), json!(ip.to_string()));
                    }
                    d
                })
                .collect();
            json!({
                "policy": {
                    "policy-type": kind.name(),
                    "policy-string": strings,
                    "policy-domain": domain,
                },
                "summary": {
                    "total-successful-session-count": c.successes,
                    "total-failure-session-count": c.failures,
                },
                "failure-details": details,
            })
        })
        .collect();
    json!({
        "organization-name": hostname,
        "date-range": {
            "start-datetime": crate::time::rfc3339_millis(start),
            "end-datetime": crate::time::rfc3339_millis(end),
        },
        "contact-info": format!("postmaster@{hostname}"),
        "report-id": report_id,
        "policies": policies,
    })
}

pub fn gzip(json: &Value) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(json.to_string().as_bytes())?;
    gz.finish()
}

/// The report as mail (RFC 8460 5.3): `multipart/report;
/// report-type="tlsrpt"`, the gzipped JSON attached. `TLS-Required: No`
/// (RFC 8689 5): a report about broken TLS must still arrive.
pub fn mail(
    domain: &str,
    to: &str,
    hostname: &str,
    report_id: &str,
    gz: &[u8],
    now_secs: i64,
    (start, end): (i64, i64),
) -> Vec<u8> {
    let boundary = format!("tlsrpt-{}", uuid::Uuid::new_v4().simple());
    let b64 = base64::engine::general_purpose::STANDARD.encode(gz);
    let mut body = String::new();
    for chunk in b64.as_bytes().chunks(76) {
        body.push_str(&String::from_utf8_lossy(chunk));
        body.push_str("\r\n");
    }
    let file = format!(
        "{hostname}!{domain}!{}!{}.json.gz",
        start / 1000,
        end / 1000
    );
    format!(
        "From: TLS reporting <postmaster@{hostname}>\r\n\
         To: <{to}>\r\n\
         Subject: Report Domain: {domain} Submitter: {hostname} Report-ID: <{report_id}>\r\n\
         Date: {date}\r\n\
         Message-ID: <{report_id}>\r\n\
         TLS-Report-Domain: {domain}\r\n\
         TLS-Report-Submitter: {hostname}\r\n\
         TLS-Required: No\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=\"tlsrpt\"; boundary=\"{boundary}\"\r\n\
         \r\n\
         --{boundary}\r\n\
         Content-Type: text/plain; charset=us-ascii\r\n\
         \r\n\
         This is an aggregate TLS report (RFC 8460) from {hostname} for {domain}.\r\n\
         \r\n\
         --{boundary}\r\n\
         Content-Type: application/tlsrpt+gzip\r\n\
         Content-Transfer-Encoding: base64\r\n\
         Content-Disposition: attachment; filename=\"{file}\"\r\n\
         \r\n\
         {body}\
         --{boundary}--\r\n",
        date = crate::time::rfc5322_date(now_secs),
    )
    .into_bytes()
}

/// The policy types of a domain's counts, for the log.
pub fn kinds(counts: &DomainCounts) -> Vec<PolicyType> {
    counts.policies.iter().map(|(k, ..)| *k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rua_takes_one_record_and_known_schemes() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rua(&s(&[
                "v=TLSRPTv1; rua=mailto:tls@example.test,https://r.example.test/v1"
            ])),
            vec![
                Rua::Mailto("tls@example.test".into()),
                Rua::Https("https://r.example.test/v1".into())
            ]
        );
        assert_eq!(
            rua(&s(&["v=TLSRPTv1;rua=mailto:a@b.test?subject=x"])),
            vec![Rua::Mailto("a@b.test".into())]
        );
        assert!(
            rua(&s(&[
                "v=TLSRPTv1; rua=mailto:a@b.test",
                "v=TLSRPTv1; rua=mailto:c@d.test"
            ]))
            .is_empty()
        );
        assert!(
            rua(&s(&[
                "v=TLSRPTv1; rua=http://insecure.test/,ftp://x,mailto:bad"
            ]))
            .is_empty()
        );
        assert!(rua(&s(&["v=spf1 -all"])).is_empty());
    }
}
