//! Durations as the config writes them: `90s`, `5m`, `3h`, `2d`, `250ms`.

use std::time::Duration;

/// The longest duration a setting may have: far beyond any real use, and
/// short enough that adding it to a clock or doubling it cannot overflow.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

/// Parses `90s`, `5m`, `3h`, `2d`, `250ms`, or a combination such as `1h30m`.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err("empty duration (use e.g. 30s, 5m, 3h)".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{value:?} is not a duration like 30s, 5m or 3h"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{value:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "d" => n.checked_mul(86400).map(Duration::from_secs),
            _ => return Err(format!("{value:?}: unit must be ms, s, m, h or d")),
        };
        total = part
            .and_then(|part| total.checked_add(part))
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(|| format!("{value:?}: longer than 100 years"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::parse_duration;
    use crate::config::Config;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(10800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("3 hours").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("999999999999999999d").is_err());
        assert!(parse_duration("18446744073709551615s1s").is_err());
    }

    /// Durations feed `Instant + d` in every session and `d * 2` in
    /// validation: one that overflows must be a problem by key, never a
    /// panic in check-config or in each connection's task.
    #[test]
    fn absurd_durations_are_refused_by_key() {
        assert!(parse_duration("9999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615s1s").is_err());
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n";
        for (extra, key) in [
            (
                "[limits]\ncommand_time_limit = \"200000000000000d\"\n",
                "limits.command_time_limit: ",
            ),
            (
                "[relay]\nmode = \"mx\"\ntimeout = \"200000000000000d\"\n",
                "relay.timeout: ",
            ),
            (
                "[idempotency]\nretention = \"18446744073709551615s1s\"\n",
                "idempotency.retention: ",
            ),
        ] {
            let err = Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }
}
