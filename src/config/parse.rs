//! From the parsed TOML table to `RawConfig`, listing every unknown key,
//! wrong-typed value and missing key by its path instead of stopping at the
//! first one, as serde alone would.

use serde_path_to_error::Segment;

use super::RawConfig;
use super::problems::Problems;

/// More passes than this and the file is not worth listing further.
const MAX_STRUCTURAL_PROBLEMS: usize = 100;

/// Builds `RawConfig` from the parsed file. serde stops at the first unknown
/// key, wrong-typed value or missing key; `serde_path_to_error` says where,
/// so each one is noted by key, taken out of the way (an unknown or
/// wrong-typed key removed, so its default applies; a missing key given an
/// empty stand-in) and the file deserialised again, until it goes through.
/// Returns the raw config and the keys already reported, or `None` when it
/// cannot be built (the problems found so far are in `p`).
pub(super) fn parse_raw(
    mut table: toml::Table,
    p: &mut Problems,
) -> Option<(RawConfig, Vec<String>)> {
    let mut reported: Vec<String> = Vec::new();
    let mut stand_ins: Vec<String> = Vec::new();
    while reported.len() <= MAX_STRUCTURAL_PROBLEMS {
        let value = toml::Value::Table(table.clone());
        let err = match serde_path_to_error::deserialize::<_, RawConfig>(value) {
            Ok(raw) => return Some((raw, reported)),
            Err(err) => err,
        };
        let segments: Vec<&Segment> = err.path().iter().collect();
        let at = key_path(&segments);
        let message = err.inner().message();
        if message.starts_with("unknown field `") {
            // The path already ends in the unknown key.
            p.add(&at, "unknown key");
            if !remove_at(&mut table, &segments) {
                return None;
            }
            reported.push(at);
        } else if let Some(field) = quoted_after(message, "missing field `") {
            let key = if at.is_empty() {
                field.to_string()
            } else {
                format!("{at}.{field}")
            };
            // A key removed for its type, or inside a missing section, is
            // already reported.
            if !reported.iter().any(|r| key == *r || within(&key, r)) {
                p.add(&key, "missing (required)");
            }
            reported.push(key.clone());
            if !insert_at(
                &mut table,
                &segments,
                field,
                toml::Value::String(String::new()),
            ) {
                return None;
            }
            stand_ins.push(key);
        } else if stand_ins.contains(&at) {
            // The stand-in has the wrong type: a whole missing section.
            match value_at(&mut table, &segments) {
                Some(v @ toml::Value::String(_)) => *v = toml::Value::Table(toml::Table::new()),
                _ => return None,
            }
        } else {
            p.add(&at, message.trim_end());
            // An element of the wrong type: drop the whole list, so the
            // other elements keep their indices in later messages.
            let whole = match segments
                .iter()
                .rposition(|s| !matches!(s, Segment::Seq { .. }))
            {
                Some(i) => &segments[..=i],
                None => return None,
            };
            if !remove_at(&mut table, whole) {
                return None;
            }
            reported.push(at);
        }
    }
    p.add(
        "config",
        format!("more than {MAX_STRUCTURAL_PROBLEMS} problems, stopped listing"),
    );
    None
}

/// Drops validation problems of keys already reported by `parse_raw`: they
/// hold a stand-in or default value, and their checks would only repeat the
/// problem in other words.
pub(super) fn drop_repeats(problems: &mut Problems, reported: &[String]) {
    problems.0.retain(|p| {
        let key = p.split_once(": ").map_or(p.as_str(), |(k, _)| k);
        !reported.iter().any(|r| key == r || within(key, r))
    });
}

/// `key` names something inside `outer` (`outer.x`, `outer[0]`).
fn within(key: &str, outer: &str) -> bool {
    key.strip_prefix(outer)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// `user[1].password_hash`; empty for the top level.
fn key_path(segments: &[&Segment]) -> String {
    let mut out = String::new();
    for s in segments {
        match s {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// `x` in "... `x` ..." right after `prefix` (serde's wording for unknown and
/// missing fields).
fn quoted_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(prefix)?;
    rest.split_once('`').map(|(name, _)| name)
}

fn value_at<'a>(table: &'a mut toml::Table, segments: &[&Segment]) -> Option<&'a mut toml::Value> {
    let (first, rest) = segments.split_first()?;
    let Segment::Map { key } = first else {
        return None;
    };
    let mut value = table.get_mut(key.as_str())?;
    for s in rest {
        value = match (s, value) {
            (Segment::Map { key }, toml::Value::Table(t)) => t.get_mut(key.as_str())?,
            (Segment::Seq { index }, toml::Value::Array(a)) => a.get_mut(*index)?,
            _ => return None,
        };
    }
    Some(value)
}

/// The table `segments` lead to (the top level when empty).
fn table_at<'a>(table: &'a mut toml::Table, segments: &[&Segment]) -> Option<&'a mut toml::Table> {
    if segments.is_empty() {
        return Some(table);
    }
    match value_at(table, segments)? {
        toml::Value::Table(t) => Some(t),
        _ => None,
    }
}

fn remove_at(table: &mut toml::Table, segments: &[&Segment]) -> bool {
    let Some((Segment::Map { key }, parent)) = segments.split_last() else {
        return false;
    };
    table_at(table, parent).is_some_and(|t| t.remove(key.as_str()).is_some())
}

fn insert_at(
    table: &mut toml::Table,
    segments: &[&Segment],
    key: &str,
    value: toml::Value,
) -> bool {
    match table_at(table, segments) {
        Some(t) if !t.contains_key(key) => {
            t.insert(key.to_string(), value);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ConfigError};

    fn problems_of(text: &str) -> Vec<String> {
        match Config::from_toml(Path::new("/tmp/x.toml"), text) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            Err(e) => panic!("expected Invalid, got {e}"),
            Ok(_) => panic!("expected problems"),
        }
    }

    const VALID: &str = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\n\
         [[trusted_network]]\ncidr = \"127.0.0.0/8\"\nworkspace = \"w\"\n\
         [relay]\nmode = \"mx\"\n";

    #[test]
    fn unknown_keys_and_bad_values_are_listed_together() {
        let text = r#"
[server]
hostname = "relay.test"
data_dir = "data"
max_mesage_size = 1
command_timeout = "soon"
max_recipients = "many"

[[listener]]
addr = "127.0.0.1:2587"

[[trusted_network]]
cidr = "127.0.0.0/8"
workspace = "w"

[limits]
foo = 1

[relay]
mode = "pigeon"
"#;
        let problems = problems_of(text);
        assert_eq!(
            problems,
            [
                "limits.foo: unknown key",
                "server.max_mesage_size: unknown key",
                "server.max_recipients: invalid type: string \"many\", expected usize",
                "server.command_timeout: \"soon\" is not a duration like 30s, 5m or 3h",
                "relay.mode: \"pigeon\" must be file, smarthost or mx",
            ]
        );
    }

    #[test]
    fn a_misspelt_required_key_is_unknown_and_missing_once() {
        let text = format!(
            "{VALID}[[user]]\nname = \"a\"\npassword_hash = \"{}\"\nworkspace = \"w\"\n\
             [[user]]\nname = \"b\"\npasword_hash = \"x\"\nworkspace = \"w\"\n",
            crate::auth::hash_password("pw").unwrap()
        );
        assert_eq!(
            problems_of(&text),
            [
                "user[1].pasword_hash: unknown key",
                "user[1].password_hash: missing (required)",
            ]
        );
        // A whole missing section: said once, not once per key in it.
        let problems = problems_of("[[listener]]\naddr = \"127.0.0.1:0\"\n");
        assert!(
            problems.contains(&"server: missing (required)".to_string()),
            "{problems:?}"
        );
        assert!(
            !problems.iter().any(|p| p.starts_with("server.")),
            "{problems:?}"
        );
        // A list element of the wrong type.
        let problems = problems_of(&format!(
            "{VALID}[[user]]\nname = \"a\"\npassword_hash = \"x\"\nworkspace = \"w\"\nallowed_senders = [\"a@b\", 5]\n"
        ));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("user[0].allowed_senders[1]: invalid type")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("user[0].password_hash: ")),
            "{problems:?}"
        );
        assert!(Config::from_toml(Path::new("/tmp/x.toml"), VALID).is_ok());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\nmax_mesage_size = 1\n";
        let err = Config::from_toml(Path::new("x.toml"), text).unwrap_err();
        assert!(err.to_string().contains("max_mesage_size"), "{err}");
    }
}
