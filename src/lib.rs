//! smtp-once: an SMTP submission relay with exactly-once acceptance.
//!
//! The layout, from the top down (an arrow only ever points down a floor;
//! `ARCHITECTURE.md` has every file and the path of one message):
//!
//! - [`cli`]: the commands; `cli::serve` is the composition root that builds
//!   a node from its config and runs it.
//! - Fronts: [`server`] (SMTP connections over [`smtp`], the sans-I/O
//!   session), [`http`] (the JSON API) with [`console`] (its web pages, on
//!   the same listener), [`metrics_http`]; every listener
//!   admitted by [`front_door`] with [`auth`] and [`budget`].
//! - Acceptance: [`accept`] (one pipeline for every front: key, fingerprint,
//!   claim, decision, one commit) on [`idempotency`] (the decision, claims and
//!   fingerprints, apart from storage) and [`dkim`].
//! - Delivery: [`delivery`] (the worker relaying the queue onward over
//!   [`smtp_client`]) and [`webhook`] (events from the outbox); neither
//!   knows the inbound side.
//! - Storage: [`store`], small traits with `sqlite` and `postgres` side by
//!   side; it knows no SMTP, HTTP or delivery type.
//! - [`config`]: the TOML, checked whole; it knows no listener or transport.
//! - Ground floor, imported by all and importing none of the above:
//!   [`address`], [`message`], [`submission`], [`content_check`],
//!   [`event_type`], [`time`], [`clock`], [`tls`], [`net`], [`metrics`],
//!   [`private_fs`], [`fd_limit`], [`terminal`], [`backlog`].
//! - [`send`]: `smtp-once send`, a client that uses only the ground floor.

pub mod accept;
pub mod address;
pub mod auth;
pub mod backlog;
pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
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
pub mod queue_count;
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
