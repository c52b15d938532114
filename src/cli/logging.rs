//! `serve`'s log lines on stderr: text or JSON (`--log-format`), filtered
//! by `RUST_LOG`, with the SQL crates held at `info` whatever it says.

use std::io::IsTerminal;

use super::LogFormat;

/// Crates whose debug and trace records carry SQL parameters: tokio-postgres
/// logs every statement's parameters at debug, message bodies, keys and
/// addresses included. They are held at `info` whatever `RUST_LOG` says,
/// even when it names them: message content never reaches the log.
const SQL_CRATES: [&str; 4] = [
    "tokio_postgres",
    "postgres_protocol",
    "postgres_types",
    "deadpool",
];

/// The cap on [`SQL_CRATES`], applied after `RUST_LOG`'s filter: a record
/// passes only when both let it through.
fn sql_cap() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    SQL_CRATES
        .iter()
        .fold(Targets::new().with_default(LevelFilter::TRACE), |t, c| {
            t.with_target(*c, LevelFilter::INFO)
        })
}

pub(super) fn init(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(sql_cap())
            .try_init(),
        // One object per line: timestamp, level, target, and the event's
        // fields (message included) at the top level.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish()
            .with(sql_cap())
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    #[test]
    fn sql_crates_stay_at_info_whatever_rust_log_says() {
        let cap = super::sql_cap();
        assert!(!cap.would_enable("tokio_postgres::query", &Level::DEBUG));
        assert!(!cap.would_enable("deadpool_postgres", &Level::TRACE));
        assert!(cap.would_enable("tokio_postgres::connection", &Level::INFO));
        assert!(cap.would_enable("smtp_once::accept", &Level::TRACE));
    }
}
