//! smtp-once: an SMTP submission relay with exactly-once acceptance.
//!
//! See `ARCHITECTURE.md` for the modules and the path of one message.

pub mod accept;
pub mod address;
pub mod auth;
pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod content_check;
pub mod delivery;
pub mod dkim;
pub mod event_type;
pub mod fd_limit;
pub mod front_door;
pub mod http;
pub mod idempotency;
pub mod message;
pub mod metrics;
pub mod metrics_http;
pub mod net;
pub mod private_fs;
pub mod send;
pub mod server;
pub mod smtp;
pub mod smtp_client;
pub mod store;
pub mod submission;
pub mod terminal;
pub mod time;
pub mod tls;
pub mod webhook;
