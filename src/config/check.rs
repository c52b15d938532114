//! Every problem of a config file, by key, and the order the sections are
//! checked in (which is the order `check-config` lists their problems).

use std::path::Path;

use super::problems::Problems;
use super::{
    Config, RawConfig, auth, dkim, http, idempotency, limits, listener, metrics, relay, server,
    store, users, webhook,
};

/// Checks every section of `raw` and builds the `Config` from what each
/// one gives back. Paths are resolved against `base`, the file's folder.
pub(super) fn check(raw: RawConfig, path: &Path, base: &Path, p: &mut Problems) -> Config {
    let has_tls = raw.tls.is_some();
    let server = server::check(&raw.server, base, p);
    let listeners = listener::check_listeners(&raw.listeners, has_tls, p);
    let tls = listener::check_tls(raw.tls.as_ref(), base, p);
    let users = users::check_users(&raw.users, p);
    let trusted_networks = users::check_trusted_networks(&raw.trusted_networks, p);
    users::check_someone_can_submit(&users, &trusted_networks, p);
    let idempotency = idempotency::check(&raw.idempotency, p);
    let relay = relay::check_relay(&raw.relay, base, p);
    let delivery = relay::check_delivery(&raw.relay, base, p);
    let limits = limits::check(&raw.limits, p);
    let store = store::check(&raw.store, base, p);
    let http = http::check(raw.http.as_ref(), has_tls, p);
    let node_id = store::node_id(raw.server.node_id.as_deref(), p);
    let auth = auth::check(&raw.auth, p);
    let webhooks = webhook::check(&raw.webhooks, base, p);
    let workspaces = users::workspaces(&raw.users, &raw.trusted_networks);
    let dkim = dkim::check(&raw.dkim, base, &workspaces, p);
    dkim::check_unsigned_key_headers(&raw.dkim, &raw.idempotency.key_headers, p);
    let metrics = metrics::check(raw.metrics.as_ref(), p);

    Config {
        path: path.to_path_buf(),
        hostname: server.hostname,
        received_auth_header: server.received_auth_header,
        data_dir: server.data_dir,
        node_id,
        store,
        http,
        max_message_size: server.max_message_size,
        max_recipients: server.max_recipients,
        max_connections: server.max_connections,
        command_timeout: server.command_timeout,
        data_timeout: server.data_timeout,
        max_bad_commands: server.max_bad_commands,
        shutdown_grace: server.shutdown_grace,
        listeners,
        tls,
        allow_plaintext_auth: raw.auth.allow_plaintext,
        auth,
        users,
        trusted_networks,
        retention: idempotency.retention,
        purge_interval: idempotency.purge_interval,
        volatile_headers: idempotency.volatile_headers,
        transit_headers: idempotency.transit_headers,
        key_headers: idempotency.key_headers,
        relay,
        delivery,
        limits,
        metrics,
        webhooks,
        dkim,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ConfigError};

    #[test]
    fn problems_are_reported_by_key() {
        let text = r#"
[server]
hostname = "relay.test"
data_dir = "data"
command_timeout = "soon"

[[listener]]
addr = "nowhere"
tls = "starttls"

[[user]]
name = "a"
password_hash = "plain"
workspace = "w"
allowed_senders = ["@@"]

[relay]
mode = "pigeon"
"#;
        let err = Config::from_toml(Path::new("/tmp/x.toml"), text).unwrap_err();
        let ConfigError::Invalid { problems, .. } = err else {
            panic!("expected Invalid, got {err}");
        };
        let keys: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap_or(""))
            .collect();
        for key in [
            "server.command_timeout",
            "listener[0].addr",
            "user[0].password_hash",
            "user[0].allowed_senders[0]",
            "relay.mode",
        ] {
            assert!(keys.contains(&key), "{key} missing from {problems:?}");
        }
    }

    /// These size tokio semaphores, which panic above MAX_PERMITS: for
    /// relay.workers inside the delivery task, leaving a daemon that
    /// accepts mail and never delivers it.
    #[test]
    fn counts_that_size_semaphores_are_bounded() {
        let huge = 3_000_000_000_000_000_000u64;
        let text = format!(
            "[server]\nhostname = \"h\"\ndata_dir = \"d\"\nmax_connections = {huge}\n\
             [[listener]]\naddr = \"127.0.0.1:0\"\n\
             [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n\
             [relay]\nmode = \"mx\"\nworkers = {huge}\nmax_per_destination = {huge}\n"
        );
        let err = Config::from_toml(Path::new("x.toml"), &text)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        for key in [
            "server.max_connections: must be at most",
            "relay.workers: must be at most",
            "relay.max_per_destination: must be at most",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }
}
