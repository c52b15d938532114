//! Retry, hold, release and cancel: `GET` a confirmation page whose form
//! carries the session's token and a fresh idempotency key, then `POST`
//! it through the API's own `http::actions::perform` (`Acceptor::once`
//! around `QueueAdmin::apply`: the same ledger, the same events, actor
//! `console:<account>`). A second submit of the same confirmation replays
//! the stored answer and acts no second time.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::html;

use super::form::{field, signed_form, signed_in};
use super::layout::{self, Nav, html_response, page, see_other};
use super::message::{Notice, find, render, title};
use crate::http::Api;
use crate::http::actions::perform;
use crate::store::AdminAction;

fn action_of(name: &str) -> Option<AdminAction> {
    Some(match name {
        "retry" => AdminAction::Retry,
        "hold" => AdminAction::Hold,
        "release" => AdminAction::Release,
        "cancel" => AdminAction::Cancel,
        _ => return None,
    })
}

fn question(action: AdminAction) -> &'static str {
    match action {
        AdminAction::Retry => {
            "Attempt this message now, without waiting for its next scheduled attempt?"
        }
        AdminAction::Hold => "Hold this message? It will not be attempted until it is released.",
        AdminAction::Release => "Release this message? It becomes due again.",
        AdminAction::Cancel => {
            "Cancel this message? Recipients not yet delivered will never get it; this cannot be undone."
        }
        AdminAction::Delete => "",
    }
}

pub(super) async fn confirm(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let signed = match signed_in(&api, &headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let session = &signed.session;
    let Some(action) = action_of(&name) else {
        return layout::not_found(Some(session));
    };
    match find(&api, session, &id).await {
        Ok(Some(_)) => {}
        Ok(None) => return layout::not_found(Some(session)),
        Err(_) => return layout::unavailable(Some(session)),
    }
    let path = format!("/console/messages/{id}/{name}");
    let main = html! {
        h1 { (title(&name)) " message " code { (id) } }
        p { (question(action)) }
        // A fresh key per render: submitting this form twice replays.
        // (`#confirm` names both the form and its button, as the console's
        // contract with its browser tests says.)
        form #confirm method="post" action=(path) {
            input type="hidden" name="csrf" value=(session.csrf);
            input type="hidden" name="idempotency_key" value=(format!("console-{}", uuid::Uuid::new_v4()));
            button #confirm type="submit" { (title(&name)) }
            " "
            a href={"/console/messages/" (id)} { "Back" }
        }
    };
    html_response(
        StatusCode::OK,
        page(title(&name), Some(session), Nav::Messages, main),
    )
}

pub(super) async fn act(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let signed = match signed_in(&api, &parts.headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let fields = match signed_form(&api, &signed, body, peer).await {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let session = &signed.session;
    let Some(action) = action_of(&name) else {
        return layout::not_found(Some(session));
    };
    let key = field(&fields, "idempotency_key").filter(|k| !k.is_empty());
    // The request's identity under the key: the action and the message,
    // never the form's token (a replay from another tab is the same act).
    let line = format!("POST /console/messages/{id}/{name}");
    let actor = format!("console:{}", session.name());
    let answer = perform(
        &api,
        &session.caller(),
        id.clone(),
        action,
        key,
        &line,
        b"",
        actor,
    )
    .await;
    let decoded = crate::http::channel::decode(&answer);
    let message = serde_json::from_slice::<serde_json::Value>(&decoded.body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned));
    match decoded.status {
        200 => {
            let replayed = if decoded.replay { "&replayed=1" } else { "" };
            see_other(&format!("/console/messages/{id}?done={name}{replayed}"))
        }
        404 => layout::not_found(Some(session)),
        status => {
            let text = message.unwrap_or_else(|| "The action was refused.".into());
            let text = if decoded.replay {
                format!("{text} (this confirmation had been submitted before)")
            } else {
                text
            };
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::CONFLICT);
            render(&api, &signed, &id, false, Notice::Refused(text), status).await
        }
    }
}
