//! Fresh events straight to this node's sender, without a claim.
//!
//! A claim is a writer transaction that reads the due rows and rewrites
//! each of them (`pending` to `sending`): for events that were written a
//! moment ago by this very node, that costs more than writing them did. So
//! while an endpoint's window has room, the producer takes a window permit
//! per event, the event is written already leased to this node (`sending`,
//! `lease_ms`), and after the commit it goes to the sender over a channel.
//! The permits bound what the channel can hold. When the window is full
//! (a slow endpoint), events are written `pending` and wait for a claim as
//! before, so a slow endpoint still slows nothing else; and until a claim
//! finds nothing more due, the fresh ones queue behind them (`backlog`),
//! so that older events are not overtaken for as long as the load lasts.
//!
//! Crash safety is the claim's: a leased row whose POST never happened is
//! given back by `release_events` at the next start (or, on PostgreSQL, by
//! its lease's end on any node). An event whose commit failed is dropped
//! with its permit: it was never written, so it is never sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::config::WebhookEndpoint;
use crate::store::outbox::OutboxEvent;

/// A claimed or handed-over event stays ours this long; its POST is cut
/// off at the endpoint's timeout, well within it.
pub const LEASE: Duration = Duration::from_secs(300);

/// Claimed events per endpoint, in units of `max_in_flight`.
pub const WINDOW_FACTOR: usize = 4;

pub const OPEN: u8 = 0;
/// This process saw a 410; the record is on its way.
pub const DISABLING: u8 = 1;
pub const DISABLED: u8 = 2;

/// What the producers and the sender share for one endpoint.
pub struct Lane {
    /// Events claimed or handed over and not yet recorded: a few times
    /// `max_in_flight`, so a POST slot never waits for the next claim.
    pub window: Arc<Semaphore>,
    /// OPEN, DISABLING or DISABLED: only an open endpoint is handed events.
    pub state: AtomicU8,
    /// Events went `pending` for want of room, and no claim has found the
    /// outbox drained since: fresh ones are written `pending` too.
    pub backlog: AtomicBool,
}

/// The producers' side: cheap to clone into every `Router`.
#[derive(Clone)]
pub struct Handoff {
    lanes: Arc<HashMap<String, Arc<Lane>>>,
    to_sender: mpsc::UnboundedSender<Direct>,
}

/// The sender's side.
pub struct Inbox {
    pub lanes: Arc<HashMap<String, Arc<Lane>>>,
    pub from_producers: mpsc::UnboundedReceiver<Direct>,
}

/// An event for the sender, holding its place in the endpoint's window.
pub struct Direct {
    pub event: OutboxEvent,
    pub permit: OwnedSemaphorePermit,
}

/// One lane per endpoint, and the channel between the two sides.
pub fn open(endpoints: &[WebhookEndpoint]) -> (Handoff, Inbox) {
    let lanes: HashMap<String, Arc<Lane>> = endpoints
        .iter()
        .map(|e| {
            let lane = Lane {
                window: Arc::new(Semaphore::new(e.max_in_flight * WINDOW_FACTOR)),
                state: AtomicU8::new(OPEN),
                backlog: AtomicBool::new(false),
            };
            (e.name.clone(), Arc::new(lane))
        })
        .collect();
    let lanes = Arc::new(lanes);
    let (to_sender, from_producers) = mpsc::unbounded_channel();
    (
        Handoff {
            lanes: lanes.clone(),
            to_sender,
        },
        Inbox {
            lanes,
            from_producers,
        },
    )
}

impl Handoff {
    /// A place in `endpoint`'s window if it is open and has room.
    pub fn take(&self, endpoint: &str) -> Option<OwnedSemaphorePermit> {
        let lane = self.lanes.get(endpoint)?;
        if lane.state.load(Ordering::Acquire) != OPEN || lane.backlog.load(Ordering::Acquire) {
            return None;
        }
        let place = lane.window.clone().try_acquire_owned().ok();
        if place.is_none() {
            lane.backlog.store(true, Ordering::Release);
        }
        place
    }
}

/// Events written leased to this node, to hand over once (and only if)
/// their transaction committed. Dropped unsent, they give their places
/// back.
#[derive(Default)]
pub struct Handover {
    events: Vec<Direct>,
    to_sender: Option<mpsc::UnboundedSender<Direct>>,
}

impl Handover {
    pub(super) fn new(handoff: &Handoff) -> Self {
        Self {
            events: Vec::new(),
            to_sender: Some(handoff.to_sender.clone()),
        }
    }

    pub(super) fn push(&mut self, direct: Direct) {
        self.events.push(direct);
    }

    /// After the commit. A sender that stopped meanwhile leaves the rows
    /// leased; its `release_events` at shutdown gives them back.
    pub fn committed(self) {
        let Some(to_sender) = self.to_sender else {
            return;
        };
        for direct in self.events {
            if to_sender.send(direct).is_err() {
                break;
            }
        }
    }
}

/// The lease in milliseconds, as the store writes it.
pub fn lease_ms() -> i64 {
    i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX)
}
