//! Host and port strings, shared by configuration checks and delivery.

/// Splits `host[:port]` (`[v6]:port` too); `default_port` when none is given.
pub fn split_host_port(value: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{value:?}: missing ]"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("{value:?}: expected :port after ]"))?,
            ),
        };
        (host, port)
    } else {
        match value.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (value, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{value:?}: empty host"));
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{value:?}: bad port"))?,
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::split_host_port as hp;

    #[test]
    fn host_and_port() {
        assert_eq!(
            hp("smtp.example.net:2525", 587),
            Ok(("smtp.example.net".into(), 2525))
        );
        assert_eq!(
            hp("smtp.example.net", 587),
            Ok(("smtp.example.net".into(), 587))
        );
        assert_eq!(hp("[::1]:25", 587), Ok(("::1".into(), 25)));
        assert_eq!(hp("[::1]", 465), Ok(("::1".into(), 465)));
        assert!(hp("host:0", 25).is_err());
        assert!(hp(":25", 25).is_err());
        // Something after the bracket that is not ":port" is not dropped.
        assert!(hp("[::1]2525", 587).is_err());
        assert!(hp("[::1]x:25", 587).is_err());
    }
}
