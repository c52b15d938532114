//! Ground floor: calendar dates from Unix time, as mail and webhooks write
//! them (RFC 5322 for `Received:`, `Date:` and DSNs; RFC 3339 for webhook
//! payloads and `webhooks redeliver --since`). Pure arithmetic in UTC;
//! imports no crate module. "Now" itself comes from `clock.rs`.

/// `Mon, 30 Nov 2026 20:06:34 +0000` from Unix seconds (UTC).
pub fn rfc5322_date(secs: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} +0000",
        DAYS[days.rem_euclid(7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2026-11-30T20:06:34.123Z` from Unix milliseconds (RFC 3339, UTC): the
/// webhook payloads' event time.
pub fn rfc3339_millis(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

/// Unix milliseconds from `2026-11-30T20:06:34Z` (seconds, optional
/// fraction, `Z` or `+00:00`): the `--since` of `webhooks redeliver`.
pub fn parse_rfc3339_utc(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = t.strip_suffix('Z').or_else(|| t.strip_suffix("+00:00"))?;
    let (date, time) = t.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut h = hms.splitn(3, ':').map(str::parse::<i64>);
    let (hh, mm, ss) = (h.next()?.ok()?, h.next()?.ok()?, h.next()?.ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let millis = match frac.get(..frac.len().min(3)) {
        Some("") | None => 0,
        Some(f) => f.parse::<i64>().ok()? * 10_i64.pow(3 - f.len() as u32),
    };
    let days = days_from_civil(y, m, day);
    Some(((days * 86400 + hh * 3600 + mm * 60 + ss) * 1000) + millis)
}

/// Howard Hinnant's civil-to-days algorithm.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        for ms in [0, 951_782_400_000, 1_796_069_194_007] {
            assert_eq!(parse_rfc3339_utc(&rfc3339_millis(ms)), Some(ms));
        }
        assert_eq!(
            parse_rfc3339_utc("2026-11-30T20:06:34+00:00"),
            Some(1_796_069_194_000)
        );
        assert_eq!(parse_rfc3339_utc("2026-13-30T20:06:34Z"), None);
        assert_eq!(parse_rfc3339_utc("yesterday"), None);
        assert_eq!(
            rfc3339_millis(1_796_069_194_007),
            "2026-11-30T20:06:34.007Z"
        );
        assert_eq!(rfc5322_date(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(
            rfc5322_date(1_796_069_194),
            "Mon, 30 Nov 2026 20:06:34 +0000"
        );
        assert_eq!(rfc5322_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 +0000");
    }
}
