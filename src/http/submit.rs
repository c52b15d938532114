//! `POST /v1/messages`: the HTTP front of the acceptance pipeline. The
//! request's identity is its method, path, query and body; its key is the
//! `Idempotency-Key` header, in the workspace's key space shared with SMTP.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::body::{self, BodyError};
use super::channel::{self, Http};
use super::compose::{self, Composed};
use super::{Api, respond};
use crate::accept::channel::KeySource;
use crate::address::ReversePath;
use crate::metrics::{self, Outcome};
use crate::submission::Submission;

pub(super) async fn submit(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let started = std::time::Instant::now();
    let response = handle(api, peer, request).await;
    metrics::global().request_seconds(started.elapsed().as_secs_f64());
    response
}

/// Refused before the pipeline: counted here (the pipeline counts its own).
fn refused(outcome: Outcome, status: u16, code: &str, message: &str) -> Response {
    metrics::global().submission(metrics::Channel::Http, outcome);
    respond(channel::error(status, code, message))
}

/// The request itself is wrong (size, type, envelope, key encoding).
fn invalid(status: u16, code: &str, message: &str) -> Response {
    refused(Outcome::Invalid, status, code, message)
}

fn too_large(max: usize) -> Response {
    invalid(413, "TooLarge", &format!("the body is over {max} bytes"))
}

/// Over the in-flight budget: nothing was kept, try again shortly.
fn over_budget(e: &BodyError) -> Response {
    tracing::warn!(error = %e, "HTTP submission refused: in-flight budget used up");
    let mut response = refused(
        Outcome::Unavailable,
        503,
        "ServerBusy",
        "too many messages are being received right now, retry shortly",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

/// `Content-Length`, when given and numeric.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn handle(api: Arc<Api>, peer: SocketAddr, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    // From the headers alone: an unauthenticated client gets its 401
    // before a byte of its body is read (or `100 Continue` sent).
    let submitter = match api.authenticate(&headers, peer).await {
        Ok(s) => s,
        Err(response) => return *response,
    };
    // An announced size over the limit is refused without reading.
    if content_length(&headers).is_some_and(|n| n > api.body.max_bytes as u64) {
        return too_large(api.max_message_size);
    }
    // Held until the answer: the body counts against the budget while
    // the pipeline looks at it.
    let mut reservation = api.budget.reservation(Some(Arc::from(submitter.name())));
    let body = match body::read(body, api.body, &mut reservation).await {
        Ok(body) => body,
        Err(BodyError::TooLarge(_)) => return too_large(api.max_message_size),
        Err(e @ BodyError::OverBudget(_)) => return over_budget(&e),
        Err(e @ BodyError::TooSlow { .. }) => {
            tracing::info!(%peer, error = %e, "HTTP request body too slow; refused");
            return invalid(408, "RequestTimeout", &e.to_string());
        }
        Err(e @ BodyError::Read(_)) => {
            tracing::info!(%peer, error = %e, "HTTP request body could not be read");
            return invalid(400, "BadRequest", &e.to_string());
        }
    };
    if body.len() > api.max_message_size {
        return too_large(api.max_message_size);
    }
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) => Some(k.to_owned()),
        Some(Err(_)) => {
            return invalid(422, "E01001", "Idempotency-Key is not visible ASCII");
        }
    };
    let query = uri.query().unwrap_or_default();
    let params = query_pairs(query);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let (composed, body_identity) = match content_type.as_str() {
        "message/rfc822" => {
            let from = params
                .iter()
                .find(|(k, _)| k == "from")
                .map(|(_, v)| v.as_str());
            let to: Vec<String> = params
                .iter()
                .filter(|(k, _)| k == "to")
                .map(|(_, v)| v.clone())
                .collect();
            (compose::from_raw(body, from, &to), None)
        }
        "application/json" => {
            let hash: [u8; 32] = Sha256::digest(&body).into();
            (compose::from_json(&body, &api.hostname), Some(hash))
        }
        _ => {
            return invalid(
                415,
                "UnsupportedMediaType",
                "Content-Type must be message/rfc822 or application/json",
            );
        }
    };
    let Composed {
        reverse_path,
        recipients,
        content,
        options,
    } = match composed {
        Ok(c) => c,
        Err(e) => {
            return invalid(400, "BadRequest", &e.to_string());
        }
    };
    if recipients.len() > api.max_recipients {
        return invalid(
            400,
            "BadRequest",
            &format!("more than {} recipients", api.max_recipients),
        );
    }
    let allowed = ReversePath::parse(&reverse_path)
        .map(|p| submitter.may_send_as_path(&p))
        .unwrap_or(false);
    if !allowed {
        tracing::info!(account = submitter.name(), sender = ?reverse_path, "HTTP submission refused: sender not allowed");
        return refused(
            Outcome::Rejected,
            403,
            "SenderNotAllowed",
            &format!("this API key may not send as {reverse_path}"),
        );
    }
    let source = KeySource::Request {
        key,
        line: format!("{method} {}?{query}", uri.path()),
        body: body_identity,
    };
    let submission = Submission {
        submitter,
        helo: "http".into(),
        peer,
        tls: api.tls,
        reverse_path,
        recipients,
        content,
        options,
    };
    let answer = api.acceptor.accept_via(submission, &Http, source).await;
    drop(reservation);
    respond(answer)
}

/// `a=1&to=x%40y&to=z` into pairs, percent- and `+`-decoded.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        assert_eq!(
            query_pairs("from=a%40x.test&to=b%40y.test&to=c+d&x"),
            [
                ("from".to_owned(), "a@x.test".to_owned()),
                ("to".into(), "b@y.test".into()),
                ("to".into(), "c d".into()),
                ("x".into(), String::new()),
            ]
        );
    }
}
