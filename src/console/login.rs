//! Sign-in and sign-out. A password goes through
//! `Authenticator::authenticate` (argon2, the same throttle and bans as
//! SMTP AUTH); an API key through the API's keys, a wrong one counted by
//! `api_key_failed`. Every failure reads the same ("Sign-in failed").
//!
//! The sign-in form has no session to bind a token to, so it is protected
//! twice: an `Origin` header, when the browser sends one, must name this
//! listener (`Host`), and the form's token must equal the one in the
//! pre-session cookie set with the form (SameSite=Strict, so another site
//! can neither read nor send it).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use maud::html;

use super::form::{field, read_form, set_cookie, signed_form, signed_in};
use super::layout::{self, Nav, banned, html_response, page, see_other};
use super::session::{COOKIE, LOGIN_COOKIE, cookie, random_token, same_token};
use crate::auth::AuthOutcome;
use crate::http::Api;

/// The pre-session token lives as long as a sign-in takes.
const LOGIN_COOKIE_SECONDS: u64 = 30 * 60;

pub(super) async fn form(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    match signed_in(&api, &headers, peer) {
        Ok(_) => return see_other("/console/"),
        Err(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => return *r,
        Err(_) => {}
    }
    login_page(&api, StatusCode::OK, None)
}

/// The form with a fresh pre-session token (cookie and hidden field).
fn login_page(api: &Api, status: StatusCode, error: Option<&str>) -> Response {
    let token = random_token();
    let body = html! {
        h1 { "Sign in" }
        @if let Some(e) = error { p.error role="alert" { (e) } }
        form #login method="post" action="/console/login" {
            input type="hidden" name="csrf" value=(token);
            fieldset {
                legend { "With an account's password" }
                p {
                    label for="account" { "Account" }
                    input #account type="text" name="account" autocomplete="username" autocapitalize="none" spellcheck="false";
                }
                p {
                    label for="password" { "Password" }
                    input #password type="password" name="password" autocomplete="current-password";
                }
            }
            fieldset {
                legend { "Or with an API key" }
                p {
                    label for="api_key" { "API key" }
                    input #api_key type="password" name="api_key" autocomplete="off";
                }
            }
            button #sign-in type="submit" { "Sign in" }
        }
    };
    let mut response = html_response(status, page("Sign in", None, Nav::None, body));
    if let Ok(v) = HeaderValue::from_str(&set_cookie(
        LOGIN_COOKIE,
        &token,
        api.tls,
        Some(LOGIN_COOKIE_SECONDS),
    )) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

pub(super) async fn submit(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let console = match super::form::console(&api) {
        Ok(console) => console,
        Err(refusal) => return *refusal,
    };
    if api.auth.api_key_refused_banned(peer.ip()) {
        return banned();
    }
    if !same_origin(&parts.headers, api.tls) {
        tracing::info!(%peer, "console sign-in refused: Origin is another site");
        return layout::forbidden(None);
    }
    let fields = match read_form(&api, None, body, peer).await {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let token_ok = match (cookie(&parts.headers, LOGIN_COOKIE), field(&fields, "csrf")) {
        (Some(c), Some(f)) => same_token(c, f),
        _ => false,
    };
    if !token_ok {
        return layout::forbidden(None);
    }
    let key = field(&fields, "api_key").unwrap_or_default();
    let account = field(&fields, "account").unwrap_or_default();
    let password = field(&fields, "password").unwrap_or_default();
    let signed = if !key.is_empty() {
        match api.keys.caller(key) {
            Some(caller) => match caller.submitter {
                crate::auth::Submitter::Account(a) => Some((a, caller.operator)),
                crate::auth::Submitter::TrustedNetwork { .. } => None,
            },
            None => {
                tracing::info!(%peer, "console sign-in failed: wrong API key");
                let delay = api.auth.api_key_failed(peer.ip());
                tokio::time::sleep(delay).await;
                None
            }
        }
    } else {
        let verdict = api.auth.authenticate(peer.ip(), account, password).await;
        match verdict.outcome {
            AuthOutcome::Success(a) => {
                let operator = console.operators.contains(&a.name);
                Some((a, operator))
            }
            AuthOutcome::IpBanned => return banned(),
            AuthOutcome::TemporaryFailure => {
                return login_page(&api, StatusCode::SERVICE_UNAVAILABLE, Some(FAILED));
            }
            AuthOutcome::Invalid | AuthOutcome::AccountLocked => {
                tokio::time::sleep(verdict.reply_delay).await;
                None
            }
        }
    };
    let Some((account, operator)) = signed else {
        return login_page(&api, StatusCode::UNAUTHORIZED, Some(FAILED));
    };
    tracing::info!(%peer, account = %account.name, operator, "console sign-in");
    let token = console.sessions.start(account, operator);
    let mut response = see_other("/console/");
    let h = response.headers_mut();
    for c in [
        set_cookie(COOKIE, &token, api.tls, None),
        set_cookie(LOGIN_COOKIE, "", api.tls, Some(0)),
    ] {
        if let Ok(v) = HeaderValue::from_str(&c) {
            h.append(header::SET_COOKIE, v);
        }
    }
    response
}

/// The same words for every cause: a wrong name, password or key, a
/// locked account.
const FAILED: &str = "Sign-in failed";

/// No `Origin` (an older browser, a script), or one naming this
/// listener's `Host`.
fn same_origin(headers: &HeaderMap, tls: bool) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let scheme = if tls { "https" } else { "http" };
    match (origin.to_str(), host) {
        (Ok(origin), Some(host)) => origin == format!("{scheme}://{host}"),
        _ => false,
    }
}

pub(super) async fn logout(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    let signed = match signed_in(&api, &parts.headers, peer) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if let Err(r) = signed_form(&api, &signed, body, peer).await {
        return *r;
    }
    if let Some(token) = cookie(&parts.headers, COOKIE) {
        signed.console.sessions.end(token);
    }
    tracing::info!(%peer, account = %signed.session.name(), "console sign-out");
    let mut response = see_other("/console/login");
    if let Ok(v) = HeaderValue::from_str(&set_cookie(COOKIE, "", api.tls, Some(0))) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}
