//! Delivery-status webhooks (Standard Webhooks): `route` turns a state
//! change into outbox rows (written by the store in the state change's own
//! transaction), `sender` POSTs them signed (`sign`) and retries per
//! `policy`. `handoff` gives fresh events to this node's sender without a
//! claim. The operator commands are `cli/webhooks.rs`.

pub mod handoff;
mod http;
pub mod policy;
pub mod route;
pub mod sender;
pub mod sign;

pub use route::Router;
pub use sender::Sender;
