//! `GET /v1/messages/{id}` and `GET /v1/messages?state=&cursor=&limit=`:
//! what `smtp-once status` shows, only within the caller's workspace
//! (another workspace's id is a 404, as if it did not exist). An
//! operator's key (`role = "operator"`) sees every workspace, and may
//! list one with `workspace=`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::channel::{encode, error};
use super::{Api, respond};
use crate::store::{
    AdminError, AttemptRecord, ListFilter, MessageState, MessageStatus, StoreError,
};

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

pub(super) async fn one(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let caller = match api.caller(&headers, peer).await {
        Ok(c) => c,
        Err(response) => return *response,
    };
    // An id that does not decode (`%FF`): JSON, like every other error.
    let id = match id {
        Ok(Path(id)) => id,
        Err(rejection) => return respond(error(400, "BadRequest", &rejection.body_text())),
    };
    let found = match caller.scope() {
        Some(workspace) => api.status.message_in(workspace, &id).await,
        None => match api.admin.show(&id).await {
            Ok(detail) => Ok(Some(detail)),
            Err(AdminError::NotFound(_)) => Ok(None),
            Err(AdminError::Store(e)) => Err(e),
            Err(e) => Err(StoreError::Transient(e.to_string())),
        },
    };
    match found {
        Ok(Some((message, attempts))) => respond(encode(200, &detail(&message, &attempts))),
        Ok(None) => respond(error(404, "NotFound", &format!("no message {id}"))),
        Err(e) => {
            tracing::warn!(error = %e, "status read failed");
            respond(error(
                503,
                "Unavailable",
                "message status cannot be read now, retry",
            ))
        }
    }
}

pub(super) async fn list(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let caller = match api.caller(&headers, peer).await {
        Ok(c) => c,
        Err(response) => return *response,
    };
    let (mut state, mut cursor, mut limit) = (None, None, DEFAULT_PAGE);
    let mut workspace = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "state" => match MessageState::parse(&v) {
                Some(s) => state = Some(s),
                None => {
                    return respond(error(
                        400,
                        "BadRequest",
                        "state must be queued, deferred, delivering, delivered, failed, expired, held or cancelled",
                    ));
                }
            },
            "cursor" => cursor = Some(v.into_owned()),
            "workspace" if caller.operator => workspace = Some(v.into_owned()),
            "workspace" => {
                return respond(error(
                    400,
                    "BadRequest",
                    "workspace= is for operator keys; this key sees its own workspace",
                ));
            }
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => {
                    return respond(error(
                        400,
                        "BadRequest",
                        &format!("limit must be 1 to {MAX_PAGE}"),
                    ));
                }
            },
            other => {
                return respond(error(
                    400,
                    "BadRequest",
                    &format!("unknown parameter {other:?}"),
                ));
            }
        }
    }
    let listed = match caller.scope() {
        Some(own) => api.status.list(own, state, cursor, limit).await,
        None => {
            let filter = ListFilter {
                state,
                workspace,
                after: cursor,
                limit,
                ..ListFilter::default()
            };
            api.admin.list(filter).await
        }
    };
    match listed {
        Ok(messages) => {
            let next = (messages.len() == limit)
                .then(|| messages.last().map(|m| m.id.clone()))
                .flatten();
            let items: Vec<Value> = messages.iter().map(summary).collect();
            respond(encode(
                200,
                &json!({ "messages": items, "next_cursor": next }),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "status list failed");
            respond(error(
                503,
                "Unavailable",
                "messages cannot be listed now, retry",
            ))
        }
    }
}

fn summary(m: &MessageStatus) -> Value {
    json!({
        "id": m.id,
        "workspace": m.workspace,
        "state": m.state.as_str(),
        "from": m.reverse_path,
        "recipients": m.recipients,
        "attempts": m.attempts,
        "created_at": m.created_at,
    })
}

fn detail(m: &MessageStatus, attempts: &[AttemptRecord]) -> Value {
    // Each recipient's latest outcome; none yet is "pending".
    let recipients: Vec<Value> = m
        .recipients
        .iter()
        .map(|r| {
            let latest = attempts.iter().rev().find(|a| a.recipient == *r);
            json!({
                "address": r,
                "outcome": latest.map_or("pending", |a| a.outcome.as_str()),
                "reply": latest.map(|a| a.reply.as_str()),
            })
        })
        .collect();
    let history: Vec<Value> = attempts
        .iter()
        .map(|a| {
            json!({
                "at": a.at,
                "recipient": a.recipient,
                "outcome": a.outcome,
                "reply": a.reply,
                "next_hop": a.next_hop,
            })
        })
        .collect();
    json!({
        "id": m.id,
        "workspace": m.workspace,
        "state": m.state.as_str(),
        "from": m.reverse_path,
        "recipients": recipients,
        "size": m.size,
        "attempts": m.attempts,
        "last_error": m.last_error,
        "created_at": m.created_at,
        "next_attempt_at": m.next_attempt_at,
        "history": history,
    })
}
