//! The open-file limit. Every connection, refusal, SQLite file and
//! delivery socket takes a descriptor; the usual soft limit of 1024 is less
//! than `max_connections` (1000) plus everything else, and running out
//! turns every new client away. So `serve` raises the soft limit to the
//! hard one, as Postfix's master does, and says so when even that is short.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors the daemon needs besides its connections: the store's
/// connections, the delivery worker's sockets, refusals in progress, logs.
pub const RESERVED: u64 = 256;

/// Raises the soft limit to the hard limit; returns the soft limit now in
/// force (None if it is unlimited).
pub fn raise_to_hard_limit() -> std::io::Result<Option<u64>> {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current != maximum {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: maximum,
                maximum,
            },
        )?;
    }
    Ok(getrlimit(Resource::Nofile).current)
}

/// The warning to log when `limit` cannot carry `max_connections`.
pub fn shortfall(limit: Option<u64>, max_connections: usize) -> Option<String> {
    let limit = limit?;
    let needed = (max_connections as u64).saturating_add(RESERVED);
    (limit < needed).then(|| {
        format!(
            "open-file limit {limit} is below max_connections + {RESERVED} = {needed}; \
             raise it (e.g. LimitNOFILE= in the systemd unit) or lower server.max_connections"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limit_ends_at_the_hard_limit() {
        let hard = getrlimit(Resource::Nofile).maximum;
        let now = raise_to_hard_limit().expect("raise");
        assert_eq!(now, hard);
    }

    #[test]
    fn shortfall_is_reported_with_the_figures() {
        assert!(shortfall(Some(1024), 1000).is_some_and(|w| w.contains("1256")));
        assert_eq!(shortfall(Some(65536), 1000), None);
        assert_eq!(shortfall(None, 1000), None);
    }
}
