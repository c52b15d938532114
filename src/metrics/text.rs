//! The two exposition formats `/metrics` speaks: which one a client asked
//! for, and the Prometheus text format 0.0.4 made from the OpenMetrics text
//! that prometheus-client writes (the crate encodes OpenMetrics only).
//!
//! Prometheus asks for OpenMetrics; everything else (curl, `promtool check
//! metrics`, agents that send `Accept: text/plain` or nothing) reads 0.0.4,
//! where a counter's family is named with its `_total` and there is no
//! `# EOF`, `# UNIT`, `_created` series or exemplar.

use std::collections::HashMap;
use std::fmt::Write as _;

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

const OPENMETRICS_TYPE: &str = "application/openmetrics-text";

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format for this `Accept` header: OpenMetrics when it names
    /// `application/openmetrics-text` with a quality no lower than any other
    /// range it accepts (Prometheus: `application/openmetrics-text;
    /// version=1.0.0,...,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`), else
    /// the text format, also for no header, `*/*` or `text/plain`.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let mut openmetrics = 0.0_f32;
        let mut other = 0.0_f32;
        for range in accept.unwrap_or_default().split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            if media.is_empty() {
                continue;
            }
            // A malformed q counts as 1, as if absent.
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(1.0));
            let best = if media.eq_ignore_ascii_case(OPENMETRICS_TYPE) {
                &mut openmetrics
            } else {
                &mut other
            };
            *best = best.max(q);
        }
        if openmetrics > 0.0 && openmetrics >= other {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }
}

/// The 0.0.4 text for an OpenMetrics text exposition.
pub(super) fn from_openmetrics(openmetrics: &str) -> String {
    // Each family's OpenMetrics type, to name its HELP line (written
    // before its TYPE line) as the text format wants.
    let types: HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    // The family whose samples follow: its name and OpenMetrics type.
    let mut family: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = types.get(name).copied().unwrap_or("unknown");
            let (name, _) = text_family(name, kind);
            let _ = writeln!(out, "# HELP {name} {}", help_text(help));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            family = Some((name, kind));
            let (name, kind) = text_family(name, kind);
            let _ = writeln!(out, "# TYPE {name} {kind}");
        } else if line.starts_with('#') || line.is_empty() {
            // `# UNIT` and `# EOF` have no place in 0.0.4.
        } else if let Some(sample) = text_sample(line, family) {
            out.push_str(&sample);
            out.push('\n');
        }
    }
    out
}

/// A family's name and type in the text format.
fn text_family<'a>(name: &'a str, kind: &str) -> (std::borrow::Cow<'a, str>, &'static str) {
    match kind {
        "counter" => (format!("{name}_total").into(), "counter"),
        "info" => (format!("{name}_info").into(), "gauge"),
        "gauge" | "stateset" => (name.into(), "gauge"),
        "histogram" => (name.into(), "histogram"),
        "summary" => (name.into(), "summary"),
        _ => (name.into(), "untyped"),
    }
}

/// HELP text: OpenMetrics also escapes `"`, which 0.0.4 does not allow.
fn help_text(help: &str) -> String {
    help.replace("\\\"", "\"")
}

/// A sample line in the text format, or `None` for one it has no place
/// for (`_created`): without the exemplar, the timestamp in milliseconds.
fn text_sample(line: &str, family: Option<(&str, &str)>) -> Option<String> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if let Some((family, kind)) = family {
        let created = name
            .strip_prefix(family)
            .is_some_and(|suffix| suffix == "_created");
        if created && matches!(kind, "counter" | "histogram" | "summary" | "gaugehistogram") {
            return None;
        }
    }
    let labels_end = if line[name_end..].starts_with('{') {
        name_end + label_set_len(&line[name_end..])
    } else {
        name_end
    };
    let (series, rest) = line.split_at(labels_end);
    // Value, then an optional timestamp, then an optional ` # ` exemplar.
    let rest = rest.split(" # ").next().unwrap_or_default();
    let mut fields = rest.split_whitespace();
    let value = fields.next()?;
    let mut sample = format!("{series} {value}");
    if let Some(seconds) = fields.next().and_then(|t| t.parse::<f64>().ok()) {
        // Seconds (OpenMetrics) to milliseconds (0.0.4).
        #[allow(clippy::cast_possible_truncation)]
        let millis = (seconds * 1000.0).round() as i64;
        let _ = write!(sample, " {millis}");
    }
    Some(sample)
}

/// The length of the `{...}` label set at the start of `s`, quotes and
/// escapes inside values respected (a value may hold `}` or ` # `).
fn label_set_len(s: &str) -> usize {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return i + 1,
            _ => {}
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_client_gets_text_and_prometheus_gets_openmetrics() {
        let prometheus = "application/openmetrics-text;version=1.0.0,\
            application/openmetrics-text;version=0.0.1;q=0.75,\
            text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        for accept in [
            None,
            Some(""),
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("text/plain, application/openmetrics-text;q=0.5"),
            Some("application/openmetrics-text;q=0"),
            Some("application/json"),
        ] {
            assert_eq!(Format::from_accept(accept), Format::Text, "{accept:?}");
        }
    }

    #[test]
    fn counters_are_named_with_total_and_openmetrics_only_lines_go() {
        let om = "# HELP a_requests Requests.\n\
                  # TYPE a_requests counter\n\
                  a_requests_total{code=\"200\"} 3\n\
                  a_requests_created{code=\"200\"} 1700000000.0\n\
                  # HELP a_latency_seconds Latency.\n\
                  # TYPE a_latency_seconds histogram\n\
                  # UNIT a_latency_seconds seconds\n\
                  a_latency_seconds_sum 0.5\n\
                  a_latency_seconds_count 1\n\
                  a_latency_seconds_bucket{le=\"+Inf\"} 1 # {trace_id=\"x # y}\"} 0.5 1700000000.5\n\
                  # HELP a_depth Depth \\\"now\\\".\n\
                  # TYPE a_depth gauge\n\
                  a_depth 2.0 1700000000.25\n\
                  # HELP a_build Build.\n\
                  # TYPE a_build info\n\
                  a_build_info{version=\"1 } # 2\"} 1\n\
                  # EOF\n";
        assert_eq!(
            from_openmetrics(om),
            "# HELP a_requests_total Requests.\n\
             # TYPE a_requests_total counter\n\
             a_requests_total{code=\"200\"} 3\n\
             # HELP a_latency_seconds Latency.\n\
             # TYPE a_latency_seconds histogram\n\
             a_latency_seconds_sum 0.5\n\
             a_latency_seconds_count 1\n\
             a_latency_seconds_bucket{le=\"+Inf\"} 1\n\
             # HELP a_depth Depth \"now\".\n\
             # TYPE a_depth gauge\n\
             a_depth 2.0 1700000000250\n\
             # HELP a_build_info Build.\n\
             # TYPE a_build_info gauge\n\
             a_build_info{version=\"1 } # 2\"} 1\n"
        );
    }
}
