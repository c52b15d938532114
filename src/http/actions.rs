//! `DELETE /v1/messages/{id}` (cancel) and `POST /v1/messages/{id}/retry`,
//! `.../hold`, `.../release`: the operators' queue actions over the API,
//! on the store's `QueueAdmin` like the CLI's, idempotent per the seeds
//! (`Idempotency-Key`, in the workspace's key space shared with
//! submissions). A workspace's key acts on its own messages only (another
//! workspace's is a 404, as for GET); an operator's on every workspace.
//!
//! What is stored under a key: every answer below 500, except those that
//! say "retry later" (`409 Delivering`: an attempt holds the message now;
//! `409 E01004`), which a retry under the same key must be able to get past.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::json;

use super::body::{self, BodyError, BodyLimits};
use super::channel::{Http, encode, error};
use super::keys::Caller;
use super::{Api, respond};
use crate::accept::operation::{LedgerSlot, Operation};
use crate::store::{AdminAction, AdminError, Change, Done, Record, Recorder, StoreError};
use crate::webhook::Router as Webhooks;

/// These routes take no body; one sent anyway is part of the request's
/// identity, and bounded.
const MAX_BODY: usize = 16 * 1024;

/// How long a client should wait before retrying an action refused
/// because an attempt holds the message (a lease is minutes at most, an
/// attempt usually seconds).
const RETRY_AFTER_SECONDS: &str = "5";

type Id = Result<Path<String>, PathRejection>;

pub(super) async fn cancel(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    id: Id,
    request: Request,
) -> Response {
    act(api, peer, id, AdminAction::Cancel, request).await
}

pub(super) async fn retry(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    id: Id,
    request: Request,
) -> Response {
    act(api, peer, id, AdminAction::Retry, request).await
}

pub(super) async fn hold(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    id: Id,
    request: Request,
) -> Response {
    act(api, peer, id, AdminAction::Hold, request).await
}

pub(super) async fn release(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    id: Id,
    request: Request,
) -> Response {
    act(api, peer, id, AdminAction::Release, request).await
}

async fn act(
    api: Arc<Api>,
    peer: SocketAddr,
    id: Id,
    action: AdminAction,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    // From the headers alone, as every route: no body byte before this.
    let caller = match api.caller(&parts.headers, peer).await {
        Ok(c) => c,
        Err(response) => return *response,
    };
    let id = match id {
        Ok(Path(id)) => id,
        Err(rejection) => return respond(error(400, "BadRequest", &rejection.body_text())),
    };
    let mut reservation = api
        .budget
        .reservation(Some(Arc::from(caller.submitter.name())));
    let limits = BodyLimits {
        max_bytes: MAX_BODY,
        ..api.body
    };
    let body = match body::read(body, limits, &mut reservation).await {
        Ok(body) => body,
        Err(BodyError::TooLarge(_)) => {
            return respond(error(
                413,
                "TooLarge",
                &format!("this request takes no body (at most {MAX_BODY} bytes)"),
            ));
        }
        Err(e @ BodyError::OverBudget(_)) => {
            tracing::warn!(%peer, error = %e, "HTTP action refused: in-flight budget used up");
            return busy();
        }
        Err(e) => {
            tracing::info!(%peer, error = %e, "HTTP action body could not be read");
            return respond(error(400, "BadRequest", &e.to_string()));
        }
    };
    let key = match parts.headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(_)) => {
            return respond(error(422, "E01001", "Idempotency-Key is not visible ASCII"));
        }
    };
    let line = format!(
        "{} {}?{}",
        parts.method,
        parts.uri.path(),
        parts.uri.query().unwrap_or_default()
    );
    let actor = format!("api:{}", caller.submitter.name());
    let answer = perform(&api, &caller, id, action, key, &line, &body, actor).await;
    drop(reservation);
    let delivering = is_delivering(&answer);
    let mut response = respond(answer);
    if delivering {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    response
}

/// One action on one message through the seeds' key steps
/// (`Acceptor::once`) and `QueueAdmin::apply`, as every front performs it
/// (the API here, the console's confirmed forms): the answer as
/// `status\nbody` (JSON), the same bytes when replayed. `line` and `body`
/// are the request's identity under `key`; `actor` names who acted.
#[allow(clippy::too_many_arguments)] // one call site per front; a struct would only rename them
pub(crate) async fn perform(
    api: &Api,
    caller: &Caller,
    id: String,
    action: AdminAction,
    key: Option<&str>,
    line: &str,
    body: &[u8],
    actor: String,
) -> Vec<u8> {
    let operation = Operation {
        workspace: caller.submitter.workspace(),
        key,
        line,
        body,
    };
    api.acceptor
        .once(operation, &Http, |slot| {
            let change = Change {
                action,
                id: id.clone(),
                workspace: caller.scope().map(str::to_owned),
                actor: actor.clone(),
                recorder: Some(recorder(
                    slot,
                    api.webhooks.clone(),
                    actor,
                    id.clone(),
                    action,
                )),
            };
            let admin = api.admin.clone();
            let caller = caller.clone();
            async move {
                match admin.apply(change).await {
                    Ok(outcome) => {
                        log(&id, action, &caller, &outcome);
                        answer(&id, action, &outcome)
                    }
                    Err(e) => {
                        tracing::warn!(queue_id = %id, action = action.as_str(), error = %e, "HTTP action failed: store");
                        store_failure(&e)
                    }
                }
            }
        })
        .await
}

/// What the change writes with itself: its answer under the key (when
/// it is one to store) and its event (when it changed something).
fn recorder(
    slot: Option<LedgerSlot>,
    webhooks: Webhooks,
    actor: String,
    id: String,
    action: AdminAction,
) -> Recorder {
    Box::new(move |outcome: &Result<Done, AdminError>| {
        let ledger = slot
            .filter(|_| stored(outcome))
            .map(|slot| slot.entry(answer(&id, action, outcome), Some(id.clone())));
        let events = match outcome {
            Ok(done) => webhooks.acted(done, &actor),
            Err(_) => Vec::new(),
        };
        Record { ledger, events }
    })
}

/// Whether an answer is stored under the key: below 500, and not one that
/// says to retry later.
fn stored(outcome: &Result<Done, AdminError>) -> bool {
    match outcome {
        Ok(_) | Err(AdminError::NotFound(_) | AdminError::State { .. }) => true,
        Err(
            AdminError::LiveLease { .. }
            | AdminError::KeyTaken
            | AdminError::UnknownState { .. }
            | AdminError::Store(_),
        ) => false,
    }
}

/// The answer, `status\nbody`, the same bytes whether sent now or replayed.
fn answer(id: &str, action: AdminAction, outcome: &Result<Done, AdminError>) -> Vec<u8> {
    match outcome {
        Ok(done) => {
            let mut body = json!({
                "id": done.id,
                "action": done.action.as_str(),
                "state": done.state.as_str(),
                "changed": done.changed(),
            });
            if done.action == AdminAction::Cancel {
                body["cancelled_recipients"] = json!(done.pending);
            }
            encode(200, &body)
        }
        Err(AdminError::NotFound(_)) => error(404, "NotFound", &format!("no message {id}")),
        Err(AdminError::State { state, .. }) => encode(
            409,
            &json!({
                "code": "InvalidState",
                "message": format!(
                    "message {id} is {}: it cannot be {}",
                    state.as_str(),
                    past_participle(action)
                ),
                "state": state.as_str(),
            }),
        ),
        Err(AdminError::LiveLease { .. }) => error(
            409,
            "Delivering",
            &format!(
                "message {id} is being delivered right now; nothing was changed, retry in a few seconds"
            ),
        ),
        Err(AdminError::KeyTaken) => crate::accept::channel::ChannelWording::in_progress(&Http),
        Err(AdminError::UnknownState { state, .. }) => error(
            500,
            "UnknownState",
            &format!("message {id} has a state this version does not know ({state:?})"),
        ),
        Err(AdminError::Store(e)) => store_failure(e),
    }
}

fn past_participle(action: AdminAction) -> &'static str {
    match action {
        AdminAction::Retry => "retried",
        AdminAction::Hold => "held",
        AdminAction::Release => "released",
        AdminAction::Cancel => "cancelled",
        AdminAction::Delete => "deleted",
    }
}

/// Nothing was changed: `E01033` when the store cannot be reached at all.
fn store_failure(e: &StoreError) -> Vec<u8> {
    use crate::accept::channel::ChannelWording;
    match e {
        StoreError::Unavailable(_) => Http.unavailable(),
        _ => Http.storage_failure(),
    }
}

fn busy() -> Response {
    let mut response = respond(error(
        503,
        "ServerBusy",
        "too many requests are being received right now, retry shortly",
    ));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

/// The `409 Delivering` refusal (never stored, so never a replay).
fn is_delivering(answer: &[u8]) -> bool {
    let decoded = super::channel::decode(answer);
    decoded.status == 409
        && serde_json::from_slice::<serde_json::Value>(&decoded.body)
            .is_ok_and(|v| v["code"] == "Delivering")
}

fn log(id: &str, action: AdminAction, caller: &Caller, outcome: &Result<Done, AdminError>) {
    let account = caller.submitter.name();
    match outcome {
        Ok(done) => tracing::info!(
            queue_id = %id, action = action.as_str(), %account, workspace = %done.workspace,
            state = done.state.as_str(), changed = done.changed(), "HTTP action done"
        ),
        Err(e) => tracing::info!(
            queue_id = %id, action = action.as_str(), %account, reason = %e, "HTTP action refused"
        ),
    }
}
