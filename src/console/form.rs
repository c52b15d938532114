//! What every console request goes through: the address's ban (refused
//! as the API refuses it), the session cookie (none or a stale one: to the
//! sign-in page), and for a POST its form: at most 16 KiB read through the
//! API's body reader (the in-flight budget, the minimum rate) and the
//! session's form token compared in constant time.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::Console;
use super::layout::{self, banned, see_other};
use super::session::{COOKIE, Session, cookie, same_token};
use crate::http::Api;
use crate::http::body::{self, BodyError, BodyLimits};

/// An answer instead of the page (boxed: a `Response` is large).
pub(super) type Refusal = Box<Response>;

/// A form body is at most this.
pub(super) const MAX_FORM: usize = 16 * 1024;

/// A signed-in request: the console, the session and its cookie value.
pub(super) struct SignedIn<'a> {
    pub(super) console: &'a Console,
    pub(super) session: Session,
}

/// The console's state (its routes exist only when it does).
pub(super) fn console(api: &Api) -> Result<&Console, Refusal> {
    api.pages
        .as_deref()
        .and_then(|pages| pages.downcast_ref::<Console>())
        .ok_or_else(|| Box::new(layout::not_found(None)))
}

/// The session of this request, or the answer: `429` to a banned address,
/// a redirect to the sign-in page without a live session.
pub(super) fn signed_in<'a>(
    api: &'a Api,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<SignedIn<'a>, Refusal> {
    let console = console(api)?;
    if api.auth.api_key_refused_banned(peer.ip()) {
        return Err(Box::new(banned()));
    }
    cookie(headers, COOKIE)
        .and_then(|token| console.sessions.get(token))
        .map(|session| SignedIn { console, session })
        .ok_or_else(|| Box::new(see_other("/console/login")))
}

/// The form's fields, or the answer: `413` over [`MAX_FORM`], `503` when
/// the node's in-flight budget is used up, `400` for a body that could not
/// be read (too slow, cut).
pub(super) async fn read_form(
    api: &Api,
    account: Option<&str>,
    body: Body,
    peer: SocketAddr,
) -> Result<Vec<(String, String)>, Refusal> {
    let mut reservation = api.budget.reservation(account.map(Arc::from));
    let limits = BodyLimits {
        max_bytes: MAX_FORM,
        ..api.body
    };
    let bytes = match body::read(body, limits, &mut reservation).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge(_)) => {
            return Err(Box::new(layout::error_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                "Too large",
                "A console form is at most 16 KiB.",
            )));
        }
        Err(e @ BodyError::OverBudget(_)) => {
            tracing::warn!(%peer, error = %e, "console form refused: in-flight budget used up");
            return Err(Box::new(layout::error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                "Busy",
                "The server is busy; try again in a moment.",
            )));
        }
        Err(e) => {
            tracing::info!(%peer, error = %e, "console form could not be read");
            return Err(Box::new(layout::error_page(
                StatusCode::BAD_REQUEST,
                None,
                "Bad request",
                "The form could not be read.",
            )));
        }
    };
    Ok(form_urlencoded::parse(&bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// The first value of `name` in `fields`.
pub(super) fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The session's form token must be in the form (`csrf`), else `403`.
pub(super) fn check_token(session: &Session, fields: &[(String, String)]) -> Result<(), Refusal> {
    match field(fields, "csrf") {
        Some(token) if same_token(token, &session.csrf) => Ok(()),
        _ => Err(Box::new(layout::forbidden(Some(session)))),
    }
}

/// Read the form of a signed-in POST and check its token.
pub(super) async fn signed_form(
    api: &Api,
    signed: &SignedIn<'_>,
    body: Body,
    peer: SocketAddr,
) -> Result<Vec<(String, String)>, Refusal> {
    let fields = read_form(api, Some(signed.session.name()), body, peer).await?;
    check_token(&signed.session, &fields)?;
    Ok(fields)
}

/// `Set-Cookie` for a console cookie: HttpOnly, SameSite=Strict, the
/// console's path only, Secure under TLS; `max_age` 0 deletes it.
pub(super) fn set_cookie(name: &str, value: &str, secure: bool, max_age: Option<u64>) -> String {
    let mut c = format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/console");
    if secure {
        c.push_str("; Secure");
    }
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={age}"));
    }
    c
}

/// Any other path under `/console`: the sign-in page without a session,
/// the not-found page with one.
pub(super) async fn unknown_page(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    match signed_in(&api, &headers, peer) {
        Ok(s) => layout::not_found(Some(&s.session)),
        Err(r) => *r,
    }
}
