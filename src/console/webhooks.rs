//! `GET /console/webhooks`: the endpoints (state, backlog, last error, a
//! re-enable form) and the latest deliveries (a redeliver form each), as
//! `smtp-once webhooks` shows and does them through `OutboxAdmin`.
//! Operators only: endpoints and events span every workspace.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::html;

use super::form::{Refusal, SignedIn, signed_form, signed_in};
use super::layout::{self, Nav, html_response, page as shell, see_other, segment, time};
use crate::http::Api;
use crate::store::now_millis;

const RECENT: usize = 50;

/// The operator's session, or the not-found page (a workspace account
/// does not learn the page exists).
fn operator<'a>(
    api: &'a Api,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<SignedIn<'a>, Refusal> {
    let signed = signed_in(api, headers, peer)?;
    if !signed.session.operator {
        return Err(Box::new(layout::not_found(Some(&signed.session))));
    }
    Ok(signed)
}

/// An operator's form post: signed in as an operator, with the session's
/// form token in a body within the form bound.
async fn operator_post(
    api: &Api,
    request: Request,
    peer: SocketAddr,
) -> Result<SignedIn<'_>, Refusal> {
    let (parts, body) = request.into_parts();
    let signed = operator(api, &parts.headers, peer)?;
    signed_form(api, &signed, body, peer).await?;
    Ok(signed)
}

pub(super) async fn page(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let signed = match operator(&api, &headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let c = signed.console;
    let session = &signed.session;
    let done = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "done")
        .map(|(_, v)| v.into_owned());
    let (backlog, disabled, recent) = (
        c.outbox.backlog(c.endpoints.clone()).await,
        c.outbox.disabled().await,
        c.outbox.recent(None, RECENT).await,
    );
    let (backlog, disabled, recent) = match (backlog, disabled, recent) {
        (Ok(b), Ok(d), Ok(r)) => (b, d, r),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            tracing::warn!(error = %e, "console webhooks read failed");
            return layout::unavailable(Some(session));
        }
    };
    let main = html! {
        h1 { "Webhooks" }
        @match done.as_deref() {
            Some("enabled") => p.notice role="status" { "Endpoint enabled: its waiting events are sent now." },
            Some("not-disabled") => p.notice role="status" { "That endpoint was not disabled." },
            Some("redelivered") => p.notice role="status" { "Due again now, with its original webhook-id." },
            Some("none") => p.error role="alert" { "No event matched (an event being sent right now is skipped)." },
            _ => {},
        }
        section aria-labelledby="endpoints-h" {
            h2 #endpoints-h { "Endpoints" }
            div.scroll {
                table #endpoints {
                    caption { "Configured endpoints" }
                    thead { tr {
                        th scope="col" { "Name" } th scope="col" { "State" } th scope="col" { "Waiting" }
                        th scope="col" { "Last error" } th scope="col" { "Action" }
                    } }
                    tbody {
                        @for b in &backlog {
                            @let off = disabled.iter().find(|d| d.endpoint == b.endpoint);
                            tr {
                                th scope="row" { (b.endpoint) }
                                td { @match off {
                                    Some(d) => { "disabled since " (time(d.at)) ": " (d.reason) }
                                    None => @if b.failing_since.is_some() { "failing" } @else { "ok" },
                                } }
                                td.num { (b.waiting) }
                                td { @match &b.last_error { Some((at, e)) => { (e) " (" (time(*at)) ")" }, None => "—" } }
                                td {
                                    @if off.is_some() {
                                        form method="post" action={"/console/webhooks/" (segment(&b.endpoint)) "/enable"} {
                                            input type="hidden" name="csrf" value=(session.csrf);
                                            button type="submit" { "Re-enable " span.visually-hidden { (b.endpoint) } }
                                        }
                                    } @else { "—" }
                                }
                            }
                        }
                        @if backlog.is_empty() { tr { td colspan="5" { "No endpoint is configured." } } }
                    }
                }
            }
        }
        section aria-labelledby="deliveries-h" {
            h2 #deliveries-h { "Recent deliveries" }
            div.scroll {
                table #deliveries {
                    caption { "The latest " (RECENT) " events, newest first" }
                    thead { tr {
                        th scope="col" { "Webhook id" } th scope="col" { "Event" } th scope="col" { "Endpoint" }
                        th scope="col" { "At" } th scope="col" { "State" } th scope="col" { "Attempts" }
                        th scope="col" { "Last answer" } th scope="col" { "Message" } th scope="col" { "Action" }
                    } }
                    tbody {
                        @for e in &recent {
                            tr.delivery data-id=(e.webhook_id) {
                                td { code { (e.webhook_id) } }
                                td { (e.event_type) }
                                td { (e.endpoint) }
                                td { (time(e.at)) }
                                td { (e.state) }
                                td.num { (e.attempts) }
                                td { @match (e.last_status, &e.last_error) {
                                    (_, Some(err)) => (err),
                                    (Some(code), None) => { "HTTP " (code) },
                                    (None, None) => "—",
                                } }
                                td { @if let Some(q) = &e.queue_id { a href={"/console/messages/" (q)} { code { (q) } } } }
                                td {
                                    form method="post" action={"/console/webhooks/deliveries/" (segment(&e.webhook_id)) "/redeliver"} {
                                        input type="hidden" name="csrf" value=(session.csrf);
                                        button type="submit" { "Redeliver " span.visually-hidden { (e.webhook_id) } }
                                    }
                                }
                            }
                        }
                        @if recent.is_empty() { tr { td colspan="9" { "No event yet." } } }
                    }
                }
            }
        }
    };
    html_response(
        StatusCode::OK,
        shell("Webhooks", Some(session), Nav::Webhooks, main),
    )
}

pub(super) async fn enable(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let signed = match operator_post(&api, request, peer).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if !signed.console.endpoints.contains(&name) {
        return layout::not_found(Some(&signed.session));
    }
    match signed.console.outbox.enable(&name).await {
        Ok(true) => {
            tracing::info!(endpoint = %name, account = %signed.session.name(), "console: webhook endpoint enabled");
            see_other("/console/webhooks?done=enabled")
        }
        Ok(false) => see_other("/console/webhooks?done=not-disabled"),
        Err(e) => {
            tracing::warn!(error = %e, "console webhook enable failed");
            layout::unavailable(Some(&signed.session))
        }
    }
}

pub(super) async fn redeliver(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(webhook_id): Path<String>,
    request: Request,
) -> Response {
    let signed = match operator_post(&api, request, peer).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match signed
        .console
        .outbox
        .redeliver_one(None, &webhook_id, now_millis())
        .await
    {
        Ok(0) => see_other("/console/webhooks?done=none"),
        Ok(n) => {
            tracing::info!(webhook_id = %webhook_id, deliveries = n, account = %signed.session.name(), "console: webhook event redelivered");
            see_other("/console/webhooks?done=redelivered")
        }
        Err(e) => {
            tracing::warn!(error = %e, "console webhook redeliver failed");
            layout::unavailable(Some(&signed.session))
        }
    }
}
