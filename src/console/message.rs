//! `GET /console/messages/{id}`: one message: envelope, header section
//! (the body only for an operator who asks, `?body=1`), key, ledger entry
//! and its expiry, every attempt per recipient with the next hop's reply,
//! the DKIM signature, and its webhook events with their delivery state.
//! Another workspace's message is the same 404 page as a missing one.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};

use super::form::{SignedIn, signed_in};
use super::layout::{self, Nav, html_response, page as shell, time};
use super::session::Session;
use crate::http::Api;
use crate::message::headers::{header_section_len, top_level_headers};
use crate::store::{AdminError, MessageDetail, StoreError, now_millis};

/// At most this much of a body is shown.
const MAX_BODY_SHOWN: usize = 1024 * 1024;

/// What the page says above the message after an action.
pub(super) enum Notice {
    None,
    Done { action: String, replayed: bool },
    Refused(String),
}

pub(super) async fn page(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let signed = match signed_in(&api, &headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let (mut body, mut done, mut replayed) = (false, None, false);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "body" => body = v == "1",
            "done" => done = Some(v.into_owned()),
            "replayed" => replayed = v == "1",
            _ => {}
        }
    }
    let notice = match done {
        Some(action) => Notice::Done { action, replayed },
        None => Notice::None,
    };
    render(&api, &signed, &id, body, notice, StatusCode::OK).await
}

/// The message as `session` may see it: `None` when it does not exist or
/// is another workspace's.
pub(super) async fn find(
    api: &Api,
    session: &Session,
    id: &str,
) -> Result<Option<MessageDetail>, StoreError> {
    match session.scope() {
        Some(workspace) => api.status.message_in(workspace, id).await,
        None => match api.admin.show(id).await {
            Ok(detail) => Ok(Some(detail)),
            Err(AdminError::NotFound(_)) => Ok(None),
            Err(AdminError::Store(e)) => Err(e),
            Err(e) => Err(StoreError::Transient(e.to_string())),
        },
    }
}

/// The page, with `notice` above it and `status`.
pub(super) async fn render(
    api: &Api,
    signed: &SignedIn<'_>,
    id: &str,
    show_body: bool,
    notice: Notice,
    status: StatusCode,
) -> Response {
    let session = &signed.session;
    let (m, attempts) = match find(api, session, id).await {
        Ok(Some(found)) => found,
        Ok(None) => return layout::not_found(Some(session)),
        Err(e) => {
            tracing::warn!(error = %e, "console message read failed");
            return layout::unavailable(Some(session));
        }
    };
    let content = match api.admin.content(id).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "console message content read failed");
            return layout::unavailable(Some(session));
        }
    };
    let key = content.as_ref().and_then(|c| c.idempotency_key.clone());
    let ledger = match &key {
        Some(k) => Some(
            signed
                .console
                .store
                .lookup(&m.workspace, k, now_millis())
                .await,
        ),
        None => None,
    };
    let events = signed.console.outbox.for_message(id, 100).await;
    let (head, rest) = content.as_ref().map_or((&[][..], &[][..]), |c| {
        c.body.split_at(header_section_len(&c.body))
    });
    let dkim: Vec<String> = content
        .as_ref()
        .map(|c| {
            let trace = top_level_headers(c.trace.as_bytes());
            let own = top_level_headers(&c.body);
            trace
                .chain(own)
                .filter(|(name, _)| name.eq_ignore_ascii_case(b"DKIM-Signature"))
                .map(|(_, value)| String::from_utf8_lossy(value).trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let body_shown = show_body && session.operator;
    let main = html! {
        h1 { "Message " code { (m.id) } }
        @match &notice {
            Notice::None => {},
            Notice::Done { action, replayed } => p.notice role="status" {
                (done_words(action))
                @if *replayed { " This confirmation had been submitted before: nothing was done again." }
            },
            Notice::Refused(text) => p.error role="alert" { (text) },
        }
        nav.actions aria-label="Actions" {
            @for a in ["retry", "hold", "release", "cancel"] {
                a.button id={"action-" (a)} href={"/console/messages/" (m.id) "/" (a)} { (title(a)) }
                " "
            }
        }
        section aria-labelledby="envelope-h" {
            h2 #envelope-h { "Envelope" }
            dl #envelope {
                dt { "State" } dd #state { span class={"state " (m.state.as_str())} { (m.state.as_str()) } }
                dt { "Workspace" } dd { (m.workspace) }
                dt { "Account" } dd { (m.account) }
                dt { "From" } dd.addr { (m.reverse_path) }
                dt { "To" } dd.addr { @for r in &m.recipients { (r) br; } }
                dt { "Size" } dd { (m.size) " bytes" }
                dt { "Accepted" } dd { (time(m.created_at)) }
                dt { "Attempts" } dd { (m.attempts) }
                @if let Some(at) = m.next_attempt_at { dt { "Next attempt" } dd { (time(at)) } }
                @if let Some(e) = &m.last_error { dt { "Last error" } dd { (e) } }
            }
        }
        section aria-labelledby="key-h" {
            h2 #key-h { "Idempotency key" }
            p #key { @match &key { Some(k) => code { (k) }, None => "No key: this message was submitted without one." } }
        }
        section #ledger aria-labelledby="ledger-h" {
            h2 #ledger-h { "Ledger entry" }
            (ledger_part(ledger))
        }
        section aria-labelledby="attempts-h" {
            h2 #attempts-h { "Delivery attempts" }
            div.scroll {
                table #attempts {
                    caption { "Every attempt per recipient, oldest first" }
                    thead { tr {
                        th scope="col" { "Recipient" } th scope="col" { "At" } th scope="col" { "Outcome" }
                        th scope="col" { "Next hop" } th scope="col" { "Reply" }
                    } }
                    tbody {
                        @for a in &attempts {
                            tr {
                                td.addr { (a.recipient) }
                                td { (time(a.at)) }
                                td { (a.outcome) }
                                td { (a.next_hop.as_deref().unwrap_or("—")) }
                                td { code { (a.reply) } }
                            }
                        }
                        @if attempts.is_empty() { tr { td colspan="5" { "No attempt yet." } } }
                    }
                }
            }
        }
        section aria-labelledby="headers-h" {
            h2 #headers-h { "Header section" }
            @if content.as_ref().is_some_and(|c| c.body_kept) {
                pre #headers tabindex="0" { (String::from_utf8_lossy(head)) }
            } @else {
                p #headers { "The message's bytes are no longer stored: it was delivered to every recipient (see relay.keep_bodies)." }
            }
            @if session.operator && content.as_ref().is_some_and(|c| c.body_kept) {
                @if body_shown {
                    h2 { "Body" }
                    pre #body tabindex="0" { (String::from_utf8_lossy(&rest[..rest.len().min(MAX_BODY_SHOWN)])) }
                    @if rest.len() > MAX_BODY_SHOWN { p { "The body is cut at 1 MiB here." } }
                } @else {
                    p { a #show-body href={"/console/messages/" (m.id) "?body=1"} { "Show the body" } }
                }
            }
        }
        section aria-labelledby="dkim-h" {
            h2 #dkim-h { "DKIM signature" }
            div #dkim {
                @for d in &dkim { pre tabindex="0" { (d) } }
                @if dkim.is_empty() { p { "Not signed." } }
            }
        }
        section aria-labelledby="events-h" {
            h2 #events-h { "Webhook events" }
            (events_part(events))
        }
    };
    html_response(
        status,
        shell(
            &format!("Message {}", m.id),
            Some(session),
            Nav::Messages,
            main,
        ),
    )
}

fn ledger_part(ledger: Option<Result<Option<crate::store::LedgerEntry>, StoreError>>) -> Markup {
    html! {
        @match ledger {
            None => p { "No key, so no ledger entry." },
            Some(Err(e)) => p.error { "The ledger cannot be read: " (e.to_string()) },
            Some(Ok(None)) => p { "No live entry: it expired (or was purged), so the key may be used again." },
            Some(Ok(Some(entry))) => dl {
                dt { "Created" } dd { (time(entry.created_at)) }
                dt { "Expires" } dd #ledger-expires { (time(entry.expires_at)) }
                dt { "Queue id" } dd { (entry.queue_id.as_deref().unwrap_or("—")) }
                dt { "Stored reply" } dd { code { (String::from_utf8_lossy(&entry.reply).trim_end()) } }
            },
        }
    }
}

fn events_part(events: Result<Vec<crate::store::outbox::EventStatus>, StoreError>) -> Markup {
    html! {
        @match events {
            Err(e) => p.error { "The outbox cannot be read: " (e.to_string()) },
            Ok(events) => div.scroll {
                table #events {
                    caption { "Events of this message, newest first" }
                    thead { tr {
                        th scope="col" { "Event" } th scope="col" { "At" } th scope="col" { "Endpoint" }
                        th scope="col" { "Delivery" } th scope="col" { "Attempts" } th scope="col" { "Last answer" }
                        th scope="col" { "Webhook id" }
                    } }
                    tbody {
                        @for e in &events {
                            tr.event data-type=(e.event_type) {
                                td { (e.event_type) }
                                td { (time(e.at)) }
                                td { (e.endpoint) }
                                td { (e.state) }
                                td.num { (e.attempts) }
                                td { @match (e.last_status, &e.last_error) {
                                    (_, Some(err)) => (err),
                                    (Some(code), None) => { "HTTP " (code) },
                                    (None, None) => "—",
                                } }
                                td { code { (e.webhook_id) } }
                            }
                        }
                        @if events.is_empty() { tr { td colspan="7" { "No webhook event." } } }
                    }
                }
            },
        }
    }
}

pub(super) fn title(action: &str) -> &'static str {
    match action {
        "retry" => "Retry now",
        "hold" => "Hold",
        "release" => "Release",
        "cancel" => "Cancel",
        _ => "",
    }
}

fn done_words(action: &str) -> &'static str {
    match action {
        "retry" => "Retried: the message is due now.",
        "hold" => "Held: no attempt until it is released.",
        "release" => "Released: the message is due again.",
        "cancel" => "Cancelled: it will not be attempted again.",
        _ => "Done.",
    }
}
