//! `GET /console/`: the node at a glance. Node-wide figures (rates, the
//! queue's depth, authentication failures, webhook endpoints) tell one
//! tenant about the others' traffic, so a workspace account sees only
//! where to find its own messages; an operator sees them all.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};

use super::form::signed_in;
use super::layout::{Nav, age, html_response, page as shell, time};
use super::rates::{chart, last_minute};
use super::{Console, SAMPLE_EVERY};
use crate::http::Api;
use crate::metrics::QUEUE_STATES;

pub(super) async fn page_handler(api: &Api, headers: &HeaderMap, peer: SocketAddr) -> Response {
    let signed = match signed_in(api, headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let c = signed.console;
    let main = if signed.session.operator {
        let endpoints = endpoints(c).await;
        html! {
            h1 { "Overview" }
            (rates(c))
            (depth(c))
            (auth())
            (endpoints)
        }
    } else {
        html! {
            h1 { "Overview" }
            p {
                "You are signed in to workspace " strong { (signed.session.account.workspace) } ". "
                a href="/console/messages" { "Find its messages" } "."
            }
            section #rates aria-labelledby="rates-h" {
                h2 #rates-h { "Rates" }
                p { "Node-wide figures are shown to operator accounts." }
            }
        }
    };
    html_response(
        StatusCode::OK,
        shell("Overview", Some(&signed.session), Nav::Overview, main),
    )
}

pub(super) async fn page(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    page_handler(&api, &headers, peer).await
}

fn rates(c: &Console) -> Markup {
    let samples = c.rates.samples();
    let minute = last_minute(&samples);
    html! {
        section #rates aria-labelledby="rates-h" {
            h2 #rates-h { "Rates" }
            @match minute {
                Some((accepted, delivered)) => p {
                    "Accepted " strong #rate-accepted { (format!("{accepted:.0}")) } " per minute, delivered "
                    strong #rate-delivered { (format!("{delivered:.0}")) } " per minute (last minute)."
                },
                None => p { "Rates appear after the first " (SAMPLE_EVERY.as_secs()) " seconds." },
            }
            figure {
                (chart(&samples))
                figcaption {
                    span.key-accepted { "── accepted" } " " span.key-delivered { "- - delivered" }
                }
            }
        }
    }
}

fn depth(c: &Console) -> Markup {
    let depth = c.depth();
    html! {
        section #queue aria-labelledby="queue-h" {
            h2 #queue-h { "Queue" }
            div.scroll {
                table #queue-depth {
                    caption { "Messages waiting, by state" }
                    thead { tr { th scope="col" { "State" } th scope="col" { "Messages" } } }
                    tbody {
                        @for state in QUEUE_STATES {
                            @let n = depth.as_ref().map_or(0, |(d, _)| {
                                d.counts.iter().find(|(s, _)| s.as_str() == state).map_or(0, |(_, n)| *n)
                            });
                            tr {
                                th scope="row" { a href={"/console/messages?state=" (state)} { (state) } }
                                td.num { (n) }
                            }
                        }
                    }
                }
            }
            @match &depth {
                Some((d, at)) => p #oldest-queued {
                    @match d.oldest_age_ms {
                        Some(ms) => { "Oldest message waiting: " (age(ms)) "." }
                        None => { "No message is waiting." }
                    }
                    " Read at " (time(*at)) "."
                },
                None => p #oldest-queued { "The queue has not been read yet." },
            }
        }
    }
}

fn auth() -> Markup {
    let t = crate::metrics::global().totals();
    html! {
        section #auth aria-labelledby="auth-h" {
            h2 #auth-h { "Authentication" }
            dl {
                dt { "Failed sign-ins and wrong API keys" } dd #auth-failures { (t.auth_failures) }
                dt { "Attempts refused from banned addresses" } dd #auth-bans { (t.banned_refusals) }
            }
            p.hint { "Since the daemon started, every channel (SMTP AUTH, API keys, this console)." }
        }
    }
}

async fn endpoints(c: &Console) -> Markup {
    let backlog = c.outbox.backlog(c.endpoints.clone()).await;
    let disabled = c.outbox.disabled().await.unwrap_or_default();
    html! {
        section #webhooks aria-labelledby="webhooks-h" {
            h2 #webhooks-h { "Webhook endpoints" }
            @match backlog {
                Err(e) => p.error { "The outbox cannot be read: " (e.to_string()) },
                Ok(rows) => div.scroll {
                    table #webhook-endpoints {
                        caption { "Events waiting per endpoint" }
                        thead { tr {
                            th scope="col" { "Endpoint" } th scope="col" { "State" }
                            th scope="col" { "Waiting" } th scope="col" { "Last error" }
                        } }
                        tbody {
                            @for row in &rows {
                                @let off = disabled.iter().find(|d| d.endpoint == row.endpoint);
                                tr {
                                    th scope="row" { (row.endpoint) }
                                    td { @if off.is_some() { "disabled" } @else if row.failing_since.is_some() { "failing" } @else { "ok" } }
                                    td.num { (row.waiting) }
                                    td { @match &row.last_error {
                                        Some((at, e)) => { (e) " (" (time(*at)) ")" }
                                        None => "—",
                                    } }
                                }
                            }
                            @if rows.is_empty() { tr { td colspan="4" { "No endpoint is configured." } } }
                        }
                    }
                },
            }
        }
    }
}
