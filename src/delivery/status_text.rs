//! What `smtp-once status` adds about delivery: each recipient's outcome
//! and every attempt, as recorded in `delivery_attempt`.

use crate::store::AttemptRecord;
use crate::time::rfc5322_date;

/// The lines after the message summary.
pub fn format_delivery(recipients: &[String], attempts: &[AttemptRecord]) -> String {
    let mut out = String::new();
    let last = attempts.last();
    out.push_str(&format!(
        "last reply:   {}\n",
        last.map_or("-".to_string(), |a| format!(
            "<{}> {}",
            a.recipient, a.reply
        ))
    ));
    out.push_str("per recipient:\n");
    let width = recipients.iter().map(|r| r.len() + 2).max().unwrap_or(0);
    for rcpt in recipients {
        let latest = attempts.iter().rev().find(|a| a.recipient == *rcpt);
        let (state, reply) = match latest {
            None => ("pending", "-"),
            Some(a) if a.outcome == "deferred" => ("pending", a.reply.as_str()),
            Some(a) => (a.outcome.as_str(), a.reply.as_str()),
        };
        out.push_str(&format!(
            "  {:<width$}  {state:<9}  {reply}\n",
            format!("<{rcpt}>")
        ));
    }
    out.push_str("history:\n");
    for a in attempts {
        let via = a
            .next_hop
            .as_deref()
            .map_or(String::new(), |h| format!(" via {h}"));
        out.push_str(&format!(
            "  {}  <{}>  {}{via}: {}\n",
            rfc5322_date(a.at / 1000),
            a.recipient,
            a.outcome,
            a.reply
        ));
    }
    out
}
