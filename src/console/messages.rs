//! `GET /console/messages`: the list, newest first, 50 a page, through
//! `QueueAdmin::list` within the caller's workspace (an operator: any, or
//! the one asked for). Paging is a cursor (`after=` the last queue id
//! shown), so a page costs the same at any depth. `?fragment=1` answers
//! the table alone, for the page's refresh script.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::{Markup, html};

use super::form::signed_in;
use super::layout::{self, Nav, html_response, page as shell, time};
use super::session::Session;
use crate::http::Api;
use crate::store::{ListFilter, MessageState, MessageStatus, now_millis};

pub(super) const PAGE: usize = 50;

const STATES: [&str; 8] = [
    "queued",
    "deferred",
    "delivering",
    "held",
    "delivered",
    "failed",
    "expired",
    "cancelled",
];

/// The filters as given (kept to fill the form and the next page's link).
#[derive(Default)]
struct Query {
    state: String,
    recipient: String,
    sender: String,
    key: String,
    age: String,
    workspace: String,
    after: String,
    fragment: bool,
}

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        let mut q = Query::default();
        for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            let v = v.trim().to_owned();
            match k.as_ref() {
                "state" => q.state = v,
                "recipient" => q.recipient = v,
                "sender" => q.sender = v,
                "key" => q.key = v,
                "age" => q.age = v,
                "workspace" => q.workspace = v,
                "after" => q.after = v,
                "fragment" => q.fragment = v == "1",
                _ => {}
            }
        }
        q
    }

    /// The filter, or what is wrong with the form.
    fn filter(&self, session: &Session) -> Result<ListFilter, String> {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let state = match self.state.as_str() {
            "" => None,
            s => Some(MessageState::parse(s).ok_or("Unknown state.")?),
        };
        let created_from = match self.age.as_str() {
            "" => None,
            a => {
                let d = crate::config::parse_duration(a)
                    .map_err(|_| "Age is a duration like 30m, 1h, 24h or 7d.")?;
                let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                Some(now_millis().saturating_sub(ms))
            }
        };
        let workspace = match session.scope() {
            Some(own) => Some(own.to_owned()),
            None => some(&self.workspace),
        };
        Ok(ListFilter {
            state,
            workspace,
            created_from,
            recipient: some(&self.recipient),
            sender: some(&self.sender),
            key: some(&self.key),
            newest_first: true,
            after: some(&self.after),
            limit: PAGE,
            ..ListFilter::default()
        })
    }

    /// This query's link with `after` set to `after`.
    fn link(&self, after: Option<&str>) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("state", &self.state),
            ("recipient", &self.recipient),
            ("sender", &self.sender),
            ("key", &self.key),
            ("age", &self.age),
            ("workspace", &self.workspace),
        ] {
            if !v.is_empty() {
                s.append_pair(k, v);
            }
        }
        if let Some(a) = after {
            s.append_pair("after", a);
        }
        format!("/console/messages?{}", s.finish())
    }
}

pub(super) async fn page(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let signed = match signed_in(&api, &headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let session = &signed.session;
    let q = Query::parse(raw.as_deref());
    let (status, error, rows) = match q.filter(session) {
        Err(e) => (StatusCode::BAD_REQUEST, Some(e), Vec::new()),
        Ok(filter) => match api.admin.list(filter).await {
            Ok(rows) => (StatusCode::OK, None, rows),
            Err(e) => {
                tracing::warn!(error = %e, "console list failed");
                return layout::unavailable(Some(session));
            }
        },
    };
    let table = table(&rows, session.operator);
    if q.fragment {
        return html_response(status, table);
    }
    let next = (rows.len() == PAGE)
        .then(|| rows.last().map(|m| q.link(Some(&m.id))))
        .flatten();
    let main = html! {
        h1 { "Messages" }
        (filter_form(&q, session.operator))
        @if let Some(e) = &error { p.error role="alert" { (e) } }
        div.scroll { (table) }
        nav.pager aria-label="Pages" {
            @if !q.after.is_empty() { a #first-page href=(q.link(None)) { "Newest" } " " }
            @if let Some(n) = &next { a #next-page href=(n) rel="next" { "Older messages" } }
        }
        script src="/console/static/console.js" defer {}
    };
    html_response(
        status,
        shell("Messages", Some(session), Nav::Messages, main),
    )
}

fn filter_form(q: &Query, operator: bool) -> Markup {
    html! {
        form #filter method="get" action="/console/messages" {
            div.fields {
                p {
                    label for="f-state" { "State" }
                    select #f-state name="state" {
                        option value="" selected[q.state.is_empty()] { "any" }
                        @for s in STATES { option value=(s) selected[q.state == s] { (s) } }
                    }
                }
                p { label for="f-recipient" { "Recipient" } input #f-recipient type="search" name="recipient" value=(q.recipient); }
                p { label for="f-sender" { "Sender" } input #f-sender type="search" name="sender" value=(q.sender); }
                p { label for="f-key" { "Idempotency key" } input #f-key type="search" name="key" value=(q.key); }
                p { label for="f-age" { "Newer than" } input #f-age type="text" name="age" value=(q.age) placeholder="e.g. 1h, 24h, 7d"; }
                @if operator {
                    p { label for="f-workspace" { "Workspace" } input #f-workspace type="text" name="workspace" value=(q.workspace); }
                }
            }
            button type="submit" { "Filter" }
            " "
            a href="/console/messages" { "Clear" }
        }
    }
}

/// The table alone: the page's and the refresh's.
fn table(rows: &[MessageStatus], operator: bool) -> Markup {
    html! {
        table #messages data-refresh="10" {
            caption { "Messages, newest first" }
            thead { tr {
                th scope="col" { "Queue id" }
                th scope="col" { "Accepted" }
                th scope="col" { "State" }
                @if operator { th scope="col" { "Workspace" } }
                th scope="col" { "From" }
                th scope="col" { "To" }
                th scope="col" { "Attempts" }
            } }
            tbody {
                @for m in rows {
                    tr.message data-id=(m.id) {
                        td { a.message-link href={"/console/messages/" (m.id)} { code { (m.id) } } }
                        td { (time(m.created_at)) }
                        td { span class={"state " (m.state.as_str())} { (m.state.as_str()) } }
                        @if operator { td { (m.workspace) } }
                        td.addr { (m.reverse_path) }
                        td.addr { (recipients(&m.recipients)) }
                        td.num { (m.attempts) }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan=(if operator { 7 } else { 6 }) { "No message matches." } }
                }
            }
        }
    }
}

fn recipients(all: &[String]) -> String {
    match all {
        [] => String::new(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} and {} more", rest.len()),
    }
}
