//! `POST /v1/messages`: the HTTP front of the acceptance pipeline. The
//! request's identity is its method, path, query and body; its key is the
//! `Idempotency-Key` header, in the workspace's key space shared with SMTP.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::channel::{self, Http};
use super::compose::{self, Composed};
use super::{Api, respond};
use crate::accept::channel::KeySource;
use crate::address::ReversePath;
use crate::metrics::{self, Outcome};
use crate::smtp::session::Submission;

pub async fn submit(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // From the whole body received to the response ready.
    let started = std::time::Instant::now();
    let response = handle(api, peer, method, uri, headers, body).await;
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

async fn handle(
    api: Arc<Api>,
    peer: SocketAddr,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let submitter = match api.authenticate(&headers) {
        Ok(s) => s,
        Err(response) => return *response,
    };
    // A body over the router's limit (the message size plus framing) is
    // refused while it is read: answered here, in JSON, not by axum.
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return too_large(api.max_message_size);
        }
        Err(rejection) => {
            return invalid(400, "BadRequest", &rejection.body_text());
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
            (compose::from_raw(body.to_vec(), from, &to), None)
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
    };
    respond(api.acceptor.accept_via(submission, &Http, source).await)
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
